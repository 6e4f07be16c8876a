// @ts-check
// Shared by the pages: named states, typed elements, a reconnecting WebSocket, the server's errors,
// status and error display, base64 and WAV helpers.

// -- what the server says --------------------------------------------------------------------------

/**
 * Whose problem an `error` is: every `error` the server sends carries one (omniweb/base/errors.py),
 * and the pages act on it, never on the message's words (those are for people).
 * @typedef {"client_error" | "capacity" | "engine_failure" | "upstream_failure" | "worker_lost"
 *   | "engine_unreachable" | "starting" | "unavailable" | "timeout" | "stalled" | "auth" | "limit"} ErrorKind
 */

/**
 * The protocol's `error` message (both streaming endpoints).
 * @typedef {object} ServerError
 * @property {"error"} type
 * @property {string} message  safe to show, in words a person can read
 * @property {ErrorKind} kind
 * @property {boolean} [partial_audio]  speech: the sentence's audio already sent is incomplete
 */

// -- named states ----------------------------------------------------------------------------------

/**
 * Named states and the moves allowed between them. A move the table does not list is refused (the
 * state stays, the refusal is logged as an error), so a page never drifts into a mix of flags that
 * no one designed.
 * @template {string} S
 */
export class Machine {
  /** @type {S} */
  #state;

  /**
   * @param {string} name  what it is the state of, for the refusal's message
   * @param {S} initial
   * @param {Readonly<Record<S, readonly S[]>>} moves  for each state, the states it may move to
   * @param {(state: S) => void} [onMove]  called after every move (to show the new state)
   */
  constructor(name, initial, moves, onMove) {
    this.name = name;
    this.#state = initial;
    this.moves = moves;
    this.onMove = onMove;
  }

  /** @returns {S} */
  get state() {
    return this.#state;
  }

