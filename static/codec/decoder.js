// @ts-check
// omniweb codec decoder for browsers and Node (ES module, no build step, no dependencies).
//
// Decodes the codec-token stream of `output_mode: "codec_tokens"` into 24 kHz float samples, the
// same samples as the Python decoder (speech/codec/model.py) within float tolerance.
//
// API
//   import { loadCodec, parsePacket, FLAG_EOS, FLAG_SEGMENT_END, FLAG_RESET } from "/static/codec/decoder.js";
//   const codec = await loadCodec();            // fetches ./hibari-rvq-v1.owct next to this file,
//                                                // checks magic, CRC32, shapes and (where
//                                                // crypto.subtle exists) the SHA-256
//   codec.accepts(codecStartMessage)            // true if decoder_id/codebooks/... match this table
//   let dec = codec.decoder();                  // one per sentence (per codec.start)
//   const pkt = parsePacket(binaryMessage, codec.codebooks);
//       // {seq, nFrames, flags, eos, segmentEnd, reset, codes: Int16Array(nFrames * codebooks)}
//   if (pkt.reset) dec = codec.decoder();       // RESET: drop decoder state first
//   const samples = dec.push(pkt.codes);        // Float32Array, final samples only (50 ms look-ahead)
//   const tail = dec.flush();                   // at codec.done / EOS: the rest of the sentence
//   // every sentence yields exactly nRows * 300 samples at codec.sampleRate (24000)
//   Also: codecFromBytes(arrayBuffer) (Node: pass fs.readFileSync(path)), parseTable(bytes),
//   DECODER_ID, TABLE_SHA256, SAMPLE_RATE, HOP.
//
// How it decodes (see model.py for the why): code 0 of a row is a pitch id (0 = unvoiced); the
// other ids pick residual-VQ codewords whose sum, times a fixed basis, gives the harmonic and
// aperiodic log envelopes. A band-limited pulse train (phase as a float64 running sum) and hashed
// uniform noise (lowbias32 of frame/bin, restarted each sentence) are shaped by those envelopes in
// one 2048-point FFT per 12.5 ms frame (1200-sample Hann window, hop 300), then overlap-added.

export const DECODER_ID = "omniweb-hibari-rvq-v1";
export const TABLE_SHA256 = "0f4500a4140ee99a64a4007510954da3ff13989c410ba6567834fc3ac06b2b78";
export const TABLE_VERSION = 1;
export const SAMPLE_RATE = 24000;
export const HOP = 300;
export const HEADER_SIZE = 7;
export const FLAG_EOS = 1;
export const FLAG_SEGMENT_END = 2;
export const FLAG_RESET = 4;

const N_FFT = 2048;
const N_BINS = N_FFT / 2 + 1;
const WIN_LEN = 1200;
const HIBARI_BINS = 601;
const VOICED_HZ = 40.0;
const F_MAX = 11000.0;
const LOG_MAX = 7.0;
const NOISE_SEED = 0x9e3779b9;
const f32 = Math.fround;
const NOISE_GAIN = f32(Math.sqrt(N_FFT / (2 * (HIBARI_BINS - 1))));
const SQRT3 = f32(Math.sqrt(3.0));
const TWO_PI = 2 * Math.PI;

// windows exactly as numpy builds them (float64 maths, stored as float32)
const WIN = new Float64Array(WIN_LEN);
const WIN_SRC = new Float64Array(WIN_LEN);
for (let i = 0; i < WIN_LEN; i++) {
  WIN[i] = f32(0.5 - 0.5 * Math.cos((2 * Math.PI * i) / WIN_LEN));
  WIN_SRC[i] = f32(WIN[i] / (WIN_LEN / 4));
}
const U = new Float64Array(HOP);
const V = new Float64Array(HOP);
for (let j = 0; j < HOP; j++) {
  U[j] = (j + 0.5) / HOP + (j < HOP / 2 ? 0.5 : -0.5);
  V[j] = 1.0 - U[j];
}
/**
 * 1 / summed squared window for a block, given which of its four frames exist (float32 as numpy)
 * @param {boolean[]} parts
 */
