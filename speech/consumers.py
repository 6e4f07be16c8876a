"""Transport for ``/v1/audio/speech/stream``: one explicit session state machine per WebSocket.

Channels dispatches this socket's messages one at a time to ``receive`` (the single reader). Each
message type has its own handler. An utterance's generation runs as a separate task so the reader
keeps listening: ``input.cancel`` stops it between two engine steps, and any other message that
arrives meanwhile is kept, in order, and handled once the utterance is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.conf import settings

from omniweb import metrics  # ops instrumentation: time to first audio
from omniweb.engine.client import EngineClient
from omniweb.engine.runtime import get_engine_client
from omniweb.sessions import SessionClock, SessionConsumer

from . import protocol
from .codec import wire
from .codec.loops import CODEC_PIPELINE, shared_codec
from .codec.model import CodecTableError
from .protocol import ProtocolError, SessionConfig
from .tts.loops import PIPELINE
from .tts.model import capabilities

logger = logging.getLogger(__name__)

MAX_PENDING_MESSAGES = 1024  # messages held while an utterance plays; a flood beyond this ends the session
MAX_PENDING_BYTES = 8 * 1024 * 1024


class SessionState(enum.Enum):
    AWAITING_CONFIG = "awaiting_config"
    READY = "ready"  # configured; buffering text or idle
    GENERATING = "generating"  # an utterance is being synthesized and streamed
    CLOSED = "closed"


@dataclass
class _Sentence:
    index: int
    text: str
    sent_bytes: int = 0
    chunk_id: int = 0
    buffer: list[bytes] = field(default_factory=list)
    # codec_tokens mode: packets sent (the next seq), frames sent, and whether the EOS packet went out
    seq: int = 0
    frames: int = 0
    eos_sent: bool = False


@dataclass
class _Utterance:
    index: int
    request_id: str
    cancelled: bool = False
    current: _Sentence | None = None
    sentences: int = 0  # audio.done (codec.done) messages sent
    codec: dict[str, Any] | None = None  # codec_tokens mode: the codec's description for codec.start
    ttfa: metrics.FirstAudioClock = field(default_factory=metrics.FirstAudioClock)  # ops: input.done → audio


class SpeechStreamConsumer(SessionConsumer):
    async def connect(self) -> None:
        self.state = SessionState.AWAITING_CONFIG
        self.config: SessionConfig | None = None
        self.text_parts: list[str] = []
        self.text_chars = 0
        self.utterance_index = 0
        self.pending: deque[tuple[str | None, bytes | None]] = deque()
        self.pending_bytes = 0
        self.replaying = False
        self.utterance: _Utterance | None = None
        self.generation: asyncio.Task[None] | None = None
        # First use may load the model: keep that off the event loop, and before the handshake so
        # the config clock only starts once the session can be served.
        self.engine: EngineClient = await asyncio.to_thread(get_engine_client)
        self.caps = capabilities()
        self.clock = SessionClock(
            config_timeout=settings.SPEECH_CONFIG_TIMEOUT,
            idle_timeout=settings.SPEECH_IDLE_TIMEOUT,
            configured=lambda: self.config is not None,
            paused=lambda: self.state is SessionState.GENERATING,  # an utterance streams
            closed=lambda: self.state is SessionState.CLOSED,
            on_timeout=self.on_timeout,
        )
        await self.accept()
        self.watchdog = asyncio.ensure_future(self.clock.run())
        self.handlers: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {
            "input.text": self.on_input_text,
            "input.done": self.on_input_done,
            "input.cancel": self.on_input_cancel,
            "session.close": self.on_session_close,
        }

    async def disconnect(self, code: int) -> None:
        self.state = SessionState.CLOSED
        for task in (getattr(self, "watchdog", None), self.generation):
            if task is not None and not task.done():
                task.cancel()
        if self.generation is not None:
            # Cancelling the task closes the engine stream, which aborts the request in the engine.
            await asyncio.gather(self.generation, return_exceptions=True)
        logger.info("speech session closed (code %s)", code)

    # -- the single reader -------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        self.clock.touch()
        if self.state is SessionState.CLOSED:
            return
        generating = self.state is SessionState.GENERATING
        if generating and text_data is not None and _is_cancel(text_data):
            await self.cancel_utterance()
            return
        if generating or self.replaying:  # keep arrival order behind the messages held so far
            size = len(text_data if text_data is not None else bytes_data or b"")
            if len(self.pending) >= MAX_PENDING_MESSAGES or self.pending_bytes + size > MAX_PENDING_BYTES:
                await self.fail("Too many messages queued while audio is being generated")
                return
            self.pending.append((text_data, bytes_data))
            self.pending_bytes += size
            return
        await self.handle(text_data, bytes_data)

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
            await self.fail(f"Expected session.config, got: {msg_type}")
        elif isinstance(msg_type, str) and msg_type in self.handlers:
            await self.handlers[msg_type](msg)
        else:
            await self.send_json(protocol.error(f"Unknown message type: {msg_type}"))

    # -- handlers, one per message type ------------------------------------------------------------
    async def on_session_config(self, msg: dict[str, Any]) -> None:
        if self.text_parts:
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
        self.state = SessionState.READY

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
        self.text_parts.append(text)
        self.text_chars += len(text)

    async def on_input_done(self, msg: dict[str, Any]) -> None:
        assert self.config is not None
        text = "".join(self.text_parts).strip()
        self.text_parts.clear()
        self.text_chars = 0
        if text:
            config = self.config
            uses_codec = config.output_mode == "codec_tokens" or config.vocoder == "codec"
            spec = await self._codec_spec() if uses_codec else None
            problem = protocol.flush_precondition_error(config, codec_ready=spec is not None)
            if problem is None:
                self.start_utterance(text, config, spec if config.output_mode == "codec_tokens" else None)
                return
            await self.send_json(protocol.error(problem))
        await self.send_json(protocol.session_done(self.utterance_index, 0))
        self.utterance_index += 1

    async def on_input_cancel(self, msg: dict[str, Any]) -> None:
        # Nothing is generating here (a cancel during generation is taken by ``receive``).
        self.text_parts.clear()
        self.text_chars = 0
        await self.send_json(protocol.input_cancelled(self.utterance_index))

    async def on_session_close(self, msg: dict[str, Any]) -> None:
        self.state = SessionState.CLOSED
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

    # -- utterances --------------------------------------------------------------------------------
    def start_utterance(self, text: str, config: SessionConfig, codec: dict[str, Any] | None = None) -> None:
        """Submit the flush; ``codec`` (the codec's spec) selects codec_tokens output."""
        self.state = SessionState.GENERATING
        self.utterance = _Utterance(index=self.utterance_index, request_id=uuid.uuid4().hex, codec=codec)
        request = protocol.tts_request(text, config, PIPELINE)
        if codec is not None:
            # As the reference's codec request: no timestamps, no vocoder chunking (nothing is vocoded).
            request.update(pipeline=CODEC_PIPELINE, codec_output="codes", timestamps=False, first_chunk_frames=None)
        elif config.vocoder == "codec":
            request.update(pipeline=CODEC_PIPELINE, codec_output="pcm")
        self.generation = asyncio.ensure_future(self._run_utterance(self.utterance, request, config))

    async def cancel_utterance(self) -> None:
        if self.utterance is not None and not self.utterance.cancelled:
            self.utterance.cancelled = True
            await self.engine.abort(self.utterance.request_id)

    async def _run_utterance(self, utt: _Utterance, request: dict[str, Any], config: SessionConfig) -> None:
        try:
            async with contextlib.aclosing(self.engine.stream(request, utt.request_id)) as stream:
                async for chunk in stream:
                    await self._on_chunk(utt, config, chunk)
                    if self.client_stalled():
                        logger.warning("closing a session whose client stopped reading")
                        # Leaving the loop closes the engine stream, which aborts the request.
                        await self.fail(
                            f"Client is not reading: over {settings.SESSION_SEND_BUFFER_MAX} bytes queued; "
                            "session closed"
                        )
                        break
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("utterance %d failed", utt.index)
            await self._end_utterance(utt, config, failed=True)
        self.utterance = None
        self.utterance_index += 1
        if self.state is SessionState.CLOSED:
            return
        self.state = SessionState.READY
        self.clock.touch()  # the idle clock restarts when the utterance ends
        await self._replay_pending()

    async def _replay_pending(self) -> None:
        """Handle the held messages in order; new arrivals queue behind them until it is done."""
        self.replaying = True
        try:
            while self.pending and self.state is SessionState.READY:
                text_data, bytes_data = self.pending.popleft()
                self.pending_bytes -= len(text_data if text_data is not None else bytes_data or b"")
                await self.handle(text_data, bytes_data)
        finally:
            self.replaying = False

    async def _on_chunk(self, utt: _Utterance, config: SessionConfig, chunk: dict[str, Any]) -> None:
        kind = chunk["type"]
        if utt.codec is not None and kind != "end":
            await self._on_codec_chunk(utt, utt.codec, config, chunk)
        elif kind == "sentence.start":
            utt.current = _Sentence(index=chunk["sentence_index"], text=chunk["text"])
            await self.send_json(protocol.audio_start(config, utt.index, utt.current.index, utt.current.text))
        elif kind == "audio" and utt.current is not None:
            await self._on_audio(utt, utt.current, config, chunk["pcm"])
        elif kind == "sentence.end" and utt.current is not None:
            sentence = utt.current
            if not config.stream_audio:
                blob = await asyncio.to_thread(protocol.encode_audio, b"".join(sentence.buffer), config.response_format)
                sentence.buffer.clear()
                sentence.sent_bytes = len(blob)
                await self.send(bytes_data=blob)
                utt.ttfa.audio_sent(stream=False)  # ops
            elif config.word_timestamps:
                final = protocol.audio_chunk(utt.index, sentence.index, sentence.chunk_id, b"", 0, chunk["timestamps"])
                final["chunk_end_ms"] = protocol.samples_to_ms(sentence.sent_bytes)
                await self.send_json(final)
            await self.send_json(protocol.audio_done(utt.index, sentence.index, sentence.sent_bytes))
            utt.sentences += 1
            utt.current = None
        elif kind == "end":
            status = chunk["status"]
            if status == "ok":
                await self.send_json(protocol.session_done(utt.index, utt.sentences))
            elif status == "cancelled" and utt.cancelled:
                await self._end_utterance(utt, config, cancelled=True)
            elif status == "busy":
                await self.send_json(protocol.error(chunk["message"]))
                await self.send_json(protocol.session_done(utt.index, 0))
            else:
                logger.warning("utterance %d ended with %s: %s", utt.index, status, chunk.get("message"))
                await self._end_utterance(utt, config, failed=True)

    async def _on_audio(self, utt: _Utterance, sentence: _Sentence, config: SessionConfig, pcm: bytes) -> None:
        if not config.stream_audio:
            sentence.buffer.append(pcm)
            return
        if config.word_timestamps:
            await self.send_json(
                protocol.audio_chunk(utt.index, sentence.index, sentence.chunk_id, pcm, sentence.sent_bytes, None)
            )
            sentence.chunk_id += 1
        else:
            await self.send(bytes_data=pcm)
        sentence.sent_bytes += len(pcm)
        utt.ttfa.audio_sent(stream=True)  # ops

    async def _on_codec_chunk(
        self, utt: _Utterance, codec: dict[str, Any], config: SessionConfig, chunk: dict[str, Any]
    ) -> None:
        """codec_tokens mode: codec.start, one binary packet per engine packet, codec.done."""
        kind = chunk["type"]
        if kind == "sentence.start":
            utt.current = _Sentence(index=chunk["sentence_index"], text=chunk["text"])
            await self.send_json(self._codec_start(utt, codec, config, utt.current))
        elif kind == "codes" and utt.current is not None:
            sentence = utt.current
            last = bool(chunk["last"])
            rows = np.frombuffer(chunk["codes"], dtype="<i2").reshape(-1, codec["codebooks"])
            packet = wire.pack_codec_frame(
                sentence.seq,
                rows,
                eos=last,  # the stream's last packet: the client flushes its decoder
                segment_end=last and bool(chunk["more"]),  # a sentence boundary inside the flush
                codebooks=codec["codebooks"],
                codebook_size=codec["codebook_size"],
            )
            await self.send(bytes_data=packet)
            sentence.seq += 1
            sentence.frames += rows.shape[0]
            sentence.eos_sent = last
            utt.ttfa.audio_sent(stream=True)  # ops
        elif kind == "sentence.end" and utt.current is not None:
            sentence = utt.current
            await self.send_json(protocol.codec_done(utt.index, sentence.index, sentence.frames, sentence.seq - 1))
            utt.sentences += 1
            utt.current = None

    @staticmethod
    def _codec_start(
        utt: _Utterance, codec: dict[str, Any], config: SessionConfig, sentence: _Sentence
    ) -> dict[str, Any]:
        return wire.codec_start_message(
            utterance_index=utt.index,
            sentence_index=sentence.index,
            sentence_text=sentence.text,
            spec=codec,
            model=config.model,
        )

    async def _end_codec_utterance(
        self, utt: _Utterance, codec: dict[str, Any], config: SessionConfig, *, failed: bool, cancelled: bool
    ) -> None:
        """As ``_end_utterance`` for codec streams: a stream that did not fail ends with an EOS
        packet (an empty one when its last packet had not gone out), then codec.done."""
        sentence = utt.current
        if sentence is None:
            sentence = _Sentence(index=utt.sentences, text="")
            await self.send_json(self._codec_start(utt, codec, config, sentence))
        if failed:
            await self.send_json(
                protocol.error(
                    f"Codec stream failed for utterance {utt.index}, sentence {sentence.index}",
                    partial_audio=sentence.frames > 0,
                )
            )
        elif not sentence.eos_sent:
            terminal = wire.pack_codec_frame(sentence.seq, None, eos=True, codebooks=codec["codebooks"])
            await self.send(bytes_data=terminal)
            sentence.seq += 1
        await self.send_json(
            protocol.codec_done(
                utt.index, sentence.index, sentence.frames, sentence.seq - 1, error=failed, cancelled=cancelled
            )
        )
        utt.sentences += 1
        utt.current = None
        await self.send_json(protocol.session_done(utt.index, utt.sentences))

    async def _end_utterance(
        self, utt: _Utterance, config: SessionConfig, *, failed: bool = False, cancelled: bool = False
    ) -> None:
        """Close the open sentence with audio.done, then the utterance.

        Between sentences an empty sentence is opened and closed, so the client always gets its
        ``audio.done`` with ``error``/``cancelled`` and every ``audio.done`` has its ``audio.start``.
        """
        if utt.codec is not None:
            await self._end_codec_utterance(utt, utt.codec, config, failed=failed, cancelled=cancelled)
            return
        sentence = utt.current
        if sentence is None:
            sentence = _Sentence(index=utt.sentences, text="")
            await self.send_json(protocol.audio_start(config, utt.index, sentence.index, sentence.text))
        if failed:
            await self.send_json(
                protocol.error(
                    f"Generation failed for utterance {utt.index}, sentence {sentence.index}",
                    partial_audio=sentence.sent_bytes > 0,
                )
            )
        await self.send_json(
            protocol.audio_done(utt.index, sentence.index, sentence.sent_bytes, error=failed, cancelled=cancelled)
        )
        utt.sentences += 1
        utt.current = None
        await self.send_json(protocol.session_done(utt.index, utt.sentences))

    # -- errors and timeouts -----------------------------------------------------------------------
    async def fail(self, message: str) -> None:
        await self.send_json(protocol.error(message))
        self.state = SessionState.CLOSED
        task = self.generation
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        await self.close()

    async def on_timeout(self, awaiting_config: bool) -> None:
        await self.fail(
            "Timeout waiting for session.config" if awaiting_config else "Idle timeout: no message received"
        )


def _is_cancel(raw: str) -> bool:
    """Peek at a message that arrived mid-generation: only input.cancel acts at once."""
    if len(raw) > protocol.MAX_OTHER_MESSAGE_SIZE:
        return False
    try:
        msg = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(msg, dict) and msg.get("type") == "input.cancel"
