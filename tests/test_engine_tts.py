"""The real voice on the engine: talker → vocoder through the scheduler equals hibari's own synthesis."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from hibari import Hibari
from support.voice import synthesize

from omniweb.engine.messages import Chunk, End, PcmAudio
from omniweb.engine.requests import SpeakRequest
from omniweb.engine.scheduler import Scheduler
from speech.tts.loops import PIPELINE, TtsPipeline

TEXT = "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. Is it done?"


@pytest.fixture(scope="module")
def pipeline() -> TtsPipeline:
    return TtsPipeline()


@pytest.fixture(scope="module")
def hibari_voice() -> Hibari:
    return Hibari()


def pcm16(wave: np.ndarray) -> bytes:
    return (np.clip(wave, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


@pytest.mark.parametrize("first_chunk_frames", [None, 1, 3, 40])
def test_streamed_audio_equals_one_shot_synthesis(pipeline, hibari_voice, first_chunk_frames):
    chunks = synthesize(pipeline, text=TEXT, seed=1234, first_chunk_frames=first_chunk_frames)
    streamed = b"".join(c["pcm"] for c in chunks if c["type"] == "audio")
    assert streamed == pcm16(hibari_voice(TEXT, seed=1234))
    assert sum(1 for c in chunks if c["type"] == "audio") > 10  # many vocoder chunks, not one blob


def test_sentences_are_announced_in_order_around_their_audio(pipeline):
    chunks = synthesize(pipeline, text=TEXT, seed=1)
    kinds = [(c["type"], c.get("index")) for c in chunks if c["type"] != "audio"]
    assert kinds == [
        ("sentence.start", 0),
        ("sentence.end", 0),
        ("sentence.start", 1),
        ("sentence.end", 1),
        ("sentence.start", 2),
        ("sentence.end", 2),
        ("end", None),
    ]
    end = dict(chunks[-1])
    assert isinstance(end.pop("rng_state"), str), "the noise's position, for a request that continues this one"
    assert end == {"type": "end", "status": "ok", "sentences": 3}
    texts = [c["text"] for c in chunks if c["type"] == "sentence.start"]
    assert texts == [
        "The quick brown fox jumps over the lazy dog.",
        "She sells sea shells by the sea shore.",
        "Is it done?",
    ]


def test_audio_is_speech_like(pipeline):
    chunks = synthesize(pipeline, text="The quick brown fox jumps over the lazy dog.", seed=3)
    pcm = np.frombuffer(b"".join(c["pcm"] for c in chunks if c["type"] == "audio"), "<i2") / 32768.0
    seconds = pcm.size / 24000
    assert 0.2 * 9 <= seconds <= 0.6 * 9  # nine words at a speaking pace
    assert np.sqrt(np.mean(pcm**2)) > 0.02  # not silent
    frames = pcm[: pcm.size // 240 * 240].reshape(-1, 240)
    loud = np.sqrt((frames**2).mean(axis=1)) > 0.01
    assert 0.4 < loud.mean() < 0.98  # speech has pauses; noise or silence would not


def test_word_timestamps_come_from_the_model(pipeline):
    chunks = synthesize(pipeline, text="Hello brave new world.", seed=3, timestamps=True)
    end = next(c for c in chunks if c["type"] == "sentence.end")
    words = end["words"]  # [word, start_ms, end_ms] on the wire
    assert [w for w, _, _ in words] == ["Hello", "brave", "new", "world."]
    total_ms = sum(len(c["pcm"]) for c in chunks if c["type"] == "audio") / 48
    starts = [start for _, start, _ in words]
    assert starts == sorted(starts) and starts[0] > 0
    assert all(start < end <= total_ms for _, start, end in words)


def test_speed_and_frame_cap(pipeline):
    def seconds(**kw: Any) -> float:
        chunks = synthesize(pipeline, text="A sentence of moderate length for timing.", seed=5, **kw)
        return sum(len(c["pcm"]) for c in chunks if c["type"] == "audio") / 48000

    normal, fast = seconds(speed=1.0), seconds(speed=2.0)
    assert fast < normal * 0.7
    assert seconds(max_frames=40) == pytest.approx(40 * 0.0125)


def test_blank_text_gives_no_sentences(pipeline):
    for text in ("", "   ", "\n\n"):
        chunks = synthesize(pipeline, text=text)
        assert [{k: v for k, v in c.items() if k != "rng_state"} for c in chunks] == [
            {"type": "end", "status": "ok", "sentences": 0}
        ]


def test_pacing_keeps_the_stream_near_real_time(pipeline):
    """With max_ahead the audio arrives no more than that far ahead of real-time playback."""
    sched = Scheduler({PIPELINE: pipeline}, workers=2, max_ahead=0.5)
    sched.start()
    arrivals: list[tuple[float, int]] = []
    ended = threading.Event()

    def sink(chunk: Chunk) -> None:
        if isinstance(chunk, PcmAudio):
            arrivals.append((time.monotonic(), len(chunk.pcm)))
        if isinstance(chunk, End):
            ended.set()

    try:
        sched.submit(
            "r", SpeakRequest(pipeline=PIPELINE, text="One short sentence here. And a second one.", seed=2), sink
        )
        assert ended.wait(30)
    finally:
        sched.stop()
    first = arrivals[0][0]
    sent = 0
    for at, size in arrivals:
        ahead = sent / 48000 - (at - first)  # seconds of audio delivered beyond real-time playback
        assert ahead <= 0.5 + 0.25  # one vocoder chunk of slack
        sent += size
    audio_seconds = sent / 48000
    assert arrivals[-1][0] - first >= audio_seconds - 0.5 - 0.25  # paced, not ~100x real time


def test_unseeded_speech_leaves_the_noise_to_the_vocoder(pipeline):
    """Without a seed the talker draws no noise (its step is cheaper before the first audio); the
    vocoder draws each chunk's own: same length as seeded speech, speech-like, different each time."""
    voice = pipeline.talker.caps.default_voice
    text = "The quick brown fox jumps over the lazy dog."
    unseeded = pipeline.talker.talk(voice, 0, text, 1.0, np.random.default_rng(), None, False, exact_noise=False)
    assert all(f.noise is None for f in unseeded.acoustic)
    assert all(s.noise_rng is not None for s in unseeded.segments)
    seeded = synthesize(pipeline, text=text, seed=3)
    runs = [synthesize(pipeline, text=text) for _ in range(2)]
    pcm = [b"".join(c["pcm"] for c in chunks if c["type"] == "audio") for chunks in (seeded, *runs)]
    assert len(pcm[1]) == len(pcm[2]) == len(pcm[0])  # durations come from the network, not the noise
    assert pcm[1] != pcm[2]
    rms = [float(np.sqrt(np.mean((np.frombuffer(p, "<i2") / 32768.0) ** 2))) for p in pcm]
    assert max(rms) < 1.15 * min(rms)


