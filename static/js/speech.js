// The speech page: text in, streamed speech out over /v1/audio/speech/stream, words lit up in time.
import {
  Connection,
  base64ToBytes,
  clearError,
  describeServerError,
  float32ToInt16,
  int16ToFloat32,
  nowMs,
  pcm16FromBytes,
  setStateText,
  showConnection,
  showError,
  showMs,
  wavBlob,
} from "./common.js";
import { PcmPlayer, resampleLinear } from "./player.js";

const PAGE = JSON.parse(document.getElementById("speech-page").textContent);
const RATE = PAGE.sample_rate;
const MAX_TEXT_PIECE = 16000; // characters per input.text: JSON escaping stays far below the 128 KiB limit
const LIVE_DEBOUNCE_MS = 300;
const HISTORY_MAX = 20; // kept utterances (their audio stays in memory until cleared)

const $ = (id) => document.getElementById(id);
const ui = {
  form: $("speech-form"),
  text: $("text"),
  live: $("live"),
  voice: $("voice"),
  mode: $("mode"),
  format: $("format"),
  speed: $("speed"),
  speedOut: $("speed-out"),
  timestamps: $("timestamps"),
  modeHint: $("mode-hint"),
  speak: $("speak"),
  cancel: $("cancel"),
  history: $("history"),
  historyEmpty: $("history-empty"),
  clearHistory: $("clear-history"),
  conn: $("conn"),
  state: $("state"),
  error: $("error"),
  transcript: $("transcript"),
  ttfa: $("ttfa"),
  ttfs: $("ttfs"),
  rtf: $("rtf"),
  duration: $("duration"),
  received: $("received"),
  played: $("played"),
  underruns: $("underruns"),
  rate: $("rate"),
};

let player = null;
let sentConfig = null; // the session.config in force on the open socket (JSON text)
let liveSent = ""; // text already sent with input.text and not yet flushed
let liveBase = ""; // the start of the text box that was already spoken (flushed)
let liveTimer = null;
let utterance = null; // the utterance being spoken or played
let nextIndex = 0; // utterance_index the server gives our next input.done (counted per socket)
let doneIndex = -1; // the last utterance_index the server finished (session.done)
let highlightOrder = 0;
let codec = null; // the in-browser codec decoder (static/codec/), loaded on first use of codec mode
let parsePacket = null;

const connection = new Connection("/v1/audio/speech/stream", {
  onOpen() {
    nextIndex = 0;
    doneIndex = -1;
    liveSent = ""; // a new socket starts with an empty buffer
    connection.send(JSON.parse(configJson()));
    sentConfig = configJson();
  },
  onMessage,
  onStatus: (state, text) => showConnection(ui.conn, state, text),
  onDrop({ opened, unexplained }) {
    if (opened && utterance && !utterance.serverDone && !utterance.stopped) {
      utterance.serverDone = true;
      utterance.dropped = true;
      const next = unexplained ? "reconnecting" : "press Speak to reconnect";
      setState("error", `The connection dropped while speaking (${next}); what arrived still plays.`);
      player?.end();
      finishUtterance();
    }
  },
});

// -- options ----------------------------------------------------------------------------------------

