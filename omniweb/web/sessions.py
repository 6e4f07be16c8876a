"""What every WebSocket session's consumer shares (Channels): JSON out, refusals, the stall check.

The session clock lives in the conversation core (``omniweb.conversation.clock``), ``spawn`` in
``omniweb.base.tasks``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from autobahn.exception import Disconnected
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from omniweb.base import budget, metrics
from omniweb.base.errors import ErrorKind
from omniweb.base.protocol import dumps, error
from omniweb.web.transport import SCOPE_KEY, SendWatch

logger = logging.getLogger(__name__)


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
        what daphne then holds for the client against the process-wide budget (omniweb/base/budget.py).

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
        """What this session holds in the process-wide budget (omniweb/base/budget.py), freed at disconnect."""
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
