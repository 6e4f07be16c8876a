"""The hibari voice as a talker: text → phonemes → 12.5 ms acoustic frames plus phoneme durations.

The ONNX graph is loaded with one extra output, the per-phoneme durations it computes internally
(``/Cast_32_output_0``, in units of two frames), so word timestamps come from the model itself.
Only voices already on disk are offered: hibari downloads other voices on first use, which must
never happen here (no network), so that path is never taken.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from functools import cache

import numpy as np
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from omniweb.base.devices import device_for
from omniweb.engine.voice import Capabilities
from omniweb.media.containers import available_formats
from speech.tts.text import WordTiming, align_words, model_text

from .vocoder import AcousticFrames, VocoderStream, draw_noise

logger = logging.getLogger(__name__)

DURATION_TENSOR = "/Cast_32_output_0"
FRAMES_PER_DURATION_UNIT = 2
LANGUAGES = ("en", "en-us", "english", "auto")


@dataclass
class SentenceFrames:
    """One sentence of talker output, handed to the vocoder loop."""

    index: int
    text: str
    acoustic: list[AcousticFrames]  # one per phoneme segment: the talker's frames
    segments: list[VocoderStream]  # the same segments ready to vocode (empty when not vocoding)
    timestamps: list[WordTiming] | None

    @property
    def n_frames(self) -> int:
        return sum(f.n_frames for f in self.acoustic)


def local_voices() -> tuple[str, ...]:
    """Voices whose model is on disk now (bundled or already cached): never triggers a download."""
    from hibari import voices

    found = []
    for name in voices.VOICES:
        try:
            voices.voice_path(name, download_missing=False)
        except FileNotFoundError:
            continue
        found.append(name)
    return tuple(found)


@cache
def capabilities() -> Capabilities:
    voices = local_voices()
    if settings.TTS_DEFAULT_VOICE not in voices:
        raise ImproperlyConfigured(
            f"OMNIWEB_TTS_VOICE={settings.TTS_DEFAULT_VOICE!r} is not on disk; available: {', '.join(voices)}"
        )
    return Capabilities(
        model_names=(settings.TTS_MODEL_NAME, "hibari"),
        voices=voices,
        default_voice=settings.TTS_DEFAULT_VOICE,
        languages=LANGUAGES,
        response_formats=available_formats(),
    )


def _providers() -> list[str | tuple[str, dict[str, str]]]:
    """onnxruntime providers for the talker's device (``OMNIWEB_TTS_DEVICE``, else ``OMNIWEB_DEVICE``)."""
    import onnxruntime as ort

    kind, index = device_for("tts")
    if kind == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ImproperlyConfigured(
            "the talker's device is cuda but this onnxruntime build has no CUDA provider "
            "(install requirements-gpu.txt, with onnxruntime-gpu, on GPU hosts)"
        )
    if hasattr(ort, "preload_dlls"):  # the CUDA/cuDNN libraries from the nvidia-* wheels, before a session
        ort.preload_dlls()
    return [("CUDAExecutionProvider", {"device_id": str(index)}), "CPUExecutionProvider"]


class HibariTalker:
    """Holds one ONNX session per local voice and the G2P; ``talk`` is thread-safe."""

    def __init__(self) -> None:
        import onnx
        import onnxruntime as ort
        from hibari import Hibari, voices

        self.caps = capabilities()
        self._sessions: dict[str, ort.InferenceSession] = {}
        self._hibari: dict[str, Hibari] = {}
        self._g2p_lock = threading.Lock()
        providers = _providers()
        for name in self.caps.voices:
            model = onnx.load(voices.voice_path(name, download_missing=False))
            model.graph.output.append(onnx.helper.make_tensor_value_info(DURATION_TENSOR, onnx.TensorProto.INT64, None))
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = opts.inter_op_num_threads = settings.TTS_THREADS
            opts.log_severity_level = 3
            self._sessions[name] = ort.InferenceSession(model.SerializeToString(), opts, providers=providers)
            # Hibari(model=...) never consults the voice registry's download path.
            self._hibari[name] = Hibari(voice=name, model=voices.voice_path(name, download_missing=False))
        self.talk(self.caps.default_voice, 0, "Warm up.", 1.0, np.random.default_rng(0), None, True)

    def talk(
        self,
        voice: str,
        index: int,
        text: str,
        speed: float,
        rng: np.random.Generator,
        max_frames: int | None,
        timestamps: bool,
        vocode: bool = True,
        exact_noise: bool = True,
    ) -> SentenceFrames:
        """Synthesize one sentence's acoustic frames; noise is drawn in order from the request's rng.

        ``vocode=False`` (the codec path) skips what only hibari's vocoder needs: the noise draw and
        the excitation, about a fifth of a talker step. ``exact_noise=False`` (unseeded requests,
        whose noise nobody can reproduce anyway) leaves the noise to the vocoder, which draws each
        chunk's frames from ``rng`` when it runs them: the same distribution, but the draw (about a
        tenth of a talker step) is no longer paid before a sentence's first audio.
        """
        hib = self._hibari[voice]
        sess = self._sessions[voice]
        with self._g2p_lock:  # the G2P keeps per-call state; the ONNX run below is thread-safe
            phonemes = hib.phonemize(model_text(text))
        acoustic: list[AcousticFrames] = []
        segments: list[VocoderStream] = []
        aligned: list[tuple[str, np.ndarray]] = []
        budget = max_frames
        for ps in phonemes:
            ids = hib.ids(ps)
            if len(ids) < 3 or budget == 0:
                continue
            out = sess.run(None, {"ids": np.asarray([ids], np.int64), "speed": np.asarray([speed], np.float32)})
            lh, th, ln, lr, phi, f0 = (o[0] for o in out[:6])
            dur = out[6]  # [ids]: one duration per phoneme id, pads included
            n = lh.shape[1]
            if budget is not None:
                n = min(n, budget)
                budget -= n
            if n == 0:
                continue
            noise = draw_noise(rng, n) if vocode and exact_noise else None
            frames = AcousticFrames(lh[:, :n], th[:, :n], ln[:, :n], lr[:, :n], phi[:, :n], f0[:n], noise)
            if vocode:  # built here, on the worker, not under the scheduler's lock
                stream = VocoderStream(frames, noise_rng=None if exact_noise else rng)
                segments.append(stream)
                frames = stream.frames  # the stream's copy: the segment is not held twice
            acoustic.append(frames)
            aligned.append((ps, dur))
        words = None
        if timestamps and acoustic:
            with self._g2p_lock:
                words = align_words(text, aligned, hib.vocab, hib.g2p)
            total_ms = round(sum(f.n_frames for f in acoustic) * 12.5)
            words = [
                {**w, "start_ms": min(int(w["start_ms"]), total_ms), "end_ms": min(int(w["end_ms"]), total_ms)}
                for w in words
            ]
        return SentenceFrames(index=index, text=text, acoustic=acoustic, segments=segments, timestamps=words)
