"""Server voice-activity detection: Silero VAD on the engine ("audio.vad") and OpenAI's server_vad turns.

The detector is tested alone on made-up probabilities (its hysteresis and times); the model and
the session-side helper on real speech (our own voice, padded with silence and with noise) through
the engine, on both dispatch paths: onsets and stops land within a window or two of the truth
measured on the waveform, and silence or steady noise produce no event at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import support.engine as engine_support
from hibari import Hibari
from scipy.signal import resample_poly
from support.engine import typed_request

from omniweb.asr.vad_engine import MAX_WINDOWS, STATE_BYTES, WINDOW_BYTES, WINDOW_MS, SileroVad, VadPipeline
from omniweb.base.errors import EngineError, ErrorKind
from omniweb.conversation.vad import SpeechStarted, SpeechStopped, TurnDetector, VadParams, VoiceActivity
from omniweb.engine.messages import Chunk, End
from omniweb.engine.requests import EngineRequest, VadRequest

RATE = 16_000
WINDOW = 32.0
QUESTION = "How many people can you see in the room?"


# -- the pure detector ----------------------------------------------------------------------------


def run(probs: list[float], params: VadParams | None = None) -> list[SpeechStarted | SpeechStopped]:
    return TurnDetector(params or VadParams()).push(probs, WINDOW)


def test_speech_starts_on_the_first_window_at_the_threshold_less_the_prefix_padding():
    events = run([0.1] * 20 + [0.5, 0.9], VadParams(prefix_padding_ms=300))
    assert events == [SpeechStarted(audio_start_ms=20 * 32 - 300)]


def test_the_prefix_padding_never_reaches_before_the_stream_began():
    assert run([0.1, 0.9, 0.9]) == [SpeechStarted(audio_start_ms=0)]


def test_one_confident_window_alone_is_a_click_not_speech():
    assert run(([0.0] * 14 + [0.7]) * 10) == []  # a beep every 480 ms
    assert run([0.0, 0.7, 0.2, 0.0, 0.9, 0.3, 0.0]) == []  # the next window falls below threshold - 0.15
    events = run([0.0, 0.7, 0.4, 0.0], VadParams(prefix_padding_ms=0))  # held above it: speech
    assert events == [SpeechStarted(audio_start_ms=32)]


def test_speech_stops_once_the_silence_has_lasted_silence_duration_ms():
    params = VadParams(prefix_padding_ms=0, silence_duration_ms=500)
    events = run([0.0] * 10 + [0.9] * 30 + [0.05] * 30, params)
    # the silence starts at window 40 (1280 ms) and reaches 500 ms at the end of window 55
    assert events == [SpeechStarted(audio_start_ms=320), SpeechStopped(audio_end_ms=1280 + 16 * 32)]


def test_a_pause_shorter_than_the_silence_duration_keeps_the_turn():
    params = VadParams(silence_duration_ms=500)
    probs = [0.9] * 20 + [0.05] * 10 + [0.9] * 20 + [0.05] * 20
    events = run(probs, params)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    assert events[1].audio_end_ms == 50 * 32 + 16 * 32


def test_probabilities_between_the_two_thresholds_neither_start_nor_end_speech():
    params = VadParams(threshold=0.5, silence_duration_ms=200)
    assert run([0.45] * 50, params) == []  # below the threshold: never speech
    events = run([0.9] * 5 + [0.4] * 50, params)  # above threshold - 0.15: speech goes on
    assert events == [SpeechStarted(audio_start_ms=0)]


def test_a_higher_threshold_needs_more_confident_speech():
    probs = [0.0] * 5 + [0.6] * 20 + [0.0] * 30
    assert [type(e) for e in run(probs, VadParams(threshold=0.5))] == [SpeechStarted, SpeechStopped]
    assert run(probs, VadParams(threshold=0.7)) == []


def test_events_do_not_depend_on_how_the_windows_are_split_across_pushes():
    probs = [0.0] * 7 + [0.8] * 23 + [0.1] * 19 + [0.95] * 3 + [0.0] * 40
    whole = run(probs)
    detector = TurnDetector(VadParams())
    split = [e for i in range(0, len(probs), 3) for e in detector.push(probs[i : i + 3], WINDOW)]
    assert split == whole
    assert len(whole) == 4


def test_reset_forgets_speech_in_progress_without_an_event_and_keeps_the_clock():
    detector = TurnDetector(VadParams(prefix_padding_ms=0))
    assert detector.push([0.9] * 10, WINDOW) == [SpeechStarted(audio_start_ms=0)]
    detector.reset()
    assert not detector.speaking
    assert detector.push([0.0] * 40, WINDOW) == []  # no stop for the forgotten speech
    assert detector.push([0.9, 0.9], WINDOW) == [SpeechStarted(audio_start_ms=50 * 32)]
    detector.reset(clock_ms=10_000.0)
    assert detector.push([0.9, 0.9], WINDOW) == [SpeechStarted(audio_start_ms=10_000)]


# -- the model ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def voice() -> Hibari:
    return Hibari()


def spoken16(voice: Hibari, text: str = QUESTION) -> np.ndarray:
    """Our voice (24 kHz) at 16 kHz, float32."""
    return resample_poly(voice(text, seed=7), 2, 3).astype(np.float32)


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def speech_extent_ms(audio: np.ndarray) -> tuple[float, float]:
    """Where the speech is on the waveform: 10 ms RMS within 30 dB of its loudest."""
    rms = np.sqrt(np.convolve(audio**2, np.ones(160) / 160, "same"))
    loud = np.flatnonzero(rms > rms.max() * 10 ** (-30 / 20))
    return 1000.0 * loud[0] / RATE, 1000.0 * loud[-1] / RATE


@pytest.fixture(scope="module")
def model() -> SileroVad:
    return SileroVad()


def windows(audio: np.ndarray) -> bytes:
    pcm = pcm16(audio)
    return pcm[: len(pcm) - len(pcm) % WINDOW_BYTES]


def test_the_streaming_state_makes_many_short_calls_equal_one_long_call(model, voice):
    pcm = windows(np.concatenate([np.zeros(RATE, np.float32), spoken16(voice)]))
    whole, whole_state = model.probs(pcm, None)
    parts, state = [], None
    for i in range(0, len(pcm), 3 * WINDOW_BYTES):
        probs, state = model.probs(pcm[i : i + 3 * WINDOW_BYTES], state)
        parts.append(probs)
    assert np.allclose(np.concatenate(parts), whole, atol=1e-5)
    assert len(whole_state) == STATE_BYTES and np.allclose(
        np.frombuffer(state, "<f4"), np.frombuffer(whole_state, "<f4"), atol=1e-5
    )
    assert whole.max() > 0.9 and whole[:25].max() < 0.2  # speech is speech, the lead-in silence is not


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"pcm": b""}, "whole windows"),
        ({"pcm": bytes(WINDOW_BYTES + 2)}, "whole windows"),
        ({"pcm": "text"}, "pcm must be bytes"),
        ({"pcm": bytes(WINDOW_BYTES * (MAX_WINDOWS + 1))}, "more than"),
        ({"pcm": bytes(WINDOW_BYTES), "state": b"short"}, "state"),
    ],
)
def test_the_pipeline_refuses_malformed_requests(request_fields, message):
    pipeline = VadPipeline.__new__(VadPipeline)  # validation needs no model
    with pytest.raises(ValueError, match=message):
        pipeline.validate(typed_request(VadRequest, **request_fields))


# -- the session-side helper, through the engine (in-process and Redis workers) ---------------------


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


async def detect(client: Any, pcm: bytes, params: VadParams, rate: int = RATE, chunk_ms: int = 20) -> list[Any]:
    """Feed ``pcm`` as a client streams it (``chunk_ms`` pieces); the events in order."""
    vad = VoiceActivity(client, params, sample_rate=rate)
    step = rate * chunk_ms // 1000 * 2
    events = []
    for i in range(0, len(pcm), step):
        events += await vad.feed(pcm[i : i + step])
    return events


TOLERANCE_MS = 2 * WINDOW_MS + 16  # "a window or two": Silero needs a window or two to be sure


@pytest.mark.parametrize("noise", [0.0, 0.02], ids=["silence", "noise"])
async def test_a_spoken_question_starts_and_stops_a_turn_where_the_speech_is(engine_client, voice, noise):
    rng = np.random.default_rng(3)
    speech = spoken16(voice)
    audio = np.concatenate([np.zeros(RATE, np.float32), speech, np.zeros(2 * RATE, np.float32)])
    audio += noise * rng.standard_normal(audio.size).astype(np.float32)
    start, end = speech_extent_ms(np.concatenate([np.zeros(RATE, np.float32), speech]))
    params = VadParams(prefix_padding_ms=0, silence_duration_ms=500)
    events = await detect(engine_client, pcm16(audio), params)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped], events
    assert abs(events[0].audio_start_ms - start) <= TOLERANCE_MS, (events, start)
    silence = 16 * WINDOW_MS  # 500 ms of silence, in whole windows
    assert abs(events[1].audio_end_ms - (end + silence)) <= TOLERANCE_MS, (events, end)


async def test_the_default_padding_moves_the_start_back_300_ms(engine_client, voice):
    audio = np.concatenate([np.zeros(RATE, np.float32), spoken16(voice), np.zeros(RATE, np.float32)])
    bare = await detect(engine_client, pcm16(audio), VadParams(prefix_padding_ms=0))
    padded = await detect(engine_client, pcm16(audio), VadParams())
    assert padded[0].audio_start_ms == bare[0].audio_start_ms - 300
    assert padded[1] == bare[1]


async def test_two_questions_with_a_pause_make_two_turns(engine_client, voice):
    gap = np.zeros(RATE, np.float32)
    audio = np.concatenate([gap, spoken16(voice), gap, spoken16(voice, "Is it dark in here?"), gap])
    events = await detect(engine_client, pcm16(audio), VadParams())
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped, SpeechStarted, SpeechStopped]


async def test_24_khz_input_gives_the_same_turn_as_16_khz(engine_client, voice):
    wave24 = voice(QUESTION, seed=7).astype(np.float32)
    audio24 = np.concatenate([np.zeros(24_000, np.float32), wave24, np.zeros(24_000, np.float32)])
    audio16 = resample_poly(audio24, 2, 3).astype(np.float32)
    at16 = await detect(engine_client, pcm16(audio16), VadParams())
    at24 = await detect(engine_client, pcm16(audio24), VadParams(), rate=24_000)
    assert [type(e) for e in at24] == [SpeechStarted, SpeechStopped]
    assert abs(at24[0].audio_start_ms - at16[0].audio_start_ms) <= WINDOW_MS
    assert abs(at24[1].audio_end_ms - at16[1].audio_end_ms) <= WINDOW_MS


@pytest.mark.parametrize(
    "kind", ["silence", "white noise", "hum", "brown noise", "beeps"], ids=lambda k: k.replace(" ", "-")
)
async def test_silence_and_steady_noise_produce_no_event(engine_client, kind):
    rng = np.random.default_rng(5)
    t = np.arange(5 * RATE) / RATE
    audio = {
        "silence": np.zeros(t.size),
        "white noise": 0.05 * rng.standard_normal(t.size),
        "hum": 0.1 * np.sin(2 * np.pi * 50 * t) + 0.05 * np.sin(2 * np.pi * 100 * t),
        "brown noise": np.cumsum(rng.standard_normal(t.size)) * 0.002,
        # Chromium's fake microphone: a loud 40 ms 400 Hz square-ish beep every 500 ms
        "beeps": 0.9 * np.sign(np.sin(2 * np.pi * 400 * t)) * ((t % 0.5) < 0.04),
    }[kind]
    assert await detect(engine_client, pcm16(audio.astype(np.float32)), VadParams()) == []


async def test_a_feed_of_odd_sizes_and_partial_windows_loses_no_audio(engine_client, voice):
    audio = np.concatenate([np.zeros(RATE, np.float32), spoken16(voice), np.zeros(RATE, np.float32)])
    pcm = pcm16(audio)
    regular = await detect(engine_client, pcm, VadParams())
    vad = VoiceActivity(engine_client, VadParams())
    odd, i = [], 0
    for size in [1, 999, 3, 4097, 77] * 200:
        if i >= len(pcm):
            break
        odd += await vad.feed(pcm[i : i + size])
        i += size
    assert odd == regular


async def test_reset_forgets_the_turn_in_progress(engine_client, voice):
    speech = pcm16(spoken16(voice))
    half = len(speech) // 4 * 2
    vad = VoiceActivity(engine_client, VadParams())
    started = await vad.feed(pcm16(np.zeros(RATE, np.float32)) + speech[:half])
    assert [type(e) for e in started] == [SpeechStarted] and vad.speaking
    vad.reset()  # e.g. input_audio_buffer.clear
    assert await vad.feed(pcm16(np.zeros(RATE, np.float32))) == []  # no stop for the cleared turn
    again = await vad.feed(speech + pcm16(np.zeros(RATE, np.float32)))
    assert [type(e) for e in again] == [SpeechStarted, SpeechStopped]
    # the clock kept running across the reset: the new turn starts after all the audio before it
    assert again[0].audio_start_ms >= 2000 + half / 2 / 16 - 2 * WINDOW_MS


async def test_an_engine_refusal_reaches_the_caller_as_an_engine_error():
    class Refusing:
        async def stream(self, request: EngineRequest, request_id: str | None = None) -> AsyncIterator[Chunk]:
            yield End.failed(ErrorKind.CAPACITY, "server is at capacity")

        async def abort(self, request_id: str) -> None:
            return None

    vad = VoiceActivity(Refusing(), VadParams())
    with pytest.raises(EngineError, match="capacity") as info:
        await vad.feed(bytes(4 * WINDOW_BYTES))
    assert info.value.kind.value == "capacity"


def test_only_16_and_24_khz_are_accepted():
    with pytest.raises(ValueError, match="sample_rate"):
        VoiceActivity(None, VadParams(), sample_rate=44_100)  # type: ignore[arg-type]
