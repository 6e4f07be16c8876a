"""The worker pool's contract: ordering, batching, cancellation, admission by counts and fault isolation.

The loops here are test doubles on purpose: they provoke what the real voice won't do on demand
(a step that raises, a step held mid-flight until the test cancels it). The real pipeline's behaviour
through the same scheduler is covered in test_engine_tts.py and the speech tests.

No test sleeps or reads the time: a step that must be "slow" or "running" is held on a ``Gate`` until
the test has arranged what it wants, and the timed waits of the pool (pacing, the settle time after a
first media, the batching window) run on a ``ManualClock`` the test moves (or, where a wait only has
to end, on the real clock with nothing asserted about how long it took). Every wait is on an event,
with a generous ceiling. The timing decisions themselves are the picking policy's, tested pure in
test_engine_policy.py; here they are seen through the threads that execute them.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from support.engine import CEILING, Gate, ManualClock, WireSink

from omniweb.base.errors import EngineError, ErrorKind
from omniweb.engine.contracts import DONE, ShapeSignature, StepResult, WaitFor, Wake, WorkPlan
from omniweb.engine.messages import Chunk, End, TextDelta, to_wire
from omniweb.engine.requests import EngineRequest, Priority
from omniweb.engine.scheduler import AdmissionError, Scheduler


@dataclass(frozen=True, kw_only=True)
class CountRequest(EngineRequest):
    """``steps`` steps, each ``media`` seconds of media; ``gate`` holds step ``gate_at`` until the test
    opens it; ``fail_at``: the step that raises (-n: ``next`` raises before step n-1)."""

    pipeline: str = "count"
    steps: int = 0
    gate: Gate | None = None
    gate_at: int = 0
    fail_at: int | None = None
    fail_kind: ErrorKind | None = None
    shape: int = 1
    tag: str = ""
    long: bool = False
    lookahead: bool = False  # steps after the first are look-ahead: due 0.1 s of media apart
    media: float = 0.1


@dataclass
class CountState:
    request: CountRequest
    done: int = 0


class CountLoop:
    """Emits one chunk per step; steps of equal shape can run batched."""

    name = "count"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batch_sizes: list[int] = []
        self.released: list[int] = []  # steps done by each request released without finalize
        self.ran: list[str] = []  # request tags in the order their steps ran
        self.next_calls: dict[str, int] = {}  # next() calls by request tag
        self.running: Counter[str] = Counter()  # "long" and "batch" steps running at this moment
        self.most: Counter[str] = Counter()  # the most of each that ran at once

    def init(self, request: CountRequest, slots: dict[str, Any]) -> CountState:
        return CountState(request)

    def next(self, state: CountState) -> WorkPlan | Any:
        request = state.request
        with self.lock:
            self.next_calls[request.tag] = self.next_calls.get(request.tag, 0) + 1
        if state.done >= request.steps:
            return DONE
        if request.fail_at == -state.done - 1:  # fail_at=-n: next() itself raises before step n-1
            raise KeyError("bookkeeping bug")
        i = state.done
        counted = [name for name, on in (("long", request.long), ("batch", request.batch)) if on]

        def run() -> StepResult:
            with self.lock:
                self.running.update(counted)
                for name in counted:
                    self.most[name] = max(self.most[name], self.running[name])
            try:
                if request.gate is not None and i == request.gate_at:
                    request.gate.hold()
            finally:
                with self.lock:
                    self.running.subtract(counted)
                    self.ran.append(request.tag)
            if request.fail_at == i:
                if request.fail_kind is not None:
                    raise EngineError(request.fail_kind, "secret internal detail", client_message="upstream said no")
                raise RuntimeError("secret internal detail")
            return StepResult(output=i, chunks=[TextDelta(str(i))], media_seconds=request.media)

        def batch_run(plans: Sequence[WorkPlan]) -> list[StepResult]:
            with self.lock:
                self.batch_sizes.append(len(plans))
            return [p.run() for p in plans]

        return WorkPlan(
            kind="count",
            shape=ShapeSignature("count", (request.shape,)),
            run=run,
            emits=("ticks",),
            batch_run=None if request.long else batch_run,
            long=request.long,
            due=0.1 * i if request.lookahead else None,
        )

    def advance(self, state: CountState, result: StepResult) -> None:
        state.done += 1

    def finalize(self, state: CountState) -> dict[str, Any]:
        return {"steps": state.done}

    def release(self, state: CountState) -> None:
        self.released.append(state.done)


class CountPipeline:
    name = "count"

    def __init__(self) -> None:
        self.loops = (CountLoop(),)

    def validate(self, request: EngineRequest) -> None:
        if isinstance(request, CountRequest) and request.steps < 0:
            raise ValueError("steps must be >= 0")

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End(segments=finals[0]["steps"])  # the steps done, in the End's count field


class Batches:
    """The scheduler's ``on_batch`` reports in order; each one wakes ``Pool.wait_idle``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.cond = threading.Condition()

    def __call__(self, kind: str, size: int) -> None:
        with self.cond:
            self.seen.append((kind, size))
            self.cond.notify_all()


