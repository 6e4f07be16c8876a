"""Per-model devices: OMNIWEB_DEVICE for all, OMNIWEB_<MODEL>_DEVICE for one, refused when unusable."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from omniweb.base.devices import device_for, parse_device, torch_device


def test_devices_parse_cpu_cuda_and_an_index():
    assert parse_device("cpu") == ("cpu", 0)
    assert parse_device(" CUDA ") == ("cuda", 0)
    assert parse_device("cuda:3") == ("cuda", 3)
    for bad in ("gpu", "cuda:", "cuda:x", "mps", ""):
        with pytest.raises(ImproperlyConfigured, match="must be 'cpu', 'cuda' or 'cuda:N'"):
            parse_device(bad)


def test_each_model_defaults_to_omniweb_device_and_can_be_set_alone():
    with override_settings(DEVICE="cuda:1", TTS_DEVICE="", VOCODER_DEVICE="", ASR_DEVICE="cpu", VISION_DEVICE=""):
        assert device_for("tts") == ("cuda", 1)
        assert torch_device("vocoder") == "cuda:1"
        assert device_for("asr") == ("cpu", 0)
        assert device_for("vision") == ("cuda", 1)
    with (
        override_settings(DEVICE="cpu", VOCODER_DEVICE="tpu"),
        pytest.raises(ImproperlyConfigured, match="OMNIWEB_VOCODER_DEVICE"),
    ):
        device_for("vocoder")
    with pytest.raises(ValueError, match="unknown model"):
        device_for("talkerz")


def test_a_cuda_talker_without_a_cuda_onnxruntime_is_a_start_up_error():
    import onnxruntime as ort

    from speech.tts.model import _providers

    with override_settings(DEVICE="cpu", TTS_DEVICE="cuda:0"):
        if "CUDAExecutionProvider" in ort.get_available_providers():
            assert _providers()[0] == ("CUDAExecutionProvider", {"device_id": "0"})
        else:
            with pytest.raises(ImproperlyConfigured, match="onnxruntime-gpu"):
                _providers()
    with override_settings(DEVICE="cuda", TTS_DEVICE="cpu"):
        assert _providers() == ["CPUExecutionProvider"]


def test_the_vocoder_follows_its_own_device():
    import torch

    from speech.tts.loops import vocoder_backend

    with override_settings(DEVICE="cuda", VOCODER_DEVICE="cpu"):
        assert vocoder_backend() is None  # numpy on the host
    with override_settings(DEVICE="cpu", VOCODER_DEVICE="cuda:0"):
        if torch.cuda.is_available():
            assert vocoder_backend() is not None
        else:
            with pytest.raises(ImproperlyConfigured, match="vocoder device 'cuda:0'"):
                vocoder_backend()
