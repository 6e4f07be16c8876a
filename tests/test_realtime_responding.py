"""The Realtime API's responses without a socket (``realtime/responding.py``): ``response.create``
makes one core turn over the conversation's items (its question the last user item that says
something, the items before it the history, the session's instructions and system items its
instructions), whose events are written as ``response.*``; one response at a time; whatever stops it
(``response.cancel``, the reader's interrupt, a truncate of the item being written, the engine's
refusal), it closes once. The turn's events are scripted on the core; every event sent is one the
official SDK parses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support.realtime_parts import ScriptedResponses, pcm, refusal, session

from omniweb.base.errors import ErrorKind
from omniweb.conversation import TextDelta, Transcript, TurnEnd
from omniweb.engine.messages import Status
from omniweb.openai_api.realtime.audio import to_engine_rate
from omniweb.openai_api.realtime.errors import RealtimeError
from omniweb.openai_api.realtime.events import ItemTruncateEvent, ResponseCancelEvent
from omniweb.openai_api.realtime.session import AnySession

TEXT = {"output_modalities": ["text"]}
DONE = "response.done"


@pytest.fixture
async def opened(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[ScriptedResponses]]:
    made: list[ScriptedResponses] = []
    yield made
    for parts in made:
        await parts.core.close()
        parts.items.close()


def opening(
    made: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch, config: AnySession | None = None
) -> ScriptedResponses:
    made.append(ScriptedResponses(config or session(), monkeypatch))
    return made[-1]


async def test_a_response_is_one_turn_over_the_conversation(
    opened: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = opening(opened, monkeypatch, session(instructions="Be brief."))
    parts.say("system", "Answer in English.")
    parts.say("user", "Hello")
    parts.say("assistant", "Hi!")
    question = parts.say("user", "How many people?")
    parts.say("user", "")  # says nothing: not the question
    parts.script = [TextDelta("Two"), TextDelta(" people."), TurnEnd(Status.OK, text="Two people.")]
    await parts.create(**TEXT)
    assert [e["type"] for e in await parts.answered()] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        DONE,
    ]
    events = parts.wire.events()
    assert events[-1]["response"]["status"] == "completed" and parts.responses.running is None
    [spec] = parts.specs
    assert (spec.question.text, spec.question.audio) == (question.text(), b"")
    assert spec.history == [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"}]
    assert spec.instructions == "Be brief.\nAnswer in English."
    assert (spec.modalities, spec.voice, spec.request_id) == (("text",), "heart", parts.wire.sent[0]["response"]["id"])
    assert spec.selection.num_frames == 4 and spec.selection.strategy == "latest_frames"
    answer = parts.items.conversation.items[-1]  # the answer joined the conversation, last
    assert (answer.text(), parts.items.conversation.previous_of(answer)) == ("Two people.", "item_4")
    assert parts.idle == 1


async def test_a_spoken_question_is_heard_by_the_turn_and_its_transcript_kept(
    opened: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = opening(opened, monkeypatch)
    spoken = parts.say("user", "", audio=pcm(300))
    spoken.content = [{"type": "input_audio", "transcript": None}]
    parts.script = [Transcript("How many people?"), TurnEnd(Status.OK, text="Two.")]
    await parts.create(audio={"output": {"voice": "ash"}}, conversation="none")
    await parts.answered()
    [spec] = parts.specs
    assert spec.question.audio == to_engine_rate(pcm(300)) and spec.question.text == ""
    assert (spec.modalities, spec.voice) == (("text", "audio"), "bella")
    assert parts.transcribed == [(spoken, ["How many people?"])]
    assert parts.items.conversation.items == [spoken]  # conversation "none"
    assert "conversation.item.added" not in parts.wire.types()


async def test_without_a_question_the_response_fails_at_once(
    opened: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = opening(opened, monkeypatch)
    await parts.create(**TEXT)
    assert parts.specs == [] and parts.responses.running is None
    assert parts.wire.events()[-1]["response"]["status_details"] == {
        "type": "failed",
        "error": {
            "type": "server_error",
            "code": "no_input",
            "message": "There is no question to answer: add a user item first",
        },
    }


async def test_one_response_at_a_time_and_a_cancel_stops_it(
    opened: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = opening(opened, monkeypatch)
    parts.say("user", "Who is there?")
    parts.script, parts.endless = [TextDelta("A")], True
    await parts.create(**TEXT)
    await parts.written("response.output_text.delta")
    response_id = parts.wire.sent[0]["response"]["id"]
    with pytest.raises(RealtimeError) as busy:
        await parts.create(event_id="evt_1")
    assert {k: refusal(busy.value)[k] for k in ("code", "event_id")} == {
        "code": "conversation_already_has_active_response",
        "event_id": "evt_1",
    }
    assert response_id in refusal(busy.value)["message"]
    with pytest.raises(RealtimeError) as other:
        await parts.responses.on_cancel(ResponseCancelEvent(type="response.cancel", response_id="resp_other"))
    assert (refusal(other.value)["code"], refusal(other.value)["param"]) == (
        "response_cancel_not_active",
        "response_id",
    )
    await parts.responses.on_cancel(ResponseCancelEvent(type="response.cancel", response_id=response_id))
    done = parts.wire.events()[-1]
    assert (done["type"], done["response"]["status"]) == (DONE, "cancelled")
    assert done["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert parts.engine.aborted == [response_id] and parts.responses.running is None
    with pytest.raises(RealtimeError) as none:
        await parts.responses.on_cancel(ResponseCancelEvent(type="response.cancel"))
    assert (refusal(none.value)["code"], refusal(none.value)["param"]) == ("response_cancel_not_active", None)


async def test_the_readers_interrupt_stops_the_turn_and_the_cancel_then_closes_it(
    opened: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = opening(opened, monkeypatch)
    parts.say("user", "Who is there?")
    parts.script, parts.endless = [TextDelta("A")], True
    await parts.create(**TEXT)
    await parts.written("response.output_text.delta")
    await parts.responses.interrupt()
    assert parts.engine.aborted == [parts.wire.sent[0]["response"]["id"]]
    assert parts.wire.types()[-1] == "response.output_text.delta" and parts.responses.running is not None
    await parts.responses.on_cancel(ResponseCancelEvent(type="response.cancel"))
    assert parts.wire.events()[-1]["response"]["status"] == "cancelled" and len(parts.engine.aborted) == 1


async def test_a_truncate_of_the_answer_being_written_cancels_it_first(
    opened: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = opening(opened, monkeypatch)
    parts.say("user", "Who is there?")
    parts.script, parts.endless = [TextDelta("A")], True
    await parts.create()  # audio
    await parts.written("response.output_audio_transcript.delta")
    assert parts.responses.running is not None
    answer_id = parts.responses.running.stream.item.id
    await parts.responses.stop_writing("item_other")  # another item: nothing stops
    assert parts.responses.running is not None
    truncate = ItemTruncateEvent(type="conversation.item.truncate", item_id=answer_id, content_index=0, audio_end_ms=0)
    await parts.items.on_truncate(truncate)
    assert parts.wire.types()[-3:] == ["conversation.item.done", DONE, "conversation.item.truncated"]
    assert parts.wire.sent[-2]["response"]["status"] == "cancelled"


async def test_a_refused_turn_is_an_error_then_a_failed_response(
    opened: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = opening(opened, monkeypatch)
    parts.say("user", "Who is there?")
    parts.script = [TurnEnd(Status.BUSY, kind=ErrorKind.CAPACITY, message="server is at capacity")]
    await parts.create(**TEXT)
    events = await parts.answered()
    assert parts.refused == [("capacity", ErrorKind.CAPACITY)]
    assert events[-1]["response"]["status"] == "failed"


async def test_a_transcription_session_creates_no_responses(
    opened: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = opening(opened, monkeypatch, session(intent="transcription"))
    with pytest.raises(RealtimeError) as refused:
        await parts.create(event_id="evt_2")
    assert refusal(refused.value) == {
        "type": "invalid_request_error",
        "code": "invalid_event_type",
        "message": "A transcription session creates no responses; connect to /v1/realtime for a conversation",
        "param": None,
        "event_id": "evt_2",
    }