@dataclass
class Pool:
    """A started scheduler and what the tests read from it: its count loop, the batch sizes it
    reported, and the gates its held steps wait on (opened at teardown if a test failed first)."""

    sched: Scheduler
    loop: CountLoop
    batches: Batches
    gates: list[Gate] = field(default_factory=list)

    def gate(self) -> Gate:
        gate = Gate()
        self.gates.append(gate)
        return gate

    def hold_worker(self, tag: str = "hold") -> Gate:
        """Occupy one worker with a held one-step request: what is submitted meanwhile is all ready
        together when the test opens the gate."""
        gate = self.gate()
        self.sched.submit(f"{tag}-{len(self.gates)}", CountRequest(steps=1, gate=gate, tag=tag), WireSink())
        gate.wait_entered()
        return gate

    def wait_idle(self) -> None:
        """Until nothing is active, queued or running: checked again after each batch ends."""
        while True:
            with self.batches.cond:
                seen = len(self.batches.seen)
            stats = self.sched.stats()
            if stats.active == stats.queued == stats.running_steps == 0:
                return
            with self.batches.cond:
                more = self.batches.cond.wait_for(lambda n=seen: len(self.batches.seen) > n, CEILING)
            assert more, f"scheduler still busy: {stats}"


@pytest.fixture
def make_pool():
    made: list[Pool] = []

    def make(extra: dict[str, Any] | None = None, **kw: Any) -> Pool:
        pipeline = CountPipeline()
        batches = Batches()
        sched = Scheduler({"count": pipeline, **(extra or {})}, on_batch=batches, **kw)
        sched.start()
        pool = Pool(sched, pipeline.loops[0], batches)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        for gate in pool.gates:
            gate.open()
        pool.sched.stop()


class OrderLog:
    """One sink per request writing into a shared log, so the order of steps across requests is
    exact; each chunk wakes a test waiting on it."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []  # (request, text delta) in the order they came
        self.events: list[tuple[str, str]] = []  # ("tick" or "end", request) in the order they came
        self.ends: dict[str, dict[str, Any]] = {}
        self.cond = threading.Condition()

    def sink(self, name: str) -> Callable[[Chunk], None]:
        def put(typed: Chunk) -> None:
            chunk = to_wire(typed)
            with self.cond:
                if chunk["type"] == "text":
                    self.log.append((name, chunk["delta"]))
                    self.events.append(("tick", name))
                elif chunk["type"] == "end":
                    self.events.append(("end", name))
                    self.ends[name] = chunk
                self.cond.notify_all()

        return put

    def steps(self) -> list[tuple[str, int]]:
        """The count requests' steps, in the order they were emitted."""
        with self.cond:
            return [(name, int(delta)) for name, delta in self.log]

    def ticks(self, name: str) -> list[int]:
        return [i for n, i in self.steps() if n == name]

    def texts(self, name: str) -> list[str]:
        with self.cond:
            return [delta for n, delta in self.log if n == name]

    def ended(self, name: str) -> bool:
        with self.cond:
            return name in self.ends

    def wait(self, what: Callable[[], bool], why: str) -> None:
        with self.cond:
            assert self.cond.wait_for(what, CEILING), why

    def wait_ended(self, *names: str) -> None:
        self.wait(lambda: all(n in self.ends for n in names), f"never ended: {names}")

    def wait_ticks(self, name: str, count: int) -> None:
        self.wait(lambda: sum(1 for n, _ in self.log if n == name) >= count, f"{name} never made {count} steps")


def ticks_of(sink: WireSink) -> list[int]:
    return [int(c["delta"]) for c in sink.chunks if c["type"] == "text"]


def test_chunks_arrive_in_order_then_end(make_pool):
    pool = make_pool(workers=2)
    sink = WireSink()
    pool.sched.submit("r1", CountRequest(steps=5), sink)
    assert sink.ended.wait(CEILING)
    assert [int(c["delta"]) for c in sink.chunks[:-1]] == [0, 1, 2, 3, 4]
    assert sink.chunks[-1] == {"type": "end", "status": "ok", "segments": 5}
    pool.wait_idle()


