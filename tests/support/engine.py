"""The engine under test: waiting until it is idle (in-process, or the Redis workers' heartbeats),
the dispatch path in use (``redis_url``, set by the ``engine`` fixture while the Redis path is under
test), and the checks run after every test (no consumer task left behind)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from channels.testing import WebsocketCommunicator

from omniweb.engine.contracts import DONE, Done, ShapeSignature, StepResult, WorkPlan
from omniweb.engine.messages import Chunk, End, to_wire
from omniweb.engine.requests import EngineRequest
from omniweb.engine.requests import from_wire as request_from_wire

IDLE_POLL_SECONDS = 30.0  # a ceiling: an idle engine returns at once, a hang still fails, a slow CI box does not
HEARTBEAT_LAG = 0.6  # a worker's heartbeat key may be this old
redis_url: str | None = None  # set while the redis dispatch path is under test


def workers_busy(url: str) -> tuple[bool, Any]:
    """Load reported by the workers' heartbeat keys (refreshed twice a second)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        beats = [json.loads(v) for v in client.mget(client.keys("omniweb:worker:*")) if v]
    finally:
        client.close()
    busy = any(b["active"] or b["queued"] or b["running_steps"] for b in beats)
    return busy, beats


def engine_busy() -> tuple[bool, Any]:
    from omniweb.engine import runtime

    if redis_url is not None:
        return workers_busy(redis_url)
    sched = runtime._scheduler
    if sched is None:  # never started in this process (e.g. the pure-function tests): nothing to check
        return False, None
    stats = sched.stats()
    return bool(stats.active or stats.queued or stats.running_steps), stats


def wait_engine_idle(seconds: float = IDLE_POLL_SECONDS) -> Any:
    """Poll the engine (in-process, or the workers' heartbeats) until idle; fail with its stats."""
    if redis_url is not None:
        seconds += HEARTBEAT_LAG
    deadline = time.monotonic() + seconds
    while True:
        busy, stats = engine_busy()
        if not busy:
            return stats
        assert time.monotonic() < deadline, f"engine still has work {seconds}s after the test: {stats}"
        time.sleep(0.02)


def reset_engine_client() -> None:
    from channels.layers import channel_layers

    from omniweb.engine import runtime

    runtime._client = None
    channel_layers.backends.clear()


def consumer_tasks() -> list[asyncio.Task[Any]]:
    """Tasks on this loop still running code from the app (consumers, engine client, channels)."""
    stray = []
    for task in asyncio.all_tasks():
        if task is asyncio.current_task() or task.done():
            continue
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None) or getattr(coro, "ag_code", None)
        filename = code.co_filename if code is not None else repr(coro)
        if any(part in filename for part in ("/speech/", "/video/", "/omniweb/", "/channels/", "/asgiref/")) or (
            "aclose" in repr(coro)
        ):
            stray.append(task)
    return stray


async def close_sessions(comms: list[WebsocketCommunicator]) -> None:
    """Disconnect every socket; then no consumer task may be left and no consumer may have raised."""
    for comm in comms:
        if not comm.future.done():
            await comm.disconnect(timeout=5)
    if any(comm.future.cancelled() for comm in comms):
        # A receive timed out and the communicator cancelled the app (the test has failed already):
        # the consumer never saw a disconnect, so its tasks are cleaned up here instead of reported.
        stray = consumer_tasks()
        for task in stray:
            task.cancel()
        await asyncio.gather(*stray, return_exceptions=True)
        return
    # Cancelled tasks and async generators finalise on later loop iterations: poll briefly.
    deadline = time.monotonic() + IDLE_POLL_SECONDS
    while (stray := consumer_tasks()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not stray, f"tasks left running after the sessions closed: {stray}"
    for comm in comms:  # an exception inside a consumer must not pass silently
        if comm.future.done() and not comm.future.cancelled():
            comm.future.result()


def typed_request(kind: type[EngineRequest], **fields: Any) -> EngineRequest:
    """A request from plain fields (frames and history as dicts, lists), checked and typed as the
    Redis worker builds one from its message: a ``ValueError`` for a field of the wrong type."""
    return request_from_wire({"kind": kind.__name__, **fields})


class WireSink:
    """A scheduler sink that keeps each chunk in its wire form (what the Redis mode sends), so tests
    compare chunks as data; ``ended`` is set by the request's ``End``."""

    def __init__(self) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.ended = threading.Event()

    def __call__(self, chunk: Chunk) -> None:
        self.chunks.append(to_wire(chunk))
        if isinstance(chunk, End):
            self.ended.set()


HOLD = "test.hold"


@dataclass(frozen=True, kw_only=True)
class HoldRequest(EngineRequest):
    """One step that runs until ``HoldPipeline.release``: it keeps a worker busy."""

    pipeline: str = HOLD


class HoldLoop:
    name = "hold"

    def __init__(self, released: threading.Event) -> None:
        self.released = released

    def init(self, request: EngineRequest, slots: dict[str, Any]) -> list[bool]:
        return [False]

    def next(self, state: list[bool]) -> WorkPlan | Done:
        if state[0]:
            return DONE

        def run() -> StepResult:
            assert self.released.wait(60), "a held worker was never released"
            return StepResult(output=None)

        return WorkPlan(kind="hold", shape=ShapeSignature("hold"), run=run, label="hold")

    def advance(self, state: list[bool], result: StepResult) -> None:
        state[0] = True

    def finalize(self, state: list[bool]) -> dict[str, Any]:
        return {}


class HoldPipeline:
    """Holds workers on purpose, so work submitted meanwhile is all runnable when they are freed:
    a batching test then sees its requests land together instead of hoping they do."""

    name = HOLD

    def __init__(self) -> None:
        self.released = threading.Event()
        self.loops = (HoldLoop(self.released),)

    def validate(self, request: EngineRequest) -> None:
        pass

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End()

    def hold(self, sched: Any, workers: int) -> None:
        """Occupy ``workers`` of ``sched``'s workers until ``release``."""
        self.released.clear()
        for i in range(workers):
            sched.submit(f"hold-{i}-{time.monotonic_ns()}", HoldRequest(), lambda chunk: None)
        deadline = time.monotonic() + 60
        while sched.stats().running_steps < workers:
            assert time.monotonic() < deadline, "the hold steps never started"
            time.sleep(0.005)

    def release(self) -> None:
        self.released.set()


CEILING = 30.0  # seconds a test waits for what it arranged: a hang still fails, a slow CI box does not


class Gate:
    """A step the test holds: the step calls ``hold`` (``entered`` is set) and runs on until the test
    calls ``open``. A worker is busy on purpose, or a request is caught mid-step, for exactly as long
    as the test needs it, never for a guessed time."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def hold(self) -> None:
        """Called by the held step, on its worker."""
        self.entered.set()
        assert self.opened.wait(CEILING), "a held step was never let go"

    def wait_entered(self) -> None:
        assert self.entered.wait(CEILING), "the held step never started"

    def open(self) -> None:
        self.opened.set()


class ManualClock:
    """A scheduler's clock (``clock=``) that moves only when the test moves it: pacing, the settle
    time and the batching window then end when the test says so, not when a busy machine gets to it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
