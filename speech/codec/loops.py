"""Codec-token speech on the engine runtime: talker → codec encoder (→ codec vocoder).

One pipeline, ``speech.codec``, serves two kinds of request:

- ``codec_output: "codes"`` (``output_mode: "codec_tokens"``): the encoder loop turns each
  sentence's acoustic frames into code rows, one packet per step: a small first packet so the
  first one leaves early, then packets of at most ``packet_frames`` rows. The client decodes.
- ``codec_output: "pcm"`` (``vocoder: "codec"``): the encoder hands the same packets to the
  codec vocoder loop through the request's ``CODES`` slot; it decodes them in chunks of frames,
  each chunk one work unit whose shape signature is its row count, so chunks of equal size from
  different sessions run as one ``decode_batch`` call. The PCM is what a client decoding the
  ``codes`` stream of the same text gets, sample for sample.

The talker is ``speech.tts.loops.TalkerLoop`` as it is: these loops read its ``SENTENCES`` slot.
Every step is a scheduler step, so a request can be cancelled between any two packets or chunks.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.conf import settings

from omniweb.engine.contracts import (
    DONE,
    WAITING,
    Done,
    ShapeSignature,
    StepResult,
    Waiting,
    WorkPlan,
)
from omniweb.engine.messages import Chunk, CodecCodes, End, SentenceEnd, SentenceStart
from omniweb.engine.requests import SPEECH_CODEC, EngineRequest, SpeakRequest, expect
from speech.tts.loops import (
    CALIBRATION_TEXT,
    SENTENCES,
    TALKER_DONE,
    TalkerLoop,
    first_chunk_frames,
    sentence_chunks,
    speech_end,
    validate_voice,
)
from speech.tts.model import HibariTalker, SentenceFrames
from speech.tts.text import WordTiming as AlignedWord
from speech.tts.vocoder import AcousticFrames

from .model import Codec, CodecDecoder, CodecTableError, decode_batch, load_codec

logger = logging.getLogger(__name__)

CODEC_PIPELINE = SPEECH_CODEC
CODES = "codec_sentences"  # slot: deque[SentenceCodes], encoder → codec vocoder ("pcm" output only)
CODES_DONE = "codec_encoder_done"  # slot: bool, the encoder has published its last sentence

_codec_lock = threading.Lock()
_codec: Codec | None = None


def shared_codec() -> Codec:
    """The process's codec, loaded once (``CodecTableError`` when the committed table is bad).

    The transport uses it for the ``codec.start`` description; the engine for the codes. A failed
    load is not remembered, so a fixed table is picked up without a restart.
    """
    global _codec
    with _codec_lock:
        if _codec is None:
            _codec = load_codec()
        return _codec


def slice_frames(frames: AcousticFrames, start: int, stop: int) -> AcousticFrames:
    """Frames [start, stop) of a segment (views, no copy)."""
    return AcousticFrames(
        frames.lh[:, start:stop],
        frames.th[:, start:stop],
        frames.ln[:, start:stop],
        frames.lr[:, start:stop],
        frames.phi[:, start:stop],
        frames.f0[start:stop],
        None if frames.noise is None else frames.noise[:, start:stop],
    )


@dataclass
class SentenceCodes:
    """One sentence as the codec vocoder sees it: rows arrive packet by packet (under the lock)."""

    index: int
    text: str
    timestamps: list[AlignedWord] | None
    total_rows: int
    packets: list[np.ndarray] = field(default_factory=list)
    available: int = 0

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) out of the packets received so far (stop <= available)."""
        out, offset = [], 0
        for packet in self.packets:
            lo, hi = max(start, offset), min(stop, offset + len(packet))
            if lo < hi:
                out.append(packet[lo - offset : hi - offset])
            offset += len(packet)
            if offset >= stop:
                break
        return np.concatenate(out) if out else np.zeros((0, 0), np.int16)


# -- the encoder loop -------------------------------------------------------------------------------


