"""Server turn detection on ``/v1/video/chat/stream`` (``session.config`` ``turn_detection``), with the
real Silero VAD on the engine: a question spoken by our own voice and padded with silence, streamed
as ``audio.chunk``s, becomes speech_started, speech_stopped and a turn (``input.transcript`` first);
speaking over an answer stops it; silence is never a turn and never fills the buffer."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support.messages import expect_close, expect_error, receive_json, receive_until
from support.video import b64, collect_turn, is_type, scene_frames, sync, synthesize, video, video_requests

from omniweb.conversation.vad import VoiceActivity

RATE = 16000
CHUNK = 3200  # 100 ms of PCM16 16 kHz
SERVER_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}


def silence(ms: int, seed: int = 0) -> bytes:
    """A quiet room: faint noise, not digital zero."""
    noise = np.random.default_rng(seed).normal(0, 30, RATE * ms // 1000)
    return noise.astype("<i2").tobytes()


def speech_extent_ms(pcm: bytes) -> tuple[float, float]:
    """Where the speech is on the waveform: 10 ms RMS within 30 dB of its loudest."""
    audio = np.frombuffer(pcm, "<i2").astype(np.float64)
    rms = np.sqrt(np.convolve(audio**2, np.ones(160) / 160, "same"))
    loud = np.flatnonzero(rms > rms.max() * 10 ** (-30 / 20))
    return 1000.0 * loud[0] / RATE, 1000.0 * loud[-1] / RATE


async def stream(comm, pcm: bytes, chunk: int = CHUNK) -> None:
    for i in range(0, len(pcm), chunk):
        await comm.send_json_to({"type": "audio.chunk", "data": b64(pcm[i : i + chunk])})


async def test_a_spoken_question_is_detected_and_answered_without_video_query(connect, requests_seen):
    speech = await synthesize("How many people are there?")
    onset, end = speech_extent_ms(speech)
    comm = await video(connect, modalities=["text"], turn_detection=SERVER_VAD)
    await scene_frames(comm)
    await stream(comm, silence(1000) + speech + silence(1500, seed=1))
    started = await receive_json(comm, 30)
    assert started["type"] == "input_audio_buffer.speech_started", started
    # Detected within a few 32 ms windows of the onset on the waveform, less the prefix padding.
    assert -100 <= started["audio_start_ms"] - (1000 + onset - 300) <= 200, (started, onset)
    stopped = await receive_json(comm, 30)
    assert stopped["type"] == "input_audio_buffer.speech_stopped", stopped
    # The stop is decided once the silence has lasted silence_duration_ms after the speech.
    assert -100 <= stopped["audio_end_ms"] - (1000 + end + 500) <= 300, (stopped, end)
    t = await collect_turn(comm, audio=False, timeout=60)
    assert t.types[:3] == ["input.transcript", "response.start", "video.frames.consumed"], t.types
    assert "how many people" in t.of_type("input.transcript")[0]["text"].lower()
    assert t.of_type("response.text.done")[0]["text"]
    [request] = video_requests(requests_seen)
    # The turn's audio is the speech segment: from the prefix-padded start to the stop.
    assert request["question"] == ""
    assert len(request["audio"]) == pytest.approx(32 * (stopped["audio_end_ms"] - started["audio_start_ms"]), abs=3200)
    await sync(comm)


async def test_speaking_over_an_answer_interrupts_it(connect):
    barge = await synthesize("Wait, is it dark?")
    comm = await video(connect, turn_detection=SERVER_VAD)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": "Describe everything you see in detail."})
    first = await receive_until(comm, is_type("response.audio.delta", "response.audio.done"), 60)
    assert first.types[-1] == "response.audio.delta", first.types  # the answer is being spoken
    await stream(comm, silence(300) + barge + silence(1200, seed=2))
    rest = await receive_until(comm, is_type("input_audio_buffer.speech_started"), 30)
    assert "response.audio.done" not in rest.types, rest.types  # the first answer never finished
    # Nothing more of the first answer: everything after speech_started belongs to the new turn.
    stopped = await receive_json(comm, 30)
    assert stopped["type"] == "input_audio_buffer.speech_stopped", stopped
    t = await collect_turn(comm, timeout=60)
    assert t.types[:2] == ["input.transcript", "response.start"], t.types
    assert "dark" in t.of_type("input.transcript")[0]["text"].lower()
    assert t.types.count("response.start") == 1 and t.types.count("response.text.done") == 1
    await sync(comm)


async def test_chunks_queued_behind_a_vad_call_are_heard_in_one_call(connect, requests_seen, monkeypatch):
    # A client sending faster than the VAD round trip (here an engine 50 ms away, as a busy one is):
    # 33 chunks do not cost 33 engine calls, and the speech times are those heard chunk by chunk.
    real = VoiceActivity._run

    async def far_away(self, pcm):
        await asyncio.sleep(0.05)
        return await real(self, pcm)

    monkeypatch.setattr(VoiceActivity, "_run", far_away)
    speech = await synthesize("Is anyone there?")
    onset, _ = speech_extent_ms(speech)
    comm = await video(connect, modalities=["text"], turn_detection={**SERVER_VAD, "create_response": False})
    await scene_frames(comm)
    pcm = silence(500) + speech + silence(1200, seed=4)
    await stream(comm, pcm)
    started = await receive_json(comm, 30)
    assert started["type"] == "input_audio_buffer.speech_started", started
    assert -100 <= started["audio_start_ms"] - (500 + onset - 300) <= 200, (started, onset)
    assert (await receive_json(comm, 30))["type"] == "input_audio_buffer.speech_stopped"
    await sync(comm)
    chunks = -(-len(pcm) // CHUNK)
    calls = [r for r in requests_seen if r.get("pipeline") == "audio.vad"]
    assert sum(len(r["pcm"]) for r in calls) == len(pcm) // 1024 * 1024  # every whole window heard once
    assert len(calls) <= chunks // 3, (len(calls), chunks)


async def test_silence_is_never_a_turn_and_never_fills_the_audio_buffer(connect, requests_seen):
    comm = await video(connect, modalities=["text"], turn_detection=SERVER_VAD)
    await scene_frames(comm)
    # Longer than the 4 MiB buffer holds (131 s), in 1 s chunks: far faster than real time, within
    # the session's inbox of 200 messages.
    await stream(comm, silence(140_000), chunk=10 * CHUNK)
    await sync(comm)  # no speech event, no overflow error came before the pong
    assert video_requests(requests_seen) == []


async def test_without_create_response_the_speech_waits_for_video_query(connect, requests_seen):
    speech = await synthesize("Is anyone there?")
    comm = await video(connect, modalities=["text"], turn_detection={**SERVER_VAD, "create_response": False})
    await scene_frames(comm)
    await stream(comm, silence(800) + speech + silence(1200, seed=3))
    assert (await receive_json(comm, 30))["type"] == "input_audio_buffer.speech_started"
    assert (await receive_json(comm, 30))["type"] == "input_audio_buffer.speech_stopped"
    await sync(comm)
    assert video_requests(requests_seen) == []
    await comm.send_json_to({"type": "video.query", "text": ""})
    t = await collect_turn(comm, audio=False, timeout=60)
    assert "anyone there" in t.of_type("input.transcript")[0]["text"].lower()
    [request] = video_requests(requests_seen)
    assert len(request["audio"]) < len(speech) + 32 * 1500  # the speech, not the silence before it


@pytest.mark.parametrize(
    ("turn_detection", "field"),
    [
        ({"type": "push_to_talk"}, "'server_vad', 'semantic_vad'"),
        ({"type": "semantic_vad", "eagerness": "eager"}, "eagerness"),
        ({"type": "server_vad", "threshold": 2}, "threshold"),
        ({"type": "server_vad", "silence_duration_ms": 0}, "silence_duration_ms"),
        ("server_vad", "turn_detection"),
    ],
)
async def test_bad_turn_detection_is_refused_naming_the_field(connect, turn_detection, field):
    comm = await video(connect, turn_detection=turn_detection)
    assert field in await expect_error(comm)
    await expect_close(comm)


async def test_null_turn_detection_keeps_turns_by_video_query(connect, requests_seen):
    speech = await synthesize("Is anyone there?")
    comm = await video(connect, modalities=["text"], turn_detection=None)
    await scene_frames(comm)
    await stream(comm, silence(500) + speech + silence(1000))
    await sync(comm)  # no speech events
    assert video_requests(requests_seen) == []


async def test_a_failed_vad_call_is_reported_and_the_session_goes_on(connect, monkeypatch):
    from omniweb.base.errors import CAPACITY_MESSAGE, EngineError, ErrorKind
    from omniweb.conversation import vad

    async def full(self, pcm16: bytes):  # the engine refused the VAD request (test double)
        raise EngineError(ErrorKind.CAPACITY, "full", client_message=CAPACITY_MESSAGE)

    monkeypatch.setattr(vad.VoiceActivity, "feed", full)
    comm = await video(connect, modalities=["text"], turn_detection=SERVER_VAD)
    await stream(comm, silence(100))
    error = await receive_json(comm)
    assert (error["type"], error["message"], error["kind"]) == ("error", CAPACITY_MESSAGE, "capacity")
    await sync(comm)
