"""Tasks whose failure is always observed: ``spawn``, for every task a session or the engine starts."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)


def spawn(coro: Coroutine[Any, Any, T], what: str) -> asyncio.Task[T]:
    """A task whose failure is always observed and logged once, never "Task exception was never
    retrieved" at garbage collection (a session's tasks may end while nobody awaits them)."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(functools.partial(_observe, what))
    return task


def _observe(what: str, task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("%s failed", what, exc_info=exc)
