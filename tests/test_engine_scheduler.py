"""The scheduler's contract: ordering, batching, cancellation, admission and fault isolation.

The loops here are test doubles on purpose: they provoke what the real voice won't do on demand
(a step that raises, a step slow enough to cancel mid-stream). The real pipeline's behaviour through
the same scheduler is covered in test_engine_tts.py and the speech tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from support.engine import WireSink

from omniweb.base.errors import EngineError, ErrorKind
from omniweb.engine.contracts import DONE, ShapeSignature, StepResult, WaitFor, Wake, WorkPlan
from omniweb.engine.messages import Chunk, End, TextDelta, to_wire
from omniweb.engine.requests import EngineRequest, Priority
from omniweb.engine.scheduler import AdmissionError, Scheduler


@dataclass(frozen=True, kw_only=True)
class CountRequest(EngineRequest):
    """``steps`` steps of ``delay`` seconds each; ``fail_at``: the step that raises (-n: ``next``)."""

    pipeline: str = "count"
    steps: int = 0
    delay: float = 0.0
    fail_at: int | None = None
    fail_kind: ErrorKind | None = None
    shape: int = 1
    tag: str = ""
    long: bool = False
    lookahead: bool = False
    media: float = 0.1  # seconds of media each step makes


@dataclass
class CountState:
    steps: int
    delay: float
    fail_at: int | None
    fail_kind: ErrorKind | None = None
    shape: int = 1
    tag: str = ""
    long: bool = False
    lookahead: bool = False  # steps after the first are look-ahead: due 0.1 s of media apart
    media: float = 0.1
    done: int = 0
    batch_sizes: list[int] = field(default_factory=list)


class CountLoop:
    """Emits one chunk per step; steps of equal shape can run batched."""

    name = "count"

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []
        self.lock = threading.Lock()
        self.released: list[int] = []  # steps done by each request released without finalize
        self.ran: list[str] = []  # request tags in the order their steps ran
        self.long_now = 0  # long steps running at this moment
        self.long_most = 0  # the most that ran at once
        self.next_calls: dict[str, int] = {}  # next() calls by request tag
        self.started: list[float] = []  # when each step began (time.monotonic)

    def init(self, request: CountRequest, slots: dict[str, Any]) -> CountState:
        return CountState(
            request.steps,
            request.delay,
            request.fail_at,
            request.fail_kind,
            shape=request.shape,
            tag=request.tag,
            long=request.long,
            lookahead=request.lookahead,
            media=request.media,
        )

    def next(self, state: CountState) -> WorkPlan | Any:
        with self.lock:
            self.next_calls[state.tag] = self.next_calls.get(state.tag, 0) + 1
        if state.done >= state.steps:
            return DONE
        if state.fail_at == -state.done - 1:  # fail_at=-n: next() itself raises before step n-1
            raise KeyError("bookkeeping bug")
        i = state.done

        def run() -> StepResult:
            self.started.append(time.monotonic())
            if state.long:
                with self.lock:
                    self.long_now += 1
                    self.long_most = max(self.long_most, self.long_now)
            time.sleep(state.delay)
            with self.lock:
                self.ran.append(state.tag)
                if state.long:
                    self.long_now -= 1
            if state.fail_at == i:
                if state.fail_kind is not None:
                    raise EngineError(state.fail_kind, "secret internal detail", client_message="upstream said no")
                raise RuntimeError("secret internal detail")
            return StepResult(output=i, chunks=[TextDelta(str(i))], media_seconds=state.media)

        def batch_run(plans: Sequence[WorkPlan]) -> list[StepResult]:
            with self.lock:
                self.batch_sizes.append(len(plans))
            return [p.run() for p in plans]

        return WorkPlan(
            kind="count",
            shape=ShapeSignature("count", (state.shape,)),
            run=run,
            emits=("ticks",),
            batch_run=None if state.long else batch_run,
            long=state.long,
            due=0.1 * i if state.lookahead else None,
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


@pytest.fixture
def make_scheduler():
    made: list[Scheduler] = []

    def make(**kw: Any) -> tuple[Scheduler, CountPipeline]:
        pipeline = CountPipeline()
        sched = Scheduler({"count": pipeline}, **kw)
        sched.start()
        made.append(sched)
        return sched, pipeline

    yield make
    for s in made:
        s.stop()


def wait_idle(sched: Scheduler, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = sched.stats()
        if st.active == st.queued == st.running_steps == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"scheduler still busy: {sched.stats()}")


def test_chunks_arrive_in_order_then_end(make_scheduler):
    sched, _ = make_scheduler(workers=2)
    sink = WireSink()
    sched.submit("r1", CountRequest(steps=5), sink)
    assert sink.ended.wait(5)
    assert [int(c["delta"]) for c in sink.chunks[:-1]] == [0, 1, 2, 3, 4]
    assert sink.chunks[-1] == {"type": "end", "status": "ok", "segments": 5}
    wait_idle(sched)


def test_request_with_no_work_ends_at_once(make_scheduler):
    sched, _ = make_scheduler()
    sink = WireSink()
    sched.submit("r0", CountRequest(steps=0), sink)
    assert sink.ended.wait(2)
    assert sink.chunks == [{"type": "end", "status": "ok", "segments": 0}]


def test_equal_shapes_from_many_requests_are_batched(make_scheduler):
    sched, pipeline = make_scheduler(workers=1, max_batch=8)
    sinks = [WireSink() for _ in range(8)]
    blocker = WireSink()
    # Hold the only worker so the other requests' first steps are all ready together.
    sched.submit("slow", CountRequest(steps=1, delay=0.2), blocker)
    time.sleep(0.05)
    for i, sink in enumerate(sinks):
        sched.submit(f"r{i}", CountRequest(steps=3), sink)
    for sink in sinks:
        assert sink.ended.wait(5)
        assert [int(c["delta"]) for c in sink.chunks[:-1]] == [0, 1, 2]
    assert max(pipeline.loops[0].batch_sizes) == 8
    assert sched.stats().batches_total >= 3
    wait_idle(sched)


def test_a_pick_asks_a_loop_again_only_after_its_own_step(make_scheduler):
    # 24 requests on one worker: 72 picks over up to 24 waiting requests, yet each loop is asked for
    # its next step once after its start and once after each of its steps: a pick looks again only
    # at requests where something changed.
    sched, pipeline = make_scheduler(workers=1, max_batch=1)
    loop = pipeline.loops[0]
    sinks = [WireSink() for _ in range(24)]
    for i, sink in enumerate(sinks):
        sched.submit(f"r{i}", CountRequest(steps=3, delay=0.002, tag=f"r{i}"), sink)
    for sink in sinks:
        assert sink.ended.wait(5)
        assert [int(c["delta"]) for c in sink.chunks[:-1]] == [0, 1, 2]
    assert loop.next_calls == {f"r{i}": 4 for i in range(24)}
    assert sched.stats().steps_total == 72
    wait_idle(sched)


def test_max_batch_caps_batches(make_scheduler):
    sched, pipeline = make_scheduler(workers=1, max_batch=3)
    blocker = WireSink()
    sched.submit("slow", CountRequest(steps=1, delay=0.2), blocker)
    time.sleep(0.05)
    sinks = [WireSink() for _ in range(7)]
    for i, sink in enumerate(sinks):
        sched.submit(f"r{i}", CountRequest(steps=2), sink)
    for sink in sinks:
        assert sink.ended.wait(5)
    assert max(pipeline.loops[0].batch_sizes) == 3


def test_abort_stops_between_steps_and_frees_the_engine(make_scheduler):
    sched, pipeline = make_scheduler(workers=2)
    sink = WireSink()
    sched.submit("long", CountRequest(steps=1000, delay=0.01), sink)
    while len(sink.chunks) < 3:
        time.sleep(0.005)
    assert sched.abort("long") is True
    assert sink.ended.wait(1)
    assert sink.chunks[-1] == {"type": "end", "status": "cancelled"}
    wait_idle(sched, timeout=1.0)
    steps = sched.stats().steps_total
    time.sleep(0.1)
    assert sched.stats().steps_total == steps  # nothing keeps running for the cancelled request
    assert len(sink.chunks) < 20
    assert sched.abort("long") is False
    assert len(pipeline.loops[0].released) == 1  # its loops could free what they hold, once


def test_abort_of_a_queued_request(make_scheduler):
    sched, _ = make_scheduler(workers=1, max_active=1, max_queued=4)
    first, second = WireSink(), WireSink()
    sched.submit("a", CountRequest(steps=50, delay=0.01), first)
    sched.submit("b", CountRequest(steps=5), second)
    assert sched.stats().queued == 1
    assert sched.abort("b")
    assert second.chunks == [{"type": "end", "status": "cancelled"}]
    sched.abort("a")
    wait_idle(sched)


def test_admission_control_refuses_at_once_when_full(make_scheduler):
    sched, _ = make_scheduler(workers=1, max_active=1, max_queued=1)
    a, b = WireSink(), WireSink()
    sched.submit("a", CountRequest(steps=50, delay=0.01), a)
    sched.submit("b", CountRequest(steps=2), b)
    with pytest.raises(AdmissionError):
        sched.submit("c", CountRequest(steps=1), WireSink())
    # At once: refused while the engine was still full, not after waiting for room.
    assert not a.ended.is_set() and b.chunks == []
    # The queued request runs once the active one finishes.
    assert a.ended.wait(5) and b.ended.wait(5)
    assert b.chunks[-1]["status"] == "ok"
    wait_idle(sched)


def test_admitted_requests_the_measured_pace_cannot_start_in_time_are_ended_early(make_scheduler):
    """Load shedding admitted a burst on a quiet cost that the engine no longer meets (its steps
    became 20 times slower, as when the cores are taken by other work): once the pace of its first
    media shows which requests would start past the budget, those end as at capacity, long before
    the budget has passed, and the others are served."""
    sched, _ = make_scheduler(workers=1, max_batch=1, admit_budget=1.0)
    warm = WireSink()  # a stream far faster than real time: twenty fit the engine, even priced cold
    sched.submit("warm", CountRequest(steps=5, delay=0.001), warm)
    assert warm.ended.wait(5)
    log = OrderLog()
    names = [f"r{i}" for i in range(20)]
    for name in names:  # admitted: 20 quiet first costs fit the budget
        sched.submit(name, CountRequest(steps=1, delay=0.2), log.sink(name))
    for name in names:
        assert log.ended[name].wait(10)
    served = [name for name, _ in log.log]
    shed = [name for name in names if name not in served]
    assert len(served) >= 2 and len(shed) >= 10, (served, shed)
    assert all(log.ends[name]["kind"] == "capacity" for name in shed)
    # Ended while the fourth request was still to be served: at 0.2 s a request, that is within
    # 0.8 s of the burst, where waiting out the 1 s budget would have served five first.
    fourth = log.events.index(("tick", served[3])) if len(served) > 3 else len(log.events)
    assert all(log.events.index(("end", name)) < fourth for name in shed)
    wait_idle(sched)


def test_admitted_requests_are_not_ended_for_the_streams_room(make_scheduler):
    """Admission keeps room for the streams it lets in; an admitted request is ended only when
    its first media would come late. A cold burst's first throughput window (encoders opening,
    refusals on the same cores) measures a fraction of the engine's rate: judged by it, every
    request still waiting was ended, whose first media the measured pace put well in time."""
    sched, _ = make_scheduler(workers=2, max_batch=1, admit_budget=1.0)
    warm = WireSink()
    sched.submit("warm", CountRequest(steps=5, delay=0.001), warm)
    assert warm.ended.wait(5)
    log = OrderLog()
    names = [f"r{i}" for i in range(12)]
    for name in names:  # first media within 0.15 s of steps, at the pace of two per 20 ms
        sched.submit(name, CountRequest(steps=10, delay=0.02), log.sink(name))
    sched._throughput["count"] = 1.0  # what such a window measures: a second of media per second
    for name in names:
        assert log.ended[name].wait(10)
    assert all(log.ends[name]["status"] == "ok" for name in names), log.ends
    wait_idle(sched)


def test_a_saturated_stretch_is_measured_from_its_start(make_scheduler):
    """The engine's throughput is sampled over windows with every worker busy, each starting
    where the workers became busy: a 0.6 s burst after a quiet spell is measured (on a clock of
    fixed windows, one started in the quiet spell and the next outlasted the burst)."""
    sched, _ = make_scheduler(workers=2, max_batch=1, admit_budget=10.0)
    time.sleep(0.3)
    sinks = [WireSink(), WireSink()]
    for i, sink in enumerate(sinks):  # one request a worker: 30 steps of 20 ms, 0.1 s of media each
        sched.submit(f"s{i}", CountRequest(steps=30, delay=0.02), sink)
    assert all(sink.ended.wait(5) for sink in sinks)
    most = 2 * 0.1 / 0.02  # media seconds per second: two workers, 0.1 s of media per 20 ms step
    rate = sched.throughputs().get("count")
    assert rate is not None and 0.5 * most < rate <= 1.05 * most, rate
    wait_idle(sched)


def test_another_pipelines_saturated_stretch_is_not_a_streams_capacity():
    """A stretch of one pipeline's work (a video turn's perception, a burst of transcriptions:
    much work, little media) measures that pipeline's rate, not the speech streams': counted
    against them, it priced each stream at a large share of the engine and refused the next."""
    quiet = CountPipeline()
    quiet.name = "quiet"
    sched = Scheduler({"count": CountPipeline(), "quiet": quiet}, workers=2, max_batch=1, admit_budget=10.0)
    sched.start()
    try:
        sinks = [WireSink(), WireSink()]
        for i, sink in enumerate(sinks):  # 0.6 s of both workers, a hundredth of the media
            sched.submit(f"q{i}", CountRequest(pipeline="quiet", steps=30, delay=0.02, media=0.001), sink)
        assert all(sink.ended.wait(5) for sink in sinks)
        rates = sched.throughputs()
        assert "count" not in rates and rates.get("quiet", 0.0) < 0.2, rates
    finally:
        sched.stop()


def test_a_failing_step_ends_only_its_request(make_scheduler, caplog):
    sched, pipeline = make_scheduler(workers=1, max_batch=1)
    bad, good = WireSink(), WireSink()
    sched.submit("bad", CountRequest(steps=5, fail_at=2), bad)
    sched.submit("good", CountRequest(steps=5), good)
    assert bad.ended.wait(5) and good.ended.wait(5)
    assert bad.chunks[-1] == {
        "type": "end",
        "status": "error",
        "kind": "engine_failure",
        "message": "generation failed",
    }
    assert "secret internal detail" not in repr(bad.chunks)  # logged, never sent
    assert "secret internal detail" in caplog.text
    assert good.chunks[-1]["status"] == "ok"
    assert pipeline.loops[0].released == [2]  # the failed request is released; the good one finalized
    # The worker survived: a new request still runs.
    again = WireSink()
    sched.submit("again", CountRequest(steps=2), again)
    assert again.ended.wait(5) and again.chunks[-1]["status"] == "ok"


def test_invalid_requests_are_refused_before_admission(make_scheduler):
    sched, _ = make_scheduler()
    with pytest.raises(ValueError, match="unknown pipeline"):
        sched.submit("x", CountRequest(pipeline="nope"), WireSink())
    with pytest.raises(ValueError, match="steps must be"):
        sched.submit("y", CountRequest(steps=-1), WireSink())
    assert sched.stats().active == 0


def test_new_request_is_served_before_a_stream_that_is_ahead(make_scheduler):
    """Earliest deadline first: a stream with buffered media yields to a request with none yet."""
    sched, _ = make_scheduler(workers=1, max_batch=1)
    long, fresh = WireSink(), WireSink()
    sched.submit("long", CountRequest(steps=400, delay=0.002), long)
    while len(long.chunks) < 50:  # 5 s of media emitted in ~0.1 s: far ahead of its listener
        time.sleep(0.005)
    sched.submit("fresh", CountRequest(steps=1), fresh)
    assert fresh.ended.wait(1)
    assert not long.ended.is_set()
    sched.abort("long")


def test_a_loop_whose_next_raises_ends_only_its_request(make_scheduler):
    sched, _ = make_scheduler(workers=1)
    bad, good = WireSink(), WireSink()
    sched.submit("bad", CountRequest(steps=5, fail_at=-3), bad)
    sched.submit("good", CountRequest(steps=3), good)
    assert bad.ended.wait(5) and good.ended.wait(5)
    assert bad.chunks[-1]["status"] == "error" and [int(c["delta"]) for c in bad.chunks[:-1]] == [0, 1]
    assert good.chunks[-1]["status"] == "ok"
    wait_idle(sched)


def test_batching_window_gathers_plans_that_arrive_within_it(make_scheduler):
    sched, pipeline = make_scheduler(workers=1, max_batch=4, batch_wait=0.2)
    sinks = [WireSink() for _ in range(4)]
    for i, sink in enumerate(sinks):  # arrivals spread over ~60 ms, inside the 200 ms window
        sched.submit(f"r{i}", CountRequest(steps=1), sink)
        time.sleep(0.02)
    for sink in sinks:
        assert sink.ended.wait(5)
    assert pipeline.loops[0].batch_sizes[0] == 4


def test_without_a_window_a_lone_request_never_waits(make_scheduler):
    sched, pipeline = make_scheduler(workers=1, max_batch=16)
    sink = WireSink()
    sched.submit("solo", CountRequest(steps=3), sink)
    assert sink.ended.wait(5)
    assert pipeline.loops[0].batch_sizes == []  # ran alone, not through batch_run


def test_batch_sizes_are_reported(make_scheduler):
    seen: list[tuple[str, int]] = []
    sched, _ = make_scheduler(workers=1, max_batch=8, on_batch=lambda kind, n: seen.append((kind, n)))
    blocker = WireSink()
    sched.submit("slow", CountRequest(steps=1, delay=0.2), blocker)
    time.sleep(0.05)
    sinks = [WireSink() for _ in range(5)]
    for i, sink in enumerate(sinks):
        sched.submit(f"r{i}", CountRequest(steps=1), sink)
    for sink in sinks:
        assert sink.ended.wait(5)
    assert ("count", 1) in seen and ("count", 5) in seen


def test_paced_streams_stay_a_bounded_time_ahead_of_their_listener(make_scheduler):
    sched, _ = make_scheduler(workers=1, max_ahead=0.5)
    sink = WireSink()
    started = time.monotonic()
    sched.submit("paced", CountRequest(steps=12), sink)  # 1.2 s of media, 0.1 s a step
    assert sink.ended.wait(5)
    elapsed = time.monotonic() - started
    # Unpaced this takes milliseconds; paced, the last step waits until its media is 0.5 s ahead
    # (a lower bound: a slow machine only adds to it).
    assert elapsed > 0.5
    ticks = [c for c in sink.chunks if c["type"] == "text"]
    assert [int(t["delta"]) for t in ticks] == list(range(12))


def test_a_request_marked_unpaced_runs_as_fast_as_it_can(make_scheduler):
    """paced: False (a file made for one flush, which nobody hears while it is made)."""
    sched, _ = make_scheduler(workers=1, max_ahead=0.5)
    sink = WireSink()
    sched.submit("file", CountRequest(steps=600, paced=False), sink)  # 60 s of media
    assert sink.ended.wait(20), "paced, this would take about a minute"
    assert len([c for c in sink.chunks if c["type"] == "text"]) == 600


def test_pacing_does_not_delay_a_second_stream(make_scheduler):
    sched, _ = make_scheduler(workers=1, max_ahead=0.3)
    order = OrderLog()
    sched.submit("long", CountRequest(steps=40), order.sink("long"))  # paced for ~3.7 s
    while len(order.log) < 4:  # the long stream has run ahead and is now held back by pacing
        time.sleep(0.01)
    with order.lock:
        before = len(order.log)
    sched.submit("fresh", CountRequest(steps=2), order.sink("fresh"))
    assert order.ended["fresh"].wait(5)
    # The paced stream's waits hold no worker: the new stream's steps ran next, with at most the one
    # paced step that came due meanwhile in between, and long before the paced stream ended.
    after = order.log[before:]
    fresh_at = [i for i, (name, _) in enumerate(after) if name == "fresh"]
    assert len(fresh_at) == 2 and fresh_at[-1] <= 2, after
    assert not order.ended["long"].is_set()
    sched.abort("long")


class OrderLog:
    """One sink per request writing into a shared log, so the order of steps across requests is exact."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.events: list[tuple[str, str]] = []  # ("tick" or "end", request) in the order they came
        self.ends: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.ended: dict[str, threading.Event] = {}

    def sink(self, name: str) -> Any:
        self.ended[name] = threading.Event()

        def put(typed: Chunk) -> None:
            chunk = to_wire(typed)
            with self.lock:
                if chunk["type"] == "text":
                    self.log.append((name, int(chunk["delta"])))
                    self.events.append(("tick", name))
                elif chunk["type"] == "end":
                    self.events.append(("end", name))
                    self.ends[name] = chunk
                    self.ended[name].set()

        return put


