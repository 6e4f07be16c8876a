"""What every WebSocket session shares: the base consumer and the session clock.

Both endpoints close a session that sends no ``session.config`` in time or goes quiet between
requests, but never while the server is still answering (the client may just be listening).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from autobahn.exception import Disconnected
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from omniweb import budget, metrics
from omniweb.errors import ErrorKind
from omniweb.protocol import dumps, error
from omniweb.transport import SCOPE_KEY, SendWatch

logger = logging.getLogger(__name__)


def spawn(coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
    """A task whose failure is always observed and logged once, never "Task exception was never
    retrieved" at garbage collection (a session's tasks may end while nobody awaits them)."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(functools.partial(_observe, what))
    return task


def _observe(what: str, task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("%s failed", what, exc_info=exc)


class SessionConsumer(AsyncWebsocketConsumer):
    """A session endpoint's consumer: JSON out (every ``error`` counted), refusals, the stall check.

    Subclasses keep ``config`` (None until a valid ``session.config``) and implement ``fail``.
    """

    # A session talks to the engine only through its EngineClient; it needs no channel of its own,
    # so it does not hold a channel-layer receive (which would die with a Redis restart).
    channel_layer_alias = "omniweb-sessions-use-no-layer"
    config: Any = None

    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        """Send ``error`` (of ``kind``) and end the session."""
        raise NotImplementedError

    async def reject(self, message: str) -> None:
        """An invalid message: fatal before the first valid session.config, reported after it."""
        if self.config is None:
            await self.fail(message)
        else:
            await self.send_json(error(message))

    # Set once a send found the client not reading; the session has then been failed and closed.
    send_stalled = False
    client_gone = False  # a send found the socket closed: nothing more can reach the client
    _send_watch: SendWatch | None = None

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False) -> None:
        """Every send (audio, acks, errors, pongs) counts against the session's send budget, and
        what daphne then holds for the client against the process-wide budget (omniweb/budget.py).

        A send to a client that has just left is dropped (daphne raises ``Disconnected`` until the
        disconnect reaches the consumer): work in flight ends quietly instead of as a traceback.
        """
        if self.client_gone:
            return
        try:
            await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        except Disconnected:
            self.client_gone = True
            return
        if close or self.send_stalled:
            return
        if not self._hold_queued_replies():
            self.send_stalled = True
            logger.warning("closing a session whose client is behind while the memory budget is spent")
            await self.fail(budget.REPLIES_FULL_MESSAGE, ErrorKind.STALLED)
            return
        if self._send_watch is None:
            self._send_watch = SendWatch(
                self.scope,
                max_bytes=settings.SESSION_SEND_BUFFER_MAX,
                max_seconds=settings.SESSION_SEND_STALL_SECONDS,
            )
        reason = self._send_watch.stalled(time.monotonic())
        if reason is None:
            return
        self.send_stalled = True
        logger.warning("closing a session whose client stopped reading (%s)", reason)
        await self.fail(f"Client is not reading: {reason}; session closed", ErrorKind.STALLED)

    _share: budget.SessionShare | None = None

    @property
    def budget_share(self) -> budget.SessionShare:
        """What this session holds in the process-wide budget (omniweb/budget.py), freed at disconnect."""
        if self._share is None:
            self._share = budget.SessionShare()
        return self._share

    def _hold_queued_replies(self) -> bool:
        """The bytes daphne holds for this client count against the process budget (issue #11)."""
        probe = self.scope.get(SCOPE_KEY)
        queued = probe() if probe is not None else None
        if queued is None:  # another server than daphne: nothing to measure
            return True
        return self.budget_share.hold("replies", queued, force=queued <= budget.REPLIES_SLACK)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        try:
            await super().websocket_disconnect(message)
        finally:
            if self._share is not None:
                self._share.close()

    async def send_json(self, payload: dict[str, Any]) -> None:
        metrics.count_error_message(payload)  # ops: omniweb_errors_total for every `error` sent
        await self.send(text_data=dumps(payload))  # strict JSON: never NaN/Infinity


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