function normRow(parts) {
  const w = new Float64Array(HOP);
  for (const p of [3, 2, 1, 0]) {
    if (!parts[p]) continue;
    for (let j = 0; j < HOP; j++) w[j] = f32(w[j] + f32(WIN[p * HOP + j] * WIN[p * HOP + j]));
  }
  return w.map((x) => f32(1 / Math.max(x, f32(1e-11))));
}
const NORM_MID = normRow([true, true, true, true]);

// -- wire ------------------------------------------------------------------------------------------
/** @typedef {ArrayBuffer | ArrayBufferView} Bytes */

/** @param {Bytes} buf */
function asBytes(buf) {
  if (buf instanceof Uint8Array) return buf;
  if (buf instanceof ArrayBuffer) return new Uint8Array(buf);
  if (ArrayBuffer.isView(buf)) return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  throw new TypeError("expected an ArrayBuffer or a typed array");
}

/**
 * One binary frame: 7-byte little-endian <IHB header (seq, n_frames, flags) + int16 frame-major body.
 * @param {Bytes} buf
 * @param {number} codebooks
 */
export function parsePacket(buf, codebooks) {
  const bytes = asBytes(buf);
  if (bytes.length < HEADER_SIZE) throw new Error("codec frame shorter than its header");
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const seq = dv.getUint32(0, true);
  const nFrames = dv.getUint16(4, true);
  const flags = dv.getUint8(6);
  const expected = nFrames * codebooks * 2;
  if (bytes.length - HEADER_SIZE !== expected) {
    throw new Error(
      `codec frame body has ${bytes.length - HEADER_SIZE} bytes, expected ${expected} for ${nFrames}x${codebooks}`,
    );
  }
  const codes = new Int16Array(nFrames * codebooks);
  for (let i = 0; i < codes.length; i++) codes[i] = dv.getInt16(HEADER_SIZE + 2 * i, true);
  return {
    seq,
    nFrames,
    flags,
    eos: (flags & FLAG_EOS) !== 0,
    segmentEnd: (flags & FLAG_SEGMENT_END) !== 0,
    reset: (flags & FLAG_RESET) !== 0,
    codes,
  };
}

// -- table -----------------------------------------------------------------------------------------
const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** @param {Uint8Array} bytes */
function crc32(bytes) {
  let c = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) c = CRC_TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/**
 * One array of the table: where it lies in the payload, its shape and how its numbers are stored.
 * @typedef {{ name: string, shape: number[], dtype: string, offset: number, scale_exp?: number | null }} ArraySpec
 */

/**
 * The table's arrays by name: f0_table, dec_mean, dec_harmonic, dec_aperiodic, codebook0...
 * @typedef {Record<string, Float64Array>} Arrays
 */

/**
 * The checked table: its JSON header, its arrays, and their sizes (K codebooks of C codewords; dh
 * harmonic and da aperiodic dimensions, D in all).
 * @typedef {{ header: TableHeader, arrays: Arrays, K: number, C: number, dh: number, da: number, D: number }} Table
 */

/**
 * The table's JSON header.
 * @typedef {object} TableHeader
 * @property {number} version
 * @property {string} decoder_id
 * @property {number} crc32  of the payload
 * @property {number} codebooks
 * @property {number} codebook_size
 * @property {number} frame_rate_hz
 * @property {number} sample_rate
 * @property {{ harmonic: number, aperiodic: number }} dims
 * @property {ArraySpec[]} arrays
 */

/**
 * @param {Uint8Array} payload
 * @param {ArraySpec} spec
 */
