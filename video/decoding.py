"""The frame decode pool: every client-frame decode on the transport side runs here, nowhere else.

A decode may be costly by design of a hostile client (a JPEG within the pixel limit still costs
CPU per scan), so decodes get threads of their own (``OMNIWEB_VIDEO_DECODE_THREADS``) instead of
the event loop's default executor, which speech sessions share for their audio encoding: a queue of
slow decodes can then never delay another session's first audio. A decode still queued when its
session ends is dropped without running (cancelling the awaiting task cancels its pool future).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.conf import settings

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def decode_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, settings.VIDEO_DECODE_THREADS), thread_name_prefix="frame-decode")
        return _pool


async def run_decode(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the decode pool."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(decode_pool(), functools.partial(fn, *args, **kwargs))
