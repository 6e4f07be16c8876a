"""Streaming vocoder: hibari's acoustic frames -> PCM, a few frames per work unit.

``hibari.dsp.synth`` turns a whole sentence into audio with one inverse STFT. Here the
same maths is cut into chunks of frames, so the first audio leaves before the sentence
is vocoded and chunks from many sessions can share one FFT call. Every spectral step
(pulse-train STFT, branch combination, irfft) is per frame, so a chunk needs only its
own frames; the overlap-add needs the last three windowed frames of the previous chunk,
which the stream carries. Each output block is summed in the same order as
``hibari.dsp.ola`` (frames b, b-1, b-2, b-3 from zero), so the concatenated chunks
match ``synth`` bit for bit on the same machine, given the same noise draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from hibari import dsp

N_BINS = dsp.N_FFT // 2 + 1  # 601
HOP = dsp.HOP  # 300 samples = 12.5 ms
SAMPLE_RATE = dsp.SR  # 24000
# 4 hops per window: frame k touches output samples [k*HOP - 600, k*HOP + 600)
_K = dsp.N_FFT // HOP
# synth drops the first 2 OLA blocks (the center=True padding)
_HALF_BLOCKS = (dsp.N_FFT // 2) // HOP
# the per-frame [601, F] inputs of the spectral step
_SPECTRA = ("lh", "th", "ln", "lr", "phi", "noise")


@dataclass
class AcousticFrames:
    """One sentence segment of talker output.

    The noise is part of the frames (not drawn while vocoding), so chunking, batching
    and scheduling order can never change which random numbers a frame gets.
    """

    lh: np.ndarray  # float32 [601, F] harmonic log-magnitude
    th: np.ndarray  # float32 [601, F] harmonic phase offset (pre-tanh)
    ln: np.ndarray  # float32 [601, F] noise log-magnitude
    lr: np.ndarray  # float32 [601, F] free-phase log-magnitude
    phi: np.ndarray  # float32 [601, F] free phase
    f0: np.ndarray  # float32 [F] pitch in Hz (unvoiced below 40)
    # complex64 [601, F], drawn exactly as hibari.dsp.synth draws it; None for frames that are never
    # vocoded here (the codec path encodes them and brings its own noise)
    noise: np.ndarray | None = None

    def __post_init__(self) -> None:
        """Fail at construction, not mid-stream, if the outputs don't line up."""
        n = np.shape(self.f0)[0] if np.ndim(self.f0) == 1 else -1
        if n < 0:
            raise ValueError(f"f0 must be 1-D, got shape {np.shape(self.f0)}")
        for name in ("lh", "th", "ln", "lr", "phi", "noise"):
            if name == "noise" and self.noise is None:
                continue
            shape = np.shape(getattr(self, name))
            if shape != (N_BINS, n):
                raise ValueError(f"{name} has shape {shape}, expected {(N_BINS, n)}")

    @property
    def n_frames(self) -> int:
        """Number of 12.5 ms frames F; the segment yields F * HOP samples."""
        return int(self.f0.shape[0])


def draw_noise(rng: np.random.Generator, n_frames: int) -> np.ndarray:
    """Same draw (shape, dtype, order) as hibari.dsp.synth, so a seeded rng gives the
    same audio.

    Draw once per segment, in segment order, from the session's generator: that
    reproduces ``Hibari.stream(text, seed=...)`` sentence by sentence.
    """
    z = rng.standard_normal((N_BINS, 2 * n_frames), dtype=np.float32)
    return z.view(np.complex64)


