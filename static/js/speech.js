// @ts-check
// The speech page: text in, streamed speech out over /v1/audio/speech/stream, words lit up in time.
//
// Everything the page knows lives in one object, `page`: the utterance's phase (named states, see
// PHASE_MOVES), the player, the codec, what the open socket was told, what was typed live, and the
// utterance itself. The server's errors are read by their `kind`, and every sample's rate is the one
// the server states (the page's data, `audio.start`, `audio.chunk`, `codec.start`, the file itself).
import {
  Connection,
  Machine,
  base64ToBytes,
  byId,
  clearError,
  describeServerError,
  errorText,
  float32ToInt16,
  int16ToFloat32,
  nowMs,
  pageData,
  pcm16FromBytes,
  setStateText,
  showConnection,
  showError,
  showMs,
  wavBlob,
} from "./common.js";
import { PcmPlayer, resampleLinear } from "./player.js";

/**
 * What the server put in the page (omniweb/web/views.py): its voices, formats and limits, and the
 * rate of the audio it sends.
 * @typedef {object} SpeechPageData
 * @property {number} sample_rate
 * @property {number} max_text_chars
 */

// -- the wire: what /v1/audio/speech/stream sends (docs/protocols/speech-stream.md) ---------------

/** @typedef {{ word: string, start_ms: number, end_ms: number }} WordTime */
/**
 * @typedef {{ type: "audio.start", utterance_index: number, sentence_index: number, sentence_text: string,
 *   format: string, sample_rate?: number }} AudioStart  `sample_rate` with streamed PCM
 * @typedef {{ type: "audio.chunk", utterance_index: number, sentence_index: number, sample_rate: number,
 *   audio_b64?: string, timestamps?: WordTime[] | null }} AudioChunk
 * @typedef {{ type: "audio.done", utterance_index: number, sentence_index: number, error: boolean }} AudioDone
 * @typedef {{ type: "session.done", utterance_index: number }} SessionDone
 * @typedef {{ type: "input.cancelled" }} InputCancelled
 * @typedef {{ type: "codec.start", utterance_index: number, sentence_index: number, sentence_text: string,
 *   sample_rate: number, decoder_id: string }} CodecStart
 * @typedef {{ type: "codec.done", utterance_index: number, sentence_index: number, error: boolean }} CodecDone
 * @typedef {AudioStart | AudioChunk | AudioDone | SessionDone | InputCancelled | CodecStart | CodecDone
 *   | import("./common.js").ServerError} SpeechMessage
 */

/** @typedef {import("../codec/decoder.js").Codec} Codec */
/** @typedef {import("../codec/decoder.js").CodecDecoder} CodecDecoder */
/** @typedef {import("./player.js").PlayerStats} PlayerStats */

/**
 * @typedef {object} Word
 * @property {HTMLSpanElement} el
 * @property {string} text
 * @property {number | null} start  sample position on the utterance's timeline (null: not timed)
 * @property {number | null} end
 *
 * @typedef {object} Sentence
 * @property {number} index
 * @property {number} offset  the utterance's samples before it
 * @property {Word[]} words
 * @property {boolean} timed  its word times have come
 * @property {HTMLParagraphElement} el
 * @property {number} rate  the rate the server states for its audio
 *
 * @typedef {"stream" | "codec" | "file"} Delivery
 *
 * @typedef {object} Utterance
 * @property {number} index  the server's utterance_index
 * @property {string} text
 * @property {Delivery} mode
 * @property {string | undefined} format  the files' format (file delivery)
 * @property {string} voice
 * @property {number} speed
 * @property {string} delivery  in words, for the history
 * @property {number} startedAt  wall clock (the download's name)
 * @property {number} sentAt
 * @property {number | null} firstAudioAt
 * @property {number | null} firstSoundAt
 * @property {number | null} serverDoneAt
 * @property {boolean} cutShort  cancelled or dropped while the server was still making it
 * @property {Int16Array[]} samples  at the page's rate, for the WAV download
 * @property {number} pushed  samples handed to the player (the page's rate)
 * @property {Sentence[]} sentences
 * @property {Sentence | null} current  the sentence whose audio is arriving
 * @property {Promise<void>} pendingFile  decoded files are queued in order
 * @property {CodecDecoder | null} decoder  codec delivery: the open sentence's decoder
 * @property {{ sentence: number, word: number }} nextWord  the next word to light
 * @property {number} lit  words lit so far
 */