@pytest.mark.parametrize("lookahead", [False, True])
@pytest.mark.parametrize("settle", [0.0, 0.15])
def test_a_request_pauses_a_settle_time_after_its_first_media(make_scheduler, settle, lookahead):
    """The first media's delivery (encoding, socket writes) has the CPUs to itself for a moment;
    then the request's next steps, look-ahead or not, run on their own, with nothing else to wake
    the workers."""
    sched, pipeline = make_scheduler(workers=2, first_media_settle=settle)
    sink = WireSink()
    sched.submit("r", CountRequest(steps=3, lookahead=lookahead), sink)
    assert sink.ended.wait(5)
    first, second, third = pipeline.loops[0].started
    assert second - first >= settle  # the pause (a lower bound: a slow machine only adds to it)
    if settle:
        assert third - second < second - first  # once: the next step does not pause again


def test_under_load_a_request_is_not_held_back_after_its_first_media(make_scheduler):
    """With other requests' work ready there is no idle CPU to give the delivery: the settle
    would only queue the request's next audio behind that work."""
    sched, _ = make_scheduler(workers=1, first_media_settle=0.5)
    order = OrderLog()
    sched.submit("a", CountRequest(steps=2, tag="a"), order.sink("a"))
    sched.submit("b", CountRequest(steps=20, delay=0.01, shape=2, tag="b"), order.sink("b"))
    assert order.ended["a"].wait(5) and order.ended["b"].wait(5)
    # Held back for the 0.5 s settle, a's second step would come after all of b's (0.2 s of steps).
    assert order.log.index(("a", 1)) < order.log.index(("b", 19)), order.log


