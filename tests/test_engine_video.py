"""The video.turn pipeline on the scheduler: thinker → talker → vocoder with the real models."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from support.engine import typed_request
from support.photos import photo
from support.pictures import camera_like, canvas, jpeg, square_frames
from support.upstream import Upstream, serve, stream
from support.voice import spoken

from omniweb.engine.messages import Chunk, End, PcmAudio, to_wire
from omniweb.engine.requests import AnswerRequest
from omniweb.engine.scheduler import Scheduler
from omniweb.engine.voice import voice
from speech.tts.text import split_text
from speech.tts.voice import HibariVoice
from video.engine.pipeline import NOTHING_HEARD, PIPELINE, VideoTurnPipeline
from video.engine.sentences import SentenceStream, speakable


@pytest.fixture(scope="module")
def pipeline() -> VideoTurnPipeline:
    with override_settings(THINKER="scene"):
        return VideoTurnPipeline()


class Recorder:
    """A scheduler for one test, recording which kinds of steps it ran."""

    def __init__(self, pipeline: VideoTurnPipeline) -> None:
        self.kinds: list[str] = []
        self.sched = Scheduler({PIPELINE: pipeline}, workers=2, on_batch=lambda kind, n: self.kinds.append(kind))

    def run(self, request: dict[str, Any], timeout: float = 30) -> list[tuple[float, dict[str, Any]]]:
        """(seconds since submit, chunk) for every chunk up to and including the end."""
        chunks: list[tuple[float, dict[str, Any]]] = []
        ended = threading.Event()
        t0 = time.monotonic()

        def sink(chunk: Chunk) -> None:
            chunks.append((time.monotonic() - t0, to_wire(chunk)))
            if isinstance(chunk, End):
                ended.set()

        self.sched.submit(f"r{time.monotonic_ns()}", typed_request(AnswerRequest, **request), sink)
        assert ended.wait(timeout), [c["type"] for _, c in chunks]
        return chunks


@pytest.fixture
def engine(pipeline: VideoTurnPipeline) -> Iterator[Recorder]:
    rec = Recorder(pipeline)
    rec.sched.start()
    yield rec
    rec.sched.stop()


def kinds(chunks: list[tuple[float, dict[str, Any]]]) -> list[str]:
    return [c["type"] for _, c in chunks]


def text_of(chunks: list[tuple[float, dict[str, Any]]]) -> str:
    return "".join(c["delta"] for _, c in chunks if c["type"] == "text")


def people_frames() -> list[dict[str, Any]]:
    return [
        {"frame_id": "f0", "data": jpeg(photo("coffee")), "pts_ms": 0},
        {"frame_id": "f1", "data": jpeg(photo("astronaut")), "pts_ms": 800},
    ]


def test_spoken_question_order_transcript_text_audio(engine):
    dark = [{"frame_id": "d", "data": jpeg(camera_like(canvas((12, 12, 12)))), "pts_ms": 0}]
    chunks = engine.run({"question": "", "audio": spoken("Is it dark in here?"), "frames": dark})
    order = kinds(chunks)
    assert order[0] == "transcript" and order.count("transcript") == 1
    assert chunks[0][1]["text"].strip() == "Is it dark in here?"
    first_audio = order.index("sentence.start")
    assert "text" in order[:first_audio]  # text before any audio
    assert order[-1] == "end"
    end = chunks[-1][1]
    assert end["status"] == "ok" and end["transcript"].strip() == "Is it dark in here?"
    assert end["text"] == text_of(chunks) and end["text"].startswith("Yes, it's very dark")
    audio = b"".join(c["pcm"] for _, c in chunks if c["type"] == "audio")
    assert len(audio) > 24_000  # over half a second of speech
    assert engine.kinds[0] == "asr" and {"talker", "vocoder"} <= set(engine.kinds)


def test_every_sentence_is_spoken_in_order(engine):
    chunks = engine.run({"question": "What do you see?", "frames": people_frames(), "history": []})
    end = chunks[-1][1]
    spoken_sentences = [c["text"] for _, c in chunks if c["type"] == "sentence.start"]
    stream = SentenceStream()
    expected = stream.feed(end["text"]) + stream.flush()
    assert spoken_sentences == expected and len(expected) >= 3
    indices = [c["index"] for _, c in chunks if c["type"] == "sentence.end"]
    assert indices == list(range(len(expected)))


def test_text_only_does_no_audio_work(engine):
    chunks = engine.run({"question": "What changed?", "frames": people_frames(), "modalities": ["text"]})
    assert set(kinds(chunks)) == {"text", "text.end", "end"}
    assert "No one was in the first frame; now I see one person." in chunks[-1][1]["text"]
    assert set(engine.kinds) == {"thinker"}  # no talker, no vocoder step ran


def test_silence_gets_an_honest_answer_not_a_guess(engine):
    chunks = engine.run({"question": "", "audio": bytes(32_000), "frames": people_frames(), "modalities": ["text"]})
    assert kinds(chunks) == ["transcript", "text", "text.end", "end"]
    assert chunks[0][1]["text"] == ""
    assert chunks[-1][1] == {"type": "end", "status": "ok", "text": NOTHING_HEARD, "transcript": ""}


def test_abort_stops_between_steps(engine):
    chunks: list[dict[str, Any]] = []
    first_audio = threading.Event()

    def sink(chunk: Chunk) -> None:
        chunks.append(to_wire(chunk))
        if isinstance(chunk, PcmAudio):
            first_audio.set()

    frames = [{"data": f, "pts_ms": i * 300} for i, f in enumerate(square_frames([40, 190, 340, 490]))]
    request = typed_request(AnswerRequest, question="Describe everything.", frames=frames)
    engine.sched.submit("long", request, sink)
    assert first_audio.wait(10)
    steps_before = engine.sched.stats().steps_total
    assert engine.sched.abort("long")
    assert chunks[-1] == {"type": "end", "status": "cancelled"}
    n = len(chunks)
    time.sleep(0.3)
    assert len(chunks) == n  # a step in flight finished, its output was dropped
    stats = engine.sched.stats()
    assert stats.active == 0 and stats.running_steps == 0
    assert stats.steps_total - steps_before <= 2  # at most the steps already running on the 2 workers


def test_the_answer_text_leads_its_audio(engine):
    """The order of a spoken answer: its first text before any of its audio, and every sentence's
    audio after that sentence's text. How quickly: bench/video_engine.py."""
    frames = [{"data": f} for f in square_frames([40, 190, 340, 490])]
    chunks = [c for _, c in engine.run({"question": "What do you see?", "frames": frames})]
    kinds = [c["type"] for c in chunks]
    assert "audio" in kinds and kinds[-1] == "end"
    assert kinds.index("text") < kinds.index("audio")
    text_so_far = ""
    for chunk in chunks:
        if chunk["type"] == "text":
            text_so_far += chunk["delta"]
        elif chunk["type"] == "sentence.start":
            assert chunk["text"].strip() in text_so_far, (chunk, text_so_far)


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"question": 3}, "question must be str"),
        ({"audio": "not bytes"}, "audio must be bytes"),
        ({"frames": [{"data": "base64?"}]}, "data must be bytes"),
        ({"frames": [{"data": b""}]}, "frames must carry image bytes"),
        ({"history": [{"role": "system", "content": "x"}]}, "history roles must be"),
        ({"modalities": ["video"]}, "modalities must be a subset"),
        ({"voice": "nobody"}, "Unknown voice 'nobody'"),
    ],
)
def test_invalid_requests_are_refused_at_submit(engine, request_fields, message):
    with pytest.raises(ValueError, match=message):  # at the Redis boundary or at submit
        engine.sched.submit("bad", typed_request(AnswerRequest, **{"question": "q", **request_fields}), lambda _: None)