const PAGE = /** @type {SpeechPageData} */ (pageData("speech-page"));
const RATE = PAGE.sample_rate; // the page's timeline: the rate the server states for its audio
const MAX_TEXT_PIECE = 16000; // characters per input.text: JSON escaping stays far below the 128 KiB limit
const LIVE_DEBOUNCE_MS = 300;
const HISTORY_MAX = 20; // kept utterances (their audio stays in memory until cleared)

const ui = {
  form: byId("speech-form", HTMLFormElement),
  text: byId("text", HTMLTextAreaElement),
  live: byId("live", HTMLInputElement),
  voice: byId("voice", HTMLSelectElement),
  mode: byId("mode", HTMLSelectElement),
  format: byId("format", HTMLSelectElement),
  speed: byId("speed", HTMLInputElement),
  speedOut: byId("speed-out", HTMLOutputElement),
  timestamps: byId("timestamps", HTMLInputElement),
  modeHint: byId("mode-hint", HTMLElement),
  speak: byId("speak", HTMLButtonElement),
  cancel: byId("cancel", HTMLButtonElement),
  history: byId("history", HTMLOListElement),
  historyEmpty: byId("history-empty", HTMLElement),
  clearHistory: byId("clear-history", HTMLButtonElement),
  conn: byId("conn", HTMLElement),
  state: byId("state", HTMLElement),
  error: byId("error", HTMLElement),
  transcript: byId("transcript", HTMLElement),
  ttfa: byId("ttfa", HTMLElement),
  ttfs: byId("ttfs", HTMLElement),
  rtf: byId("rtf", HTMLElement),
  duration: byId("duration", HTMLElement),
  received: byId("received", HTMLElement),
  played: byId("played", HTMLElement),
  underruns: byId("underruns", HTMLElement),
  rate: byId("rate", HTMLElement),
};

/**
 * The utterance's phase. `idle`: nothing spoken yet; `starting`: Speak pressed, the player, codec
 * and session being readied; `speaking`: sent, the server is making it; `finishing`: the server is
 * done, its last files decode; `playing`: all of it is in the player; `done`: played out (or nothing
 * to say); `cancelled`: stopped by the person; `dropped`: the connection dropped while speaking,
 * what arrived plays.
 * @typedef {"idle" | "starting" | "speaking" | "finishing" | "playing" | "done" | "cancelled" | "dropped"} Phase
 */

/** @type {Readonly<Record<Phase, readonly Phase[]>>} */
const PHASE_MOVES = {
  idle: ["starting"],
  starting: ["speaking", "idle"], // idle: the player or the socket could not be readied
  speaking: ["finishing", "cancelled", "dropped"],
  finishing: ["playing", "done", "cancelled"],
  playing: ["done", "cancelled", "starting"],
  done: ["starting"],
  cancelled: ["starting"],
  dropped: ["done", "cancelled", "starting"],
};

/**
 * Speak and Cancel follow the phase.
 * @param {Phase} phase
 */
function showPhase(phase) {
  ui.speak.disabled = phase === "starting" || phase === "speaking" || phase === "finishing";
  ui.cancel.disabled = !(phase === "speaking" || phase === "finishing" || phase === "playing" || phase === "dropped");
}

const page = {
  phase: new Machine("speech page", /** @type {Phase} */ ("idle"), PHASE_MOVES, showPhase),
  /** @type {PcmPlayer | null} */
  player: null,
  /** @type {{ codec: Codec, parsePacket: typeof import("../codec/decoder.js").parsePacket } | null} loaded on first use of codec delivery */
  codec: null,
  /** What the open socket was told and has answered (counted per socket). */
  socket: {
    /** @type {string | null} the session.config in force (canonical JSON) */
    config: null,
    nextIndex: 0, // utterance_index the server gives our next input.done
    doneIndex: -1, // the last utterance_index the server finished (session.done)
  },
  /** "Send as I type". */
  live: {
    sent: "", // text already sent with input.text and not yet flushed
    base: "", // the start of the text box that was already spoken (flushed)
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    timer: undefined,
  },
  /** @type {Utterance | null} the utterance being spoken or played (or the last one) */
  utterance: null,
};

