"""The Realtime API's response wire without a socket: the core's typed turn events in, ``response.*``
events out, in order (``omniweb/openai_api/realtime/responses.py``), and the input audio
transcription's events (``transcripts.py``). Generated ids are compared by relation (``<item:2>`` is
the assistant item wherever it is named), every event is one the official SDK parses."""

from __future__ import annotations

from typing import Any

import pytest
from support.realtime import normalized, sdk_parses

from omniweb.base.errors import ErrorKind
from omniweb.conversation import AudioChunk, NoUsableFrames, TextDelta, Transcript, TurnEnd, Usage, WordTiming
from omniweb.engine.messages import Status
from omniweb.openai_api.protocol import OPENAI_VOICES
from omniweb.openai_api.realtime import server_events
from omniweb.openai_api.realtime.errors import error_event, new_id
from omniweb.openai_api.realtime.events import ResponseParams
from omniweb.openai_api.realtime.items import Conversation, Item
from omniweb.openai_api.realtime.responses import Ending, ResponseStream
from omniweb.openai_api.realtime.session import new_session
from omniweb.openai_api.realtime.transcripts import InputTranscripts

VOICES = {**dict.fromkeys(OPENAI_VOICES, "heart"), "heart": "heart"}
PCM = b"\x01\x00" * 2400  # 100 ms at 24 kHz
# Where a response's deltas and parts are: its one output, its one content part (ids by relation).
AT = {"response_id": "<resp:1>", "item_id": "<item:2>", "output_index": 0, "content_index": 0}


def asked(text: str = "How many people can you see?") -> tuple[Conversation, Item]:
    conv = Conversation()
    question = Item(id=new_id("item"), role="user", content=[{"type": "input_text", "text": text}])
    conv.add(question)
    return conv, question


def respond(conv: Conversation, **params: Any) -> ResponseStream:
    stream = ResponseStream.create(ResponseParams(**params), new_session(VOICES), conv)
    if stream.in_conversation:
        conv.add(stream.item)  # the consumer places the item before the opening events
    return stream


def wire(payloads: list[dict[str, Any]], *known: str) -> list[dict[str, Any]]:
    """The events as the SDK reads them, ids by relation; each has an event id of its own (then left out)."""
    for payload in payloads:
        sdk_parses(payload)
    events = normalized(payloads, known)
    assert [e.pop("event_id") for e in events] == [f"<event:{n}>" for n in range(1, len(events) + 1)]
    return events


def assistant(status: str, part: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "<item:2>",
        "object": "realtime.item",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def tokens(*, text_in: int = 0, audio_in: int = 0, images: int = 0, text_out: int = 0, audio_out: int = 0) -> dict:
    return {
        "total_tokens": text_in + audio_in + images + text_out + audio_out,
        "input_tokens": text_in + audio_in + images,
        "output_tokens": text_out + audio_out,
        "input_token_details": {
            "text_tokens": text_in,
            "audio_tokens": audio_in,
            "image_tokens": images,
            "cached_tokens": 0,
        },
        "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out},
    }


def response(
    status: str,
    output: list[dict[str, Any]],
    modalities: list[str],
    *,
    conversation: str | None = "<conv:1>",
    details: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "object": "realtime.response",
        "id": "<resp:1>",
        "status": status,
        "status_details": details,
        "output": output,
        "conversation_id": conversation,
        "output_modalities": modalities,
        "max_output_tokens": "inf",
        "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"}},
        "usage": usage,
        "metadata": None,
    }


def run(stream: ResponseStream, *turn: Any) -> tuple[list[dict[str, Any]], Ending]:
    """start, the turn's events, its end and finish: every event sent, and how it ended."""
    *pieces, last = turn
    out = stream.start()
    for event in pieces:
        out += stream.write(event)
    end = stream.end(last)
    return out + stream.finish(end.status, end.details), end