def test_batch_priority_is_not_paced(make_scheduler):
    """A client writing a file declares priority "batch": its stream runs ahead of any listener."""
    sched, _ = make_scheduler(workers=1, max_ahead=0.3)
    order = OrderLog()
    sched.submit("listener", CountRequest(steps=12), order.sink("listener"))  # paced: ~0.9 s
    sched.submit("file", CountRequest(steps=12, priority=Priority.BATCH), order.sink("file"))
    assert order.ended["file"].wait(5)
    assert not order.ended["listener"].is_set(), "the batch request waited for pacing like the listener"
    assert order.ended["listener"].wait(5)
    assert [i for name, i in order.log if name == "file"] == list(range(12))


def test_batch_priority_yields_to_real_time_requests(make_scheduler):
    sched, _ = make_scheduler(workers=1, max_batch=1)
    order = OrderLog()
    # Slower than real time (0.12 s a step for 0.1 s of media): by deadline alone it would go first.
    sched.submit("file", CountRequest(steps=40, delay=0.12, priority=Priority.BATCH), order.sink("file"))
    while len(order.log) < 3:
        time.sleep(0.01)
    with order.lock:
        before = len(order.log)
        sched.submit("live", CountRequest(steps=3), order.sink("live"))
    assert order.ended["live"].wait(5)
    with order.lock:
        log = list(order.log)
    # At most the batch step already running when "live" arrived comes first, then all of live's.
    first_live = log.index(("live", 0))
    assert first_live <= before + 1, log[before : first_live + 1]
    assert [name for name, _ in log[first_live : first_live + 3]] == ["live"] * 3
    sched.abort("file")


