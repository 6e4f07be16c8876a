"""Turns on ``/v1/video/chat/stream`` with the real ``video.turn`` pipeline (scene thinker, Whisper,
hibari): message order, modalities, frame sampling and ``video.frames.consumed``, bad frames never
reaching the thinker, the audio buffer, history, spoken questions, interrupts, ``video.done``,
failures without exception text, and disconnects."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import wave
from typing import Any

import pytest
from support.messages import expect_close, expect_error, receive_json, receive_until
from support.video import (
    QUESTION,
    ack,
    b64,
    collect_turn,
    frame,
    is_type,
    jpeg,
    scene_frames,
    sync,
    synthesize,
    video,
    video_requests,
)

from omniweb.base import metrics
from omniweb.base.errors import ErrorKind
from omniweb.engine import client as engine_client
from omniweb.engine import dispatch
from omniweb.engine.messages import End, PcmAudio, TextDelta
from omniweb.engine.requests import AnswerRequest


def wav_pcm(delta: dict[str, Any]) -> bytes:
    with wave.open(io.BytesIO(base64.b64decode(delta["data"]))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return w.readframes(w.getnframes())


# -- one turn -------------------------------------------------------------------------------------
async def test_text_and_audio_turn_order(connect):
    comm = await video(connect)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm)
    types = t.types
    assert types[0] == "response.start"
    assert types[1] == "video.frames.consumed"
    deltas = t.of_type("response.text.delta")
    assert deltas, types
    done = t.of_type("response.text.done")
    assert len(done) == 1
    assert done[0]["text"] == "".join(d["delta"] for d in deltas)  # the complete text
    last_delta = max(i for i, k in enumerate(types) if k == "response.text.delta")
    assert types.index("response.text.done") > last_delta
    audio = t.of_type("response.audio.delta")
    assert audio and all(a["format"] == "wav" for a in audio)
    pcm = b"".join(wav_pcm(a) for a in audio)
    assert len(pcm) > 24000  # over half a second of speech
    assert types[-1] == "response.audio.done"
    assert t.errors == []
    await sync(comm)  # the session goes on


async def test_a_turn_is_measured_first_text_first_audio_and_duration(connect):
    names = ("omniweb_video_first_text_seconds", "omniweb_video_first_audio_seconds")
    before = [metrics.REGISTRY.get_sample_value(f"{n}_count") or 0.0 for n in names]
    turns_before = metrics.REGISTRY.get_sample_value("omniweb_video_turn_seconds_count", {"outcome": "ok"}) or 0.0
    comm = await video(connect)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm)
    assert t.errors == []
    after = [metrics.REGISTRY.get_sample_value(f"{n}_count") for n in names]
    assert after == [b + 1 for b in before]  # once per turn, not per delta
    assert metrics.REGISTRY.get_sample_value("omniweb_video_turn_seconds_count", {"outcome": "ok"}) == turns_before + 1
    first_text = metrics.REGISTRY.get_sample_value("omniweb_video_first_text_seconds_sum")
    assert first_text is not None and first_text > 0


async def test_frames_consumed_lists_the_sampled_frames(connect):
    comm = await video(connect, num_frames=4, enable_frame_filter=False)
    for i in range(10):
        await frame(comm, jpeg(20 * i), f"f{i}", pts_ms=100 * i, source_pts_ms=1000 + i, quality_profile="low")
        await ack(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm)
    [consumed] = t.of_type("video.frames.consumed")
    assert consumed["frame_ids"] == ["f0", "f2", "f4", "f9"]  # stride 2, plus the newest
    assert consumed["latest_pts_ms"] == 900
    assert consumed["request_id"].startswith("video-")
    first = consumed["frames"][0]
    assert set(first) == {
        "frame_id",
        "pts_ms",
        "source_pts_ms",
        "quality_profile",
        "receiver_received_ts_ms",
        "decoded_ready_ts_ms",
    }
    assert (first["pts_ms"], first["source_pts_ms"], first["quality_profile"]) == (0, 1000, "low")
    assert first["receiver_received_ts_ms"] <= first["decoded_ready_ts_ms"] <= consumed["model_selected_ts_ms"]
    assert t.types.index("video.frames.consumed") < t.types.index("response.text.delta")


async def test_no_frames_consumed_without_frame_ids(connect, requests_seen):
    comm = await video(connect, modalities=["text"])
    await scene_frames(comm, 2, ids=False)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm, audio=False)
    assert t.of_type("video.frames.consumed") == []
    [request] = video_requests(requests_seen)
    assert [f["frame_id"] for f in request["frames"]] == [None, None]


async def test_text_only_modality(connect, requests_seen):
    comm = await video(connect, modalities=["text"])
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm, audio=False)
    assert t.of_type("response.text.delta")
    assert not t.of_type("response.audio.delta")
    await expect_silence_then_pong(comm)  # no response.audio.done follows
    assert video_requests(requests_seen)[0]["modalities"] == ["text"]


async def test_audio_only_modality_still_closes_with_text_done(connect):
    comm = await video(connect, modalities=["audio"])
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm)
    assert not t.of_type("response.text.delta")
    assert t.of_type("response.audio.delta")
    assert t.of_type("response.text.done")[0]["text"]  # the caption of what was said
    assert t.types[-1] == "response.audio.done"


async def expect_silence_then_pong(comm) -> None:
    await comm.send_json_to({"type": "ping"})
    assert await receive_json(comm) == {"type": "pong"}


async def test_engine_request_follows_the_contract(connect, requests_seen):
    comm = await video(connect, system_prompt="Be brief.", model="some-vlm", voice="heart", num_frames=2)
    await scene_frames(comm, 3)
    pcm = b"\x01\x00" * 800
    await comm.send_json_to({"type": "audio.chunk", "data": b64(pcm)})
    await comm.send_json_to({"type": "video.query", "text": QUESTION, "audio_data": b64(b"\x02\x00" * 10)})
    await collect_turn(comm)
    [request] = video_requests(requests_seen)
    assert request["kind"] == "AnswerRequest"  # the typed request, as the Redis mode sends it
    assert set(request) == {"kind", *(f.name for f in dataclasses.fields(AnswerRequest))}
    assert request["timestamps"] is True  # the spoken answer's word timings (audio is in the modalities)
    assert request["question"] == QUESTION
    assert request["audio"] == pcm + b"\x02\x00" * 10  # session buffer, then the query's audio
    assert [(f["frame_id"], f["pts_ms"]) for f in request["frames"]] == [("f0", 0), ("f2", 1000)]
    assert all(f["data"].startswith(b"\xff\xd8\xff") for f in request["frames"])  # the JPEG bytes as received
    assert (request["system_prompt"], request["model"], request["voice"]) == ("Be brief.", "some-vlm", "heart")
    assert request["history"] == []
    # The buffer went with that query: the next one starts empty.
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    await collect_turn(comm)
    assert video_requests(requests_seen)[1]["audio"] == b""


async def test_overflowing_query_audio_is_reported_and_the_turn_still_runs(connect, requests_seen):
    comm = await video(connect, modalities=["text"])
    await scene_frames(comm)
    big = b64(b"\0" * (3 * 1024 * 1024))
    await comm.send_json_to({"type": "audio.chunk", "data": big})
    await comm.send_json_to({"type": "video.query", "text": QUESTION, "audio_data": big})
    assert await expect_error(comm) == "Audio buffer overflow"
    t = await collect_turn(comm, audio=False)
    assert t.of_type("response.text.done")
    assert video_requests(requests_seen)[0]["audio"] == b""


async def test_history_carries_earlier_turns(connect, requests_seen, settings):
    settings.VIDEO_HISTORY_TURNS = 2
    comm = await video(connect, modalities=["text"])
    await scene_frames(comm)
    answers = []
    for question in ("What do you see?", "Is it dark?", "What colour is it?"):
        await comm.send_json_to({"type": "video.query", "text": question})
        answers.append((await collect_turn(comm, audio=False)).of_type("response.text.done")[0]["text"])
    histories = [
        [{"role": h["role"], "content": h["content"]} for h in r["history"]] for r in video_requests(requests_seen)
    ]
    assert not any(h["calls"] or h["call_id"] for r in video_requests(requests_seen) for h in r["history"])
    assert histories[0] == []
    assert histories[1] == [
        {"role": "user", "content": "What do you see?"},
        {"role": "assistant", "content": answers[0]},
    ]
    assert histories[2] == [  # bounded to the last VIDEO_HISTORY_TURNS turns
        {"role": "user", "content": "What do you see?"},
        {"role": "assistant", "content": answers[0]},
        {"role": "user", "content": "Is it dark?"},
        {"role": "assistant", "content": answers[1]},
    ]
    await comm.send_json_to({"type": "video.query", "text": "Anything else?"})
    await collect_turn(comm, audio=False)
    assert [h["content"] for h in video_requests(requests_seen)[3]["history"][::2]] == [
        "Is it dark?",
        "What colour is it?",
    ]


# -- bad frames never reach the thinker -----------------------------------------------------------
async def test_a_frame_that_does_not_decode_is_never_given_to_the_thinker(connect, requests_seen):
    comm = await video(connect, enable_frame_filter=False, modalities=["text"])
    good, broken = jpeg(10), jpeg(200)[:-40]
    await frame(comm, good, "good1")
    await frame(comm, broken, "broken")
    await frame(comm, jpeg(90), "good2")
    # Query at once: the turn waits for the decodes it needs.
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await receive_until(comm, is_type("response.text.done"), 30)
    assert t.errors == ["Frame decode failed"]
    [consumed] = t.of_type("video.frames.consumed")
    assert consumed["frame_ids"] == ["good1", "good2"]
    [request] = video_requests(requests_seen)
    assert [f["frame_id"] for f in request["frames"]] == ["good1", "good2"]


async def test_query_when_every_frame_failed_to_decode(connect):
    comm = await video(connect, enable_frame_filter=False)
    await frame(comm, jpeg()[:-40], "broken")
    await ack(comm)
    assert await expect_error(comm) == "Frame decode failed"
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    assert await expect_error(comm) == "No frames buffered"
    await sync(comm)


# -- spoken questions -----------------------------------------------------------------------------


async def test_spoken_question_is_transcribed_before_the_response(connect, requests_seen):
    speech = await synthesize("How many people are there?")
    comm = await video(connect, modalities=["text"])
    await scene_frames(comm)
    half = len(speech) // 4 * 2
    await comm.send_json_to({"type": "audio.chunk", "data": b64(speech[:half])})
    await comm.send_json_to({"type": "video.query", "text": "", "audio_data": b64(speech[half:])})
    t = await collect_turn(comm, audio=False, timeout=60)
    assert t.types[:3] == ["input.transcript", "response.start", "video.frames.consumed"]
    heard = t.of_type("input.transcript")[0]["text"].lower()
    assert "how many people" in heard, heard
    assert t.of_type("response.text.done")[0]["text"]
    [request] = video_requests(requests_seen)
    assert request["question"] == "" and request["audio"] == speech
    # What was heard becomes the question in the history.
    await comm.send_json_to({"type": "video.query", "text": "And now?"})
    await collect_turn(comm, audio=False)
    assert "how many people" in video_requests(requests_seen)[1]["history"][0]["content"].lower()


# -- interrupts and video.done ---------------------------------------------------------------------
async def test_new_query_interrupts_the_active_turn(connect, requests_seen):
    comm = await video(connect)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": "Describe everything you see in detail."})
    first = await receive_until(comm, is_type("response.start"))
    assert first.types == ["response.start"]
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm)
    # Turn 1 sent nothing after the interrupt; everything from turn 2's response.start on is turn 2's.
    starts = [i for i, k in enumerate(t.types) if k == "response.start"]
    assert len(starts) == 1, t.types
    assert len(t.of_type("response.text.done")) == 1
    consumed = t.of_type("video.frames.consumed")
    turn2_id = consumed[-1]["request_id"]
    assert all(c["request_id"] == turn2_id for c in consumed[1:])
    assert t.types.index("video.frames.consumed", starts[0]) > starts[0]
    await expect_silence_then_pong(comm)
    # Only the finished turn is remembered.
    await comm.send_json_to({"type": "video.query", "text": "Again?"})
    await collect_turn(comm)
    history = video_requests(requests_seen)[2]["history"]
    assert [h["content"] for h in history[::2]] == [QUESTION]


async def test_back_to_back_queries_answer_only_the_last(connect):
    comm = await video(connect, modalities=["text"])
    await scene_frames(comm)
    for text in ("One?", "Two?", QUESTION):
        await comm.send_json_to({"type": "video.query", "text": text})
    t = await collect_turn(comm, audio=False)
    await expect_silence_then_pong(comm)
    assert len(t.of_type("response.text.done")) == 1
    assert t.types.count("video.frames.consumed") == 1


async def test_video_done_waits_for_the_active_turn(connect):
    comm = await video(connect)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    await comm.send_json_to({"type": "video.done"})
    t = await receive_until(comm, is_type("session.done"), 30)
    types = t.types
    assert types[0] == "response.start"
    assert types[-2:] == ["response.audio.done", "session.done"]
    assert types.count("response.text.done") == 1
    await expect_close(comm)


async def test_disconnect_mid_turn_frees_the_engine(connect):
    comm = await video(connect)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": "Describe everything you see in detail."})
    await receive_until(comm, is_type("response.start"))
    await comm.disconnect()
    # The autouse fixture then checks the engine went idle and no session task was left behind.


# -- failures -------------------------------------------------------------------------------------
def break_engine_after(monkeypatch, kind: type) -> None:
    """The engine stream breaks after its first ``kind`` chunk with an exception carrying internal text."""
    for cls in (engine_client.LocalEngineClient, dispatch.ChannelEngineClient):
        real = cls.stream

        async def broken(self, request, request_id=None, _real=real):
            async for chunk in _real(self, request, request_id):
                yield chunk
                if isinstance(chunk, kind):
                    raise RuntimeError("secret internal detail /srv/models")

        monkeypatch.setattr(cls, "stream", broken)


@pytest.fixture
def failing_engine(monkeypatch) -> None:
    break_engine_after(monkeypatch, TextDelta)


async def test_failure_after_audio_started_still_ends_the_audio(connect, monkeypatch):
    break_engine_after(monkeypatch, PcmAudio)
    comm = await video(connect)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await receive_until(comm, is_type("response.audio.done"), 30)
    assert t.errors == ["Query processing failed"]
    # the text was complete before the audio failed: its text.done went out then, not again
    assert t.types[-2:] == ["error", "response.audio.done"]
    assert t.types.count("response.text.done") == 1
    assert len(t.of_type("response.audio.delta")) == 1


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_failure_sends_error_then_text_done_without_exception_text(connect, failing_engine):
    engine_before = sample("omniweb_errors_total", kind="engine_failure")
    client_before = sample("omniweb_errors_total", kind="client_error")
    failed_before = sample("omniweb_video_turn_seconds_count", outcome="error")
    comm = await video(connect)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await receive_until(comm, is_type("response.text.done"), 30)
    assert t.types[0] == "response.start"
    assert t.errors == ["Query processing failed"]
    assert t.of_type("error")[0]["kind"] == "engine_failure"
    # A server failure is counted as one, not as a client's protocol error.
    assert sample("omniweb_errors_total", kind="engine_failure") == engine_before + 1
    assert sample("omniweb_errors_total", kind="client_error") == client_before
    assert sample("omniweb_video_turn_seconds_count", outcome="error") == failed_before + 1
    assert t.types.index("error") < t.types.index("response.text.done")
    assert "secret" not in json.dumps(t.json)
    assert t.of_type("response.text.done")[0]["text"] == "".join(d["delta"] for d in t.of_type("response.text.delta"))
    await expect_silence_then_pong(comm)


@pytest.fixture
def busy_engine(monkeypatch) -> None:
    for cls in (engine_client.LocalEngineClient, dispatch.ChannelEngineClient):

        async def busy(self, request, request_id=None):
            yield End.failed(ErrorKind.CAPACITY, "server is at capacity; retry shortly")

        monkeypatch.setattr(cls, "stream", busy)


async def test_engine_at_capacity(connect, busy_engine):
    comm = await video(connect)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await receive_until(comm, is_type("response.text.done"))
    assert t.types == ["response.start", "error", "response.text.done"]
    assert t.errors == ["server is at capacity; retry shortly"]
    assert t.of_type("error")[0]["kind"] == "capacity"
    assert t.of_type("response.text.done")[0]["text"] == ""


async def test_a_turn_keeps_the_session_reading(connect):
    """Frames and pings are handled while a turn streams (the reader never waits for the turn)."""
    comm = await video(connect, enable_frame_filter=False)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": "Describe everything you see in detail."})
    await receive_until(comm, is_type("response.start"))
    await frame(comm, jpeg(), "during")
    await comm.send_json_to({"type": "ping"})
    t = await receive_until(comm, is_type("response.audio.done"), 30)
    assert t.of_type("video.frame.ack")[0]["buffered_frames"] == 3
    assert t.of_type("pong")
