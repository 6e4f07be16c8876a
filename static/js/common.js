// Shared by the pages: a reconnecting WebSocket, status and error display, base64 and WAV helpers.

/** ws:// or wss:// URL for an endpoint of this server; a ?token= on the page URL is passed along. */
export function wsUrl(path) {
  const url = new URL(path, window.location.href);
  url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
  const token = new URLSearchParams(window.location.search).get("token");
  if (token) url.searchParams.set("token", token);
  return url.toString();
}

/** Milliseconds on one clock for the whole page (epoch-based, monotonic within the page). */
export function nowMs() {
  return performance.timeOrigin + performance.now();
}

/**
 * One WebSocket that comes back after a drop.
 *
 * A socket that closes without having told us why (server restart, network loss) is reopened with
 * backoff; one that the server closed after an `error` message (idle timeout, rejected config) is
 * reopened only when the page next needs it (`open()`), so a rejected config can't loop.
 */
export class Connection {
  constructor(path, { onOpen, onMessage, onStatus, onDrop }) {
    this.path = path;
    this.onOpen = onOpen;
    this.onMessage = onMessage;
    this.onStatus = onStatus;
    this.onDrop = onDrop;
    this.ws = null;
    this.opening = null;
    this.retryTimer = null;
    this.retries = 0;
    this.sawError = false;
    this.wanted = false;
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  /** Resolve once the socket is open and `onOpen` has run (it sends the session's config). */
  open() {
    this.wanted = true;
    if (this.isOpen) return Promise.resolve();
    if (this.opening) return this.opening;
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.opening = new Promise((resolve, reject) => {
      this.onStatus("connecting", this.retries ? `Reconnecting (attempt ${this.retries + 1})…` : "Connecting…");
      const ws = new WebSocket(wsUrl(this.path));
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      this.sawError = false;
      let opened = false;
      ws.onopen = () => {
        opened = true;
        this.retries = 0;
        this.opening = null;
        this.onStatus("open", "Connected");
        try {
          this.onOpen();
          resolve();
        } catch (err) {
          reject(err);
        }
      };
      ws.onmessage = (event) => {
        if (typeof event.data === "string") {
          let msg;
          try {
            msg = JSON.parse(event.data);
          } catch {
            return;
          }
          if (msg && msg.type === "error") this.sawError = true;
          this.onMessage(msg);
        } else {
          this.onMessage(event.data);
        }
      };
      ws.onclose = (event) => {
        if (this.ws !== ws) return;
        this.ws = null;
        this.opening = null;
        if (!opened) {
          reject(new Error(refusalText(event)));
        }
        const unexplained = !this.sawError && event.code !== 1000;
        this.onDrop?.({ opened, unexplained, code: event.code });
        if (this.wanted && unexplained) {
          this.scheduleRetry();
        } else {
          this.onStatus("closed", this.wanted ? "Disconnected; reconnects when needed" : "Closed");
        }
      };
    });
    return this.opening;
  }

  scheduleRetry() {
    const delay = Math.min(10000, 500 * 2 ** this.retries);
    this.retries += 1;
    this.onStatus("retrying", `Connection lost; reconnecting in ${(delay / 1000).toFixed(1)} s`);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.open().catch(() => {});
    }, delay);
  }

  send(message) {
    if (!this.isOpen) throw new Error("not connected");
    this.ws.send(JSON.stringify(message));
  }

  get bufferedAmount() {
    return this.ws ? this.ws.bufferedAmount : 0;
  }

  /** Close on purpose: no reconnect until `open()` is called again. */
  close(finalMessage) {
    this.wanted = false;
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    if (this.ws) {
      if (finalMessage && this.isOpen) this.ws.send(JSON.stringify(finalMessage));
      this.ws.close(1000);
    }
  }
}

function refusalText(event) {
  if (event.code === 1006) {
    return (
      "Could not connect to the server. It may be down, or it refused this page " +
      "(the page's address must be in OMNIWEB_ALLOWED_HOSTS, and a server with API tokens needs ?token= in the page address)."
    );
  }
  return `The connection closed before it opened (code ${event.code}).`;
}

/** Show a connection state: `el` holds a .dot and a .label; data-state drives the colour. */
export function showConnection(el, state, text) {
  el.dataset.state = state;
  el.querySelector(".label").textContent = text;
}

/** Put a message in a role=alert box, in words a person can act on. */
export function showError(el, message) {
  el.textContent = message;
  el.hidden = false;
}