def test_batch_priority_leaves_a_worker_free_for_real_time_arrivals(make_scheduler):
    sched, _ = make_scheduler(workers=2, max_batch=1)
    order = OrderLog()
    for name in ("file-a", "file-b"):
        sched.submit(name, CountRequest(steps=15, delay=0.02, priority=Priority.BATCH), order.sink(name))
    most = 0
    while not (order.ended["file-a"].is_set() and order.ended["file-b"].is_set()):
        most = max(most, sched.stats().running_steps)
        time.sleep(0.002)
    assert most == 1, "two batch steps ran at once: no worker was left for a real-time arrival"


def test_long_steps_leave_a_worker_to_a_playing_stream(make_scheduler):
    """Whisper-like steps (WorkPlan.long) never take every worker while a stream plays."""
    sched, pipeline = make_scheduler(workers=2, max_batch=1)
    loop = pipeline.loops[0]
    order = OrderLog()
    sched.submit("live", CountRequest(steps=40, delay=0.002), order.sink("live"))
    while not order.log:  # the stream has started playing
        time.sleep(0.002)
    for name in ("asr-a", "asr-b"):
        sched.submit(name, CountRequest(steps=3, delay=0.05, long=True), order.sink(name))
    assert order.ended["asr-a"].wait(5) and order.ended["asr-b"].wait(5)
    assert loop.long_most == 1, "two long steps held both workers while a stream was playing"
    sched.abort("live")


