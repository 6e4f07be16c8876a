// Decodes the vectors tests/test_codec_js.py writes with the Python decoder, using static/codec/decoder.js,
// and prints one JSON report on stdout: per case the sample count and the largest difference.
// Usage: node tests/js/codec_vectors.mjs <vector-dir>
import { readFileSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { codecFromBytes, parsePacket, parseTable } from "../../static/codec/decoder.js";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const dir = process.argv[2];
const manifest = JSON.parse(readFileSync(join(dir, "manifest.json"), "utf8"));
const tableBytes = readFileSync(join(root, "speech", "codec", "tables", "hibari-rvq-v1.owct"));
const codec = codecFromBytes(tableBytes);
const report = { spec: codec.spec(), cases: {}, errors: {} };

for (const c of manifest.cases) {
  const expected = new Float32Array(readFileSync(join(dir, c.expected)).buffer.slice(0));
  let dec = codec.decoder();
  const parts = [];
  const t0 = performance.now();
  for (const name of c.packets) {
    const pkt = parsePacket(readFileSync(join(dir, name)), codec.codebooks);
    if (pkt.reset) {
      dec = codec.decoder(); // what the old decoder produced belongs to the abandoned sentence
      parts.length = 0;
    }
    parts.push(dec.push(pkt.codes));
    if (pkt.eos) parts.push(dec.flush());
  }
  const ms = performance.now() - t0;
  const total = parts.reduce((a, p) => a + p.length, 0);
  const got = new Float32Array(total);
  let at = 0;
  for (const p of parts) {
    got.set(p, at);
    at += p.length;
  }
  let maxDiff = 0;
  let peak = 0;
  for (let i = 0; i < Math.min(got.length, expected.length); i++) {
    maxDiff = Math.max(maxDiff, Math.abs(got[i] - expected[i]));
    peak = Math.max(peak, Math.abs(expected[i]));
  }
  report.cases[c.name] = { samples: got.length, expected: expected.length, maxDiff, peak, ms };
}

function error(fn) {
  try {
    fn();
    return null;
  } catch (e) {
    return String(e.message);
  }
}
const damaged = Uint8Array.from(tableBytes);
damaged[damaged.length - 5] ^= 0xff;
report.errors.table_crc = error(() => parseTable(damaged));
report.errors.short_packet = error(() => parsePacket(new Uint8Array(5), codec.codebooks));
report.errors.body_mismatch = error(() => parsePacket(new Uint8Array(7 + 3), codec.codebooks));
report.errors.id_range = error(() => codec.decoder().push(new Int16Array(codec.codebooks).fill(-1)));
report.errors.row_shape = error(() => codec.decoder().push(new Int16Array(codec.codebooks + 1)));
const d = codec.decoder();
d.flush();
report.errors.after_flush = error(() => d.push(new Int16Array(0)));
console.log(JSON.stringify(report));