# -- audio while the text still streams (a thinker that writes at a model's pace) ----------------


@pytest.fixture(scope="module")
def paced_upstream() -> Iterator[Upstream]:
    with serve() as state:
        yield state


def test_audio_starts_before_the_text_ends(paced_upstream):
    paced_upstream.script = stream(
        ["The first ", "sentence ", "is short. ", "The second ", "one comes ", "later."], 0.3
    )
    with override_settings(THINKER="llm", LLM_URL=paced_upstream.url, LLM_MODEL_PATH=""):
        rec = Recorder(VideoTurnPipeline())
    rec.sched.start()
    try:
        chunks = rec.run({"question": "Talk slowly.", "frames": []})
    finally:
        rec.sched.stop()
    order = kinds(chunks)
    last_text = max(i for i, k in enumerate(order) if k == "text")
    assert order.index("audio") < last_text  # the first sentence plays while the second is written
    assert [c["text"] for _, c in chunks if c["type"] == "sentence.start"] == [
        "The first sentence is short.",
        "The second one comes later.",
    ]


# -- sentence cutting ------------------------------------------------------------------------------


def test_sentences_are_released_once_proven_complete():
    s = SentenceStream()
    out: list[str] = []
    for ch in "Hello there. Dr. Smith paid 3.5 dollars! Is it done? yes it is":
        out.extend(s.feed(ch))
    assert out == ["Hello there.", "Dr. Smith paid 3.5 dollars!"]
    assert s.flush() == ["Is it done? yes it is"]  # a lowercase start does not end a sentence (hibari's rule)


def test_sentence_waits_for_the_next_text_and_lines_break():
    s = SentenceStream()
    assert s.feed("One sentence. ") == []  # not proven yet: "3." or "Dr." look the same
    assert s.feed("Two") == ["One sentence."]
    assert s.feed(" items\n- **Three**") == ["Two items"]
    assert s.flush() == ["- Three"]
    assert speakable("**Bold** and `code`  here") == "Bold and code here"
    assert s.flush() == []


def test_the_turn_speaks_with_the_voice_the_speech_app_registered(pipeline):
    """video reaches speech's voice by name (omniweb.engine.voice), never by import: the pipeline's
    last loops are the registered voice's talker and vocoder, its sentences the voice's cut."""
    assert isinstance(voice(), HibariVoice)
    assert [loop.name for loop in pipeline.loops] == ["thinker", "talker", "vocoder"]
    text = "Dr. Smith paid 3.5 dollars. He left!"
    assert voice().sentences(text) == split_text(text, "sentence") == ["Dr. Smith paid 3.5 dollars.", "He left!"]
    with pytest.raises(ValueError, match="Unknown voice 'nobody'"):
        voice().validate(typed_request(AnswerRequest, question="Hi", voice="nobody"))