# -- responses ---------------------------------------------------------------------------------------
def test_a_text_response_opens_streams_its_deltas_and_closes_in_the_conversation() -> None:
    conv, question = asked()
    stream = respond(conv, output_modalities=["text"])
    assert stream.question is question and stream.in_conversation
    turn = [TextDelta("Two "), AudioChunk(PCM), TextDelta(""), Transcript("ignored"), TextDelta("people.")]
    out, end = run(stream, *turn, TurnEnd(Status.OK))
    assert end == Ending("completed")
    empty, done = {"type": "output_text", "text": ""}, {"type": "output_text", "text": "Two people."}
    assert wire(out, question.id) == [
        {"type": "response.created", "response": response("in_progress", [], ["text"])},
        {"type": "response.output_item.added", "response_id": "<resp:1>", "output_index": 0}
        | {"item": assistant("in_progress", empty)},
        {"type": "conversation.item.added", "previous_item_id": "<item:1>", "item": assistant("in_progress", empty)},
        {"type": "response.content_part.added", **AT, "part": {"type": "text", "text": ""}},
        {"type": "response.output_text.delta", **AT, "delta": "Two "},
        {"type": "response.output_text.delta", **AT, "delta": "people."},
        {"type": "response.output_text.done", **AT, "text": "Two people."},
        {"type": "response.content_part.done", **AT, "part": {"type": "text", "text": "Two people."}},
        {"type": "response.output_item.done", "response_id": "<resp:1>", "output_index": 0}
        | {"item": assistant("completed", done)},
        {"type": "conversation.item.done", "previous_item_id": "<item:1>", "item": assistant("completed", done)},
        {  # no usage from the turn: counted from what was heard (one word) and written (two, and a full stop)
            "type": "response.done",
            "response": response(
                "completed", [assistant("completed", done)], ["text"], usage=tokens(text_in=1, text_out=3)
            ),
        },
    ]
    assert conv.items == [question, stream.item] and stream.item.audio_ms == 0  # text: the audio is not kept
    assert conv.history() == [
        {"role": "user", "content": "How many people can you see?"},
        {"role": "assistant", "content": "Two people."},
    ]


def test_an_audio_response_keeps_word_timings_and_reports_the_turns_usage() -> None:
    conv, question = asked()
    stream = respond(conv)  # the session's default: audio, its transcript the text
    words = (WordTiming("Two", 0, 60), WordTiming("people.", 60, 180))
    usage = Usage(input_text_tokens=7, input_image_tokens=85, output_text_tokens=3, output_audio_tokens=4)
    out, end = run(
        stream,
        TextDelta("Two people."),
        AudioChunk(PCM, words[:1]),
        AudioChunk(b"", words[1:]),  # words only: no delta
        AudioChunk(PCM),
        TurnEnd(Status.OK, text="Two people.", usage=usage),
    )
    assert end == Ending("completed")
    empty, done = {"type": "output_audio", "transcript": ""}, {"type": "output_audio", "transcript": "Two people."}
    assert wire(out, question.id) == [
        {"type": "response.created", "response": response("in_progress", [], ["audio"])},
        {"type": "response.output_item.added", "response_id": "<resp:1>", "output_index": 0}
        | {"item": assistant("in_progress", empty)},
        {"type": "conversation.item.added", "previous_item_id": "<item:1>", "item": assistant("in_progress", empty)},
        {"type": "response.content_part.added", **AT, "part": {"type": "audio", "transcript": ""}},
        {"type": "response.output_audio_transcript.delta", **AT, "delta": "Two people."},
        {"type": "response.output_audio.delta", **AT, "delta": "<base64 4800 bytes>"},
        {"type": "response.output_audio.delta", **AT, "delta": "<base64 4800 bytes>"},
        {"type": "response.output_audio.done", **AT},
        {"type": "response.output_audio_transcript.done", **AT, "transcript": "Two people."},
        {"type": "response.content_part.done", **AT, "part": {"type": "audio", "transcript": "Two people."}},
        {"type": "response.output_item.done", "response_id": "<resp:1>", "output_index": 0}
        | {"item": assistant("completed", done)},
        {"type": "conversation.item.done", "previous_item_id": "<item:1>", "item": assistant("completed", done)},
        {
            "type": "response.done",
            "response": response(
                "completed",
                [assistant("completed", done)],
                ["audio"],
                usage=tokens(text_in=7, images=85, text_out=3, audio_out=4),
            ),
        },
    ]
    item = stream.item
    assert (item.words, item.audio_ms) == (list(words), 200)
    assert conv.truncate(item.id, 0, 100).content[0] == {"type": "output_audio", "transcript": "Two"}


