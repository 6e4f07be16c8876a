// Test and bench double for the microphone (added with Playwright's add_init_script): getUserMedia
// returns Chromium's fake camera with an audio track fed by a WebAudio graph, so a spoken clip
// starts exactly when the caller says (`__say(name)`, clips handed over as `__cues[name]`, 24 kHz
// float32). It also timestamps (performance.now()) every JSON message the page's sockets receive
// and every change of the answer's audio state, in `__events`, for latency figures.
(() => {
  const real = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
  window.__cues = {};
  window.__events = [];
  window.__said = [];
  navigator.mediaDevices.getUserMedia = async (constraints) => {
    const camera = await real({ video: constraints.video });
    const ctx = new AudioContext({ sampleRate: 48000 });
    const out = ctx.createMediaStreamDestination();
    window.__say = (name) => {
      const samples = window.__cues[name];
      const buffer = ctx.createBuffer(1, samples.length, 24000);
      buffer.copyToChannel(samples, 0);
      const src = ctx.createBufferSource();
      src.buffer = buffer;
      src.connect(out);
      src.start();
      window.__said.push({ name, t: performance.now() });
    };
    return new MediaStream([...camera.getVideoTracks(), ...out.stream.getAudioTracks()]);
  };
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (event) => {
        if (typeof event.data !== "string") return;
        try {
          window.__events.push({ type: JSON.parse(event.data).type, t: performance.now() });
        } catch {
          // not JSON: not an event
        }
      });
    }
  };
  document.addEventListener("DOMContentLoaded", () => {
    const audio = document.getElementById("audio-state");
    if (!audio) return;
    new MutationObserver(() =>
      window.__events.push({ type: `audio-state:${audio.dataset.state}`, t: performance.now() }),
    ).observe(audio, { attributes: true, attributeFilter: ["data-state"] });
  });
})();
