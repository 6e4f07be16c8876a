"""Admission: whether a new real-time request can have its first media within its budget.

The rule: the wait ahead of a new request is the work queued before it (the first media of every
request aimed earlier, at its pipeline's measured cost) spread over the workers, run in what the
playing streams leave of them. A request with nothing queued ahead is admitted, however slow the
cores: it starts now, and refusing it would only make its client retry into the same state. Past
the budget it is refused at once, so a burst that fits is served whole and a burst that does not is
cut where the budget ends. Costs are worker seconds measured on the steps themselves: a pipeline's
are measured when it loads (``calibration.measure``), so the first burst after a start is priced as
well as later ones, and learned from every finished request after. Nothing here reads wall-clock
contention (another process's CPU use), so that cannot refuse anything by itself.

Work that belongs to a session already admitted (``EngineRequest.admitted``: its voice activity
windows, end-of-turn checks, streaming recognition) and pipelines that say ``shed = False`` are
never refused. Admission holds no lock of its own: the worker pool calls it under its lock, with an
injected clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

from omniweb.base.errors import CAPACITY_MESSAGE, ErrorKind

from .policy import Job

COST_SMOOTHING = 0.2  # weight of the newest sample in a pipeline's measured costs (an EWMA)
RESERVATION_SECONDS = 30.0  # a front-door admission not submitted by then is dropped from the estimates
MAX_ESTIMATE = 3600.0  # seconds: what an estimate reports for "no room" (the streams take every worker)
MAX_RETRY_AFTER = 10.0  # seconds: a refusal's hint at most


class AdmissionError(RuntimeError):
    """The engine cannot take the request (at capacity, starting, unavailable, stopped)."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.CAPACITY, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after  # seconds after which a retry may be admitted


@dataclass(frozen=True)
class Costs:
    """A pipeline's measured costs in worker seconds."""

    first: float  # until a request's first media (all of it for a request that makes none)
    stream: float = 0.0  # per second of media, over a whole request (its first media's work included)


@dataclass(frozen=True)
class _Reservation:
    pipeline: str
    tenant: str | None
    at: float


class Reservations:
    """Front-door admissions not submitted yet, with per-pipeline and per-tenant counts kept current
    (a burst reserves hundreds, and each estimate reads them)."""

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
        _drop(self._by_pipeline, r.pipeline)
        _drop(self._by_tenant, r.tenant)
        return True

    def expire(self, before: float) -> None:
        """Drop those made before ``before``: neither submitted nor released in time, a leak."""
        while self._items:
            key, oldest = next(iter(self._items.items()))
            if oldest.at >= before:
                return
            self.pop(key)

    def of_tenant(self, tenant: str | None) -> int:
        return self._by_tenant.get(tenant, 0)

    def by_pipeline(self) -> dict[str, int]:
        return dict(self._by_pipeline)


K = TypeVar("K")


def _drop(table: dict[K, int], name: K) -> None:
    table[name] -= 1
    if not table[name]:
        del table[name]


