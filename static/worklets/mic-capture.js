// AudioWorklet: microphone → 16 kHz mono PCM16 on the audio thread. Low-passes below the new Nyquist
// (two cascaded biquads, cut-off 7 kHz) and steps through the input at the rate ratio with linear
// interpolation. Posts Int16Array chunks (processorOptions.chunkMs long, 100 ms by default) with their
// RMS level; "flush" posts what is left.

const TARGET_RATE = 16000;
const DEFAULT_CHUNK_MS = 100;
const CUTOFF_HZ = 7000;

/** RBJ cookbook low-pass coefficients (Q = 1/√2), normalised by a0. */
function lowpass(rate, cutoff) {
  const w0 = (2 * Math.PI * cutoff) / rate;
  const alpha = Math.sin(w0) / Math.SQRT2;
  const cos = Math.cos(w0);
  const a0 = 1 + alpha;
  return {
    b0: (1 - cos) / 2 / a0,
    b1: (1 - cos) / a0,
    b2: (1 - cos) / 2 / a0,
    a1: (-2 * cos) / a0,
    a2: (1 - alpha) / a0,
  };
}

class Biquad {
  constructor(c) {
    this.c = c;
    this.x1 = this.x2 = this.y1 = this.y2 = 0;
  }

  step(x) {
    const { b0, b1, b2, a1, a2 } = this.c;
    const y = b0 * x + b1 * this.x1 + b2 * this.x2 - a1 * this.y1 - a2 * this.y2;
    this.x2 = this.x1;
    this.x1 = x;
    this.y2 = this.y1;
    this.y1 = y;
    return y;
  }
}

class MicCaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const chunkMs = Number(options?.processorOptions?.chunkMs) || DEFAULT_CHUNK_MS;
    this.ratio = sampleRate / TARGET_RATE;
    const filtering = sampleRate > TARGET_RATE * 1.01;
    const coeffs = filtering ? lowpass(sampleRate, Math.min(CUTOFF_HZ, sampleRate * 0.45)) : null;
    this.filters = filtering ? [new Biquad(coeffs), new Biquad(coeffs)] : [];
    this.inputIndex = -1; // index of the last input sample seen
    this.nextPos = 0; // input position of the next output sample
    this.previous = 0;
    this.chunk = new Int16Array(Math.max(1, Math.round((TARGET_RATE * chunkMs) / 1000)));
    this.filled = 0;
    this.sumSquares = 0;
    this.port.onmessage = (event) => {
      if (event.data === "flush") this.post(true);
    };
  }

  post(final) {
    const samples = this.chunk.slice(0, this.filled);
    const rms = this.filled ? Math.sqrt(this.sumSquares / this.filled) : 0;
    this.port.postMessage({ samples, rms, final }, [samples.buffer]);
    this.filled = 0;
    this.sumSquares = 0;
  }

  emit(value) {
    const s = Math.max(-1, Math.min(1, value));
    this.chunk[this.filled++] = s < 0 ? s * 32768 : s * 32767;
    this.sumSquares += s * s;
    if (this.filled === this.chunk.length) this.post(false);
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    for (let i = 0; i < channel.length; i++) {
      let x = channel[i];
      for (const f of this.filters) x = f.step(x);
      this.inputIndex += 1;
      while (this.nextPos <= this.inputIndex) {
        const frac = this.nextPos - (this.inputIndex - 1);
        this.emit(this.previous + (x - this.previous) * frac);
        this.nextPos += this.ratio;
      }
      this.previous = x;
    }
    // Keep the positions small over long sessions without changing their difference.
    if (this.inputIndex > 1e6) {
      this.inputIndex -= 1e6;
      this.nextPos -= 1e6;
    }
    return true;
  }
}

registerProcessor("mic-capture", MicCaptureProcessor);
