"""One Realtime session, whatever carries it: the client's events in, the server's events out.

A ``RealtimeSession`` is what the WebSocket consumer (``consumer``) and a WebRTC call (``calls`` /
``webrtc``) share: the effective session, the inbox and its one processor, the session's parts
(``opening``, ``conversation_items``, ``input_audio``, ``responding``), the idle clock and the
shutdown. What differs is the ``Transport`` under it: how an event reaches the client, whether the
client can still be reached, how the connection ends; and, over WebRTC, where the answer's audio
goes (an ``AnswerAudio``: the call's outgoing track, instead of ``response.output_audio.delta``) and
where the input audio comes from (``hear``: the call's incoming track, instead of
``input_audio_buffer.append``).

Each client message is parsed by ``events`` into a typed event and put on the inbox; its processor
hands each, in arrival order, to its handler. A refused event is answered with an ``error`` event
(its ``event_id`` echoed) and the session goes on. A ``response.cancel`` also stops the running
response as soon as it is read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from django.conf import settings

from omniweb.base import metrics
from omniweb.base.errors import ErrorKind
from omniweb.base.protocol import dumps
from omniweb.base.tasks import spawn
from omniweb.conversation import BufferedFrame, Inbox, InboxLimits
from omniweb.conversation.clock import SessionClock
from omniweb.conversation.transcription import segment_texts
from omniweb.engine.client import EngineClient

from . import events, server_events
from .audio import to_engine_rate
from .conversation_items import ConversationItems, for_event
from .errors import RealtimeError, error_event, new_id
from .input_audio import IdleTimedOut, InputAudio, Transcriber
from .opening import new_core, new_listener
from .responding import AnswerAudio, Responses
from .session import AnySession, Session, update_session

logger = logging.getLogger(__name__)

LARGE_MESSAGE = 1024 * 1024  # parse events above this size off the event loop
# Events read, not yet handled: past these the reader waits (the socket paces the client), so a
# response.cancel behind a long run of appends waits at most this much.
INBOX_LIMITS = InboxLimits(max_messages=256, max_bytes=64 * 1024 * 1024, wait=True)


class Transport(Protocol):
    """What carries a session: its events to the client, and the connection's end."""

    async def send_text(self, text: str) -> None:
        """One server event (JSON text) to the client."""

    @property
    def gone(self) -> bool:
        """Nothing more can reach the client (it left, or stopped reading): a running turn stops."""

    async def close(self) -> None:
        """End the connection (after a fatal error was sent)."""


@dataclass(frozen=True)
class HeardAudio:
    """Input audio from a media track (PCM16 24 kHz), in order with the client's events."""

    pcm: bytes
    type: ClassVar[Literal["track.audio"]] = "track.audio"


Inboxed = events.ClientEvent | HeardAudio | IdleTimedOut | RealtimeError