/** @type {Connection<SpeechMessage>} */
const connection = new Connection("/v1/audio/speech/stream", {
  onOpen() {
    page.socket.nextIndex = 0;
    page.socket.doneIndex = -1;
    page.live.sent = ""; // a new socket starts with an empty buffer
    const config = configJson();
    connection.send(JSON.parse(config));
    page.socket.config = config;
  },
  onMessage,
  onStatus: (state, text) => showConnection(ui.conn, state, text),
  onDrop({ opened, unexplained }) {
    const u = page.utterance;
    if (!opened || !u || !page.phase.is("speaking")) return;
    page.phase.move("dropped");
    u.cutShort = true;
    const next = unexplained ? "reconnecting" : "press Speak to reconnect";
    setState("error", `The connection dropped while speaking (${next}); what arrived still plays.`);
    page.player?.end();
    keep(u);
  },
});

// -- options ----------------------------------------------------------------------------------------

/** @param {string} mode */
function modeHint(mode) {
  if (mode === "stream") {
    return `Streamed 16-bit PCM at ${RATE / 1000} kHz, played as it arrives. Speed is fixed at 1× when streaming.`;
  }
  if (mode === "codec") {
    return "The server sends codec tokens (about 24× fewer bytes than PCM); this page turns them into audio itself. Words do not light up in this mode.";
  }
  return `Each sentence arrives as one ${ui.format.value} file once it is made; words do not light up in this mode.`;
}

function syncOptions() {
  const mode = ui.mode.value;
  ui.format.disabled = mode !== "file";
  ui.speed.disabled = mode === "stream"; // the protocol streams PCM at 1× only
  if (mode === "stream") ui.speed.value = "1";
  ui.timestamps.disabled = mode !== "stream";
  ui.speedOut.textContent = `${Number(ui.speed.value).toFixed(2)}×`;
  ui.modeHint.textContent = modeHint(mode);
}

/** @returns {Delivery} */
function delivery() {
  const mode = ui.mode.value;
  return mode === "stream" || mode === "codec" ? mode : "file";
}

/** The session.config for the current options, as canonical JSON (equal text: same config). */
function configJson() {
  const mode = delivery();
  // A paragraph (and a file) per sentence. Typing live, the text must wait for Speak, and with
  // "sentence" the server would speak each sentence as soon as it is typed: so "none" there.
  const split = ui.live.checked ? "none" : "sentence";
  const config = { type: "session.config", voice: ui.voice.value, split_granularity: split };
  if (mode === "stream") {
    Object.assign(config, { response_format: "pcm", stream_audio: true, word_timestamps: ui.timestamps.checked });
  } else if (mode === "codec") {
    Object.assign(config, { output_mode: "codec_tokens", speed: Number(ui.speed.value) });
  } else {
    Object.assign(config, { response_format: ui.format.value, speed: Number(ui.speed.value) });
  }
  return JSON.stringify(config);
}

// -- sending ----------------------------------------------------------------------------------------

async function ensurePlayer() {
  if (!page.player) {
    page.player = await PcmPlayer.create({ sourceRate: RATE, onStats });
    ui.rate.textContent = `${page.player.contextRate} Hz (stream ${RATE} Hz)`;
  }
  await page.player.resume();
  return page.player;
}

/** Open the socket if needed and make sure the options on screen are the session's config. */
async function ensureSession() {
  await connection.open();
  const wanted = configJson();
  if (wanted === page.socket.config) return;
  if (page.live.sent) {
    connection.send({ type: "input.cancel" }); // a config can't change while text is buffered
    page.live.sent = "";
  }
  connection.send(JSON.parse(wanted));
  page.socket.config = wanted;
}

/** @param {string} text */
function sendText(text) {
  for (let i = 0; i < text.length; i += MAX_TEXT_PIECE) {
    connection.send({ type: "input.text", text: text.slice(i, i + MAX_TEXT_PIECE) });
  }
}

/**
 * Bring the server's buffer in line with the text box: append what's new, or start over after an edit.
 * @param {string} text
 */
function syncBufferedText(text) {
  if (text.startsWith(page.live.sent)) {
    sendText(text.slice(page.live.sent.length));
  } else {
    connection.send({ type: "input.cancel" });
    sendText(text);
  }
  page.live.sent = text;
}

/** The server is still working on an utterance (a cancelled one too, until its session.done). */
function serverBusy() {
  return page.socket.nextIndex - 1 > page.socket.doneIndex;
}

/**
 * The part of the text box not spoken yet: what follows the spoken start, or all of it after an edit.
 * @param {string} text
 */
