"""The scheduler: owns the device workers and steps every active request's loops.

Worker threads share one lock-protected table of jobs. Each worker picks the most urgent ready work
plan (earliest playback deadline first), gathers other ready plans with the same shape signature
into a batch when the model can run them together, runs the batch outside the lock, then advances
the loops and hands the emitted chunks to each request's sink. The asyncio event loop never runs
device work: sinks only schedule a thread-safe put onto the session's queue.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omniweb.base.errors import (
    CAPACITY_MESSAGE,
    STARTING_MESSAGE,
    EngineError,
    ErrorKind,
    kind_of,
    unavailable_message,
)

from .contracts import DONE, WAITING, Loop, Pipeline, StepResult, WaitFor, WorkPlan
from .messages import CANCELLED, Chunk, End
from .requests import EngineRequest

logger = logging.getLogger(__name__)

Sink = Callable[[Chunk], None]
STREAM_GUARD = 0.1  # seconds: a playing stream this close to running dry outranks any new request
# A request of ``Priority.BATCH`` (a client writing a file, not listening) is never paced, only
# gets a worker when no real-time work is ready, never takes the last free worker (with two or
# more), and waits while a real-time request is still before its first audio, so a real-time
# arrival neither waits for a batch step nor shares the machine with new ones.
MAX_INSTANT_WAKES = 8  # a WaitFor woken at once this many times in a row without a plan is a loop bug
COST_SMOOTHING = 0.2  # weight of the newest sample in a pipeline's measured costs (an EWMA)
SLOWDOWN_MIN_WAIT = 0.25  # seconds: shorter estimated waits (an idle engine) say nothing of contention
SLOWDOWN_MAX = 4.0
PACE_CHECK_SECONDS = 0.05  # how often admitted requests are re-checked against the measured pace
RESERVATION_SECONDS = 30.0  # a front-door admission not submitted by then is dropped from the estimates
# An admitted request is ended as at capacity only once its first media is estimated (or has
# waited) past this many times its budget: the estimate that admitted it is an estimate, and ending
# it for a small miss turns a first audio a little late into a refusal that came late too.
SHED_TOLERANCE = 1.25
# Load shedding keeps the real-time streams it admits within this share of the engine's measured
# throughput: the rest starts new requests, so a session that begins while a burst is being served
# still has its first audio at the quiet pace instead of after the streams that fill the engine.
STREAM_CEILING = 0.75
THROUGHPUT_WINDOW = 0.5  # seconds of saturated workers over which the engine's media rate is sampled
IDLE_TOLERANCE = 0.02  # a window counts as saturated when its workers idled at most this share of it
STREAM_WORK_SHARE = 0.5  # a pipeline's rate is learned from windows where its steps took this share of the workers
MAX_ESTIMATE = 3600.0  # seconds: what an estimate reports for "no room" (the engine cannot keep up)
MAX_RETRY_AFTER = 10.0  # seconds: a refusal's hint at most (the streams filling the engine end by then)


class AdmissionError(RuntimeError):
    """The engine's queue is full (or the engine is stopped); the request was not accepted."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.CAPACITY, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after  # seconds after which a retry may be admitted (load shedding)


@dataclass(frozen=True)
class _Reservation:
    pipeline: str
    tenant: str | None
    at: float


class _Reservations:
    """Front-door admissions not submitted yet, with the counts the estimates read kept current:
    a burst reserves hundreds, and each of its estimates must not walk them all (at 300 that was
    most of the time the burst's refusals waited)."""

    def __init__(self) -> None:
        self._items: dict[int, _Reservation] = {}  # in the order made (oldest first)
        self._by_pipeline: dict[str, int] = {}
        self._by_tenant: dict[str | None, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, pipeline: str, tenant: str | None, at: float) -> int:
        self._next += 1
        self._items[self._next] = _Reservation(pipeline, tenant, at)
        self._by_pipeline[pipeline] = self._by_pipeline.get(pipeline, 0) + 1
        self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + 1
        return self._next

    def pop(self, key: int | None) -> bool:
        """Drop one (submitted or released); whether it was still held."""
        r = self._items.pop(key, None) if key is not None else None
        if r is None:
            return False
        self._drop(self._by_pipeline, r.pipeline)
        self._drop(self._by_tenant, r.tenant)
        return True

    @staticmethod
    def _drop(table: dict[Any, int], name: Any) -> None:
        table[name] -= 1
        if not table[name]:
            del table[name]

    def expire(self, before: float) -> None:
        """Drop those made before ``before``: neither submitted nor released in time, a leak."""
        while self._items:
            key, oldest = next(iter(self._items.items()))
            if oldest.at >= before:
                return
            self.pop(key)

    def of_tenant(self, tenant: str | None) -> int:
        return self._by_tenant.get(tenant, 0)

    def first_cost(self, costs: dict[str, float]) -> float:
        """The first-media work of all of them, at each pipeline's measured cost."""
        return sum(costs.get(name, 0.0) * n for name, n in self._by_pipeline.items())


@dataclass(eq=False)
class _Entry:
    loop: Loop[Any]
    state: Any
    plan: WorkPlan | None = None
    waiting: bool = False  # on an upstream loop of the same request: re-polled after its steps
    io_wait: bool = False  # on outside I/O (``WaitFor``): re-polled only when woken
    busy: bool = False
    done: bool = False


@dataclass(frozen=True)
class _Window:
    """Where a throughput window started: when, and the totals then (idle worker seconds, and per
    pipeline its media seconds and its steps' worker seconds)."""

    start: float
    idle: float
    media: dict[str, float]
    work: dict[str, float]


