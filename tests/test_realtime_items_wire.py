"""The Realtime API's ``conversation.item.*`` without a socket (``realtime/conversation_items.py``):
items placed as OpenAI places them, their input audio held in the process budget while they are in
the conversation, their images in the core's frame buffer, and the refusals each event earns, with
the event's ``event_id`` echoed. Every event sent is one the official SDK parses."""

from __future__ import annotations

from typing import Any

import pytest
from support.realtime_parts import Wire, b64, jpeg_url, pcm, refusal
from support.video import jpeg

from omniweb.base import budget as process_budget
from omniweb.conversation import FrameBuffer
from omniweb.openai_api.realtime.conversation_items import ConversationItems
from omniweb.openai_api.realtime.errors import RealtimeError
from omniweb.openai_api.realtime.events import (
    ItemCreateEvent,
    ItemDeleteEvent,
    ItemRetrieveEvent,
    ItemTruncateEvent,
)
from omniweb.openai_api.realtime.items import Item

MESSAGE = {"object": "realtime.item", "type": "message", "status": "completed"}


class Parts:
    """A session's items as its consumer wires them: the wire, the frame buffer, what was asked to
    be transcribed and which answers were asked to stop being written."""

    def __init__(self, max_items: int = 200) -> None:
        self.wire = Wire()
        self.frames = FrameBuffer(
            max_frames=4, max_bytes=1 << 20, max_pixels=1 << 22, filter_threshold=None, on_decode_failed=lambda _: None
        )
        self.transcribed: list[Item] = []
        self.stopped: list[str] = []
        self.items = ConversationItems(
            self.wire.send,
            self.frames,
            transcribe=self.transcribed.append,
            stop_writing=self._stop_writing,
            max_items=max_items,
        )

    async def _stop_writing(self, item_id: str) -> None:
        self.stopped.append(item_id)

    async def create(self, *content: dict[str, Any], event_id: str | None = None, **fields: Any) -> Item:
        item = {"type": "message", "role": fields.pop("role", "user"), "content": list(content)}
        if "id" in fields:
            item["id"] = fields.pop("id")
        event = {"type": "conversation.item.create", "item": item, "event_id": event_id, **fields}
        await self.items.on_create(ItemCreateEvent.model_validate(event))
        return self.items.conversation.get(self.wire.sent[-1]["item"]["id"])  # conversation.item.done's


def text(words: str) -> dict[str, Any]:
    return {"type": "input_text", "text": words}


async def test_an_item_is_added_then_done_after_the_item_before_it() -> None:
    parts = Parts()
    first = await parts.create(text("Hello"))
    second = await parts.create(text("Who is there?"))
    assert parts.wire.events(first.id, second.id) == [
        {"type": "conversation.item.added", "previous_item_id": None}
        | {"item": {"id": "<item:1>", **MESSAGE, "role": "user", "content": [text("Hello")]}},
        {"type": "conversation.item.done", "previous_item_id": None}
        | {"item": {"id": "<item:1>", **MESSAGE, "role": "user", "content": [text("Hello")]}},
        {"type": "conversation.item.added", "previous_item_id": "<item:1>"}
        | {"item": {"id": "<item:2>", **MESSAGE, "role": "user", "content": [text("Who is there?")]}},
        {"type": "conversation.item.done", "previous_item_id": "<item:1>"}
        | {"item": {"id": "<item:2>", **MESSAGE, "role": "user", "content": [text("Who is there?")]}},
    ]
    parts.wire.clear()
    await parts.create(text("Be brief."), role="system", id="sys", previous_item_id="root")
    assert [e["previous_item_id"] for e in parts.wire.sent] == [None, None]
    assert [i.id for i in parts.items.conversation.items] == ["sys", first.id, second.id]
    assert parts.transcribed == []  # text asks for no transcription


async def test_input_audio_is_held_in_the_budget_and_transcribed_unless_it_has_a_transcript() -> None:
    parts, held = Parts(), process_budget.held()
    spoken = await parts.create({"type": "input_audio", "audio": b64(pcm(200))})
    assert spoken.audio == pcm(200) and spoken.content == [{"type": "input_audio", "transcript": None}]
    assert parts.wire.sent[0]["item"]["content"] == [{"type": "input_audio", "transcript": None}]  # no audio echoed
    assert parts.transcribed == [spoken]
    said = await parts.create({"type": "input_audio", "audio": b64(pcm(100)), "transcript": "Hi."})
    only_said = await parts.create({"type": "input_audio", "transcript": "Hello."})
    assert parts.transcribed == [spoken]  # those have their transcripts
    assert (said.text(), only_said.text(), only_said.audio) == ("Hi.", "Hello.", b"")
    assert process_budget.held() - held == len(pcm(300))
    await parts.items.on_delete(ItemDeleteEvent(type="conversation.item.delete", item_id=spoken.id))
    assert parts.wire.events(spoken.id)[-1] == {"type": "conversation.item.deleted", "item_id": "<item:1>"}
    assert process_budget.held() - held == len(pcm(100))
    parts.items.close()
    assert process_budget.held() == held and parts.items.conversation.items == []


async def test_the_oldest_items_go_over_the_cap_with_their_audio() -> None:
    parts, held = Parts(max_items=2), process_budget.held()
    first = await parts.create({"type": "input_audio", "audio": b64(pcm(100))})
    await parts.create(text("a"))
    await parts.create(text("b"))
    assert first not in parts.items.conversation.items and process_budget.held() == held