function unspoken(text) {
  if (!text.startsWith(page.live.base)) page.live.base = "";
  return text.slice(page.live.base.length);
}

async function liveSync() {
  page.live.timer = undefined;
  if (!ui.live.checked || serverBusy()) return; // a cancel now would stop the utterance in flight
  try {
    await ensureSession();
    if (serverBusy()) return; // Speak flushed while the socket opened
    syncBufferedText(unspoken(ui.text.value));
  } catch (err) {
    showError(ui.error, errorText(err));
  }
}

async function speak() {
  clearError(ui.error);
  const text = ui.text.value;
  if (!text.trim()) {
    showError(ui.error, "There is nothing to speak: type some text first.");
    ui.text.focus();
    return;
  }
  if (text.length > PAGE.max_text_chars) {
    showError(ui.error, `The text is ${text.length} characters long; this server speaks at most ${PAGE.max_text_chars} at once.`);
    return;
  }
  if (page.phase.is("starting", "speaking", "finishing")) return; // one utterance at a time
  page.phase.move("starting");
  setState("starting", "Starting…"); // at once: the click is seen before the player and session are ready
  clearTimeout(page.live.timer);
  page.live.timer = undefined;
  let player;
  try {
    player = await ensurePlayer();
    if (delivery() === "codec" && !page.codec) {
      const module = await import("../codec/decoder.js");
      page.codec = { codec: await module.loadCodec(), parsePacket: module.parsePacket };
    }
    await ensureSession();
  } catch (err) {
    page.phase.move("idle");
    page.player?.stop();
    setState("error", "Not speaking: the message above says why.");
    showError(ui.error, errorText(err));
    return;
  }
  player.stop();
  player.reset();
  // Typing live, Speak says what was typed since the last Speak; with nothing new, the whole text again.
  const fresh = ui.live.checked ? unspoken(text) : "";
  const said = fresh.trim() ? fresh : text;
  const u = startUtterance(page.socket.nextIndex, said.trim());
  syncBufferedText(said);
  connection.send({ type: "input.done" });
  page.socket.nextIndex += 1;
  page.live.sent = "";
  page.live.base = text;
  u.sentAt = nowMs();
}

function cancel() {
  const u = page.utterance;
  if (!u || !page.phase.is("speaking", "finishing", "playing", "dropped")) return;
  const making = page.phase.is("speaking", "finishing"); // not in the history yet
  if (page.phase.is("speaking")) {
    if (connection.isOpen) connection.send({ type: "input.cancel" });
    u.cutShort = true;
  }
  page.phase.move("cancelled");
  page.player?.stop();
  setState("cancelled", "Cancelled: playback stopped.");
  if (making) keep(u);
}

// -- the utterance ----------------------------------------------------------------------------------

/**
 * A new utterance, now being spoken.
 * @param {number} index
 * @param {string} text
 */
function startUtterance(index, text) {
  const config = JSON.parse(configJson());
  const mode = delivery();
  /** @type {Utterance} */
  const u = {
    index,
    text,
    mode,
    format: config.response_format,
    voice: config.voice,
    speed: config.speed ?? 1,
    delivery: mode === "stream" ? "streamed PCM" : mode === "codec" ? "codec tokens" : `${config.response_format} files`,
    startedAt: Date.now(),
    sentAt: 0,
    firstAudioAt: null,
    firstSoundAt: null,
    serverDoneAt: null,
    cutShort: false,
    samples: [],
    pushed: 0,
    sentences: [],
    current: null,
    pendingFile: Promise.resolve(),
    decoder: null,
    nextWord: { sentence: 0, word: 0 },
    lit: 0,
  };
  page.utterance = u;
  ui.transcript.replaceChildren();
  for (const el of [ui.ttfa, ui.ttfs, ui.rtf, ui.duration]) el.textContent = "–";
  page.phase.move("speaking");
  setState("speaking", "Speaking…");
  return u;
}

/**
 * The utterance being made, when `msg` belongs to it (a cancelled one may still be finishing).
 * @param {{ utterance_index: number }} msg
 */
function making(msg) {
  const u = page.utterance;
  return u && page.phase.is("speaking") && msg.utterance_index === u.index ? u : null;
}

// -- history: what this page spoke, to play again or download ---------------------------------------

/**
 * A history entry for an utterance with audio: its text, voice and delivery, an audio player and a download.
 * @param {Utterance} u
 */