function modeHint(mode) {
  if (mode === "stream") {
    return "Streamed 16-bit PCM at 24 kHz, played as it arrives. Speed is fixed at 1× when streaming.";
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

/** The session.config for the current options, as canonical JSON (equal text: same config). */
function configJson() {
  const mode = ui.mode.value;
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
  if (!player) {
    player = await PcmPlayer.create({ sourceRate: RATE, onStats });
    ui.rate.textContent = `${player.contextRate} Hz (stream ${RATE} Hz)`;
  }
  await player.resume();
}

/** Open the socket if needed and make sure the options on screen are the session's config. */
async function ensureSession() {
  await connection.open();
  const wanted = configJson();
  if (wanted === sentConfig) return;
  if (liveSent) {
    connection.send({ type: "input.cancel" }); // a config can't change while text is buffered
    liveSent = "";
  }
  connection.send(JSON.parse(wanted));
  sentConfig = wanted;
}

function sendText(text) {
  for (let i = 0; i < text.length; i += MAX_TEXT_PIECE) {
    connection.send({ type: "input.text", text: text.slice(i, i + MAX_TEXT_PIECE) });
  }
}

/** Bring the server's buffer in line with the text box: append what's new, or start over after an edit. */
function syncBufferedText(text) {
  if (text.startsWith(liveSent)) {
    sendText(text.slice(liveSent.length));
  } else {
    connection.send({ type: "input.cancel" });
    sendText(text);
  }
  liveSent = text;
}

/** The server is still working on an utterance (a cancelled one too, until its session.done). */
function serverBusy() {
  return nextIndex - 1 > doneIndex;
}

function speaking() {
  return utterance !== null && !utterance.serverDone && !utterance.cancelled;
}

/** The part of the text box not spoken yet: what follows the spoken start, or all of it after an edit. */
function unspoken(text) {
  if (!text.startsWith(liveBase)) liveBase = "";
  return text.slice(liveBase.length);
}

async function liveSync() {
  liveTimer = null;
  if (!ui.live.checked || serverBusy()) return; // a cancel now would stop the utterance in flight
  try {
    await ensureSession();
    if (serverBusy()) return; // Speak flushed while the socket opened
    syncBufferedText(unspoken(ui.text.value));
  } catch (err) {
    showError(ui.error, err.message);
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
  if (speaking()) return;
  clearTimeout(liveTimer);
  liveTimer = null;
  ui.speak.disabled = true;
  try {
    await ensurePlayer();
    if (ui.mode.value === "codec" && !codec) {
      const module = await import("../codec/decoder.js");
      codec = await module.loadCodec();
      parsePacket = module.parsePacket;
    }
    await ensureSession();
  } catch (err) {
    ui.speak.disabled = false;
    showError(ui.error, err.message);
    return;
  }
  player.stop();
  player.reset();
  // Typing live, Speak says what was typed since the last Speak; with nothing new, the whole text again.
  const fresh = ui.live.checked ? unspoken(text) : "";
  const said = fresh.trim() ? fresh : text;
  startUtterance(nextIndex, said.trim());
  syncBufferedText(said);
  connection.send({ type: "input.done" });
  nextIndex += 1;
  liveSent = "";
  liveBase = text;
  utterance.sentAt = nowMs();
}

function cancel() {
  if (!utterance) return;
  if (speaking() && connection.isOpen) {
    connection.send({ type: "input.cancel" });
    utterance.cancelled = true;
  }
  utterance.stopped = true;
  player?.stop();
  setState("cancelled", "Cancelled: playback stopped.");
  finishUtterance();
}

// -- the utterance ----------------------------------------------------------------------------------

function startUtterance(index, text) {
  const config = JSON.parse(configJson());
  const mode = ui.mode.value;
  utterance = {
    index,
    text,
    voice: config.voice,
    speed: config.speed ?? 1,
    delivery: mode === "stream" ? "streamed PCM" : mode === "codec" ? "codec tokens" : `${config.response_format} files`,
    startedAt: Date.now(),
    kept: false,
    sentAt: 0,
    firstAudioAt: null,
    firstSoundAt: null,
    serverDoneAt: null,
    serverDone: false,
    cancelled: false,
    stopped: false,
    samples: [], // Int16Array chunks, for the WAV download
    pushed: 0, // samples handed to the player
    sentences: [],
    current: null,
    pendingFile: Promise.resolve(), // decoded files are queued in order
    nextWord: { sentence: 0, word: 0 },
  };
  highlightOrder = 0;
  ui.transcript.replaceChildren();
  ui.cancel.disabled = false;
  for (const el of [ui.ttfa, ui.ttfs, ui.rtf, ui.duration]) el.textContent = "–";
  setState("speaking", "Speaking…");
}

function finishUtterance() {
  ui.speak.disabled = false;
  if (utterance && utterance.samples.length && !utterance.kept) {
    utterance.kept = true;
    keep(utterance);
  }
  if (!utterance || utterance.stopped) ui.cancel.disabled = true;
}

// -- history: what this page spoke, to play again or download ---------------------------------------

/** A history entry for an utterance: its text, voice and delivery, an audio player and a download. */
function keep(u) {
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
  const how = u.cancelled || u.dropped ? " · cut short" : "";
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
  while (ui.history.children.length > HISTORY_MAX) dropItem(ui.history.lastElementChild);
  syncHistory();
}

function dropItem(item) {
  URL.revokeObjectURL(item.dataset.url);
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

function addSentence(msg) {
  const p = document.createElement("p");
  p.className = "sentence";
  p.dataset.sentence = String(msg.sentence_index);
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
  const sentence = { index: msg.sentence_index, offset: utterance.pushed, words, timed: false, el: p };
  utterance.sentences.push(sentence);
  utterance.current = sentence;
}

/** Audio for the open sentence: 16-bit samples from the wire, or floats from the codec decoder. */
function addAudio(samples) {
  if (!samples.length) return;
  if (utterance.firstAudioAt === null) {
    utterance.firstAudioAt = nowMs();
    showMs(ui.ttfa, utterance.firstAudioAt - utterance.sentAt);
  }
  const floats = samples instanceof Float32Array;
  utterance.samples.push(floats ? float32ToInt16(samples) : samples.slice());
  utterance.pushed += samples.length;
  player.push(floats ? samples : int16ToFloat32(samples), RATE);
}

/** codec_tokens mode: one packet of codec rows, decoded here into samples. */
function addCodecPacket(u, buffer) {
  const packet = parsePacket(buffer, codec.codebooks);
  if (packet.reset || !u.decoder) u.decoder = codec.decoder();
  addAudio(u.decoder.push(packet.codes));
  if (packet.eos) finishCodecSentence(u);
}

function finishCodecSentence(u) {
  if (!u.decoder) return;
  addAudio(u.decoder.flush());
  u.decoder = null;
}

/** Word times (ms from the sentence's start) become sample positions on the utterance's timeline. */
function addTimestamps(sentence, timestamps) {
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
  highlight(player.stats.played);
}

/** A whole file per sentence: decode it off the network thread, then queue it in order. */
function addFile(buffer) {
  const u = utterance;
  const format = JSON.parse(sentConfig || "{}").response_format;
  u.pendingFile = u.pendingFile.then(async () => {
    let int16;
    if (format === "pcm") {
      int16 = pcm16FromBytes(new Uint8Array(buffer));
    } else {
      const decoded = await player.context.decodeAudioData(buffer);
      const data = decoded.getChannelData(0);
      // decodeAudioData resamples to the context's rate; the player expects the stream's.
      int16 = float32ToInt16(
        decoded.sampleRate === RATE ? data : resampleLinear(data, decoded.sampleRate, RATE),
      );
    }
    if (u === utterance && !u.stopped) addAudio(int16);
  });
  u.pendingFile.catch((err) => showError(ui.error, `Could not decode the audio: ${err.message}`));
}

// -- messages ---------------------------------------------------------------------------------------

function onMessage(msg) {
  if (typeof msg.utterance_index === "number" && msg.type === "session.done") doneIndex = msg.utterance_index;
  // Only the current utterance's messages count: a cancelled one may still be finishing.
  const u = utterance && !utterance.stopped ? utterance : null;
  if (msg instanceof ArrayBuffer) {
    if (!u || !u.current) return; // binary frames belong to the open sentence
    if (u.codec) addCodecPacket(u, msg);
    else if (JSON.parse(sentConfig || "{}").stream_audio) addAudio(pcm16FromBytes(new Uint8Array(msg)));
    else addFile(msg);
    return;
  }
  const mine = u !== null && msg.utterance_index === u.index;
  switch (msg.type) {
    case "audio.start":
      if (mine) addSentence(msg);
      break;
    case "audio.chunk":
      if (!mine || !u.current) break;
      if (msg.audio_b64) addAudio(pcm16FromBytes(base64ToBytes(msg.audio_b64)));
      if (Array.isArray(msg.timestamps)) addTimestamps(u.current, msg.timestamps);
      break;
    case "audio.done":
      if (!mine) break;
      u.current = null;
      if (msg.error) setState("error", "A sentence failed; see the message above.");
      break;
    case "session.done":
      if (!mine || u.serverDone) break;
      u.serverDone = true;
      u.serverDoneAt = nowMs();
      u.pendingFile.then(() => {
        if (u !== utterance || u.stopped) return;
        const seconds = u.pushed / RATE;
        const sentences = u.sentences.filter((s) => s.words.length).length;
        ui.duration.textContent = `${seconds.toFixed(2)} s`;
        ui.duration.title = `${sentences} sentence${sentences === 1 ? "" : "s"}`;
        if (seconds > 0) ui.rtf.textContent = ((u.serverDoneAt - u.sentAt) / 1000 / seconds).toFixed(3);
        player.end();
        if (u.pushed === 0) {
          setState("done", "Nothing to say: the text has no words.");
          u.stopped = true;
        } else {
          setState("playing", "Playing…");
        }
        finishUtterance();
        if (ui.live.checked && ui.text.value) scheduleLiveSync();
      });
      break;
    case "input.cancelled":
      break;
    case "codec.start":
      if (!mine) break;
      if (!codec.accepts(msg)) {
        showError(ui.error, `This page cannot decode the server's codec (${msg.decoder_id}); choose another delivery.`);
        cancel();
        break;
      }
      u.codec = true;
      u.decoder = codec.decoder();
      addSentence(msg);
      break;
    case "codec.done":
      if (!mine) break;
      finishCodecSentence(u);
      u.current = null;
      if (msg.error) setState("error", "A sentence failed; see the message above.");
      break;
    case "error":
      // The server ends quiet sessions; the page opens a new one when it next needs it.
      if (/^Idle timeout/.test(msg.message)) break;
      showError(ui.error, describeServerError(msg));
      break;
    default:
      break;
  }
}

// -- playback position: counters and word highlighting ---------------------------------------------

function onStats(stats) {
  ui.received.textContent = stats.received.toLocaleString("en");
  ui.received.dataset.value = String(stats.received);
  ui.played.textContent = stats.played.toLocaleString("en");
  ui.played.dataset.value = String(stats.played);
  ui.underruns.textContent = String(stats.underruns);
  ui.underruns.dataset.value = String(stats.underruns);
  const u = utterance;
  if (!u || u.stopped) return;
  if (stats.reason === "start" && u.firstSoundAt === null) {
    u.firstSoundAt = nowMs();
    showMs(ui.ttfs, u.firstSoundAt - u.sentAt);
  }
  highlight(stats.played);
  if (stats.reason === "drained" && u.serverDone && stats.played >= u.pushed) {
    highlight(Infinity);
    u.stopped = true;
    if (!u.dropped) setState("done", `Done: ${(u.pushed / RATE).toFixed(2)} s of speech.`);
    ui.cancel.disabled = true;
  }
}

function highlight(played) {
  const u = utterance;
  if (!u || !player) return;
  const heard = played === Infinity ? Infinity : played - player.latencySamples;
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
    word.el.dataset.order = String(highlightOrder++);
    next.word += 1;
  }
  if (heard === Infinity) ui.transcript.querySelector(".word.current")?.classList.remove("current");
}

// -- page state -------------------------------------------------------------------------------------

function setState(state, text) {
  setStateText(ui.state, state, text);
}

function scheduleLiveSync() {
  clearTimeout(liveTimer);
  liveTimer = setTimeout(liveSync, LIVE_DEBOUNCE_MS);
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
