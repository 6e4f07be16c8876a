"""The worker pool: the threads that step every active request's loops, and cancellation.

It executes what the two deciding parts say: ``Admission`` (whether a new request can have its
first media within its budget) and ``Policy`` (which ready steps run next, batched). Worker threads
share one lock-protected table of requests; each asks the loops that may have changed for their
next step, takes a batch from the policy, runs it outside the lock, then advances the loops and
hands the emitted chunks to each request's sink. The asyncio event loop never runs device work:
sinks only schedule a thread-safe put onto the session's queue. Time comes from an injected clock.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omniweb.base.errors import STARTING_MESSAGE, ErrorKind, kind_of, unavailable_message

from .admission import Admission, AdmissionError, Costs
from .calibration import calibrate
from .contracts import Pipeline, StepResult, WorkPlan
from .messages import CANCELLED, End
from .policy import Entry, Job, Policy, Sink, Workers
from .requests import EngineRequest
from .steps import emit, failure, poll, release, run

__all__ = ["AdmissionError", "Scheduler", "SchedulerStats", "Sink"]

logger = logging.getLogger(__name__)


class PipelineState(StrEnum):
    LOADING = "loading"  # its models are loading: its requests hear "starting"
    READY = "ready"
    FAILED = "failed"  # its models could not load: its requests hear "unavailable"


@dataclass
class SchedulerStats:
    active: int
    queued: int
    running_steps: int
    steps_total: int
    batches_total: int
    batched_steps_total: int
    pipelines: dict[str, PipelineState] = field(default_factory=dict)


class Scheduler:
    """Runs driven loops on ``workers`` threads with admission control and cancellation.

    ``admit_budget``: seconds a new real-time request's first media may be estimated to wait before
    it is refused (0: by the counts alone); ``first_media_budget``: where first media are aimed, the
    policy's order; ``pipelines`` given here are calibrated like those added later."""

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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._n_workers = max(1, workers)
        self._policy = Policy(
            budget=max(0.0, first_media_budget),
            settle=max(0.0, first_media_settle),
            max_ahead=max(0.0, max_ahead),
            max_batch=max(1, max_batch),
        )
        self._admission = Admission(workers=self._n_workers, budget=admit_budget, aim=self._policy.budget, clock=clock)
        self._pipelines: dict[str, Pipeline] = {}  # the ready ones
        self._states: dict[str, PipelineState] = {}  # every announced one's
        self._max_active = max(1, max_active)
        self._max_queued = max(0, max_queued)
        self._batch_wait = max(0.0, batch_wait)
        self._on_batch = on_batch
        self._wake_at: float | None = None  # the earliest a waiting step may run: wakes idle workers
        self._cond = threading.Condition()
        self._active: dict[str, Job] = {}
        self._queued: deque[Job] = deque()
        self._threads: list[threading.Thread] = []
        self._running = False
        self._running_steps = 0
        self._batch_workers = 0  # workers running a batch-priority step now
        self._long_workers = 0  # workers running a long step (WorkPlan.long) now
        self._steps_total = 0
        self._batches_total = 0
        self._batched_steps_total = 0
        for name, pipeline in pipelines.items():
            self.add_pipeline(name, pipeline)

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
            release(job)
            emit(job, End.failed(ErrorKind.ENGINE, "engine stopped"))
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []

    # -- pipelines ------------------------------------------------------------------------------
    def pipeline_loading(self, name: str) -> None:
        """``name``'s models are loading: its requests are refused as ``starting`` until it is added."""
        with self._cond:
            self._states[name] = PipelineState.LOADING

    def add_pipeline(self, name: str, pipeline: Pipeline) -> None:
        """Measure the pipeline's costs (on the caller's thread: the loading one), then serve it."""
        costs = calibrate(pipeline, workers=self._n_workers)
        with self._cond:
            if costs is not None:
                self._admission.calibrate(name, costs)
            self._pipelines[name] = pipeline
            self._states[name] = PipelineState.READY
            self._cond.notify_all()

    def pipeline_failed(self, name: str) -> None:
        """``name`` could not load (the loader keeps why): its requests are refused as ``unavailable``."""
        with self._cond:
            self._states[name] = PipelineState.FAILED
            self._cond.notify_all()

    def pipeline_state(self, name: str) -> PipelineState | None:
        """None for a name never announced."""
        with self._cond:
            return self._states.get(name)

    # -- requests -------------------------------------------------------------------------------
    def submit(self, request_id: str, request: EngineRequest, sink: Sink, reservation: int | None = None) -> None:
        """Admit a request or raise ``AdmissionError`` (at capacity, full, starting, unavailable) /
        ``ValueError``. ``reservation`` (from ``reserve``): the front door already admitted it."""
        if not isinstance(request, EngineRequest):
            raise ValueError(f"not an engine request: {type(request).__name__}")
        name = request.pipeline
        with self._cond:
            pipeline = self._pipelines.get(name)
            state = self._states.get(name)
        if state is PipelineState.LOADING:
            raise AdmissionError(STARTING_MESSAGE, ErrorKind.STARTING)
        if state is PipelineState.FAILED:
            raise AdmissionError(unavailable_message(name), ErrorKind.UNAVAILABLE)
        if pipeline is None:
            raise ValueError(f"unknown pipeline {name!r}")
        pipeline.validate(request)
        with self._cond:
            if not self._running:
                raise AdmissionError("engine is not running", ErrorKind.UNREACHABLE)
            if request_id in self._active or any(j.request_id == request_id for j in self._queued):
                raise ValueError(f"duplicate request id {request_id!r}")
            job = Job(request_id, request, pipeline, sink, submitted_at=self._clock())
            reserved = self._admission.reservations.pop(reservation)
            self._admission.judge(job, self._jobs(), sheds=getattr(pipeline, "shed", True), reserved=reserved)
            if len(self._active) < self._max_active:
                self._activate(job)
            elif len(self._queued) < self._max_queued:
                self._queued.append(job)
            else:
                raise AdmissionError("engine queue is full")
            self._cond.notify_all()

    def reserve(self, name: str, tenant: str | None, delivery: float = 0.0) -> int | None:
        """Admit a real-time ``name`` request at the front door, before it is even parsed (see
        ``Admission.reserve``); None when this engine does not judge it (not ready, not shed)."""
        with self._cond:
            pipeline = self._pipelines.get(name)
            if pipeline is None or not self._running or not getattr(pipeline, "shed", True):
                return None
            return self._admission.reserve(name, tenant, self._jobs(), delivery=delivery)

    def release(self, reservation: int | None) -> None:
        """Give back a reservation whose request was never submitted (refused by the view, gone)."""
        with self._cond:
            self._admission.reservations.pop(reservation)

    def abort(self, request_id: str) -> bool:
        """Cancel between steps: the job leaves the tables now; a step in flight is discarded."""
        with self._cond:
            job = self._active.pop(request_id, None)
            if job is None:
                job = next((j for j in self._queued if j.request_id == request_id), None)
                if job is None:
                    return False
                self._queued.remove(job)
            job.finished = True
            self._promote()
            self._cond.notify_all()
        release(job)
        emit(job, CANCELLED)
        return True

    def stats(self) -> SchedulerStats:
        with self._cond:
            states = dict(self._states)
            return SchedulerStats(
                active=len(self._active),
                queued=len(self._queued),
                running_steps=self._running_steps,
                steps_total=self._steps_total,
                batches_total=self._batches_total,
                batched_steps_total=self._batched_steps_total,
                pipelines=states,
            )

    def estimated_waits(self) -> dict[str, float]:
        """Per ready pipeline that load shedding judges: seconds until a new request's first media."""
        with self._cond:
            judged = [name for name, p in self._pipelines.items() if getattr(p, "shed", True)]
            return self._admission.estimated_waits(judged, self._jobs())

    @property
    def admission(self) -> Admission:
        """The admission estimator (its ``budget`` may be set while the engine runs)."""
        return self._admission

    def costs(self) -> dict[str, Costs]:
        """Per pipeline: the worker seconds admission prices its requests at (measured)."""
        with self._cond:
            return self._admission.costs()

    def _jobs(self) -> list[Job]:
        return [*self._active.values(), *self._queued]

    # -- the loop each worker runs ------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                batch = self._next_batch()
                if not batch:
                    return
                plans: list[WorkPlan] = []
                for _, e in batch:
                    assert e.plan is not None  # the policy takes only entries with a plan
                    e.busy = True
                    plans.append(e.plan)
                    e.plan = None
                self._running_steps += len(batch)
                batch_worker = batch[0][0].batch  # the most urgent is batch: nothing real-time is ready
                self._batch_workers += batch_worker
                long_worker = any(p.long for p in plans)
                self._long_workers += long_worker
            started = self._clock()
            results, errors = run(plans)  # device work: outside the lock
            share = (self._clock() - started) / len(batch)
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
                for (job, e), result, error, plan in zip(batch, results, errors, plans, strict=True):
                    self._update(job, e, plan, result, error, share)
                self._cond.notify_all()

    def _next_batch(self) -> list[tuple[Job, Entry]]:
        """Wait (under the lock) for a batch to run; empty once the engine stops."""
        while self._running:
            batch = self._fill(self._pick())
            if batch:
                return batch
            wake = self._wake_at
            self._cond.wait(None if wake is None else max(0.001, wake - self._clock()))
        return []

    def _pick(self) -> list[tuple[Job, Entry]]:
        """Ask the loops that may have changed for their next step, then let the policy choose."""
        for job in list(self._active.values()):  # a failing loop leaves the table mid-iteration
            if job.stale:
                job.stale = False
                if self._poll(job) and all(e.done for e in job.entries):  # a woken loop found its input ended
                    self._finish_if_done(job)
        workers = Workers(self._n_workers, self._batch_workers, self._long_workers)
        pick = self._policy.pick(self._active.values(), workers, self._clock())
        self._wake_at = pick.wake_at
        return pick.batch

    def _fill(self, batch: list[tuple[Job, Entry]]) -> list[tuple[Job, Entry]]:
        """The batching window: wait up to ``batch_wait`` for more plans of the batch's shape (0,
        the default: a lone session never waits; under load batches fill by themselves). Plans are
        picked again after each wait (another worker may have taken some): it can end empty."""
        plan = batch[0][1].plan if batch else None
        if plan is None or plan.batch_run is None or self._batch_wait <= 0:
            return batch
        deadline = self._clock() + self._batch_wait
        while self._running and len(batch) < self._policy.max_batch:
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
            batch = self._pick()
            if not batch:
                break
        return batch

    def _update(
        self, job: Job, e: Entry, plan: WorkPlan, result: StepResult | None, error: BaseException | None, share: float
    ) -> None:
        """A step's outcome: advance its loop and deliver its chunks, or end its request."""
        e.busy = False
        job.stale = True
        job.work_seconds += share
        if job.finished:
            return  # cancelled while the step ran: its output is dropped
        if error is not None or result is None:
            logger.error("step %s of %s failed: %r", plan.label, job.request_id, error)
            self._fail(job, *failure(error))
            return
        try:
            e.loop.advance(e.state, result)
        except Exception as exc:
            logger.exception("advance failed for request %s", job.request_id)
            self._fail(job, kind_of(exc))
            return
        if result.media_seconds:
            if job.first_media_at is None:
                job.first_media_at = self._clock()
                job.first_work = job.work_seconds
                job.first_media_seconds = result.media_seconds
            job.media_seconds += result.media_seconds
        for chunk in result.chunks:
            emit(job, chunk)
        for other in job.entries:  # upstream progress may unblock a waiting loop
            other.waiting = False
        self._finish_if_done(job)

    # -- a request's loops (called with the lock held) -----------------------------------------
    def _activate(self, job: Job) -> None:
        slots: dict[str, Any] = {}
        try:
            job.entries = [Entry(loop, loop.init(job.request, slots)) for loop in job.pipeline.loops]
        except Exception:
            logger.exception("init failed for request %s", job.request_id)
            job.finished = True
            emit(job, End.failed(ErrorKind.ENGINE, "request could not be started"))
            return
        self._active[job.request_id] = job
        self._finish_if_done(job)  # a request with nothing to do (blank text) ends at once

    def _promote(self) -> None:
        while self._queued and len(self._active) < self._max_active:
            self._activate(self._queued.popleft())

    def _poll(self, job: Job) -> bool:
        """Ask idle loops for their next step; False (and the request failed) if a loop raised."""
        try:
            poll(job, self._waker)
        except Exception as exc:
            logger.exception("next() failed for request %s", job.request_id)
            self._fail(job, kind_of(exc))
            return False
        return True

    def _waker(self, job: Job, entry: Entry) -> Callable[[], None]:
        """The wake-up for one ``WaitFor``: callable from any thread, any number of times. It holds
        the job and the entry weakly, so a subscription kept by an outside party (the upstream
        reader thread) never keeps an ended request's state alive."""
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

    def _finish_if_done(self, job: Job) -> None:
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
        self._admission.learn(job)
        self._promote()
        emit(job, end)

    def _fail(self, job: Job, kind: ErrorKind = ErrorKind.ENGINE, message: str = "generation failed") -> None:
        job.finished = True
        self._active.pop(job.request_id, None)
        self._promote()
        release(job)
        emit(job, End.failed(kind, message))