def test_request_with_no_work_ends_at_once(make_pool):
    pool = make_pool()
    sink = WireSink()
    pool.sched.submit("r0", CountRequest(steps=0), sink)
    # Ended within submit itself: no worker was needed.
    assert sink.chunks == [{"type": "end", "status": "ok", "segments": 0}]
    assert pool.sched.stats().steps_total == 0


def test_equal_shapes_from_many_requests_are_batched(make_pool):
    pool = make_pool(workers=1, max_batch=8)
    held = pool.hold_worker()  # the only worker is busy: the eight first steps are ready together
    sinks = [WireSink() for _ in range(8)]
    for i, sink in enumerate(sinks):
        pool.sched.submit(f"r{i}", CountRequest(steps=3), sink)
    held.open()
    for sink in sinks:
        assert sink.ended.wait(CEILING)
        assert [int(c["delta"]) for c in sink.chunks[:-1]] == [0, 1, 2]
    assert pool.loop.batch_sizes == [8, 8, 8]
    stats = pool.sched.stats()
    assert (stats.batches_total, stats.batched_steps_total) == (3, 24)
    pool.wait_idle()


def test_a_pick_asks_a_loop_again_only_after_its_own_step(make_pool):
    # 24 requests on one worker: 72 picks over up to 24 waiting requests, yet each loop is asked for
    # its next step once after its start and once after each of its steps: a pick looks again only
    # at requests where something changed.
    pool = make_pool(workers=1, max_batch=1)
    held = pool.hold_worker()
    sinks = [WireSink() for _ in range(24)]
    for i, sink in enumerate(sinks):
        pool.sched.submit(f"r{i}", CountRequest(steps=3, tag=f"r{i}"), sink)
    held.open()
    for sink in sinks:
        assert sink.ended.wait(CEILING)
        assert [int(c["delta"]) for c in sink.chunks[:-1]] == [0, 1, 2]
    assert pool.loop.next_calls == {"hold": 2, **{f"r{i}": 4 for i in range(24)}}
    assert pool.sched.stats().steps_total == 1 + 72
    pool.wait_idle()


def test_max_batch_caps_batches(make_pool):
    pool = make_pool(workers=1, max_batch=3)
    held = pool.hold_worker()
    sinks = [WireSink() for _ in range(7)]
    for i, sink in enumerate(sinks):
        pool.sched.submit(f"r{i}", CountRequest(steps=2), sink)
    held.open()
    for sink in sinks:
        assert sink.ended.wait(CEILING) and sink.chunks[-1]["status"] == "ok"
    assert max(pool.loop.batch_sizes) == 3
    assert pool.sched.stats().steps_total == 1 + 14
    pool.wait_idle()


def test_abort_stops_between_steps_and_frees_the_engine(make_pool):
    pool = make_pool(workers=2)
    sink = WireSink()
    gate = pool.gate()
    pool.sched.submit("long", CountRequest(steps=1000, gate=gate, gate_at=3), sink)
    gate.wait_entered()  # three steps done, the fourth in flight
    assert ticks_of(sink) == [0, 1, 2]
    assert pool.sched.abort("long") is True
    assert sink.ended.is_set()  # the client hears it at once, not when the step in flight ends
    assert sink.chunks[-1] == {"type": "end", "status": "cancelled"}
    assert pool.loop.released == [3]  # its loops could free what they hold
    gate.open()
    pool.wait_idle()
    # The step in flight ran to its end and was discarded; nothing ran after it.
    assert pool.sched.stats().steps_total == 4
    assert ticks_of(sink) == [0, 1, 2] and sink.chunks[-1] == {"type": "end", "status": "cancelled"}
    assert pool.sched.abort("long") is False
    assert pool.loop.released == [3]  # once


def test_abort_of_a_queued_request_and_of_an_active_one_that_frees_a_slot(make_pool):
    pool = make_pool(workers=1, max_active=1, max_queued=4)
    a, b, c = WireSink(), WireSink(), WireSink()
    gate = pool.gate()
    pool.sched.submit("a", CountRequest(steps=2, gate=gate), a)
    gate.wait_entered()
    pool.sched.submit("b", CountRequest(steps=5), b)
    pool.sched.submit("c", CountRequest(steps=2), c)
    assert pool.sched.stats().queued == 2
    assert pool.sched.abort("b")
    assert b.chunks == [{"type": "end", "status": "cancelled"}]
    assert pool.sched.abort("a")  # its slot goes to c, which runs once the worker is free
    stats = pool.sched.stats()
    assert (stats.active, stats.queued) == (1, 0)
    gate.open()
    assert c.ended.wait(CEILING)
    assert c.chunks[-1] == {"type": "end", "status": "ok", "segments": 2}
    assert a.chunks == [{"type": "end", "status": "cancelled"}]  # the step in flight was discarded
    pool.wait_idle()