function readArray(payload, spec) {
  const count = spec.shape.reduce((a, b) => a * b, 1);
  const dv = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const out = new Float64Array(count);
  const scale = spec.scale_exp == null ? 1 : 2 ** -spec.scale_exp;
  const size = spec.dtype === "<i2" ? 2 : spec.dtype === "<f4" ? 4 : 0;
  if (!size) throw new Error(`codec table: unsupported dtype ${spec.dtype} for ${spec.name}`);
  if (spec.offset + count * size > payload.length) throw new Error(`codec table: ${spec.name} runs past the end`);
  for (let i = 0; i < count; i++) {
    const at = spec.offset + i * size;
    out[i] = (size === 2 ? dv.getInt16(at, true) : dv.getFloat32(at, true)) * scale;
  }
  return out;
}

/**
 * Parse and check an OWCT table (magic, CRC32 of the payload, version, decoder id, shapes).
 * @param {Bytes} buf
 * @returns {Table}
 */
export function parseTable(buf) {
  const bytes = asBytes(buf);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length < 8 || String.fromCharCode(...bytes.subarray(0, 4)) !== "OWCT") {
    throw new Error("codec table: not an OWCT file");
  }
  const hlen = dv.getUint32(4, true);
  /** @type {TableHeader} */
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + hlen)));
  const base = 8 + hlen + ((8 - ((8 + hlen) % 8)) % 8);
  const payload = bytes.subarray(base);
  if (crc32(payload) !== header.crc32) throw new Error("codec table: payload CRC32 does not match its header");
  if (header.version !== TABLE_VERSION || header.decoder_id !== DECODER_ID) {
    throw new Error(`codec table is ${header.version}/${header.decoder_id}, this decoder reads ${TABLE_VERSION}/${DECODER_ID}`);
  }
  const K = header.codebooks;
  const C = header.codebook_size;
  const dh = header.dims.harmonic;
  const da = header.dims.aperiodic;
  const D = dh + da;
  /** @type {Record<string, ArraySpec>} */
  const specs = Object.fromEntries(header.arrays.map((a) => [a.name, a]));
  /** @type {Record<string, number[]>} */
  const want = {
    f0_table: [C],
    dec_mean: [2, N_BINS],
    dec_harmonic: [dh, N_BINS],
    dec_aperiodic: [da, N_BINS],
  };
  for (let s = 0; s < K - 1; s++) want[`codebook${s}`] = [C, D];
  /** @type {Arrays} */
  const arrays = {};
  for (const [name, shape] of Object.entries(want)) {
    const spec = specs[name];
    if (!spec || spec.shape.join(",") !== shape.join(",")) {
      throw new Error(`codec table: ${name} has shape ${spec ? spec.shape : "nothing"}, expected ${shape}`);
    }
    arrays[name] = readArray(payload, spec);
  }
  return { header, arrays, K, C, dh, da, D };
}

/** @param {Uint8Array} bytes */
async function sha256Hex(bytes) {
  const digest = await globalThis.crypto.subtle.digest("SHA-256", bytes);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Fetch the table (default: next to this module) and build the codec. */
export async function loadCodec(url = new URL("./hibari-rvq-v1.owct", import.meta.url)) {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`codec table ${url}: HTTP ${res.status}`);
  const bytes = new Uint8Array(await res.arrayBuffer());
  if (globalThis.crypto?.subtle) {
    const got = await sha256Hex(bytes);
    if (got !== TABLE_SHA256) throw new Error(`codec table sha256 ${got}, expected ${TABLE_SHA256}`);
  }
  return codecFromBytes(bytes);
}

/**
 * Build the codec from the table's bytes (the CRC32 is checked; use loadCodec for SHA-256 too).
 * @param {Bytes} buf
 */
export function codecFromBytes(buf) {
  return new Codec(parseTable(buf));
}

