"""Fit the codec tables: ``python -m speech.codec.fit``.

Synthesizes a fixed corpus with the hibari voice (offline: the sentences come from Python's own
bundled documentation, ``pydoc_data``; pinned seeds and speeds), then fits

1. a frequency-weighted PCA of the harmonic and aperiodic log envelopes (mel-like weights, so the
   low bins that carry intelligibility get most of the precision),
2. residual vector quantization of the PCA coefficients: one k-means codebook per stage, each stage
   fitted on what the previous stages left over,

and writes the table (fixed-point integers with power-of-two scales, see ``speech.codec.model``) to
``speech/codec/tables/``, which the site also serves at ``/static/codec/`` for the browser decoder.
It prints the sha256 to record as ``TABLE_SHA256`` in model.py. Runs in a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from . import model as m

FLOOR = -10.0  # log-magnitude floor: exp(-10) is ~ -87 dB, nothing audible is lost
F0_RANGE = (45.0, 720.0)  # pitch table range in Hz (4 octaves, 4.7 cents per step at 1023 steps)
SPEEDS = (1.0, 0.85, 1.0, 1.2)  # corpus sentences cycle through these speaking rates
BASIS_EXP = 12  # decoder basis: int16 * 2^-12 (|value| < 8)
MEAN_EXP = 11  # decoder mean: int16 * 2^-11 (|value| < 16)
MAX_CODE_EXP = 16  # codewords are multiples of 2^-16 at the finest


def corpus_sentences(limit: int, seed: int = 7) -> list[str]:
    """Plain English sentences (letters, commas, apostrophes; 6-22 words) from pydoc_data, in a fixed
    shuffled order: a corpus that needs no download."""
    from pydoc_data import topics

    text = re.sub(r"\s+", " ", " ".join(topics.topics[k] for k in sorted(topics.topics)))
    seen: set[str] = set()
    found = []
    for s in re.split(r"(?<=[.!?])\s+", text):
        if re.fullmatch(r"[A-Z][a-z ,']+[a-z][.!?]", s) and 6 <= len(s.split()) <= 22 and s not in seen:
            seen.add(s)
            found.append(s)
    random.Random(seed).shuffle(found)
    return found[:limit]


def synthesize(sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(f0 [N], envelopes [N, 2 * 601]) of every frame of every sentence, voice "heart"."""
    from hibari import Hibari

    tts = Hibari()
    f0s, envs = [], []
    for i, text in enumerate(sentences):
        speed = np.asarray([SPEEDS[i % len(SPEEDS)]], np.float32)
        for ps in tts.phonemize(text):
            ids = tts.ids(ps)
            if len(ids) < 3:
                continue
            lh, _, ln, lr, _, f0 = (
                o[0] for o in tts.sess.run(None, {"ids": np.asarray([ids], np.int64), "speed": speed})
            )
            f, env = m.frame_features(lh, ln, lr, f0, FLOOR)
            f0s.append(f)
            envs.append(env)
    return np.concatenate(f0s), np.concatenate(envs)