function keep(u) {
  if (!u.samples.length) return;
  const url = URL.createObjectURL(wavBlob(u.samples, RATE));
  const item = document.createElement("li");
  item.className = "history-item";
  item.dataset.url = url;
  const said = document.createElement("p");
  said.className = "said";
  said.textContent = u.text;
  said.title = u.text;
  const meta = document.createElement("p");
  meta.className = "meta";
  const seconds = (u.pushed / RATE).toFixed(1);
  const how = u.cutShort ? " · cut short" : "";
  meta.textContent = `${u.voice} · ${u.delivery} · ${seconds} s${u.speed !== 1 ? ` · ${u.speed.toFixed(2)}×` : ""}${how}`;
  const controls = document.createElement("div");
  controls.className = "controls";
  const audio = document.createElement("audio");
  audio.controls = true;
  audio.preload = "metadata";
  audio.src = url;
  audio.setAttribute("aria-label", `Play: ${u.text.slice(0, 60)}`);
  const download = document.createElement("a");
  download.className = "button small download";
  download.href = url;
  download.download = `speech-${new Date(u.startedAt).toISOString().slice(0, 19).replace(/[:T]/g, "-")}.wav`;
  download.textContent = "Download WAV";
  controls.append(audio, download);
  item.append(said, meta, controls);
  ui.history.prepend(item);
  while (ui.history.lastElementChild && ui.history.children.length > HISTORY_MAX) dropItem(ui.history.lastElementChild);
  syncHistory();
}

/** @param {Element} item */
function dropItem(item) {
  if (item instanceof HTMLElement && item.dataset.url) URL.revokeObjectURL(item.dataset.url);
  item.remove();
}

function clearHistory() {
  for (const item of [...ui.history.children]) dropItem(item);
  syncHistory();
  ui.text.focus();
}

function syncHistory() {
  const empty = ui.history.children.length === 0;
  ui.historyEmpty.hidden = !empty;
  ui.clearHistory.disabled = empty;
}

/**
 * A sentence starts: its words on screen, its audio at the rate the server states.
 * @param {Utterance} u
 * @param {AudioStart | CodecStart} msg
 */
function addSentence(u, msg) {
  const p = document.createElement("p");
  p.className = "sentence";
  p.dataset.sentence = String(msg.sentence_index);
  /** @type {Word[]} */
  const words = [];
  msg.sentence_text.split(/(\s+)/).forEach((part) => {
    if (!part) return;
    if (/^\s+$/.test(part)) {
      p.append(part);
      return;
    }
    const span = document.createElement("span");
    span.className = "word";
    span.textContent = part;
    p.append(span);
    words.push({ el: span, text: part, start: null, end: null });
  });
  ui.transcript.append(p);
  const rate = msg.sample_rate ?? RATE; // a file says its own rate; raw PCM files are at the page's
  const sentence = { index: msg.sentence_index, offset: u.pushed, words, timed: false, el: p, rate };
  u.sentences.push(sentence);
  u.current = sentence;
}

/**
 * Audio for the utterance: 16-bit samples from the wire, or floats from the codec decoder, at
 * `rate`; kept and played at the page's rate (its timeline for the words and the download).
 * @param {Utterance} u
 * @param {Int16Array | Float32Array} samples
 * @param {number} rate
 */
function addAudio(u, samples, rate) {
  if (!samples.length || !page.player) return;
  if (u.firstAudioAt === null) {
    u.firstAudioAt = nowMs();
    showMs(ui.ttfa, u.firstAudioAt - u.sentAt);
  }
  let floats = samples instanceof Float32Array ? samples : int16ToFloat32(samples);
  if (rate !== RATE) floats = resampleLinear(floats, rate, RATE);
  u.samples.push(samples instanceof Int16Array && rate === RATE ? samples.slice() : float32ToInt16(floats));
  u.pushed += floats.length;
  page.player.push(floats, RATE);
}

/**
 * codec_tokens mode: one packet of codec rows, decoded here into samples.
 * @param {Utterance} u
 * @param {ArrayBuffer} buffer
 */
function addCodecPacket(u, buffer) {
  const codec = page.codec;
  if (!codec || !u.current) return;
  const packet = codec.parsePacket(buffer, codec.codec.codebooks);
  if (packet.reset || !u.decoder) u.decoder = codec.codec.decoder();
  addAudio(u, u.decoder.push(packet.codes), u.current.rate);
  if (packet.eos) finishCodecSentence(u);
}