@dataclass(eq=False)
class _Job:
    request_id: str
    request: EngineRequest
    pipeline: Pipeline
    sink: Sink
    submitted_at: float = field(default_factory=time.monotonic)
    entries: list[_Entry] = field(default_factory=list)
    first_media_at: float | None = None
    media_seconds: float = 0.0
    finished: bool = False
    batch: bool = field(init=False)  # batch priority: fixed at submit, read on every pick
    tenant: str | None = field(init=False)  # who asked (an API token, a client address): fair ordering
    # Fair share: a tenant's n-th request still before its first media aims that much later (the
    # measured first-media cost over the workers, times n), so one client's burst cannot hold a
    # later client's first audio behind all of it.
    fair_delay: float = 0.0
    work_seconds: float = 0.0  # worker time its steps took (a batched step's time shared out)
    first_work: float | None = None  # work_seconds at its first media
    first_media_seconds: float = 0.0  # media its first media step carried
    unscaled_wait: float | None = None  # load shedding's estimate at admission before the slowdown
    admit_budget: float = 0.0  # seconds its first media may take before it is refused (set at submit)
    turn: bool = False  # a conversation's turn, with a budget of its own (set at submit)
    # Its loops may have a new step to offer (activated, a step of it ended, a waiting loop woken):
    # a pick asks only such requests' loops, not every active request's every time.
    stale: bool = True

    def __post_init__(self) -> None:
        self.batch = self.request.batch
        self.tenant = self.request.tenant or None

    def first_deadline(self, first_media_budget: float) -> float:
        """Where its first media is aimed (before the stream guard): the order new requests start in."""
        return self.submitted_at + first_media_budget + self.fair_delay

    def deadline(self, plan: WorkPlan, first_media_budget: float, now: float) -> float:
        """Wall-clock time by which ``plan`` must have run for the listener to hear no gap.

        Until its first media a request aims at ``submitted_at + first_media_budget`` but never
        ahead of a playing stream that would run dry within ``STREAM_GUARD``: a burst of arrivals
        may wait for its first audio, a stream that has started must not stutter. After its first
        media a request's timeline is anchored at that moment. Earliest deadline first then keeps
        every stream fed and runs look-ahead work (the talker's next sentence) when it is needed.
        """
        due = self.media_seconds if plan.due is None else plan.due
        if self.first_media_at is None:
            return max(self.first_deadline(first_media_budget), now + STREAM_GUARD) + due
        return self.first_media_at + due

    def ready_at(self, plan: WorkPlan, settle: float) -> float | None:
        """When ``plan`` may run (None: not before the request's first media).

        Look-ahead work (due later) waits for the request's first media so it cannot slow that
        down. Then, while nothing else is ready, every step of the request waits ``settle``
        seconds more, leaving the CPUs to that media's delivery, which runs after the step that
        made it (an HTTP body's encoder, socket writes, a client on this machine): a step of the
        same request running meanwhile (the next vocoder chunk, the next sentence) delayed it by
        1-2 ms. The next audio is due tens of milliseconds later.
        """
        if self.first_media_at is None:
            return None if plan.due else 0.0
        return self.first_media_at + settle

    def release(self, plan: WorkPlan, max_ahead: float) -> float | None:
        """When an emitting step may run if the stream is paced ``max_ahead`` seconds ahead of its listener."""
        if max_ahead <= 0 or not plan.emits or self.first_media_at is None or self.batch:
            return None
        if not self.request.paced:  # nobody listens while it is made (e.g. one file per flush)
            return None
        return self.first_media_at + self.media_seconds - max_ahead

    def busy(self) -> bool:
        return any(e.busy for e in self.entries)


@dataclass
class SchedulerStats:
    active: int
    queued: int
    running_steps: int
    steps_total: int
    batches_total: int
    batched_steps_total: int
    pipelines: dict[str, str] = field(default_factory=dict)  # name -> "loading" | "ready" | "failed"


