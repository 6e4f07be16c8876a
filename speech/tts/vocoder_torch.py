"""The vocoder in torch, on a configurable device ("cpu", "cuda", "cuda:1"), state kept there.

``run_chunks_batched(items, backend=TorchBackend(device))`` calls ``run_batch``: each segment's
frames (spectra, noise, the padded pulse train, the overlap-add norm) go to the device once, when
its first chunk runs, and stay there with its overlap-add tail; a step gathers every chunk's
frames on the device, runs the pulse-train rfft, the branch combination, the windowed irfft and
the overlap-add there in float32/complex64 for all sessions of the batch at once, and brings
back one array: the batch's PCM. Nothing else crosses between host and device per step.
``windowed_frames`` (the ``SpectralBackend`` call on host arrays) remains for ``bench/batching.py``.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from hibari import dsp

if TYPE_CHECKING:
    from .vocoder import VocoderStream

__all__ = ["TorchBackend"]

_BINS = dsp.N_FFT // 2 + 1
_EXP_MAX = 7.0  # hibari.dsp.ex clamps log-magnitudes at 7 before exp
_HOP = dsp.HOP
_K = dsp.N_FFT // _HOP  # hops per window
_HALF_BLOCKS = (dsp.N_FFT // 2) // _HOP  # synth drops the first two overlap-add blocks


@dataclass
class _DeviceSegment:
    """One segment's frames on the device, frame-major, and its overlap-add tail there."""

    lh: torch.Tensor
    th: torch.Tensor
    ln: torch.Tensor
    lr: torch.Tensor
    phi: torch.Tensor
    noise: torch.Tensor | None  # complex64 [F, 601]; None: drawn per chunk on the device (``noise_gen``)
    noise_gen: torch.Generator | None
    windows: torch.Tensor  # [F, 1200] analysis windows: a view of the padded pulse train
    norm: torch.Tensor  # [F + 3, HOP]
    tail: torch.Tensor  # windowed frames [max(0, next - 3), next) as [n, K, HOP]


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
            self._win_src = torch.from_numpy(np.ascontiguousarray(dsp.WIN_SRC, np.float32)).to(dev)
            self.device = self._win.device
            # one frame end to end: proves the device has every op used (and warms it up)
            src = np.zeros((1, dsp.N_FFT), np.float32)
            lh, th, ln, lr, phi = (np.zeros((1, _BINS), np.float32) for _ in range(5))
            self.windowed_frames(src, lh, th, ln, lr, phi, np.zeros((1, _BINS), np.complex64))
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
            tensors = (torch.from_numpy(x).to(dev, non_blocking=True) for x in (src, lh, th, ln, lr, phi, noise))
            return self._frames(*tensors).cpu().numpy()

    def _frames(
        self,
        s: torch.Tensor,
        a_h: torch.Tensor,
        t_h: torch.Tensor,
        a_n: torch.Tensor,
        a_r: torch.Tensor,
        p_r: torch.Tensor,
        z: torch.Tensor,
    ) -> torch.Tensor:
        """The spectral step on device tensors the call owns (all but ``s`` are overwritten)."""
        spec = torch.fft.rfft(s, dim=1)  # complex64 [rows, 601]: STFT of the pulse train
        # pi * tanh(th) as pi * (2 sigmoid(2 th) - 1): same value to ~1e-7, 3-4x faster on CPU
        t_h.mul_(2.0).sigmoid_().mul_(2.0 * math.pi).sub_(math.pi)
        buf = torch.empty((*t_h.shape, 2), dtype=t_h.dtype, device=self.device)
        spec.mul_(_rot(t_h, _ex(a_h), buf))  # harmonic branch
        spec.add_(z.mul_(_ex(a_n)))  # noise branch
        spec.add_(_rot(p_r, _ex(a_r), buf))  # free-phase branch
        frames = torch.fft.irfft(spec, n=dsp.N_FFT, dim=1)
        frames.mul_(self._win)
        return frames

    # -- device-resident streams -----------------------------------------------------------------
    def run_batch(self, items: list[tuple[VocoderStream, int, int]]) -> list[np.ndarray]:
        """Vocode checked items (``run_chunks_batched`` checked them) entirely on the device.

        One gather per input over all chunks, one spectral call, the overlap-add per stream on the
        device, then a single device-to-host copy of every chunk's samples.
        """
        with torch.inference_mode():
            work = [(s, a, b, self._segment(s)) for s, a, b in items if b > a]
            outs: list[torch.Tensor] = []
            if work:
                src = torch.cat([seg.windows[a:b] for _, a, b, seg in work]).mul_(self._win_src)
                inputs = [torch.cat([getattr(seg, k)[a:b] for _, a, b, seg in work]) for k in _ROWS[:-1]]
                inputs.append(torch.cat([self._noise(seg, a, b) for _, a, b, seg in work]))
                frames = self._frames(src, *inputs)
                row = 0
                for s, a, b, seg in work:
                    outs.append(_overlap_add(seg, s.n_frames, a, b, frames[row : row + b - a]))
                    row += b - a
            host = torch.cat(outs).cpu().numpy() if outs else np.zeros(0, np.float32)
        result: list[np.ndarray] = []
        pos, k = 0, 0
        for s, a, b in items:
            if b == a:
                result.append(np.zeros(0, np.float32))
                continue
            n = outs[k].numel()
            result.append(host[pos : pos + n])
            pos += n
            k += 1
            s._next = b  # the host side of the stream's bookkeeping
            if b == s.n_frames:
                s.device_state = None  # the segment is done: free its device memory
                s._windows = None
        return result

    def _noise(self, seg: _DeviceSegment, start: int, stop: int) -> torch.Tensor:
        """complex64 noise rows of frames [start, stop): uploaded ones, or drawn here (real and
        imaginary parts N(0, 1) each, as numpy's draw viewed as complex64)."""
        if seg.noise is not None:
            return seg.noise[start:stop]
        pairs = torch.randn((stop - start, _BINS, 2), generator=seg.noise_gen, device=self.device)
        return torch.view_as_complex(pairs)

    def _segment(self, stream: VocoderStream) -> _DeviceSegment:
        """The stream's frames on the device, uploaded at its first chunk and kept on the stream."""
        seg = stream.device_state
        if isinstance(seg, _DeviceSegment):
            return seg
        dev = self.device
        host = stream.rows()
        rows = {k: torch.from_numpy(host[k]).to(dev, non_blocking=True) for k in _ROWS[:-1]}
        noise, noise_gen = None, None
        if stream.noise_rng is None:
            noise = torch.from_numpy(host["noise"]).to(dev, non_blocking=True)
        else:  # unseeded: the noise is drawn on the device, seeded once from the request's generator
            noise_gen = torch.Generator(device=dev)
            noise_gen.manual_seed(int(stream.noise_rng.integers(2**63)))
        xp = np.pad(dsp.pulses(stream.frames.f0), dsp.N_FFT // 2, mode="reflect").astype(np.float32, copy=False)
        windows = torch.from_numpy(xp).to(dev, non_blocking=True).unfold(0, dsp.N_FFT, _HOP)
        norm = torch.from_numpy(np.ascontiguousarray(dsp._ola_norm(stream.n_frames), np.float32)).to(dev)
        tail = torch.zeros((0, _K, _HOP), dtype=torch.float32, device=dev)
        seg = _DeviceSegment(**rows, noise=noise, noise_gen=noise_gen, windows=windows, norm=norm, tail=tail)
        stream.device_state = seg
        return seg


_ROWS = ("lh", "th", "ln", "lr", "phi", "noise")  # the spectral step's row inputs, in its order


def _overlap_add(seg: _DeviceSegment, n: int, start: int, stop: int, frames: torch.Tensor) -> torch.Tensor:
    """``VocoderStream._overlap_add`` on the device: the samples now final, the tail carried on."""
    g0 = start - seg.tail.shape[0]
    g = torch.cat([seg.tail, frames.reshape(-1, _K, _HOP)])
    b0 = max(start, _HALF_BLOCKS)
    b1 = stop if stop < n else n + _HALF_BLOCKS
    keep = max(0, stop - (_K - 1)) - g0
    seg.tail = g[keep:].clone()
    if b1 <= b0:
        return torch.zeros(0, dtype=torch.float32, device=frames.device)
    y = torch.zeros((b1 - b0, _HOP), dtype=torch.float32, device=frames.device)
    for k in range(_K):
        lo, hi = max(b0, g0 + k), min(b1, stop + k)
        if lo < hi:
            y[lo - b0 : hi - b0] += g[lo - k - g0 : hi - k - g0, k]
    y *= seg.norm[b0:b1]
    return y.reshape(-1)


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