def test_a_refused_response_fails_with_an_error_first_and_keeps_what_was_written() -> None:
    conv, question = asked()
    stream = respond(conv, output_modalities=["text"])
    message = "server is at capacity; retry shortly"
    out, end = run(stream, TextDelta("Two"), TurnEnd(Status.BUSY, kind=ErrorKind.CAPACITY, message=message, text="Two"))
    details = {"type": "failed", "error": {"type": "server_error", "code": "capacity", "message": message}}
    assert (end.status, end.details, end.kind) == ("failed", details, ErrorKind.CAPACITY)
    assert end.refusal is not None
    assert error_event(end.refusal)["error"] == {
        "type": "server_error",
        "code": "capacity",
        "message": message,
        "param": None,
        "event_id": None,
    }
    done = {"type": "output_text", "text": "Two"}
    events = wire(out, question.id)
    assert [e["type"] for e in events[4:]] == [
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert events[-3]["item"] == events[-2]["item"] == assistant("incomplete", done)
    assert events[-1]["response"] == response(
        "failed", [assistant("incomplete", done)], ["text"], details=details, usage=tokens(text_out=1)
    )


@pytest.mark.parametrize(
    ("last", "code", "message"),
    [
        (TurnEnd(Status.ERROR, kind=ErrorKind.ENGINE), "engine_failure", "The response failed"),
        (TurnEnd(Status.ERROR, message="The thinker failed"), "server_error", "The thinker failed"),
        (NoUsableFrames(), "invalid_image", "No image could be decoded"),
    ],
)
def test_other_failures_end_the_response_without_an_error_event(last: Any, code: str, message: str) -> None:
    conv, _ = asked()
    end = respond(conv).end(last)
    assert end == Ending("failed", server_events.failed(message, code), None, getattr(last, "kind", None))


def test_a_cancelled_response_outside_the_conversation_closes_what_it_opened() -> None:
    conv, question = asked()
    stream = respond(conv, conversation="none", metadata={"topic": "people"})
    assert not stream.in_conversation and conv.items == [question]
    out = stream.start() + stream.write(TextDelta("Two")) + stream.write(AudioChunk(PCM))
    out += stream.finish("cancelled", server_events.cancelled("turn_detected"))
    assert stream.write(TextDelta(" more")) == [] and stream.finish("completed", None) == []  # closed
    empty, done = {"type": "output_audio", "transcript": ""}, {"type": "output_audio", "transcript": "Two"}
    details = {"type": "cancelled", "reason": "turn_detected"}
    assert wire(out, question.id) == [
        {
            "type": "response.created",
            "response": response("in_progress", [], ["audio"], conversation=None) | {"metadata": {"topic": "people"}},
        },
        {"type": "response.output_item.added", "response_id": "<resp:1>", "output_index": 0}
        | {"item": assistant("in_progress", empty)},
        {"type": "response.content_part.added", **AT, "part": {"type": "audio", "transcript": ""}},
        {"type": "response.output_audio_transcript.delta", **AT, "delta": "Two"},
        {"type": "response.output_audio.delta", **AT, "delta": "<base64 4800 bytes>"},
        {"type": "response.output_audio.done", **AT},
        {"type": "response.output_audio_transcript.done", **AT, "transcript": "Two"},
        {"type": "response.content_part.done", **AT, "part": {"type": "audio", "transcript": "Two"}},
        {"type": "response.output_item.done", "response_id": "<resp:1>", "output_index": 0}
        | {"item": assistant("incomplete", done)},
        {  # usage counted from what was sent: one word, 100 ms of audio at a completed answer's one token per 50 ms
            "type": "response.done",
            "response": response(
                "cancelled",
                [assistant("incomplete", done)],
                ["audio"],
                conversation=None,
                details=details,
                usage=tokens(text_out=1, audio_out=2),
            )
            | {"metadata": {"topic": "people"}},
        },
    ]
    assert conv.items == [question]  # conversation "none": the answer is not in it


def test_the_turns_own_cancel_and_a_deleted_item() -> None:
    conv, _ = asked()
    stream = respond(conv, output_modalities=["text"])
    stream.start()
    assert stream.end(TurnEnd(Status.CANCELLED)) == Ending("cancelled", server_events.cancelled("client_cancelled"))
    conv.delete(stream.item.id)  # deleted while it was written: no conversation.item.done for it
    assert [e["type"] for e in stream.finish("cancelled", None)] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]


