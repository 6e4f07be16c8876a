// @ts-check
// The video page: camera frames and microphone audio up, streamed answer text and speech down,
// over /v1/video/chat/stream. Hands-free (the default where a microphone is granted) streams the
// microphone all the time and lets the server's voice-activity detection find the turns
// (session.config's turn_detection); hold-to-talk sends only what is said while the button is held.
//
// Everything the page knows lives in one object, `page`: the camera, the Talk button and each
// turn move through named states (CAMERA_MOVES, TALK_MOVES, TURN_MOVES), the open session's facts
// sit in `page.session`. The server's errors are read by their `kind` (and, for a refused frame,
// by the order the server answers in); the answer's audio plays at the rate each WAV states.
import {
  Connection,
  Machine,
  base64ToBytes,
  byId,
  bytesToBase64,
  clearError,
  describeServerError,
  errorText,
  formatMs,
  int16ToFloat32,
  nowMs,
  parseWav,
  setStateText,
  showConnection,
  showError,
  showMs,
} from "./common.js";
import { PcmPlayer } from "./player.js";

/** @typedef {import("./common.js").ServerError} ServerError */
/** @typedef {import("./player.js").PlayerStats} PlayerStats */

// -- the wire: what /v1/video/chat/stream sends (docs/protocols/video-stream.md) ------------------

/**
 * @typedef {{ type: "video.frame.ack", frame_id: string, accepted: boolean, reason?: string,
 *   dropped_frame_id?: string, capture_ts_ms?: number | null }} FrameAck
 * @typedef {{ type: "input.transcript", text?: unknown }} InputTranscript
 * @typedef {{ type: "response.text.delta", delta: string }} TextDelta
 * @typedef {{ type: "response.text.done", text: string }} TextDone
 * @typedef {{ type: "response.audio.delta", data: string }} AudioDelta  a base64 WAV file
 * @typedef {{ type: "video.frames.consumed" | "input_audio_buffer.speech_started"
 *   | "input_audio_buffer.speech_stopped" | "response.start" | "response.audio.done" | "pong"
 *   | "session.done" }} Bare  the messages the page reads by their type alone
 * @typedef {FrameAck | InputTranscript | TextDelta | TextDone | AudioDelta | Bare | ServerError} VideoMessage
 */

const MAX_BUFFERED_BYTES = 2 * 1024 * 1024; // skip a frame rather than queue behind a slow link
const PING_EVERY_MS = 15000;
// Frames kept in the page and sent again when a new session starts (a changed "Speak the answer",
// an idle timeout, a reconnect): the server's buffer is per session, and a question needs frames.
const RESEND_FRAMES = 4;
const REOPEN_AFTER_MS = 5000; // the camera is on and the server ended the session: a new one, at most this often
const MIC_WORKLET_URL = new URL("../worklets/mic-capture.js", import.meta.url);
const MIC_CHUNK_MS = 40; // short chunks: the server hears the start of speech (a barge-in) sooner
// A shorter press is a tap, not a question. Its audio never leaves the page: the protocol has no way
// to take audio back, and it would otherwise be prepended to the next spoken question.
const MIN_TALK_MS = 250;
// OpenAI's server_vad defaults: a turn ends after half a second of silence, speech interrupts an answer.
const TURN_DETECTION = {
  type: "server_vad",
  threshold: 0.5,
  prefix_padding_ms: 300,
  silence_duration_ms: 500,
  create_response: true,
  interrupt_response: true,
};

const ui = {
  preview: byId("preview", HTMLVideoElement),
  badge: byId("camera-badge", HTMLElement),
  placeholder: byId("preview-placeholder", HTMLElement),
  start: byId("start", HTMLButtonElement),
  stop: byId("stop", HTMLButtonElement),
  fps: byId("fps", HTMLSelectElement),
  quality: byId("quality", HTMLInputElement),
  qualityOut: byId("quality-out", HTMLOutputElement),
  width: byId("width", HTMLSelectElement),
  sent: byId("sent", HTMLElement),
  accepted: byId("accepted", HTMLElement),
  filtered: byId("filtered", HTMLElement),
  replaced: byId("replaced", HTMLElement),
  talk: byId("talk", HTMLButtonElement),
  talkHint: byId("talk-hint", HTMLElement),
  handsFree: byId("hands-free", HTMLInputElement),
  listening: byId("listening", HTMLElement),
  level: byId("level", HTMLElement),
  askForm: byId("ask-form", HTMLFormElement),
  question: byId("question", HTMLInputElement),
  speakAnswer: byId("speak-answer", HTMLInputElement),
  conversation: byId("conversation", HTMLOListElement),
  conversationEmpty: byId("conversation-empty", HTMLElement),
  state: byId("state", HTMLElement),
  ackLatency: byId("ack-latency", HTMLElement),
  firstText: byId("first-text", HTMLElement),
  firstAudio: byId("first-audio", HTMLElement),
  rtt: byId("rtt", HTMLElement),
  played: byId("played", HTMLElement),
  answerRate: byId("answer-rate", HTMLElement),
  audioState: byId("audio-state", HTMLElement),
  conn: byId("conn", HTMLElement),
  error: byId("error", HTMLElement),
};

