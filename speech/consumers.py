"""Transport for ``/v1/audio/speech/stream``: the speech wire format over the conversation core.

This consumer is an adapter: it owns the socket and the session's lifetime (config and idle
timeouts, closing, the send budget), decodes the wire messages and hands them, in order, to the
session's ``SpeechSession`` (speech/session.py: the wire state over the core's ``Conversation``, one
handler per message type), whose utterances write their audio through an ``Utterance``
(speech/utterances.py).

``receive`` is the socket's single reader (Channels dispatches one message at a time). It hands each
message to the session's ``Inbox`` (the core's), which handles it at once while nothing is held and
holds it once the utterance is flushed (ANSWERING), so the reader keeps listening: ``input.cancel``
(and disconnecting, and closing) stop the utterance through the core's one interrupt, between two
engine steps (an urgent message, overtaking what is queued), and any other message that arrives
after the flush waits in the inbox, in order, and is handled once the utterance is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from django.conf import settings

from omniweb.base import budget
from omniweb.base.errors import ErrorKind
from omniweb.base.tasks import spawn
from omniweb.conversation import ConversationState, Inbox, InboxFull, InboxLimits
from omniweb.conversation.clock import SessionClock
from omniweb.engine.client import EngineClient
from omniweb.engine.runtime import get_engine_client
from omniweb.web.sessions import SessionConsumer

from . import protocol
from .protocol import ProtocolError, SessionConfig
from .session import SpeechSession

logger = logging.getLogger(__name__)

# Messages held while an utterance plays; a flood beyond this ends the session.
HELD_LIMITS = InboxLimits(
    max_messages=1024,
    max_bytes=8 * 1024 * 1024,
    full_message="Too many messages queued while audio is being generated",
    budget_message=budget.HELD_FULL_MESSAGE,
)

SessionState = ConversationState  # the session's states are the core's (speech/session.py)


class SpeechStreamConsumer(SessionConsumer):
    async def connect(self) -> None:
        self.session: SpeechSession | None = None
        # The reader handles a message itself while nothing is held; after the flush (ANSWERING)
        # messages wait here and the processor handles them once the utterance is over.
        self.inbox: Inbox[tuple[str | None, bytes | None]] = Inbox(
            lambda item: self.handle(*item),
            HELD_LIMITS,
            hold=lambda held, _alone: self.budget_share.hold("held messages", held),
            gate=lambda: self.state not in (SessionState.ANSWERING, SessionState.CLOSED),
            inline=True,
        )
        # First use may load the model: keep that off the event loop, and before the handshake so
        # the config clock only starts once the session can be served.
        engine: EngineClient = await asyncio.to_thread(get_engine_client)
        self.session = SpeechSession(
            engine,
            self._send_wire,
            share=self.budget_share,
            stopped=lambda: self.send_stalled or self.client_gone,  # leaving aborts the request
            fail=self.fail,
            end=self.close,
            touch=self._touch,
            resume=self._utterance_over,
        )
        self.clock: SessionClock | None = SessionClock(
            config_timeout=settings.SPEECH_CONFIG_TIMEOUT,
            idle_timeout=settings.SPEECH_IDLE_TIMEOUT,
            configured=lambda: self.config is not None,
            paused=lambda: self.session is not None and self.session.streaming,  # an utterance streams
            closed=lambda: self.state is SessionState.CLOSED,
            on_timeout=self.on_timeout,
        )
        await self.accept()
        self.watchdog: asyncio.Task[None] | None = spawn(self.clock.run(), "speech session clock")
        self.processor: asyncio.Task[None] | None = spawn(self.inbox.run(), "speech session inbox")

    @property
    def state(self) -> ConversationState:
        """The session's state is the core's (CLOSED before the core exists and once it is released)."""
        return self.session.state if self.session is not None else SessionState.CLOSED

    @property
    def config(self) -> SessionConfig | None:  # SessionConsumer.reject: fatal until it is set
        return self.session.config if self.session is not None else None

    async def disconnect(self, code: int) -> None:
        watchdog = getattr(self, "watchdog", None)
        if watchdog is not None and not watchdog.done():
            watchdog.cancel()
        if self.session is not None:
            # The core's interrupt: the engine request is aborted, the utterance's task cancelled.
            await self.session.conversation.close()
        task = getattr(self, "processor", None)  # it may be handling held messages
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._release()
        logger.info("speech session closed (code %s)", code)

    def _release(self) -> None:
        """Drop buffered text, held messages and the references that make the session a cycle
        (clock and callback closures, tasks), so a closed session is freed without the cyclic GC."""
        with contextlib.suppress(AttributeError):  # connect may have failed before setting it
            self.inbox.close()  # held messages, and its callbacks (closures over the session)
        if self.session is not None:
            self.session.release()
        self.session = None
        self.processor = None
        self.watchdog = None
        self.clock = None

    def _touch(self) -> None:
        if self.clock is not None:
            self.clock.touch()

    def _utterance_over(self) -> None:
        assert self.clock is not None  # an utterance of a released session never gets here (its session drops it)
        self.clock.touch()  # the idle clock restarts when the utterance ends
        self.inbox.reopen()  # the messages held meanwhile, in order

    # -- the single reader -------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        assert self.clock is not None  # set in connect; None only once released, after the last receive
        self.clock.touch()
        if self.state is SessionState.CLOSED:
            return
        speaking = self.state in (SessionState.ANSWERING, SessionState.SPEAKING)
        urgent = speaking and text_data is not None and _is_cancel(text_data)  # overtakes what is held
        try:
            size = len(text_data if text_data is not None else bytes_data or b"")
            await self.inbox.deliver((text_data, bytes_data), size, urgent=urgent)
        except InboxFull as full:
            await self.fail(full.message, full.kind)

    async def handle(self, text_data: str | None, bytes_data: bytes | None) -> None:
        if text_data is None:
            await self.reject("Binary messages are not accepted on this endpoint; send JSON text messages")
            return
        try:
            msg = protocol.parse_message(text_data)
        except ProtocolError as exc:
            await self.reject(exc.message)
            return
        assert self.session is not None
        await self.session.handle(msg)

    async def _send_wire(self, payload: dict[str, Any] | bytes) -> None:
        """The session's way out: a JSON message, or a binary frame (audio, a file, a codec packet)."""
        if isinstance(payload, bytes):
            await self.send(bytes_data=payload)
        else:
            await self.send_json(payload)

    # -- errors and timeouts -----------------------------------------------------------------------
    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        await self.send_json(protocol.error(message, kind=kind))
        if self.session is not None:
            await self.session.conversation.close()  # CLOSED; the utterance (unless it is the caller) is interrupted
        await self.close()

    async def on_timeout(self, awaiting_config: bool) -> None:
        await self.fail(
            "Timeout waiting for session.config" if awaiting_config else "Idle timeout: no message received",
            ErrorKind.TIMEOUT,
        )


def _is_cancel(raw: str) -> bool:
    """Peek at a message that arrived mid-generation: only input.cancel acts at once."""
    if len(raw) > protocol.MAX_OTHER_MESSAGE_SIZE:
        return False
    try:
        msg = protocol.parse_message(raw)
    except ProtocolError:
        return False  # handled (and reported) in arrival order with the held messages
    return msg.get("type") == "input.cancel"
