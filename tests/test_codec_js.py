"""The browser decoder (static/codec/decoder.js) against vectors from the Python decoder, under Node.

The Python side encodes real hibari sentences, packs them into wire frames (7-byte <IHB header +
int16 frame-major body) with the packet sizes and flags a server sends, and decodes them itself; the
Node script parses the same frames and decodes them with the JavaScript module. Same samples within
float tolerance (Python's spectral step is float32, JavaScript's float64).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from speech.codec import model

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "js" / "codec_vectors.mjs"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (CI installs it): JS decoder untested")
SENTENCES = ["The birch canoe slid on the smooth planks.", "Four hours of steady work faced us."]


def packet(seq: int, codes: np.ndarray, flags: int) -> bytes:
    return struct.pack("<IHB", seq, len(codes), flags) + codes.astype("<i2").tobytes()


@pytest.fixture(scope="module")
def codec() -> model.Codec:
    return model.load_codec()


@pytest.fixture(scope="module")
def report(codec: model.Codec, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from support.voice import hibari_network_outputs

    from speech.tts.vocoder import AcousticFrames, draw_noise

    out = tmp_path_factory.mktemp("codec_js")
    rng = np.random.default_rng(5)
    cases = []
    codes_all = []
    for lh, th, ln, lr, phi, f0 in hibari_network_outputs(SENTENCES):
        noise = draw_noise(np.random.default_rng(0), len(f0))
        codes_all.append(codec.encode(AcousticFrames(lh, th, ln, lr, phi, f0, noise)))
    # case 0: first packet of 2 rows, then 10 per packet, EOS on the last; case 1: random sizes
    # including empty packets and a terminal empty EOS frame; case 2: a stray sentence, then RESET
    plans = [
        [2] + [10] * 200,
        [int(n) for n in rng.integers(0, 7, 400)],
    ]
    for i, (codes, plan) in enumerate(zip(codes_all, plans, strict=True)):
        dec = codec.decoder()
        names, samples, at, seq = [], [], 0, 0
        for n in plan:
            if at >= len(codes):
                break
            chunk = codes[at : at + n]
            at += len(chunk)
            last = at >= len(codes) and i == 0
            names.append(f"c{i}_{seq}.bin")
            (out / names[-1]).write_bytes(packet(seq, chunk, 1 if last else 0))
            samples.append(dec.push(chunk))
            seq += 1
        if i == 1:
            names.append(f"c{i}_{seq}.bin")
            (out / names[-1]).write_bytes(packet(seq, codes[:0], 1))
        samples.append(dec.flush())
        (out / f"c{i}.f32").write_bytes(np.concatenate(samples).astype("<f4").tobytes())
        cases.append({"name": f"case{i}", "packets": names, "expected": f"c{i}.f32"})
    # a sentence longer than the decoder's shared noise rows, in packets of 25 rows
    long = np.concatenate([codes_all[0]] * 6)
    dec = codec.decoder()
    names, samples = [], []
    for seq, at in enumerate(range(0, len(long), 25)):
        rows = long[at : at + 25]
        names.append(f"l_{seq}.bin")
        (out / names[-1]).write_bytes(packet(seq, rows, 1 if at + 25 >= len(long) else 0))
        samples.append(dec.push(rows))
    samples.append(dec.flush())
    (out / "long.f32").write_bytes(np.concatenate(samples).astype("<f4").tobytes())
    cases.append({"name": "long", "packets": names, "expected": "long.f32"})
    # RESET: junk rows for a first decoder, then the sentence again from a reset packet
    junk = codes_all[1][:7]
    (out / "r0.bin").write_bytes(packet(0, junk, 0))
    (out / "r1.bin").write_bytes(packet(1, codes_all[0], 4 | 1))
    cases.append({"name": "reset", "packets": ["r0.bin", "r1.bin"], "expected": "c0.f32"})
    (out / "manifest.json").write_text(json.dumps({"cases": cases}))
    proc = subprocess.run([NODE, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_js_spec_matches_python(codec: model.Codec, report: dict) -> None:
    assert report["spec"] == codec.spec()


@pytest.mark.parametrize("case", ["case0", "case1", "long", "reset"])
def test_js_decodes_like_python(report: dict, case: str) -> None:
    r = report["cases"][case]
    assert r["samples"] == r["expected"] > 0
    assert r["peak"] > 0.05  # real speech, not silence
    assert r["maxDiff"] <= 1e-5 * max(1.0, r["peak"]), r


def test_js_rejects_bad_input(report: dict) -> None:
    e = report["errors"]
    assert "CRC32" in e["table_crc"]
    assert "shorter than its header" in e["short_packet"]
    assert "body has 3 bytes" in e["body_mismatch"]
    assert "outside" in e["id_range"]
    assert "multiple" in e["row_shape"]
    assert "flushed" in e["after_flush"]


def test_js_constants_match_python() -> None:
    js = (ROOT / "static" / "codec" / "decoder.js").read_text()
    assert f'TABLE_SHA256 = "{model.TABLE_SHA256}"' in js
    assert f'DECODER_ID = "{model.DECODER_ID}"' in js


def test_the_site_serves_the_table_next_to_the_decoder(client) -> None:
    """decoder.js fetches ./hibari-rvq-v1.owct: the one table in the package, served at /static/codec/."""
    js = client.get("/static/codec/decoder.js")
    table = client.get(f"/static/codec/{model.TABLE_PATH.name}")
    assert js.status_code == 200 and table.status_code == 200
    assert b"".join(table) == model.TABLE_PATH.read_bytes()