  /**
   * True in any of `states`.
   * @param {...S} states
   */
  is(...states) {
    return states.includes(this.#state);
  }

  /**
   * Move to `to` when the table allows it from here; else refuse: stay, log, return false.
   * @param {S} to
   */
  move(to) {
    if (!this.moves[this.#state].includes(to)) {
      console.error(`${this.name}: refused move ${this.#state} → ${to}`);
      return false;
    }
    this.#state = to;
    this.onMove?.(to);
    return true;
  }
}

// -- the page's elements ---------------------------------------------------------------------------

/**
 * The element with this id, of the class the page's template gives it (checked: a template that
 * changed under the script fails at load, by name, not later as a null).
 * @template {Element} T
 * @param {string} id
 * @param {{ new (): T }} type
 * @returns {T}
 */
export function byId(id, type) {
  const el = document.getElementById(id);
  if (!(el instanceof type)) throw new Error(`#${id} is missing or not a ${type.name}`);
  return el;
}

/**
 * The JSON the server put in the page (`json_script`), read as the given shape.
 * @template T
 * @param {string} id
 * @returns {T}
 */
export function pageData(id) {
  return JSON.parse(byId(id, HTMLScriptElement).textContent ?? "null");
}

/**
 * ws:// or wss:// URL for an endpoint of this server; a ?token= on the page URL is passed along.
 * @param {string} path
 */
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

// -- the connection --------------------------------------------------------------------------------

/**
 * `closed`: not wanted (before the first `open()`, or after `close()`); `connecting`; `open`;
 * `retrying`: dropped without a word from the server, reopening after a backoff; `ended`: the server
 * ended it (after an `error`, or a clean close), reopened when the page next needs it.
 * @typedef {"closed" | "connecting" | "open" | "retrying" | "ended"} SocketState
 */

/** @type {Readonly<Record<SocketState, readonly SocketState[]>>} */
const SOCKET_MOVES = {
  closed: ["connecting"],
  connecting: ["open", "retrying", "ended", "closed"],
  open: ["retrying", "ended", "closed", "connecting"], // connecting: a socket the server is closing is replaced
  retrying: ["connecting", "closed"],
  ended: ["connecting", "closed"],
};

/**
 * What the page hears of its socket: `onStatus` gets the pill's state ("connecting", "open",
 * "retrying", "closed") and words; `onDrop` a close of the socket it was using.
 * @template M  the JSON messages the endpoint sends
 * @typedef {object} ConnectionHooks
 * @property {() => void} onOpen  sends the session's config (runs before `open()` resolves)
 * @property {(msg: M | ArrayBuffer) => void} onMessage
 * @property {(state: string, text: string) => void} onStatus
 * @property {(drop: { opened: boolean, unexplained: boolean, code: number }) => void} [onDrop]
 */

/**
 * One WebSocket that comes back after a drop.
 *
 * A socket that closes without having told us why (server restart, network loss) is reopened with
 * backoff; one that the server closed after an `error` message (idle timeout, rejected config) is
 * reopened only when the page next needs it (`open()`), so a rejected config can't loop.
 * @template {{ type: string }} M
 */
export class Connection {
  /** @param {string} path @param {ConnectionHooks<M>} hooks */
  constructor(path, { onOpen, onMessage, onStatus, onDrop }) {
    this.path = path;
    this.onOpen = onOpen;
    this.onMessage = onMessage;
    this.onStatus = onStatus;
    this.onDrop = onDrop;
    this.states = new Machine("connection", /** @type {SocketState} */ ("closed"), SOCKET_MOVES);
    /** @type {WebSocket | null} */
    this.ws = null;
    /** @type {Promise<void> | null} */
    this.opening = null;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    this.retryTimer = undefined;
    this.retries = 0;
    /** @type {ErrorKind | null} the kind of the last `error` on the current socket: its close is explained */
    this.lastError = null;
  }

  get state() {
    return this.states.state;
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  /** Resolve once the socket is open and `onOpen` has run (it sends the session's config). */
  open() {
    if (this.isOpen) return Promise.resolve();
    if (this.opening) return this.opening;
    clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    this.states.move("connecting");
    this.opening = new Promise((resolve, reject) => {
      this.onStatus("connecting", this.retries ? `Reconnecting (attempt ${this.retries + 1})…` : "Connecting…");
      const ws = new WebSocket(wsUrl(this.path));
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      this.lastError = null;
      let opened = false;
      ws.onopen = () => {
        opened = true;
        this.retries = 0;
        this.opening = null;
        this.states.move("open");
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
          /** @type {M} */
          let msg;
          try {
            msg = JSON.parse(event.data);
          } catch {
            return;
          }
          if (isServerError(msg)) this.lastError = msg.kind;
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
        const unexplained = this.lastError === null && event.code !== 1000;
        this.onDrop?.({ opened, unexplained, code: event.code });
        if (this.states.is("closed")) {
          this.onStatus("closed", "Closed");
        } else if (unexplained) {
          this.scheduleRetry();
        } else {
          this.states.move("ended");
          this.onStatus("closed", "Disconnected; reconnects when needed");
        }
      };
    });
    return this.opening;
  }

  scheduleRetry() {
    this.states.move("retrying");
    const delay = Math.min(10000, 500 * 2 ** this.retries);
    this.retries += 1;
    this.onStatus("retrying", `Connection lost; reconnecting in ${(delay / 1000).toFixed(1)} s`);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      this.open().catch(() => {});
    }, delay);
  }

  /** @param {object} message */
  send(message) {
    if (this.ws === null || !this.isOpen) throw new Error("not connected");
    this.ws.send(JSON.stringify(message));
  }

  get bufferedAmount() {
    return this.ws ? this.ws.bufferedAmount : 0;
  }

  /**
   * Close on purpose: no reconnect until `open()` is called again.
   * @param {object | null} [finalMessage]
   */
  close(finalMessage) {
    clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    if (this.states.is("closed")) return;
    this.states.move("closed");
    if (this.ws) {
      if (finalMessage && this.isOpen) this.ws.send(JSON.stringify(finalMessage));
      this.ws.close(1000);
    } else {
      this.onStatus("closed", "Closed");
    }
  }
}

/** @param {CloseEvent} event */
function refusalText(event) {
  if (event.code === 1006) {
    return (
      "Could not connect to the server. It may be down, or it refused this page " +
      "(the page's address must be in OMNIWEB_ALLOWED_HOSTS, and a server with API tokens needs ?token= in the page address)."
    );
  }
  return `The connection closed before it opened (code ${event.code}).`;
}

/**
 * Show a connection state: `el` holds a .dot and a .label; data-state drives the colour.
 * @param {HTMLElement} el
 * @param {string} state
 * @param {string} text
 */
export function showConnection(el, state, text) {
  el.dataset.state = state;
  const label = el.querySelector(".label");
  if (label) label.textContent = text;
}

/**
 * Put a message in a role=alert box, in words a person can act on.
 * @param {HTMLElement} el
 * @param {string} message
 */
export function showError(el, message) {
  el.textContent = message;
  el.hidden = false;
}

/** @param {HTMLElement} el */
export function clearError(el) {
  el.textContent = "";
  el.hidden = true;
}

/**
 * True for the protocol's `error` message.
 * @param {{ type: string }} msg
 * @returns {msg is ServerError}
 */
export function isServerError(msg) {
  return msg.type === "error";
}

/**
 * The protocol's `error` message as a sentence for a person.
 * @param {ServerError} msg
 */
export function describeServerError(msg) {
  let text = `The server said: ${msg.message}`;
  if (msg.partial_audio) text += " (the audio already played for this sentence is incomplete).";
  return text;
}

/**
 * The words of a thrown value (an Error's message, or the value itself).
 * @param {unknown} err
 */
export function errorText(err) {
  return err instanceof Error ? err.message : String(err);
}

// -- bytes ----------------------------------------------------------------------------------------

/** @param {Uint8Array} bytes */
export function bytesToBase64(bytes) {
  let binary = "";
  const step = 0x8000;
  for (let i = 0; i < bytes.length; i += step) {
    binary += String.fromCharCode(...bytes.subarray(i, i + step));
  }
  return btoa(binary);
}

/** @param {string} b64 */
export function base64ToBytes(b64) {
  const binary = atob(b64);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}

/**
 * Little-endian 16-bit PCM bytes as samples (copies when the bytes are not 2-aligned).
 * @param {Uint8Array} bytes
 */
export function pcm16FromBytes(bytes) {
  const even = bytes.byteLength - (bytes.byteLength % 2);
  if (bytes.byteOffset % 2 === 0) return new Int16Array(bytes.buffer, bytes.byteOffset, even / 2);
  return new Int16Array(bytes.slice(0, even).buffer);
}

/** @param {Int16Array} int16 */
export function int16ToFloat32(int16) {
  const out = new Float32Array(int16.length);
  for (let i = 0; i < int16.length; i++) out[i] = int16[i] / 32768;
  return out;
}

/** @param {Float32Array} float32 */
export function float32ToInt16(float32) {
  const out = new Int16Array(float32.length);
  for (let i = 0; i < float32.length; i++) {
    const s = Math.max(-1, Math.min(1, float32[i]));
    out[i] = s < 0 ? s * 32768 : s * 32767;
  }
  return out;
}

/**
 * A mono 16-bit WAV file of the given sample chunks.
 * @param {Int16Array[]} chunks
 * @param {number} sampleRate
 */
export function wavBlob(chunks, sampleRate) {
  const samples = chunks.reduce((n, c) => n + c.length, 0);
  const header = new DataView(new ArrayBuffer(44));
  /** @param {number} offset @param {string} s */
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

/**
 * Samples of a 16-bit PCM WAV file (mono, or the first channel) and the rate its header states.
 * Throws on anything else.
 * @param {Uint8Array} bytes
 * @returns {{ rate: number, samples: Int16Array }}
 */
export function parseWav(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  /** @param {number} offset */
  const text = (offset) => String.fromCharCode(...bytes.subarray(offset, offset + 4));
  if (bytes.byteLength < 12 || text(0) !== "RIFF" || text(8) !== "WAVE") throw new Error("not a WAV file");
  let offset = 12;
  /** @type {{ code: number, channels: number, rate: number, bits: number } | null} */
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

/** @param {number | null | undefined} ms */
export function formatMs(ms) {
  if (ms == null || !Number.isFinite(ms)) return "–";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

/**
 * Show a latency readout; the raw value stays in data-ms for tests and benches.
 * @param {HTMLElement} el
 * @param {number} ms
 */
export function showMs(el, ms) {
  el.textContent = formatMs(ms);
  el.dataset.ms = ms.toFixed(1);
}

/**
 * Show a page's state in words (in its .label when it has one); data-state drives its styling.
 * @param {HTMLElement} el
 * @param {string} state
 * @param {string} text
 */
export function setStateText(el, state, text) {
  el.dataset.state = state;
  (el.querySelector(".label") ?? el).textContent = text;
}
