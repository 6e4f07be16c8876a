"""Text-to-speech as two driven loops on the engine runtime: talker → vocoder.

The talker turns one sentence per step into acoustic frames and hands them to the vocoder through
the request's slots, staying at most ``lookahead`` sentences ahead (bounded memory). The vocoder
turns frames into PCM a few frames per step, so sentence *i* streams while the talker works on
sentence *i+1*, and time to first audio does not grow with the length of the flush.

In incremental mode (``TalkerLoop(..., incremental=True)``) the talker's text does not come with the
request: an upstream loop of the same request (e.g. a thinker writing an answer) appends complete
sentences to the ``TEXT_IN`` slot (``omniweb.engine.voice``) as it produces them and sets
``TEXT_IN_DONE`` when it has no more, so each sentence is spoken while the next is still being written.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from omniweb.base.devices import torch_device
from omniweb.engine.contracts import (
    DONE,
    WAITING,
    Done,
    ShapeSignature,
    StepResult,
    Waiting,
    WorkPlan,
)
from omniweb.engine.messages import Chunk, End, PcmAudio, SentenceEnd, SentenceStart, WordTiming
from omniweb.engine.requests import SPEECH, EngineRequest, SpeakingRequest, SpeakRequest, expect
from omniweb.engine.voice import TEXT_IN, TEXT_IN_DONE
from speech.tts.text import Granularity, bound_units, split_text
from speech.tts.text import WordTiming as AlignedWord

from .model import HibariTalker, SentenceFrames
from .vocoder import SAMPLE_RATE, SpectralBackend, VocoderStream, run_chunks_batched

PIPELINE = SPEECH
# Two Harvard sentences: a typical request, what admission prices a new one at before any has run.
CALIBRATION_TEXT = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
SENTENCES = "sentences"  # slot: deque[SentenceFrames], talker → vocoder
TALKER_DONE = "talker_done"
TALKER_LEAD_SECONDS = 1.0  # synthesize the next sentence this long before the listener needs it
FRAME_SECONDS = 0.0125


def rng_for(seed: int | None) -> np.random.Generator:
    """Seeded noise; int64 seeds (negative ones too) map onto numpy's unsigned seed space."""
    return np.random.default_rng(None if seed is None else seed % 2**64)


def rng_state(rng: np.random.Generator) -> str:
    """The generator's position as a JSON string (plain data, so it can cross to another worker)."""
    return json.dumps(rng.bit_generator.state)


def resume_rng(seed: int | None, state: str | None) -> np.random.Generator:
    """The seeded generator, moved to ``state`` when a request continues an earlier one's noise.

    The transport splits one utterance into several requests when it speaks before the flush; passing
    the state on keeps the noise (and so the audio) identical to speaking the utterance in one request.
    """
    rng = rng_for(seed)
    if state is not None:
        try:
            rng.bit_generator.state = json.loads(state)
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError("rng_state is not a state of this generator") from exc
    return rng