// -- FFT (radix 2, complex, in place) -------------------------------------------------------------
const BITREV = new Uint32Array(N_FFT);
for (let i = 0, bits = Math.log2(N_FFT); i < N_FFT; i++) {
  let r = 0;
  for (let b = 0; b < bits; b++) r |= ((i >> b) & 1) << (bits - 1 - b);
  BITREV[i] = r;
}
const COS = new Float64Array(N_FFT / 2);
const SIN = new Float64Array(N_FFT / 2);
for (let i = 0; i < N_FFT / 2; i++) {
  COS[i] = Math.cos((2 * Math.PI * i) / N_FFT);
  SIN[i] = -Math.sin((2 * Math.PI * i) / N_FFT);
}

/**
 * Forward DFT X_k = sum x_n e^{-2 pi i k n / N} of (re, im), in place.
 * @param {Float64Array} re
 * @param {Float64Array} im
 */
function fft(re, im) {
  for (let i = 0; i < N_FFT; i++) {
    const j = BITREV[i];
    if (j > i) {
      let t = re[i];
      re[i] = re[j];
      re[j] = t;
      t = im[i];
      im[i] = im[j];
      im[j] = t;
    }
  }
  for (let size = 2; size <= N_FFT; size *= 2) {
    const half = size / 2;
    const step = N_FFT / size;
    for (let start = 0; start < N_FFT; start += size) {
      for (let k = 0; k < half; k++) {
        const wr = COS[k * step];
        const wi = SIN[k * step];
        const a = start + k;
        const b = a + half;
        const xr = re[b] * wr - im[b] * wi;
        const xi = re[b] * wi + im[b] * wr;
        re[b] = re[a] - xr;
        im[b] = im[a] - xi;
        re[a] += xr;
        im[a] += xi;
      }
    }
  }
}

// -- codec -----------------------------------------------------------------------------------------
/** @param {number} x */
function lowbias32(x) {
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}

export class Codec {
  /** @param {Table} table */
  constructor(table) {
    this.table = table;
    this.decoderId = table.header.decoder_id;
    this.codebooks = table.K;
    this.codebookSize = table.C;
    this.frameRateHz = table.header.frame_rate_hz;
    this.sampleRate = table.header.sample_rate;
  }

  /** The fields codec.start carries, as the server's Codec.spec() sends them. */
  spec() {
    return {
      codebooks: this.codebooks,
      codebook_size: this.codebookSize,
      frame_rate_hz: this.frameRateHz,
      sample_rate: this.sampleRate,
      decoder_id: this.decoderId,
    };
  }

  /**
   * True if a codec.start message describes a stream this table decodes.
   * @param {object} msg
   */
  accepts(msg) {
    /** @type {Record<string, unknown>} */
    const fields = { ...msg };
    return Object.entries(this.spec()).every(([k, v]) => fields[k] === v);
  }

  /** Fresh streaming decoder for one sentence. */
  decoder() {
    return new CodecDecoder(this);
  }

  /**
   * Log envelopes (harmonic bins then aperiodic bins, float32 values) of one code row.
   * @param {ArrayLike<number>} codes
   * @param {number} row
   */
  envelope(codes, row) {
    const { arrays, K, D, dh } = this.table;
    const coef = new Float64Array(D);
    for (let s = 0; s < K - 1; s++) {
      const cb = arrays[`codebook${s}`];
      const at = codes[row * K + s + 1] * D;
      for (let d = 0; d < D; d++) coef[d] += cb[at + d];
    }
    // exact in float64 (fixed-point tables), so equal to numpy's matmul before rounding to float32
    const env = new Float64Array(2 * N_BINS);
    const mean = arrays.dec_mean;
    for (let i = 0; i < 2 * N_BINS; i++) env[i] = mean[i];
    const bh = arrays.dec_harmonic;
    const ba = arrays.dec_aperiodic;
    for (let d = 0; d < dh; d++) {
      const c = coef[d];
      if (c === 0) continue;
      const off = d * N_BINS;
      for (let i = 0; i < N_BINS; i++) env[i] += c * bh[off + i];
    }
    for (let d = dh; d < D; d++) {
      const c = coef[d];
      if (c === 0) continue;
      const off = (d - dh) * N_BINS;
      for (let i = 0; i < N_BINS; i++) env[N_BINS + i] += c * ba[off + i];
    }
    for (let i = 0; i < 2 * N_BINS; i++) env[i] = f32(env[i]);
    return env;
  }
}