def test_admission_by_counts_refuses_at_once_when_full(make_pool):
    pool = make_pool(workers=1, max_active=1, max_queued=1)
    order = OrderLog()
    gate = pool.gate()
    pool.sched.submit("a", CountRequest(steps=2, gate=gate), order.sink("a"))
    pool.sched.submit("b", CountRequest(steps=2), order.sink("b"))
    with pytest.raises(AdmissionError) as refused:
        pool.sched.submit("c", CountRequest(steps=1), WireSink())
    assert refused.value.kind is ErrorKind.CAPACITY
    # At once: refused while the engine was still full (a is held), not after waiting for room.
    assert order.events == []
    gate.open()
    order.wait_ended("a", "b")
    # The queued request runs once the active one finishes.
    assert order.events == [("tick", "a"), ("tick", "a"), ("end", "a"), ("tick", "b"), ("tick", "b"), ("end", "b")]
    assert order.ends["b"]["status"] == "ok"
    pool.wait_idle()


def test_a_failing_step_ends_only_its_request(make_pool, caplog):
    pool = make_pool(workers=1, max_batch=1)
    bad, good = WireSink(), WireSink()
    pool.sched.submit("bad", CountRequest(steps=5, fail_at=2), bad)
    pool.sched.submit("good", CountRequest(steps=5), good)
    assert bad.ended.wait(CEILING) and good.ended.wait(CEILING)
    assert bad.chunks[-1] == {
        "type": "end",
        "status": "error",
        "kind": "engine_failure",
        "message": "generation failed",
    }
    assert "secret internal detail" not in repr(bad.chunks)  # logged, never sent
    assert "secret internal detail" in caplog.text
    assert good.chunks[-1]["status"] == "ok"
    assert pool.loop.released == [2]  # the failed request is released; the good one finalized
    # The worker survived: a new request still runs.
    again = WireSink()
    pool.sched.submit("again", CountRequest(steps=2), again)
    assert again.ended.wait(CEILING) and again.chunks[-1]["status"] == "ok"


def test_invalid_requests_are_refused_before_admission(make_pool):
    pool = make_pool()
    with pytest.raises(ValueError, match="unknown pipeline"):
        pool.sched.submit("x", CountRequest(pipeline="nope"), WireSink())
    with pytest.raises(ValueError, match="steps must be"):
        pool.sched.submit("y", CountRequest(steps=-1), WireSink())
    assert pool.sched.stats().active == 0


def test_new_request_is_served_before_a_stream_that_is_ahead(make_pool):
    """Earliest deadline first, as the pool applies it: a stream 5 s of media ahead (made while its
    clock stood still) yields to a request with none yet as soon as the step in flight ends."""
    pool = make_pool(workers=1, max_batch=1, clock=ManualClock())
    order = OrderLog()
    gate = pool.gate()
    pool.sched.submit("long", CountRequest(steps=60, gate=gate, gate_at=50), order.sink("long"))
    gate.wait_entered()
    pool.sched.submit("fresh", CountRequest(steps=1), order.sink("fresh"))
    gate.open()
    order.wait_ended("fresh", "long")
    steps = order.steps()
    assert steps[:52] == [("long", i) for i in range(51)] + [("fresh", 0)], steps[48:54]
    assert order.events.index(("end", "fresh")) < order.events.index(("end", "long"))
    pool.wait_idle()


def test_a_loop_whose_next_raises_ends_only_its_request(make_pool):
    pool = make_pool(workers=1)
    bad, good = WireSink(), WireSink()
    pool.sched.submit("bad", CountRequest(steps=5, fail_at=-3), bad)
    pool.sched.submit("good", CountRequest(steps=3), good)
    assert bad.ended.wait(CEILING) and good.ended.wait(CEILING)
    assert bad.chunks[-1]["status"] == "error" and ticks_of(bad) == [0, 1]
    assert good.chunks[-1]["status"] == "ok"
    pool.wait_idle()


