"""Transport for ``/v1/audio/speech/stream``: one explicit session state machine per WebSocket.

Channels dispatches this socket's messages one at a time to ``receive`` (the single reader). Each
message type has its own handler. An utterance's generation runs as a separate task so the reader
keeps listening: ``input.cancel`` stops it between two engine steps, and any other message that
arrives after the flush is kept, in order, and handled once the utterance is done.

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
import enum
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.conf import settings

from omniweb import metrics  # ops instrumentation: time to first audio
from omniweb.conversation.chunks import (
    AudioChunk,
    CodecCodes,
    EngineChunk,
    SentenceEnd,
    SentenceStart,
    TurnEnd,
    parse_chunk,
)
from omniweb.engine.client import EngineClient
from omniweb.engine.runtime import get_engine_client
from omniweb.errors import ErrorKind
from omniweb.protocol import excerpt
from omniweb.sessions import SessionClock, SessionConsumer, spawn

from . import protocol
from .codec import wire
from .codec.loops import CODEC_PIPELINE, shared_codec
from .codec.model import CodecTableError
from .protocol import ProtocolError, SessionConfig
from .text import split_text
from .tts.loops import FRAME_SECONDS, PIPELINE
from .tts.model import capabilities

logger = logging.getLogger(__name__)

MAX_PENDING_MESSAGES = 1024  # messages held while an utterance plays; a flood beyond this ends the session
MAX_PENDING_BYTES = 8 * 1024 * 1024


class SessionState(enum.Enum):
    AWAITING_CONFIG = "awaiting_config"
    READY = "ready"  # configured; buffering text or idle
    SPEAKING = "speaking"  # sentence/clause: completed pieces are spoken while the client still writes
    GENERATING = "generating"  # flushed: the rest of the utterance is synthesized and streamed
    CLOSED = "closed"


@dataclass
class _Sentence:
    index: int
    text: str
    sent_bytes: int = 0
    chunk_id: int = 0
    buffer: list[bytes] = field(default_factory=list)
    pcm_bytes: int = 0  # PCM through this wire sentence so far, streamed or buffered for its file
    # split_granularity none: word timings of the engine sentences so far, on the flush's timeline
    timestamps: list[dict[str, Any]] = field(default_factory=list)
    part_start: int = 0  # pcm_bytes where the engine sentence now playing began
    # codec_tokens mode: packets sent (the next seq), frames sent, and whether the EOS packet went out
    seq: int = 0
    frames: int = 0
    eos_sent: bool = False


@dataclass
class _Utterance:
    index: int
    text: str  # the text so far (the flushed text for split_granularity none)
    merge: bool  # split_granularity none: the engine's sentences are one sentence on the wire
    request_id: str = ""  # the engine request now streaming
    cancelled: bool = False
    current: _Sentence | None = None
    sentences: int = 0  # audio.done (codec.done) messages sent
    codec: dict[str, Any] | None = None  # codec_tokens mode: the codec's description for codec.start
    ttfa: metrics.FirstAudioClock = field(default_factory=metrics.FirstAudioClock)  # ops: input.done → audio
    feed: list[str] = field(default_factory=list)  # completed pieces not yet sent to the engine
    input_done: bool = True  # False while the client may still add pieces (speaking before the flush)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # new pieces, the flush, or a cancel
    streaming: bool = False  # an engine request is open
    rng_state: str | None = None  # the seeded noise where the previous request left it
    first_audio_at: float | None = None
    media_seconds: float = 0.0  # audio (or codes) sent, in seconds of playback


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
            paused=self._streaming,  # an utterance streams
            closed=lambda: self.state is SessionState.CLOSED,
            on_timeout=self.on_timeout,
        )
        await self.accept()
        self.watchdog = spawn(self.clock.run(), "speech session clock")
        self.handlers: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {
            "input.text": self.on_input_text,
            "input.done": self.on_input_done,
            "input.cancel": self.on_input_cancel,
            "session.close": self.on_session_close,
        }

    def _streaming(self) -> bool:
        """No idle timeout while audio is made for the client (it has nothing to say meanwhile)."""
        if self.state is SessionState.GENERATING:
            return True
        return self.state is SessionState.SPEAKING and self.utterance is not None and self.utterance.streaming

    async def disconnect(self, code: int) -> None:
        self.state = SessionState.CLOSED
        for task in (getattr(self, "watchdog", None), self.generation):
            if task is not None and not task.done():
                task.cancel()
        if self.generation is not None:
            # Cancelling the task closes the engine stream, which aborts the request in the engine.
            await asyncio.gather(self.generation, return_exceptions=True)
        self._release()
        logger.info("speech session closed (code %s)", code)

    def _release(self) -> None:
        """Drop buffered text, held messages and the references that make the session a cycle
        (clock and handler closures, tasks), so a closed session is freed without the cyclic GC."""
        for name in ("text_parts", "pending", "handlers"):
            with contextlib.suppress(AttributeError):  # connect may have failed before setting it
                getattr(self, name).clear()
        self.pending_bytes = 0
        self.utterance = None
        self.generation = None
        self.watchdog = None
        self.clock = None

    # -- the single reader -------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        self.clock.touch()
        if self.state is SessionState.CLOSED:
            return
        generating = self.state is SessionState.GENERATING
        speaking = generating or self.state is SessionState.SPEAKING
        if speaking and text_data is not None and _is_cancel(text_data):
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
        self.utterance.feed.extend(complete)
        self.utterance.text = f"{self.utterance.text} {' '.join(complete)}"
        self.utterance.wake.set()

    async def on_input_done(self, msg: dict[str, Any]) -> None:
        assert self.config is not None
        text = "".join(self.text_parts).strip()
        self.text_parts.clear()
        self.text_chars = 0
        config = self.config
        utt = self.utterance
        if utt is not None:  # speaking before the flush: the rest joins the utterance
            pieces = split_text(text, config.split_granularity)
            utt.feed.extend(pieces)
            if pieces:
                utt.text = f"{utt.text} {' '.join(pieces)}"
            utt.input_done = True
            utt.wake.set()
            self.state = SessionState.GENERATING
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
        if self.utterance is not None:  # replayed while speaking before the flush: stop it
            await self.cancel_utterance()
            return
        # Nothing is generating here (a cancel during an utterance is taken by ``receive``).
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
    def start_utterance(
        self, pieces: list[str], config: SessionConfig, codec: dict[str, Any] | None = None, *, input_done: bool = True
    ) -> None:
        """Start speaking ``pieces``; ``codec`` (the codec's spec) selects codec_tokens output.

        ``input_done=False``: the client is still writing; more pieces come through ``feed``.
        """
        self.state = SessionState.GENERATING if input_done else SessionState.SPEAKING
        self.utterance = _Utterance(
            index=self.utterance_index,
            text=" ".join(pieces),
            merge=config.split_granularity == "none" and codec is None,
            codec=codec,
            feed=list(pieces),
            input_done=input_done,
        )
        self.generation = spawn(self._run_utterance(self.utterance, config), "speech utterance")

    def _request(self, utt: _Utterance, config: SessionConfig, pieces: list[str]) -> dict[str, Any]:
        """The engine request for the next pieces of the utterance."""
        if config.split_granularity == "none":
            # One sentence on the wire, but synthesized sentence by sentence so the first one plays
            # while the rest is made (codec_tokens keeps one code stream: the talker takes it whole).
            text, split = pieces[0], ("none" if utt.codec is not None else "sentence")
        else:
            # One piece per line: the splitter cuts them exactly where they were cut here.
            text, split = "\n".join(pieces), config.split_granularity
        request = protocol.tts_request(text, config, PIPELINE, split=split)
        if split == "sentence" and utt.merge:
            request["max_frames_scope"] = "request"  # max_new_tokens caps the flush, as one request
            if not config.stream_audio:
                request["paced"] = False  # one file at the end: nothing plays meanwhile, so no pacing
        if utt.rng_state is not None:
            request["rng_state"] = utt.rng_state
        if utt.codec is not None:
            # As the reference's codec request: no timestamps, no vocoder chunking (nothing is vocoded).
            request.update(pipeline=CODEC_PIPELINE, codec_output="codes", timestamps=False, first_chunk_frames=None)
        elif config.vocoder == "codec":
            request.update(pipeline=CODEC_PIPELINE, codec_output="pcm")
        return request

    async def cancel_utterance(self) -> None:
        utt = self.utterance
        if utt is not None and not utt.cancelled:
            utt.cancelled = True
            self.text_parts.clear()
            self.text_chars = 0
            utt.wake.set()
            if utt.streaming:
                await self.engine.abort(utt.request_id)

    async def _run_utterance(self, utt: _Utterance, config: SessionConfig) -> None:
        """Speak the utterance's pieces as they come, one engine request per batch, then end it."""
        try:
            status = "ok"
            while status == "ok" and (utt.feed or not utt.input_done) and not utt.cancelled:
                if not utt.feed:
                    utt.wake.clear()
                    await utt.wake.wait()
                    continue
                await self._pace(utt)
                if utt.cancelled:
                    break
                pieces, utt.feed = utt.feed, []
                status = await self._stream_request(utt, config, self._request(utt, config, pieces))
            if status == "ok":
                if utt.cancelled and (utt.feed or not utt.input_done):  # a cancel after the last audio is moot
                    await self._end_utterance(utt, config, cancelled=True)
                else:
                    if utt.current is not None:  # split_granularity none: the flush's one sentence
                        await self._close_sentence(utt, utt.current, config)
                    await self.send_json(protocol.session_done(utt.index, utt.sentences))
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("utterance %d failed", utt.index)
            await self._end_utterance(utt, config, failed=True, kind=ErrorKind.ENGINE)
        self.utterance = None
        self.utterance_index += 1
        if self.state is SessionState.CLOSED:
            return
        if self.state is SessionState.SPEAKING:
            # Ended before the flush (cancelled or failed): what the client writes next is a new utterance.
            self.text_parts.clear()
            self.text_chars = 0
        self.state = SessionState.READY
        self.clock.touch()  # the idle clock restarts when the utterance ends
        await self._replay_pending()

    async def _pace(self, utt: _Utterance) -> None:
        """Before the next request: wait while the audio sent is over ENGINE_MAX_AHEAD_SECONDS ahead.

        The engine paces each request from its own first audio; across the requests of one
        utterance the listener's position is only known here.
        """
        limit = settings.ENGINE_MAX_AHEAD_SECONDS
        while limit > 0 and utt.first_audio_at is not None and not utt.cancelled:
            ahead = utt.media_seconds - (time.monotonic() - utt.first_audio_at)
            if ahead <= limit:
                return
            utt.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(utt.wake.wait(), ahead - limit)

    async def _stream_request(self, utt: _Utterance, config: SessionConfig, request: dict[str, Any]) -> str:
        """Stream one engine request to the client; its end status ("stalled": the session was closed).

        Anything but "ok" has already ended the utterance on the wire.
        """
        utt.request_id = uuid.uuid4().hex
        utt.streaming = True
        self.clock.touch()  # the idle clock pauses while audio is made
        try:
            async with contextlib.aclosing(self.engine.stream(request, utt.request_id)) as stream:
                async for raw in stream:
                    chunk = parse_chunk(raw)  # the engine's dicts become types in one place
                    if isinstance(chunk, TurnEnd):
                        return await self._on_end(utt, config, chunk)
                    if chunk is not None:
                        await self._on_chunk(utt, config, chunk)
                    if self.send_stalled or self.client_gone:  # failed by a send, or gone (sessions.py)
                        return "stalled"  # leaving the loop closes the engine stream, which aborts the request
        finally:
            utt.streaming = False
            self.clock.touch()
        raise RuntimeError("engine stream ended without an end chunk")

    async def _on_end(self, utt: _Utterance, config: SessionConfig, end: TurnEnd) -> str:
        status = end.status
        kind = end.kind or ErrorKind.ENGINE
        if status == "ok":
            utt.rng_state = end.rng_state
        elif status == "cancelled" and utt.cancelled:
            await self._end_utterance(utt, config, cancelled=True)
        elif status in ("busy", "unavailable") and utt.sentences == 0 and utt.current is None:
            # nothing was generated: the client may retry
            await self.send_json(protocol.error(end.message or "", kind=kind))
            await self.send_json(protocol.session_done(utt.index, 0))
        elif status in ("busy", "unavailable"):  # a later request of an utterance that already spoke
            await self.send_json(protocol.error(end.message or "", kind=kind))
            await self._end_utterance(utt, config, failed=True, kind=kind)
        else:
            logger.warning("utterance %d ended with %s (%s): %s", utt.index, status, end.kind, end.message)
            retry = end.message if "retry" in str(end.message) else None
            await self._end_utterance(utt, config, failed=True, kind=kind, reason=retry)
        return status

    async def _replay_pending(self) -> None:
        """Handle the held messages in order; new arrivals queue behind them until it is done."""
        self.replaying = True
        try:
            # SPEAKING (a replayed input.text completed a piece) takes every message type too.
            while self.pending and self.state in (SessionState.READY, SessionState.SPEAKING):
                text_data, bytes_data = self.pending.popleft()
                self.pending_bytes -= len(text_data if text_data is not None else bytes_data or b"")
                await self.handle(text_data, bytes_data)
        finally:
            self.replaying = False

    async def _on_chunk(self, utt: _Utterance, config: SessionConfig, chunk: EngineChunk) -> None:
        if utt.codec is not None:
            await self._on_codec_chunk(utt, utt.codec, config, chunk)
        elif isinstance(chunk, SentenceStart):
            if utt.merge and utt.current is not None:  # the next engine sentence continues the flush
                utt.current.part_start = utt.current.pcm_bytes
                return
            utt.current = _Sentence(index=utt.sentences, text=utt.text if utt.merge else chunk.text)
            await self.send_json(protocol.audio_start(config, utt.index, utt.current.index, utt.current.text))
        elif isinstance(chunk, AudioChunk) and utt.current is not None:
            await self._on_audio(utt, utt.current, config, chunk.pcm)
        elif isinstance(chunk, SentenceEnd) and utt.current is not None:
            sentence = utt.current
            offset = protocol.samples_to_ms(sentence.part_start)
            for word in chunk.words:
                sentence.timestamps.append(
                    {"word": word.word, "start_ms": word.start_ms + offset, "end_ms": word.end_ms + offset}
                )
            if not utt.merge:
                await self._close_sentence(utt, sentence, config)

    async def _close_sentence(self, utt: _Utterance, sentence: _Sentence, config: SessionConfig) -> None:
        """The sentence's file (file mode) or final timestamps chunk, then its audio.done."""
        if not config.stream_audio:
            blob = await asyncio.to_thread(protocol.encode_audio, b"".join(sentence.buffer), config.response_format)
            sentence.buffer.clear()
            sentence.sent_bytes = len(blob)
            await self.send(bytes_data=blob)
            utt.ttfa.audio_sent(stream=False)  # ops
            self._played(utt, sentence.pcm_bytes / protocol.BYTES_PER_SAMPLE / protocol.SAMPLE_RATE)
        elif config.word_timestamps:
            final = protocol.audio_chunk(utt.index, sentence.index, sentence.chunk_id, b"", 0, sentence.timestamps)
            final["chunk_end_ms"] = protocol.samples_to_ms(sentence.sent_bytes)
            await self.send_json(final)
        await self.send_json(protocol.audio_done(utt.index, sentence.index, sentence.sent_bytes))
        utt.sentences += 1
        utt.current = None

    @staticmethod
    def _played(utt: _Utterance, seconds: float) -> None:
        """Count media sent, for pacing across the utterance's requests."""
        if utt.first_audio_at is None:
            utt.first_audio_at = time.monotonic()
        utt.media_seconds += seconds

    async def _on_audio(self, utt: _Utterance, sentence: _Sentence, config: SessionConfig, pcm: bytes) -> None:
        sentence.pcm_bytes += len(pcm)
        if not config.stream_audio:
            sentence.buffer.append(pcm)
            return
        self._played(utt, len(pcm) / protocol.BYTES_PER_SAMPLE / protocol.SAMPLE_RATE)
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
        self, utt: _Utterance, codec: dict[str, Any], config: SessionConfig, chunk: EngineChunk
    ) -> None:
        """codec_tokens mode: codec.start, one binary packet per engine packet, codec.done."""
        if isinstance(chunk, SentenceStart):
            utt.current = _Sentence(index=utt.sentences, text=chunk.text)
            await self.send_json(self._codec_start(utt, codec, config, utt.current))
        elif isinstance(chunk, CodecCodes) and utt.current is not None:
            sentence = utt.current
            last = chunk.last
            rows = np.frombuffer(chunk.codes, dtype="<i2").reshape(-1, codec["codebooks"])
            packet = wire.pack_codec_frame(
                sentence.seq,
                rows,
                eos=last,  # the stream's last packet: the client flushes its decoder
                segment_end=last and chunk.more,  # a sentence boundary inside the flush
                codebooks=codec["codebooks"],
                codebook_size=codec["codebook_size"],
            )
            await self.send(bytes_data=packet)
            sentence.seq += 1
            sentence.frames += rows.shape[0]
            sentence.eos_sent = last
            utt.ttfa.audio_sent(stream=True)  # ops
            self._played(utt, rows.shape[0] * FRAME_SECONDS)
        elif isinstance(chunk, SentenceEnd) and utt.current is not None:
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
        self,
        utt: _Utterance,
        codec: dict[str, Any],
        config: SessionConfig,
        *,
        failed: bool,
        cancelled: bool,
        kind: ErrorKind = ErrorKind.ENGINE,
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
                    kind=kind,
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
        self,
        utt: _Utterance,
        config: SessionConfig,
        *,
        failed: bool = False,
        cancelled: bool = False,
        kind: ErrorKind = ErrorKind.ENGINE,
        reason: str | None = None,
    ) -> None:
        """Close the open sentence with audio.done, then the utterance.

        Between sentences an empty sentence is opened and closed, so the client always gets its
        ``audio.done`` with ``error``/``cancelled`` and every ``audio.done`` has its ``audio.start``.
        """
        if utt.codec is not None:
            await self._end_codec_utterance(utt, utt.codec, config, failed=failed, cancelled=cancelled, kind=kind)
            return
        sentence = utt.current
        if sentence is None:
            sentence = _Sentence(index=utt.sentences, text=utt.text if utt.merge else "")
            await self.send_json(protocol.audio_start(config, utt.index, sentence.index, sentence.text))
        if failed:
            await self.send_json(
                protocol.error(
                    f"Generation failed for utterance {utt.index}, sentence {sentence.index}"
                    + (f": {reason}" if reason else ""),  # an engine outage says so, and to retry
                    partial_audio=sentence.sent_bytes > 0,
                    kind=kind,
                )
            )
        await self.send_json(
            protocol.audio_done(utt.index, sentence.index, sentence.sent_bytes, error=failed, cancelled=cancelled)
        )
        utt.sentences += 1
        utt.current = None
        await self.send_json(protocol.session_done(utt.index, utt.sentences))

    # -- errors and timeouts -----------------------------------------------------------------------
    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        await self.send_json(protocol.error(message, kind=kind))
        self.state = SessionState.CLOSED
        task = self.generation
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
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
