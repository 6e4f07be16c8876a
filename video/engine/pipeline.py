"""The ``video.turn`` pipeline: thinker → talker → vocoder on the engine runtime.

Request: an ``AnswerRequest`` (``omniweb.engine.requests``; built by the conversation core's turn
runner): the question, its audio (PCM16 LE 16 kHz mono), the frames, the history, the modalities,
the voice, ``timestamps`` (the talker times each spoken word, as for the speech endpoint) and
``transcribe`` (also transcribe the audio when there is a question: it follows the text).

Chunks, in order per kind: ``Transcript`` (only when the question came from the audio, or with
``transcribe``; before any text); ``TextDelta``s; ``TextEnd`` once the answer's text is complete
(not after a thinker failure), so it can be shown before its audio ends; when "audio" is in the
modalities the voice's loops' (``omniweb.engine.voice``: the speech app's talker and vocoder)
``SentenceStart`` / ``PcmAudio`` (24 kHz) / ``SentenceEnd`` (both ends carry the sentence's word
timings when asked for), each sentence spoken as soon as the thinker has completed it; then the
scheduler's ``End``. On success it carries ``text`` (the whole answer) and
``transcript`` (when there was one). When the thinker fails in a way the client may hear about (the
upstream server refused, timed out, sent garbage), the ``End`` has ``Status.ERROR``, kind
``upstream_failure`` and a client-safe ``message`` of ours, plus the ``text`` streamed so far.

The thinker loop's first steps transcribe the audio (the shared recognizer's, batched with other
requests') when the question is empty; then each step
asks the thinker for its next deltas and hands every completed sentence to the talker (the
talker's incremental mode), so the first sentence is spoken while the thinker still writes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from omniweb.asr.pipeline import Recognition, Recognizer, shared_recognizer
from omniweb.asr.whisper import Options as AsrOptions
from omniweb.base.errors import ErrorKind
from omniweb.engine.contracts import DONE, Done, ShapeSignature, StepResult, WaitFor, Waiting, WorkPlan
from omniweb.engine.messages import Chunk, End, Status, TextDelta, TextEnd, Transcript
from omniweb.engine.requests import VIDEO_TURN, AnswerRequest, EngineRequest, ToolChoice, expect
from omniweb.engine.voice import TEXT_IN, TEXT_IN_DONE, voice
from omniweb.llm.chat import Piece

from .llm import LlmThinker
from .sentences import SentenceStream
from .thinkers import Frame, SceneThinker, Thinker, ThinkerError, ThinkerRun, Turn, WaitableRun

PIPELINE = VIDEO_TURN
CALIBRATION_QUESTION = "What can you tell me about what you see right now?"  # a typical first question
MODALITIES = ("text", "audio")
NOTHING_HEARD = "Sorry, I didn't catch a question in the audio."


@dataclass
class ThinkerState:
    request: AnswerRequest
    slots: dict[str, Any]
    speak: bool  # "audio" in modalities: hand sentences to the talker
    listening: bool  # the question is still to be transcribed from the audio
    recognition: Recognition | None = None
    transcript: str | None = None
    run: ThinkerRun | None = None
    done: bool = False
    error: str | None = None
    text: list[str] = field(default_factory=list)
    sentences: SentenceStream = field(default_factory=SentenceStream)


@dataclass
class _Thought:
    """A thinking step's output; it carries the run only from the first step (see ``_think_plan``)."""

    deltas: list[Piece]
    done: bool
    run: ThinkerRun | None = None  # the run the first step started
    error: str | None = None


