"""Admission control: a tiny scheduler over the real voice refuses work beyond its capacity, at once.

The process-wide scheduler is a singleton sized by settings, so these tests build their own
``Scheduler`` (max_active=1, max_queued=1) around the real ``TtsPipeline`` and, for the WebSocket
path, put a ``LocalEngineClient`` over it in place of the runtime's client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import receive_until_done, session, speak

from omniweb.engine import runtime
from omniweb.engine.client import LocalEngineClient
from omniweb.engine.scheduler import AdmissionError, Scheduler
from speech.tts.loops import PIPELINE, TtsPipeline

HELLO = "Hello there."
LONG = " ".join(f"This is sentence number {i} of a long request that keeps the engine busy." for i in range(60))


def request(text: str) -> dict[str, Any]:
    return {
        "pipeline": PIPELINE,
        "text": text,
        "voice": None,
        "speed": 1.0,
        "seed": 0,
        "split": "sentence",
        "timestamps": False,
        "first_chunk_frames": None,
        "max_frames": None,
    }


class Sink:
    """Collects a request's chunks from the worker threads."""

    def __init__(self) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.ended = threading.Event()

    def __call__(self, chunk: dict[str, Any]) -> None:
        self.times.append(time.monotonic())
        self.chunks.append(chunk)
        if chunk["type"] == "end":
            self.ended.set()

    @property
    def end(self) -> dict[str, Any] | None:
        return next((c for c in self.chunks if c["type"] == "end"), None)


@pytest.fixture(scope="module")
def pipeline() -> TtsPipeline:
    return TtsPipeline()


@pytest.fixture
def tiny(pipeline: TtsPipeline) -> Iterator[Scheduler]:
    sched = Scheduler({PIPELINE: pipeline}, workers=2, max_active=1, max_queued=1)
    sched.start()
    yield sched
    deadline = time.monotonic() + 2
    while (stats := sched.stats()).active or stats.queued or stats.running_steps:
        assert time.monotonic() < deadline, f"tiny scheduler still busy: {stats}"
        time.sleep(0.02)
    sched.stop()


@pytest.fixture
def tiny_client(tiny: Scheduler, monkeypatch: pytest.MonkeyPatch) -> LocalEngineClient:
    """Sessions opened during the test use the tiny scheduler; the runtime's client comes back after."""
    client = LocalEngineClient(tiny)
    monkeypatch.setattr(runtime, "_client", client)
    return client


def fill(sched: Scheduler) -> list[tuple[str, Sink]]:
    """One active and one queued long request: the scheduler is at capacity."""
    held = []
    for rid in ("filler-active", "filler-queued"):
        sink = Sink()
        sched.submit(rid, request(LONG), sink)
        held.append((rid, sink))
    stats = sched.stats()
    assert (stats.active, stats.queued) == (1, 1)
    return held


# -- the scheduler itself --------------------------------------------------------------------------


def test_third_concurrent_request_is_refused(tiny):
    held = fill(tiny)
    with pytest.raises(AdmissionError):
        tiny.submit("third", request(HELLO), Sink())
    stats = tiny.stats()
    assert (stats.active, stats.queued) == (1, 1)  # the refused request left no trace
    for rid, _ in held:
        assert tiny.abort(rid)


def test_abort_frees_capacity_and_promotes_the_queued_request(tiny):
    (active_id, active_sink), (queued_id, _) = fill(tiny)
    assert tiny.abort(active_id)
    assert active_sink.ended.wait(2) and active_sink.end == {"type": "end", "status": "cancelled"}
    stats = tiny.stats()
    assert (stats.active, stats.queued) == (1, 0)  # the queued request moved up
    third = Sink()
    tiny.submit("third", request(HELLO), third)  # room in the queue again
    assert tiny.abort(queued_id)
    assert third.ended.wait(10)
    assert third.end["status"] == "ok" and third.end["total_sentences"] == 1
    assert any(c["type"] == "audio" for c in third.chunks)
    assert not tiny.abort(queued_id)  # already gone


def test_queued_request_runs_when_the_active_one_finishes(tiny):
    first, second = Sink(), Sink()
    tiny.submit("first", request(HELLO), first)
    tiny.submit("second", request("Second request."), second)
    assert first.ended.wait(10) and second.ended.wait(10)
    assert first.end["status"] == second.end["status"] == "ok"
    # With one active slot the queued request produced nothing until the first one had ended.
    assert second.times[0] >= first.times[-1]
    assert first.end["total_sentences"] == second.end["total_sentences"] == 1


def test_invalid_request_is_refused_before_admission(tiny):
    with pytest.raises(ValueError, match="Unknown voice"):
        tiny.submit("bad", {**request(HELLO), "voice": "nobody"}, Sink())
    with pytest.raises(ValueError, match="unknown pipeline"):
        tiny.submit("bad", {**request(HELLO), "pipeline": "nope"}, Sink())
    stats = tiny.stats()
    assert (stats.active, stats.queued) == (0, 0)


# -- over the WebSocket ----------------------------------------------------------------------------


async def test_over_capacity_session_gets_an_error_at_once(connect, tiny, tiny_client):
    held = fill(tiny)
    comm = await session(connect)
    started = time.monotonic()
    t = await speak(comm, HELLO, timeout=5)
    assert time.monotonic() - started < 1.0, "a full engine must answer at once, not queue the client"
    assert t.types == ["error", "session.done"]
    assert "capacity" in t.errors[0]
    assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}
    for rid, _ in held:
        tiny.abort(rid)
    # With room again the same session is served, and its utterance count moved on.
    t = await speak(comm, HELLO)
    assert t.errors == []
    assert t.json[-1] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


async def test_sessions_beyond_capacity_are_refused_while_admitted_ones_finish(connect, tiny, tiny_client):
    text = " ".join(f"Sentence {i} of a flush that keeps the tiny engine busy." for i in range(15))
    a = await session(connect, split_granularity="sentence", response_format="pcm")
    b = await session(connect, split_granularity="sentence", response_format="pcm")
    c = await session(connect, split_granularity="sentence", response_format="pcm")
    for comm in (a, b):
        await comm.send_json_to({"type": "input.text", "text": text})
        await comm.send_json_to({"type": "input.done"})
    refused = await speak(c, HELLO, timeout=5)
    assert refused.types == ["error", "session.done"] and "capacity" in refused.errors[0]
    for comm in (a, b):  # the active one and the queued one both complete in full
        t = await receive_until_done(comm)
        assert t.errors == []
        assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 15}
    served = await speak(c, HELLO)
    assert served.errors == [] and served.json[-1]["utterance_index"] == 1
