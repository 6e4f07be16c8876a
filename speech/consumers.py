"""Transport for ``/v1/audio/speech/stream``: the speech wire format over the conversation core.

This consumer is an adapter: it parses the wire messages into calls on the session's
``omniweb.conversation.Conversation`` (its state machine, and the one turn that may run) and writes
the core's typed events back as the endpoint's messages. An utterance is the core's ``SpeechTurn``
(one engine request per batch of pieces, paced, the noise generator carried across requests), run
as the session's turn, so the reader keeps listening: ``input.cancel`` (and disconnecting, and
closing) stop it through the core's one interrupt, between two engine steps (an urgent message of
the session's inbox, overtaking what is queued), and any other message that arrives after the flush
waits in the inbox, in order, and is handled once the utterance is done. What is
wire-specific is one utterance's writer (``speech/utterances.py``): WAV or PCM or timestamped
chunks, codec framing, the reference's message order, how the engine's sentences map onto the
client's.

The shape of an utterance on the wire follows ``split_granularity``. ``none`` (the default, as the
reference) makes the flush one sentence: one ``audio.start``, the audio, one ``audio.done``, while
the engine still synthesizes it sentence by sentence, so first audio does not wait for the whole
text. ``sentence`` and ``clause`` send each piece as its own sentence and start speaking a piece as
soon as its text is complete, before ``input.done`` (the utterance then runs as one engine request
per batch of completed pieces, with the noise generator carried from one request to the next).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from django.conf import settings

from omniweb.base import budget  # metrics: ops instrumentation (time to first audio)
from omniweb.base.errors import ErrorKind
from omniweb.base.protocol import excerpt
from omniweb.base.tasks import spawn
from omniweb.conversation import (
    Conversation,
    ConversationState,
    Inbox,
    InboxFull,
    InboxLimits,
    SpeechTurn,
)
from omniweb.conversation.clock import SessionClock
from omniweb.engine.client import EngineClient
from omniweb.engine.requests import SpeakRequest
from omniweb.engine.runtime import get_engine_client
from omniweb.web.sessions import SessionConsumer

from . import protocol
from .codec.loops import CODEC_PIPELINE, shared_codec
from .codec.model import CodecTableError
from .protocol import ProtocolError, SessionConfig
from .tts.loops import PIPELINE
from .tts.model import capabilities
from .tts.text import split_text
from .utterances import Utterance

logger = logging.getLogger(__name__)

# Messages held while an utterance plays; a flood beyond this ends the session.
HELD_LIMITS = InboxLimits(
    max_messages=1024,
    max_bytes=8 * 1024 * 1024,
    full_message="Too many messages queued while audio is being generated",
    budget_message=budget.HELD_FULL_MESSAGE,
)


# The session's states are the core's: READY (configured; buffering text or idle), SPEAKING
# (sentence/clause: completed pieces are spoken while the client still writes), ANSWERING (flushed:
# the rest of the utterance is synthesized and streamed), AWAITING_CONFIG and CLOSED.
SessionState = ConversationState


class SpeechStreamConsumer(SessionConsumer):
    async def connect(self) -> None:
        self.conversation: Conversation | None = None
        self.config: SessionConfig | None = None
        self.text_parts: list[str] = []
        self.text_chars = 0
        self.utterance_index = 0
        self.utterance: Utterance | None = None
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
        self.engine: EngineClient = await asyncio.to_thread(get_engine_client)
        self.conversation = Conversation(self.engine)
        self.caps = capabilities()
        self.clock = SessionClock(
            config_timeout=settings.SPEECH_CONFIG_TIMEOUT,
            idle_timeout=settings.SPEECH_IDLE_TIMEOUT,
            configured=lambda: self.config is not None,
            paused=self._streaming,  # an utterance streams
            closed=lambda: self.state is SessionState.CLOSED,
            on_timeout=self.on_timeout,
        )
        await self.accept()
        self.watchdog = spawn(self.clock.run(), "speech session clock")
        self.processor = spawn(self.inbox.run(), "speech session inbox")
        self.handlers: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {
            "input.text": self.on_input_text,
            "input.done": self.on_input_done,
            "input.cancel": self.on_input_cancel,
            "session.close": self.on_session_close,
        }

    @property
    def state(self) -> ConversationState:
        """The session's state is the core's (CLOSED before the core exists and once it is released)."""
        return self.conversation.state if self.conversation is not None else SessionState.CLOSED

    def _streaming(self) -> bool:
        """No idle timeout while audio is made for the client (it has nothing to say meanwhile)."""
        if self.state is SessionState.ANSWERING:
            return True
        utt = self.utterance
        return self.state is SessionState.SPEAKING and utt is not None and utt.speech.streaming

    async def disconnect(self, code: int) -> None:
        watchdog = getattr(self, "watchdog", None)
        if watchdog is not None and not watchdog.done():
            watchdog.cancel()
        if self.conversation is not None:
            # The core's interrupt: the engine request is aborted, the utterance's task cancelled.
            await self.conversation.close()
        task = getattr(self, "processor", None)  # it may be handling held messages
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._release()
        logger.info("speech session closed (code %s)", code)

    def _release(self) -> None:
        """Drop buffered text, held messages and the references that make the session a cycle
        (clock and handler closures, tasks), so a closed session is freed without the cyclic GC."""
        for name in ("text_parts", "handlers"):
            with contextlib.suppress(AttributeError):  # connect may have failed before setting it
                getattr(self, name).clear()
        with contextlib.suppress(AttributeError):
            self.inbox.close()  # held messages, and its callbacks (closures over the session)
        self.utterance = None
        self.processor = None
        self.watchdog = None
        self.clock = None
        self.conversation = None

    # -- the single reader -------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
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
        msg_type = msg.get("type")
        if msg_type == "session.config":
            await self.on_session_config(msg)
        elif self.config is None:
            await self.fail(f"Expected session.config, got: {excerpt(msg_type)}")
        elif isinstance(msg_type, str) and msg_type in self.handlers:
            await self.handlers[msg_type](msg)
        else:
            await self.send_json(protocol.error(f"Unknown message type: {excerpt(msg_type)}"))

    # -- handlers, one per message type ------------------------------------------------------------
    async def on_session_config(self, msg: dict[str, Any]) -> None:
        if self.text_parts or self.state is SessionState.SPEAKING:
            await self.send_json(
                protocol.error("session.config cannot be applied while input is buffered; send input.done first")
            )
            return
        try:
            config = protocol.build_config(msg, self.caps)
        except ProtocolError as exc:
            await self.reject(exc.message)  # fatal only for the first config; else the old one stays
            return
        self.config = config
        self.conversation.configure()  # READY: the speech endpoint buffers no frames or audio

    async def on_input_text(self, msg: dict[str, Any]) -> None:
        text = msg.get("text", "")
        if not isinstance(text, str):
            await self.send_json(protocol.error("input.text requires a string value"))
            return
        if self.text_chars + len(text) > settings.SPEECH_MAX_TEXT_CHARS:
            await self.send_json(
                protocol.error(
                    f"Buffered text would exceed {settings.SPEECH_MAX_TEXT_CHARS} characters; "
                    "send input.done to flush first"
                )
            )
            return
        if not self.budget_share.hold("text", self.text_chars + len(text)):  # all sessions together
            await self.send_json(protocol.error(budget.TEXT_FULL_MESSAGE, kind=ErrorKind.CAPACITY))
            return
        self.text_parts.append(text)
        self.text_chars += len(text)
        assert self.config is not None
        if self.config.split_granularity != "none":
            await self._speak_completed(self.config)

    async def _speak_completed(self, config: SessionConfig) -> None:
        """Hand every piece whose text is complete to the utterance, starting it if need be.

        A piece is complete once text follows it that the splitter cuts before (a sentence end is
        only known when the next word has begun: "Dr. Smith" is one sentence). The last piece stays
        buffered until more text comes or ``input.done`` flushes it.
        """
        buffered = "".join(self.text_parts)
        pieces = split_text(buffered, config.split_granularity)
        if len(pieces) < 2:
            return
        cut = buffered.rfind(pieces[-1])
        if cut < 0:  # the last piece was rejoined by the splitter: wait for more text
            return
        complete = pieces[:-1]
        if self.utterance is None:
            codec, problem, _ = await self._flush_plan(config)
            if problem is not None:  # reported at input.done, as for a plain flush
                return
            self.text_parts = [buffered[cut:]]
            self.start_utterance(complete, config, codec, input_done=False)
            return
        self.text_parts = [buffered[cut:]]
        self.utterance.speech.add(complete)
        self.utterance.text = f"{self.utterance.text} {' '.join(complete)}"

    async def on_input_done(self, msg: dict[str, Any]) -> None:
        assert self.config is not None
        text = "".join(self.text_parts).strip()
        self.text_parts.clear()
        self.text_chars = 0
        self.budget_share.hold("text", 0)
        config = self.config
        utt = self.utterance
        if utt is not None:  # speaking before the flush: the rest joins the utterance
            pieces = split_text(text, config.split_granularity)
            utt.speech.finish(pieces)
            if pieces:
                utt.text = f"{utt.text} {' '.join(pieces)}"
            self.conversation.input_closed()
            return
        if text:
            codec, problem, kind = await self._flush_plan(config)
            if problem is None:
                pieces = [text] if config.split_granularity == "none" else split_text(text, config.split_granularity)
                self.start_utterance(pieces, config, codec)
                return
            await self.send_json(protocol.error(problem, kind=kind))
        await self.send_json(protocol.session_done(self.utterance_index, 0))
        self.utterance_index += 1

    async def _flush_plan(self, config: SessionConfig) -> tuple[dict[str, Any] | None, str | None, ErrorKind]:
        """The codec spec for codec_tokens output (else None), why the flush cannot run (else None),
        and whose fault that is: a codec mode refused because the codec could not be loaded is the
        server's failure."""
        uses_codec = config.output_mode == "codec_tokens" or config.vocoder == "codec"
        spec = await self._codec_spec() if uses_codec else None
        problem = protocol.flush_precondition_error(config, codec_ready=spec is not None)
        kind = ErrorKind.ENGINE if uses_codec and spec is None else ErrorKind.CLIENT
        return (spec if config.output_mode == "codec_tokens" else None), problem, kind

    async def on_input_cancel(self, msg: dict[str, Any]) -> None:
        if self.utterance is not None:  # while speaking (urgent) or held and handled while speaking
            await self.cancel_utterance()
            return
        self.text_parts.clear()
        self.text_chars = 0
        await self.send_json(protocol.input_cancelled(self.utterance_index))

    async def on_session_close(self, msg: dict[str, Any]) -> None:
        self.conversation.stop_input()  # disconnect then stops the utterance (conversation.close)
        await self.close()

    @staticmethod
    async def _codec_spec() -> dict[str, Any] | None:
        """The codec's description, or None when its table cannot be used (codec modes refused)."""
        try:
            codec = await asyncio.to_thread(shared_codec)  # first use reads and verifies the table
        except CodecTableError:
            logger.exception("codec table unusable: codec modes are refused")
            return None
        return codec.spec()

    # -- utterances: the core's speech turn --------------------------------------------------------
    def start_utterance(
        self, pieces: list[str], config: SessionConfig, codec: dict[str, Any] | None = None, *, input_done: bool = True
    ) -> None:
        """Start speaking ``pieces``; ``codec`` (the codec's spec) selects codec_tokens output.

        ``input_done=False``: the client is still writing; more pieces come through ``speech.add``.
        """
        merge = config.split_granularity == "none" and codec is None
        speech = SpeechTurn(
            lambda batch: self._request(config, batch, merge=merge, codec=codec),
            pieces,
            input_done=input_done,
            # batch priority writes a file: nobody listens meanwhile, so no request waits for playback
            max_ahead_seconds=0.0 if config.priority == "batch" else settings.ENGINE_MAX_AHEAD_SECONDS,
            on_activity=self._touch,  # the idle clock pauses while audio is made
        )
        utt = Utterance(
            send=self._send_wire,
            hold_file_audio=lambda held: self.budget_share.hold("file audio", held),  # all sessions together
            config=config,
            index=self.utterance_index,
            text=" ".join(pieces),
            merge=merge,
            speech=speech,
            codec=codec,
        )
        self.utterance = utt
        self.conversation.start_turn(
            speech,
            lambda turn, event: utt.emit(event),
            stopped=lambda: utt.over or self.send_stalled or self.client_gone,  # leaving aborts the request
            ended=lambda turn: self._utterance_over(utt),
            input_open=not input_done,
        )

    def _touch(self) -> None:
        if self.clock is not None:
            self.clock.touch()

    @staticmethod
    def _request(
        config: SessionConfig, pieces: list[str], *, merge: bool, codec: dict[str, Any] | None
    ) -> SpeakRequest:
        """The engine request for the next pieces of the utterance (the core adds the noise state)."""
        if config.split_granularity == "none":
            # One sentence on the wire, but synthesized sentence by sentence so the first one plays
            # while the rest is made (codec_tokens keeps one code stream: the talker takes it whole).
            text, split = pieces[0], ("none" if codec is not None else "sentence")
        else:
            # One piece per line: the splitter cuts them exactly where they were cut here.
            text, split = "\n".join(pieces), config.split_granularity
        request = protocol.tts_request(text, config, PIPELINE, split=split)
        if split == "sentence" and merge:
            # max_new_tokens caps the flush, as one request; one file at the end plays nothing
            # meanwhile, so it is not paced.
            request = replace(request, max_frames_scope="request", paced=config.stream_audio)
        if codec is not None:
            # As the reference's codec request: no timestamps, no vocoder chunking (nothing is vocoded).
            request = replace(
                request, pipeline=CODEC_PIPELINE, codec_output="codes", timestamps=False, first_chunk_frames=None
            )
        elif config.vocoder == "codec":
            request = replace(request, pipeline=CODEC_PIPELINE, codec_output="pcm")
        return request

    async def cancel_utterance(self) -> None:
        """``input.cancel``: the core's interrupt, then the utterance ends on the wire as cancelled."""
        utt = self.utterance
        if utt is None or utt.cancelling:
            return
        self.text_parts.clear()
        self.text_chars = 0
        if utt.speech.finished:  # every piece is spoken: a cancel after the last audio is moot
            return
        utt.cancelling = True
        await self.conversation.interrupt()
        if not utt.over and self.config is not None and self.state is not SessionState.CLOSED:
            await utt.end(cancelled=True)
        await self._utterance_over(utt)

    async def _utterance_over(self, utt: Utterance) -> None:
        """After the utterance, however it ended: the next one, and the messages held meanwhile."""
        if self.utterance is not utt:
            return
        self.utterance = None
        self.budget_share.hold("file audio", 0)
        self.utterance_index += 1
        if self.state is SessionState.CLOSED:
            return
        if not utt.speech.input_done:
            # Ended before the flush (cancelled or failed): what the client writes next is a new utterance.
            self.text_parts.clear()
            self.text_chars = 0
            self.budget_share.hold("text", 0)
        self.clock.touch()  # the idle clock restarts when the utterance ends
        self.inbox.reopen()  # the messages held meanwhile, in order

    async def _send_wire(self, payload: dict[str, Any] | bytes) -> None:
        """The utterance's way out: a JSON message, or a binary frame (audio, a file, a codec packet)."""
        if isinstance(payload, bytes):
            await self.send(bytes_data=payload)
        else:
            await self.send_json(payload)

    # -- errors and timeouts -----------------------------------------------------------------------
    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        await self.send_json(protocol.error(message, kind=kind))
        if self.conversation is not None:
            await self.conversation.close()  # CLOSED; the utterance (unless it is the caller) is interrupted
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