def test_batching_window_gathers_plans_that_arrive_within_it(make_pool):
    """On a clock that stands still the window never closes: the four arrivals ride together
    however far apart the test thread gets to submit them."""
    pool = make_pool(workers=1, max_batch=4, batch_wait=0.2, clock=ManualClock())
    sinks = [WireSink() for _ in range(4)]
    for i, sink in enumerate(sinks):
        pool.sched.submit(f"r{i}", CountRequest(steps=1), sink)
    for sink in sinks:
        assert sink.ended.wait(CEILING)
    assert pool.loop.batch_sizes == [4]


def test_a_batching_window_closes_on_a_lone_plan(make_pool):
    """Nothing else arrives: the window ends and the plan runs alone (a window that never closed
    would hang this test until its ceiling)."""
    pool = make_pool(workers=1, max_batch=4, batch_wait=0.05)
    sink = WireSink()
    pool.sched.submit("solo", CountRequest(steps=2), sink)
    assert sink.ended.wait(CEILING) and sink.chunks[-1]["status"] == "ok"
    assert pool.loop.batch_sizes == []  # ran alone, not through batch_run


def test_without_a_window_a_lone_request_never_waits(make_pool):
    pool = make_pool(workers=1, max_batch=16)
    sink = WireSink()
    pool.sched.submit("solo", CountRequest(steps=3), sink)
    assert sink.ended.wait(CEILING)
    assert pool.loop.batch_sizes == []  # ran alone, not through batch_run


def test_batch_sizes_are_reported(make_pool):
    pool = make_pool(workers=1, max_batch=8)
    held = pool.hold_worker()
    sinks = [WireSink() for _ in range(5)]
    for i, sink in enumerate(sinks):
        pool.sched.submit(f"r{i}", CountRequest(steps=1), sink)
    held.open()
    for sink in sinks:
        assert sink.ended.wait(CEILING)
    assert pool.batches.seen == [("count", 1), ("count", 5)]  # the held step alone, then the five


def test_a_request_marked_unpaced_runs_as_fast_as_it_can(make_pool):
    """paced: False (a file made for one flush, which nobody hears while it is made). On a clock
    that stands still a paced stream stops 0.5 s of media ahead of its listener; this one makes all
    of its 25 s."""
    pool = make_pool(workers=1, max_ahead=0.5, clock=ManualClock())
    order = OrderLog()
    pool.sched.submit("listened", CountRequest(steps=100, media=0.25), order.sink("listened"))
    pool.sched.submit("file", CountRequest(steps=100, media=0.25, paced=False), order.sink("file"))
    order.wait_ended("file")
    assert order.ticks("file") == list(range(100))
    assert not order.ended("listened") and len(order.ticks("listened")) <= 3  # 0.75 s made: 0.5 s ahead
    pool.sched.abort("listened")
    pool.wait_idle()


def test_pacing_does_not_delay_a_second_stream(make_pool):
    """A paced stream waits for its listener without holding a worker: a new stream runs meanwhile,
    and the paced one goes on when its clock does."""
    clock = ManualClock()
    pool = make_pool(workers=1, max_ahead=0.5, clock=clock)
    order = OrderLog()
    pool.sched.submit("long", CountRequest(steps=12, media=0.25), order.sink("long"))  # 3 s of media
    order.wait_ticks("long", 3)  # 0.75 s made at once, then it waits: more would be over 0.5 s ahead
    pool.sched.submit("fresh", CountRequest(steps=2, media=0.25), order.sink("fresh"))
    order.wait_ended("fresh")
    assert order.steps() == [("long", 0), ("long", 1), ("long", 2), ("fresh", 0), ("fresh", 1)]
    assert not order.ended("long")
    clock.advance(10.0)  # the listener has heard it all: the rest comes
    order.wait_ended("long")
    assert order.ticks("long") == list(range(12)) and order.ends["long"]["status"] == "ok"
    pool.wait_idle()


@pytest.mark.parametrize("lookahead", [False, True])
@pytest.mark.parametrize("settle", [0.0, 0.15])
def test_a_request_pauses_a_settle_time_after_its_first_media(make_pool, settle, lookahead):
    """The first media's delivery (encoding, socket writes) has the CPUs to itself for a moment;
    then the request's next steps, look-ahead or not, run on their own, with nothing else to wake
    the workers, and do not pause again."""
    clock = ManualClock()
    pool = make_pool(workers=2, first_media_settle=settle, clock=clock)
    order = OrderLog()
    pool.sched.submit("r", CountRequest(steps=3, lookahead=lookahead), order.sink("r"))
    if settle:
        order.wait_ticks("r", 1)
        assert order.ticks("r") == [0] and not order.ended("r")  # paused while the clock stands
        clock.advance(settle)  # once: both remaining steps run after it
    order.wait_ended("r")
    assert order.ticks("r") == [0, 1, 2]
    pool.wait_idle()


