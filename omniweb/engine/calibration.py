"""A pipeline's costs measured when it loads, so admission prices the first burst after a start.

A pipeline may offer ``calibration_request()``: a typical request (a sentence to speak, a few
seconds to transcribe). Its loops are stepped here one step at a time on the loading thread (and, to
see what the workers cost each other, on one thread per worker at once) before the pipeline serves
anything, and the steps' own time is what admission starts from. A loop that waits on
outside I/O (a remote model) cannot be measured so: such a pipeline is learned from its requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .admission import Costs
from .contracts import Done, Pipeline, WaitFor, Waiting
from .requests import EngineRequest

logger = logging.getLogger(__name__)
MAX_STEPS = 10_000  # a calibration request is small: more steps than this is a loop that never ends


def calibrate(pipeline: Pipeline, clock: Callable[[], float] = time.perf_counter, *, workers: int = 1) -> Costs | None:
    """The pipeline's measured costs, or None when it offers no calibration request or it fails
    (admission then learns its costs from the first requests, as for a remote model).

    A first run alone pays the one-off costs; then ``workers`` copies run at once, one per thread,
    as the engine's workers would run a burst: each step's time then includes what the workers
    cost each other on these cores, and the costs are their mean."""
    make = getattr(pipeline, "calibration_request", None)
    request = make() if make is not None else None
    if request is None:
        return None
    try:
        if measure(pipeline, request, clock) is None:
            return None
        with ThreadPoolExecutor(max(1, workers), thread_name_prefix="engine-calibration") as pool:
            runs = list(pool.map(lambda _: measure(pipeline, request, clock), range(max(1, workers))))
    except Exception:
        logger.exception("calibrating %s failed: its costs are learned from its first requests", pipeline.name)
        return None
    measured = [c for c in runs if c is not None]
    if not measured:
        return None
    return Costs(sum(c.first for c in measured) / len(measured), sum(c.stream for c in measured) / len(measured))


def measure(pipeline: Pipeline, request: EngineRequest, clock: Callable[[], float]) -> Costs | None:
    """Step one request to its end, alone, timing each step: the work until its first media, and
    over the whole request per second of media."""
    slots: dict[str, Any] = {}
    loops = [(loop, loop.init(request, slots)) for loop in pipeline.loops]
    done = [False] * len(loops)
    work, first, media = 0.0, None, 0.0
    for _ in range(MAX_STEPS):
        stepped = False
        for i, (loop, state) in enumerate(loops):
            if done[i]:
                continue
            plan = loop.next(state)
            if isinstance(plan, Done):
                done[i] = True
                continue
            if isinstance(plan, Waiting):
                continue
            if isinstance(plan, WaitFor):
                _abandon(loops)  # outside I/O: not the engine's cost
                return None
            t0 = clock()
            result = plan.run()
            work += clock() - t0
            loop.advance(state, result)
            if result.media_seconds and first is None:
                first = work
            media += result.media_seconds
            stepped = True
            break  # the upstream loops first, as the engine would order them
        if all(done):
            break
        if not stepped:
            _abandon(loops)  # every loop waits on another: nothing to measure
            return None
    for loop, state in loops:
        loop.finalize(state)
    if first is None:
        return Costs(work)
    return Costs(first, work / media)


def _abandon(loops: list[tuple[Any, Any]]) -> None:
    """Let loops free what they hold outside (``Releasing``) when the measurement stops early."""
    for loop, state in loops:
        release = getattr(loop, "release", None)
        if release is not None:
            release(state)