class Scheduler:
    """Runs driven loops on ``workers`` threads with admission control and cancellation."""

    def __init__(
        self,
        pipelines: dict[str, Pipeline],
        *,
        workers: int = 2,
        max_active: int = 128,
        max_queued: int = 256,
        max_batch: int = 16,
        batch_wait: float = 0.0,
        first_media_budget: float = 0.15,
        max_ahead: float = 0.0,
        first_media_settle: float = 0.0,
        admit_budget: float = 0.0,
        on_batch: Callable[[str, int], None] | None = None,
    ) -> None:
        self._pipelines = dict(pipelines)
        self._loading: set[str] = set()  # announced, models still loading: requests hear "starting"
        self._failed: dict[str, str] = {}  # name -> why its models failed to load
        # Load shedding: a request whose first media is estimated to come later than this (seconds)
        # is refused at once (0: admit by the counts alone).
        self._admit_budget = max(0.0, admit_budget)
        self._first_cost: dict[str, float] = {}  # per pipeline: worker seconds until a request's first media
        self._media_cost: dict[str, float] = {}  # per pipeline: worker seconds per media second after it
        self._media_len: dict[str, float] = {}  # per pipeline: media seconds a finished request made
        # Per pipeline: worker seconds per media second of a whole request, first media included:
        # what a stream costs whatever its shape (after the first media alone, a one-sentence
        # request has only vocoder work left, and priced a two-sentence stream at a third).
        self._stream_cost: dict[str, float] = {}
        # Per pipeline: the CPU seconds per media second a finished stream's delivery spent on these
        # cores (``EngineRequest.delivery``: its encoder), the average the throughput was measured on.
        self._delivery: dict[str, float] = {}
        # Per pipeline: the media seconds the engine delivers per second while every worker is busy
        # with it (an EWMA over THROUGHPUT_WINDOW samples): its real capacity, with everything else
        # the process does on the same cores. Absent until measured.
        self._throughput: dict[str, float] = {}
        self._media_by: dict[str, float] = {}  # per pipeline: media seconds delivered, in all
        self._work_by: dict[str, float] = {}  # per pipeline: worker seconds its steps took, in all
        self._idle_total = 0.0  # worker seconds spent waiting for work
        self._idle_from: dict[int, float] = {}  # thread id -> since when that worker waits
        self._window = _Window(time.monotonic(), 0.0, {}, {})
        # How much longer first media took than estimated, under load (an EWMA of the ratio): the
        # workers share the cores with the event loop, encoders and each other, so W workers do
        # less than W times one worker's work. Estimates are scaled by it.
        self._slowdown = 1.0
        # Per pipeline: wall-clock seconds between consecutive first media while every worker had a
        # request waiting for its first media (an EWMA): the pace at which a saturated engine
        # starts requests, with all else the process does meanwhile (HTTP, encoders, the loop).
        # Under a burst it is several times the quiet per-request cost over the workers.
        self._first_gap: dict[str, float] = {}
        self._saturated_firsts: dict[str, deque[float]] = {}  # pipeline -> last first media while saturated
        self._next_pace_check = 0.0
        self._reservations = _Reservations()  # admitted at the front door, not submitted yet
        self._n_workers = max(1, workers)
        self._max_active = max(1, max_active)
        self._max_queued = max(0, max_queued)
        self._max_batch = max(1, max_batch)
        self._batch_wait = max(0.0, batch_wait)
        self._on_batch = on_batch
        self._budget = max(0.0, first_media_budget)
        self._max_ahead = max(0.0, max_ahead)
        self._settle = max(0.0, first_media_settle)
        # The earliest time a waiting step may run (a paced step's release, the first media's settle):
        # wakes idle workers.
        self._next_release: float | None = None
        self._cond = threading.Condition()
        self._active: dict[str, _Job] = {}
        self._queued: deque[_Job] = deque()
        self._threads: list[threading.Thread] = []
        self._running = False
        self._running_steps = 0
        self._batch_workers = 0  # workers running a batch-priority step now
        self._long_workers = 0  # workers running a long step (WorkPlan.long) now
        self._steps_total = 0
        self._batches_total = 0
        self._batched_steps_total = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        with self._cond:
            if self._running:
                return
            self._running = True
            self._threads = [
                threading.Thread(target=self._work, name=f"engine-worker-{i}", daemon=True)
                for i in range(self._n_workers)
            ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        with self._cond:
            self._running = False
            jobs = [*self._active.values(), *self._queued]
            self._active.clear()
            self._queued.clear()
            self._cond.notify_all()
        for job in jobs:
            self._release(job)
            self._emit(job, End.failed(ErrorKind.ENGINE, "engine stopped"))
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []

    # -- pipelines ------------------------------------------------------------------------------
    def pipeline_loading(self, name: str) -> None:
        """``name``'s models are loading: its requests are refused as ``starting`` until it is added."""
        with self._cond:
            self._loading.add(name)

    def add_pipeline(self, name: str, pipeline: Pipeline) -> None:
        with self._cond:
            self._pipelines[name] = pipeline
            self._loading.discard(name)
            self._failed.pop(name, None)
            self._cond.notify_all()

    def pipeline_failed(self, name: str, reason: str) -> None:
        """``name`` could not load: its requests are refused as ``unavailable``; the others serve."""
        with self._cond:
            self._loading.discard(name)
            self._failed[name] = reason
            self._cond.notify_all()

    def pipeline_state(self, name: str) -> str | None:
        """ "ready", "loading", "failed", or None for a name never announced."""
        with self._cond:
            return self._state_of(name)

    def _state_of(self, name: str) -> str | None:
        if name in self._pipelines:
            return "ready"
        if name in self._loading:
            return "loading"
        return "failed" if name in self._failed else None

    # -- requests -------------------------------------------------------------------------------
    def submit(self, request_id: str, request: EngineRequest, sink: Sink, reservation: int | None = None) -> None:
        """Admit a request or raise ``AdmissionError`` (full, starting, unavailable) / ``ValueError``.

        ``reservation`` (from ``reserve``): the front door already admitted it; it is not shed again.
        """
        if not isinstance(request, EngineRequest):
            raise ValueError(f"not an engine request: {type(request).__name__}")
        name = request.pipeline
        with self._cond:
            pipeline = self._pipelines.get(name)
            state = None if pipeline is not None else self._state_of(name)
        if state == "loading":
            raise AdmissionError(STARTING_MESSAGE, ErrorKind.STARTING)
        if state == "failed":
            raise AdmissionError(unavailable_message(name), ErrorKind.UNAVAILABLE)
        if pipeline is None:
            raise ValueError(f"unknown pipeline {name!r}")
        pipeline.validate(request)
        job = _Job(request_id=request_id, request=request, pipeline=pipeline, sink=sink)
        own = request.own_admit_budget if self._admit_budget > 0 else None
        job.turn = own is not None
        job.admit_budget = self._admit_budget if own is None else own
        with self._cond:
            if not self._running:
                raise AdmissionError("engine is not running", ErrorKind.UNREACHABLE)
            if request_id in self._active or any(j.request_id == request_id for j in self._queued):
                raise ValueError(f"duplicate request id {request_id!r}")
            self._admit(job, reserved=self._reservations.pop(reservation))
            if len(self._active) < self._max_active:
                self._activate(job)
            elif len(self._queued) < self._max_queued:
                self._queued.append(job)
            else:
                raise AdmissionError("engine queue is full")
            self._cond.notify_all()

    def abort(self, request_id: str) -> bool:
        """Cancel between steps: the job leaves the tables now; a step in flight is discarded."""
        with self._cond:
            job = self._active.pop(request_id, None)
            if job is None:
                for queued in self._queued:
                    if queued.request_id == request_id:
                        job = queued
                        self._queued.remove(queued)
                        break
            if job is None:
                return False
            job.finished = True
            self._promote()
            self._cond.notify_all()
        self._release(job)
        self._emit(job, CANCELLED)
        return True

    def stats(self) -> SchedulerStats:
        with self._cond:
            states = {name: "ready" for name in self._pipelines}
            states.update({name: "loading" for name in self._loading})
            states.update({name: "failed" for name in self._failed})
            return SchedulerStats(
                active=len(self._active),
                queued=len(self._queued),
                running_steps=self._running_steps,
                steps_total=self._steps_total,
                batches_total=self._batches_total,
                batched_steps_total=self._batched_steps_total,
                pipelines=states,
            )

    @property
    def slowdown(self) -> float:
        """Measured first-media wait over the estimate under load (1: estimates hold)."""
        return self._slowdown

    def estimated_waits(self) -> dict[str, float]:
        """Per ready pipeline: the estimated seconds until a new request's first media (no tenant)."""
        with self._cond:
            now = time.monotonic()
            return {
                name: round(self._estimate(name, now + self._budget, delivery=self._delivery.get(name, 0.0)), 3)
                for name in self._pipelines
                if name in self._first_cost
            }

    def throughputs(self) -> dict[str, float]:
        """Per pipeline measured: the media seconds it delivers per second with every worker busy."""
        with self._cond:
            return {name: round(rate, 2) for name, rate in self._throughput.items()}

    def start_paces(self) -> dict[str, float]:
        """Per ready pipeline: the seconds between first media the estimates assume on a saturated
        engine (measured, or one request's work over the workers)."""
        with self._cond:
            return {name: round(self._pace(name), 4) for name in self._pipelines if name in self._first_cost}

    # -- admission (called with the lock held) ----------------------------------------------------
    def _admit(self, job: _Job, reserved: bool = False) -> None:
        """Place a real-time request in its tenant's fair order, and refuse it when its first media
        is estimated to come later than the admission budget (the engine cannot start it in time).
        """
        if job.batch:
            return
        # A conversation's turn is judged by the engine's work alone: its tenant's other sessions
        # (one voice-agent backend's users share a token) still order it, but the fair delay they
        # add made the estimate 2x what such turns took (16 at once: 7.7-8.2 s estimated, the
        # admitted ones' first audio within 4.1 s).
        job.fair_delay, wait = self._verdict(
            job.pipeline, job.tenant, job.submitted_at, turn=job.turn, delivery=job.request.delivery
        )
        if wait is None:
            return
        if not reserved and wait > job.admit_budget and self._sheds(job.pipeline):
            retry = _retry_after(wait - job.admit_budget)
            raise AdmissionError(CAPACITY_MESSAGE, ErrorKind.CAPACITY, retry_after=retry)
        job.unscaled_wait = wait / self._slowdown

    def _sheds(self, pipeline: Pipeline) -> bool:
        return self._admit_budget > 0 and getattr(pipeline, "shed", True)

    def reserve(self, name: str, tenant: str | None, delivery: float = 0.0) -> int | None:
        """Admit a real-time ``name`` request at the front door, before it is even parsed: its
        place counts in every estimate until it is submitted (``submit(reservation=)``) or
        ``release``d, so a burst that arrives faster than it is submitted cannot all pass the door.
        ``delivery``: what its delivery is expected to cost (``EngineRequest.delivery``).
        Raises ``AdmissionError`` when load shedding would refuse it; None when nothing is estimated.
        """
        with self._cond:
            pipeline = self._pipelines.get(name)
            if pipeline is None or not self._running or not self._sheds(pipeline):
                return None
            now = time.monotonic()
            wait = self._verdict(pipeline, tenant, now, delivery=delivery)[1]
            if wait is None:
                return None
            if wait > self._admit_budget:
                retry = _retry_after(wait - self._admit_budget)
                raise AdmissionError(CAPACITY_MESSAGE, ErrorKind.CAPACITY, retry_after=retry)
            return self._reservations.add(name, tenant, now)

    def release(self, reservation: int | None) -> None:
        """Give back a reservation whose request was never submitted (refused by the view, gone)."""
        if reservation is not None:
            with self._cond:
                self._reservations.pop(reservation)

    def _verdict(
        self, pipeline: Pipeline, tenant: str | None, submitted_at: float, turn: bool = False, delivery: float = 0.0
    ) -> tuple[float, float | None]:
        """A new request's fair delay, and its estimated wait for its first media (None: a
        pipeline with no measured cost yet, admitted by the counts). A conversation's ``turn`` is
        judged without its fair delay, by its own estimate (``_estimate``)."""
        name = pipeline.name
        cost = self._first_cost.get(name)
        if cost is None:
            return 0.0, None
        fair_delay = 0.0
        if tenant is not None:
            ahead = sum(
                1
                for j in (*self._active.values(), *self._queued)
                if j.tenant == tenant and not j.batch and j.first_media_at is None
            )
            ahead += self._reservations.of_tenant(tenant)
            fair_delay = ahead * self._pace(name)
        aimed = submitted_at + self._budget + (0.0 if turn else fair_delay)
        return fair_delay, self._estimate(name, aimed, cost, turn=turn, delivery=delivery)

    def _estimate(
        self, name: str, deadline: float, own: float | None = None, turn: bool = False, delivery: float = 0.0
    ) -> float:
        """Seconds until the first media of a ``name`` request aimed at ``deadline``.

        Before it: the first media of every request aimed earlier, each at its measured work over
        the workers, slowed by the engine's contention (``_contention``) and run in what the
        streams leave: the playing streams' share of the engine (for the part of the horizon they
        need feeding) and, once each request ahead has its first media, its own stream. The k-th
        first media thus takes ``work / (1 − load − k·share)``: a burst fills the engine with its
        own streams, and the last requests of it start much slower than the first (60 requests
        take ~1.4 s where their first-media work alone is ~0.8 s). Past ``STREAM_CEILING`` of the
        engine there is no room for another stream until one ends.

        A conversation's ``turn`` keeps the estimate turns were judged by: the first media ahead
        over the workers (or at the measured pace) plus the playing streams' media due before
        its deadline. Its answers are short and the talker runs ahead, so its streams do not hold
        a share of the engine for the whole wait (estimated so, 16 spoken questions at once were
        refused 12 times where the engine had answered them all within 3.3 s).
        """
        now = time.monotonic()
        horizon = self._admit_budget or self._budget  # at most this much of a stream counts
        self._reservations.expire(now - RESERVATION_SECONDS)
        pending = len(self._reservations)  # requests before it still waiting for their first media
        first = self._reservations.first_cost(self._first_cost)
        load = 0.0  # the engine's share the playing streams take until the deadline
        streams = 0.0  # the playing streams' media work due before the deadline (a turn's estimate)
        shares: dict[tuple[str, float], float] = {}  # the door asks this per arrival of a burst
        for j in (*self._active.values(), *self._queued):
            if j.finished or j.batch:
                continue
            if j.first_media_at is None:
                if j.first_deadline(self._budget) <= deadline:
                    pending += 1
                    first += max(0.0, self._first_cost.get(j.pipeline.name, 0.0) - j.work_seconds)
            else:
                due = deadline - (j.first_media_at + j.media_seconds)
                key = (j.pipeline.name, j.request.delivery)
                if (share := shares.get(key)) is None:
                    share = shares[key] = self._stream_share(*key)
                load += share * min(horizon, max(0.0, due)) / horizon
                streams += self._media_cost.get(j.pipeline.name, 0.0) * min(horizon, max(0.0, due))
        own_cost = self._first_cost.get(name, 0.0) if own is None else own
        if turn:
            ahead = max(first / self._n_workers, pending * self._first_gap.get(name, 0.0))
            return min(MAX_ESTIMATE, self._slowdown * (ahead + streams / self._n_workers + own_cost))
        wait = self._start_in(name, pending + 1, load, first + own_cost, delivery)
        # The first media ahead at the saturated engine's measured pace, when that is slower.
        paced = pending * self._first_gap.get(name, 0.0) + own_cost
        return min(MAX_ESTIMATE, self._slowdown * max(wait, paced))

    def _start_in(self, name: str, count: int, load: float, work: float, delivery: float) -> float:
        """Seconds until the last of ``count`` first media of ``name`` (``work`` worker seconds of
        first-media work in all), while the playing streams take ``load`` of the engine and each
        one started adds its own stream (each priced with this one's ``delivery``). When they would
        take more than ``STREAM_CEILING`` of it, past the budget by a stream's length: no room
        until one ends."""
        share = self._stream_share(name, delivery)
        wait = self._contention(name) * work / count / self._n_workers * _filling(count, load, share)
        if load + count * share > STREAM_CEILING:
            wait = max(wait, (self._admit_budget or self._budget) + max(1.0, self._media_len.get(name, 0.0)))
        return wait

    def _contention(self, name: str) -> float:
        """How many times slower than its measured costs (steps and delivery) the engine works for
        ``name`` on these cores: its workers share them with each other, the requests' HTTP
        handling and the event loop. Measured from the throughput of a saturated engine; until
        then the workers are taken not to add up."""
        cost = self._stream_cost.get(name)
        rate = self._throughput.get(name)
        if rate and cost:
            return max(1.0, self._n_workers / ((cost + self._delivery.get(name, 0.0)) * rate))
        return float(self._n_workers)

    def _stream_share(self, name: str, delivery: float) -> float:
        """The share of the engine a real-time ``name`` stream takes (fed as fast as it plays): its
        steps' work and its ``delivery``'s, per second of media, on these cores. Priced so, a
        cold burst of 300 mp3 streams is let in about as many as the measured engine admits
        (its steps alone said 76, where the measured engine let in ~50)."""
        work = self._stream_cost.get(name, 0.0) + delivery
        return self._contention(name) * work / self._n_workers

    def _pace(self, name: str) -> float:
        """Seconds between first media of ``name`` requests on a saturated engine: measured, or
        (never saturated yet) one request's first-media work over the workers."""
        return max(self._first_cost.get(name, 0.0) / self._n_workers, self._first_gap.get(name, 0.0))

    def _expire(self, now: float) -> None:
        """End, as at capacity, every admitted real-time request with no step run yet whose first
        media can no longer come within the admission budget: it has waited past the budget, or
        (checked every ``PACE_CHECK_SECONDS``) its place among the requests waiting for their first
        media, at the engine's measured pace, puts it past the budget. The estimate that admitted
        it was wrong (a cold burst, the cores busier than measured); ending it now answers its
        client in a fraction of the budget. It learns from them, so the next estimates are closer."""
        waiting = [
            j
            for j in (*self._active.values(), *self._queued)
            if not j.finished and not j.batch and j.first_media_at is None
        ]
        late = [j for j in waiting if self._sheddable(j) and now - j.submitted_at > j.admit_budget * SHED_TOLERANCE]
        if now >= self._next_pace_check:
            self._next_pace_check = now + PACE_CHECK_SECONDS
            self._sample_throughput(now)
            late += self._behind_pace(waiting, now, set(late))
        for job in late:
            ratio = (now - job.submitted_at) / max(job.unscaled_wait or 0.0, SLOWDOWN_MIN_WAIT)
            self._learn_slowdown(ratio)
            if job in self._queued:
                self._queued.remove(job)
            job.finished = True
            self._active.pop(job.request_id, None)
            self._release(job)
            self._emit(job, End.failed(ErrorKind.CAPACITY, CAPACITY_MESSAGE, retry_after=1.0))
        if late:
            self._promote()

    def _sample_throughput(self, now: float) -> None:
        """Close a throughput window: when no worker idled in it, each pipeline whose steps took
        most of it learns its media rate, as if they had taken all of it. A stretch of another
        pipeline's work (a burst of transcriptions, a video turn's perception) says nothing of
        what a speech stream costs: counted against speech, much work and little media would
        price each stream at a large share of the engine."""
        window = self._window
        span = now - window.start
        if span < THROUGHPUT_WINDOW:
            return
        if not self._window_idled(now):
            for name, total in self._work_by.items():
                work = total - window.work.get(name, 0.0)
                media = self._media_by.get(name, 0.0) - window.media.get(name, 0.0)
                if media > 0 and work >= STREAM_WORK_SHARE * span * self._n_workers:
                    self._learn(self._throughput, name, media * self._n_workers / work)
        self._window = self._fresh_window(now)

    def _restart_window(self, now: float) -> None:
        """Start the throughput window afresh when the current one has idled: a saturated stretch
        is measured from its start (windows on a fixed clock straddled its edges, and the warm-up
        bursts of ``bench/overload.py``, ~1 s each, often measured none)."""
        if self._window_idled(now):
            self._window = self._fresh_window(now)

    def _fresh_window(self, now: float) -> _Window:
        return _Window(now, self._idle_seconds(now), dict(self._media_by), dict(self._work_by))

    def _window_idled(self, now: float) -> bool:
        window = self._window
        return self._idle_seconds(now) - window.idle > IDLE_TOLERANCE * (now - window.start) * self._n_workers

    def _idle_seconds(self, now: float) -> float:
        return self._idle_total + sum(now - t for t in self._idle_from.values())

    @staticmethod
    def _sheddable(job: _Job) -> bool:
        return job.unscaled_wait is not None and job.work_seconds == 0.0 and not job.busy()

    def _behind_pace(self, waiting: list[_Job], now: float, late: set[_Job]) -> list[_Job]:
        """The waiting requests that would start after their budget at the saturated engine's
        measured pace: in the order they start in (first deadline), the k-th of a pipeline k
        first media from now.

        Judged by the pace alone, not by the door's model: the playing streams yield to a first
        media until they run within ``STREAM_GUARD`` of dry, so the streams' share the door keeps
        room for does not hold these back. Judged by the model, a cold burst's first half second
        of throughput (its encoders opening, its refusals on the same cores: 26 audio seconds per
        second where 60 followed) ended every waiting request, whose first bytes the pace put
        within 1 s."""
        gaps = self._first_gap
        behind: list[_Job] = []
        place: dict[str, int] = {}
        for job in sorted(waiting, key=lambda j: j.first_deadline(self._budget)):
            if job in late:
                continue
            name = job.pipeline.name
            k = place[name] = place.get(name, 0) + 1
            if name not in gaps or not self._sheddable(job) or not self._sheds(job.pipeline):
                continue
            if job.turn:
                # A conversation's turn: the pace, measured on bursts of new requests, overshot it
                # (turns that waited 1-2 s were predicted past a 6 s budget, and the rest of them
                # had their first audio within 4.9 s); it is refused when it waited past its budget.
                continue
            if now + k * gaps[name] - job.submitted_at > job.admit_budget * SHED_TOLERANCE:
                behind.append(job)
                place[name] -= 1  # it leaves the line: the ones after it move up
        return behind

    def _learn(self, table: dict[str, float], name: str, sample: float, weight: float = COST_SMOOTHING) -> None:
        old = table.get(name)
        table[name] = sample if old is None else old + weight * (sample - old)

    def _learn_slowdown(self, ratio: float) -> None:
        """A measured first-media wait over its estimate (never taken as faster than estimated)."""
        self._slowdown += COST_SMOOTHING * (min(max(ratio, 1.0), SLOWDOWN_MAX) - self._slowdown)

    # -- internals (called with the lock held unless noted) ---------------------------------------
    def _activate(self, job: _Job) -> None:
        slots: dict[str, Any] = {}
        try:
            job.entries = [_Entry(loop, loop.init(job.request, slots)) for loop in job.pipeline.loops]
        except Exception:
            logger.exception("init failed for request %s", job.request_id)
            job.finished = True
            self._emit(job, End.failed(ErrorKind.ENGINE, "request could not be started"))
            return
        self._active[job.request_id] = job
        self._finish_if_done(job)  # a request with nothing to do (blank text) ends at once

    def _promote(self) -> None:
        while self._queued and len(self._active) < self._max_active:
            self._activate(self._queued.popleft())

    def _poll(self, job: _Job) -> bool:
        """Ask idle loops for their next step; False (and the request failed) if a loop raised."""
        for e in job.entries:
            if e.busy or e.done or e.plan is not None or e.waiting or e.io_wait:
                continue
            try:
                nxt = e.loop.next(e.state)
                for _ in range(MAX_INSTANT_WAKES):
                    if not isinstance(nxt, WaitFor):
                        break
                    e.io_wait = True
                    nxt.subscribe(self._waker(job, e))  # may wake at once (the lock is reentrant)
                    if e.io_wait:
                        break
                    nxt = e.loop.next(e.state)  # woken at once: its input is already there
                else:
                    if isinstance(nxt, WaitFor):  # a loop that waits for what it already has: a bug
                        raise RuntimeError(f"{e.loop.name} woke at once {MAX_INSTANT_WAKES} times without work")
            except Exception as exc:
                logger.exception("next() failed for request %s", job.request_id)
                self._fail(job, kind_of(exc))
                return False
            if isinstance(nxt, WaitFor):
                continue
            if nxt is DONE:
                e.done = True
            elif nxt is WAITING:
                e.waiting = True
            else:
                e.plan = nxt  # type: ignore[assignment]
        return True

    def _waker(self, job: _Job, entry: _Entry) -> Callable[[], None]:
        """The wake-up for one ``WaitFor``: callable from any thread, any number of times.

        It holds the job and the entry weakly, so a subscription kept by an outside party (the
        upstream reader thread) never keeps an ended request's state alive.
        """
        job_ref, entry_ref = weakref.ref(job), weakref.ref(entry)

        def wake() -> None:
            with self._cond:
                j, e = job_ref(), entry_ref()
                if j is None or e is None or j.finished or not e.io_wait:
                    return
                e.io_wait = False
                j.stale = True
                self._cond.notify_all()

        return wake

    def _pick(self) -> list[tuple[_Job, _Entry]]:
        """The most urgent ready step, with the equal-shape steps that may ride in its batch.

        One pass over the active requests, asking loops for steps only where something changed
        (``_Job.stale``), keeping the minimum instead of sorting every ready plan: a burst of 64
        requests offers ~80 ready plans to each of its ~400 picks, all under the lock.
        """
        ready: list[tuple[tuple[bool, float, int, int], _Job, _Entry]] = []
        settling: list[tuple[float, tuple[tuple[bool, float, int, int], _Job, _Entry]]] = []
        now = time.monotonic()
        self._next_release = None
        batch_full: bool | None = None  # computed when a batch-priority plan first needs it
        long_full: bool | None = None
        if self._admit_budget > 0:
            self._expire(now)
        for job in list(self._active.values()):  # a failing loop leaves the table mid-iteration
            if job.stale:
                job.stale = False
                if not self._poll(job):
                    continue
                if all(e.done for e in job.entries):  # a woken loop found its input ended: no step left
                    self._finish_if_done(job)
                    continue
            for e in job.entries:
                plan = e.plan
                if plan is None or e.busy:
                    continue
                at = job.ready_at(plan, self._settle)
                if at is None:
                    continue
                if job.batch:
                    if batch_full is None:
                        batch_full = self._batch_full()
                    if batch_full:
                        continue
                if plan.long:
                    if long_full is None:
                        long_full = self._long_full()
                    if long_full:
                        continue
                release = job.release(plan, self._max_ahead)
                if release is not None and release > now:  # far enough ahead of its listener: wait
                    self._wake_at(release)
                    continue
                # Real-time work first (earliest deadline first), batch work in what time is left;
                # the count keeps the order of equal keys as the table's (as a stable sort would).
                count = len(ready) + len(settling)
                key = (job.batch, job.deadline(plan, self._budget, now), 0 if plan.emits else 1, count)
                if at > now:  # its request's first media is being delivered
                    settling.append((at, (key, job, e)))
                    continue
                ready.append((key, job, e))
        if not ready:
            # Idle workers leave the CPUs to the first media's delivery for its settle time.
            # Under load there is nothing idle to give: holding the request back would only put
            # its next audio behind other requests' work (a burst's talker batches).
            if settling:
                self._wake_at(min(at for at, _ in settling))
            return []
        ready += [item for _, item in settling]
        first_key, job, entry = min(ready, key=_key)
        batch = [(job, entry)]
        plan = entry.plan
        assert plan is not None
        if plan.batch_run is None or self._max_batch <= 1:
            return batch
        # Work of another shape that is more urgent than the rest must not wait behind them:
        # batching those would run them ahead of it (a burst's first audio behind streams that are
        # far ahead). So the batch takes equal-shape plans more urgent than any other shape's.
        other = min((k for k, _, e in ready if e.plan is not None and e.plan.shape != plan.shape), default=None)
        # A first media rides only with other first media: batched with 15 chunks of playing
        # streams, a session's first vocoder step took 70 ms instead of 3 (under a burst).
        starting = job.first_media_at is None
        mates = [
            item
            for item in ready
            if item[0] != first_key
            and (other is None or item[0] < other)
            and item[2].plan is not None
            and item[2].plan.shape == plan.shape
            and (not starting or item[1].first_media_at is None)
        ]
        batch += [(j, e) for _, j, e in heapq.nsmallest(self._max_batch - 1, mates, key=_key)]
        return batch

    def _wake_at(self, at: float) -> None:
        if self._next_release is None or at < self._next_release:
            self._next_release = at

    def _batch_full(self) -> bool:
        """Batch work waits while its share of workers is taken or a real-time request awaits first media."""
        return self._batch_workers >= max(1, self._n_workers - 1) or any(
            not job.batch and job.first_media_at is None for job in self._active.values()
        )

    def _long_full(self) -> bool:
        """A playing stream keeps a worker that no long step (a Whisper segment) can take."""
        return self._long_workers >= max(1, self._n_workers - 1) and any(
            job.first_media_at is not None and not job.batch and not job.finished for job in self._active.values()
        )

    def _finish_if_done(self, job: _Job) -> None:
        if job.finished or job.busy() or not self._poll(job):
            return
        if not all(e.done for e in job.entries):
            if not any(e.plan is not None or e.busy or e.io_wait for e in job.entries):
                # Every loop waits on another: a pipeline bug, not something to hang a client on.
                logger.error("request %s deadlocked: all loops waiting", job.request_id)
                self._fail(job)
            return
        try:
            end = job.pipeline.finish([e.loop.finalize(e.state) for e in job.entries])
        except Exception as exc:
            logger.exception("finalize failed for request %s", job.request_id)
            self._fail(job, kind_of(exc))
            return
        job.finished = True
        self._active.pop(job.request_id, None)
        self._learn_costs(job)
        self._promote()
        self._emit(job, end)

    def _learn_costs(self, job: _Job) -> None:
        """A finished request's measured costs: all its work when it made no media (a transcription),
        else the work per second of media after its first, and over the whole request."""
        name = job.pipeline.name
        if job.first_work is None:
            if not job.batch:
                self._learn(self._first_cost, name, job.work_seconds)
            return
        media = job.media_seconds - job.first_media_seconds
        if media > 0:
            self._learn(self._media_cost, name, (job.work_seconds - job.first_work) / media)
        if not job.batch:
            self._learn(self._media_len, name, job.media_seconds)
            self._learn(self._stream_cost, name, job.work_seconds / job.media_seconds)
            self._learn(self._delivery, name, job.request.delivery)

    def _fail(self, job: _Job, kind: ErrorKind = ErrorKind.ENGINE, message: str = "generation failed") -> None:
        job.finished = True
        self._active.pop(job.request_id, None)
        self._promote()
        self._release(job)
        self._emit(job, End.failed(kind, message))

    @staticmethod
    def _release(job: _Job) -> None:
        """Let loops free outside resources of a request that ends without finalize."""
        for entry in job.entries:
            release = getattr(entry.loop, "release", None)
            if release is None:
                continue
            try:
                release(entry.state)
            except Exception:
                logger.exception("release failed for request %s in %s", job.request_id, entry.loop.name)

    @staticmethod
    def _emit(job: _Job, chunk: Chunk) -> None:
        try:
            job.sink(chunk)
        except Exception:  # a sink whose session is gone must not take a worker down
            logger.debug("sink for %s rejected a chunk", job.request_id, exc_info=True)

    def _work(self) -> None:
        while True:
            with self._cond:
                batch: list[tuple[_Job, _Entry]] = []
                while self._running:
                    batch = self._fill(self._pick())
                    if batch:
                        break
                    wake = self._next_release
                    me, idle = threading.get_ident(), time.monotonic()
                    self._idle_from[me] = idle
                    self._cond.wait(None if wake is None else max(0.001, wake - time.monotonic()))
                    del self._idle_from[me]
                    now = time.monotonic()
                    self._idle_total += now - idle
                    if not self._idle_from:  # every worker busy again: a window may start here
                        self._restart_window(now)
                if not self._running:
                    return
                plans: list[WorkPlan] = []
                for _, e in batch:
                    assert e.plan is not None  # _pick takes only entries with a plan
                    e.busy = True
                    plans.append(e.plan)
                    e.plan = None
                self._running_steps += len(batch)
                batch_worker = batch[0][0].batch  # the most urgent is batch: nothing real-time is ready
                self._batch_workers += batch_worker
                long_worker = any(p.long for p in plans)
                self._long_workers += long_worker
            started = time.monotonic()
            results, errors = self._run(plans)  # device work: outside the lock
            share = (time.monotonic() - started) / len(batch)
            with self._cond:
                self._running_steps -= len(batch)
                self._batch_workers -= batch_worker
                self._long_workers -= long_worker
                self._steps_total += len(batch)
                if self._on_batch is not None:
                    self._on_batch(plans[0].kind, len(batch))
                if len(batch) > 1:
                    self._batches_total += 1
                    self._batched_steps_total += len(batch)
                for i, (job, e) in enumerate(batch):
                    e.busy = False
                    job.stale = True
                    job.work_seconds += share
                    self._work_by[job.pipeline.name] = self._work_by.get(job.pipeline.name, 0.0) + share
                    if job.finished:
                        continue  # cancelled while the step ran: drop its output
                    error, result = errors[i], results[i]
                    if error is not None or result is None:
                        logger.error("step %s of %s failed: %r", plans[i].label, job.request_id, error)
                        self._fail(job, *_failure(error))
                        continue
                    try:
                        e.loop.advance(e.state, result)
                    except Exception as exc:
                        logger.exception("advance failed for request %s", job.request_id)
                        self._fail(job, kind_of(exc))
                        continue
                    self._deliver(job, result)
                    for other in job.entries:  # upstream progress may unblock a waiting loop
                        other.waiting = False
                    self._finish_if_done(job)
                self._cond.notify_all()

    def _fill(self, batch: list[tuple[_Job, _Entry]]) -> list[tuple[_Job, _Entry]]:
        """The batching window: wait up to ``batch_wait`` for more plans of the batch's shape.

        With the default of 0 a lone session never waits; under load, batches fill by themselves
        because equal-shape plans from many sessions are ready at the same moment. Plans are
        re-picked after each wait (another worker may have taken some); the result can be empty.
        """
        if not batch or self._batch_wait <= 0:
            return batch
        plan = batch[0][1].plan
        if plan is None or plan.batch_run is None:
            return batch
        deadline = time.monotonic() + self._batch_wait
        while self._running and len(batch) < self._max_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
            batch = self._pick()
            if not batch:
                break
        return batch

    def _deliver(self, job: _Job, result: StepResult) -> None:
        if result.media_seconds:
            if job.first_media_at is None:
                job.first_media_at = time.monotonic()
                job.first_work = job.work_seconds
                job.first_media_seconds = result.media_seconds
                self._learn(self._first_cost, job.pipeline.name, job.work_seconds)
                self._learn_pace(job)
                if job.unscaled_wait is not None and job.unscaled_wait >= SLOWDOWN_MIN_WAIT:
                    ratio = (job.first_media_at - job.submitted_at) / job.unscaled_wait
                    self._learn_slowdown(ratio)
            job.media_seconds += result.media_seconds
            name = job.pipeline.name
            self._media_by[name] = self._media_by.get(name, 0.0) + result.media_seconds
        for chunk in result.chunks:
            self._emit(job, chunk)

    def _learn_pace(self, job: _Job) -> None:
        """At a first media: while every worker has a request waiting for its first media (the
        engine is saturated), the mean gap between its last 2W+1 first media (W workers). It is
        kept after the burst: the next one is admitted at the pace this one met."""
        name = job.pipeline.name
        now = job.first_media_at or time.monotonic()
        waiting = sum(
            1
            for j in (*self._active.values(), *self._queued)
            if j is not job and j.pipeline.name == name and not j.batch and not j.finished and j.first_media_at is None
        )
        # First media come in clumps of W (gaps of 1 ms, then 50): one gap, or an average weighted
        # to the last few, swung the pace 10x (one shed ended 125 requests of a burst); two whole
        # clumps average that out.
        window = 2 * self._n_workers + 1
        firsts = self._saturated_firsts.setdefault(name, deque(maxlen=window))
        if waiting < self._n_workers:
            firsts.clear()
            return
        firsts.append(now)
        if len(firsts) == window:
            self._first_gap[name] = (firsts[-1] - firsts[0]) / (window - 1)

    @staticmethod
    def _run(plans: Sequence[WorkPlan]) -> tuple[list[StepResult | None], list[BaseException | None]]:
        """Run the plans; one result or one error per plan, so a fault stays with its own request.

        A batch that raises is run again one plan at a time (``batch_run`` changes nothing when it
        raises), so only the plan that fails alone ends its request; the others get their results.
        """
        first = plans[0]
        if len(plans) > 1 and first.batch_run is not None:
            try:
                results = first.batch_run(plans)
                if len(results) != len(plans):
                    raise RuntimeError(f"batch_run returned {len(results)} results for {len(plans)} plans")
                return list(results), [None] * len(plans)
            except Exception:
                logger.exception("batched %s step of %d failed; running its plans alone", first.kind, len(plans))
        out: list[StepResult | None] = []
        errors: list[BaseException | None] = []
        for plan in plans:
            try:
                out.append(plan.run())
                errors.append(None)
            except Exception as exc:  # reported per job by the caller; the worker lives on
                logger.exception("work unit %s failed", plan.label or plan.kind)
                out.append(None)
                errors.append(exc)
        return out, errors


def _retry_after(seconds: float) -> float:
    """A refusal's ``Retry-After``: how much later than its budget the request would have started,
    at most ``MAX_RETRY_AFTER`` (an estimate of "no room" is not an hour's wait)."""
    return min(MAX_RETRY_AFTER, seconds)


def _filling(count: int, load: float, share: float) -> float:
    """``Σ 1 / (1 − load − k·share)`` for k < ``count``: the wait for the last of ``count`` first
    media, in units of one's work, while the streams started before each take their share (the
    sum's midpoint integral, within 0.1% of it; the door asks it per arrival). ``MAX_ESTIMATE``
    when the streams leave nothing."""
    free = 1.0 - load
    if share <= 0.0:
        return count / free if free > 0 else MAX_ESTIMATE
    end = free - (count - 0.5) * share
    if end <= 0.0:
        return MAX_ESTIMATE
    return math.log((free + share / 2) / end) / share


def _key(item: tuple[tuple[bool, float, int, int], _Job, _Entry]) -> tuple[bool, float, int, int]:
    return item[0]


def _failure(exc: BaseException | None) -> tuple[ErrorKind, str]:
    """The kind and client-safe message for a failed step: the step's own when it chose them."""
    if isinstance(exc, EngineError):
        return exc.kind, exc.client_message or "generation failed"
    return (ErrorKind.ENGINE if exc is None else kind_of(exc)), "generation failed"