def test_under_load_a_request_is_not_held_back_after_its_first_media(make_pool):
    """With other requests' work ready there is no idle CPU to give the delivery: the settle
    would only queue the request's next audio behind that work."""
    clock = ManualClock()
    pool = make_pool(workers=1, first_media_settle=0.5, clock=clock)
    order = OrderLog()
    pool.sched.submit("a", CountRequest(steps=2, tag="a"), order.sink("a"))
    pool.sched.submit("b", CountRequest(steps=20, shape=2, tag="b"), order.sink("b"))
    order.wait_ended("a")  # within the 0.5 s settle: its clock never moved
    assert order.ticks("a") == [0, 1]
    clock.advance(0.5)  # b, alone now, has its own settle
    order.wait_ended("b")
    assert order.ticks("b") == list(range(20))
    pool.wait_idle()


def test_batch_priority_is_not_paced(make_pool):
    """A client writing a file declares priority "batch": its stream runs ahead of any listener."""
    clock = ManualClock()
    pool = make_pool(workers=1, max_ahead=0.5, clock=clock)
    order = OrderLog()
    pool.sched.submit("listener", CountRequest(steps=12, media=0.25), order.sink("listener"))
    pool.sched.submit("file", CountRequest(steps=12, media=0.25, priority=Priority.BATCH), order.sink("file"))
    order.wait_ended("file")
    assert order.ticks("file") == list(range(12))
    assert not order.ended("listener") and len(order.ticks("listener")) <= 3, "the listener was not paced"
    clock.advance(10.0)
    order.wait_ended("listener")
    pool.wait_idle()


def test_batch_priority_yields_to_real_time_requests(make_pool):
    """By deadline alone the file, submitted first, would go first; a real-time request's steps run
    as soon as the batch step in flight when it arrived has ended."""
    pool = make_pool(workers=1, max_batch=1)
    order = OrderLog()
    gate = pool.gate()
    pool.sched.submit("file", CountRequest(steps=8, gate=gate, gate_at=3, priority=Priority.BATCH), order.sink("file"))
    gate.wait_entered()
    pool.sched.submit("live", CountRequest(steps=3), order.sink("live"))
    gate.open()
    order.wait_ended("live", "file")
    expected = [("file", i) for i in range(4)] + [("live", i) for i in range(3)] + [("file", i) for i in range(4, 8)]
    assert order.steps() == expected
    pool.wait_idle()


def test_batch_priority_leaves_a_worker_free_for_real_time_arrivals(make_pool):
    pool = make_pool(workers=2, max_batch=1)
    order = OrderLog()
    gates = {name: pool.gate() for name in ("file-a", "file-b")}
    for name, gate in gates.items():
        request = CountRequest(steps=2, gate=gate, priority=Priority.BATCH)
        pool.sched.submit(name, request, order.sink(name))
    gates["file-a"].wait_entered()
    pool.sched.submit("live", CountRequest(steps=1), order.sink("live"))
    order.wait_ended("live")  # on the worker the batch work left free
    assert not gates["file-b"].entered.is_set(), "two batch steps ran at once"
    for gate in gates.values():
        gate.open()
    order.wait_ended("file-a", "file-b")
    assert pool.loop.most["batch"] == 1
    pool.wait_idle()


def test_long_steps_leave_a_worker_to_a_playing_stream(make_pool):
    """Whisper-like steps (WorkPlan.long) never take every worker while a stream plays."""
    clock = ManualClock()
    pool = make_pool(workers=2, max_batch=1, max_ahead=0.5, clock=clock)
    order = OrderLog()
    pool.sched.submit("live", CountRequest(steps=12, media=0.25), order.sink("live"))
    order.wait_ticks("live", 3)  # playing, and paced: it holds no worker while it waits
    gates = {name: pool.gate() for name in ("asr-a", "asr-b")}
    for name, gate in gates.items():
        pool.sched.submit(name, CountRequest(steps=1, long=True, gate=gate), order.sink(name))
    gates["asr-a"].wait_entered()
    pool.sched.submit("fresh", CountRequest(steps=1), order.sink("fresh"))
    order.wait_ended("fresh")  # on the worker the long step left free
    assert not gates["asr-b"].entered.is_set(), "two long steps held both workers while a stream was playing"
    for gate in gates.values():
        gate.open()
    order.wait_ended("asr-a", "asr-b")
    assert pool.loop.most["long"] == 1
    clock.advance(10.0)
    order.wait_ended("live")
    pool.wait_idle()


