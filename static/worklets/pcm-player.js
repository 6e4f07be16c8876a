// AudioWorklet: plays pushed PCM chunks back to back on the audio thread, so consecutive chunks join
// sample-exact (no gaps, no clicks). Reads each chunk at the rate it was pushed with (the rate the
// server states for it); when the context runs at another rate it steps through the source with
// linear interpolation. Counts what it received and played (source samples) and reports that to the
// page a few dozen times a second.

const REPORT_SECONDS = 0.02;
const FADE_SECONDS = 0.008; // a stop ramps down this long instead of cutting mid-wave

class PcmPlayerProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    this.sourceRate = opts.sourceRate || sampleRate; // for chunks pushed without a rate
    this.prebufferSeconds = (opts.prebufferMs ?? 60) / 1000;
    this.reportEvery = Math.round(REPORT_SECONDS * sampleRate);
    this.fadeLength = Math.max(1, Math.round(FADE_SECONDS * sampleRate));
    this.reset();
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  reset() {
    this.chunks = []; // { samples, step }: step = the chunk's rate / the context's rate
    this.position = 0; // fractional read position inside chunks[0]
    this.queued = 0; // source samples not yet played
    this.received = 0;
    this.played = 0;
    this.underruns = 0;
    this.started = false; // playing (after the pre-buffer filled)
    this.ended = false; // the page said no more audio follows
    this.fadeLeft = 0;
    this.sinceReport = 0;
  }

  onMessage(msg) {
    if (msg.type === "push") {
      if (msg.samples.length === 0) return;
      this.chunks.push({ samples: msg.samples, step: (msg.rate || this.sourceRate) / sampleRate });
      this.queued += msg.samples.length;
      this.received += msg.samples.length;
      this.ended = false;
    } else if (msg.type === "end") {
      this.ended = true;
    } else if (msg.type === "stop") {
      if (this.queued > 0 && this.started) this.fadeLeft = this.fadeLength;
      else this.clear();
      this.ended = true;
    } else if (msg.type === "reset") {
      this.reset();
    }
    this.report(msg.type);
  }

  clear() {
    this.chunks = [];
    this.position = 0;
    this.queued = 0;
    this.started = false;
    this.fadeLeft = 0;
  }

  report(reason) {
    this.sinceReport = 0;
    this.port.postMessage({
      type: "stats",
      reason,
      received: this.received,
      played: this.played,
      queued: this.queued,
      underruns: this.underruns,
      playing: this.started && this.queued > 0,
    });
  }

  /** The next output sample, or null when no source sample is queued. */
  next() {
    const head = this.chunks[0];
    if (!head) return null;
    const chunk = head.samples;
    const i = Math.floor(this.position);
    let value = chunk[i];
    if (head.step !== 1) {
      const frac = this.position - i;
      const after = i + 1 < chunk.length ? chunk[i + 1] : this.chunks[1] ? this.chunks[1].samples[0] : value;
      value += (after - value) * frac;
    }
    this.position += head.step;
    const consumed = Math.floor(this.position) - i;
    this.played += consumed;
    this.queued -= consumed;
    while (this.chunks.length && this.position >= this.chunks[0].samples.length) {
      this.position -= this.chunks[0].samples.length;
      this.chunks.shift();
    }
    if (!this.chunks.length) {
      this.position = 0;
      this.queued = 0;
    }
    return value;
  }

  process(inputs, outputs) {
    const output = outputs[0];
    const channel = output[0];
    for (let n = 0; n < channel.length; n++) {
      if (!this.started) {
        const prebuffer = this.queued > 0 ? this.prebufferSeconds * this.chunks[0].step * sampleRate : 0;
        if (this.queued > 0 && (this.queued >= prebuffer || this.ended)) {
          this.started = true;
          this.report("start");
        } else {
          channel[n] = 0;
          continue;
        }
      }
      let value = this.next();
      if (value === null) {
        // Ran dry: a gap the listener hears unless the stream is over.
        this.started = false;
        if (!this.ended) this.underruns += 1;
        this.report(this.ended ? "drained" : "underrun");
        channel[n] = 0;
        continue;
      }
      if (this.fadeLeft > 0) {
        value *= this.fadeLeft / this.fadeLength;
        this.fadeLeft -= 1;
        if (this.fadeLeft === 0) {
          this.clear();
          this.report("stopped");
        }
      }
      channel[n] = value;
    }
    for (let c = 1; c < output.length; c++) output[c].set(channel);
    this.sinceReport += channel.length;
    if (this.sinceReport >= this.reportEvery) this.report("tick");
    return true;
  }
}

registerProcessor("pcm-player", PcmPlayerProcessor);