def weighted_pca(x: np.ndarray, dims: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean [601], encoder projection [dims, 601], decoder basis [601, dims]) of log envelopes x [N, 601].

    Bins are weighted by the mel scale's density 700 / (700 + f), so squared error in coefficient space
    is a perceptually weighted log-spectral error."""
    freqs = np.arange(m.HIBARI_BINS) * (m.SAMPLE_RATE / 2 / (m.HIBARI_BINS - 1))
    sw = np.sqrt(700.0 / (700.0 + freqs))
    mean = x.mean(axis=0, dtype=np.float64)
    y = (x - mean) * sw
    cov = (y.T @ y) / len(y)
    vals, vecs = np.linalg.eigh(cov)
    order = np.argsort(vals)[::-1][:dims]
    v = vecs[:, order]
    kept = vals[order].sum() / vals.sum()
    print(f"  PCA {dims} dims keep {kept:.4f} of the weighted variance", flush=True)
    return mean, (v * sw[:, None]).T, v / sw[:, None]


def to_decoder_grid(x: np.ndarray) -> np.ndarray:
    """Resample rows defined on hibari's 601 bins onto the decoder's N_BINS bins (linear)."""
    src = np.arange(m.HIBARI_BINS) * (m.SAMPLE_RATE / 2 / (m.HIBARI_BINS - 1))
    dst = np.arange(m.N_BINS) * (m.SAMPLE_RATE / m.N_FFT)
    return np.stack([np.interp(dst, src, row) for row in np.atleast_2d(x)])


def fixed_point(x: np.ndarray, exp: int) -> np.ndarray:
    """int16 values of x * 2^exp; refuses values that do not fit."""
    q = np.round(np.asarray(x, np.float64) * 2.0**exp)
    if np.abs(q).max() > 32767:
        raise ValueError(f"values up to {np.abs(x).max():.3f} do not fit int16 * 2^-{exp}")
    return q.astype(np.int16)


def nearest(x: np.ndarray, cb: np.ndarray) -> np.ndarray:
    """Index of the nearest codeword for every row (chunked to bound memory)."""
    sq = np.einsum("cd,cd->c", cb, cb)
    out = np.empty(len(x), np.int64)
    for i in range(0, len(x), 16384):
        out[i : i + 16384] = np.argmin(sq[None, :] - 2.0 * (x[i : i + 16384] @ cb.T), axis=1)
    return out


def kmeans(x: np.ndarray, k: int, iters: int, rng: np.random.Generator) -> np.ndarray:
    """Lloyd's k-means (float32), seeded from random rows; empty clusters get the worst-fit rows."""
    cb = x[rng.choice(len(x), k, replace=False)].copy()
    for _ in range(iters):
        ids = nearest(x, cb)
        counts = np.bincount(ids, minlength=k)
        sums = np.zeros_like(cb, dtype=np.float64)
        np.add.at(sums, ids, x)
        full = counts > 0
        cb[full] = (sums[full] / counts[full, None]).astype(np.float32)
        if not full.all():
            err = ((x - cb[ids]) ** 2).sum(axis=1)
            cb[~full] = x[np.argsort(err)[::-1][: int((~full).sum())]]
    return cb