def test_long_steps_use_every_worker_when_nothing_plays(make_pool):
    pool = make_pool(workers=2, max_batch=1)
    order = OrderLog()
    gates = {name: pool.gate() for name in ("asr-a", "asr-b")}
    for name, gate in gates.items():
        pool.sched.submit(name, CountRequest(steps=3, long=True, gate=gate), order.sink(name))
    for gate in gates.values():
        gate.wait_entered()  # both at once
    for gate in gates.values():
        gate.open()
    order.wait_ended("asr-a", "asr-b")
    assert pool.loop.most["long"] == 2
    pool.wait_idle()


def test_a_fault_in_a_batched_step_ends_only_its_own_request(make_pool, caplog):
    """Eight requests step in lockstep in batches of eight; one step of one of them raises."""
    pool = make_pool(workers=1, max_batch=8)
    held = pool.hold_worker()  # the only worker is busy: the eight first steps are ready together
    sinks = [WireSink() for _ in range(8)]
    for i, sink in enumerate(sinks):
        request = CountRequest(steps=4, fail_at=1 if i == 3 else None)
        pool.sched.submit(f"r{i}", request, sink)
    held.open()
    for sink in sinks:
        assert sink.ended.wait(CEILING)
    # The failing step ran in a batch of eight (then each plan alone); the seven went on together.
    assert pool.loop.batch_sizes == [8, 8, 7, 7]
    bad = sinks[3]
    assert ticks_of(bad) == [0]
    assert bad.chunks[-1]["status"] == "error" and bad.chunks[-1]["kind"] == "engine_failure"
    for i, sink in enumerate(sinks):
        if i != 3:
            assert [int(c["delta"]) for c in sink.chunks[:-1]] == [0, 1, 2, 3]
            assert sink.chunks[-1] == {"type": "end", "status": "ok", "segments": 4}
    assert "running its plans alone" in caplog.text
    pool.wait_idle()


def test_a_step_chooses_the_kind_and_client_message_of_its_error(make_pool):
    pool = make_pool(workers=1)
    sink = WireSink()
    pool.sched.submit("up", CountRequest(steps=3, fail_at=1, fail_kind=ErrorKind.UPSTREAM), sink)
    assert sink.ended.wait(CEILING)
    assert sink.chunks[-1] == {
        "type": "end",
        "status": "error",
        "kind": "upstream_failure",
        "message": "upstream said no",
    }


def test_a_stopped_engine_refuses_as_unreachable(make_pool):
    pool = make_pool()
    pool.sched.stop()
    with pytest.raises(AdmissionError) as refused:
        pool.sched.submit("late", CountRequest(steps=1), WireSink())
    assert refused.value.kind is ErrorKind.UNREACHABLE