class ThinkerLoop:
    name = "thinker"

    def __init__(self, thinker: Thinker, recognizer: Recognizer) -> None:
        self._thinker = thinker
        self._recognizer = recognizer

    def init(self, request: AnswerRequest, slots: dict[str, Any]) -> ThinkerState:
        speak = "audio" in (request.modalities or MODALITIES)
        slots[TEXT_IN] = []
        slots[TEXT_IN_DONE] = not speak  # text only: the talker and vocoder finish without a step
        question = request.question
        listening = bool(request.audio) and (not question.strip() or request.transcribe)
        state = ThinkerState(
            request=request,
            slots=slots,
            speak=speak,
            listening=listening,
            sentences=SentenceStream(first_clause=self._thinker.language_model),
        )
        if listening:
            state.recognition = self._recognizer.start(request.audio, AsrOptions())
        return state

    def next(self, state: ThinkerState) -> WorkPlan | Done | Waiting | WaitFor:
        if state.done:
            return DONE
        if state.listening:
            return self._listen_plan(state)
        run = state.run
        if isinstance(run, WaitableRun) and run.pending():
            return WaitFor(run.subscribe)  # nothing has arrived: hold no worker until it does
        return self._think_plan(state)

    def _listen_plan(self, state: ThinkerState) -> WorkPlan | Done:
        """The question's next recognition step, on the shared recognizer: it batches with other
        sessions' transcriptions and the turn can be dropped between two steps."""
        assert state.recognition is not None
        plan = self._recognizer.plan(state.recognition, "thinker.asr")
        if isinstance(plan, Done):  # silence, nothing to decode: one step says what was heard
            return WorkPlan(kind="asr", shape=ShapeSignature("asr.silent"), run=StepResult, label="thinker.asr")
        return plan

    def _think_plan(self, state: ThinkerState) -> WorkPlan:
        # Later steps reach the run through a weak reference: a step still queued when its request
        # is aborted (release has closed the run) must not keep the run alive or use it.
        ref = weakref.ref(state.run) if state.run is not None else None
        turn = None if ref is not None else self._turn(state)
        thinker = self._thinker

        def run() -> StepResult:
            started = None
            if ref is None:
                assert turn is not None
                current = started = thinker.start(turn)
            else:
                found = ref()
                if found is None:  # the request is gone
                    return StepResult(output=_Thought([], True))
                current = found
            try:
                deltas = current.step()
            except ThinkerError as exc:
                current.close()
                return StepResult(output=_Thought([], True, started, str(exc)))
            chunks: list[Chunk] = [TextDelta(d) if isinstance(d, str) else d for d in deltas]
            if current.done:
                chunks.append(TextEnd())
            return StepResult(output=_Thought(deltas, current.done, started), chunks=chunks)

        return WorkPlan(
            kind="thinker",
            shape=ShapeSignature(f"thinker.{thinker.name}"),
            run=run,
            label="thinker.step",
        )

    def _turn(self, state: ThinkerState) -> Turn:
        request = state.request
        question = request.question
        if state.transcript is not None:  # heard: the question, or what follows the typed text
            question = f"{question.strip()} {state.transcript}".strip() if question.strip() else state.transcript
        return Turn(
            question=question,
            frames=[Frame(frame_id=f.frame_id, data=f.data, pts_ms=f.pts_ms) for f in request.frames],
            history=[
                {"role": h.role, "content": h.content}
                for h in request.history
                if h.role in ("user", "assistant") and h.content
            ],
            system_prompt=request.system_prompt,
            model=request.model,
            entries=request.history,
            tools=request.tools,
            tool_choice=request.tool_choice,
            tool_name=request.tool_name,
            parallel_tool_calls=request.parallel_tool_calls,
            max_tokens=request.max_tokens,
        )

    def advance(self, state: ThinkerState, result: StepResult) -> None:
        if state.listening:
            recognition = state.recognition
            assert recognition is not None
            if result.output is not None:
                self._recognizer.advance(recognition, result)
            if recognition.done:
                self._heard(state, recognition.text, result)
            return
        thought: _Thought = result.output
        if thought.run is not None:
            state.run = thought.run
        self._add(state, [d for d in thought.deltas if isinstance(d, str)])
        if thought.error is not None:
            state.error = thought.error
            state.done = True
            state.slots[TEXT_IN_DONE] = True  # sentences already handed over are still spoken
        elif thought.done:
            self._finish(state)

    def _heard(self, state: ThinkerState, text: str, result: StepResult) -> None:
        state.listening = False
        state.transcript = text
        result.chunks.append(Transcript(text))
        if not text and not state.request.question.strip():  # nothing to answer: say so
            result.chunks += [TextDelta(NOTHING_HEARD), TextEnd()]
            self._add(state, [NOTHING_HEARD])
            self._finish(state)

    def _add(self, state: ThinkerState, deltas: list[str]) -> None:
        for delta in deltas:
            state.text.append(delta)
            if state.speak:
                state.slots[TEXT_IN].extend(state.sentences.feed(delta))

    def _finish(self, state: ThinkerState) -> None:
        if state.speak:
            state.slots[TEXT_IN].extend(state.sentences.flush())
        state.slots[TEXT_IN_DONE] = True
        state.done = True

    def finalize(self, state: ThinkerState) -> dict[str, Any]:
        self.release(state)
        usage = state.run.usage if state.run is not None else None  # the model's (prompt, completion)
        return {"text": "".join(state.text), "transcript": state.transcript, "error": state.error, "usage": usage}

    def release(self, state: ThinkerState) -> None:
        """Close an upstream stream now, also when the turn is interrupted (the scheduler calls this)."""
        if state.run is not None:
            state.run.close()


