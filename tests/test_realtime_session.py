"""``/v1/realtime`` sessions in process, over both dispatch paths (the embedded engine, and Redis with
engine workers, where the VAD, Whisper and the voice all run on the workers)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hibari import Hibari
from support.messages import RECEIVE_TIMEOUT

RATE = 24000
PATH = "/v1/realtime?model=gpt-realtime"
CHUNK = RATE * 2 // 10  # 100 ms appends


@pytest.fixture(scope="module")
def voice() -> Hibari:
    return Hibari()


def pcm(voice: Hibari, text: str) -> bytes:
    return (np.clip(voice(text, seed=7), -1, 1) * 32767).astype("<i2").tobytes()


def trimmed(voice: Hibari, text: str) -> bytes:
    """Our voice without its own leading and trailing silence."""
    wave = np.clip(voice(text, seed=7), -1, 1)
    loud = np.flatnonzero(np.abs(wave) > 0.02 * np.abs(wave).max())
    return (wave[loud[0] : loud[-1] + 1] * 32767).astype("<i2").tobytes()


def silence(seconds: float) -> bytes:
    return bytes(int(RATE * seconds) * 2)


async def recv(comm: Any, timeout: float = RECEIVE_TIMEOUT) -> dict[str, Any]:
    return await comm.receive_json_from(timeout=timeout)


async def until(comm: Any, kind: str, timeout: float = 60) -> list[dict[str, Any]]:
    events = []
    while True:
        events.append(await recv(comm, timeout))
        if events[-1]["type"] == kind:
            return events


async def open_session(connect: Callable[..., Any], **session: Any) -> Any:
    comm = await connect(PATH)
    assert (await recv(comm))["type"] == "session.created"
    if session:
        await comm.send_json_to({"type": "session.update", "session": {"type": "realtime", **session}})
        assert (await recv(comm))["type"] == "session.updated"
    return comm


async def append(comm: Any, audio: bytes) -> None:
    for i in range(0, len(audio), CHUNK):
        await comm.send_json_to(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(audio[i : i + CHUNK]).decode()}
        )


async def test_the_transcript_streams_while_the_question_is_spoken(connect: Callable[..., Any], voice: Hibari) -> None:
    """Streaming recognition: appended at a microphone's pace, a 2.5 s question has transcription
    deltas for its item before speech_stopped; the deltas join to the completed transcript."""
    import asyncio

    comm = await open_session(
        connect, output_modalities=["text"], audio={"input": {"transcription": {"model": "whisper-1"}}}
    )
    question = silence(0.5) + trimmed(voice, "Please tell me how many people you can see in the room.") + silence(1.5)
    for i in range(0, len(question), CHUNK):
        await comm.send_json_to(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(question[i : i + CHUNK]).decode()}
        )
        await asyncio.sleep(0.1)  # 100 ms of audio per 100 ms
    events = await until(comm, "response.done")
    types = [e["type"] for e in events]
    assert "error" not in types, events
    item_id = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")["item_id"]
    stopped = types.index("input_audio_buffer.speech_stopped")
    early = [e for e in events[:stopped] if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert early and all(e["item_id"] == item_id for e in early), types
    heard = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    deltas = [e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert heard["item_id"] == item_id and "".join(deltas) == heard["transcript"]
    assert {"people", "room"} <= set(heard["transcript"].lower().replace(".", "").split())


async def test_a_pause_inside_a_question_does_not_end_the_turn(connect: Callable[..., Any], voice: Hibari) -> None:
    """The early transcription started at the pause is dropped when the speaker goes on: the turn's
    transcript has the whole question."""
    comm = await open_session(
        connect, output_modalities=["text"], audio={"input": {"transcription": {"model": "whisper-1"}}}
    )
    # 350 ms of silence: past the early transcription's 200 ms, short of the turn's 500 ms
    question = silence(0.5) + trimmed(voice, "How many people") + silence(0.35) + trimmed(voice, "can you see?")
    await append(comm, question + silence(1.5))
    events = await until(comm, "response.done")
    types = [e["type"] for e in events]
    assert "error" not in types, events
    assert types.count("input_audio_buffer.speech_started") == 1
    assert types.count("input_audio_buffer.speech_stopped") == 1
    heard = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    words = heard["transcript"].lower()
    assert "people" in words and "see" in words, heard
    deltas = [e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert "".join(deltas) == heard["transcript"]  # the abandoned early pass sent none
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"]


async def test_an_audio_item_and_an_answer_kept_out_of_the_conversation(
    connect: Callable[..., Any], voice: Hibari
) -> None:
    comm = await open_session(connect, output_modalities=["text"], audio={"input": {"turn_detection": None}})
    audio = base64.b64encode(pcm(voice, "What colour is the wall?")).decode()
    await comm.send_json_to(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]},
        }
    )
    added = await until(comm, "conversation.item.done")
    item_id = added[-1]["item"]["id"]
    await comm.send_json_to({"type": "response.create", "response": {"conversation": "none", "metadata": {"k": "v"}}})
    events = await until(comm, "response.done")
    types = [e["type"] for e in events]
    assert "conversation.item.added" not in types and "conversation.item.done" not in types
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["conversation_id"] is None and done["metadata"] == {"k": "v"}
    await comm.send_json_to({"type": "conversation.item.retrieve", "item_id": done["output"][0]["id"]})
    assert (await recv(comm))["error"]["code"] == "item_not_found"
    await comm.send_json_to({"type": "conversation.item.retrieve", "item_id": item_id})
    item = (await recv(comm))["item"]
    assert "wall" in item["content"][0]["transcript"].lower()  # the response's Whisper pass heard it
    await comm.send_json_to({"type": "conversation.item.delete", "item_id": item_id})
    deleted = await recv(comm)
    assert (deleted["type"], deleted["item_id"]) == ("conversation.item.deleted", item_id)


async def test_a_cancel_stops_the_response_while_earlier_events_wait_for_the_vad(
    connect: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """response.cancel overtakes the session's inbox: the response stops while an append before it
    still waits for its VAD round trip; the cancel is then answered in order (response.done
    cancelled after that append is handled)."""
    from omniweb.conversation import TurnSpec
    from omniweb.openai_api.realtime.consumer import RealtimeConsumer

    consumers: list[RealtimeConsumer] = []
    connect_consumer = RealtimeConsumer.connect

    async def keep(self: RealtimeConsumer) -> None:
        consumers.append(self)
        await connect_consumer(self)

    stopped, vad_free = asyncio.Event(), asyncio.Event()

    async def endless(self: TurnSpec, engine: Any) -> Any:  # a response that runs until it is stopped
        try:
            await asyncio.Event().wait()
            yield
        finally:
            stopped.set()

    async def slow_feed(pcm: bytes) -> list[Any]:  # a VAD round trip that takes its time
        await vad_free.wait()
        return []

    monkeypatch.setattr(RealtimeConsumer, "connect", keep)
    monkeypatch.setattr(TurnSpec, "run", endless)
    comm = await open_session(connect, output_modalities=["text"])
    [consumer] = consumers
    monkeypatch.setattr(consumer.listener, "feed", slow_feed)
    question = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Who is there?"}]}
    await comm.send_json_to({"type": "conversation.item.create", "item": question})
    await comm.send_json_to({"type": "response.create"})
    await until(comm, "response.content_part.added")
    await comm.send_json_to({"type": "input_audio_buffer.append", "audio": base64.b64encode(silence(0.1)).decode()})
    await comm.send_json_to({"type": "response.cancel"})
    await asyncio.wait_for(stopped.wait(), 10)  # at once: the append before it is still being heard
    assert not vad_free.is_set()
    vad_free.set()
    events = await until(comm, "response.done")
    assert "error" not in [e["type"] for e in events], events
    assert events[-1]["response"]["status"] == "cancelled"
    assert events[-1]["response"]["status_details"]["reason"] == "client_cancelled"