def test_long_steps_use_every_worker_when_nothing_plays(make_scheduler):
    sched, pipeline = make_scheduler(workers=2, max_batch=1)
    order = OrderLog()
    for name in ("asr-a", "asr-b"):
        sched.submit(name, CountRequest(steps=3, delay=0.05, long=True), order.sink(name))
    assert order.ended["asr-a"].wait(5) and order.ended["asr-b"].wait(5)
    assert pipeline.loops[0].long_most == 2


def test_a_fault_in_a_batched_step_ends_only_its_own_request(make_scheduler, caplog):
    """Eight requests step in lockstep in batches of eight; one step of one of them raises."""
    sched, pipeline = make_scheduler(workers=1, max_batch=8)
    blocker = WireSink()
    sched.submit("slow", CountRequest(steps=1, delay=0.2), blocker)
    time.sleep(0.05)  # the only worker is busy: the eight first steps are ready together
    sinks = [WireSink() for _ in range(8)]
    for i, sink in enumerate(sinks):
        request = CountRequest(steps=4, fail_at=1 if i == 3 else None)
        sched.submit(f"r{i}", request, sink)
    for sink in sinks:
        assert sink.ended.wait(5)
    assert pipeline.loops[0].batch_sizes[:2] == [8, 8]  # the failing step ran in a batch of eight
    bad = sinks[3]
    assert [int(c["delta"]) for c in bad.chunks[:-1]] == [0]
    assert bad.chunks[-1]["status"] == "error" and bad.chunks[-1]["kind"] == "engine_failure"
    for i, sink in enumerate(sinks):
        if i != 3:
            assert [int(c["delta"]) for c in sink.chunks[:-1]] == [0, 1, 2, 3]
            assert sink.chunks[-1] == {"type": "end", "status": "ok", "segments": 4}
    assert "running its plans alone" in caplog.text
    wait_idle(sched)