class VideoTurnPipeline:
    """thinker → talker → vocoder for ``AnswerRequest``s."""

    name = PIPELINE

    def __init__(self) -> None:
        self.voice = voice()  # the server's voice (the speech app's), reached by name
        self.thinker = make_thinker()
        self.recognizer = shared_recognizer()  # one Whisper per process: every transcription batches on it
        self.loops = (ThinkerLoop(self.thinker, self.recognizer), *self.voice.speaking_loops())

    def validate(self, request: EngineRequest) -> None:
        answer = expect(request, AnswerRequest)
        if not all(f.data for f in answer.frames):
            raise ValueError("frames must carry image bytes")
        names = {t.name for t in answer.tools}
        if answer.tool_choice is ToolChoice.FUNCTION and answer.tool_name not in names:
            raise ValueError("tool_name must name one of the tools")
        forced = answer.tool_choice in (ToolChoice.REQUIRED, ToolChoice.FUNCTION)
        if (answer.tools or forced) and not self.thinker.language_model:
            raise ValueError("tool calling needs a language model (OMNIWEB_THINKER=llm)")
        self.voice.validate(answer)

    def calibration_request(self) -> AnswerRequest | None:
        """What admission measures a turn's costs on when it loads (``engine.calibration``): a typed
        question answered aloud. A language model (behind HTTP, or in its own threads) is not the
        engine's work to measure: its turns' costs are learned from the first ones."""
        return None if self.thinker.language_model else AnswerRequest(question=CALIBRATION_QUESTION, seed=0)

    def finish(self, finals: list[dict[str, Any]]) -> End:
        thought = finals[0]
        prompt_tokens, completion_tokens = thought["usage"] or (None, None)
        result = {
            "text": thought["text"],
            "transcript": thought["transcript"],
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
        }
        if thought["error"] is not None:  # the language model failed: what was streamed, and why
            return End(status=Status.ERROR, kind=ErrorKind.UPSTREAM, message=thought["error"], **result)
        return End(**result)


def make_thinker() -> Thinker:
    """The thinker ``OMNIWEB_THINKER`` names; a bad configuration is a start-up error."""
    kind = settings.THINKER.strip().lower()
    if kind == "scene":
        return SceneThinker()
    if kind == "llm":
        return LlmThinker.from_settings()
    raise ImproperlyConfigured(f"OMNIWEB_THINKER must be 'scene' or 'llm', not {settings.THINKER!r}")