def test_the_question_is_the_latest_user_item_that_says_something() -> None:
    conv, first = asked("What is this?")
    conv.add(Item(id=new_id("item"), role="assistant", content=[{"type": "output_text", "text": "A photo."}]))
    conv.add(Item(id=new_id("item"), role="user", content=[{"type": "input_image", "detail": "auto"}]))
    assert respond(conv).question is first  # an image alone asks nothing
    spoken = Item(id=new_id("item"), role="user", content=[{"type": "input_audio", "transcript": None}], audio=PCM)
    conv.add(spoken)
    assert respond(Conversation()).question is None
    stream = respond(conv, audio={"output": {"voice": "ash"}}, output_modalities=["text", "audio"])
    assert stream.question is spoken  # audio not yet transcribed
    assert (stream.response.modalities, stream.response.voice) == (("audio",), "ash")


# -- input audio transcription ----------------------------------------------------------------------
def spoken_item() -> Item:
    return Item(id=new_id("item"), role="user", content=[{"type": "input_audio", "transcript": None}], audio=PCM)


def test_a_transcript_is_one_delta_per_segment_then_completed() -> None:
    item = spoken_item()
    out = InputTranscripts().transcribed(item, [" How many people", " can you see?"], announce=True)
    at = {"item_id": "<item:1>", "content_index": 0}
    assert wire(out, item.id) == [
        {"type": "conversation.item.input_audio_transcription.delta", **at, "delta": "How many people"},
        {"type": "conversation.item.input_audio_transcription.delta", **at, "delta": " can you see?"},
        {"type": "conversation.item.input_audio_transcription.completed", **at}
        | {"transcript": "How many people can you see?", "usage": {"type": "duration", "seconds": 0.1}},
    ]
    assert item.content[0] == {"type": "input_audio", "transcript": "How many people can you see?"}


def test_streamed_deltas_are_not_sent_again() -> None:
    transcripts, item = InputTranscripts(), spoken_item()
    out = transcripts.heard(item.id, "How many") + transcripts.heard(item.id, " people")
    out += transcripts.transcribed(item, [" How many people", " can you see?"], announce=True)
    assert [(e["type"].rsplit(".", 1)[1], e.get("delta")) for e in wire(out, item.id)] == [
        ("delta", "How many"),
        ("delta", " people"),
        ("delta", " can you see?"),  # the rest, in one delta
        ("completed", None),
    ]
    assert transcripts.streamed == {}
    # Streaming that guessed otherwise than the final transcript: nothing more is sent but .completed.
    other = spoken_item()
    transcripts.heard(other.id, "How much")
    assert [e["type"] for e in transcripts.transcribed(other, [" How many?"], announce=True)] == [
        "conversation.item.input_audio_transcription.completed"
    ]


def test_without_transcription_the_item_keeps_its_transcript_silently() -> None:
    item = spoken_item()
    assert InputTranscripts().transcribed(item, [" Hello."], announce=False) == []
    assert item.content[0]["transcript"] == "Hello."