// -- the page's state ---------------------------------------------------------------------------

/**
 * The camera (and microphone): `off`; `starting` (Start pressed: the player, the devices);
 * `live` (frames flow, the session is kept open).
 * @typedef {"off" | "starting" | "live"} CameraState
 */
/** @type {Readonly<Record<CameraState, readonly CameraState[]>>} */
const CAMERA_MOVES = { off: ["starting"], starting: ["live", "off"], live: ["off"] };

/**
 * Hold-to-talk: `up`; `held` (the microphone's chunks are the question); `releasing` (let go: the
 * last chunk is on its way, then the question is asked).
 * @typedef {"up" | "held" | "releasing"} TalkState
 */
/** @type {Readonly<Record<TalkState, readonly TalkState[]>>} */
const TALK_MOVES = { up: ["held"], held: ["up", "releasing"], releasing: ["up"] };

/**
 * A turn: `hearing` (hands-free: the server hears speech), `waiting` (asked: the answer has not
 * started), `answering`, then how it ended: `answered`, `failed` or `interrupted`.
 * @typedef {"hearing" | "waiting" | "answering" | "answered" | "failed" | "interrupted"} TurnPhase
 */
/** @type {Readonly<Record<TurnPhase, readonly TurnPhase[]>>} */
const TURN_MOVES = {
  hearing: ["waiting", "failed", "interrupted"],
  waiting: ["answering", "failed", "interrupted"],
  answering: ["answered", "failed", "interrupted"],
  answered: [],
  failed: [],
  interrupted: [],
};

/** @typedef {"idle" | "encoding"} CaptureState  a frame is being drawn and encoded */
/** @type {Readonly<Record<CaptureState, readonly CaptureState[]>>} */
const CAPTURE_MOVES = { idle: ["encoding"], encoding: ["idle"] };

/**
 * A turn of the conversation: its phase, its place on screen and what has come of its answer.
 * @typedef {object} Turn
 * @property {Machine<TurnPhase>} phase
 * @property {HTMLLIElement} el
 * @property {HTMLDivElement} questionEl
 * @property {HTMLParagraphElement} questionText
 * @property {HTMLDivElement} answer
 * @property {HTMLParagraphElement} answerText
 * @property {boolean} handsFree  asked by the server's voice-activity detection
 * @property {number} sentAt
 * @property {number | null} firstText
 * @property {number | null} firstAudio
 * @property {number | null} framesBefore  frames of its session sent (or answered) before it was asked
 * @property {string} text
 * @property {boolean} textDone  response.text.done came (its audio may still come)
 * @property {boolean} audioStarted
 * @property {boolean} failed  an error came for it; the response still closes after it
 * @property {{ samples: Float32Array, rate: number }[]} audio  to play the answer again
 */

/**
 * The open session: what it was configured with, and how many of its frames the server answered.
 * @typedef {object} Session
 * @property {string} config  the session.config sent (JSON text)
 * @property {boolean} speaksAnswers  its modalities include audio
 * @property {boolean} handsFree  it detects turns in the streamed microphone audio
 * @property {number} framesSent
 * @property {number} framesAnswered  by an ack or an error (the server answers every frame, in order)
 * @property {number | null} pingAt
 */

/** @typedef {{ context: AudioContext, node: AudioWorkletNode, source: MediaStreamAudioSourceNode }} Mic */
/** @typedef {{ type: "video.frame", data: string, frame_id: string, pts_ms: number, capture_ts_ms?: number }} Frame */

const page = {
  camera: new Machine("camera", /** @type {CameraState} */ ("off"), CAMERA_MOVES),
  /** @type {MediaStream | null} camera + microphone */
  stream: null,
  /** @type {PcmPlayer | null} */
  player: null,
  /** @type {Mic | null} */
  mic: null,
  timers: {
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    frame: undefined,
    /** @type {ReturnType<typeof setInterval> | undefined} */
    ping: undefined,
  },
  frames: {
    capture: new Machine("frame capture", /** @type {CaptureState} */ ("idle"), CAPTURE_MOVES),
    seq: 0,
    captureStart: 0,
    lastReopen: 0,
    /** @type {Frame[]} the last RESEND_FRAMES frames sent */
    recent: [],
  },
  counts: { sent: 0, accepted: 0, filtered: 0, replaced: 0 },
  /** @type {number[]} the last 20 frame ack latencies */
  ackLatencies: [],
  /** @type {Session | null} */
  session: null,
  talk: new Machine("talk", /** @type {TalkState} */ ("up"), TALK_MOVES),
  held: {
    since: 0, // when Talk went down
    spokenMs: 0, // how long it was held (set on release)
    /** @type {Int16Array[]} chunks of a press not yet MIN_TALK_MS long */
    chunks: [],
  },
  /** @type {Turn | null} the turn whose answer is streaming (or awaited) */
  question: null,
  turns: 0,
  /** @type {{ turn: Turn, button: HTMLButtonElement } | null} the answer being played again */
  replaying: null,
};

