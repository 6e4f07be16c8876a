// @ts-check
// The page side of the pcm-player AudioWorklet: an AudioContext at the stream's own rate when the
// page knows it beforehand (the rate the server states), so the browser plays the samples as they
// are, and a node that takes chunks as they arrive, each read at the rate it is pushed with.

const WORKLET_URL = new URL("../worklets/pcm-player.js", import.meta.url);

/**
 * What the worklet reports a few dozen times a second (and on every message it gets).
 * @typedef {object} PlayerStats
 * @property {number} received  source samples pushed since the last reset
 * @property {number} played  source samples played since the last reset
 * @property {number} queued
 * @property {number} underruns
 * @property {boolean} playing
 * @property {string} reason  what the report follows: "push", "end", "stop", "reset", "start", "drained", ...
 */

/**
 * Linear resampling: a chunk brought onto a page's timeline when its rate differs from the page's.
 * @param {Float32Array} samples
 * @param {number} fromRate
 * @param {number} toRate
 */
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
  /**
   * Must be called from a user gesture the first time (browsers start audio only then).
   * @param {{ sourceRate?: number, onStats?: (stats: PlayerStats) => void }} options  `sourceRate`:
   *   the rate the server states for its audio, when the page knows it before the audio comes (the
   *   context then runs at it); without one the context runs at the device's rate
   */
  static async create({ sourceRate, onStats = () => {} }) {
    let context;
    try {
      context = new AudioContext({ sampleRate: sourceRate, latencyHint: "interactive" });
    } catch {
      context = new AudioContext({ latencyHint: "interactive" }); // the worklet then resamples
    }
    sourceRate ??= context.sampleRate;
    await context.audioWorklet.addModule(WORKLET_URL);
    const node = new AudioWorkletNode(context, "pcm-player", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { sourceRate },
    });
    node.connect(context.destination);
    return new PcmPlayer(context, node, sourceRate, onStats);
  }

  /**
   * @param {AudioContext} context
   * @param {AudioWorkletNode} node
   * @param {number} sourceRate
   * @param {(stats: PlayerStats) => void} onStats
   */
  constructor(context, node, sourceRate, onStats) {
    this.context = context;
    this.node = node;
    this.sourceRate = sourceRate;
    /** @type {PlayerStats} */
    this.stats = { received: 0, played: 0, queued: 0, underruns: 0, playing: false, reason: "" };
    node.port.onmessage = (event) => {
      this.stats = event.data;
      onStats(event.data);
    };
  }

  async resume() {
    if (this.context.state !== "running") await this.context.resume();
  }

  /**
   * Queue float samples (-1..1) at `rate` (the worklet reads them at it); ownership of the buffer
   * moves to the worklet.
   * @param {Float32Array} samples
   * @param {number} [rate]
   */
  push(samples, rate = this.sourceRate) {
    this.node.port.postMessage({ type: "push", samples, rate }, [samples.buffer]);
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