class Admission:
    """The estimator and its verdicts. ``budget``: seconds a new request's first media may wait
    (0: admit by the counts alone); ``aim``: the first-media budget the picking policy orders by."""

    def __init__(self, *, workers: int, budget: float, aim: float, clock: Callable[[], float]) -> None:
        self.workers = max(1, workers)
        self.budget = max(0.0, budget)
        self.aim = max(0.0, aim)
        self.clock = clock
        self.reservations = Reservations()
        self._costs: dict[str, Costs] = {}

    # -- costs ------------------------------------------------------------------------------------
    def calibrate(self, name: str, costs: Costs) -> None:
        """A pipeline's costs measured at load, before any request."""
        self._costs[name] = costs

    def costs(self) -> dict[str, Costs]:
        return dict(self._costs)

    def learn(self, job: Job) -> None:
        """A finished request's measured costs (real-time ones; batch work runs on spare workers)."""
        if job.batch:
            return
        name = job.pipeline.name
        old = self._costs.get(name) or Costs(job.work_seconds if job.first_work is None else job.first_work)
        if job.first_work is None:  # it made no media (a transcription, a VAD window): all its work
            self._costs[name] = replace(old, first=_ewma(old.first, job.work_seconds))
            return
        self._costs[name] = Costs(
            _ewma(old.first, job.first_work), _ewma(old.stream or None, job.work_seconds / job.media_seconds)
        )

    def pace(self, name: str) -> float:
        """Seconds of the workers one ``name`` request's first media takes: a tenant's fair delay unit."""
        costs = self._costs.get(name)
        return 0.0 if costs is None else costs.first / self.workers

    # -- verdicts ---------------------------------------------------------------------------------
    def judge(self, job: Job, jobs: Iterable[Job], *, sheds: bool, reserved: bool = False) -> None:
        """Place a real-time request in its tenant's fair order and refuse it (``AdmissionError``)
        when work is queued ahead of it and its first media would come past its budget."""
        if job.batch:
            return
        jobs = list(jobs)
        job.fair_delay = self._tenant_ahead(job.tenant, jobs) * self.pace(job.pipeline.name)
        if reserved or not sheds or job.request.admitted or self.budget <= 0:
            return
        budget = job.request.own_admit_budget or self.budget
        self._refuse_past(
            budget, *self._wait(job.pipeline.name, job.first_deadline(self.aim), jobs, job.request.delivery)
        )

    def reserve(self, name: str, tenant: str | None, jobs: Iterable[Job], *, delivery: float = 0.0) -> int | None:
        """Admit a ``name`` request at the front door, before it is parsed: its place counts in every
        estimate until it is submitted or released, so a burst that arrives faster than it is
        submitted cannot all pass the door. Raises ``AdmissionError`` past the budget."""
        if self.budget <= 0:
            return None
        now = self.clock()
        jobs = list(jobs)
        aimed = now + self.aim + self._tenant_ahead(tenant, jobs) * self.pace(name)
        self._refuse_past(self.budget, *self._wait(name, aimed, jobs, delivery))
        return self.reservations.add(name, tenant, now)

    def estimated_waits(self, names: Iterable[str], jobs: Iterable[Job]) -> dict[str, float]:
        """Per pipeline with known costs: seconds until a new request's first media (no tenant), 0
        when nothing is queued ahead of it (it starts now: what the Redis mode's door judges by)."""
        jobs = list(jobs)
        aimed = self.clock() + self.aim
        waits = {name: self._wait(name, aimed, jobs, 0.0) for name in names if name in self._costs}
        return {name: round(wait, 3) if ahead else 0.0 for name, (ahead, wait) in waits.items()}

    @staticmethod
    def _refuse_past(budget: float, ahead: int, wait: float) -> None:
        if ahead and wait > budget:
            retry = min(MAX_RETRY_AFTER, wait - budget)
            raise AdmissionError(CAPACITY_MESSAGE, ErrorKind.CAPACITY, retry_after=retry)

    def _tenant_ahead(self, tenant: str | None, jobs: list[Job]) -> int:
        if tenant is None:
            return 0
        return sum(1 for j in jobs if j.tenant == tenant and j.starting) + self.reservations.of_tenant(tenant)

    def _wait(self, name: str, aimed: float, jobs: list[Job], delivery: float) -> tuple[int, float]:
        """How many first media are queued ahead of a ``name`` request aimed at ``aimed``, and the
        seconds until its own.

        The first media ahead (their remaining first-media work) and its own run on the workers in
        what the playing streams leave: the policy feeds each stream just before it runs dry, so it
        takes its share (work per media second over the workers) for the part of the budget it
        plays beyond what is already made, and each request started ahead adds its own stream. The
        k-th first media thus takes ``work / (1 − load − k·share)``; when the streams would take
        every worker there is no room (``MAX_ESTIMATE``)."""
        now = self.clock()
        self.reservations.expire(now - RESERVATION_SECONDS)
        horizon = self.budget or self.aim
        ahead = len(self.reservations)
        work = sum(self._first(p) * n for p, n in self.reservations.by_pipeline().items())
        load = 0.0
        for j in jobs:
            if j.finished or j.batch:
                continue
            if j.first_media_at is None:
                if j.first_deadline(self.aim) <= aimed:
                    ahead += 1
                    work += max(0.0, self._first(j.pipeline.name) - j.work_seconds)
            elif j.request.paced and horizon > 0:
                owed = now + horizon - (j.first_media_at + j.media_seconds)  # media it plays within the horizon
                load += self._share(j.pipeline.name, j.request.delivery) * min(horizon, max(0.0, owed)) / horizon
        count = ahead + 1
        work += self._first(name)
        filling = _filling(count, load, self._share(name, delivery))
        if filling is None:
            return ahead, MAX_ESTIMATE
        return ahead, min(MAX_ESTIMATE, work / count / self.workers * filling)

    def _first(self, name: str) -> float:
        costs = self._costs.get(name)
        return 0.0 if costs is None else costs.first

    def _share(self, name: str, delivery: float) -> float:
        """The share of the workers a ``name`` stream takes while it plays: its steps' work and its
        delivery's (the adapter's encoder on the same cores) per second of media."""
        costs = self._costs.get(name)
        return ((costs.stream if costs else 0.0) + delivery) / self.workers


def _ewma(old: float | None, sample: float) -> float:
    return sample if old is None else old + COST_SMOOTHING * (sample - old)


def _filling(count: int, load: float, share: float) -> float | None:
    """``Σ 1 / (1 − load − k·share)`` for k < ``count`` (by its midpoint integral, within 0.1%):
    the wait for the last of ``count`` first media in units of one's work, while the streams
    started before each take their share. None when the streams leave nothing."""
    free = 1.0 - load
    if share <= 0.0:
        return count / free if free > 0 else None
    end = free - (count - 0.5) * share
    if end <= 0.0:
        return None
    return math.log((free + share / 2) / end) / share