export class CodecDecoder {
  /** @param {Codec} codec */
  constructor(codec) {
    this.codec = codec;
    /** @type {number[]} */
    this.f0 = []; // Hz of every frame received (0 = unvoiced)
    /** @type {Float64Array[]} */
    this.envs = []; // envelopes of frames not yet synthesized
    this.n = 0; // frames received
    this.synth = 0; // frames synthesized
    this.emitted = 0; // output blocks returned
    this.nextBlock = -2; // next pulse block to generate (the first window starts at sample -600)
    this.firstBlock = -2; // block index of pulses[0]
    /** @type {Float64Array[]} */
    this.pulses = []; // Float64Array(300) per block, values rounded to float32
    this.acc = 0.0; // pulse phase in cycles
    /** @type {Float64Array[]} */
    this.ola = []; // Float64Array(300) per block [emitted, ...)
    this.flushed = false;
    this.re = new Float64Array(N_FFT);
    this.im = new Float64Array(N_FFT);
  }

  get framesReceived() {
    return this.n;
  }

  /**
   * codes: Int16Array (or any integer array) of nRows * codebooks ids, frame-major.
   * @param {ArrayLike<number>} codes
   */
  push(codes) {
    if (this.flushed) throw new Error("decoder already flushed: start a new one for the next sentence");
    const { codebooks: K, codebookSize: C } = this.codec;
    if (codes.length % K !== 0) throw new Error(`codes length ${codes.length} is not a multiple of ${K}`);
    for (let i = 0; i < codes.length; i++) {
      const v = codes[i];
      if (!Number.isInteger(v) || v < 0 || v >= C) throw new Error(`code id ${v} outside [0, ${C})`);
    }
    const rows = codes.length / K;
    const f0t = this.codec.table.arrays.f0_table;
    for (let r = 0; r < rows; r++) {
      this.f0.push(f0t[codes[r * K]]);
      this.envs.push(this.codec.envelope(codes, r));
    }
    this.n += rows;
    return this.step(false);
  }

  /** End of the sentence: the remaining samples. */
  flush() {
    if (this.flushed) throw new Error("decoder already flushed: start a new one for the next sentence");
    this.flushed = true;
    return this.step(true);
  }

  /** @param {boolean} final */
  step(final) {
    const stop = final ? this.n : Math.max(this.synth, this.n - 2);
    if (this.n) this.pulseUntil(final ? this.n : this.n - 2);
    for (let k = this.synth; k < stop; k++) {
      const env = this.envs.shift(); // pushed with its frame: one per frame not yet synthesized
      if (!env) throw new Error(`codec decoder: no envelope for frame ${k}`);
      this.addFrame(k, this.synthFrame(k, env));
    }
    this.synth = Math.max(this.synth, stop);
    while (this.firstBlock < this.synth - 2 && this.pulses.length) {
      this.pulses.shift();
      this.firstBlock++;
    }
    const end = final ? this.n : Math.max(this.emitted, this.synth - 2);
    const out = new Float32Array((end - this.emitted) * HOP);
    for (let b = this.emitted; b < end; b++) {
      const acc = this.ola[b - this.emitted] || new Float64Array(HOP);
      let norm = NORM_MID;
      if (b === 0 || b >= this.n - 2) {
        norm = normRow([0, 1, 2, 3].map((p) => b + 2 - p >= 0 && b + 2 - p < this.n));
      }
      const at = (b - this.emitted) * HOP;
      for (let j = 0; j < HOP; j++) out[at + j] = acc[j] * norm[j];
    }
    this.ola.splice(0, end - this.emitted);
    this.emitted = end;
    if (final) {
      this.pulses = [];
      this.ola = [];
    }
    return out;
  }