@dataclass
class EncoderState:
    slots: dict[str, Any]
    emit: bool  # True: packets go to the client; False: to the codec vocoder (CODES slot)
    first_packet: int
    packet: int
    sentence: SentenceFrames | None = None
    offsets: list[int] = field(default_factory=list)  # first row of each segment, then the total
    published: SentenceCodes | None = None  # the sentence's entry in CODES ("pcm" output)
    next_row: int = 0
    packets_in_sentence: int = 0
    packets_sent: int = 0
    sentences_done: int = 0

    @property
    def total_rows(self) -> int:
        return self.offsets[-1] if self.offsets else 0


@dataclass
class _Packet:
    state: EncoderState
    sentence: SentenceFrames
    offsets: list[int]
    start: int
    stop: int
    first: bool
    last: bool
    more: bool  # another sentence of this flush follows (only meaningful when ``last``)


class CodecEncoderLoop:
    """Acoustic frames → code packets, one packet per step, lazily encoded per packet.

    The codec is frame-local (one row per frame from that frame alone), so encoding a packet's
    frames alone gives the same rows as encoding the whole segment; the first packet then costs
    only its own few frames. Packets may span the talker's segments: on the wire a sentence is one
    continuous code sequence.
    """

    name = "codec_encoder"

    def __init__(self, codec: Codec, packet_frames: int, first_packet_frames: int, lookahead: int) -> None:
        self._codec = codec
        self._packet = max(1, packet_frames)
        self._first = max(0, first_packet_frames)
        self._lookahead = max(1, lookahead)

    def init(self, request: SpeakRequest, slots: dict[str, Any]) -> EncoderState:
        emit = request.codec_output == "codes"
        slots[CODES] = deque()
        slots[CODES_DONE] = False
        return EncoderState(slots=slots, emit=emit, first_packet=self._first or self._packet, packet=self._packet)

    def _more_sentences(self, state: EncoderState) -> bool | None:
        """Whether another sentence of this flush follows the current one; None: not known yet."""
        if state.slots[SENTENCES]:
            return True
        return False if state.slots[TALKER_DONE] else None

    def _start_sentence(self, state: EncoderState) -> bool:
        """Take the talker's next sentence; False when none is ready (or the vocoder is behind)."""
        queue: deque[SentenceFrames] = state.slots[SENTENCES]
        if not queue:
            return False
        if not state.emit and len(state.slots[CODES]) >= self._lookahead:
            return False  # bounded memory: the codec vocoder has not started the earlier ones
        sentence = queue.popleft()
        state.sentence = sentence
        state.offsets = [0]
        for frames in sentence.acoustic:
            state.offsets.append(state.offsets[-1] + frames.n_frames)
        state.next_row = 0
        state.packets_in_sentence = 0
        state.published = None
        if not state.emit:
            state.published = SentenceCodes(sentence.index, sentence.text, sentence.timestamps, state.total_rows)
            state.slots[CODES].append(state.published)
        return True

    def next(self, state: EncoderState) -> WorkPlan | Done | Waiting:
        if state.sentence is None or state.next_row >= state.total_rows:
            state.sentence = None
            if not self._start_sentence(state):
                if state.slots[TALKER_DONE] and not state.slots[SENTENCES]:
                    state.slots[CODES_DONE] = True  # polled before the vocoder in the same pass
                    return DONE
                return WAITING
        sentence = state.sentence
        assert sentence is not None
        total = state.total_rows
        size = state.first_packet if state.packets_in_sentence == 0 else state.packet
        start, stop = state.next_row, min(total, state.next_row + size)
        more = False
        if stop == total and state.emit:
            known = self._more_sentences(state)
            if known is None:
                # The packet's flags need to know whether the flush goes on. Wait for the talker,
                # except for a request's very first packet: its media may be what the talker's
                # look-ahead step waits for, so send all but the last row now instead.
                if state.packets_sent == 0 and stop - start > 1:
                    stop -= 1
                else:
                    return WAITING
            else:
                more = known
        first = state.packets_in_sentence == 0
        packet = _Packet(state, sentence, state.offsets, start, stop, first, stop == total, more)
        state.next_row = stop  # claimed: the next plan continues from here
        state.packets_in_sentence += 1
        return WorkPlan(
            kind="codec_encoder",
            shape=ShapeSignature("codec_encoder", (stop - start,)),
            run=lambda: self._run(packet),
            emits=("codes",) if state.emit else (),
            payload=packet,
            label=f"codec.s{sentence.index}.f{start}",
        )

    def _encode(self, sentence: SentenceFrames, offsets: list[int], start: int, stop: int) -> np.ndarray:
        """Code rows [start, stop) of the sentence, encoding only the frames they come from."""
        parts = []
        for seg, lo, hi in zip(sentence.acoustic, offsets, offsets[1:], strict=False):
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                parts.append(self._codec.encode(slice_frames(seg, a - lo, b - lo)))
        rows = np.concatenate(parts).astype(np.int16, copy=False)
        if rows.shape != (stop - start, self._codec.codebooks):
            raise ValueError(f"codec returned {rows.shape} for {stop - start} frames")
        return rows

    def _run(self, packet: _Packet) -> StepResult:
        state, sentence = packet.state, packet.sentence
        rows = self._encode(sentence, packet.offsets, packet.start, packet.stop)
        if not state.emit:
            return StepResult(output=(packet, rows))
        chunks: list[Chunk] = []
        if packet.first:
            chunks.append(SentenceStart(sentence.index, sentence.text))
        codes = rows.astype("<i2").tobytes()
        chunks.append(CodecCodes(codes, int(rows.shape[0]), packet.last, packet.more, sentence.index))
        if packet.last:
            chunks.append(SentenceEnd(sentence.index))
        seconds = rows.shape[0] / self._codec.frame_rate_hz
        return StepResult(output=(packet, rows), chunks=chunks, media_seconds=seconds)

    def advance(self, state: EncoderState, result: StepResult) -> None:
        packet, rows = result.output
        state.packets_sent += 1
        if state.published is not None:  # hand the rows to the codec vocoder (under the lock)
            state.published.packets.append(rows)
            state.published.available = packet.stop
        if packet.last:
            state.sentences_done += 1

    def finalize(self, state: EncoderState) -> dict[str, Any]:
        return {"sentences_encoded": state.sentences_done, "packets": state.packets_sent}