/** @param {Utterance} u */
function finishCodecSentence(u) {
  if (!u.decoder) return;
  addAudio(u, u.decoder.flush(), u.current?.rate ?? RATE);
  u.decoder = null;
}

/**
 * Word times (ms from the sentence's start) become sample positions on the utterance's timeline.
 * @param {Sentence} sentence
 * @param {WordTime[]} timestamps
 */
function addTimestamps(sentence, timestamps) {
  /** @param {number} ms */
  const toSamples = (ms) => sentence.offset + Math.round((ms * RATE) / 1000);
  let w = 0;
  for (const stamp of timestamps) {
    // Words come back as sent, one per whitespace-separated word; skip any that don't line up.
    while (w < sentence.words.length && sentence.words[w].text !== stamp.word) w++;
    if (w >= sentence.words.length) break;
    sentence.words[w].start = toSamples(stamp.start_ms);
    sentence.words[w].end = toSamples(stamp.end_ms);
    w++;
  }
  sentence.timed = true;
  sentence.el.classList.add("timed");
  if (page.player) highlight(page.player.stats.played);
}

/**
 * A whole file per sentence: decode it off the network thread, then queue it in order.
 * @param {Utterance} u
 * @param {ArrayBuffer} buffer
 */
function addFile(u, buffer) {
  const player = page.player;
  if (!player || !u.current) return;
  const rate = u.current.rate;
  u.pendingFile = u.pendingFile.then(async () => {
    if (u.format === "pcm") {
      const pcm = pcm16FromBytes(new Uint8Array(buffer));
      if (u === page.utterance && page.phase.is("speaking", "finishing")) addAudio(u, pcm, rate);
      return;
    }
    const decoded = await player.context.decodeAudioData(buffer); // at the context's rate
    if (u === page.utterance && page.phase.is("speaking", "finishing")) {
      addAudio(u, decoded.getChannelData(0).slice(), decoded.sampleRate); // a copy: the player takes its buffer
    }
  });
  u.pendingFile.catch((err) => showError(ui.error, `Could not decode the audio: ${errorText(err)}`));
}

/**
 * The server finished the utterance: once its last file is decoded, it plays out.
 * @param {Utterance} u
 */
function serverDone(u) {
  page.phase.move("finishing");
  u.serverDoneAt = nowMs();
  u.pendingFile.then(() => {
    if (u !== page.utterance || !page.phase.is("finishing") || !page.player) return;
    const seconds = u.pushed / RATE;
    const sentences = u.sentences.filter((s) => s.words.length).length;
    ui.duration.textContent = `${seconds.toFixed(2)} s`;
    ui.duration.title = `${sentences} sentence${sentences === 1 ? "" : "s"}`;
    if (seconds > 0 && u.serverDoneAt !== null) {
      ui.rtf.textContent = ((u.serverDoneAt - u.sentAt) / 1000 / seconds).toFixed(3);
    }
    page.player.end();
    if (u.pushed === 0) {
      page.phase.move("done");
      setState("done", "Nothing to say: the text has no words.");
    } else {
      page.phase.move("playing");
      setState("playing", "Playing…");
    }
    keep(u);
    if (ui.live.checked && ui.text.value) scheduleLiveSync();
  });
}

// -- messages ---------------------------------------------------------------------------------------