class VocoderStream:
    """Per-segment state: excitation (cumulative phase) and frame-major copies of the spectra, made
    when first needed, and the OLA tail carried between chunks.

    A sentence's first chunk is on the path to its first audio, so it builds only what it needs:
    the pulse train of its own frames (the phase is a running sum, so a prefix of the train is
    exact) and its columns of the bins-major spectra. The whole train and the frame-major copies
    (a chunk's rows are then one contiguous slice) are made by the next chunk, after that audio
    has left.
    """

    def __init__(self, frames: AcousticFrames, noise_rng: np.random.Generator | None = None) -> None:
        """``noise_rng``: frames without noise get theirs drawn from it chunk by chunk, frame-major,
        as each chunk runs (so only the frames a chunk needs are drawn before its audio)."""
        if frames.noise is None and noise_rng is None:
            raise ValueError("frames drawn without noise cannot be vocoded")
        self.noise_rng = noise_rng if frames.noise is None else None
        self._names = _SPECTRA if self.noise_rng is None else _SPECTRA[:-1]
        # The stream's own frames object (same arrays): when the frame-major copies are made, its
        # fields become transposed views of them, so the segment is never held twice; the
        # caller's ``frames`` is left as it is.
        self.frames = AcousticFrames(**{k: getattr(frames, k) for k in self._names}, f0=frames.f0)
        self._rows: dict[str, np.ndarray] | None = None
        self._n = frames.n_frames
        self._next = 0
        self.device_state: object = None  # a device backend's copy of this segment (vocoder_torch)
        # windowed frames [max(0, next-3), next): what a later chunk still adds to
        self._tail = np.zeros((0, _K, HOP), np.float32)
        self._windows: np.ndarray | None = None  # every frame's analysis window, once built
        # [F+3, HOP]; F is known up front, so no sample waits for the normalisation
        self._norm = dsp._ola_norm(self._n) if self._n else None

    @property
    def n_frames(self) -> int:
        """Total frames in the segment."""
        return self._n

    @property
    def next_frame(self) -> int:
        """First frame not yet vocoded."""
        return self._next

    @property
    def done(self) -> bool:
        """True once every sample of the segment has been returned."""
        return self._next >= self._n

    def plan(self, max_frames: int) -> tuple[int, int]:
        """(start, stop) of the next chunk, at most max_frames; (F, F) once done."""
        if max_frames < 1:
            raise ValueError("max_frames must be >= 1")
        return self._next, min(self._n, self._next + max_frames)

    def run_chunk(self, start: int, stop: int, backend: SpectralBackend | None = None) -> np.ndarray:
        """Vocode frames [start, stop) (start must equal next_frame); return the float32
        samples that are now final.

        Final means no later chunk can touch them: after frames < stop, output samples
        < (stop-2)*300 (frame k reaches back 600 samples). The last chunk (stop == F)
        flushes the rest, so all returned lengths sum to F * 300. An empty range
        returns an empty array and changes nothing. ``backend``: as in run_chunks_batched.
        """
        return run_chunks_batched([(self, start, stop)], backend)[0]

    def noise_rows(self, start: int, stop: int) -> np.ndarray:
        """complex64 [stop - start, 601] noise of frames [start, stop): the drawn rows, or new ones.

        New ones come frame-major from ``noise_rng`` in chunk order, so how the frames are cut into
        chunks does not change which numbers a frame gets.
        """
        if self.noise_rng is None:
            return self.spectrum_rows("noise", start, stop)
        return self.noise_rng.standard_normal((stop - start, 2 * N_BINS), dtype=np.float32).view(np.complex64)

    def rows(self) -> dict[str, np.ndarray]:
        """Frame-major copies [F, 601] of the spectra (and drawn noise), made at the first call."""
        if self._rows is None:
            self._rows = {k: np.ascontiguousarray(getattr(self.frames, k).T) for k in self._names}
            for k, v in self._rows.items():  # the bins-major arrays are no longer referenced here
                setattr(self.frames, k, v.T)
        return self._rows

    def spectrum_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Frames [start, stop) of one spectrum (or the drawn noise), frame-major [stop - start, 601].

        The first chunk reads its columns of the bins-major arrays (a small gather); later chunks
        slice the frame-major copies, made by the first of them.
        """
        if self._rows is None and start == 0:
            return getattr(self.frames, name)[:, start:stop].T
        return self.rows()[name][start:stop]

    def windows(self, start: int, stop: int) -> np.ndarray:
        """The pulse train's analysis windows [stop - start, 1200] of frames [start, stop).

        A first chunk that ends well before the segment does builds the train of its frames only:
        frame k's window reaches pulse samples below (k + 2) * HOP, whose values need f0 up to
        frame k + 2 (the train interpolates f0 between frames), and a prefix of the running phase
        sum is exact, so these windows equal those of the whole train.
        """
        if self._windows is None:
            if start == 0 and stop + 2 < self._n:
                return _analysis_windows(self.frames.f0[: stop + 2])[:stop]
            self._windows = _analysis_windows(self.frames.f0)
        return self._windows[start:stop]

    # -- internals -------------------------------------------------------------------
    def _check(self, start: int, stop: int) -> None:
        if start != self._next:
            raise ValueError(f"chunk starts at frame {start}, but the next frame is {self._next}")
        if not start <= stop <= self._n:
            raise ValueError(f"chunk [{start}, {stop}) is outside [{start}, {self._n}]")

    def _overlap_add(self, start: int, stop: int, frames: np.ndarray) -> np.ndarray:
        """Add windowed frames [start, stop) to the carried tail; return the output
        blocks that are now final.

        Output block j is OLA block j+2. OLA block b sums hop k of frame b-k for
        k = 0..3, added from zero in increasing k as hibari.dsp.ola does, so the float
        result is identical; it is final once frame b exists (or the segment ends).
        """
        g0 = start - len(self._tail)
        # windowed frames [g0, stop)
        g = np.concatenate([self._tail, frames.reshape(-1, _K, HOP)])
        # earlier blocks were returned already (blocks 0 and 1 are never output)
        b0 = max(start, _HALF_BLOCKS)
        b1 = stop if stop < self._n else self._n + _HALF_BLOCKS
        keep = max(0, stop - (_K - 1)) - g0
        self._tail = g[keep:].copy()
        self._next = stop
        if stop == self._n:
            self._windows = None  # release the padded pulse train
        if b1 <= b0:
            return np.zeros(0, np.float32)
        y = np.zeros((b1 - b0, HOP), np.float32)
        for k in range(_K):
            # blocks b whose frame b-k is in [g0, stop)
            lo, hi = max(b0, g0 + k), min(b1, stop + k)
            if lo < hi:
                y[lo - b0 : hi - b0] += g[lo - k - g0 : hi - k - g0, k]
        assert self._norm is not None  # None only for a segment of no frames, which has no blocks
        y *= self._norm[b0:b1]
        return y.reshape(-1)


def _analysis_windows(f0: np.ndarray) -> np.ndarray:
    """A view [F, 1200] of every frame's analysis window of the pulse train, reflect-padded
    exactly as hibari.dsp.stft pads it."""
    xp = np.pad(dsp.pulses(f0), dsp.N_FFT // 2, mode="reflect")
    return np.lib.stride_tricks.sliding_window_view(xp, dsp.N_FFT)[::HOP]


class SpectralBackend(Protocol):
    """Computes the spectral step of ``run_chunks_batched``: stacked frame rows in, windowed
    time-domain frames out.

    Every input is a fresh C-contiguous array with one row per frame (all chunks' frames
    stacked), owned by the call: a backend may overwrite any of them.
    """

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
        """src: float32 [rows, 1200], the pulse-train analysis windows already multiplied by
        ``dsp.WIN_SRC``; lh/th/ln/lr/phi: float32 [rows, 601]; noise: complex64 [rows, 601].
        Returns the float32 [rows, 1200] frames irfft(S) * ``dsp.WIN``, S being hibari's spectrum
        exp(lh) e^{i pi tanh(th)} rfft(src) + exp(ln) noise + exp(lr) e^{i phi}."""
        ...


class NumpyBackend:
    """The default backend: numpy/scipy on the host, the same element-wise operations in the
    same order as hibari.dsp.synth/stft/ola, so the audio is bit-identical to ``synth``."""

    name = "numpy"

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
        spec = dsp.rfft(src, 1)  # complex64 [rows, 601]: STFT of the pulse train
        rot = np.empty(spec.shape, np.complex64)
        c = np.tanh(th)
        c *= np.pi
        np.cos(c, out=rot.real)
        np.sin(c, out=rot.imag)
        rot *= dsp.ex(lh)
        spec *= rot  # harmonic branch
        noise *= dsp.ex(ln)  # the gathered copy: the caller's noise is never written
        spec += noise  # noise branch
        np.cos(phi, out=rot.real)
        np.sin(phi, out=rot.imag)
        rot *= dsp.ex(lr)
        spec += rot  # free-phase branch
        frames = dsp.irfft(spec, dsp.N_FFT, 1)
        frames *= dsp.WIN
        return frames


NUMPY_BACKEND = NumpyBackend()


def _gather(items: list[tuple[VocoderStream, int, int]], name: str) -> np.ndarray:
    """Frames [start, stop) of every item, frame-major [sum n, 601], always a fresh copy (the
    backend may write it): the FFTs batch over rows."""
    if name == "noise":
        return np.concatenate([s.noise_rows(a, b) for s, a, b in items])
    return np.concatenate([s.spectrum_rows(name, a, b) for s, a, b in items])


def _spectral(items: list[tuple[VocoderStream, int, int]], backend: SpectralBackend) -> np.ndarray:
    """Windowed time-domain frames [sum n, 1200] for all items: the inputs are stacked
    frame-major here, and the backend makes one call per step over all rows."""
    n_rows = sum(b - a for _, a, b in items)
    src = np.empty((n_rows, dsp.N_FFT), np.float32)
    row = 0
    for s, a, b in items:
        np.multiply(s.windows(a, b), dsp.WIN_SRC, out=src[row : row + b - a])
        row += b - a
    g = {name: _gather(items, name) for name in _SPECTRA}
    frames = backend.windowed_frames(src, **g)
    if frames.shape != (n_rows, dsp.N_FFT) or frames.dtype != np.float32:
        raise ValueError(f"backend returned {frames.dtype} {frames.shape}, expected float32 {(n_rows, dsp.N_FFT)}")
    return frames


def run_chunks_batched(
    items: list[tuple[VocoderStream, int, int]], backend: SpectralBackend | None = None
) -> list[np.ndarray]:
    """Same result as calling run_chunk on each, but the spectral work (pulse STFT,
    branch combination, irfft) of chunks with equal frame counts is stacked into one
    call each, so the scheduler can batch work units across sessions.

    Every spectral step is per frame, so the frames of all chunks are stacked along one
    frame axis and go through a single call per step, whatever their lengths; only the
    cheap overlap-add is per stream. A stream may appear at most once per batch (its
    next chunk depends on this one's tail). All items are checked before any runs.

    ``backend`` does the spectral step (default: ``NUMPY_BACKEND``, bit-identical to
    hibari; ``speech.tts.vocoder_torch.TorchBackend`` runs it in torch on a device). The
    overlap-add is numpy on the host either way.
    """
    seen: set[int] = set()
    for s, a, b in items:
        if id(s) in seen:
            raise ValueError("a stream may appear only once per batch")
        seen.add(id(s))
        s._check(a, b)
    run_batch = getattr(backend, "run_batch", None)
    if run_batch is not None:  # a device backend that keeps the streams' state on its device
        return run_batch(items)
    work = [(s, a, b) for s, a, b in items if b > a]
    frames = _spectral(work, backend or NUMPY_BACKEND) if work else np.zeros((0, dsp.N_FFT), np.float32)
    out: list[np.ndarray] = []
    row = 0
    for s, a, b in items:
        if b == a:
            out.append(np.zeros(0, np.float32))
            continue
        out.append(s._overlap_add(a, b, frames[row : row + b - a]))
        row += b - a
    return out