# -- the codec vocoder loop (server-side decoding) -------------------------------------------------


@dataclass
class CodecVocoderState:
    slots: dict[str, Any]
    active: bool
    first_chunk_frames: int
    chunk_frames: int
    sentence: SentenceCodes | None = None
    decoder: CodecDecoder | None = None
    next_row: int = 0
    chunks_in_sentence: int = 0
    sentences_done: int = 0


@dataclass
class _DecodeChunk:
    decoder: CodecDecoder
    sentence: SentenceCodes
    rows: np.ndarray
    first: bool
    last: bool
    sample_rate: int


class CodecVocoderLoop:
    """Codes → PCM in chunks of frames, one decoder per sentence; idle for ``codes`` requests."""

    name = "codec_vocoder"

    def __init__(self, codec: Codec, chunk_frames: int, first_chunk_frames: int) -> None:
        self._codec = codec
        self._chunk = max(1, chunk_frames)
        self._first = max(0, first_chunk_frames)

    def init(self, request: SpeakRequest, slots: dict[str, Any]) -> CodecVocoderState:
        return CodecVocoderState(
            slots=slots,
            active=request.codec_output == "pcm",
            first_chunk_frames=first_chunk_frames(request, self._first, self._chunk),
            chunk_frames=self._chunk,
        )

    def next(self, state: CodecVocoderState) -> WorkPlan | Done | Waiting:
        if not state.active:
            return DONE
        if state.sentence is None:
            queue: deque[SentenceCodes] = state.slots[CODES]
            if not queue:
                return DONE if state.slots[CODES_DONE] else WAITING
            state.sentence = queue.popleft()
            state.decoder = self._codec.decoder()  # fresh state per sentence, as a client does
            state.next_row = 0
            state.chunks_in_sentence = 0
        sentence, decoder = state.sentence, state.decoder
        assert decoder is not None
        size = state.first_chunk_frames if state.chunks_in_sentence == 0 else state.chunk_frames
        start, stop = state.next_row, min(sentence.total_rows, state.next_row + size)
        if sentence.available < stop:
            return WAITING  # the encoder has not produced these rows yet
        chunk = _DecodeChunk(
            decoder=decoder,
            sentence=sentence,
            rows=sentence.rows(start, stop),
            first=state.chunks_in_sentence == 0,
            last=stop == sentence.total_rows,
            sample_rate=self._codec.sample_rate,
        )
        state.next_row = stop
        state.chunks_in_sentence += 1
        if chunk.last:
            state.sentence = None  # the next plan starts the next sentence
        return WorkPlan(
            kind="codec_vocoder",
            shape=ShapeSignature("codec_vocoder", (stop - start,)),
            run=lambda: _decode([chunk])[0],
            emits=("audio",),
            payload=chunk,
            batch_run=_decode_batch_run,
            label=f"codec_vocoder.s{sentence.index}.f{start}",
        )

    def advance(self, state: CodecVocoderState, result: StepResult) -> None:
        chunk: _DecodeChunk = result.output
        if chunk.last:
            state.sentences_done += 1

    def finalize(self, state: CodecVocoderState) -> dict[str, Any]:
        return {"sentences_decoded": state.sentences_done}