  /** @param {number} last */
  pulseUntil(last) {
    const f = this.f0;
    /** @param {number} i */
    const at = (i) => f[Math.min(Math.max(i, 0), f.length - 1)];
    for (let m = this.nextBlock; m <= last; m++) {
      const fp = at(m - 1);
      const fc = at(m);
      const fn = at(m + 1);
      const block = new Float64Array(HOP);
      const start = this.acc;
      let c = 0.0;
      let tLast = 0.0;
      for (let j = 0; j < HOP; j++) {
        let fj = (j < HOP / 2 ? fp : fc) * V[j] + (j < HOP / 2 ? fc : fn) * U[j];
        const voiced = fj > VOICED_HZ;
        if (fj < VOICED_HZ) fj = VOICED_HZ;
        c += fj;
        const cs = c * (1.0 / SAMPLE_RATE);
        let t = start + cs;
        tLast = t;
        t -= Math.floor(t);
        t *= TWO_PI;
        const h = Math.floor(F_MAX / fj) + 0.5;
        let s = 2.0 * Math.sin(0.5 * t);
        let e;
        if (Math.abs(s) <= 2e-3) {
          e = h;
        } else {
          e = Math.sin(h * t) / s;
        }
        e -= 0.5;
        block[j] = voiced ? f32(e) : 0;
      }
      this.acc = tLast - Math.floor(tLast);
      this.pulses.push(block);
    }
    this.nextBlock = Math.max(this.nextBlock, last + 1);
  }

  /**
   * @param {number} k
   * @param {Float64Array} env
   */
  synthFrame(k, env) {
    const { re, im } = this;
    re.fill(0);
    im.fill(0);
    // window over blocks k-2 .. k+1
    for (let p = 0; p < 4; p++) {
      const block = this.pulses[k - 2 + p - this.firstBlock];
      for (let j = 0; j < HOP; j++) re[p * HOP + j] = f32(block[j] * WIN_SRC[p * HOP + j]);
    }
    fft(re, im);
    const base = Math.imul(k, 2 * N_BINS) >>> 0;
    for (let i = 0; i < N_BINS; i++) {
      const gh = f32(Math.exp(Math.min(env[i], LOG_MAX)));
      const ga = f32(f32(Math.exp(Math.min(env[N_BINS + i], LOG_MAX))) * NOISE_GAIN);
      const hr = lowbias32((base + 2 * i + NOISE_SEED) >>> 0);
      const hi = lowbias32((base + 2 * i + 1 + NOISE_SEED) >>> 0);
      const nr = f32(f32(f32((hr >>> 8) * 2 ** -23) - 1) * SQRT3);
      const ni = f32(f32(f32((hi >>> 8) * 2 ** -23) - 1) * SQRT3);
      re[i] = re[i] * gh + nr * ga;
      im[i] = im[i] * gh + ni * ga;
    }
    // inverse real FFT: Hermitian extension (DC and Nyquist imaginary parts ignored), conjugate trick
    im[0] = 0;
    im[N_BINS - 1] = 0;
    for (let i = 1; i < N_BINS - 1; i++) {
      re[N_FFT - i] = re[i];
      im[N_FFT - i] = im[i];
      im[i] = -im[i];
    }
    fft(re, im);
    const frame = new Float64Array(WIN_LEN);
    for (let j = 0; j < WIN_LEN; j++) frame[j] = (re[j] / N_FFT) * WIN[j];
    return frame;
  }

  /**
   * @param {number} k
   * @param {Float64Array} frame
   */
  addFrame(k, frame) {
    for (let p = 0; p < 4; p++) {
      const b = k - 2 + p;
      if (b < this.emitted) continue;
      while (this.ola.length <= b - this.emitted) this.ola.push(new Float64Array(HOP));
      const acc = this.ola[b - this.emitted];
      for (let j = 0; j < HOP; j++) acc[j] += frame[p * HOP + j];
    }
  }
}
