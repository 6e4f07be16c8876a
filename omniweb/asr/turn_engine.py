"""The ``audio.turn`` pipeline: Smart Turn v3.2 (an end-of-turn model) on the engine.

Request: ``EndOfTurnRequest(windows)`` (built by ``omniweb.conversation.vad.SemanticVoiceActivity``; PCM16 LE
16 kHz mono, each <= 8 s). Chunks: one ``TurnProbabilities`` (per window, the probability that the
speaker has finished their turn at the window's end), then the scheduler's ``End``.

The model is the int8 ONNX file that pipecat-ai's wheel (BSD-2-Clause) ships; it is read from the
installed wheel (``requirements-vision.txt``, installed without its dependencies), never downloaded,
and none of pipecat's code is imported. Its input is Whisper's log-mel spectrogram (80 bins, 10 ms
hops) of exactly 8 s: the last 8 s of the window, zero-padded at the front, normalized to zero mean
and unit variance first (as pipecat's ``LocalSmartTurnAnalyzerV3`` feeds it). faster-whisper's
``FeatureExtractor`` computes that spectrogram (equal to pipecat's own numpy copy of transformers'
within 1e-6; tests/test_semantic_turn.py checks it), so transformers is not needed.

Every window has the same shape, so ``batch_run`` stacks all the windows of all the sessions that
asked at once into one model call. The model runs on the CPU (~75 ms per window on one thread).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omniweb.engine.contracts import DONE, Done, ShapeSignature, StepResult, WorkPlan
from omniweb.engine.messages import End, TurnProbabilities
from omniweb.engine.requests import END_OF_TURN, EndOfTurnRequest, EngineRequest, expect

PIPELINE = END_OF_TURN
SAMPLE_RATE = EndOfTurnRequest.SAMPLE_RATE
WINDOW_SECONDS = EndOfTurnRequest.WINDOW_SECONDS
WINDOW_SAMPLES = WINDOW_SECONDS * SAMPLE_RATE  # the model sees exactly this much audio
MAX_WINDOWS = EndOfTurnRequest.MAX_WINDOWS
MODEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
MODEL_DIST = "pipecat-ai"
_NORM_EPS = 1e-7  # the variance floor of Whisper's feature extractor's normalization


class ModelMissing(RuntimeError):
    """The Smart Turn file is not installed (``pip install --no-deps -r requirements-vision.txt``)."""


def model_path() -> Path:
    """The Smart Turn file inside the installed pipecat-ai wheel, found through the wheel's metadata
    (importing ``pipecat`` would need its dependencies, which are not installed)."""
    try:
        dist = importlib.metadata.distribution(MODEL_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelMissing(
            f"{MODEL_DIST} is not installed: run pip install --no-deps -r requirements-vision.txt"
        ) from None
    path = Path(str(dist.locate_file(MODEL_FILE)))
    if not path.is_file():
        raise ModelMissing(
            f"{MODEL_DIST} {dist.version} has no {MODEL_FILE}; requirements-vision.txt pins the one that does"
        )
    return path


@functools.cache
def _extractor() -> Any:
    """One extractor per process: it precomputes its mel filters."""
    from faster_whisper.feature_extractor import FeatureExtractor

    return FeatureExtractor(chunk_length=WINDOW_SECONDS)


def features(pcm: bytes) -> np.ndarray:
    """The model's input for one window: (80, 800) float32 log-mel of its last 8 s."""
    audio = np.frombuffer(pcm, "<i2").astype(np.float32)[-WINDOW_SAMPLES:] / 32768.0
    audio = np.pad(audio, (WINDOW_SAMPLES - audio.size, 0))
    audio = (audio - audio.mean()) / np.sqrt(audio.var() + _NORM_EPS)
    return np.asarray(_extractor()(audio, padding=0), np.float32)


class SmartTurn:
    """The ONNX session, loaded once per engine process; ``probs`` is pure."""

    def __init__(self) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1  # the engine's workers are the parallelism
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self._session = onnxruntime.InferenceSession(
            str(model_path()), providers=["CPUExecutionProvider"], sess_options=opts
        )
        self.probs([bytes(2 * SAMPLE_RATE)])  # warm-up: the first run pays one-off allocation costs

    def probs(self, windows: Sequence[bytes]) -> np.ndarray:
        """P(the turn is complete at the window's end), one per window, in one model call."""
        batch = np.stack([features(w) for w in windows])
        (out,) = self._session.run(None, {"input_features": batch})
        return np.asarray(out, np.float32).reshape(-1)


@dataclass
class TurnState:
    windows: list[bytes]
    done: bool = False


class TurnLoop:
    """One step per request: its windows, batched with other sessions' into one model call."""

    name = "turn"

    def __init__(self, model: SmartTurn) -> None:
        self._model = model

    def init(self, request: EndOfTurnRequest, slots: dict[str, Any]) -> TurnState:
        return TurnState(windows=list(request.windows))

    def _run(self, state: TurnState) -> StepResult:
        return self._batch_run_states([state])[0]

    def _batch_run_states(self, states: Sequence[TurnState]) -> list[StepResult]:
        probs = self._model.probs([w for s in states for w in s.windows]).tolist()
        results, at = [], 0
        for state in states:  # pure: nothing changes when the call raises
            mine, at = probs[at : at + len(state.windows)], at + len(state.windows)
            results.append(StepResult(output=True, chunks=[TurnProbabilities(tuple(mine))]))
        return results

    def _batch_run(self, plans: Sequence[WorkPlan]) -> list[StepResult]:
        return self._batch_run_states([plan.payload for plan in plans])

    def next(self, state: TurnState) -> WorkPlan | Done:
        if state.done:
            return DONE
        return WorkPlan(
            kind="turn",
            shape=ShapeSignature("audio.turn"),
            run=lambda: self._run(state),
            emits=("turn",),
            payload=state,
            batch_run=self._batch_run,
            label="turn.windows",
            long=True,  # a batch of sessions' windows holds its worker for hundreds of ms
        )

    def advance(self, state: TurnState, result: StepResult) -> None:
        state.done = True

    def finalize(self, state: TurnState) -> dict[str, Any]:
        return {"windows": len(state.windows)}


class TurnPipeline:
    """``EndOfTurnRequest``s on the process's one Smart Turn model."""

    name = PIPELINE
    shed = False  # a listening session's end-of-turn check: never refused by load shedding (a few ms)

    def __init__(self) -> None:
        self.loops = (TurnLoop(SmartTurn()),)

    def validate(self, request: EngineRequest) -> None:
        windows = expect(request, EndOfTurnRequest).windows
        if not 1 <= len(windows) <= MAX_WINDOWS:
            raise ValueError(f"windows must be a list of 1 to {MAX_WINDOWS} PCM16 windows")
        for window in windows:
            if not isinstance(window, bytes) or not window or len(window) % 2:
                raise ValueError("each window must be non-empty PCM16 bytes")
            if len(window) > 2 * WINDOW_SAMPLES:
                raise ValueError(f"a window holds at most {WINDOW_SECONDS} s of 16 kHz audio")

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End()