def test_a_step_chooses_the_kind_and_client_message_of_its_error(make_scheduler):
    sched, _ = make_scheduler(workers=1)
    sink = WireSink()
    sched.submit("up", CountRequest(steps=3, fail_at=1, fail_kind=ErrorKind.UPSTREAM), sink)
    assert sink.ended.wait(5)
    assert sink.chunks[-1] == {
        "type": "end",
        "status": "error",
        "kind": "upstream_failure",
        "message": "upstream said no",
    }


def test_a_stopped_engine_refuses_as_unreachable(make_scheduler):
    sched, _ = make_scheduler()
    sched.stop()
    with pytest.raises(AdmissionError) as refused:
        sched.submit("late", CountRequest(steps=1), WireSink())
    assert refused.value.kind is ErrorKind.UNREACHABLE


class Source:
    """Outside input a loop waits on (as the upstream thinker's HTTP stream): pushed from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[str] = []
        self.closed = False
        self.wake: Wake | None = None
        self.subscriptions = 0

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
            self.subscriptions += 1
            ready = bool(self.items) or self.closed
            if not ready:
                self.wake = wake
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
    loops = (IoLoop(),)

    def validate(self, request: EngineRequest) -> None:
        pass

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End(text=" ".join(finals[0]["got"]))


def test_loops_waiting_on_io_hold_no_worker_and_wake_when_input_arrives():
    io = IoPipeline()
    sched = Scheduler({"count": CountPipeline(), "io": io}, workers=2)
    sched.start()
    try:
        sources = [Source(), Source()]
        waiting = [WireSink(), WireSink()]
        for i, (source, sink) in enumerate(zip(sources, waiting, strict=True)):
            sched.submit(f"io{i}", IoRequest(source=source), sink)
        # Both workers stay free for other work while the two requests wait on silent sources.
        streams = [WireSink() for _ in range(4)]
        for i, sink in enumerate(streams):
            sched.submit(f"s{i}", CountRequest(steps=20, delay=0.005), sink)
        for sink in streams:
            assert sink.ended.wait(5) and sink.chunks[-1]["status"] == "ok"
        assert io.loops[0].steps == 0 and not any(w.ended.is_set() for w in waiting)
        assert sched.stats().active == 2 and sched.stats().running_steps == 0
        # Input wakes the waiting loop from another thread; an ended source finishes the request.
        threading.Thread(target=sources[0].push, args=("hello",)).start()
        deadline = time.monotonic() + 5
        while not waiting[0].chunks and time.monotonic() < deadline:
            time.sleep(0.005)
        assert waiting[0].chunks[0] == {"type": "text", "delta": "hello"}
        sources[0].push("world")
        sources[0].push(None)
        sources[1].push(None)
        for sink in waiting:
            assert sink.ended.wait(5)
        assert waiting[0].chunks[-1] == {"type": "end", "status": "ok", "text": "hello world"}
        assert waiting[1].chunks[-1] == {"type": "end", "status": "ok", "text": ""}
        assert io.loops[0].steps <= 3  # one step per arrival at most, never a poll
        wait_idle(sched)
    finally:
        sched.stop()


def test_an_aborted_request_waiting_on_io_ignores_a_late_wake_up():
    io = IoPipeline()
    sched = Scheduler({"io": io}, workers=1)
    sched.start()
    try:
        source, sink = Source(), WireSink()
        sched.submit("gone", IoRequest(source=source), sink)
        deadline = time.monotonic() + 2
        while source.subscriptions == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert sched.abort("gone")
        source.push("late")  # wakes nothing: the request has left the tables
        assert sink.chunks == [{"type": "end", "status": "cancelled"}]
        wait_idle(sched)
    finally:
        sched.stop()


def test_a_batch_never_carries_work_less_urgent_than_other_work_waiting(make_scheduler):
    """Batching is free on a GPU but not on a CPU: a batch takes only the equal-shape plans that
    are more urgent than the most urgent plan of another shape, so it cannot push that one back."""
    sched, pipeline = make_scheduler(workers=1, max_batch=8)
    blocker = WireSink()
    sched.submit("slow", CountRequest(steps=1, delay=0.2, tag="slow"), blocker)
    time.sleep(0.05)
    sinks = [WireSink() for _ in range(4)]
    for i, (shape, tag) in enumerate([(1, "a"), (1, "b"), (2, "c"), (1, "d")]):
        sched.submit(f"r{i}", CountRequest(steps=1, shape=shape, tag=tag), sinks[i])
    for sink in sinks:
        assert sink.ended.wait(5)
    loop = pipeline.loops[0]
    assert loop.ran == ["slow", "a", "b", "c", "d"]  # "d" did not ride along with "a" and "b"
    assert loop.batch_sizes == [2]


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


def test_a_loop_that_waits_for_what_it_has_fails_its_request_instead_of_spinning(caplog):
    sched = Scheduler({"eager": EagerPipeline(), "count": CountPipeline()}, workers=1)
    sched.start()
    try:
        bad, good = WireSink(), WireSink()
        sched.submit("bad", EagerRequest(), bad)
        sched.submit("good", CountRequest(steps=2), good)
        assert bad.ended.wait(5) and good.ended.wait(5)
        assert bad.chunks[-1]["status"] == "error" and bad.chunks[-1]["kind"] == "engine_failure"
        assert good.chunks[-1]["status"] == "ok"
        assert "woke at once" in caplog.text
    finally:
        sched.stop()


def test_the_first_media_behind_filling_streams_are_summed_in_closed_form():
    """The door asks for each arrival of a burst, so the sum over the requests ahead is computed in
    closed form; it stays within 0.1% of the sum it stands for, and says "no room" past it."""
    from omniweb.engine.scheduler import MAX_ESTIMATE, _filling

    def summed(count: int, load: float, share: float) -> float:
        return sum(1 / (1 - load - k * share) for k in range(count))

    for count, load, share in [(1, 0.0, 0.01), (58, 0.0, 1 / 78), (40, 0.3, 0.01), (10, 0.5, 0.0), (300, 0.0, 0.001)]:
        assert _filling(count, load, share) == pytest.approx(summed(count, load, share), rel=1e-3)
    assert _filling(80, 0.0, 1 / 78) == MAX_ESTIMATE  # 80 streams where 78 fill the engine
