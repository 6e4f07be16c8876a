"""The vocoder's spectral step in torch, on a configurable device ("cpu", "cuda", "cuda:1").

``run_chunks_batched(items, backend=TorchBackend(device))`` stacks the frames of every chunk
in the batch on the host (as for the numpy backend), moves each stacked array to the device
in one transfer, runs the pulse-train rfft, the branch combination and the windowed irfft
there in float32/complex64, and brings the windowed frames back in one transfer. The
overlap-add stays per stream on the host.

The maths is hibari.dsp.synth's; the result matches the numpy backend to float32 rounding
(max abs difference ~2e-7 on real speech; the tests require 1e-4), not bit for bit: torch's
FFT and transcendental functions round differently from scipy's and numpy's.

On the CPU this backend is slower than the numpy one (~85 µs fixed cost per call and ~13 µs
per frame with one thread, vs ~25 µs and ~9 µs), and batching gains it little: see
``bench/batching.py`` and docs/benchmarks.md. With more than one torch intra-op thread on a
busy machine its calls stall (each parallel region waits for a preempted thread): on the CPU,
use it with ``torch.set_num_threads(1)`` or not at all. It is meant for a GPU.

torch is imported here only, so the numpy path never needs it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hibari import dsp

__all__ = ["TorchBackend"]

_BINS = dsp.N_FFT // 2 + 1
_EXP_MAX = 7.0  # hibari.dsp.ex clamps log-magnitudes at 7 before exp


class TorchBackend:
    """``SpectralBackend`` for ``speech.tts.vocoder.run_chunks_batched`` running in torch.

    Stateless apart from the two window constants on the device, so one instance can be
    shared by all sessions and worker threads. Construction fails with ValueError when the
    device string is malformed or the device is not usable here (e.g. "cuda" on a CPU-only
    torch or a machine without a GPU).
    """

    name = "torch"

    def __init__(self, device: str = "cpu") -> None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"not a torch device: {device!r} ({e})") from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(
                    f"vocoder device {device!r} is not available: torch {torch.__version__} sees no CUDA device"
                )
            n = torch.cuda.device_count()
            if dev.index is not None and dev.index >= n:
                raise ValueError(f"vocoder device {device!r} is not available: {n} CUDA device(s)")
        try:
            self._win = torch.from_numpy(dsp.WIN).to(dev)
            self.device = self._win.device
            # one frame end to end: proves the device has every op used (and warms it up)
            rows = [np.zeros((1, dsp.N_FFT), np.float32)] + [np.zeros((1, _BINS), np.float32) for _ in range(5)]
            self.windowed_frames(*rows, np.zeros((1, _BINS), np.complex64))
        except Exception as e:  # a device type this torch build lacks or cannot run (mps, xpu, meta...)
            raise ValueError(f"vocoder device {device!r} is not available: {e}") from None

    def __repr__(self) -> str:
        return f"TorchBackend({str(self.device)!r})"

    def windowed_frames(
        self,
        src: np.ndarray,
        lh: np.ndarray,
        th: np.ndarray,
        ln: np.ndarray,
        lr: np.ndarray,
        phi: np.ndarray,
        noise: np.ndarray,
    ) -> np.ndarray:
        """See ``speech.tts.vocoder.SpectralBackend``: float32 [rows, 1200] windowed frames.

        The host arrays are the call's own (fresh) buffers, so on the CPU device the tensors
        share their memory and the element-wise steps run in place: no copy in, none out.
        """
        with torch.inference_mode():
            dev = self.device
            s, a_h, t_h, a_n, a_r, p_r, z = (
                torch.from_numpy(x).to(dev, non_blocking=True) for x in (src, lh, th, ln, lr, phi, noise)
            )
            spec = torch.fft.rfft(s, dim=1)  # complex64 [rows, 601]: STFT of the pulse train
            # pi * tanh(th) as pi * (2 sigmoid(2 th) - 1): same value to ~1e-7, 3-4x faster on CPU
            t_h.mul_(2.0).sigmoid_().mul_(2.0 * math.pi).sub_(math.pi)
            buf = torch.empty((*t_h.shape, 2), dtype=t_h.dtype, device=dev)
            spec.mul_(_rot(t_h, _ex(a_h), buf))  # harmonic branch
            spec.add_(z.mul_(_ex(a_n)))  # noise branch
            spec.add_(_rot(p_r, _ex(a_r), buf))  # free-phase branch
            frames = torch.fft.irfft(spec, n=dsp.N_FFT, dim=1)
            frames.mul_(self._win)
            return frames.cpu().numpy()


def _ex(x: torch.Tensor) -> torch.Tensor:
    """hibari.dsp.ex in place: exp(min(x, 7))."""
    return x.clamp_(max=_EXP_MAX).exp_()


def _rot(angle: torch.Tensor, mag: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """mag * e^{i angle} as a complex64 view of ``buf`` [..., 2] (cos and sin written straight
    into the interleaved real/imaginary parts: ~1.7x faster than torch.polar on CPU)."""
    torch.cos(angle, out=buf[..., 0])
    torch.sin(angle, out=buf[..., 1])
    buf.mul_(mag.unsqueeze(-1))
    return torch.view_as_complex(buf)
