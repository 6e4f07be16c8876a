"""Which device each model runs on: ``OMNIWEB_DEVICE`` for all, ``OMNIWEB_<MODEL>_DEVICE`` for one.

``OMNIWEB_TTS_DEVICE`` (the talker, onnxruntime), ``OMNIWEB_VOCODER_DEVICE`` (hibari's vocoder,
torch on CUDA), ``OMNIWEB_ASR_DEVICE`` (Whisper, CTranslate2) and ``OMNIWEB_VISION_DEVICE`` (the
video perception models) each default to ``OMNIWEB_DEVICE`` (``cpu``). A device is ``cpu``,
``cuda`` or ``cuda:N``; anything else is a start-up error, not a silent fallback to the CPU.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

MODELS = ("tts", "vocoder", "asr", "vision")


def parse_device(value: str, name: str = "OMNIWEB_DEVICE") -> tuple[str, int]:
    """``("cpu", 0)`` or ``("cuda", index)``; ``ImproperlyConfigured`` naming the setting otherwise."""
    device = value.strip().lower()
    if device == "cpu":
        return "cpu", 0
    kind, colon, index = device.partition(":")
    if kind == "cuda" and (not colon or index.isdigit()):
        return "cuda", int(index or 0)
    raise ImproperlyConfigured(f"{name} must be 'cpu', 'cuda' or 'cuda:N', not {value!r}")


def device_for(model: str) -> tuple[str, int]:
    """The parsed device of one model (one of ``MODELS``)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    value = getattr(settings, f"{model.upper()}_DEVICE", "") or settings.DEVICE
    return parse_device(value, f"OMNIWEB_{model.upper()}_DEVICE" if value != settings.DEVICE else "OMNIWEB_DEVICE")


def torch_device(model: str) -> str:
    """The device as torch spells it: ``cpu`` or ``cuda:N``."""
    kind, index = device_for(model)
    return "cpu" if kind == "cpu" else f"cuda:{index}"