def to_pcm16(samples: np.ndarray) -> bytes:
    """Float waveform → little-endian 16-bit PCM, the same conversion hibari's write_wav uses."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


@dataclass
class TalkerState:
    sentences: list[str]
    voice: str
    speed: float
    rng: np.random.Generator
    exact_noise: bool  # seeded: hibari's own noise draw, so the audio is reproducible bit for bit
    max_frames: int | None
    frames_left: int | None  # max_frames_scope "request": what the request's cap leaves
    timestamps: bool
    slots: dict[str, Any]
    next_index: int = 0  # the next unit of ``sentences`` to cut into steps
    steps: deque[str] = field(default_factory=deque)  # the current unit's pieces not yet synthesized
    spoken: int = 0
    synthesized_seconds: float = 0.0


class TalkerLoop:
    name = "talker"

    def __init__(
        self,
        talker: HibariTalker,
        lookahead: int,
        *,
        incremental: bool = False,
        vocode: bool = True,
    ) -> None:
        self._talker = talker
        self._lookahead = max(1, lookahead)
        # Every unit, whoever wrote it (the request's split, an upstream loop), is cut to these bounds
        # before the talker sees it: a step's time and memory never grow with the text.
        self._max_unit = max(1, settings.TALKER_MAX_UNIT_CHARS)
        self._max_run = max(1, min(settings.TALKER_MAX_RUN_CHARS, self._max_unit))
        self._incremental = incremental
        self._vocode = vocode  # False: a downstream loop other than hibari's vocoder takes the frames

    def init(self, request: SpeakingRequest, slots: dict[str, Any]) -> TalkerState:
        slots[SENTENCES] = deque()
        if self._incremental:  # the list is shared: the upstream loop appends, the talker reads
            sentences = slots.setdefault(TEXT_IN, [])
            slots.setdefault(TEXT_IN_DONE, False)
            slots[TALKER_DONE] = False
        else:
            assert isinstance(request, SpeakRequest)
            # a plain str in the engine's request; split_text refuses any other value
            sentences = split_text(request.text, cast(Granularity, request.split))
            slots[TALKER_DONE] = not sentences
        return TalkerState(
            sentences=sentences,
            voice=request.voice or self._talker.caps.default_voice,
            speed=float(request.speed or 1.0),
            rng=resume_rng(request.seed, request.rng_state),
            exact_noise=request.seed is not None,
            max_frames=request.max_frames,
            frames_left=request.max_frames if request.max_frames_scope == "request" else None,
            timestamps=request.timestamps,
            slots=slots,
        )

    def _input_done(self, state: TalkerState) -> bool:
        return not self._incremental or bool(state.slots[TEXT_IN_DONE])

    def _refill(self, state: TalkerState) -> None:
        """Cut the next unit into bounded steps once the previous unit's steps are all done."""
        while not state.steps and state.next_index < len(state.sentences):
            state.steps.extend(bound_units([state.sentences[state.next_index]], self._max_unit, self._max_run))
            state.next_index += 1

    def _finished(self, state: TalkerState) -> bool:
        return not state.steps and state.next_index >= len(state.sentences) and self._input_done(state)

    def next(self, state: TalkerState) -> WorkPlan | Done | Waiting:
        self._refill(state)
        if not state.steps:
            if not self._input_done(state):
                return WAITING  # the upstream loop is still writing
            state.slots[TALKER_DONE] = True  # input ended after our last step: release the vocoder
            return DONE
        if state.frames_left == 0 and self._input_done(state):  # the request's cap is spent
            state.steps.clear()
            state.next_index = len(state.sentences)
            state.slots[TALKER_DONE] = True
            return DONE
        if len(state.slots[SENTENCES]) >= self._lookahead:
            return WAITING
        text = state.steps[0]
        index = state.spoken
        cap = state.max_frames if state.frames_left is None else state.frames_left

        def run() -> StepResult:
            out = self._talker.talk(
                state.voice,
                index,
                text,
                state.speed,
                state.rng,
                cap,
                state.timestamps,
                self._vocode,
                exact_noise=state.exact_noise,
            )
            return StepResult(output=out)

        return WorkPlan(
            kind="talker",
            shape=ShapeSignature("talker"),
            run=run,
            label=f"talker.sentence{state.spoken}",
            due=max(0.0, state.synthesized_seconds - TALKER_LEAD_SECONDS),
        )

    def advance(self, state: TalkerState, result: StepResult) -> None:
        sentence: SentenceFrames = result.output
        state.steps.popleft()
        self._refill(state)
        if sentence.acoustic:  # text with nothing to say is not a sentence on the wire
            state.slots[SENTENCES].append(sentence)
            state.spoken += 1
            state.synthesized_seconds += FRAME_SECONDS * sentence.n_frames
        if state.frames_left is not None:
            state.frames_left = max(0, state.frames_left - sentence.n_frames)
        if self._finished(state):
            state.slots[TALKER_DONE] = True

    def finalize(self, state: TalkerState) -> dict[str, Any]:
        return {"total_sentences": state.spoken, "rng_state": rng_state(state.rng)}


@dataclass
class VocoderState:
    slots: dict[str, Any]
    first_chunk_frames: int
    chunk_frames: int
    sentence: SentenceFrames | None = None
    segment: int = 0
    stream: VocoderStream | None = None
    chunks_in_sentence: int = 0
    sentences_done: int = 0


