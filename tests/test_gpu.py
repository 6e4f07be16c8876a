"""The CUDA configuration end to end: talker, vocoder and Whisper on the GPU (skipped without one).

``bench/gpu_check.py`` runs these first on a machine with a CUDA device. Results on the GPU are
compared with the CPU's, not bit for bit (cuDNN, cuFFT and float16 Whisper round differently), but
closely enough that a wrong device path (garbage, silence, a truncated stream) fails.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from django.test import override_settings
from support.voice import synthesize

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

TEXT = "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore."


def speak(pipeline: Any, text: str, seed: int) -> bytes:
    chunks = synthesize(pipeline, workers=2, text=text, seed=seed)
    assert chunks[-1]["status"] == "ok", chunks[-1]
    return b"".join(c["pcm"] for c in chunks if c["type"] == "audio")


@pytest.fixture(scope="module")
def cpu_pipeline() -> Any:
    from speech.tts.loops import TtsPipeline

    with override_settings(DEVICE="cpu", TTS_DEVICE="", VOCODER_DEVICE=""):
        return TtsPipeline()


@pytest.fixture(scope="module")
def gpu_pipeline() -> Any:
    import onnxruntime as ort

    from speech.tts.loops import TtsPipeline

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.fail("a CUDA device but onnxruntime without its CUDA provider: install requirements-gpu.txt")
    with override_settings(DEVICE="cuda", TTS_DEVICE="", VOCODER_DEVICE=""):
        pipeline = TtsPipeline()
    assert pipeline.loops[1]._backend is not None  # the vocoder runs in torch on the GPU
    return pipeline


def test_the_talker_runs_on_the_gpu_and_agrees_with_the_cpu(cpu_pipeline, gpu_pipeline):
    providers = next(iter(gpu_pipeline.talker._sessions.values())).get_providers()
    assert providers[0] == "CUDAExecutionProvider"
    text, voice = "Streaming speech should never stall.", cpu_pipeline.talker.caps.default_voice
    cpu = cpu_pipeline.talker.talk(voice, 0, text, 1.0, np.random.default_rng(0), None, False)
    gpu = gpu_pipeline.talker.talk(voice, 0, text, 1.0, np.random.default_rng(0), None, False)
    assert abs(gpu.n_frames - cpu.n_frames) <= max(2, cpu.n_frames // 50)  # durations may round differently
    n = min(gpu.acoustic[0].n_frames, cpu.acoustic[0].n_frames)
    diff = np.abs(gpu.acoustic[0].lh[:, :n] - cpu.acoustic[0].lh[:, :n]).mean()
    assert diff < 0.05, diff


def test_the_gpu_pipeline_streams_the_same_speech_as_the_cpu(cpu_pipeline, gpu_pipeline):
    cpu = np.frombuffer(speak(cpu_pipeline, TEXT, 3), "<i2").astype(np.float32)
    gpu = np.frombuffer(speak(gpu_pipeline, TEXT, 3), "<i2").astype(np.float32)
    assert abs(gpu.size - cpu.size) <= cpu.size // 20
    rms_cpu, rms_gpu = np.sqrt(np.mean(cpu**2)), np.sqrt(np.mean(gpu**2))
    assert rms_gpu > 0.5 * rms_cpu and rms_gpu < 2.0 * rms_cpu  # speech, not silence or noise blasts


def test_whisper_transcribes_on_the_gpu(cpu_pipeline):
    from scipy.signal import resample_poly

    from omniweb.asr.pipeline import Recognizer
    from omniweb.asr.whisper import Options, Whisper

    pcm24 = np.frombuffer(speak(cpu_pipeline, "The quick brown fox jumps over the lazy dog.", 1), "<i2")
    pcm16 = np.clip(resample_poly(pcm24.astype(np.float32), 2, 3), -32768, 32767).astype("<i2").tobytes()
    with override_settings(DEVICE="cpu", ASR_DEVICE="cuda"):
        recognizer = Recognizer(Whisper())
    text = recognizer.run(recognizer.start(pcm16, Options())).text.lower()
    assert "quick brown fox" in text, text
