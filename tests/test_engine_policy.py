"""The picking policy, alone: which ready steps run next and which ride together, at a given "now".

Pure: the jobs are built by hand with their timelines and offered plans, and ``now`` is a number, so
every case is exact (no threads, no clock). What the worker pool does with the picks (threads,
stepping, cancellation) is tested in test_engine_scheduler.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omniweb.engine.contracts import ShapeSignature, StepResult, WorkPlan
from omniweb.engine.messages import End
from omniweb.engine.policy import STREAM_GUARD, Entry, Job, Policy, Workers
from omniweb.engine.requests import EngineRequest, Priority

BUDGET = 0.15


class Named:
    """A pipeline as the policy sees it: a name (it never calls one)."""

    def __init__(self, name: str = "p") -> None:
        self.name = name
        self.loops: tuple[Any, ...] = ()

    def validate(self, request: EngineRequest) -> None: ...

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End()


def batch_run(plans: Sequence[WorkPlan]) -> list[StepResult]:
    return [StepResult() for _ in plans]


def plan(
    shape: int = 1, *, emits: bool = True, due: float | None = None, long: bool = False, batched: bool = True
) -> WorkPlan:
    return WorkPlan(
        kind="k",
        shape=ShapeSignature("k", (shape,)),
        run=StepResult,
        emits=("audio",) if emits else (),
        batch_run=batch_run if batched else None,
        due=due,
        long=long,
    )


@dataclass
class Spec:
    name: str
    submitted_at: float = 0.0
    first_media_at: float | None = None
    media_seconds: float = 0.0
    priority: Priority = Priority.REALTIME
    paced: bool = True


def job(spec: Spec, *plans: WorkPlan) -> Job:
    request = EngineRequest(pipeline="p", priority=spec.priority, paced=spec.paced)
    j = Job(spec.name, request, Named(), lambda chunk: None, submitted_at=spec.submitted_at)
    j.first_media_at, j.media_seconds = spec.first_media_at, spec.media_seconds
    j.entries = [Entry(loop=None, state=None, plan=p) for p in plans]  # type: ignore[arg-type]
    j.stale = False
    return j


def names(batch: list[tuple[Job, Entry]]) -> list[str]:
    return [j.request_id for j, _ in batch]


POLICY = Policy(budget=BUDGET, max_batch=16)
TWO = Workers(total=2)


def test_earliest_deadline_first_a_new_request_before_a_stream_that_is_ahead():
    stream = job(Spec("stream", first_media_at=0.0, media_seconds=5.0), plan(2))  # 5 s played ahead
    new = job(Spec("new", submitted_at=1.0), plan(1))
    assert names(POLICY.pick([stream, new], TWO, now=1.0).batch) == ["new"]


def test_a_stream_about_to_run_dry_outranks_a_new_request():
    """A stream whose audio runs out within the guard is fed first; a new request may wait."""
    dry = job(Spec("dry", first_media_at=0.0, media_seconds=1.0 + STREAM_GUARD / 2), plan(2))
    new = job(Spec("new", submitted_at=1.0), plan(1))
    assert names(POLICY.pick([new, dry], TWO, now=1.0).batch) == ["dry"]


def test_equal_shapes_ride_together_up_to_max_batch():
    jobs = [job(Spec(f"r{i}", submitted_at=i * 0.001), plan(1)) for i in range(6)]
    assert names(Policy(budget=BUDGET, max_batch=4).pick(jobs, TWO, now=0.0).batch) == ["r0", "r1", "r2", "r3"]
    assert names(Policy(budget=BUDGET, max_batch=1).pick(jobs, TWO, now=0.0).batch) == ["r0"]
    alone = [job(Spec(f"a{i}"), plan(1, batched=False)) for i in range(3)]
    assert names(POLICY.pick(alone, TWO, now=0.0).batch) == ["a0"]  # no batch_run: one at a time


def test_a_batch_never_carries_work_less_urgent_than_another_shapes():
    first = job(Spec("first", submitted_at=0.00), plan(1))
    other = job(Spec("other", submitted_at=0.01), plan(2))
    late = job(Spec("late", submitted_at=0.02), plan(1))
    assert names(POLICY.pick([late, other, first], TWO, now=0.0).batch) == ["first"]


def test_a_first_media_rides_only_with_other_first_media():
    new = job(Spec("new", submitted_at=0.0), plan(1))
    playing = job(Spec("playing", first_media_at=0.0, media_seconds=0.2), plan(1))
    starting = job(Spec("starting", submitted_at=0.01), plan(1))
    batch = POLICY.pick([new, playing, starting], TWO, now=0.0).batch
    assert names(batch)[0] == "new" and "playing" not in names(batch)


def test_look_ahead_waits_for_the_first_media():
    """A step due later in the media (the talker's next sentence) cannot slow the first audio down."""
    ahead = job(Spec("ahead"), plan(1, due=2.0))
    assert POLICY.pick([ahead], TWO, now=0.0).batch == []
    started = job(Spec("started", first_media_at=0.0, media_seconds=0.5), plan(1, due=2.0))
    assert names(POLICY.pick([started], TWO, now=0.1).batch) == ["started"]


def test_a_paced_stream_waits_until_it_is_max_ahead_of_its_listener():
    policy = Policy(budget=BUDGET, max_ahead=0.5)
    stream = job(Spec("s", first_media_at=0.0, media_seconds=1.2), plan(1))  # 1.2 s made at t=0
    pick = policy.pick([stream], TWO, now=0.0)
    assert pick.batch == [] and pick.wake_at == 0.7  # runs when it is 0.5 s ahead
    assert names(policy.pick([stream], TWO, now=0.7).batch) == ["s"]
    unpaced = job(Spec("u", first_media_at=0.0, media_seconds=1.2, paced=False), plan(1))
    assert names(policy.pick([unpaced], TWO, now=0.0).batch) == ["u"]
    batch = job(Spec("b", first_media_at=0.0, media_seconds=1.2, priority=Priority.BATCH), plan(1))
    assert names(policy.pick([batch], TWO, now=0.0).batch) == ["b"]  # nobody listens: never paced


def test_after_its_first_media_a_request_settles_only_while_nothing_else_is_ready():
    policy = Policy(budget=BUDGET, settle=0.005)
    just = job(Spec("just", first_media_at=1.0, media_seconds=0.1), plan(1))
    pick = policy.pick([just], TWO, now=1.001)
    assert pick.batch == [] and pick.wake_at == 1.005  # the cores go to its first audio's delivery
    other = job(Spec("other", submitted_at=1.0), plan(2))
    assert set(names(policy.pick([just, other], TWO, now=1.001).batch)) <= {"just", "other"}
    assert policy.pick([just, other], TWO, now=1.001).batch  # under load nothing is held back


def test_batch_priority_runs_only_in_what_real_time_work_leaves():
    file = job(Spec("file", priority=Priority.BATCH), plan(1))
    starting = job(Spec("live", submitted_at=0.0), plan(2))
    # A real-time request waiting for its first media: batch work waits.
    assert names(POLICY.pick([file, starting], TWO, now=0.0).batch) == ["live"]
    assert POLICY.pick([file, job(Spec("waiting"))], TWO, now=0.0).batch == []  # no plan, still starting
    # Alone it runs, but never on the last free worker.
    assert names(POLICY.pick([file], TWO, now=0.0).batch) == ["file"]
    assert POLICY.pick([file], Workers(total=2, batch=1), now=0.0).batch == []
    assert names(POLICY.pick([file], Workers(total=1), now=0.0).batch) == ["file"]


def test_long_steps_leave_a_worker_to_a_playing_stream():
    playing = job(Spec("playing", first_media_at=0.0, media_seconds=10.0))  # plays, nothing to do now
    whisper = job(Spec("whisper", first_media_at=0.0, media_seconds=10.0), plan(3, long=True))
    assert POLICY.pick([playing, whisper], Workers(total=2, long=1), now=0.0).batch == []
    assert names(POLICY.pick([playing, whisper], Workers(total=2), now=0.0).batch) == ["whisper"]
    quiet = job(Spec("quiet"), plan(3, long=True))  # nothing plays: long steps may take every worker
    assert names(POLICY.pick([quiet], Workers(total=2, long=1), now=0.0).batch) == ["quiet"]


def test_a_tenants_fair_delay_orders_its_burst_after_another_tenants_request():
    burst = [job(Spec(f"a{i}", submitted_at=0.0), plan(i)) for i in range(3)]
    for i, j in enumerate(burst):
        j.fair_delay = i * 0.05
    other = job(Spec("b", submitted_at=0.01), plan(9))
    order = []
    pending = [*burst, other]
    while pending:
        [(picked, _)] = Policy(budget=BUDGET, max_batch=1).pick(pending, TWO, now=0.0).batch
        order.append(picked.request_id)
        pending.remove(picked)
    assert order == ["a0", "b", "a1", "a2"]


def test_busy_and_finished_are_never_picked():
    busy = job(Spec("busy"), plan(1))
    busy.entries[0].busy = True
    done = job(Spec("done"), plan(1))
    done.finished = True
    assert POLICY.pick([busy, done], TWO, now=0.0).batch == []