@dataclass
class _Chunk:
    state: VocoderState
    stream: VocoderStream
    start: int
    stop: int
    first_of_sentence: bool
    last_of_sentence: bool
    backend: SpectralBackend | None


class VocoderLoop:
    name = "vocoder"

    def __init__(self, chunk_frames: int, first_chunk_frames: int, backend: SpectralBackend | None = None) -> None:
        self._chunk = max(1, chunk_frames)
        self._first = max(0, first_chunk_frames)
        self._backend = backend  # None: numpy on the CPU, bit-identical to hibari

    def init(self, request: SpeakingRequest, slots: dict[str, Any]) -> VocoderState:
        first = first_chunk_frames(request, self._first, self._chunk)
        return VocoderState(slots=slots, first_chunk_frames=first, chunk_frames=self._chunk)

    def _advance_segment(self, state: VocoderState) -> bool:
        """Move to the next segment (or sentence) with frames left; False when none is ready yet."""
        while state.stream is None or state.stream.done:
            if state.sentence is not None and state.segment + 1 < len(state.sentence.segments):
                state.segment += 1
            else:
                queue: deque[SentenceFrames] = state.slots[SENTENCES]
                if not queue:
                    return False
                state.sentence = queue.popleft()
                state.segment = 0
                state.chunks_in_sentence = 0
            state.stream = state.sentence.segments[state.segment]
        return True

    def next(self, state: VocoderState) -> WorkPlan | Done | Waiting:
        if not self._advance_segment(state):
            return DONE if state.slots[TALKER_DONE] else WAITING
        stream = state.stream
        sentence = state.sentence
        assert stream is not None and sentence is not None
        size = state.first_chunk_frames if state.chunks_in_sentence == 0 else state.chunk_frames
        start, stop = stream.plan(size)
        chunk = _Chunk(
            state=state,
            stream=stream,
            start=start,
            stop=stop,
            first_of_sentence=state.chunks_in_sentence == 0,
            last_of_sentence=stop >= stream.n_frames and state.segment == len(sentence.segments) - 1,
            backend=self._backend,
        )
        plan = WorkPlan(
            kind="vocoder",
            # Chunks of any length stack into one call (the spectral step is per frame), so all of a
            # step's vocoder chunks share one signature: batches are not cut by a short last chunk.
            shape=ShapeSignature("vocoder"),
            run=lambda: _results([chunk])[0],
            emits=("audio",),
            payload=chunk,
            batch_run=_batch_run,
            label=f"vocoder.s{sentence.index}.f{start}",
        )
        # The chunk is claimed now so the next plan (after advance) continues from ``stop``.
        state.chunks_in_sentence += 1
        return plan

    def advance(self, state: VocoderState, result: StepResult) -> None:
        chunk: _Chunk = result.output
        if chunk.last_of_sentence:
            state.sentences_done += 1

    def finalize(self, state: VocoderState) -> dict[str, Any]:
        return {"sentences_vocoded": state.sentences_done}


def first_chunk_frames(request: SpeakingRequest, default: int, chunk: int) -> int:
    """A sentence's first chunk size: the request's ``first_chunk_frames`` or the setting; 0 = ``chunk``."""
    first = request.first_chunk_frames
    return (default if first is None else int(first)) or chunk


def _batch_run(plans: Sequence[WorkPlan]) -> list[StepResult]:
    return _results([p.payload for p in plans])


def _results(chunks: list[_Chunk]) -> list[StepResult]:
    """Vocode the chunks (stacked FFTs when several) and turn each into client stream chunks."""
    waves = run_chunks_batched([(c.stream, c.start, c.stop) for c in chunks], chunks[0].backend)
    results = []
    for c, wave in zip(chunks, waves, strict=True):
        sentence = c.state.sentence
        assert sentence is not None
        out = sentence_chunks(sentence, wave, SAMPLE_RATE, first=c.first_of_sentence, last=c.last_of_sentence)
        results.append(StepResult(output=c, chunks=out, media_seconds=wave.size / SAMPLE_RATE))
    return results