def test_no_talker_step_grows_with_an_unpunctuated_sentence(pipeline, monkeypatch):
    """4,000 characters without a clause mark: every talker step gets a bounded piece (issue #11)."""
    from django.conf import settings

    seen: list[str] = []
    talk = pipeline.talker.talk

    def spy(voice, index, text, *args, **kwargs):
        seen.append(text)
        return talk(voice, index, text, *args, **kwargs)

    monkeypatch.setattr(pipeline.talker, "talk", spy)
    text = " ".join(["blue"] * 800)
    chunks = synthesize(pipeline, text=text, split="none", max_frames=4)
    assert chunks[-1]["status"] == "ok"
    pieces = [t for t in seen if set(t.split()) == {"blue"}]  # not the engine's calibration sentences
    assert len(pieces) == 14 and max(map(len, pieces)) <= settings.TALKER_MAX_RUN_CHARS
    starts = [c["text"] for c in chunks if c["type"] == "sentence.start"]
    assert " ".join(starts) == text  # each bounded piece is a sentence on the wire, in order


@pytest.mark.parametrize("fmt", ["mp3", "aac", "flac", "opus"])
def test_an_openai_streams_first_vocoder_step_gives_its_encoder_its_first_bytes(pipeline, fmt):
    from omniweb.media.containers import StreamEncoder
    from omniweb.openai_api.views import first_chunk_frames

    chunks = synthesize(
        pipeline, text="Streaming speech should never stall.", first_chunk_frames=first_chunk_frames(fmt)
    )
    first = next(c["pcm"] for c in chunks if c["type"] == "audio")
    assert StreamEncoder(fmt).feed(first), "the encoder needs a second vocoder step before its first bytes"
