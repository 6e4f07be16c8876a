"""A request's loops as the worker pool drives them: asked for their next step, run (batched or
alone, a fault kept to its own request), released and told of the end. Called with the pool's lock
held, except ``run`` (device work), ``release`` and ``emit``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from omniweb.base.errors import EngineError, ErrorKind, kind_of

from .contracts import Done, StepResult, WaitFor, Waiting, WorkPlan
from .messages import Chunk
from .policy import Entry, Job

logger = logging.getLogger(__name__)
MAX_INSTANT_WAKES = 8  # a WaitFor woken at once this many times in a row without a plan is a loop bug


def poll(job: Job, waker: Callable[[Job, Entry], Callable[[], None]]) -> None:
    """Ask the idle loops of ``job`` for their next step; raises what a loop's ``next`` raised.

    A loop waiting on outside I/O (``WaitFor``) subscribes ``waker(job, entry)`` and is not asked
    again until woken; one woken at once is asked again at once (its input is already there)."""
    for e in job.entries:
        if e.busy or e.done or e.plan is not None or e.waiting or e.io_wait:
            continue
        nxt = e.loop.next(e.state)
        for _ in range(MAX_INSTANT_WAKES):
            if not isinstance(nxt, WaitFor):
                break
            e.io_wait = True
            nxt.subscribe(waker(job, e))  # may wake at once (the pool's lock is reentrant)
            if e.io_wait:
                break
            nxt = e.loop.next(e.state)
        else:
            if isinstance(nxt, WaitFor):  # a loop that waits for what it already has: a bug
                raise RuntimeError(f"{e.loop.name} woke at once {MAX_INSTANT_WAKES} times without work")
        if isinstance(nxt, Done):
            e.done = True
        elif isinstance(nxt, Waiting):
            e.waiting = True
        elif isinstance(nxt, WorkPlan):
            e.plan = nxt


def run(plans: Sequence[WorkPlan]) -> tuple[list[StepResult | None], list[BaseException | None]]:
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


def failure(exc: BaseException | None) -> tuple[ErrorKind, str]:
    """The kind and client-safe message for a failed step: the step's own when it chose them."""
    if isinstance(exc, EngineError):
        return exc.kind, exc.client_message or "generation failed"
    return (ErrorKind.ENGINE if exc is None else kind_of(exc)), "generation failed"


def release(job: Job) -> None:
    """Let loops free outside resources of a request that ends without finalize."""
    for entry in job.entries:
        free = getattr(entry.loop, "release", None)
        if free is None:
            continue
        try:
            free(entry.state)
        except Exception:
            logger.exception("release failed for request %s in %s", job.request_id, entry.loop.name)


def emit(job: Job, chunk: Chunk) -> None:
    try:
        job.sink(chunk)
    except Exception:  # a sink whose session is gone must not take a worker down
        logger.debug("sink for %s rejected a chunk", job.request_id, exc_info=True)