class SpokenSentence(Protocol):
    """What a vocoder knows of the sentence it voices (hibari's frames or the codec's codes)."""

    index: int
    text: str
    timestamps: list[AlignedWord] | None


def word_timings(timestamps: list[AlignedWord] | None) -> tuple[WordTiming, ...]:
    """``speech.tts.text.align_words``' timings as the engine's typed words."""
    return tuple(WordTiming(str(w["word"]), int(w["start_ms"]), int(w["end_ms"])) for w in timestamps or ())


def sentence_chunks(
    sentence: SpokenSentence, wave: np.ndarray, sample_rate: int, *, first: bool, last: bool
) -> list[Chunk]:
    """The client stream chunks for one vocoded piece of a sentence: its start, its PCM, its end.

    Every vocoder (hibari's, the codec's) emits exactly these, so the transport has one audio path.
    The word timings (when the request asked for them) ride both ends: at the start so a listener
    knows the words before it hears them (a conversation cut short mid-sentence keeps them), at the
    end as the speech endpoint sends them.
    """
    out: list[Chunk] = []
    words = word_timings(sentence.timestamps)
    if first:
        out.append(SentenceStart(sentence.index, sentence.text, words))
    if wave.size:
        out.append(PcmAudio(to_pcm16(wave), sample_rate, sentence.index))
    if last:
        out.append(SentenceEnd(sentence.index, words))
    return out


def vocoder_backend() -> SpectralBackend | None:
    """The vocoder's spectral step on the configured device: torch on CUDA, numpy on the CPU.

    On the CPU numpy is both faster than torch here and bit-identical to hibari (bench/batching.py).
    """
    device = torch_device("vocoder")  # OMNIWEB_VOCODER_DEVICE, else OMNIWEB_DEVICE
    if device == "cpu":
        return None
    from .vocoder_torch import TorchBackend

    try:
        return TorchBackend(device)
    except ValueError as exc:
        raise ImproperlyConfigured(f"vocoder device {device!r}: {exc}") from exc


def validate_voice(request: SpeakingRequest, voices: tuple[str, ...]) -> None:
    """The talker settings of any pipeline that speaks: one of ``voices`` (those on disk) and a speed in range."""
    voice = request.voice
    if voice is not None and voice not in voices:
        raise ValueError(f"Unknown voice '{voice}'; available voices: {', '.join(voices)}")
    speed = float(request.speed or 1.0)
    if not 0.25 <= speed <= 4.0:
        raise ValueError("speed must be between 0.25 and 4.0")
    if request.rng_state is not None:
        resume_rng(request.seed, request.rng_state)


def speech_end(finals: list[dict[str, Any]]) -> End:
    """The talker's count of spoken sentences and where its noise generator stopped."""
    return End(sentences=finals[0]["total_sentences"], rng_state=finals[0]["rng_state"])


class TtsPipeline:
    """talker → vocoder for ``SpeakRequest``s.

    Besides the text and voice settings a request may carry ``rng_state`` (an earlier ``End``'s, to
    continue its seeded noise) and ``max_frames_scope="request"`` (``max_frames`` caps the whole
    request instead of each sentence). ``paced=False`` (read by the scheduler) makes the audio as
    fast as it can, for a file nobody hears until it is whole.
    """

    name = PIPELINE

    def __init__(self, talker: HibariTalker | None = None) -> None:
        """``talker``: the process's shared (thread-safe) talker, instead of loading the voice again."""
        self.talker = talker or HibariTalker()
        self.loops = (
            TalkerLoop(self.talker, settings.TALKER_LOOKAHEAD),
            VocoderLoop(settings.VOCODER_CHUNK_FRAMES, settings.VOCODER_FIRST_CHUNK_FRAMES, vocoder_backend()),
        )

    def validate(self, request: EngineRequest) -> None:
        validate_voice(expect(request, SpeakRequest), self.talker.caps.voices)

    def calibration_request(self) -> SpeakRequest:
        """What admission measures this pipeline's costs on when it loads (``engine.calibration``)."""
        return SpeakRequest(pipeline=PIPELINE, text=CALIBRATION_TEXT, seed=0)

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return speech_end(finals)
