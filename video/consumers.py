"""Transport for ``/v1/video/chat/stream``: the video wire format over the conversation core.

This consumer is an adapter: it owns the socket and the session's lifetime (config and idle
timeouts, closing), decodes the wire messages and hands them, in order, to the session's
``VideoSession`` (video/session.py: the wire state over the core's ``Conversation``, frame acks, the
VAD), whose turns write their answers through an ``Answer`` (video/answers.py).

``receive`` is the socket's single reader (Channels dispatches one message at a time). It checks the
first ``session.config`` itself, then parses each later message and puts it on the session's bounded
inbox (the core's ``Inbox``). Its one processor task takes the inbox in order, with one handler per
message type, so frames, audio and queries keep their arrival order while the reader stays free.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from omniweb.base import budget as process_budget
from omniweb.base.errors import ErrorKind
from omniweb.base.protocol import excerpt
from omniweb.base.tasks import spawn
from omniweb.conversation import (
    BufferedFrame,
    ConversationState,
    Inbox,
    InboxFull,
    InboxLimits,
    now_ms,  # the server clock of every *_ts_ms field: monotonic milliseconds, as in the seed
)
from omniweb.conversation.clock import SessionClock
from omniweb.engine.client import EngineClient
from omniweb.engine.runtime import get_engine_client
from omniweb.engine.voice import voice
from omniweb.web.sessions import SessionConsumer

from . import protocol
from .protocol import ProtocolError, VideoSessionConfig
from .session import RECEIVED_MS, VideoSession

logger = logging.getLogger(__name__)

LARGE_MESSAGE = 1024 * 1024  # parse messages above this size off the event loop
INBOX_FULL = "Too many messages queued: the session cannot keep up; session closed"

SessionState = ConversationState  # the session's states are the core's


@dataclass(frozen=True)
class _DecodeFailed:
    """The decoder's report to the processor; a Python object, so no client can forge it."""

    frame: BufferedFrame


_Item = dict[str, Any] | _DecodeFailed


def _is_audio_chunk(item: _Item | None) -> bool:
    return isinstance(item, dict) and item.get("type") == "audio.chunk"