/** @param {SpeechMessage | ArrayBuffer} msg */
function onMessage(msg) {
  if (msg instanceof ArrayBuffer) {
    // Binary frames belong to the open sentence of the utterance being made.
    const u = page.utterance;
    if (!u || !u.current || !page.phase.is("speaking")) return;
    if (u.mode === "codec") addCodecPacket(u, msg);
    else if (u.mode === "stream") addAudio(u, pcm16FromBytes(new Uint8Array(msg)), u.current.rate);
    else addFile(u, msg);
    return;
  }
  switch (msg.type) {
    case "audio.start": {
      const u = making(msg);
      if (u) addSentence(u, msg);
      break;
    }
    case "audio.chunk": {
      const u = making(msg);
      if (!u || !u.current) break;
      if (msg.audio_b64) addAudio(u, pcm16FromBytes(base64ToBytes(msg.audio_b64)), msg.sample_rate);
      if (Array.isArray(msg.timestamps)) addTimestamps(u.current, msg.timestamps);
      break;
    }
    case "audio.done": {
      const u = making(msg);
      if (!u) break;
      u.current = null;
      if (msg.error) setState("error", "A sentence failed; see the message above.");
      break;
    }
    case "session.done": {
      page.socket.doneIndex = msg.utterance_index;
      const u = making(msg);
      if (u) serverDone(u);
      break;
    }
    case "input.cancelled":
      break;
    case "codec.start": {
      const u = making(msg);
      if (!u) break;
      if (!page.codec?.codec.accepts(msg)) {
        showError(ui.error, `This page cannot decode the server's codec (${msg.decoder_id}); choose another delivery.`);
        cancel();
        break;
      }
      u.decoder = page.codec.codec.decoder();
      addSentence(u, msg);
      break;
    }
    case "codec.done": {
      const u = making(msg);
      if (!u) break;
      finishCodecSentence(u);
      u.current = null;
      if (msg.error) setState("error", "A sentence failed; see the message above.");
      break;
    }
    case "error":
      // timeout: the server ends quiet sessions; the page opens a new one when it next needs it.
      if (msg.kind === "timeout") break;
      showError(ui.error, describeServerError(msg));
      break;
    default:
      break;
  }
}

// -- playback position: counters and word highlighting ---------------------------------------------

/** @param {PlayerStats} stats */
function onStats(stats) {
  ui.received.textContent = stats.received.toLocaleString("en");
  ui.received.dataset.value = String(stats.received);
  ui.played.textContent = stats.played.toLocaleString("en");
  ui.played.dataset.value = String(stats.played);
  ui.underruns.textContent = String(stats.underruns);
  ui.underruns.dataset.value = String(stats.underruns);
  const u = page.utterance;
  if (!u || !page.phase.is("speaking", "finishing", "playing", "dropped")) return;
  if (stats.reason === "start" && u.firstSoundAt === null) {
    u.firstSoundAt = nowMs();
    showMs(ui.ttfs, u.firstSoundAt - u.sentAt);
  }
  highlight(stats.played);
  if (stats.reason === "drained" && page.phase.is("playing", "dropped") && stats.played >= u.pushed) {
    highlight(Infinity);
    const dropped = page.phase.is("dropped"); // its words stay: "the connection dropped"
    page.phase.move("done");
    if (!dropped) setState("done", `Done: ${(u.pushed / RATE).toFixed(2)} s of speech.`);
  }
}

/**
 * Light the words heard by now (`played` samples, less what is still on its way to the ear).
 * @param {number} played
 */
function highlight(played) {
  const u = page.utterance;
  if (!u || !page.player) return;
  const heard = played === Infinity ? Infinity : played - page.player.latencySamples;
  const next = u.nextWord;
  while (next.sentence < u.sentences.length) {
    const sentence = u.sentences[next.sentence];
    if (!sentence.timed) return; // its times are not here yet
    if (next.word >= sentence.words.length) {
      next.sentence += 1;
      next.word = 0;
      continue;
    }
    const word = sentence.words[next.word];
    if (word.start === null) {
      next.word += 1; // a word the server did not time: skip it
      continue;
    }
    if (word.start > heard) break;
    ui.transcript.querySelector(".word.current")?.classList.remove("current");
    word.el.classList.add("spoken", "current");
    word.el.dataset.order = String(u.lit++);
    next.word += 1;
  }
  if (heard === Infinity) ui.transcript.querySelector(".word.current")?.classList.remove("current");
}

// -- page state -------------------------------------------------------------------------------------

/** @param {string} state @param {string} text */
function setState(state, text) {
  setStateText(ui.state, state, text);
}

function scheduleLiveSync() {
  clearTimeout(page.live.timer);
  page.live.timer = setTimeout(liveSync, LIVE_DEBOUNCE_MS);
}

ui.form.addEventListener("submit", (event) => {
  event.preventDefault();
  speak();
});
ui.cancel.addEventListener("click", cancel);
ui.clearHistory.addEventListener("click", clearHistory);
ui.text.addEventListener("input", () => {
  if (ui.live.checked) scheduleLiveSync();
});
ui.text.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    speak();
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && !ui.cancel.disabled) cancel();
});
ui.live.addEventListener("change", () => {
  if (ui.live.checked) scheduleLiveSync();
});
for (const el of [ui.mode, ui.format, ui.speed, ui.voice, ui.timestamps]) el.addEventListener("input", syncOptions);
syncOptions();
showPhase(page.phase.state);
