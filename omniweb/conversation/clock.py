"""The session clock: the config and idle timeouts every WebSocket session keeps.

Every endpoint closes a session that sends no ``session.config`` in time or goes quiet between
requests, but never while the server is still answering (the client may just be listening).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


class SessionClock:
    """``touch()`` on every client message; ``run()`` as a task of the session until it closes."""

    def __init__(
        self,
        *,
        config_timeout: float,
        idle_timeout: float,
        configured: Callable[[], bool],
        paused: Callable[[], bool],
        closed: Callable[[], bool],
        on_timeout: Callable[[bool], Awaitable[None]],
    ) -> None:
        self._config_timeout = config_timeout
        self._idle_timeout = idle_timeout
        self._configured = configured
        self._paused = paused  # an answer is streaming: no idle timeout
        self._closed = closed
        self._on_timeout = on_timeout  # called with True when session.config never came
        self._activity = asyncio.Event()
        self._last = asyncio.get_running_loop().time()

    def touch(self) -> None:
        """Restart the clock and wake the watcher to re-read it (also when a pause ends)."""
        self._last = asyncio.get_running_loop().time()
        self._activity.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed():
            self._activity.clear()
            if self._paused():
                await self._activity.wait()
                continue
            configured = self._configured()
            limit = self._idle_timeout if configured else self._config_timeout
            remaining = self._last + limit - loop.time()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._activity.wait(), remaining)
                continue
            await self._on_timeout(not configured)
            return
