"""The picking policy: which ready steps run next, and which ride together in one batch.

Pure: it reads the requests' timelines and their loops' offered plans at a given ``now`` and decides;
it never calls a loop, takes a lock or reads a clock (the worker pool does those). Earliest playback
deadline first: a request before its first media aims at ``submitted_at + first_media_budget`` (plus
its tenant's fair delay), a playing stream at the moment its audio so far runs out, so a burst of
arrivals may wait for its first audio but a stream that has started never stutters.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .contracts import Loop, Pipeline, WorkPlan
from .messages import Chunk
from .requests import EngineRequest

Sink = Callable[[Chunk], None]
STREAM_GUARD = 0.1  # seconds: a playing stream this close to running dry outranks any new request


@dataclass(eq=False)
class Entry:
    """One loop of a request, with the step it offers (``plan``) and why it offers none."""

    loop: Loop[Any, Any]
    state: Any
    plan: WorkPlan | None = None
    waiting: bool = False  # on an upstream loop of the same request: re-polled after its steps
    io_wait: bool = False  # on outside I/O (``WaitFor``): re-polled only when woken
    busy: bool = False
    done: bool = False


@dataclass(eq=False)
class Job:
    """A request in the engine: its loops and its media timeline (what the policy orders by)."""

    request_id: str
    request: EngineRequest
    pipeline: Pipeline
    sink: Sink
    submitted_at: float
    entries: list[Entry] = field(default_factory=list)
    first_media_at: float | None = None
    media_seconds: float = 0.0
    finished: bool = False
    # Fair share: a tenant's n-th request still before its first media aims that much later (one
    # request's first-media work over the workers, times n), so one client's burst cannot hold a
    # later client's first audio behind all of it.
    fair_delay: float = 0.0
    work_seconds: float = 0.0  # worker time its steps took (a batched step's time shared out)
    first_work: float | None = None  # work_seconds at its first media
    first_media_seconds: float = 0.0  # media its first media step carried
    # Its loops may have a new step to offer (activated, a step of it ended, a waiting loop woken):
    # only such requests' loops are asked again.
    stale: bool = True

    @property
    def batch(self) -> bool:
        return self.request.batch

    @property
    def tenant(self) -> str | None:
        return self.request.tenant or None

    @property
    def starting(self) -> bool:
        """Real-time and still waiting for its first media (what admission counts ahead)."""
        return not self.finished and not self.batch and self.first_media_at is None

    def first_deadline(self, budget: float) -> float:
        """Where its first media is aimed: the order new requests start in."""
        return self.submitted_at + budget + self.fair_delay

    def deadline(self, plan: WorkPlan, budget: float, now: float) -> float:
        """When ``plan`` must have run for the listener to hear no gap: before the first media, at
        the aimed first media but never ahead of a stream within ``STREAM_GUARD`` of running dry;
        after it, on the timeline anchored at the first media."""
        due = self.media_seconds if plan.due is None else plan.due
        if self.first_media_at is None:
            return max(self.first_deadline(budget), now + STREAM_GUARD) + due
        return self.first_media_at + due

    def ready_at(self, plan: WorkPlan, settle: float) -> float | None:
        """When ``plan`` may run (None: not before the first media).

        Look-ahead work (due later) waits for the first media so it cannot slow that down; after
        it, every step waits ``settle`` more while nothing else is ready, leaving the cores to that
        media's delivery (an HTTP body's encoder, socket writes), which runs after the step."""
        if self.first_media_at is None:
            return None if plan.due else 0.0
        return self.first_media_at + settle

    def release(self, plan: WorkPlan, max_ahead: float) -> float | None:
        """When an emitting step may run if its stream is kept ``max_ahead`` seconds ahead of the listener."""
        if max_ahead <= 0 or not plan.emits or self.first_media_at is None or self.batch or not self.request.paced:
            return None
        return self.first_media_at + self.media_seconds - max_ahead

    def busy(self) -> bool:
        return any(e.busy for e in self.entries)


@dataclass(frozen=True)
class Workers:
    """The worker pool as the policy needs it: how many, and what the busy ones run."""

    total: int
    batch: int = 0  # running a batch-priority step
    long: int = 0  # running a long step (``WorkPlan.long``)


@dataclass
class Pick:
    """A batch to run now (possibly empty) and, when nothing is ready, when to look again."""

    batch: list[tuple[Job, Entry]]
    wake_at: float | None = None


Key = tuple[bool, float, int, int]


@dataclass(frozen=True)
class Policy:
    budget: float = 0.15  # seconds a new request's first media aims at
    settle: float = 0.0  # seconds after a first media its request's next step waits, when nothing else is ready
    max_ahead: float = 0.0  # seconds a paced stream may run ahead of its listener (0: unpaced)
    max_batch: int = 16

    def pick(self, jobs: Iterable[Job], workers: Workers, now: float) -> Pick:
        """The most urgent ready step with the equal-shape steps that may ride in its batch.

        Real-time work first (earliest deadline), batch work in what is left; batch-priority work
        never takes the last free worker nor runs while a real-time request awaits its first media;
        a long step never takes the worker a playing stream needs.
        """
        jobs = list(jobs)
        ready: list[tuple[Key, Job, Entry]] = []
        settling: list[tuple[float, tuple[Key, Job, Entry]]] = []
        wake: list[float] = []
        batch_full = workers.batch >= max(1, workers.total - 1) or any(j.starting for j in jobs)
        long_full = workers.long >= max(1, workers.total - 1) and any(
            j.first_media_at is not None and not j.batch and not j.finished for j in jobs
        )
        for job in jobs:
            if job.finished:
                continue
            for e in job.entries:
                plan = e.plan
                if plan is None or e.busy or (job.batch and batch_full) or (plan.long and long_full):
                    continue
                at = job.ready_at(plan, self.settle)
                if at is None:
                    continue
                release = job.release(plan, self.max_ahead)
                if release is not None and release > now:  # far enough ahead of its listener: wait
                    wake.append(release)
                    continue
                # The count keeps equal keys in the table's order, as a stable sort would.
                key = (
                    job.batch,
                    job.deadline(plan, self.budget, now),
                    0 if plan.emits else 1,
                    len(ready) + len(settling),
                )
                if at > now:  # its request's first media is being delivered
                    settling.append((at, (key, job, e)))
                else:
                    ready.append((key, job, e))
        if not ready:
            # Idle workers leave the cores to a first media's delivery for its settle time; under
            # load there is nothing idle to give, so settling steps run as soon as they are picked.
            wake += [at for at, _ in settling]
            return Pick([], min(wake, default=None))
        ready += [item for _, item in settling]
        return Pick(self._batch(ready), min(wake, default=None))

    def _batch(self, ready: list[tuple[Key, Job, Entry]]) -> list[tuple[Job, Entry]]:
        first_key, job, entry = min(ready, key=_key)
        plan = entry.plan
        assert plan is not None
        if plan.batch_run is None or self.max_batch <= 1:
            return [(job, entry)]
        # A batch takes only equal-shape plans more urgent than any other shape's (batching the
        # rest would run them ahead of that), and a first media rides only with other first media
        # (batched with a burst's playing streams, a first vocoder step took 70 ms instead of 3).
        other = min((k for k, _, e in ready if e.plan is not None and e.plan.shape != plan.shape), default=None)
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
        return [(job, entry)] + [(j, e) for _, j, e in heapq.nsmallest(self.max_batch - 1, mates, key=_key)]


def _key(item: tuple[Key, Job, Entry]) -> Key:
    return item[0]
