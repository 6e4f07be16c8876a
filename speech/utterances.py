"""The speech endpoint's wire for one utterance: the core's typed events → its messages, in order.

What only this wire format knows lives here, so the consumer stays an adapter: the reference's
message order (audio.start, audio or audio.chunk, audio.done per sentence, session.done), file
mode (a sentence's PCM buffered and encoded into one file), word timestamps (for
``split_granularity: none``, the engine's sentences merged into the flush's one sentence on its
timeline), codec-token packets (codec.start, one packet per engine packet with EOS and segment
flags, codec.done) and how a failed, refused or cancelled utterance still closes every sentence it
opened. ``Utterance.send`` is the only way out, so it runs without a socket in the tests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omniweb.base import budget, clocks  # clocks: ops instrumentation (time to first audio)
from omniweb.base.errors import RETRYABLE, ErrorKind
from omniweb.conversation import (
    AudioChunk,
    CodecCodes,
    EngineChunk,
    SentenceEnd,
    SentenceStart,
    SpeechTurn,
    TurnEnd,
)

from . import protocol
from .codec import wire
from .protocol import SessionConfig
from .tts.loops import FRAME_SECONDS

logger = logging.getLogger(__name__)


@dataclass
class Sentence:
    """One sentence as the wire tells it (its audio.start/codec.start to its audio.done/codec.done)."""

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


@dataclass(eq=False)
class Utterance:
    """One utterance on the wire: what has been said of it so far, and the messages each of the
    core's events adds (the core's ``SpeechTurn`` speaks it). ``send`` writes a JSON message or a
    binary frame to the client; ``hold_file_audio`` asks the process budget for the PCM a file
    buffers (False: refused)."""

    send: Callable[[dict[str, Any] | bytes], Awaitable[None]]
    hold_file_audio: Callable[[int], bool]
    config: SessionConfig
    index: int
    text: str  # the text so far (the flushed text for split_granularity none)
    merge: bool  # split_granularity none: the engine's sentences are one sentence on the wire
    speech: SpeechTurn
    current: Sentence | None = None
    sentences: int = 0  # audio.done (codec.done) messages sent
    codec: dict[str, Any] | None = None  # codec_tokens mode: the codec's description for codec.start
    ttfa: clocks.FirstAudioClock = field(default_factory=clocks.FirstAudioClock)  # ops: input.done → audio
    refused: str | None = None  # why the process budget refused the audio of a file (omniweb/base/budget.py)
    cancelling: bool = False
    over: bool = False  # its session.done went out

    async def emit(self, event: EngineChunk) -> None:
        """One typed event of the utterance → the wire."""
        if isinstance(event, TurnEnd):
            await self._on_end(event)
            return
        await self._on_chunk(event)
        if self.refused is not None:  # the core stops the turn (stopped()), which aborts the request
            await self.end(failed=True, kind=ErrorKind.CAPACITY, reason=self.refused)

    async def _on_end(self, end: TurnEnd) -> None:
        status = end.status
        kind = end.kind or ErrorKind.ENGINE
        if status == "ok":  # every piece is spoken
            if self.current is not None:  # split_granularity none: the flush's one sentence
                await self._close_sentence(self.current)
            await self.send(protocol.session_done(self.index, self.sentences))
            self.over = True
        elif status in ("busy", "unavailable") and self.sentences == 0 and self.current is None:
            # nothing was generated: the client may retry
            await self.send(protocol.error(end.message or "", kind=kind))
            await self.send(protocol.session_done(self.index, 0))
            self.over = True
        elif status in ("busy", "unavailable"):  # a later request of an utterance that already spoke
            await self.send(protocol.error(end.message or "", kind=kind))
            await self.end(failed=True, kind=kind)
        else:
            logger.warning("utterance %d ended with %s (%s): %s", self.index, status, end.kind, end.message)
            retry = end.message if kind in RETRYABLE else None  # an engine outage says so, and to retry
            await self.end(failed=True, kind=kind, reason=retry)

    async def _on_chunk(self, chunk: EngineChunk) -> None:
        if self.codec is not None:
            await self._on_codec_chunk(chunk)
        elif isinstance(chunk, SentenceStart):
            if self.merge and self.current is not None:  # the next engine sentence continues the flush
                self.current.part_start = self.current.pcm_bytes
                return
            self.current = Sentence(index=self.sentences, text=self.text if self.merge else chunk.text)
            await self.send(protocol.audio_start(self.config, self.index, self.current.index, self.current.text))
        elif isinstance(chunk, AudioChunk) and self.current is not None:
            await self._on_audio(self.current, chunk.pcm)
        elif isinstance(chunk, SentenceEnd) and self.current is not None:
            sentence = self.current
            offset = protocol.samples_to_ms(sentence.part_start)
            for word in chunk.words:
                sentence.timestamps.append(
                    {"word": word.word, "start_ms": word.start_ms + offset, "end_ms": word.end_ms + offset}
                )
            if not self.merge:
                await self._close_sentence(sentence)

    async def _close_sentence(self, sentence: Sentence) -> None:
        """The sentence's file (file mode) or final timestamps chunk, then its audio.done."""
        if not self.config.stream_audio:
            blob = await asyncio.to_thread(
                protocol.encode_audio, b"".join(sentence.buffer), self.config.response_format
            )
            sentence.buffer.clear()
            self.hold_file_audio(0)
            sentence.sent_bytes = len(blob)
            await self.send(blob)
            self.ttfa.audio_sent(stream=False)  # ops
            self.speech.played(sentence.pcm_bytes / protocol.BYTES_PER_SAMPLE / protocol.SAMPLE_RATE)
        elif self.config.word_timestamps:
            final = protocol.audio_chunk(self.index, sentence.index, sentence.chunk_id, b"", 0, sentence.timestamps)
            final["chunk_end_ms"] = protocol.samples_to_ms(sentence.sent_bytes)
            await self.send(final)
        await self.send(protocol.audio_done(self.index, sentence.index, sentence.sent_bytes))
        self.sentences += 1
        self.current = None

    async def _on_audio(self, sentence: Sentence, pcm: bytes) -> None:
        sentence.pcm_bytes += len(pcm)
        if not self.config.stream_audio:
            if not self.hold_file_audio(sentence.pcm_bytes):  # all sessions together
                self.refused = budget.AUDIO_FULL_MESSAGE
                return
            sentence.buffer.append(pcm)
            return
        self.speech.played(len(pcm) / protocol.BYTES_PER_SAMPLE / protocol.SAMPLE_RATE)
        if self.config.word_timestamps:
            await self.send(
                protocol.audio_chunk(self.index, sentence.index, sentence.chunk_id, pcm, sentence.sent_bytes, None)
            )
            sentence.chunk_id += 1
        else:
            await self.send(pcm)
        sentence.sent_bytes += len(pcm)
        self.ttfa.audio_sent(stream=True)  # ops

    async def _on_codec_chunk(self, chunk: EngineChunk) -> None:
        """codec_tokens mode: codec.start, one binary packet per engine packet, codec.done."""
        if isinstance(chunk, SentenceStart):
            self.current = Sentence(index=self.sentences, text=chunk.text)
            await self.send(self._codec_start(self.current))
        elif isinstance(chunk, CodecCodes) and self.current is not None:
            sentence = self.current
            last = chunk.last
            assert self.codec is not None
            rows = np.frombuffer(chunk.codes, dtype="<i2").reshape(-1, self.codec["codebooks"])
            packet = wire.pack_codec_frame(
                sentence.seq,
                rows,
                eos=last,  # the stream's last packet: the client flushes its decoder
                segment_end=last and chunk.more,  # a sentence boundary inside the flush
                codebooks=self.codec["codebooks"],
                codebook_size=self.codec["codebook_size"],
            )
            await self.send(packet)
            sentence.seq += 1
            sentence.frames += rows.shape[0]
            sentence.eos_sent = last
            self.ttfa.audio_sent(stream=True)  # ops
            self.speech.played(rows.shape[0] * FRAME_SECONDS)
        elif isinstance(chunk, SentenceEnd) and self.current is not None:
            sentence = self.current
            await self.send(protocol.codec_done(self.index, sentence.index, sentence.frames, sentence.seq - 1))
            self.sentences += 1
            self.current = None

    def _codec_start(self, sentence: Sentence) -> dict[str, Any]:
        assert self.codec is not None
        return wire.codec_start_message(
            utterance_index=self.index,
            sentence_index=sentence.index,
            sentence_text=sentence.text,
            spec=self.codec,
            model=self.config.model,
        )

    async def _end_codec_utterance(
        self,
        *,
        failed: bool,
        cancelled: bool,
        kind: ErrorKind = ErrorKind.ENGINE,
    ) -> None:
        """As ``end`` for codec streams: a stream that did not fail ends with an EOS
        packet (an empty one when its last packet had not gone out), then codec.done."""
        sentence = self.current
        if sentence is None:
            sentence = Sentence(index=self.sentences, text="")
            await self.send(self._codec_start(sentence))
        if failed:
            await self.send(
                protocol.error(
                    f"Codec stream failed for utterance {self.index}, sentence {sentence.index}",
                    partial_audio=sentence.frames > 0,
                    kind=kind,
                )
            )
        elif not sentence.eos_sent:
            assert self.codec is not None
            terminal = wire.pack_codec_frame(sentence.seq, None, eos=True, codebooks=self.codec["codebooks"])
            await self.send(terminal)
            sentence.seq += 1
        await self.send(
            protocol.codec_done(
                self.index, sentence.index, sentence.frames, sentence.seq - 1, error=failed, cancelled=cancelled
            )
        )
        self.sentences += 1
        self.current = None
        await self.send(protocol.session_done(self.index, self.sentences))
        self.over = True

    async def end(
        self,
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
        if self.codec is not None:
            await self._end_codec_utterance(failed=failed, cancelled=cancelled, kind=kind)
            return
        sentence = self.current
        if sentence is None:
            sentence = Sentence(index=self.sentences, text=self.text if self.merge else "")
            await self.send(protocol.audio_start(self.config, self.index, sentence.index, sentence.text))
        if failed:
            await self.send(
                protocol.error(
                    f"Generation failed for utterance {self.index}, sentence {sentence.index}"
                    + (f": {reason}" if reason else ""),  # an engine outage says so, and to retry
                    partial_audio=sentence.sent_bytes > 0,
                    kind=kind,
                )
            )
        await self.send(
            protocol.audio_done(self.index, sentence.index, sentence.sent_bytes, error=failed, cancelled=cancelled)
        )
        self.sentences += 1
        self.current = None
        await self.send(protocol.session_done(self.index, self.sentences))
        self.over = True
