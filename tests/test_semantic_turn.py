"""Semantic turn detection (``semantic_vad``): Smart Turn v3.2 from pipecat-ai's wheel as the engine's
"audio.turn" pipeline, judging each pause that Silero VAD finds.

The model and its input are checked against the wheel itself (its file, pipecat's own feature code);
the detector on questions in our own voice with a pause in the middle of the sentence, through the
engine on both dispatch paths: ``server_vad`` cuts the speaker off at the pause, ``semantic_vad``
waits and ends the turn after the question. Several sessions' checks share one model call.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.metadata
import importlib.util
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np
import pytest
import support.engine as engine_support
from hibari import Hibari
from support.engine import typed_request
from support.messages import RECEIVE_TIMEOUT
from support.paused_speech import PausedQuestion, paused_question, pcm16, spoken

from omniweb.asr.turn_engine import MAX_WINDOWS, WINDOW_SAMPLES, SmartTurn, TurnPipeline, features, model_path
from omniweb.asr.vad_engine import VadPipeline
from omniweb.base.errors import ErrorKind
from omniweb.conversation.vad import (
    CHECK_MS,
    EAGERNESS,
    TURN_TAILS_MS,
    SemanticVoiceActivity,
    SpeechStarted,
    SpeechStopped,
    VadParams,
    VoiceActivity,
)
from omniweb.engine.client import LocalEngineClient
from omniweb.engine.messages import Chunk, End, TurnProbabilities
from omniweb.engine.requests import EndOfTurnRequest, EngineRequest
from omniweb.engine.scheduler import Scheduler

RATE = 16_000
# "next to" keeps the voice's intonation rising: every window the detector sends scores it below 0.1
QUESTION = "How many people are standing next to, the window?"
WINDOW_MS = 32.0


@pytest.fixture(scope="module")
def voice() -> Hibari:
    return Hibari()


@pytest.fixture(scope="module")
def model() -> SmartTurn:
    return SmartTurn()


# -- the model, from the wheel ----------------------------------------------------------------------


def test_the_model_file_is_the_one_the_pinned_wheel_ships() -> None:
    path = model_path()
    assert path.name == "smart-turn-v3.2-cpu.onnx" and path.stat().st_size > 8_000_000
    assert importlib.metadata.version("pipecat-ai") == "1.14.0"


def test_the_features_are_the_log_mel_spectrogram_smart_turn_is_fed(voice: Hibari) -> None:
    """faster-whisper's extractor on the padded, normalized window equals pipecat's own numpy copy of
    transformers' Whisper features (loaded from the wheel by path: pipecat itself is not importable
    without its dependencies)."""
    reference = importlib.metadata.distribution("pipecat-ai").locate_file(
        "pipecat/audio/turn/smart_turn/_whisper_features.py"
    )
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", str(reference))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for seconds in (1.5, 9.0):  # shorter than the window (zero-padded at the front) and longer (its end)
        audio = np.concatenate([np.zeros(RATE // 2, np.float32), spoken(voice, "Is it dark in here?")])
        audio = np.resize(audio, int(RATE * seconds))
        pcm = pcm16(audio)
        samples = np.frombuffer(pcm, "<i2").astype(np.float32)[-WINDOW_SAMPLES:] / 32768.0
        expected = module.compute_whisper_log_mel_features(np.pad(samples, (WINDOW_SAMPLES - samples.size, 0)))
        ours = features(pcm)
        assert ours.shape == expected.shape == (80, 800) and ours.dtype == np.float32
        assert np.abs(ours - expected).max() < 1e-4


def _turn_windows(audio: np.ndarray, end_ms: float) -> list[bytes]:
    """The windows the detector sends at a pause that began at ``end_ms``."""
    return [pcm16(audio[: int(RATE * (end_ms + tail) / 1000)]) for tail in TURN_TAILS_MS]


def test_a_finished_question_scores_higher_than_one_cut_off_mid_sentence(voice: Hibari, model: SmartTurn) -> None:
    q = paused_question(voice, QUESTION, 1.0)
    cut = model.probs(_turn_windows(q.audio, q.pause_start_ms + WINDOW_MS))
    finished = model.probs(_turn_windows(q.audio, q.speech_end_ms + WINDOW_MS))
    assert finished.min() > cut.max(), (finished, cut)
    assert finished.min() >= EAGERNESS["medium"].threshold and cut.max() < EAGERNESS["high"].threshold


def test_one_call_scores_many_windows_as_each_alone(voice: Hibari, model: SmartTurn) -> None:
    q = paused_question(voice, QUESTION, 1.0)
    windows = [*_turn_windows(q.audio, q.pause_start_ms), *_turn_windows(q.audio, q.speech_end_ms)]
    together = model.probs(windows)
    alone = np.concatenate([model.probs([w]) for w in windows])
    assert np.allclose(together, alone, atol=1e-4)


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({}, "windows"),
        ({"windows": []}, "windows"),
        ({"windows": [b"\x00\x00"] * (MAX_WINDOWS + 1)}, "windows"),
        ({"windows": [b""]}, "non-empty"),
        ({"windows": [b"\x00"]}, "PCM16"),
        ({"windows": ["text"]}, "windows must be tuple"),
        ({"windows": [bytes(2 * WINDOW_SAMPLES + 2)]}, "at most"),
    ],
)
def test_the_pipeline_refuses_malformed_requests(request_fields: dict[str, Any], message: str) -> None:
    pipeline = TurnPipeline.__new__(TurnPipeline)  # validation needs no model
    with pytest.raises(ValueError, match=message):
        pipeline.validate(typed_request(EndOfTurnRequest, **request_fields))


# -- the detector, through the engine (in-process and Redis workers) --------------------------------


@pytest.fixture
async def engine_client(engine: Any) -> AsyncIterator[Any]:
    from omniweb.engine.runtime import get_engine_client

    if engine_support.redis_url is not None:
        engine_support.reset_engine_client()  # channels_redis binds to this test's event loop
    yield get_engine_client()
    if engine_support.redis_url is not None:
        from channels.layers import channel_layers

        layer = channel_layers.backends.get("default")
        if layer is not None:
            await layer.close_pools()


async def detect(vad: VoiceActivity, audio: np.ndarray, chunk_ms: int = 20) -> list[Any]:
    """Feed ``audio`` (16 kHz) as a client streams it; the events in order."""
    pcm, step = pcm16(audio), RATE * chunk_ms // 1000 * 2
    events = []
    for i in range(0, len(pcm), step):
        events += await vad.feed(pcm[i : i + step])
    return events


async def test_a_pause_mid_sentence_ends_a_server_vad_turn_but_not_a_semantic_one(engine_client, voice) -> None:
    q = paused_question(voice, QUESTION, 0.8)
    server = await detect(VoiceActivity(engine_client, VadParams()), q.audio)
    assert [type(e) for e in server] == [SpeechStarted, SpeechStopped] * 2  # cut off at the pause
    semantic = await detect(SemanticVoiceActivity(engine_client, "auto"), q.audio)
    assert [type(e) for e in semantic] == [SpeechStarted, SpeechStopped], semantic
    assert semantic[0] == server[0]  # the same VAD finds the speech
    # The stop comes after the question, within the check's silence and a few windows of it:
    # well before server_vad's 500 ms of silence.
    assert q.speech_end_ms < semantic[1].audio_end_ms <= q.speech_end_ms + CHECK_MS + 4 * WINDOW_MS
    assert semantic[1].audio_end_ms < server[3].audio_end_ms


class _Scripted:
    """An engine client whose end-of-turn model says what the test wants (or fails); the VAD is real."""

    def __init__(self, engine: Any, probs: float | None) -> None:
        self._engine = engine
        self._probs = probs
        self.turn_requests = 0

    async def stream(self, request: EngineRequest, request_id: str | None = None) -> AsyncIterator[Chunk]:
        if not isinstance(request, EndOfTurnRequest):
            async for chunk in self._engine.stream(request, request_id):
                yield chunk
            return
        self.turn_requests += 1
        if self._probs is None:
            yield End.failed(ErrorKind.CAPACITY, "server is at capacity")
            return
        yield TurnProbabilities((self._probs,) * len(request.windows))
        yield End()

    async def abort(self, request_id: str) -> None:
        return None


@pytest.mark.parametrize("probs", [0.05, None], ids=["never-complete", "model-fails"])
async def test_a_pause_never_judged_final_ends_the_turn_at_the_maximum_wait(engine_client, voice, probs) -> None:
    """high eagerness: 2 s. A failing model is a pause not judged final: the wait still ends the turn."""
    wait = EAGERNESS["high"].max_wait_ms
    audio = np.concatenate([np.zeros(RATE // 2, np.float32), spoken(voice, "Is it dark in here?")])
    audio = np.concatenate([audio, np.zeros(int(RATE * (wait / 1000 + 0.5)), np.float32)])
    client = _Scripted(engine_client, probs)
    vad = SemanticVoiceActivity(client, "high")
    events = await detect(vad, audio)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped] and client.turn_requests == 1
    end_ms = 1000 * (RATE // 2 + len(spoken(voice, "Is it dark in here?"))) / RATE
    assert end_ms + wait <= events[1].audio_end_ms <= end_ms + wait + 4 * WINDOW_MS


async def test_each_pause_is_judged_once_and_the_turn_goes_on_after_a_pause_judged_not_final(
    engine_client, voice
) -> None:
    client = _Scripted(engine_client, 0.05)
    q = paused_question(voice, QUESTION, 0.8, tail_s=1.0)
    events = await detect(SemanticVoiceActivity(client, "auto"), q.audio)
    assert [type(e) for e in events] == [SpeechStarted] and client.turn_requests == 2  # the pause, the end


async def test_reset_forgets_the_turn_and_its_audio(engine_client, voice) -> None:
    q = paused_question(voice, QUESTION, 0.8)
    vad = SemanticVoiceActivity(engine_client, "auto")
    half = int(RATE * q.pause_start_ms / 1000)
    assert [type(e) for e in await detect(vad, q.audio[:half])] == [SpeechStarted]
    vad.reset()  # input_audio_buffer.clear
    again = await detect(vad, q.audio)
    assert [type(e) for e in again] == [SpeechStarted, SpeechStopped]
    assert again[1].audio_end_ms > 1000 * half / RATE + q.speech_end_ms  # the clock kept running


# -- batching across sessions -----------------------------------------------------------------------


async def test_two_sessions_pausing_at_once_share_one_model_call(voice) -> None:
    vad_pipeline, turn_pipeline = VadPipeline(), TurnPipeline()
    loop = turn_pipeline.loops[0]
    model = loop._model
    calls: list[int] = []
    score = model.probs

    def counted(windows: Sequence[bytes]) -> np.ndarray:
        calls.append(len(windows))
        return score(windows)

    model.probs = counted  # type: ignore[method-assign]
    batches: list[tuple[str, int]] = []
    # One worker and a batching window: what two sessions ask within it runs as one step.
    sched = Scheduler(
        {"audio.vad": vad_pipeline, "audio.turn": turn_pipeline},
        workers=1,
        max_batch=8,
        batch_wait=0.5,
        on_batch=lambda kind, n: batches.append((kind, n)),
    )
    sched.start()
    try:
        client = LocalEngineClient(sched)
        audio = np.concatenate([np.zeros(RATE // 2, np.float32), spoken(voice, "Is it dark in here?")])
        audio = np.concatenate([audio, np.zeros(RATE, np.float32)])
        sessions = [SemanticVoiceActivity(client, "auto") for _ in range(2)]
        results = await asyncio.gather(*(s.feed(pcm16(audio)) for s in sessions))
    finally:
        sched.stop()
    assert results[0] == results[1] and [type(e) for e in results[0]] == [SpeechStarted, SpeechStopped]
    windows = len(TURN_TAILS_MS)
    assert calls == [2 * windows], calls  # both sessions' windows in one model call
    assert ("turn", 2) in batches, batches


# -- the endpoints ----------------------------------------------------------------------------------

REALTIME_PATH = "/v1/realtime?model=gpt-realtime"
REALTIME_RATE = 24_000


async def _until(comm: Any, kind: str, timeout: float = 60) -> list[dict[str, Any]]:
    events = []
    while True:
        events.append(await comm.receive_json_from(timeout=timeout))
        if events[-1]["type"] == kind:
            return events


async def test_a_realtime_agent_session_update_with_tracing_and_semantic_vad_is_accepted_and_waits_out_the_pause(
    connect: Callable[..., Any], voice: Hibari
) -> None:
    """What openai-agents' realtime agent sends by default: its instructions are kept, nothing is
    traced, and the question is answered once, after the pause inside it."""
    comm = await connect(REALTIME_PATH)
    assert (await comm.receive_json_from(timeout=RECEIVE_TIMEOUT))["type"] == "session.created"
    session = {
        "type": "realtime",
        "instructions": "Answer in one short sentence.",
        "output_modalities": ["text"],
        "tracing": "auto",
        "audio": {
            "input": {
                "transcription": {"model": "whisper-1"},
                "turn_detection": {"type": "semantic_vad", "eagerness": "auto", "interrupt_response": True},
            }
        },
    }
    await comm.send_json_to({"type": "session.update", "session": session})
    updated = await comm.receive_json_from(timeout=RECEIVE_TIMEOUT)
    assert updated["type"] == "session.updated", updated
    assert updated["session"]["instructions"] == "Answer in one short sentence."
    assert updated["session"]["tracing"] is None  # accepted, not kept: this server traces nothing
    turn = updated["session"]["audio"]["input"]["turn_detection"]
    assert turn == {"type": "semantic_vad", "eagerness": "auto", "create_response": True, "interrupt_response": True}
    q: PausedQuestion = paused_question(voice, QUESTION, 0.8, rate=REALTIME_RATE)
    pcm, chunk = pcm16(q.audio), REALTIME_RATE * 2 // 10
    for i in range(0, len(pcm), chunk):
        audio = base64.b64encode(pcm[i : i + chunk]).decode()
        await comm.send_json_to({"type": "input_audio_buffer.append", "audio": audio})
    events = await _until(comm, "response.done")
    types = [e["type"] for e in events]
    assert "error" not in types, events
    assert types.count("input_audio_buffer.speech_started") == 1
    [stopped] = [e for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    assert stopped["audio_end_ms"] > q.speech_end_ms  # not at the pause
    heard = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    words = heard["transcript"].lower()
    assert "people" in words and "window" in words, heard  # both halves are one question
    assert events[-1]["response"]["status"] == "completed"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}, "turn_detection.eagerness"),
        ({"turn_detection": {"type": "semantic_vad", "threshold": 0.5}}, "turn_detection.threshold"),
        ({"turn_detection": {"type": "push_to_talk"}}, "turn_detection.type"),
    ],
)
def test_bad_semantic_vad_fields_are_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    from omniweb.openai_api.realtime.errors import RealtimeError
    from omniweb.openai_api.realtime.session import new_session, update_session

    voices = {"alloy": "alloy"}
    with pytest.raises(RealtimeError) as info:
        update_session(new_session(voices), {"audio": {"input": fields}}, voices)
    assert info.value.param == f"session.audio.input.{param}"


@pytest.mark.parametrize("tracing", ["auto", None, {"workflow_name": "agent", "group_id": "g", "metadata": {}}])
def test_tracing_is_accepted_and_ignored(tracing: Any) -> None:
    from omniweb.openai_api.realtime.session import new_session, update_session

    voices = {"alloy": "alloy"}
    session = update_session(new_session(voices), {"tracing": tracing, "instructions": "hi"}, voices)
    assert session.tracing is None and session.instructions == "hi"


async def test_the_video_endpoint_takes_semantic_vad_and_answers_after_the_pause(connect, voice) -> None:
    from support.video import b64, collect_turn, scene_frames, video

    comm = await video(connect, modalities=["text"], turn_detection={"type": "semantic_vad", "eagerness": "high"})
    await scene_frames(comm)
    q = paused_question(voice, QUESTION, 0.8)
    pcm = pcm16(q.audio)
    for i in range(0, len(pcm), 3200):
        await comm.send_json_to({"type": "audio.chunk", "data": b64(pcm[i : i + 3200])})
    started = await comm.receive_json_from(timeout=30)
    assert started["type"] == "input_audio_buffer.speech_started", started
    stopped = await comm.receive_json_from(timeout=30)
    assert stopped["type"] == "input_audio_buffer.speech_stopped", stopped
    assert stopped["audio_end_ms"] > q.speech_end_ms  # not at the pause
    t = await collect_turn(comm, audio=False, timeout=60)
    words = t.of_type("input.transcript")[0]["text"].lower()
    assert "people" in words and "window" in words, words