class RealtimeSession:
    """One session over ``transport``: ``start`` it, hand it every client message (``receive``)
    and, over WebRTC, the incoming track's audio (``hear``), ``shutdown`` it when the connection
    ends. ``output``: where answers' audio plays (None: as ``response.output_audio.delta``); with
    one the client may also send the event only a media connection takes
    (``output_audio_buffer.clear``)."""

    def __init__(
        self,
        transport: Transport,
        engine: EngineClient,
        config: AnySession,
        *,
        voices: Mapping[str, str],
        output: AnswerAudio | None = None,
    ) -> None:
        self.transport = transport
        self.engine = engine
        self.voices = voices
        self.output = output
        # Tools and a token limit need a language model behind the thinker (OMNIWEB_THINKER=llm).
        self.language_model = settings.THINKER.strip().lower() == "llm"
        self.config = config
        self.tasks: list[asyncio.Task[Any]] = []
        self.closed = False
        # Events in arrival order (a refusal of one that did not parse keeps its place); one
        # processor handles them, so the reader stays free to stop a response at once.
        self.inbox: Inbox[Inboxed] = Inbox(self._handle, INBOX_LIMITS, gate=lambda: not self.closed)
        self.core = new_core(self.engine, on_idle=self._touch, on_decode_failed=self._decode_failed)
        assert self.core.frames is not None
        self.listener = new_listener(self.core, self._listened)
        self.transcriber = Transcriber(self.send_event, self._session, self._transcript_of, self._spawn)
        self.items = ConversationItems(
            self.send_event,
            self.core.frames,
            transcribe=self.transcriber.start,
            stop_writing=lambda item_id: self.responses.stop_writing(item_id),
            input_format=lambda: self.config.audio.input.format.type,
        )
        self.responses = Responses(
            self.core,
            self.items,
            self.send_event,
            self.refuse,
            session=self._session,
            voices=self.voices,
            transcribed=self.transcriber.transcribed,
            stopped=lambda: transport.gone,
            on_idle=self._touch,
            output=output,
        )
        self.input = InputAudio(
            self.send_event,
            self.listener,
            self.items,
            self.transcriber,
            self.responses,
            session=self._session,
            engine=self.engine,
            output=output,
            post=self.inbox.post,  # the idle timeout's report, in order with the events
        )
        self.input.configure_vad()
        self.handlers: dict[str, Callable[[Any], Awaitable[None]]] = {
            "session.update": self.on_session_update,
            "input_audio_buffer.append": self.input.on_append,
            "input_audio_buffer.commit": self.input.on_commit,
            "input_audio_buffer.clear": self.input.on_clear,
            "conversation.item.create": self.items.on_create,
            "conversation.item.delete": self.items.on_delete,
            "conversation.item.retrieve": self.items.on_retrieve,
            "conversation.item.truncate": self.items.on_truncate,
            "response.create": self.responses.on_create,
            "response.cancel": self.responses.on_cancel,
            HeardAudio.type: self._on_heard,
            IdleTimedOut.type: self.input.on_idle_timeout,
        }
        if output is not None:
            self.handlers["output_audio_buffer.clear"] = self.responses.on_output_clear
        self.clock: SessionClock | None = SessionClock(
            config_timeout=settings.VIDEO_IDLE_TIMEOUT,
            idle_timeout=settings.VIDEO_IDLE_TIMEOUT,
            configured=lambda: True,
            paused=lambda: self.responses.running is not None,  # no idle timeout while a response streams
            closed=lambda: self.closed,
            on_timeout=self.on_timeout,
        )
        self._overflowing = False  # the track's audio found the input buffer full (said once)

    async def start(self) -> None:
        """The session runs: its clock and inbox, then ``session.created``."""
        assert self.clock is not None
        self._spawn(self.clock.run(), "realtime session clock")
        self._spawn(self.inbox.run(), "realtime session inbox")
        await self.send_event(server_events.session_created(self.config))

    def _session(self) -> AnySession:
        """The effective session, as the parts read it (``session.update`` replaces it)."""
        return self.config

    def _spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> None:
        """A task of the session (cancelled at its end); finished ones are forgotten."""
        self.tasks = [t for t in self.tasks if not t.done()]
        self.tasks.append(spawn(coro, what))

    def _touch(self) -> None:
        if self.clock is not None:
            self.clock.touch()

    def _decode_failed(self, frame: BufferedFrame) -> None:
        """An image the decode pool rejected: reported as an error, the session goes on."""
        if (err := self.items.decode_failed(frame)) is not None:
            self._spawn(self.refuse(err), "realtime decode report")

    # -- sending -----------------------------------------------------------------------------------
    async def send_event(self, payload: dict[str, Any]) -> None:
        if not self.closed:
            await self.transport.send_text(dumps(payload))

    async def refuse(self, err: RealtimeError, kind: ErrorKind | None = None) -> None:
        if kind is None:
            kind = ErrorKind.ENGINE if err.type == "server_error" else ErrorKind.CLIENT
        metrics.count_error(kind.value)
        await self.send_event(error_event(err))

    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        """A fatal problem (the client stopped reading, the idle timeout): error, then close."""
        metrics.count_error(kind.value)
        err_type = "invalid_request_error" if kind in (ErrorKind.CLIENT, ErrorKind.TIMEOUT) else "server_error"
        await self.send_event(error_event(RealtimeError(message, code=kind.value, type=err_type)))
        await self.shutdown()
        await self.transport.close()

    async def on_timeout(self, awaiting_config: bool) -> None:
        await self.fail("Idle timeout: no event from the client; session closed", ErrorKind.TIMEOUT)

    # -- the single reader -------------------------------------------------------------------------
    async def receive(self, raw: str | bytes) -> None:
        """One client message: parsed, then queued in order (a cancel also stops the response now)."""
        if self.closed:
            return
        self._touch()
        item: events.ClientEvent | RealtimeError
        media = self.output is not None
        try:
            if len(raw) > LARGE_MESSAGE:
                item = await asyncio.to_thread(
                    events.parse_event, raw, voices=self.voices, language_model=self.language_model, media=media
                )
            else:
                item = events.parse_event(raw, voices=self.voices, language_model=self.language_model, media=media)
        except RealtimeError as err:
            item = err
        if not isinstance(item, RealtimeError) and item.type == "response.cancel":
            await self._stop_generating()
        await self.inbox.deliver(item, len(raw))

    async def hear(self, pcm: bytes) -> None:
        """Input audio from the call's track (PCM16 24 kHz), queued in order with the events."""
        if self.closed:
            return
        self._touch()
        await self.inbox.deliver(HeardAudio(pcm), len(pcm))

    async def _stop_generating(self) -> None:
        """A ``response.cancel`` overtakes the events queued before it: the running response's
        engine request is aborted now and it emits nothing more; the cancel is then answered in
        order (``response.done`` cancelled). Not when a ``response.create`` waits before it: that
        one must still find this response running, as it would have."""
        if not any(isinstance(queued, events.ResponseCreateEvent) for queued in self.inbox):
            await self.responses.interrupt()

    async def _handle(self, item: Inboxed) -> None:
        """One event from the inbox: its handler, or its refusal (an error event, the session goes on)."""
        try:
            if isinstance(item, RealtimeError):
                raise item
            await self.handlers[item.type](item)
        except RealtimeError as err:
            await self.refuse(err)
        except Exception:  # a bug or an engine failure in one handler: report it, keep the session
            logger.exception("realtime event handler failed")
            failure = RealtimeError("The server could not handle the event", code="server_error", type="server_error")
            await self.refuse(failure, ErrorKind.ENGINE)

    async def _on_heard(self, heard: HeardAudio) -> None:
        """The track's audio through the input audio buffer and the VAD. A full buffer (no turn
        detection, nothing committed) is said once, not for every 20 ms that follows."""
        try:
            await self.input.feed(heard.pcm)
        except RealtimeError as err:
            if err.code != "input_audio_buffer_overflow":
                raise
            if not self._overflowing:
                self._overflowing = True
                raise
            return
        self._overflowing = False

    async def on_session_update(self, event: events.SessionUpdateEvent) -> None:
        with for_event(event.event_id):
            session = update_session(self.config, event.session, self.voices, language_model=self.language_model)
        before = self.config.turn_detection
        first = isinstance(session, Session) and session.instructions and not getattr(self.config, "instructions", "")
        if first and not self.language_model:  # said once a session, when they first arrive
            logger.info("realtime session %s: instructions accepted, not applied by the scene thinker", session.id)
        self.config = session
        if session.turn_detection != before:
            self.input.configure_vad()
        await self.send_event(server_events.session_updated(session))

    # -- transcription on the engine ---------------------------------------------------------------
    async def _listened(self, pcm24: bytes, *, prefix: str | None, partial: bool) -> list[str] | None:
        """The listener's transcriptions: early ones (at a silence in the speech) and, with
        transcription on, the streaming partials (batch priority: they wait for real-time work)."""
        if partial and self.config.audio.input.transcription is None:
            return None  # nobody reads the deltas
        return await self._transcript_of(pcm24, new_id("asr"), prefix=prefix, partial=partial)

    async def _transcript_of(
        self, pcm24: bytes, request_id: str, *, prefix: str | None = None, partial: bool = False
    ) -> list[str] | None:
        """Whisper's segment texts, on the engine (``audio.transcribe``, the model
        /v1/audio/transcriptions uses); None when the engine refused or failed."""
        transcription = self.config.audio.input.transcription
        return await segment_texts(
            self.engine,
            to_engine_rate(pcm24),
            request_id,
            prompt=transcription.prompt if transcription is not None else None,
            prefix=prefix,
            partial=partial,
            admit_budget=settings.ENGINE_TURN_ADMIT_BUDGET_MS / 1000.0,
        )

    # -- shutdown ----------------------------------------------------------------------------------
    async def shutdown(self) -> None:
        """The session ends: its response, listener, core and tasks stop; its items' audio goes back."""
        if self.closed:
            return
        self.closed = True
        self.responses.running = None
        self.inbox.clear()  # a reader waiting for room goes on (and its event is dropped)
        self.listener.close()
        self.input.close()
        await self.core.close()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in self.tasks if t is not current), return_exceptions=True)
        self.tasks.clear()
        self.items.close()
        self.handlers.clear()
        self.clock = None
