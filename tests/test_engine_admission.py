"""Admission, alone: the wait ahead of a new request against its budget, on a fake clock.

The rule (issue 36 §1): a request with nothing queued ahead is admitted; past that, the first media
queued ahead at their measured costs, spread over the workers in what the playing streams leave,
decide; the costs come from the pipeline's calibration at load, so a fresh engine prices its first
burst as a warm one does. Jobs are built by hand; nothing here sleeps or reads the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from omniweb.base.errors import ErrorKind
from omniweb.engine.admission import RESERVATION_SECONDS, Admission, AdmissionError, Costs
from omniweb.engine.calibration import calibrate
from omniweb.engine.contracts import DONE, ShapeSignature, StepResult, WorkPlan
from omniweb.engine.messages import End
from omniweb.engine.policy import Job
from omniweb.engine.requests import EngineRequest, Priority

# The voice's figures from issue 36: 9.2 ms of talker work before a session's first audio; a
# stream's work per second of audio is a few tens of ms on these cores.
TALKER = Costs(first=0.0092, stream=0.02)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Named:
    def __init__(self, name: str = "speech", shed: bool = True) -> None:
        self.name = name
        self.shed = shed
        self.loops: tuple[Any, ...] = ()

    def validate(self, request: EngineRequest) -> None: ...

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End()


class Engine:
    """The tables admission reads, kept as the worker pool keeps them."""

    def __init__(self, costs: Costs | None = TALKER, *, workers: int = 2, budget: float = 2.0) -> None:
        self.clock = Clock()
        self.admission = Admission(workers=workers, budget=budget, aim=0.15, clock=self.clock)
        if costs is not None:
            self.admission.calibrate("speech", costs)
        self.jobs: list[Job] = []

    def submit(self, request: EngineRequest | None = None, *, pipeline: Named | None = None) -> bool:
        """Whether a new request is admitted now (admitted ones join the table, waiting to start)."""
        request = request or EngineRequest(pipeline="speech")
        pipeline = pipeline or Named(request.pipeline)
        job = Job(f"r{len(self.jobs)}", request, pipeline, lambda chunk: None, submitted_at=self.clock())
        try:
            self.admission.judge(job, self.jobs, sheds=pipeline.shed)
        except AdmissionError as exc:
            assert exc.kind is ErrorKind.CAPACITY and exc.retry_after is not None and exc.retry_after > 0
            return False
        self.jobs.append(job)
        return True

    def burst(self, n: int, make: Callable[[], EngineRequest] | None = None) -> list[bool]:
        return [self.submit(make() if make else None) for _ in range(n)]

    def play(self, n: int, *, delivery: float = 0.0) -> None:
        """``n`` streams that had their first audio a moment ago and play on."""
        for i in range(n):
            request = EngineRequest(pipeline="speech", delivery=delivery)
            j = Job(f"s{i}", request, Named(), lambda chunk: None, submitted_at=self.clock() - 0.5)
            j.first_media_at, j.media_seconds = self.clock() - 0.1, 0.5
            self.jobs.append(j)


def test_a_burst_that_fits_is_admitted_whole():
    """64 sessions flushing at once need ~0.3 s of two workers before their first audio: all fit."""
    assert all(Engine().burst(64))


def test_a_burst_past_the_budget_is_cut_where_the_budget_ends():
    engine = Engine(Costs(first=0.03, stream=0.03))
    verdicts = engine.burst(300)
    admitted = verdicts.count(True)
    assert 10 < admitted < 300
    assert verdicts == [True] * admitted + [False] * (300 - admitted)  # a cut, not a scatter
    waits = engine.admission.estimated_waits(["speech"], engine.jobs)
    assert waits["speech"] > engine.admission.budget  # the next one would start past it


def test_an_engine_with_nothing_queued_ahead_admits_however_slow_its_steps():
    """A neighbour's CPU use can make the steps slow; the first request still starts now."""
    engine = Engine(Costs(first=100.0, stream=50.0))
    # What the workers publish for the Redis mode's door: no wait, so it lets the request through.
    assert engine.admission.estimated_waits(["speech"], engine.jobs) == {"speech": 0.0}
    assert engine.submit()
    assert not engine.submit()  # the second waits behind 100 s of work: refused at once
    assert engine.admission.estimated_waits(["speech"], engine.jobs)["speech"] > engine.admission.budget