async def test_images_enter_the_frame_buffer_and_a_failed_decode_is_reported_once() -> None:
    parts = Parts()
    image = {"type": "input_image", "image_url": jpeg_url(jpeg(40)), "detail": "low"}
    item = await parts.create(text("What is this?"), image)
    assert item.content == [text("What is this?"), {"type": "input_image", "detail": "low"}]
    [frame] = parts.frames.snapshot()
    assert frame.meta == {"item_id": item.id}
    err = parts.items.decode_failed(frame)
    assert err is not None and refusal(err) == {
        "type": "invalid_request_error",
        "code": "invalid_image",
        "message": f"The image of item '{item.id}' could not be decoded",
        "param": None,
        "event_id": None,
    }
    assert parts.frames.snapshot() == [] and parts.items.decode_failed(frame) is None  # it had left


@pytest.mark.parametrize(
    ("content", "code", "param", "message", "echoed"),
    [
        (
            {"type": "input_audio", "audio": "not base64!"},
            "invalid_base64",
            "item.content[1].audio",
            "Invalid base64 audio",
            True,
        ),
        (
            {"type": "input_audio", "audio": b64(b"\x01\x00\x02")},
            "invalid_value",
            "item.content[1].audio",
            "Audio must be whole PCM16 samples (an even number of bytes)",
            True,
        ),
        (
            {"type": "input_audio"},
            "invalid_value",
            "item.content[1]",
            "An input_audio part needs audio or a transcript",
            True,
        ),
        (
            {"type": "input_image", "image_url": jpeg_url(b"not a jpeg")},
            "invalid_image",
            "item.content[1].image_url",
            None,
            True,
        ),
        (  # refused before the event is looked at: no event_id (as on the wire)
            {"type": "input_image", "image_url": "https://example.com/cat.jpg"},
            "invalid_value",
            "item.content[1].image_url",
            None,
            False,
        ),
    ],
)
async def test_a_refused_part_places_nothing(
    content: dict[str, Any], code: str, param: str, message: str | None, echoed: bool
) -> None:
    parts = Parts()
    with pytest.raises(RealtimeError) as refused:
        await parts.create(text("Look:"), content, event_id="evt_1")
    error = refusal(refused.value)
    assert (error["code"], error["param"], error["event_id"]) == (code, param, "evt_1" if echoed else None)
    assert message is None or error["message"] == message
    assert parts.items.conversation.items == [] and parts.wire.sent == [] and parts.transcribed == []


async def test_placement_refusals_echo_the_event() -> None:
    parts = Parts()
    await parts.create(text("Hi"), id="mine")
    with pytest.raises(RealtimeError) as exists:
        await parts.create(text("Again"), id="mine", event_id="evt_2")
    with pytest.raises(RealtimeError) as missing:
        await parts.create(text("After"), previous_item_id="nope", event_id="evt_3")
    assert {k: refusal(exists.value)[k] for k in ("code", "param", "event_id")} == {
        "code": "item_create_duplicate_item_id",
        "param": "item.id",
        "event_id": "evt_2",
    }
    assert {k: refusal(missing.value)[k] for k in ("code", "param", "event_id")} == {
        "code": "item_not_found",
        "param": "previous_item_id",
        "event_id": "evt_3",
    }


async def test_retrieve_sends_the_item_with_its_audio_and_refuses_an_unknown_one() -> None:
    parts = Parts()
    item = await parts.create({"type": "input_audio", "audio": b64(pcm(100))})
    parts.wire.clear()
    await parts.items.on_retrieve(ItemRetrieveEvent(type="conversation.item.retrieve", item_id=item.id))
    [retrieved] = parts.wire.events(item.id)
    assert retrieved == {"type": "conversation.item.retrieved"} | {
        "item": {"id": "<item:1>", **MESSAGE, "role": "user"}
        | {"content": [{"type": "input_audio", "transcript": None, "audio": "<base64 4800 bytes>"}]}
    }
    not_found = {
        "type": "invalid_request_error",
        "code": "item_not_found",
        "message": "Item with item_id 'gone' not found",
        "param": "item_id",
        "event_id": "evt_4",
    }
    with pytest.raises(RealtimeError) as refused:
        await parts.items.on_retrieve(
            ItemRetrieveEvent(type="conversation.item.retrieve", item_id="gone", event_id="evt_4")
        )
    assert refusal(refused.value) == not_found
    with pytest.raises(RealtimeError) as refused:
        await parts.items.on_delete(ItemDeleteEvent(type="conversation.item.delete", item_id="gone", event_id="evt_4"))
    assert refusal(refused.value) == not_found
    assert len(parts.wire.sent) == 1
    parts.items.close()


async def test_a_truncate_stops_the_answer_being_written_first_then_cuts_it() -> None:
    parts = Parts()
    answer = Item(id="item_answer", role="assistant", content=[{"type": "output_audio", "transcript": "Two."}])
    answer.audio_ms = 500
    parts.items.add(answer, None, None)
    event = ItemTruncateEvent(
        type="conversation.item.truncate", item_id=answer.id, content_index=0, audio_end_ms=300, event_id="evt_5"
    )
    await parts.items.on_truncate(event)
    assert parts.stopped == [answer.id]
    assert parts.wire.events() == [
        {"type": "conversation.item.truncated", "item_id": answer.id, "content_index": 0, "audio_end_ms": 300}
    ]
    assert answer.audio_ms == 300
    beyond = event.model_copy(update={"audio_end_ms": 400})
    with pytest.raises(RealtimeError) as refused:
        await parts.items.on_truncate(beyond)
    error = refusal(refused.value)
    assert (error["param"], error["event_id"]) == ("audio_end_ms", "evt_5")
    assert len(parts.wire.sent) == 1