export function clearError(el) {
  el.textContent = "";
  el.hidden = true;
}

/** The protocol's `error` message as a sentence for a person. */
export function describeServerError(msg) {
  let text = `The server said: ${msg.message}`;
  if (msg.partial_audio) text += " (the audio already played for this sentence is incomplete).";
  return text;
}

// -- bytes ----------------------------------------------------------------------------------------

export function bytesToBase64(bytes) {
  let binary = "";
  const step = 0x8000;
  for (let i = 0; i < bytes.length; i += step) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + step));
  }
  return btoa(binary);
}

export function base64ToBytes(b64) {
  const binary = atob(b64);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}

/** Little-endian 16-bit PCM bytes as samples (copies when the bytes are not 2-aligned). */
export function pcm16FromBytes(bytes) {
  const even = bytes.byteLength - (bytes.byteLength % 2);
  if (bytes.byteOffset % 2 === 0) return new Int16Array(bytes.buffer, bytes.byteOffset, even / 2);
  return new Int16Array(bytes.slice(0, even).buffer);
}

export function int16ToFloat32(int16) {
  const out = new Float32Array(int16.length);
  for (let i = 0; i < int16.length; i++) out[i] = int16[i] / 32768;
  return out;
}

export function float32ToInt16(float32) {
  const out = new Int16Array(float32.length);
  for (let i = 0; i < float32.length; i++) {
    const s = Math.max(-1, Math.min(1, float32[i]));
    out[i] = s < 0 ? s * 32768 : s * 32767;
  }
  return out;
}

/** A mono 16-bit WAV file of the given sample chunks. */
export function wavBlob(chunks, sampleRate) {
  const samples = chunks.reduce((n, c) => n + c.length, 0);
  const header = new DataView(new ArrayBuffer(44));
  const tag = (offset, s) => [...s].forEach((ch, i) => header.setUint8(offset + i, ch.charCodeAt(0)));
  tag(0, "RIFF");
  header.setUint32(4, 36 + samples * 2, true);
  tag(8, "WAVE");
  tag(12, "fmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, 1, true); // PCM
  header.setUint16(22, 1, true); // mono
  header.setUint32(24, sampleRate, true);
  header.setUint32(28, sampleRate * 2, true);
  header.setUint16(32, 2, true);
  header.setUint16(34, 16, true);
  tag(36, "data");
  header.setUint32(40, samples * 2, true);
  return new Blob([header, ...chunks], { type: "audio/wav" });
}

/** Samples of a 16-bit PCM WAV file (mono, or the first channel). Throws on anything else. */
export function parseWav(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const text = (offset) => String.fromCharCode(...bytes.subarray(offset, offset + 4));
  if (bytes.byteLength < 12 || text(0) !== "RIFF" || text(8) !== "WAVE") throw new Error("not a WAV file");
  let offset = 12;
  let format = null;
  while (offset + 8 <= bytes.byteLength) {
    const id = text(offset);
    const size = view.getUint32(offset + 4, true);
    const body = offset + 8;
    if (id === "fmt ") {
      format = {
        code: view.getUint16(body, true),
        channels: view.getUint16(body + 2, true),
        rate: view.getUint32(body + 4, true),
        bits: view.getUint16(body + 14, true),
      };
    } else if (id === "data") {
      if (!format || format.code !== 1 || format.bits !== 16) throw new Error("WAV is not 16-bit PCM");
      const end = Math.min(bytes.byteLength, body + size);
      const all = pcm16FromBytes(bytes.subarray(body, end));
      if (format.channels === 1) return { rate: format.rate, samples: all };
      const mono = new Int16Array(Math.floor(all.length / format.channels));
      for (let i = 0; i < mono.length; i++) mono[i] = all[i * format.channels];
      return { rate: format.rate, samples: mono };
    }
    offset = body + size + (size % 2);
  }
  throw new Error("WAV has no data chunk");
}

export function formatMs(ms) {
  if (ms == null || !Number.isFinite(ms)) return "–";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

/** Show a latency readout; the raw value stays in data-ms for tests and benches. */
export function showMs(el, ms) {
  el.textContent = formatMs(ms);
  el.dataset.ms = ms.toFixed(1);
}

/** Show a page's state in words (in its .label when it has one); data-state drives its styling. */
export function setStateText(el, state, text) {
  el.dataset.state = state;
  (el.querySelector(".label") ?? el).textContent = text;
}