class VideoStreamConsumer(SessionConsumer):
    async def connect(self) -> None:
        self.config: VideoSessionConfig | None = None  # SessionConsumer.reject: fatal until it is set
        self.session: VideoSession | None = None
        # All sessions together (omniweb/base/budget.py); one message at a time always passes, so a client
        # that waits for its acks meets the budget as refused frames, a flooding one as a close.
        self.inbox: Inbox[_Item] = Inbox(
            self._handle,
            InboxLimits(
                max_messages=protocol.MAX_QUEUED_MESSAGES,
                max_bytes=protocol.MAX_QUEUED_BYTES,
                full_message=INBOX_FULL,
                budget_message=process_budget.INBOX_FULL_MESSAGE,
            ),
            hold=lambda queued, alone: self.budget_share.hold("inbox", queued, force=alone),
            gate=lambda: self.state is not SessionState.CLOSED,
        )
        self.tasks: list[asyncio.Task[None]] = []
        # First use may load the models: off the event loop, and before the handshake so the config
        # clock only starts once the session can be served.
        engine: EngineClient = await asyncio.to_thread(get_engine_client)
        self.session = VideoSession(
            engine,
            self.send_json,
            stopped=lambda: self.send_stalled or self.client_gone,
            report_decode_failure=lambda frame: self.inbox.post(_DecodeFailed(frame)),
            on_idle=self._on_turn_idle,
        )
        self.caps = voice().capabilities()
        self.clock: SessionClock | None = SessionClock(
            config_timeout=settings.VIDEO_CONFIG_TIMEOUT,
            idle_timeout=settings.VIDEO_IDLE_TIMEOUT,
            configured=lambda: self.config is not None,
            # no idle timeout while a turn streams or the session finishes
            paused=lambda: self.state in (SessionState.ANSWERING, SessionState.FINISHING),
            closed=lambda: self.state is SessionState.CLOSED,
            on_timeout=self.on_timeout,
        )
        await self.accept()
        self.tasks.append(spawn(self.clock.run(), "video session clock"))
        self.handlers: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {
            "video.frame": self.session.on_video_frame,
            "audio.chunk": self.session.on_audio_chunk,
            "video.query": self.session.on_video_query,
            "video.done": self.on_video_done,
            "ping": self.on_ping,
        }

    @property
    def _live(self) -> VideoSession:
        """The session, set in connect; None only once released, after which no handler runs."""
        assert self.session is not None
        return self.session

    @property
    def state(self) -> ConversationState:
        session = getattr(self, "session", None)
        return session.conversation.state if session is not None else SessionState.CLOSED

    async def disconnect(self, code: int) -> None:
        await self._shutdown()
        self._release()
        logger.info("video session closed (code %s)", code)

    def _release(self) -> None:
        """Drop the references that make the session a cycle (clock and handler closures, the core's
        callbacks, tasks), so a closed session is freed at once, not at the cyclic collector's leisure."""
        for name in ("tasks", "handlers"):
            with contextlib.suppress(AttributeError):  # connect may have failed before setting it
                getattr(self, name).clear()
        with contextlib.suppress(AttributeError):
            self.inbox.close()  # held messages, and its callbacks (closures over the session)
        self.clock = None
        self.session = None

    def _on_turn_idle(self) -> None:
        if self.clock is not None:
            self.clock.touch()  # the idle clock restarts when the turn ends

    # -- the single reader -------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        received_ms = now_ms()
        assert self.clock is not None  # set in connect; None only once released, after the last receive
        self.clock.touch()
        if self.state in (SessionState.CLOSED, SessionState.FINISHING):
            return  # nothing after video.done is read, as in the seed
        if text_data is None:
            await self.reject("Binary messages are not accepted; send JSON text messages")
            return
        if self.state is SessionState.AWAITING_CONFIG:
            await self.on_session_config(text_data)
            return
        try:
            if len(text_data) > LARGE_MESSAGE:
                msg = await asyncio.to_thread(protocol.parse_message, text_data)
            else:
                msg = protocol.parse_message(text_data)
        except ProtocolError as exc:
            await self.send_json(protocol.error(exc.message))
            return
        if msg.get("type") == "video.frame":
            msg[RECEIVED_MS] = received_ms
        try:
            await self.inbox.deliver(msg, len(text_data))
        except InboxFull as full:
            await self.fail(full.message, full.kind)
            return
        if msg.get("type") == "video.done":
            self._live.conversation.finish()  # nothing after it is read

    async def on_session_config(self, text_data: str) -> None:
        try:
            config = protocol.parse_config(text_data, self.caps)
        except ProtocolError as exc:
            await self.fail(exc.message)
            return
        self.config = config
        self._live.configure(config)
        self.tasks.append(spawn(self.inbox.run(), "video session processor"))

    # -- the processor: one handler per message type -----------------------------------------------
    async def _handle(self, item: _Item) -> None:
        """One message of the inbox. Audio waits to be heard while more ``audio.chunk``s are queued
        behind it, so the server VAD hears a run of them in one engine call instead of one round
        trip each (a client that sends faster than real time, or any client while the engine is busy)."""
        if isinstance(item, _DecodeFailed):
            await self._live.decode_failed(item.frame)
            return
        msg_type = item.get("type")
        handler = self.handlers.get(msg_type) if isinstance(msg_type, str) else None
        if handler is None:
            await self.send_json(protocol.error(f"Unknown type: {excerpt(msg_type)}"))
            return
        await handler(item)
        if not _is_audio_chunk(self.inbox.peek()):
            await self._live.listen()

    async def on_video_done(self, msg: dict[str, Any]) -> None:
        await self._live.conversation.wait()
        await self.send_json(protocol.session_done())
        await self._close_session()

    async def on_ping(self, msg: dict[str, Any]) -> None:
        await self.send_json(protocol.pong())

    # -- errors, timeouts, shutdown ----------------------------------------------------------------
    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        await self.send_json(protocol.error(message, kind))
        await self._close_session()

    async def _close_session(self) -> None:
        if self.state is SessionState.CLOSED:
            return
        await self._shutdown()
        await self.close()

    async def _shutdown(self) -> None:
        """Stop every task of the session (the active turn's engine request is aborted)."""
        current = asyncio.current_task()
        tasks = [t for t in getattr(self, "tasks", []) if t is not current]
        for task in tasks:
            if not task.done():
                task.cancel()
        session = getattr(self, "session", None)
        if session is not None:
            await session.conversation.close()  # the state is CLOSED before the cancelled tasks run again
        await asyncio.gather(*tasks, return_exceptions=True)

    async def on_timeout(self, awaiting_config: bool) -> None:
        await self.fail("Timeout waiting for session.config" if awaiting_config else "Idle timeout", ErrorKind.TIMEOUT)
