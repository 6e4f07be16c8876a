// The page side of the pcm-player AudioWorklet: an AudioContext at the stream's own rate (24 kHz),
// so the browser plays the samples as they are, and a node that takes chunks as they arrive.

const WORKLET_URL = new URL("../worklets/pcm-player.js", import.meta.url);

/** Linear resampling for the rare chunk whose rate differs from the player's. */
export function resampleLinear(samples, fromRate, toRate) {
  if (fromRate === toRate) return samples;
  const out = new Float32Array(Math.max(0, Math.floor((samples.length * toRate) / fromRate)));
  const step = fromRate / toRate;
  for (let i = 0; i < out.length; i++) {
    const pos = i * step;
    const j = Math.floor(pos);
    const a = samples[j];
    const b = j + 1 < samples.length ? samples[j + 1] : a;
    out[i] = a + (b - a) * (pos - j);
  }
  return out;
}

export class PcmPlayer {
  /** Must be called from a user gesture the first time (browsers start audio only then). */
  static async create({ sourceRate = 24000, onStats = () => {} } = {}) {
    let context;
    try {
      context = new AudioContext({ sampleRate: sourceRate, latencyHint: "interactive" });
    } catch {
      context = new AudioContext({ latencyHint: "interactive" }); // the worklet then resamples
    }
    await context.audioWorklet.addModule(WORKLET_URL);
    const node = new AudioWorkletNode(context, "pcm-player", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { sourceRate },
    });
    node.connect(context.destination);
    return new PcmPlayer(context, node, sourceRate, onStats);
  }

  constructor(context, node, sourceRate, onStats) {
    this.context = context;
    this.node = node;
    this.sourceRate = sourceRate;
    this.stats = { received: 0, played: 0, queued: 0, underruns: 0, playing: false, reason: "" };
    node.port.onmessage = (event) => {
      this.stats = event.data;
      onStats(event.data);
    };
  }

  async resume() {
    if (this.context.state !== "running") await this.context.resume();
  }

  /** Queue float samples (-1..1) recorded at `rate`; ownership of the buffer moves to the worklet. */
  push(samples, rate = this.sourceRate) {
    const data = rate === this.sourceRate ? samples : resampleLinear(samples, rate, this.sourceRate);
    this.node.port.postMessage({ type: "push", samples: data }, [data.buffer]);
  }

  /** No more audio follows: play out what is queued, even if shorter than the pre-buffer. */
  end() {
    this.node.port.postMessage({ type: "end" });
  }

  /** Stop now: a few milliseconds' fade, then everything queued is dropped. */
  stop() {
    this.node.port.postMessage({ type: "stop" });
  }

  /** Start counting from zero (a new utterance); anything queued is dropped. */
  reset() {
    this.node.port.postMessage({ type: "reset" });
  }

  /** Source samples between the worklet's read position and the listener's ear. */
  get latencySamples() {
    const seconds = (this.context.outputLatency || 0) + (this.context.baseLatency || 0);
    return Math.round(seconds * this.sourceRate);
  }

  get contextRate() {
    return this.context.sampleRate;
  }
}