/** The session.config the page's options ask for (a change starts a new session). */
function wantedConfig() {
  /** @type {{ type: string, modalities: string[], turn_detection?: typeof TURN_DETECTION }} */
  const config = { type: "session.config", modalities: ui.speakAnswer.checked ? ["text", "audio"] : ["text"] };
  if (handsFreeWanted()) config.turn_detection = TURN_DETECTION;
  return config;
}

function handsFreeWanted() {
  return page.mic !== null && ui.handsFree.checked;
}

/** @type {Connection<VideoMessage>} */
const connection = new Connection("/v1/video/chat/stream", {
  onOpen() {
    const config = wantedConfig();
    page.session = {
      config: JSON.stringify(config),
      speaksAnswers: config.modalities.includes("audio"),
      handsFree: Boolean(config.turn_detection),
      framesSent: 0,
      framesAnswered: 0,
      pingAt: null,
    };
    connection.send(config);
    // A new session starts with an empty frame buffer: give it the latest frames at once.
    for (const frame of page.frames.recent) sendFrame(frame);
    ping();
    showListening();
  },
  onMessage,
  onStatus: (state, text) => {
    showConnection(ui.conn, state, text);
    if (state !== "open") showListening();
  },
  onDrop({ opened }) {
    page.session = null;
    if (opened) endAnswer("The connection dropped during the answer; ask again once it is back.");
  },
});

// -- camera and microphone --------------------------------------------------------------------------

