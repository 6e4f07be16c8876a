"""The ``audio.vad`` pipeline: Silero VAD (the ONNX model inside the faster-whisper wheel) on the engine.

Request: ``VadRequest(pcm, state)`` (built by ``omniweb.conversation.vad.VoiceActivity``; PCM16 LE 16 kHz mono,
whole 512-sample windows). Chunks: one ``VoiceProbabilities`` (one speech probability per 32 ms
window, in order, and the model's state after them), then the scheduler's ``End``. The model is
stateful across windows (an LSTM plus the last 64 samples of the previous window as context);
that state travels in the request and back in the chunk, so the session carries it and any
worker can serve its next call. ``state=None`` starts a stream.

The graph's recurrent state has a fixed batch of one and its windows form one sequence, so
sessions cannot share a device call; ``batch_run`` still runs several sessions' windows in one
worker step (one scheduler round trip for many sessions). The model is tiny (~2 MB, ~0.1 ms per
window on one CPU thread) and always runs on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from omniweb.engine.contracts import DONE, Done, ShapeSignature, StepResult, WorkPlan
from omniweb.engine.messages import End, VoiceProbabilities
from omniweb.engine.requests import VAD, EngineRequest, VadRequest, expect

PIPELINE = VAD
SAMPLE_RATE = VadRequest.SAMPLE_RATE
WINDOW_SAMPLES = VadRequest.WINDOW_SAMPLES
WINDOW_MS = VadRequest.WINDOW_MS
WINDOW_BYTES = VadRequest.WINDOW_BYTES
CONTEXT_SAMPLES = 64  # the tail of the previous window the model sees before each window
HIDDEN = 128
STATE_FLOATS = 2 * HIDDEN + CONTEXT_SAMPLES  # h, c, context
STATE_BYTES = 4 * STATE_FLOATS
MAX_WINDOWS = VadRequest.MAX_WINDOWS


def model_path() -> str:
    """The Silero VAD model faster-whisper ships in its wheel (nothing is downloaded)."""
    from faster_whisper.utils import get_assets_path

    return os.path.join(get_assets_path(), "silero_vad_v6.onnx")


class SileroVad:
    """The ONNX session, loaded once per engine process; ``probs`` is pure (state in, state out)."""

    def __init__(self) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1  # ~0.1 ms per window: more threads only add overhead
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self._session = onnxruntime.InferenceSession(
            model_path(), providers=["CPUExecutionProvider"], sess_options=opts
        )
        self.probs(bytes(WINDOW_BYTES), None)  # warm-up: the first run pays one-off allocation costs

    def probs(self, pcm: bytes, state: bytes | None) -> tuple[np.ndarray, bytes]:
        """Speech probabilities of ``pcm``'s windows and the state after the last one."""
        audio = np.frombuffer(pcm, "<i2").astype(np.float32).reshape(-1, WINDOW_SAMPLES) / 32768.0
        saved = np.zeros(STATE_FLOATS, np.float32) if state is None else np.frombuffer(state, "<f4")
        h = saved[:HIDDEN].reshape(1, 1, HIDDEN)
        c = saved[HIDDEN : 2 * HIDDEN].reshape(1, 1, HIDDEN)
        context = np.empty((audio.shape[0], CONTEXT_SAMPLES), np.float32)
        context[0] = saved[2 * HIDDEN :]
        context[1:] = audio[:-1, -CONTEXT_SAMPLES:]
        out, hn, cn = self._session.run(None, {"input": np.concatenate([context, audio], axis=1), "h": h, "c": c})
        after = np.concatenate([hn.reshape(-1), cn.reshape(-1), audio[-1, -CONTEXT_SAMPLES:]]).astype("<f4")
        return np.asarray(out, np.float32).reshape(-1), after.tobytes()


@dataclass
class VadState:
    pcm: bytes
    state: bytes | None
    done: bool = False


class VadLoop:
    """One step per request: all of its windows in one model call."""

    name = "vad"

    def __init__(self, model: SileroVad) -> None:
        self._model = model

    def init(self, request: VadRequest, slots: dict[str, Any]) -> VadState:
        return VadState(pcm=request.pcm, state=request.state)

    def _run(self, state: VadState) -> StepResult:
        probs, after = self._model.probs(state.pcm, state.state)
        chunk = VoiceProbabilities(tuple(probs.tolist()), WINDOW_MS, after)
        return StepResult(output=True, chunks=[chunk])

    def _batch_run(self, plans: Sequence[WorkPlan]) -> list[StepResult]:
        return [self._run(plan.payload) for plan in plans]  # pure: nothing changes when one raises

    def next(self, state: VadState) -> WorkPlan | Done:
        if state.done:
            return DONE
        return WorkPlan(
            kind="vad",
            shape=ShapeSignature("audio.vad"),
            run=lambda: self._run(state),
            emits=("vad",),
            payload=state,
            batch_run=self._batch_run,
            label="vad.windows",
        )

    def advance(self, state: VadState, result: StepResult) -> None:
        state.done = True

    def finalize(self, state: VadState) -> dict[str, Any]:
        return {"windows": len(state.pcm) // WINDOW_BYTES}


class VadPipeline:
    """``VadRequest``s on the process's one Silero VAD model."""

    name = PIPELINE
    shed = False  # a listening session's next windows: never refused by load shedding (a few ms each)

    def __init__(self) -> None:
        self.loops = (VadLoop(SileroVad()),)

    def validate(self, request: EngineRequest) -> None:
        vad = expect(request, VadRequest)
        pcm = vad.pcm
        if not isinstance(pcm, bytes) or not pcm or len(pcm) % WINDOW_BYTES:
            raise ValueError(f"pcm must be PCM16 bytes in whole windows of {WINDOW_SAMPLES} samples")
        if len(pcm) > MAX_WINDOWS * WINDOW_BYTES:
            raise ValueError(f"pcm holds more than {MAX_WINDOWS} windows")
        state = vad.state
        if state is not None and (not isinstance(state, bytes) or len(state) != STATE_BYTES):
            raise ValueError(f"state must be None or the {STATE_BYTES} bytes a previous call returned")

    def finish(self, finals: list[dict[str, Any]]) -> End:
        return End()
