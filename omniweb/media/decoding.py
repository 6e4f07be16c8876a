"""The frame decode pool: every client-frame decode on the transport side runs here, nowhere else.

A decode may be costly by design of a hostile client (a JPEG within the pixel limit still costs
CPU per scan), so decodes get threads of their own (``OMNIWEB_VIDEO_DECODE_THREADS``, given by the
wiring through ``configure``) instead of the event loop's default executor, which speech sessions
share for their audio encoding: a queue of slow decodes can then never delay another session's
first audio.

A decode whose session has gone is abandoned: cancelling the awaiting task (the session's shutdown
does) cancels its pool future, so a decode still queued never runs, and it lets go of its frame at
once (the pool's queue keeps only an empty job until a thread reaches it, not the frame's up to
10 MB behind other sessions' slow decodes). A decode already running finishes (its cost is bounded
by the frame checks) and its result is dropped.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_threads = 2  # until the wiring configures it (the setting's own default)
_waiting: set[_Job[Any]] = set()  # queued, not started: each holds its frame


class AbandonedError(Exception):
    """Raised on the pool by a job whose caller had gone before a thread reached it."""


class _Job(Generic[T]):
    """A decode and its arguments; ``drop`` releases them before it runs."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._call: Callable[[], T] | None = call

    def run(self) -> T:
        with _lock:
            call, self._call = self._call, None
            _waiting.discard(self)
        if call is None:
            raise AbandonedError
        return call()

    def drop(self) -> None:
        with _lock:
            self._call = None
            _waiting.discard(self)


def configure(threads: int) -> None:
    """The pool's threads (at least one), read when the first decode starts it."""
    global _threads
    _threads = max(1, threads)


def decode_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_threads, thread_name_prefix="frame-decode")
        return _pool


def waiting() -> int:
    """Decodes queued on the pool and not started, all sessions together."""
    with _lock:
        return len(_waiting)


async def run_decode(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the decode pool; cancelled, it never runs and frees its arguments."""
    loop = asyncio.get_running_loop()
    job = _Job(functools.partial(fn, *args, **kwargs))
    with _lock:
        _waiting.add(job)
    try:
        return await loop.run_in_executor(decode_pool(), job.run)
    finally:
        job.drop()