async function start() {
  if (!page.camera.is("off")) return;
  page.camera.move("starting");
  clearError(ui.error);
  ui.start.disabled = true;
  let stream;
  try {
    page.player ??= await PcmPlayer.create({ onStats: onPlayerStats }); // each answer's WAV says its rate
    await page.player.resume();
    stream = await navigator.mediaDevices.getUserMedia({
      video: { width: { ideal: 640 }, height: { ideal: 480 } },
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
  } catch (err) {
    page.camera.move("off");
    ui.start.disabled = false;
    showError(ui.error, mediaErrorText(err));
    return;
  }
  page.camera.move("live");
  page.stream = stream;
  ui.preview.srcObject = stream;
  ui.badge.textContent = "Live";
  ui.badge.dataset.live = "true";
  ui.placeholder.hidden = true;
  ui.stop.disabled = false;
  if (!live(page.question)) setState("idle", "Ready: ask a question");
  await startMicrophone(stream);
  if (page.stream !== stream) return; // Stop came while the microphone started
  page.frames.captureStart = performance.now();
  scheduleFrames();
  connection.open().catch((err) => showError(ui.error, errorText(err)));
  clearInterval(page.timers.ping);
  page.timers.ping = setInterval(ping, PING_EVERY_MS);
}

/** @param {unknown} err */
function mediaErrorText(err) {
  if (!navigator.mediaDevices) {
    return "This page needs a secure address (https://, or http://localhost) to use the camera and microphone.";
  }
  if (err instanceof DOMException && err.name === "NotAllowedError") {
    return "The browser was not allowed to use the camera or microphone.";
  }
  if (err instanceof DOMException && err.name === "NotFoundError") return "No camera or microphone was found.";
  return `Could not start the camera or microphone: ${errorText(err)}`;
}

/** @param {MediaStream} stream */
async function startMicrophone(stream) {
  const tracks = stream.getAudioTracks();
  if (!tracks.length) {
    ui.talk.disabled = true;
    showHandsFree();
    return;
  }
  const context = new AudioContext({ latencyHint: "interactive" });
  await context.audioWorklet.addModule(MIC_WORKLET_URL);
  if (page.stream !== stream) {
    context.close(); // Stop came while the worklet loaded
    return;
  }
  const source = context.createMediaStreamSource(new MediaStream(tracks));
  const node = new AudioWorkletNode(context, "mic-capture", {
    numberOfInputs: 1,
    numberOfOutputs: 0,
    processorOptions: { chunkMs: MIC_CHUNK_MS },
  });
  node.port.onmessage = (event) => onMicChunk(event.data);
  source.connect(node);
  page.mic = { context, node, source };
  showHandsFree();
}

/** Hands-free on: the Talk button rests (the server finds the turns); off: hold Talk to ask. */
function showHandsFree() {
  const on = handsFreeWanted();
  ui.talk.disabled = !page.mic || on;
  ui.talkHint.textContent = on
    ? "Hands-free is on: just speak. In a noisy room, turn it off and hold this button while you speak."
    : "Hold the button (or hold Space on it) while you speak; letting go sends the question.";
  showListening();
}

/** The listening indicator: whether the server hears the microphone now, and whether it hears speech. */
function showListening(hearing = false) {
  if (!ui.handsFree.checked) {
    setStateText(ui.listening, "off", "Hands-free off");
  } else if (!page.mic) {
    const text = page.stream ? "No microphone: type your questions" : "Hands-free starts with the camera";
    setStateText(ui.listening, "off", text);
  } else if (!page.session?.handsFree || !connection.isOpen) {
    setStateText(ui.listening, "waiting", "Hands-free: connecting…");
  } else if (hearing) {
    setStateText(ui.listening, "hearing", "Hearing you…");
  } else {
    setStateText(ui.listening, "listening", "Listening");
  }
}

/** The Hands-free switch: a new session with (or without) turn detection, at once. */
async function onHandsFreeChange() {
  showHandsFree();
  if (!page.camera.is("live")) return;
  stopTalking(false);
  try {
    await ensureSession();
  } catch (err) {
    showError(ui.error, errorText(err));
  }
  showListening();
}

function stop() {
  if (!page.camera.is("live")) return;
  page.camera.move("off");
  clearError(ui.error); // whatever went wrong belonged to the session that is ending
  interruptAnswer();
  stopReplay();
  page.frames.recent.length = 0;
  clearTimeout(page.timers.frame);
  clearInterval(page.timers.ping);
  page.timers.frame = undefined;
  stopTalking(false);
  page.stream?.getTracks().forEach((t) => t.stop());
  page.stream = null;
  page.mic?.context.close();
  page.mic = null;
  ui.preview.srcObject = null;
  ui.badge.textContent = "Camera off";
  ui.badge.dataset.live = "false";
  ui.placeholder.hidden = false;
  ui.start.disabled = false;
  ui.stop.disabled = true;
  ui.talk.disabled = true;
  page.session = null;
  showHandsFree();
  page.player?.stop();
  connection.close(connection.isOpen ? { type: "video.done" } : null);
  setState("idle", "Camera off");
}

// -- frames -----------------------------------------------------------------------------------------

function scheduleFrames() {
  clearTimeout(page.timers.frame);
  page.timers.frame = setTimeout(() => {
    captureFrame();
    if (page.camera.is("live")) scheduleFrames();
  }, 1000 / Number(ui.fps.value));
}

const canvas = document.createElement("canvas");

/**
 * Send a frame to the open session (the server answers each, in order: an ack or an error).
 * @param {Frame} frame
 */
function sendFrame(frame) {
  connection.send(frame);
  if (page.session) page.session.framesSent += 1;
  bump("sent");
}

async function captureFrame() {
  const video = ui.preview;
  if (connection.state === "ended" || connection.state === "closed") {
    // The server ended the session (idle, or after an error): the camera is on, so start a new one.
    if (nowMs() - page.frames.lastReopen > REOPEN_AFTER_MS) {
      page.frames.lastReopen = nowMs();
      connection.open().catch((err) => showError(ui.error, errorText(err)));
    }
  }
  if (!page.frames.capture.is("idle") || !connection.isOpen || !video.videoWidth) return;
  if (connection.bufferedAmount > MAX_BUFFERED_BYTES) return; // the link is behind; send the next one
  const context = canvas.getContext("2d");
  if (!context) return;
  page.frames.capture.move("encoding");
  try {
    const width = Math.min(Number(ui.width.value), video.videoWidth);
    canvas.width = width;
    canvas.height = Math.round((video.videoHeight * width) / video.videoWidth);
    const capturedAt = nowMs();
    const pts = Math.round(performance.now() - page.frames.captureStart);
    context.drawImage(video, 0, 0, canvas.width, canvas.height);
    /** @type {Blob | null} */
    const blob = await new Promise((resolve) => canvas.toBlob(resolve, "image/jpeg", Number(ui.quality.value)));
    if (!blob || !connection.isOpen) return;
    const data = bytesToBase64(new Uint8Array(await blob.arrayBuffer()));
    page.frames.seq += 1;
    const id = `f${page.frames.seq}`;
    sendFrame({ type: "video.frame", data, frame_id: id, pts_ms: pts, capture_ts_ms: Math.round(capturedAt) });
    // Sent again only to a new session, without a capture time (its ack would not be a latency).
    page.frames.recent.push({ type: "video.frame", data, frame_id: `${id}r`, pts_ms: pts });
    if (page.frames.recent.length > RESEND_FRAMES) page.frames.recent.shift();
  } finally {
    page.frames.capture.move("idle");
  }
}

/** @param {keyof typeof page.counts} name */
function bump(name) {
  page.counts[name] += 1;
  ui[name].textContent = String(page.counts[name]);
  ui[name].dataset.value = String(page.counts[name]);
}

/** @param {FrameAck} ack */
function onAck(ack) {
  const session = page.session;
  if (session) session.framesAnswered = Math.min(session.framesSent, session.framesAnswered + 1);
  if (ack.accepted) bump("accepted");
  else if (ack.reason === "filtered") bump("filtered");
  if (ack.dropped_frame_id) bump("replaced");
  if (typeof ack.capture_ts_ms === "number") {
    const latencies = page.ackLatencies;
    latencies.push(nowMs() - ack.capture_ts_ms);
    if (latencies.length > 20) latencies.shift();
    const last = latencies[latencies.length - 1];
    const mean = latencies.reduce((a, b) => a + b, 0) / latencies.length;
    ui.ackLatency.textContent = `${formatMs(last)} (mean of last ${latencies.length}: ${formatMs(mean)})`;
    ui.ackLatency.dataset.ms = last.toFixed(1);
  }
}

/**
 * Whether a `client_error` is the server refusing one of our frames. The server answers every
 * frame, in order, with an ack or an error, so an error is a frame's when a frame is still
 * unanswered; while a question waits for its answer to start, only frames sent before it count
 * (later ones are answered after its verdict), so an error with none of those left is the
 * question's refusal (no frames buffered). The frame is then counted as answered.
 */
function refusedFrame() {
  const session = page.session;
  if (!session) return false;
  const q = page.question;
  const before = q && q.phase.is("waiting") && q.framesBefore !== null ? q.framesBefore : session.framesSent;
  if (session.framesAnswered >= before) return false;
  session.framesAnswered += 1;
  return true;
}

// -- push to talk -----------------------------------------------------------------------------------

function startTalking() {
  const mic = page.mic;
  if (!page.talk.is("up") || !mic || ui.talk.disabled) return;
  interruptAnswer(); // the person is speaking: stop the current answer now
  stopReplay();
  page.talk.move("held");
  setState("listening", "Listening…");
  page.held.since = nowMs();
  page.held.chunks = [];
  ui.talk.setAttribute("aria-pressed", "true");
  ui.talk.textContent = "Listening… release to send";
  mic.context.resume();
  ensureSession().catch((err) => showError(ui.error, errorText(err))); // the audio goes to the session that answers
}

function stopTalking(send = true) {
  if (!page.talk.is("held")) return;
  ui.talk.setAttribute("aria-pressed", "false");
  ui.talk.textContent = "Hold to talk";
  ui.level.style.width = "0";
  if (send && page.mic) {
    page.held.spokenMs = nowMs() - page.held.since;
    page.talk.move("releasing");
    page.mic.node.port.postMessage("flush"); // the rest of the audio, then the question (onMicChunk)
  } else {
    page.talk.move("up");
    page.held.chunks = [];
  }
}

function sendHeldChunks() {
  for (const samples of page.held.chunks) {
    connection.send({ type: "audio.chunk", data: bytesToBase64(new Uint8Array(samples.buffer)) });
  }
  page.held.chunks = [];
}

/** @param {{ samples: Int16Array, rms: number, final: boolean }} chunk */
function onMicChunk({ samples, rms, final }) {
  if (page.session?.handsFree && page.talk.is("up")) {
    // Hands-free: every chunk goes to the server, whose voice-activity detection finds the turns.
    ui.level.style.width = `${Math.min(100, Math.round(rms * 400))}%`;
    if (samples.length && connection.isOpen) {
      connection.send({ type: "audio.chunk", data: bytesToBase64(new Uint8Array(samples.buffer)) });
    }
    return;
  }
  const held = page.talk.is("held");
  if (held || final) {
    ui.level.style.width = held ? `${Math.min(100, Math.round(rms * 400))}%` : "0";
    if (samples.length && connection.isOpen && page.talk.is("held", "releasing")) {
      page.held.chunks.push(samples);
      const pressedMs = held ? nowMs() - page.held.since : page.held.spokenMs;
      if (pressedMs >= MIN_TALK_MS) sendHeldChunks();
    }
  }
  if (final && page.talk.is("releasing")) {
    page.talk.move("up");
    const spokenMs = page.held.spokenMs;
    if (spokenMs < MIN_TALK_MS) {
      page.held.chunks = [];
      showError(ui.error, "That was too short to hear a question: hold the button while you speak.");
      setState("idle", "Ready: ask a question");
      return;
    }
    sendHeldChunks();
    ask("", `${(spokenMs / 1000).toFixed(1)} s of speech`);
  }
}

// -- questions and answers --------------------------------------------------------------------------

/**
 * The turn is still open (asked, or being heard or answered).
 * @param {Turn | null} q
 * @returns {q is Turn}
 */
function live(q) {
  return q !== null && q.phase.is("hearing", "waiting", "answering");
}

/**
 * Send a question about the buffered frames; `label` describes a spoken one until it is heard.
 * @param {string} text
 * @param {string} label
 */
async function ask(text, label) {
  clearError(ui.error);
  if (!page.camera.is("live")) {
    showError(ui.error, "Start the camera first: the answers are about what it sees.");
    setState("idle", "Camera off");
    ui.start.focus();
    return;
  }
  interruptAnswer();
  stopReplay();
  const q = addTurn(text, label, "waiting"); // on screen at once, also while a new session opens
  page.question = q;
  ui.firstText.textContent = "–";
  ui.firstAudio.textContent = "–";
  setState("thinking", text ? "Thinking…" : "Working out what you said…");
  try {
    await ensureSession();
  } catch (err) {
    showError(ui.error, errorText(err));
    if (q.phase.is("waiting")) finish(q, "failed");
    setState("error", "Not connected: the message above says why.");
    return;
  }
  if (page.question !== q || !q.phase.is("waiting")) return; // another question (or Stop) came while connecting
  q.sentAt = nowMs();
  q.framesBefore = page.session?.framesSent ?? 0;
  connection.send({ type: "video.query", text });
}

/**
 * The open session, configured as the page's options say. "Speak the answer" sets the session's
 * modalities, which the protocol fixes per session: when it changed, start a new session (its
 * onOpen sends the recent frames again; the conversation on screen stays).
 */
async function ensureSession() {
  if (connection.isOpen && page.session?.config !== JSON.stringify(wantedConfig())) connection.close();
  await connection.open();
}

/**
 * A conversation entry: the question (typed, or as heard) and its answer, newest at the bottom.
 * @param {string} text
 * @param {string} label
 * @param {"hearing" | "waiting"} phase
 * @returns {Turn}
 */
function addTurn(text, label, phase) {
  page.turns += 1;
  const item = document.createElement("li");
  item.className = "turn";
  item.dataset.turn = String(page.turns);
  const q = document.createElement("div");
  q.className = "bubble question";
  const qWho = document.createElement("span");
  qWho.className = "who";
  qWho.textContent = text ? "You" : "You (spoken)";
  const qText = document.createElement("p");
  qText.className = "question-text";
  qText.textContent = text || label;
  q.append(qWho, qText);
  const a = document.createElement("div");
  a.className = "bubble answer";
  const aWho = document.createElement("span");
  aWho.className = "who";
  aWho.textContent = "Answer";
  const aText = document.createElement("p");
  aText.className = "answer-text";
  a.append(aWho, aText);
  item.append(q, a);
  ui.conversation.append(item);
  ui.conversationEmpty.hidden = true;
  scrollToNewest();
  /** @param {TurnPhase} to  its element says how it stands (a turn being heard is waiting too) */
  const show = (to) => {
    item.dataset.how = to === "hearing" ? "waiting" : to;
  };
  show(phase);
  return {
    phase: new Machine(`turn ${page.turns}`, phase, TURN_MOVES, show),
    el: item,
    questionEl: q,
    questionText: qText,
    answer: a,
    answerText: aText,
    handsFree: false,
    sentAt: nowMs(),
    firstText: null,
    firstAudio: null,
    framesBefore: null,
    text: "",
    textDone: false,
    audioStarted: false,
    failed: false,
    audio: [],
  };
}

function scrollToNewest() {
  ui.conversation.scrollTop = ui.conversation.scrollHeight;
}

/**
 * What the server heard of a spoken question.
 * @param {Turn} q
 * @param {string} text
 */
function heard(q, text) {
  if (q.phase.is("hearing")) q.phase.move("waiting");
  if (text.trim()) {
    q.questionText.textContent = `“${text.trim()}”`;
    q.questionEl.classList.remove("unheard");
  } else {
    q.questionText.textContent = q.handsFree
      ? "Nothing was heard: speak a little closer to the microphone."
      : "Nothing was heard: hold Talk while you speak, close to the microphone.";
    q.questionEl.classList.add("unheard");
  }
}

/**
 * The server heard speech start (hands-free): whatever is answering or playing stops at once, and
 * the person's turn appears in the conversation while they speak.
 */
function onSpeechStarted() {
  if (!page.session?.handsFree) return;
  showListening(true);
  stopReplay();
  if (page.question?.phase.is("hearing")) return; // the same turn, heard again
  interruptAnswer();
  const q = addTurn("", "Listening…", "hearing");
  q.handsFree = true;
  page.question = q;
  setState("listening", "Hearing you…");
}

/** The server heard the speech stop: the turn is asked (the server answers it, as a spoken query). */
function onSpeechStopped() {
  showListening(false);
  const q = page.question;
  if (!q || !q.phase.is("hearing")) return;
  q.phase.move("waiting");
  q.sentAt = nowMs(); // the figures: from the end of the question, as with hold-to-talk
  // The server answered every frame it read before this audio ahead of this event: any frame
  // still unanswered comes after the turn's verdict.
  q.framesBefore = page.session?.framesAnswered ?? 0;
  q.questionText.textContent = "Working out what you said…";
  ui.firstText.textContent = "–";
  ui.firstAudio.textContent = "–";
  setState("thinking", "Working out what you said…");
}

/** A new question (or the person starting to talk) stops the current answer and its audio at once. */
function interruptAnswer() {
  page.player?.stop();
  if (live(page.question)) {
    finish(page.question, "interrupted");
    setState("idle", "Interrupted.");
  }
}

/**
 * The turn is over: how it ended, and a Play again button when its answer had audio.
 * @param {Turn} q
 * @param {"answered" | "failed" | "interrupted"} how
 */
function finish(q, how) {
  q.phase.move(how);
  if (how === "interrupted") q.answerText.textContent ||= "(interrupted)";
  if (how === "answered" && q.audio.length) {
    const replay = document.createElement("button");
    replay.type = "button";
    replay.className = "small replay";
    replay.textContent = "Play again";
    replay.setAttribute("aria-label", `Play the answer again: ${q.text.slice(0, 60)}`);
    replay.addEventListener("click", () => replayAnswer(q, replay));
    q.answer.append(replay);
  }
  scrollToNewest();
}

/** @param {string} text */
function endAnswer(text) {
  if (!live(page.question)) return;
  finish(page.question, "interrupted");
  setState("error", text);
}

/**
 * Play an earlier answer's audio again (stops anything playing).
 * @param {Turn} q
 * @param {HTMLButtonElement} button
 */
async function replayAnswer(q, button) {
  const player = page.player;
  if (!player) return;
  interruptAnswer();
  stopReplay();
  await player.resume();
  player.stop();
  player.reset();
  page.replaying = { turn: q, button };
  button.textContent = "Playing…";
  for (const chunk of q.audio) player.push(chunk.samples.slice(), chunk.rate);
  player.end();
  setState("speaking", "Playing the answer again…");
}

function stopReplay() {
  if (!page.replaying) return;
  page.replaying.button.textContent = "Play again";
  page.replaying = null;
  page.player?.stop();
}

/** @param {VideoMessage | ArrayBuffer} msg */
function onMessage(msg) {
  if (msg instanceof ArrayBuffer) return; // the protocol sends JSON only
  const q = page.question;
  switch (msg.type) {
    case "video.frame.ack":
      onAck(msg);
      break;
    case "video.frames.consumed":
      break;
    case "input_audio_buffer.speech_started":
      onSpeechStarted();
      break;
    case "input_audio_buffer.speech_stopped":
      onSpeechStopped();
      break;
    case "input.transcript":
      if (live(q)) heard(q, typeof msg.text === "string" ? msg.text : "");
      break;
    case "response.start":
      if (!q || !q.phase.is("waiting")) break;
      q.phase.move("answering");
      setState("thinking", "Answering…");
      break;
    case "response.text.delta":
      if (!q || !q.phase.is("answering")) break;
      if (q.firstText === null) {
        q.firstText = nowMs();
        showMs(ui.firstText, q.firstText - q.sentAt);
      }
      q.text += msg.delta;
      q.answerText.textContent = q.text;
      scrollToNewest();
      break;
    case "response.text.done":
      if (!q || !q.phase.is("answering")) break;
      q.text = msg.text;
      q.answerText.textContent = msg.text;
      // The text is done as soon as it is written; its audio may still come. Without audio the
      // answer is complete; with audio, once the player has played it out (onPlayerStats).
      q.textDone = true;
      if (!q.audioStarted && (!page.session?.speaksAnswers || q.failed)) completeAnswer(q);
      break;
    case "response.audio.delta":
      if (!q || !q.phase.is("answering")) break;
      onAnswerAudio(q, msg);
      break;
    case "response.audio.done":
      if (!q || q.phase.is("hearing", "waiting", "interrupted")) break;
      page.player?.end();
      if (q.phase.is("answering") && !q.audioStarted) completeAnswer(q);
      break;
    case "pong":
      if (page.session?.pingAt) showMs(ui.rtt, nowMs() - page.session.pingAt);
      break;
    case "session.done":
      break;
    case "error":
      onServerError(msg);
      break;
    default:
      break;
  }
}

/**
 * The server's `error`, by its kind: `timeout` ends a quiet session (not shown: the next question,
 * or frame, opens a new one); a `client_error` may be a refused frame (the questions go on);
 * anything else fails the open turn, at once when nothing else of it follows.
 * @param {ServerError} msg
 */
function onServerError(msg) {
  if (msg.kind === "timeout") return;
  showError(ui.error, describeServerError(msg));
  if (msg.kind === "client_error" && refusedFrame()) return;
  const q = page.question;
  if (!live(q)) return;
  q.failed = true;
  // refused before it started, or failed before any audio: nothing else follows
  if (q.phase.is("hearing", "waiting") || (q.textDone && !q.audioStarted)) completeAnswer(q);
}

/**
 * A piece of the spoken answer: a WAV file, played at the rate its header states.
 * @param {Turn} q
 * @param {AudioDelta} msg
 */
function onAnswerAudio(q, msg) {
  const player = page.player;
  if (!player) return;
  let wav;
  try {
    wav = parseWav(base64ToBytes(msg.data));
  } catch (err) {
    showError(ui.error, `Could not play the answer's audio: ${errorText(err)}`);
    return;
  }
  if (q.firstAudio === null) {
    q.firstAudio = nowMs();
    showMs(ui.firstAudio, q.firstAudio - q.sentAt);
  }
  q.audioStarted = true;
  setState("speaking", "Speaking the answer…");
  const samples = int16ToFloat32(wav.samples);
  q.audio.push({ samples: samples.slice(), rate: wav.rate });
  player.push(samples, wav.rate);
  if (ui.answerRate.dataset.value !== String(wav.rate)) {
    ui.answerRate.dataset.value = String(wav.rate);
    ui.answerRate.textContent = `${wav.rate} Hz (player ${player.contextRate} Hz)`;
  }
}

/** @param {PlayerStats} stats */
function onPlayerStats(stats) {
  ui.played.textContent = stats.played.toLocaleString("en");
  ui.played.dataset.value = String(stats.played);
  const audio = stats.playing ? "playing" : stats.reason === "stopped" || stats.reason === "stop" ? "stopped" : "idle";
  if (ui.audioState.dataset.state !== audio) {
    ui.audioState.dataset.state = audio;
    ui.audioState.textContent = audio;
  }
  const q = page.question;
  if (stats.reason === "drained" && page.replaying) {
    page.replaying.button.textContent = "Play again";
    page.replaying = null;
    setState("done", "Played again.");
  } else if (stats.reason === "drained" && q && q.phase.is("answering") && q.audioStarted) {
    completeAnswer(q);
  }
}

/** @param {Turn} q */
function completeAnswer(q) {
  finish(q, q.failed ? "failed" : "answered");
  if (q.failed) setState("error", "The answer failed; the message above says why.");
  else setState("done", "Answered.");
  applyOptionsWhenIdle();
}

/**
 * Hands-free turns are asked by the server, not through ask(), so a changed "Speak the answer"
 * would never reach the session: start the new session between turns instead.
 */
function applyOptionsWhenIdle() {
  const session = page.session;
  if (!page.camera.is("live") || !session?.handsFree || live(page.question)) return;
  if (session.config === JSON.stringify(wantedConfig())) return;
  ensureSession().catch((err) => showError(ui.error, errorText(err)));
}

function ping() {
  if (!connection.isOpen || !page.session) return;
  page.session.pingAt = nowMs();
  connection.send({ type: "ping" });
}

/**
 * @param {string} state
 * @param {string} text
 */
function setState(state, text) {
  setStateText(ui.state, state, text);
}

// -- wiring -----------------------------------------------------------------------------------------

ui.start.addEventListener("click", start);
ui.stop.addEventListener("click", stop);
ui.fps.addEventListener("change", () => page.camera.is("live") && scheduleFrames());
ui.handsFree.addEventListener("change", onHandsFreeChange);
ui.speakAnswer.addEventListener("change", applyOptionsWhenIdle);
ui.quality.addEventListener("input", () => {
  ui.qualityOut.textContent = Number(ui.quality.value).toFixed(2);
});
ui.askForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = ui.question.value.trim();
  if (!text) {
    showError(ui.error, "Type a question first, or hold Talk and ask it aloud.");
    ui.question.focus();
    return;
  }
  ui.question.value = "";
  ask(text, "");
});
ui.talk.addEventListener("pointerdown", (event) => {
  ui.talk.setPointerCapture(event.pointerId);
  startTalking();
});
ui.talk.addEventListener("pointerup", () => stopTalking());
ui.talk.addEventListener("pointercancel", () => stopTalking());
ui.talk.addEventListener("keydown", (event) => {
  if ((event.key === " " || event.key === "Enter") && !event.repeat) {
    event.preventDefault();
    startTalking();
  }
});
ui.talk.addEventListener("keyup", (event) => {
  if (event.key === " " || event.key === "Enter") {
    event.preventDefault();
    stopTalking();
  }
});
ui.talk.addEventListener("blur", () => stopTalking());
window.addEventListener("pagehide", () => connection.close(connection.isOpen ? { type: "video.done" } : null));
