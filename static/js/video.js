// The video page: camera frames and microphone audio up, streamed answer text and speech down,
// over /v1/video/chat/stream. Hands-free (the default where a microphone is granted) streams the
// microphone all the time and lets the server's voice-activity detection find the turns
// (session.config's turn_detection); hold-to-talk sends only what is said while the button is held.
import {
  Connection,
  base64ToBytes,
  bytesToBase64,
  clearError,
  describeServerError,
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

const ANSWER_RATE = 24000;
const MAX_BUFFERED_BYTES = 2 * 1024 * 1024; // skip a frame rather than queue behind a slow link
const PING_EVERY_MS = 15000;
// Frames kept in the page and sent again when a new session starts (a changed "Speak the answer",
// an idle timeout, a reconnect): the server's buffer is per session, and a question needs frames.
const RESEND_FRAMES = 4;
const MIC_WORKLET_URL = new URL("../worklets/mic-capture.js", import.meta.url);
const MIC_CHUNK_MS = 40; // short chunks: the server hears the start of speech (a barge-in) sooner
// OpenAI's server_vad defaults: a turn ends after half a second of silence, speech interrupts an answer.
const TURN_DETECTION = {
  type: "server_vad",
  threshold: 0.5,
  prefix_padding_ms: 300,
  silence_duration_ms: 500,
  create_response: true,
  interrupt_response: true,
};

const $ = (id) => document.getElementById(id);
const ui = {
  preview: $("preview"),
  badge: $("camera-badge"),
  placeholder: $("preview-placeholder"),
  start: $("start"),
  stop: $("stop"),
  fps: $("fps"),
  quality: $("quality"),
  qualityOut: $("quality-out"),
  width: $("width"),
  sent: $("sent"),
  accepted: $("accepted"),
  filtered: $("filtered"),
  replaced: $("replaced"),
  talk: $("talk"),
  talkHint: $("talk-hint"),
  handsFree: $("hands-free"),
  listening: $("listening"),
  level: $("level"),
  askForm: $("ask-form"),
  question: $("question"),
  speakAnswer: $("speak-answer"),
  conversation: $("conversation"),
  conversationEmpty: $("conversation-empty"),
  state: $("state"),
  ackLatency: $("ack-latency"),
  firstText: $("first-text"),
  firstAudio: $("first-audio"),
  rtt: $("rtt"),
  played: $("played"),
  audioState: $("audio-state"),
  conn: $("conn"),
  error: $("error"),
};

const counts = { sent: 0, accepted: 0, filtered: 0, replaced: 0 };
let stream = null; // camera + microphone
let player = null;
let mic = null; // { context, node, source }
let frameTimer = null;
let pingTimer = null;
let frameSeq = 0;
let captureStart = 0;
let capturing = false; // a frame is being encoded
let talking = false;
let talkStartedAt = 0;
let question = null; // the turn whose answer is streaming (or awaited)
let awaitingStart = false; // a new question was sent: drop the old answer's late messages
let turn = 0;
let lastPingAt = 0;
let sessionConfig = null; // what the open session was configured with (JSON text)
let speaksAnswers = false; // the session's modalities include audio
let sessionHandsFree = false; // the open session detects turns in the streamed microphone audio
let replaying = null; // the turn whose answer is being played again
const recentFrames = []; // the last RESEND_FRAMES video.frame messages sent
const ackLatencies = [];

/** The session.config the page's options ask for (a change starts a new session). */
function wantedConfig() {
  const config = { type: "session.config", modalities: ui.speakAnswer.checked ? ["text", "audio"] : ["text"] };
  if (handsFreeWanted()) config.turn_detection = TURN_DETECTION;
  return config;
}

function handsFreeWanted() {
  return Boolean(mic) && ui.handsFree.checked;
}

const connection = new Connection("/v1/video/chat/stream", {
  onOpen() {
    const config = wantedConfig();
    sessionConfig = JSON.stringify(config);
    speaksAnswers = config.modalities.includes("audio");
    sessionHandsFree = Boolean(config.turn_detection);
    connection.send(config);
    // A new session starts with an empty frame buffer: give it the latest frames at once.
    for (const frame of recentFrames) {
      connection.send(frame);
      bump("sent");
    }
    ping();
    showListening();
  },
  onMessage,
  onStatus: (state, text) => {
    showConnection(ui.conn, state, text);
    if (state !== "open") showListening();
  },
  onDrop({ opened }) {
    sessionHandsFree = false;
    if (opened && question && !question.done) {
      endAnswer("The connection dropped during the answer; ask again once it is back.");
    }
  },
});

// -- camera and microphone --------------------------------------------------------------------------

async function start() {
  clearError(ui.error);
  ui.start.disabled = true;
  try {
    player ??= await PcmPlayer.create({ sourceRate: ANSWER_RATE, onStats: onPlayerStats });
    await player.resume();
    stream = await navigator.mediaDevices.getUserMedia({
      video: { width: { ideal: 640 }, height: { ideal: 480 } },
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
  } catch (err) {
    ui.start.disabled = false;
    showError(ui.error, mediaErrorText(err));
    return;
  }
  ui.preview.srcObject = stream;
  ui.badge.textContent = "Live";
  ui.badge.dataset.live = "true";
  ui.placeholder.hidden = true;
  ui.stop.disabled = false;
  if (!question || question.done) setState("idle", "Ready: ask a question");
  await startMicrophone();
  captureStart = performance.now();
  scheduleFrames();
  connection.open().catch((err) => showError(ui.error, err.message));
  clearInterval(pingTimer);
  pingTimer = setInterval(ping, PING_EVERY_MS);
}

function mediaErrorText(err) {
  if (!navigator.mediaDevices) {
    return "This page needs a secure address (https://, or http://localhost) to use the camera and microphone.";
  }
  if (err.name === "NotAllowedError") return "The browser was not allowed to use the camera or microphone.";
  if (err.name === "NotFoundError") return "No camera or microphone was found.";
  return `Could not start the camera or microphone: ${err.message}`;
}

async function startMicrophone() {
  const tracks = stream.getAudioTracks();
  if (!tracks.length) {
    ui.talk.disabled = true;
    showHandsFree();
    return;
  }
  const context = new AudioContext({ latencyHint: "interactive" });
  await context.audioWorklet.addModule(MIC_WORKLET_URL);
  const source = context.createMediaStreamSource(new MediaStream(tracks));
  const node = new AudioWorkletNode(context, "mic-capture", {
    numberOfInputs: 1,
    numberOfOutputs: 0,
    processorOptions: { chunkMs: MIC_CHUNK_MS },
  });
  node.port.onmessage = (event) => onMicChunk(event.data);
  source.connect(node);
  mic = { context, node, source };
  showHandsFree();
}

/** Hands-free on: the Talk button rests (the server finds the turns); off: hold Talk to ask. */
function showHandsFree() {
  const on = handsFreeWanted();
  ui.talk.disabled = !mic || on;
  ui.talkHint.textContent = on
    ? "Hands-free is on: just speak. In a noisy room, turn it off and hold this button while you speak."
    : "Hold the button (or hold Space on it) while you speak; letting go sends the question.";
  showListening();
}

/** The listening indicator: whether the server hears the microphone now, and whether it hears speech. */
function showListening(hearing = false) {
  if (!ui.handsFree.checked) {
    setStateText(ui.listening, "off", "Hands-free off");
  } else if (!mic) {
    setStateText(ui.listening, "off", stream ? "No microphone: type your questions" : "Hands-free starts with the camera");
  } else if (!sessionHandsFree || !connection.isOpen) {
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
  if (!stream) return;
  stopTalking(false);
  try {
    await ensureSession();
  } catch (err) {
    showError(ui.error, err.message);
  }
  showListening();
}

function stop() {
  clearError(ui.error); // whatever went wrong belonged to the session that is ending
  interruptAnswer();
  stopReplay();
  recentFrames.length = 0;
  clearTimeout(frameTimer);
  clearInterval(pingTimer);
  frameTimer = null;
  stopTalking(false);
  stream?.getTracks().forEach((t) => t.stop());
  stream = null;
  mic?.context.close();
  mic = null;
  ui.preview.srcObject = null;
  ui.badge.textContent = "Camera off";
  ui.badge.dataset.live = "false";
  ui.placeholder.hidden = false;
  ui.start.disabled = false;
  ui.stop.disabled = true;
  ui.talk.disabled = true;
  sessionHandsFree = false;
  showHandsFree();
  player?.stop();
  connection.close(connection.isOpen ? { type: "video.done" } : null);
  setState("idle", "Camera off");
}

// -- frames -----------------------------------------------------------------------------------------

function scheduleFrames() {
  clearTimeout(frameTimer);
  frameTimer = setTimeout(() => {
    captureFrame();
    if (stream) scheduleFrames();
  }, 1000 / Number(ui.fps.value));
}

const canvas = document.createElement("canvas");

let lastReopen = 0;

async function captureFrame() {
  const video = ui.preview;
  if (!connection.isOpen && !connection.opening && !connection.retryTimer && nowMs() - lastReopen > 5000) {
    // The server ended the session (idle, or after an error): the camera is on, so start a new one.
    lastReopen = nowMs();
    connection.open().catch((err) => showError(ui.error, err.message));
  }
  if (capturing || !connection.isOpen || !video.videoWidth) return;
  if (connection.bufferedAmount > MAX_BUFFERED_BYTES) return; // the link is behind; send the next one
  capturing = true;
  try {
    const width = Math.min(Number(ui.width.value), video.videoWidth);
    canvas.width = width;
    canvas.height = Math.round((video.videoHeight * width) / video.videoWidth);
    const capturedAt = nowMs();
    const pts = Math.round(performance.now() - captureStart);
    canvas.getContext("2d").drawImage(video, 0, 0, canvas.width, canvas.height);
    const blob = await new Promise((resolve) => canvas.toBlob(resolve, "image/jpeg", Number(ui.quality.value)));
    if (!blob || !connection.isOpen) return;
    const data = bytesToBase64(new Uint8Array(await blob.arrayBuffer()));
    frameSeq += 1;
    connection.send({
      type: "video.frame",
      data,
      frame_id: `f${frameSeq}`,
      pts_ms: pts,
      capture_ts_ms: Math.round(capturedAt),
    });
    bump("sent");
    // Sent again only to a new session, without a capture time (its ack would not be a latency).
    recentFrames.push({ type: "video.frame", data, frame_id: `f${frameSeq}r`, pts_ms: pts });
    if (recentFrames.length > RESEND_FRAMES) recentFrames.shift();
  } finally {
    capturing = false;
  }
}

function bump(name) {
  counts[name] += 1;
  ui[name].textContent = String(counts[name]);
  ui[name].dataset.value = String(counts[name]);
}

function onAck(ack) {
  if (ack.accepted) bump("accepted");
  else if (ack.reason === "filtered") bump("filtered");
  if (ack.dropped_frame_id) bump("replaced");
  if (typeof ack.capture_ts_ms === "number") {
    ackLatencies.push(nowMs() - ack.capture_ts_ms);
    if (ackLatencies.length > 20) ackLatencies.shift();
    const mean = ackLatencies.reduce((a, b) => a + b, 0) / ackLatencies.length;
    ui.ackLatency.textContent = `${formatMs(ackLatencies.at(-1))} (mean of last ${ackLatencies.length}: ${formatMs(mean)})`;
    ui.ackLatency.dataset.ms = ackLatencies.at(-1).toFixed(1);
  }
}

// -- push to talk -----------------------------------------------------------------------------------

function startTalking() {
  if (talking || !mic || ui.talk.disabled) return;
  interruptAnswer(); // the person is speaking: stop the current answer now
  stopReplay();
  talking = true;
  setState("listening", "Listening…");
  talkStartedAt = nowMs();
  heldChunks = [];
  ui.talk.setAttribute("aria-pressed", "true");
  ui.talk.textContent = "Listening… release to send";
  mic.context.resume();
  ensureSession().catch((err) => showError(ui.error, err.message)); // the audio goes to the session that answers
}

function stopTalking(send = true) {
  if (!talking) return;
  talking = false;
  ui.talk.setAttribute("aria-pressed", "false");
  ui.talk.textContent = "Hold to talk";
  ui.level.style.width = "0";
  if (send && mic) {
    pendingVoiceQuestion = nowMs() - talkStartedAt;
    mic.node.port.postMessage("flush"); // the rest of the audio, then the question (onMicChunk)
  }
}

let pendingVoiceQuestion = null; // ms spoken, set between release and the last chunk
// A shorter press is a tap, not a question. Its audio never leaves the page: the protocol has no way
// to take audio back, and it would otherwise be prepended to the next spoken question.
const MIN_TALK_MS = 250;
let heldChunks = []; // microphone chunks of a press not yet MIN_TALK_MS long

function sendHeldChunks() {
  for (const samples of heldChunks) {
    connection.send({ type: "audio.chunk", data: bytesToBase64(new Uint8Array(samples.buffer)) });
  }
  heldChunks = [];
}

function onMicChunk({ samples, rms, final }) {
  if (sessionHandsFree && !talking && pendingVoiceQuestion === null) {
    // Hands-free: every chunk goes to the server, whose voice-activity detection finds the turns.
    ui.level.style.width = `${Math.min(100, Math.round(rms * 400))}%`;
    if (samples.length && connection.isOpen) {
      connection.send({ type: "audio.chunk", data: bytesToBase64(new Uint8Array(samples.buffer)) });
    }
    return;
  }
  if (talking || final) {
    ui.level.style.width = talking ? `${Math.min(100, Math.round(rms * 400))}%` : "0";
    if (samples.length && connection.isOpen && (talking || pendingVoiceQuestion !== null)) {
      heldChunks.push(samples);
      const pressedMs = talking ? nowMs() - talkStartedAt : pendingVoiceQuestion;
      if (pressedMs >= MIN_TALK_MS) sendHeldChunks();
    }
  }
  if (final && pendingVoiceQuestion !== null) {
    const spokenMs = pendingVoiceQuestion;
    pendingVoiceQuestion = null;
    if (spokenMs < MIN_TALK_MS) {
      heldChunks = [];
      showError(ui.error, "That was too short to hear a question: hold the button while you speak.");
      setState("idle", "Ready: ask a question");
      return;
    }
    sendHeldChunks();
    ask("", `${(spokenMs / 1000).toFixed(1)} s of speech`);
  }
}

// -- questions and answers --------------------------------------------------------------------------

/** Send a question about the buffered frames; `label` describes a spoken one until it is heard. */
async function ask(text, label) {
  clearError(ui.error);
  if (!stream) {
    showError(ui.error, "Start the camera first: the answers are about what it sees.");
    setState("idle", "Camera off");
    ui.start.focus();
    return;
  }
  interruptAnswer();
  stopReplay();
  const q = addTurn(text, label); // on screen at once, also while a new session opens
  question = q;
  awaitingStart = true;
  ui.firstText.textContent = "–";
  ui.firstAudio.textContent = "–";
  setState("thinking", text ? "Thinking…" : "Working out what you said…");
  try {
    await ensureSession();
  } catch (err) {
    showError(ui.error, err.message);
    finish(q, "failed");
    setState("error", "Not connected: the message above says why.");
    return;
  }
  if (question !== q || q.done) return; // another question (or Stop) came while connecting
  q.sentAt = nowMs();
  connection.send({ type: "video.query", text });
}

/**
 * The open session, configured as the page's options say. "Speak the answer" sets the session's
 * modalities, which the protocol fixes per session: when it changed, start a new session (its
 * onOpen sends the recent frames again; the conversation on screen stays).
 */
async function ensureSession() {
  if (connection.isOpen && sessionConfig !== JSON.stringify(wantedConfig())) connection.close();
  await connection.open();
}

/** A conversation entry: the question (typed, or as heard) and its answer, newest at the bottom. */
function addTurn(text, label) {
  turn += 1;
  const item = document.createElement("li");
  item.className = "turn";
  item.dataset.turn = String(turn);
  item.dataset.how = "waiting";
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
  return {
    el: item,
    questionEl: q,
    questionText: qText,
    answer: a,
    answerText: aText,
    sentAt: nowMs(),
    firstText: null,
    firstAudio: null,
    done: false,
    text: "",
    audio: [], // Float32Array chunks at their rates, to play the answer again
  };
}

function scrollToNewest() {
  ui.conversation.scrollTop = ui.conversation.scrollHeight;
}

function heard(q, text) {
  q.hearing = false;
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
  if (!sessionHandsFree) return;
  showListening(true);
  stopReplay();
  if (question && question.hearing && !question.done) return; // the same turn, heard again
  interruptAnswer();
  const q = addTurn("", "Listening…");
  q.handsFree = true;
  q.hearing = true;
  question = q;
  awaitingStart = true;
  setState("listening", "Hearing you…");
}

/** The server heard the speech stop: the turn is asked (the server answers it, as a spoken query). */
function onSpeechStopped() {
  showListening(false);
  if (!question || question.done || !question.hearing) return;
  question.hearing = false;
  question.sentAt = nowMs(); // the figures: from the end of the question, as with hold-to-talk
  question.questionText.textContent = "Working out what you said…";
  ui.firstText.textContent = "–";
  ui.firstAudio.textContent = "–";
  setState("thinking", "Working out what you said…");
}

/** A new question (or the person starting to talk) stops the current answer and its audio at once. */
function interruptAnswer() {
  player?.stop();
  if (question && !question.done) {
    finish(question, "interrupted");
    setState("idle", "Interrupted.");
  }
  awaitingStart = true;
}

/** The turn is over: how it ended, and a Play again button when its answer had audio. */
function finish(q, how) {
  q.done = true;
  q.el.dataset.how = how;
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

function endAnswer(text) {
  if (!question || question.done) return;
  finish(question, "interrupted");
  setState("error", text);
}

/** Play an earlier answer's audio again (stops anything playing). */
async function replayAnswer(q, button) {
  if (question && !question.done) interruptAnswer();
  stopReplay();
  await player.resume();
  player.stop();
  player.reset();
  replaying = { turn: q, button };
  button.textContent = "Playing…";
  for (const chunk of q.audio) player.push(chunk.samples.slice(), chunk.rate);
  player.end();
  setState("speaking", "Playing the answer again…");
}

function stopReplay() {
  if (!replaying) return;
  replaying.button.textContent = "Play again";
  replaying = null;
  player?.stop();
}

function onMessage(msg) {
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
      if (question && !question.done) heard(question, typeof msg.text === "string" ? msg.text : "");
      break;
    case "response.start":
      if (!question || question.done) break;
      awaitingStart = false;
      question.el.dataset.how = "answering";
      setState("thinking", "Answering…");
      break;
    case "response.text.delta":
      if (awaitingStart || !question || question.done) break;
      if (question.firstText === null) {
        question.firstText = nowMs();
        showMs(ui.firstText, question.firstText - question.sentAt);
      }
      question.text += msg.delta;
      question.answerText.textContent = question.text;
      scrollToNewest();
      break;
    case "response.text.done":
      if (awaitingStart || !question || question.done) break;
      question.text = msg.text;
      question.answerText.textContent = msg.text;
      // The text is done as soon as it is written; its audio may still come. Without audio the
      // answer is complete; with audio, once the player has played it out (onPlayerStats).
      question.textDone = true;
      if (!question.audioStarted && (!speaksAnswers || question.failed)) completeAnswer();
      break;
    case "response.audio.delta":
      if (awaitingStart || !question || question.done) break;
      onAnswerAudio(msg);
      break;
    case "response.audio.done":
      if (awaitingStart || !question) break;
      player?.end();
      if (!question.done && !question.audioStarted) completeAnswer();
      break;
    case "pong":
      if (lastPingAt) showMs(ui.rtt, nowMs() - lastPingAt);
      break;
    case "session.done":
      break;
    case "error":
      if (/^Idle timeout/.test(msg.message)) break; // a quiet session ended; the next question reopens it
      showError(ui.error, describeServerError(msg));
      if (question && !question.done && !/^(Frame|Invalid image)/.test(msg.message)) {
        question.failed = true;
        // refused before it started, or failed before any audio: nothing else follows
        if (awaitingStart || (question.textDone && !question.audioStarted)) completeAnswer();
      }
      break;
    default:
      break;
  }
}

function onAnswerAudio(msg) {
  let wav;
  try {
    wav = parseWav(base64ToBytes(msg.data));
  } catch (err) {
    showError(ui.error, `Could not play the answer's audio: ${err.message}`);
    return;
  }
  if (question.firstAudio === null) {
    question.firstAudio = nowMs();
    showMs(ui.firstAudio, question.firstAudio - question.sentAt);
  }
  question.audioStarted = true;
  setState("speaking", "Speaking the answer…");
  const samples = int16ToFloat32(wav.samples);
  question.audio.push({ samples: samples.slice(), rate: wav.rate });
  player.push(samples, wav.rate);
}

function onPlayerStats(stats) {
  ui.played.textContent = stats.played.toLocaleString("en");
  ui.played.dataset.value = String(stats.played);
  const audio = stats.playing ? "playing" : stats.reason === "stopped" || stats.reason === "stop" ? "stopped" : "idle";
  if (ui.audioState.dataset.state !== audio) {
    ui.audioState.dataset.state = audio;
    ui.audioState.textContent = audio;
  }
  if (stats.reason === "drained" && replaying) {
    replaying.button.textContent = "Play again";
    replaying = null;
    setState("done", "Played again.");
  } else if (stats.reason === "drained" && question && !question.done && question.audioStarted) {
    completeAnswer();
  }
}

function completeAnswer() {
  finish(question, question.failed ? "failed" : "answered");
  if (question.failed) setState("error", "The answer failed; the message above says why.");
  else setState("done", "Answered.");
  applyOptionsWhenIdle();
}

/**
 * Hands-free turns are asked by the server, not through ask(), so a changed "Speak the answer"
 * would never reach the session: start the new session between turns instead.
 */
function applyOptionsWhenIdle() {
  if (!stream || !sessionHandsFree || (question && !question.done)) return;
  if (sessionConfig === JSON.stringify(wantedConfig())) return;
  ensureSession().catch((err) => showError(ui.error, err.message));
}

function ping() {
  if (!connection.isOpen) return;
  lastPingAt = nowMs();
  connection.send({ type: "ping" });
}

function setState(state, text) {
  setStateText(ui.state, state, text);
}

// -- wiring -----------------------------------------------------------------------------------------

ui.start.addEventListener("click", start);
ui.stop.addEventListener("click", stop);
ui.fps.addEventListener("change", () => stream && scheduleFrames());
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