class Source:
    """Outside input a loop waits on (as the upstream thinker's HTTP stream): pushed from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[str] = []
        self.closed = False
        self.wake: Wake | None = None
        self.subscribed = threading.Event()

    def push(self, item: str | None) -> None:
        with self.lock:
            if item is None:
                self.closed = True
            else:
                self.items.append(item)
            wake, self.wake = self.wake, None
        if wake is not None:
            wake()

    def subscribe(self, wake: Wake) -> None:
        with self.lock:
            ready = bool(self.items) or self.closed
            if not ready:
                self.wake = wake
        self.subscribed.set()
        if ready:
            wake()


@dataclass
class IoState:
    source: Source
    got: list[str] = field(default_factory=list)


class IoLoop:
    """Emits what its source delivers; waits (holding no worker) while the source is silent."""

    name = "io"

    def __init__(self) -> None:
        self.steps = 0

    def init(self, request: IoRequest, slots: dict[str, Any]) -> IoState:
        return IoState(request.source)

    def next(self, state: IoState) -> WorkPlan | Any:
        source = state.source
        with source.lock:
            items, source.items = source.items, []
            closed = source.closed
        if not items:
            return DONE if closed else WaitFor(source.subscribe)

        def run() -> StepResult:
            self.steps += 1
            return StepResult(output=items, chunks=[TextDelta(" ".join(items))])

        return WorkPlan(kind="io", shape=ShapeSignature("io"), run=run)

    def advance(self, state: IoState, result: StepResult) -> None:
        state.got.extend(result.output)

    def finalize(self, state: IoState) -> dict[str, Any]:
        return {"got": state.got}


@dataclass(frozen=True, kw_only=True)
class IoRequest(EngineRequest):
    pipeline: str = "io"
    source: Source


class IoPipeline:
    name = "io"

    def __init__(self) -> None:
        self.loops = (IoLoop(),)

    def validate(self, request: EngineRequest) -> None:
        pass

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End(text=" ".join(finals[0]["got"]))


def test_loops_waiting_on_io_hold_no_worker_and_wake_when_input_arrives(make_pool):
    io = IoPipeline()
    pool = make_pool(extra={"io": io}, workers=2)
    order = OrderLog()
    sources = [Source(), Source()]
    for i, source in enumerate(sources):
        pool.sched.submit(f"io{i}", IoRequest(source=source), order.sink(f"io{i}"))
    # Both workers stay free for other work while the two requests wait on silent sources.
    streams = [WireSink() for _ in range(4)]
    for i, sink in enumerate(streams):
        pool.sched.submit(f"s{i}", CountRequest(steps=20), sink)
    for sink in streams:
        assert sink.ended.wait(CEILING) and sink.chunks[-1]["status"] == "ok"
    assert io.loops[0].steps == 0 and order.events == []
    stats = pool.sched.stats()
    assert stats.active == 2 and stats.running_steps == 0
    # Input wakes the waiting loop from another thread; an ended source finishes the request.
    threading.Thread(target=sources[0].push, args=("hello",)).start()
    order.wait(lambda: bool(order.log), "the input never woke its loop")
    assert order.texts("io0") == ["hello"]
    sources[0].push("world")
    sources[0].push(None)
    sources[1].push(None)
    order.wait_ended("io0", "io1")
    assert order.ends["io0"] == {"type": "end", "status": "ok", "text": "hello world"}
    assert order.ends["io1"] == {"type": "end", "status": "ok", "text": ""}
    assert io.loops[0].steps <= 3  # one step per arrival at most, never a poll
    pool.wait_idle()


def test_an_aborted_request_waiting_on_io_ignores_a_late_wake_up(make_pool):
    pool = make_pool(extra={"io": IoPipeline()}, workers=1)
    source, sink = Source(), WireSink()
    pool.sched.submit("gone", IoRequest(source=source), sink)
    assert source.subscribed.wait(CEILING)
    assert pool.sched.abort("gone")
    source.push("late")  # wakes nothing: the request has left the tables
    assert sink.chunks == [{"type": "end", "status": "cancelled"}]
    pool.wait_idle()


def test_a_batch_never_carries_work_less_urgent_than_other_work_waiting(make_pool):
    """Batching is free on a GPU but not on a CPU: a batch takes only the equal-shape plans that
    are more urgent than the most urgent plan of another shape, so it cannot push that one back."""
    pool = make_pool(workers=1, max_batch=8)
    held = pool.hold_worker("slow")
    sinks = [WireSink() for _ in range(4)]
    for i, (shape, tag) in enumerate([(1, "a"), (1, "b"), (2, "c"), (1, "d")]):
        pool.sched.submit(f"r{i}", CountRequest(steps=1, shape=shape, tag=tag), sinks[i])
    held.open()
    for sink in sinks:
        assert sink.ended.wait(CEILING)
    assert pool.loop.ran == ["slow", "a", "b", "c", "d"]  # "d" did not ride along with "a" and "b"
    assert pool.loop.batch_sizes == [2]


class EagerLoop:
    """A buggy loop: it waits for input it says is already there, forever."""

    name = "eager"

    def init(self, request: EngineRequest, slots: dict[str, Any]) -> None:
        return None

    def next(self, state: None) -> WaitFor:
        return WaitFor(lambda wake: wake())

    def advance(self, state: None, result: StepResult) -> None:
        pass

    def finalize(self, state: None) -> dict[str, Any]:
        return {}


@dataclass(frozen=True, kw_only=True)
class EagerRequest(EngineRequest):
    pipeline: str = "eager"


class EagerPipeline:
    name = "eager"
    loops = (EagerLoop(),)

    def validate(self, request: EngineRequest) -> None:
        pass

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End()


def test_a_loop_that_waits_for_what_it_has_fails_its_request_instead_of_spinning(make_pool, caplog):
    pool = make_pool(extra={"eager": EagerPipeline()}, workers=1)
    bad, good = WireSink(), WireSink()
    pool.sched.submit("bad", EagerRequest(), bad)
    pool.sched.submit("good", CountRequest(steps=2), good)
    assert bad.ended.wait(CEILING) and good.ended.wait(CEILING)
    assert bad.chunks[-1]["status"] == "error" and bad.chunks[-1]["kind"] == "engine_failure"
    assert good.chunks[-1]["status"] == "ok"
    assert "woke at once" in caplog.text