def _decode_batch_run(plans: Sequence[WorkPlan]) -> list[StepResult]:
    return _decode([p.payload for p in plans])


def _decode(chunks: list[_DecodeChunk]) -> list[StepResult]:
    """Decode the chunks in one batched call (each sentence's decoder appears once) and turn each
    into the same client chunks the hibari vocoder emits."""
    waves = decode_batch([(c.decoder, c.rows) for c in chunks])
    results = []
    for c, wave in zip(chunks, waves, strict=True):
        if c.last:
            wave = np.concatenate([wave, c.decoder.flush()])
        out = sentence_chunks(c.sentence, wave, c.sample_rate, first=c.first, last=c.last)
        results.append(StepResult(output=c, chunks=out, media_seconds=wave.size / c.sample_rate))
    return results


class CodecPipeline:
    """talker → codec encoder → codec vocoder for ``SpeakRequest(pipeline="speech.codec")``.

    The request's fields as for ``speech.tts``, plus ``codec_output``: ``"codes"`` (packets to the
    client, the default) or ``"pcm"`` (decoded here).
    """

    name = CODEC_PIPELINE

    def __init__(self, talker: HibariTalker | None = None) -> None:
        """``talker``: share another pipeline's (thread-safe) talker instead of loading the voice again."""
        self.loops: tuple[Any, ...] = ()
        try:
            codec = shared_codec()
        except CodecTableError as exc:
            # A bad table must not take the PCM path down with it: codec requests are refused
            # (the transport reports codec_tokens as unsupported) and the reason is logged once.
            logger.error("codec unavailable, codec_tokens refused: %s", exc)
            self.unavailable: str | None = str(exc)
            return
        self.unavailable = None
        self.talker = talker or HibariTalker()
        self._warm_up(codec)
        self.loops = (
            TalkerLoop(self.talker, settings.TALKER_LOOKAHEAD, vocode=False),
            CodecEncoderLoop(
                codec, settings.CODEC_PACKET_FRAMES, settings.CODEC_FIRST_PACKET_FRAMES, settings.TALKER_LOOKAHEAD
            ),
            CodecVocoderLoop(codec, settings.VOCODER_CHUNK_FRAMES, settings.VOCODER_FIRST_CHUNK_FRAMES),
        )

    def _warm_up(self, codec: Codec) -> None:
        """Encode and decode one short sentence now: the first FFT calls of a process set up plans and
        caches (~70 ms), which the first session's first packet or chunk must not pay."""
        voice = self.talker.caps.default_voice
        sentence = self.talker.talk(voice, 0, "Warm up.", 1.0, np.random.default_rng(0), None, False, vocode=False)
        decoder = codec.decoder()
        for frames in sentence.acoustic:
            decoder.push(codec.encode(frames))
        decoder.flush()

    def validate(self, request: EngineRequest) -> None:
        if self.unavailable is not None:
            raise ValueError(f"the codec is unavailable: {self.unavailable}")
        validate_voice(expect(request, SpeakRequest), self.talker.caps.voices)  # codec_output: a CodecOutput

    def calibration_request(self) -> SpeakRequest | None:
        """What admission measures this pipeline's costs on when it loads (``engine.calibration``)."""
        return None if self.unavailable else SpeakRequest(pipeline=CODEC_PIPELINE, text=CALIBRATION_TEXT, seed=0)

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return speech_end(finals)