def fit_rvq(x: np.ndarray, stages: int, size: int, iters: int, train: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """Codebooks int16 [stages, size, D] and their exponents: stage s codes the residual of stages < s,
    using the fixed-point codewords exactly as the decoder will see them."""
    rng = np.random.default_rng(seed)
    res = x.astype(np.float32)
    sub = rng.choice(len(res), min(train, len(res)), replace=False)
    books, exps = [], []
    total = float((res**2).sum())
    for s in range(stages):
        t0 = time.perf_counter()
        cb = kmeans(res[sub], size, iters, rng)
        exp = int(min(MAX_CODE_EXP, np.floor(np.log2(32767 / max(np.abs(cb).max(), 1e-9)))))
        q = fixed_point(cb, exp)
        deq = (q * 2.0**-exp).astype(np.float32)
        res -= deq[nearest(res, deq)]
        books.append(q)
        exps.append(exp)
        left = float((res**2).sum()) / total
        print(
            f"  stage {s + 1}/{stages}: residual {left:.4f} of the coefficient energy "
            f"({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    return np.stack(books), exps


def write_table(header: dict, arrays: list[tuple[str, np.ndarray, int | None]]) -> bytes:
    """The OWCT container: magic, header length, JSON header, then 8-aligned little-endian arrays."""
    payload = b""
    specs = []
    for name, arr, exp in arrays:
        payload += b"\0" * (-len(payload) % 8)
        a = np.ascontiguousarray(arr, arr.dtype.newbyteorder("<"))
        specs.append(
            {"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": len(payload), "scale_exp": exp}
        )
        payload += a.tobytes()
    head = json.dumps({**header, "arrays": specs, "crc32": zlib.crc32(payload)}, sort_keys=True).encode()
    out = m.TABLE_MAGIC + struct.pack("<I", len(head)) + head
    return out + b"\0" * (-len(out) % 8) + payload


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=400, help="at most this many corpus sentences (311 exist)")
    ap.add_argument("--codebooks", type=int, default=12, help="K: 1 pitch codebook + K-1 RVQ stages")
    ap.add_argument("--codebook-size", type=int, default=1024)
    ap.add_argument("--harmonic-dims", type=int, default=28)
    ap.add_argument("--aperiodic-dims", type=int, default=16)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--train-frames", type=int, default=60000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, nargs="*", default=[m.TABLE_PATH])
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    sentences = corpus_sentences(args.sentences)
    f0, env = synthesize(sentences)
    print(
        f"corpus: {len(sentences)} sentences, {len(f0)} frames ({len(f0) / m.FRAME_RATE_HZ:.0f} s) "
        f"in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    nb = m.HIBARI_BINS
    mh, ph, bh = weighted_pca(env[:, :nb], args.harmonic_dims)
    ma, pa, ba = weighted_pca(env[:, nb:], args.aperiodic_dims)
    enc_mean = np.stack([mh, ma]).astype(np.float32)
    enc_proj = np.zeros((args.harmonic_dims + args.aperiodic_dims, 2 * nb), np.float32)
    enc_proj[: args.harmonic_dims, :nb] = ph
    enc_proj[args.harmonic_dims :, nb:] = pa
    coef = (env - enc_mean.reshape(-1)) @ enc_proj.T
    books, exps = fit_rvq(coef, args.codebooks - 1, args.codebook_size, args.iters, args.train_frames, args.seed)
    bound = sum(np.abs(b).max() * 2.0**-e for b, e in zip(books, exps, strict=True))
    if bound >= 2**9:  # model.envelopes relies on |coef| < 2^9 for an exact float64 product
        raise SystemExit(f"coefficients reach {bound:.1f}: too large for exact decoding")
    f0_table = np.zeros(args.codebook_size, np.float32)
    f0_table[1:] = np.exp(np.linspace(np.log(F0_RANGE[0]), np.log(F0_RANGE[1]), args.codebook_size - 1))
    header = {
        "format": "omniweb-codec-table",
        "version": m.TABLE_VERSION,
        "decoder_id": m.DECODER_ID,
        "codebooks": args.codebooks,
        "codebook_size": args.codebook_size,
        "frame_rate_hz": m.FRAME_RATE_HZ,
        "sample_rate": m.SAMPLE_RATE,
        "hop": m.HOP,
        "n_fft": m.N_FFT,
        "win_len": m.WIN_LEN,
        "floor": FLOOR,
        "dims": {"harmonic": args.harmonic_dims, "aperiodic": args.aperiodic_dims},
        "corpus": f"pydoc_data {sys.version_info.major}.{sys.version_info.minor}, {len(sentences)} sentences",
    }
    arrays: list[tuple[str, np.ndarray, int | None]] = [
        ("f0_table", f0_table, None),
        # one array per stage, each with its own power-of-two scale
        *[(f"codebook{s}", books[s], exps[s]) for s in range(len(books))],
        ("dec_mean", fixed_point(to_decoder_grid(np.stack([mh, ma])), MEAN_EXP), MEAN_EXP),
        ("dec_harmonic", fixed_point(to_decoder_grid(bh.T), BASIS_EXP), BASIS_EXP),
        ("dec_aperiodic", fixed_point(to_decoder_grid(ba.T), BASIS_EXP), BASIS_EXP),
        ("enc_mean", enc_mean, None),
        ("enc_proj", enc_proj.astype(np.float16), None),
    ]
    data = write_table(header, arrays)
    for path in args.out:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path} ({len(data)} bytes)")
    digest = hashlib.sha256(data).hexdigest()
    print(f"sha256 {digest}  (record as TABLE_SHA256 in speech/codec/model.py and static/codec/decoder.js)")
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