def test_a_fresh_engine_prices_its_first_burst_from_its_calibration():
    """Costs measured when the pipeline loads cut the first burst where a warm engine cuts it."""
    clock = Clock()
    measured = calibrate(Ticking(clock), clock)
    assert measured == Costs(first=pytest.approx(0.03), stream=pytest.approx(0.09 / 0.3))
    fresh = Engine(measured)
    warm = Engine(None)
    for i in range(3):  # three requests run to their end teach the warm engine the same costs
        j = Job(f"w{i}", EngineRequest(pipeline="speech"), Named(), lambda chunk: None, submitted_at=0.0)
        j.first_work, j.work_seconds, j.media_seconds = 0.03, 0.09, 0.3
        warm.admission.learn(j)
    first = fresh.burst(300)
    assert first == warm.burst(300) and 0 < first.count(True) < 300


class Ticking:
    """A pipeline whose steps take known time on the fake clock: three steps of 30 ms, 0.1 s of media each."""

    name = "speech"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.loops = (self,)

    def calibration_request(self) -> EngineRequest:
        return EngineRequest(pipeline="speech")

    def init(self, request: EngineRequest, slots: dict[str, Any]) -> list[int]:
        return [0]

    def next(self, state: list[int]) -> WorkPlan | Any:
        if state[0] == 3:
            return DONE

        def run() -> StepResult:
            self.clock.now += 0.03
            return StepResult(media_seconds=0.1)

        return WorkPlan(kind="t", shape=ShapeSignature("t"), run=run)

    def advance(self, state: list[int], result: StepResult) -> None:
        state[0] += 1

    def finalize(self, state: list[int]) -> dict[str, Any]:
        return {}

    def validate(self, request: EngineRequest) -> None: ...

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End()


def test_work_of_an_admitted_session_is_never_refused():
    engine = Engine(Costs(first=1.0))
    engine.burst(10)  # a queue far past the budget
    assert not engine.submit()
    assert engine.submit(EngineRequest(pipeline="speech", admitted=True))  # its VAD windows, its recognition
    assert engine.submit(pipeline=Named("audio.vad", shed=False))
    assert engine.submit(EngineRequest(pipeline="speech", priority=Priority.BATCH))  # spare workers only


def test_a_conversation_turn_is_judged_by_its_own_longer_budget():
    engine = Engine(Costs(first=0.5))
    engine.burst(8)  # ~2 s of first audio queued: the next is past the engine's budget
    assert not engine.submit()
    assert engine.submit(EngineRequest(pipeline="speech", admit_budget=6.0))


def test_playing_streams_leave_less_room_and_an_encoder_makes_them_dearer():
    quiet = Engine(Costs(first=0.03, stream=0.03)).burst(300).count(True)
    busy = Engine(Costs(first=0.03, stream=0.03))
    busy.play(30)
    assert 0 < busy.burst(300).count(True) < quiet
    plain = Engine(Costs(first=0.03, stream=0.03))
    encoded = Engine(Costs(first=0.03, stream=0.03))
    mp3 = EngineRequest(pipeline="speech", delivery=0.03)  # an encoder as dear as the synthesis
    assert encoded.burst(300, lambda: mp3).count(True) < plain.burst(300).count(True)


def test_a_front_door_reservation_counts_until_submitted_released_or_stale():
    engine = Engine(Costs(first=0.5))
    admission = engine.admission
    idle = admission.estimated_waits(["speech"], [])["speech"]
    held = admission.reserve("speech", None, [])
    assert held is not None and admission.estimated_waits(["speech"], [])["speech"] > idle
    assert admission.reservations.pop(held) and admission.estimated_waits(["speech"], [])["speech"] == idle
    keys = [admission.reserve("speech", None, []) for _ in range(8)]  # 4 s of first audio over 2 workers
    assert all(k is not None for k in keys)
    with pytest.raises(AdmissionError):
        admission.reserve("speech", None, [])
    engine.clock.now += RESERVATION_SECONDS + 1  # never submitted nor released: a leak, dropped
    assert admission.reserve("speech", None, []) is not None


def test_one_tenants_burst_does_not_push_another_tenants_request_behind_it():
    engine = Engine(Costs(first=0.2))
    a = EngineRequest(pipeline="speech", tenant="client-a")
    assert engine.burst(6, lambda: a).count(True) >= 6  # 0.6 s of work: fits
    assert engine.submit(replace(a, tenant="client-b"))
    own, other = engine.jobs[5], engine.jobs[6]
    assert other.first_deadline(0.15) < own.first_deadline(0.15)  # b starts ahead of most of a's burst


def test_a_pipeline_with_no_costs_yet_is_admitted_by_the_counts():
    engine = Engine(None)
    assert all(engine.burst(100))
