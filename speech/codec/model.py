"""A small speech codec fitted to the hibari voice: acoustic frames -> int codes -> 24 kHz audio.

Why this design: no neural audio codec is installable here, but hibari already describes each 12.5 ms
frame as a spectrum that a cheap DSP turns into sound. The codec keeps that idea and sends only what
the ear needs:

* per frame, the pitch (one id into a log-spaced table, id 0 = unvoiced) and two spectral envelopes
  in the log domain: the harmonic gain ``lh`` and the aperiodic gain, which folds hibari's noise and
  free-phase branches into one (their phases carry no intelligibility);
* the envelopes are projected onto a frequency-weighted PCA basis and coded by residual vector
  quantization (k-means codebooks fitted by ``speech.codec.fit``), one id per stage;
* the decoder rebuilds the envelopes, filters a band-limited pulse train (hibari's formula) and a
  hashed noise in one FFT per frame (2048 points, a 1200-sample Hann window, hop 300), and
  overlap-adds. Power-of-two FFTs keep the browser decoder simple and fast.

Determinism across machines and languages: the tables are fixed-point integers with power-of-two
scales, so the envelope matrix product is exact in float64 whatever the summation order; the pulse
train's phase is a float64 running sum in a fixed order; noise is an integer hash of (frame index,
bin), restarted at every sentence. So streaming, batched and one-shot decoding give the same samples
bit for bit here, and ``static/codec/decoder.js`` reproduces them within float tolerance.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import scipy.fft as sfft

if TYPE_CHECKING:
    from speech.tts.vocoder import AcousticFrames

FRAME_RATE_HZ = 80.0  # one code row per 12.5 ms acoustic frame (hop 300 at 24 kHz)
SAMPLE_RATE = 24000
HOP = 300
TABLE_VERSION = 1
DECODER_ID = "omniweb-hibari-rvq-v1"
TABLE_PATH = Path(__file__).resolve().parent / "tables" / "hibari-rvq-v1.owct"
# printed by ``python -m speech.codec.fit``; a table with any other digest is refused
TABLE_SHA256 = "0f4500a4140ee99a64a4007510954da3ff13989c410ba6567834fc3ac06b2b78"
TABLE_MAGIC = b"OWCT"

# -- synthesis constants (the JavaScript decoder uses the same) ---------------------------------------
N_FFT = 2048  # zero-padded FFT size: a power of two
WIN_LEN = 1200  # analysis/synthesis window, 4 hops, as hibari
N_BINS = N_FFT // 2 + 1
HIBARI_BINS = 601  # hibari's spectra: n_fft 1200
VOICED_HZ = 40.0  # hibari: samples with f0 at or below this are unvoiced
F_MAX = 11000.0  # highest harmonic of the pulse train
LOG_MAX = 7.0  # hibari clips log-magnitudes here before exp
NOISE_SEED = 0x9E3779B9
# noise is generated on N_FFT bins but hibari's on 601: same time-domain power needs this gain
NOISE_GAIN = np.float32(np.sqrt(N_FFT / (2 * (HIBARI_BINS - 1))))
NOISE_CACHE_FRAMES = 1024  # 12.8 s of noise rows (8 MB) shared by all sentences
SPECTRAL_ROWS = 64  # rows per FFT call: large stacks fall out of the CPU cache
LOOKAHEAD_FRAMES = 4  # a block of output is final 4 frames after its own frame

WIN = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(WIN_LEN) / WIN_LEN)).astype(np.float32)
WIN_SRC = (WIN / (WIN_LEN / 4)).astype(np.float32)  # a unit cosine has spectral peak 1 (as hibari)
_W2 = (WIN * WIN).reshape(4, HOP)  # window part p covers block k-2+p of frame k
# u: weight of the later frame when interpolating f0 at sample j of a block (align_corners=False)
_J = np.arange(HOP, dtype=np.float64)
_U = (_J + 0.5) / HOP + np.where(_J < HOP // 2, 0.5, -0.5)
_V = 1.0 - _U
_LOW = _J < HOP // 2


class CodecTableError(ValueError):
    """The table file is missing, damaged, or not the one this code was written for."""


@dataclass(frozen=True)
class Table:
    """The fitted tables, converted to the exact float64/float32 values the decoder uses."""

    header: dict
    f0_table: np.ndarray  # float32 [C]: Hz per pitch id, 0.0 for id 0 (unvoiced)
    codebooks: np.ndarray  # float64 [K-1, C, D]: RVQ stages (fixed-point values, exact)
    dec_mean: np.ndarray  # float64 [2, N_BINS]: mean log envelope (harmonic, aperiodic)
    dec_harmonic: np.ndarray  # float64 [Dh, N_BINS]: harmonic coefficients -> envelope
    dec_aperiodic: np.ndarray  # float64 [Da, N_BINS]: aperiodic coefficients -> envelope
    enc_mean: np.ndarray  # float32 [2, 601]
    enc_proj: np.ndarray  # float32 [D, 2 * 601]: weighted PCA projection
    floor: float


def _read_table(data: bytes) -> Table:
    """Parse an OWCT file: magic, uint32 header length, JSON header, 8-aligned little-endian arrays."""
    if len(data) < 8 or data[:4] != TABLE_MAGIC:
        raise CodecTableError("codec table: not an OWCT file")
    (hlen,) = struct.unpack("<I", data[4:8])
    try:
        header = json.loads(data[8 : 8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecTableError(f"codec table: unreadable header ({exc})") from exc
    base = 8 + hlen
    base += -base % 8
    payload = data[base:]
    if zlib.crc32(payload) != header.get("crc32"):
        raise CodecTableError("codec table: payload CRC32 does not match its header")
    arrays: dict[str, np.ndarray] = {}
    try:
        for spec in header["arrays"]:
            dt = np.dtype(spec["dtype"]).newbyteorder("<")
            count = int(np.prod(spec["shape"]))
            if spec["offset"] + count * dt.itemsize > len(payload):
                raise CodecTableError(f"codec table: array {spec['name']} runs past the end of the file")
            arr = np.frombuffer(payload, dt, count, spec["offset"]).reshape(spec["shape"])
            arrays[spec["name"]] = arr * 2.0 ** -spec["scale_exp"] if spec.get("scale_exp") is not None else arr
        k, c = int(header["codebooks"]), int(header["codebook_size"])
        dh, da = int(header["dims"]["harmonic"]), int(header["dims"]["aperiodic"])
        d = dh + da
        expect = {
            "f0_table": (c,),
            **{f"codebook{s}": (c, d) for s in range(k - 1)},
            "dec_mean": (2, N_BINS),
            "dec_harmonic": (dh, N_BINS),
            "dec_aperiodic": (da, N_BINS),
            "enc_mean": (2, HIBARI_BINS),
            "enc_proj": (d, 2 * HIBARI_BINS),
        }
    except CodecTableError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CodecTableError(f"codec table: bad header ({type(exc).__name__}: {exc})") from exc
    for name, shape in expect.items():
        if name not in arrays or arrays[name].shape != shape:
            got = arrays[name].shape if name in arrays else "nothing"
            raise CodecTableError(f"codec table: {name} has shape {got}, expected {shape}")
    return Table(
        header=header,
        f0_table=arrays["f0_table"].astype(np.float32),
        codebooks=np.stack([arrays[f"codebook{s}"] for s in range(k - 1)]).astype(np.float64),
        dec_mean=np.asarray(arrays["dec_mean"], np.float64),
        dec_harmonic=np.ascontiguousarray(arrays["dec_harmonic"], np.float64),
        dec_aperiodic=np.ascontiguousarray(arrays["dec_aperiodic"], np.float64),
        enc_mean=arrays["enc_mean"].astype(np.float32),
        enc_proj=arrays["enc_proj"].astype(np.float32),
        floor=float(header["floor"]),
    )


def lowbias32(x: np.ndarray) -> np.ndarray:
    """A 32-bit integer hash (Wellons' lowbias32): cheap, portable, Math.imul in JavaScript."""
    x = np.asarray(x, np.uint32).copy()
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def frame_noise(frame_index: np.ndarray) -> np.ndarray:
    """Uniform complex noise [rows, N_BINS] (unit variance per part) for sentence-relative frames.

    Counter = frame * 2 * N_BINS + 2 * bin + part, hashed: it restarts with every sentence, and
    needs no state, so any chunking or batching draws the same numbers. The first NOISE_CACHE_FRAMES
    frames are the same for every sentence, so they are computed once.
    """
    frame_index = np.asarray(frame_index)
    if len(frame_index) and frame_index.max() < NOISE_CACHE_FRAMES:
        return _noise_cache()[frame_index]
    return _hash_noise(frame_index)


@cache
def _noise_cache() -> np.ndarray:
    return _hash_noise(np.arange(NOISE_CACHE_FRAMES))


def _hash_noise(frame_index: np.ndarray) -> np.ndarray:
    lanes = np.arange(2 * N_BINS, dtype=np.uint32)
    ctr = np.asarray(frame_index, np.uint32)[:, None] * np.uint32(2 * N_BINS) + lanes
    h = lowbias32(ctr + np.uint32(NOISE_SEED))
    u = (h >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-23) - np.float32(1.0)  # [-1, 1), exact
    u *= np.float32(np.sqrt(3.0))
    return u.view(np.complex64)


def pulse_blocks(
    f_prev: np.ndarray, f_cur: np.ndarray, f_next: np.ndarray, accs: Sequence[float], counts: Sequence[int]
) -> tuple[np.ndarray, list[float]]:
    """Band-limited pulse train (hibari.dsp.pulses' formula) for 300-sample blocks of several streams.

    Block m interpolates pitch between frames m-1, m and m+1 (float64 arrays, one entry per block);
    the blocks are ``counts[i]`` consecutive blocks of stream i, whose phase starts at ``accs[i]``
    cycles. Within a block the phase is ``acc + cumsum(f) / SR`` (float64, sequential) and its
    fractional part carries over, so a block's samples never depend on how blocks are grouped into
    calls. Returns float32 [n_blocks, 300] and each stream's carried phase.
    """
    n = len(f_cur)
    if n == 0:
        return np.zeros((0, HOP), np.float32), list(accs)
    a = np.where(_LOW, f_prev[:, None], f_cur[:, None])
    b = np.where(_LOW, f_cur[:, None], f_next[:, None])
    f = a * _V + b * _U
    voiced = f > VOICED_HZ
    np.maximum(f, VOICED_HZ, out=f)
    c = np.cumsum(f, axis=1)
    c *= 1.0 / SAMPLE_RATE
    ends = c[:, -1].tolist()
    starts = np.empty(n)
    carried = []
    i = 0
    for acc, count in zip(accs, counts, strict=True):
        for _ in range(count):
            starts[i] = acc
            t = acc + ends[i]
            acc = t - math.floor(t)
            i += 1
        carried.append(acc)
    t = starts[:, None] + c
    t -= np.floor(t)
    t *= 2 * np.pi
    harmonics = np.floor(F_MAX / f) + 0.5
    s = 2.0 * np.sin(0.5 * t)
    bad = np.abs(s) <= 2e-3
    s[bad] = 1.0
    e = np.sin(harmonics * t) / s
    e[bad] = harmonics[bad]
    e -= 0.5
    e[~voiced] = 0.0
    return e.astype(np.float32), carried


def spectral_frames(windows: np.ndarray, env: np.ndarray, frame_index: np.ndarray) -> np.ndarray:
    """Windowed time-domain frames [rows, 1200] from pulse windows [rows, 1200] (already multiplied
    by WIN_SRC), envelopes float32 [rows, 2 * N_BINS] and sentence-relative frame indices.

    S = exp(H) FFT(pulses) + NOISE_GAIN exp(A) noise; frame = IFFT(S)[:1200] * WIN. Every step is per
    row, so stacking rows of many streams changes no result.
    """
    if len(windows) > SPECTRAL_ROWS:
        return np.concatenate(
            [
                spectral_frames(
                    windows[i : i + SPECTRAL_ROWS], env[i : i + SPECTRAL_ROWS], frame_index[i : i + SPECTRAL_ROWS]
                )
                for i in range(0, len(windows), SPECTRAL_ROWS)
            ]
        )
    rows = len(windows)
    buf = np.zeros((rows, N_FFT), np.float32)
    buf[:, :WIN_LEN] = windows
    spec = sfft.rfft(buf, axis=1, overwrite_x=True)
    gains = np.exp(np.minimum(env, np.float32(LOG_MAX)))
    spec *= gains[:, :N_BINS]
    amp = gains[:, N_BINS:]
    amp *= NOISE_GAIN
    noise = frame_noise(frame_index)
    noise *= amp
    spec += noise
    out = sfft.irfft(spec, N_FFT, axis=1)[:, :WIN_LEN]
    out *= WIN
    return out


def frame_features(
    lh: np.ndarray, ln: np.ndarray, lr: np.ndarray, f0: np.ndarray, floor: float
) -> tuple[np.ndarray, np.ndarray]:
    """(f0 [F], log envelopes float32 [F, 2 * 601]) from hibari's [601, F] outputs: the harmonic gain
    and an aperiodic gain carrying the power of the noise (E|z|^2 = 2) and free-phase branches, both
    clipped to [floor, LOG_MAX] (hibari clips at LOG_MAX; below floor nothing is audible)."""
    lo, hi = np.float32(floor), np.float32(LOG_MAX)
    h = np.clip(np.asarray(lh, np.float32), lo, hi)
    n = np.minimum(np.asarray(ln, np.float32), hi)
    r = np.minimum(np.asarray(lr, np.float32), hi)
    a = np.clip(np.float32(0.5) * np.logaddexp(2 * n, 2 * r - np.float32(np.log(2.0))), lo, hi)
    return np.asarray(f0, np.float32), np.concatenate([h.T, a.T], axis=1)


@cache
def _norm_row(parts: tuple[bool, bool, bool, bool]) -> np.ndarray:
    """1 / summed squared window over the frames that exist for a block (all four inside a sentence)."""
    w = np.zeros(HOP, np.float32)
    for p in (3, 2, 1, 0):
        if parts[p]:
            w += _W2[p]
    return (np.float32(1.0) / np.maximum(w, np.float32(1e-11))).astype(np.float32)


class Codec:
    """The fitted codec: encoder for the server, factory of streaming decoders for every client."""

    frame_rate_hz: float = FRAME_RATE_HZ
    sample_rate: int = SAMPLE_RATE

    def __init__(self, table: Table) -> None:
        self.table = table
        h = table.header
        self.decoder_id: str = h["decoder_id"]
        self.codebooks: int = int(h["codebooks"])
        self.codebook_size: int = int(h["codebook_size"])
        self._dh = int(h["dims"]["harmonic"])
        self._log_f0 = np.log(table.f0_table[1:].astype(np.float64))
        # squared norms of the codewords, for nearest-codeword search
        self._cb32 = table.codebooks.astype(np.float32)
        self._cb32_t = np.ascontiguousarray(self._cb32.transpose(0, 2, 1))
        self._cb_sq = np.einsum("scd,scd->sc", self._cb32, self._cb32)

    def spec(self) -> dict:
        """What a client needs to know to decode (sent in codec.start)."""
        return {
            "codebooks": self.codebooks,
            "codebook_size": self.codebook_size,
            "frame_rate_hz": self.frame_rate_hz,
            "sample_rate": self.sample_rate,
            "decoder_id": self.decoder_id,
        }

    # -- encoder --------------------------------------------------------------------------------------
    def encode(self, frames: AcousticFrames) -> np.ndarray:
        """int16 [n_frames, K], every id in [0, codebook_size). One row per acoustic frame."""
        f0, env = frame_features(frames.lh, frames.ln, frames.lr, frames.f0, self.table.floor)
        return self.encode_features(f0, env)

    def encode_features(self, f0: np.ndarray, env: np.ndarray) -> np.ndarray:
        """Codes for pitch [F] and log envelopes [F, 2 * 601] (see ``frame_features``)."""
        n = len(f0)
        codes = np.zeros((n, self.codebooks), np.int16)
        if n == 0:
            return codes
        voiced = f0 > VOICED_HZ
        logf = np.log(np.maximum(f0, VOICED_HZ).astype(np.float64))
        idx = np.searchsorted(self._log_f0, logf).clip(1, len(self._log_f0) - 1)
        nearer_low = (logf - self._log_f0[idx - 1]) < (self._log_f0[idx] - logf)
        codes[:, 0] = np.where(voiced, idx + 1 - nearer_low, 0)
        t = self.table
        # numpy's einsum loops, not BLAS: multithreaded BLAS on a busy CPU was 10x slower here
        x = env - t.enc_mean.reshape(-1)
        nb, dh = HIBARI_BINS, self._dh  # the projection is block-diagonal: harmonic | aperiodic
        res = np.concatenate(
            [
                np.einsum("fb,db->fd", x[:, :nb], t.enc_proj[:dh, :nb]),
                np.einsum("fb,db->fd", x[:, nb:], t.enc_proj[dh:, nb:]),
            ],
            axis=1,
        )
        for s in range(self.codebooks - 1):
            dist = self._cb_sq[s][None, :] - 2.0 * np.einsum("fd,dc->fc", res, self._cb32_t[s])
            ids = np.argmin(dist, axis=1)
            codes[:, s + 1] = ids
            res -= self._cb32[s][ids]
        return codes

    # -- decoder --------------------------------------------------------------------------------------
    def decoder(self) -> CodecDecoder:
        """Fresh streaming decoder state for ONE sentence."""
        return CodecDecoder(self)

    def check_codes(self, codes: np.ndarray) -> np.ndarray:
        """Validated int64 [n, K] view of a code block; ValueError says what is wrong."""
        arr = np.asarray(codes)
        if arr.ndim != 2 or arr.shape[1] != self.codebooks:
            raise ValueError(f"codes must have shape [n, {self.codebooks}], got {arr.shape}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"codes must be integers, got {arr.dtype}")
        arr = arr.astype(np.int64, copy=False)
        if arr.size and (arr.min() < 0 or arr.max() >= self.codebook_size):
            raise ValueError(f"code ids must be in [0, {self.codebook_size}), got {arr.min()}..{arr.max()}")
        return arr

    def pitch(self, codes: np.ndarray) -> np.ndarray:
        """Hz per row (float64; 0.0 = unvoiced)."""
        return self.table.f0_table[codes[:, 0]].astype(np.float64)

    def envelopes(self, codes: np.ndarray) -> np.ndarray:
        """float32 [n, 2 * N_BINS] log envelopes (harmonic, aperiodic) of validated codes.

        Codewords are multiples of 2^-16 and the basis of 2^-12 with small magnitudes, so the sum
        and the product below are exact in float64: the result never depends on the BLAS kernel,
        the batch size, or the language that computes it.
        """
        t = self.table
        coef = np.zeros((len(codes), t.codebooks.shape[2]))
        for s in range(self.codebooks - 1):
            coef += t.codebooks[s][codes[:, s + 1]]
        env = np.empty((len(codes), 2 * N_BINS), np.float32)
        dh = self._dh
        # numpy's own loop, not BLAS: no worker threads to wait for on a busy CPU
        for half, basis, c in ((0, t.dec_harmonic, coef[:, :dh]), (1, t.dec_aperiodic, coef[:, dh:])):
            e = np.einsum("rd,dn->rn", c, basis)
            e += t.dec_mean[half]
            env[:, half * N_BINS : (half + 1) * N_BINS] = e
        return env


@dataclass
class _Work:
    """One decoder's share of a batched step: frames to synthesize and blocks to emit."""

    decoder: CodecDecoder
    rows: int  # frames synthesized in this step
    env: np.ndarray  # float32 [rows, 2 * N_BINS]
    first_frame: int
    final: bool
    blocks: np.ndarray  # int64 pulse block indices to generate
    windows: np.ndarray | None = None  # float32 [rows, 1200], set once the pulses exist


class CodecDecoder:
    """Streaming decoder for one sentence: push code rows, get the samples that are final.

    Frame k's window spans output blocks k-2..k+1 and its pulse train needs pitch up to frame k+2, so
    block b is final once frame b+4 has arrived: 4 frames (50 ms) of look-ahead.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self._f0 = np.zeros(0)  # Hz of every frame received
        self._env = np.zeros((0, 2 * N_BINS), np.float32)  # envelopes of frames not yet synthesized
        self._n = 0  # frames received
        self._synth = 0  # frames synthesized
        self._emitted = 0  # output blocks returned
        self._next_block = -2  # next pulse block to generate (the first window starts at -600)
        self._pulses = np.zeros((0, HOP), np.float32)  # pulse blocks [_next_block - len, _next_block)
        self._acc = 0.0  # pulse phase in cycles
        self._ola = np.zeros((0, HOP), np.float32)  # blocks [_emitted, ...) being summed
        self._flushed = False

    @property
    def frames_received(self) -> int:
        """Code rows pushed so far."""
        return self._n

    def push(self, codes: np.ndarray) -> np.ndarray:
        """codes int [n, K] (n may be 0). Returns the float32 samples that are final now."""
        return decode_batch([(self, codes)])[0]

    def flush(self) -> np.ndarray:
        """End of the sentence: the remaining samples (all lengths sum to rows * 300)."""
        return decode_batch([(self, None)])[0]

    # -- steps of decode_batch ------------------------------------------------------------------------
    def _take(self, pitch: np.ndarray | None, env: np.ndarray) -> _Work:
        """Add decoded rows (pitch None: flush) and plan what can be synthesized now."""
        final = pitch is None
        if pitch is not None and len(pitch):
            self._f0 = np.concatenate([self._f0, pitch])
            self._env = np.concatenate([self._env, env])
            self._n += len(pitch)
        self._flushed = final
        stop = self._n if final else max(self._synth, self._n - 2)
        # block m interpolates pitch up to frame m+1: only blocks whose pitch is known
        last = (self._n if final else self._n - 2) if self._n else self._next_block - 1
        rows = stop - self._synth
        work = _Work(self, rows, self._env[:rows], self._synth, final, np.arange(self._next_block, last + 1))
        self._env = self._env[rows:]
        return work

    def _pitch_of(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pitch of frames m-1, m, m+1 for each block m, edge-extended past both ends."""
        top = len(self._f0) - 1
        return tuple(self._f0[np.minimum(np.maximum(blocks + d, 0), top)] for d in (-1, 0, 1))

    def _add_pulses(self, work: _Work, new: np.ndarray, acc: float) -> None:
        """Store new pulse blocks and cut the analysis windows of this step's frames."""
        self._pulses = np.concatenate([self._pulses, new]) if len(new) else self._pulses
        self._next_block += len(new)
        self._acc = acc
        first = self._next_block - len(self._pulses)
        if work.rows:
            flat = self._pulses[work.first_frame - 2 - first : work.first_frame + work.rows + 1 - first].reshape(-1)
            view = np.lib.stride_tricks.sliding_window_view(flat, WIN_LEN)[::HOP]
            work.windows = view[: work.rows] * WIN_SRC
        else:
            work.windows = np.zeros((0, WIN_LEN), np.float32)

    def _finish(self, frames: np.ndarray, work: _Work) -> np.ndarray:
        """Overlap-add synthesized frames; return the blocks no later frame can change."""
        k0, rows = work.first_frame, len(frames)
        k1 = k0 + rows
        top = k1 + 1  # frame k1 - 1 reaches block k1
        if len(self._ola) < top - self._emitted:
            pad = np.zeros((top - self._emitted - len(self._ola), HOP), np.float32)
            self._ola = np.concatenate([self._ola, pad])
        parts = frames.reshape(rows, 4, HOP)
        for p in (3, 2, 1, 0):  # per block, frames are added in increasing order, however chunked
            lo = max(k0, self._emitted + 2 - p)  # frame k adds to block k - 2 + p >= _emitted
            if lo < k1:
                self._ola[lo - 2 + p - self._emitted : k1 - 2 + p - self._emitted] += parts[lo - k0 :, p]
        self._synth = k1
        # drop pulse blocks no later window needs (windows start at block _synth - 2)
        drop = (self._synth - 2) - (self._next_block - len(self._pulses))
        if drop > 0:
            self._pulses = self._pulses[drop:]
        end = self._n if work.final else max(self._emitted, self._synth - 2)
        out = self._ola[: end - self._emitted].copy()
        scale = np.empty_like(out)
        scale[:] = _norm_row((True, True, True, True))
        # only block 0 and the last two blocks of a sentence lack one of their four frames
        for b in {0, self._n - 2, self._n - 1} & set(range(self._emitted, end)):
            scale[b - self._emitted] = _norm_row(tuple(0 <= b + 2 - p < self._n for p in range(4)))
        out *= scale
        self._ola = self._ola[end - self._emitted :]
        self._emitted = end
        if work.final:
            self._pulses = np.zeros((0, HOP), np.float32)
            self._ola = np.zeros((0, HOP), np.float32)
        return out.reshape(-1)


def decode_batch(steps: Sequence[tuple[CodecDecoder, np.ndarray | None]]) -> list[np.ndarray]:
    """Same results as calling d.push(c) for each pair (c None: d.flush()), computed in batched array
    operations: one envelope product, one pulse-train pass and one FFT call per direction for all
    streams. A decoder may appear once per batch; every code block is validated before any state
    changes."""
    if not steps:
        return []
    seen: set[int] = set()
    checked: list[np.ndarray | None] = []
    for dec, codes in steps:
        if id(dec) in seen:
            raise ValueError("a decoder may appear only once per batch")
        seen.add(id(dec))
        if dec._flushed:
            raise ValueError("decoder already flushed: start a new one for the next sentence")
        checked.append(None if codes is None else dec.codec.check_codes(codes))
    # pitch and envelopes of all rows, one call per codec (a server has one)
    decoded: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for codec in {id(d.codec): d.codec for d, _ in steps}.values():
        rows = [c for (d, _), c in zip(steps, checked, strict=True) if d.codec is codec and c is not None]
        every = np.concatenate(rows) if rows else np.zeros((0, codec.codebooks), np.int64)
        decoded[id(codec)] = (codec.pitch(every), codec.envelopes(every))
    works: list[_Work] = []
    at = dict.fromkeys(decoded, 0)
    for (dec, _), codes in zip(steps, checked, strict=True):
        if codes is None:
            works.append(dec._take(None, np.zeros((0, 2 * N_BINS), np.float32)))
            continue
        key, n = id(dec.codec), len(codes)
        pitch, env = decoded[key]
        works.append(dec._take(pitch[at[key] : at[key] + n], env[at[key] : at[key] + n]))
        at[key] += n
    # pulse trains of all streams in one pass
    pitch3 = [w.decoder._pitch_of(w.blocks) for w in works]
    f_prev, f_cur, f_next = (np.concatenate([p[i] for p in pitch3]) for i in range(3))
    new, accs = pulse_blocks(
        f_prev,
        f_cur,
        f_next,
        [w.decoder._acc for w in works],
        [len(w.blocks) for w in works],
    )
    block = 0
    for w, acc in zip(works, accs, strict=True):
        w.decoder._add_pulses(w, new[block : block + len(w.blocks)], acc)
        block += len(w.blocks)
    busy = [w for w in works if w.rows]
    if busy:
        frames = spectral_frames(
            np.concatenate([w.windows for w in busy]),
            np.concatenate([w.env for w in busy]),
            np.concatenate([np.arange(w.first_frame, w.first_frame + w.rows) for w in busy]),
        )
    out: list[np.ndarray] = []
    row = 0
    for w in works:
        out.append(w.decoder._finish(frames[row : row + w.rows] if w.rows else np.zeros((0, WIN_LEN), np.float32), w))
        row += w.rows
    return out


def read_table(path: Path | None = None, expected_sha256: str | None = TABLE_SHA256) -> Table:
    """Read and verify a table file (checksum, magic, CRC, shapes, version)."""
    path = Path(path or TABLE_PATH)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CodecTableError(f"codec table {path} cannot be read: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256:
        raise CodecTableError(
            f"codec table {path} has sha256 {digest}, expected {expected_sha256}: refit with "
            "`python -m speech.codec.fit` or restore the committed file"
        )
    table = _read_table(data)
    h = table.header
    if h.get("version") != TABLE_VERSION or h.get("decoder_id") != DECODER_ID:
        raise CodecTableError(
            f"codec table {path} is version {h.get('version')} / {h.get('decoder_id')}, "
            f"this code decodes version {TABLE_VERSION} / {DECODER_ID}"
        )
    if not (int(h["codebooks"]) > 1 and 1 < int(h["codebook_size"]) <= 32768):
        raise CodecTableError("codec table: codebooks/codebook_size out of range")
    return table


def load_codec(path: Path | None = None) -> Codec:
    """Load the committed table; verify its recorded checksum and shapes; raise CodecTableError."""
    return Codec(read_table(path))
