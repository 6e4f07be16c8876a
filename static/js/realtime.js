// @ts-check
// The call page: a Realtime session over WebRTC (POST /v1/realtime/calls), as OpenAI's browser
// clients hold one. The microphone goes up as an Opus track, the answer comes down as one and plays
// in an <audio> element; the events travel on the "oai-events" data channel. The server's VAD ends
// each turn and answers; speaking over an answer stops it (the server silences its track). When
// speech starts, a picture from the camera goes along as an input_image item.

/**
 * An element of the page, of the given type.
 * @template {HTMLElement} T
 * @param {string} id
 * @param {{ new (): T }} type
 * @returns {T}
 */
function byId(id, type) {
  const el = document.getElementById(id);
  if (!(el instanceof type)) throw new Error(`#${id} is missing or not a ${type.name}`);
  return el;
}

const ui = {
  conn: byId("conn", HTMLElement),
  state: byId("state", HTMLElement),
  error: byId("error", HTMLElement),
  preview: byId("preview", HTMLVideoElement),
  placeholder: byId("preview-placeholder", HTMLElement),
  badge: byId("camera-badge", HTMLElement),
  start: byId("start", HTMLButtonElement),
  hangup: byId("hangup", HTMLButtonElement),
  sendCamera: byId("send-camera", HTMLInputElement),
  answer: byId("answer", HTMLAudioElement),
  conversation: byId("conversation", HTMLOListElement),
  empty: byId("conversation-empty", HTMLElement),
  firstAudio: byId("first-audio", HTMLElement),
  callId: byId("call-id", HTMLElement),
  iceState: byId("ice-state", HTMLElement),
  audioState: byId("audio-state", HTMLElement),
  eventCount: byId("event-count", HTMLElement),
};

const CALLS = "/v1/realtime/calls";
const IMAGE_WIDTH = 640;
const IMAGE_QUALITY = 0.7;
// The session the page asks for once the channel opens: spoken answers, and the questions written
// out too (Whisper) so they can be shown.
const SESSION = {
  type: "realtime",
  output_modalities: ["audio"],
  audio: { input: { transcription: { model: "whisper-1" } } },
};

/** An API token or client secret (ek_…) from the page's URL (?key=), sent as the Bearer token. */
const key = new URLSearchParams(window.location.search).get("key");

/**
 * One call: the peer connection, its data channel, the devices' stream and the call's id.
 * @typedef {{ pc: RTCPeerConnection, channel: RTCDataChannel, stream: MediaStream, id: string | null }} Call
 *
 * A server event, as far as this page reads it.
 * @typedef {{ type: string, item_id?: string, response_id?: string, delta?: string, transcript?: string,
 *   response?: { id: string, status: string }, error?: { message: string } }} ServerEvent
 */

const page = {
  /** @type {Call | null} */
  call: null,
  events: 0,
  /** @type {number | null} when the server said the last turn's speech stopped */
  turnEndedAt: null,
  /** @type {Map<string, HTMLElement>} question texts by item id */
  questions: new Map(),
  /** @type {Map<string, HTMLElement>} turns by the id of the response answering them */
  answers: new Map(),
  canvas: document.createElement("canvas"),
};

/**
 * @param {HTMLElement} el
 * @param {string} state
 * @param {string} text
 */
function setPill(el, state, text) {
  el.dataset.state = state;
  const label = el.querySelector(".label");
  if (label) label.textContent = text;
}

/** @param {string} message */
function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = !message;
}

/** @param {string} state */
function setAudio(state) {
  ui.audioState.dataset.state = state;
  ui.audioState.textContent = state;
}

/** @returns {Record<string, string>} */
function authHeaders() {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/**
 * The message of an OpenAI-style error body, or the status line.
 * @param {Response} response
 */
async function refusal(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch {
    // not JSON
  }
  return `${response.status} ${response.statusText}`;
}

async function openDevices() {
  const audio = { echoCancellation: true, noiseSuppression: true, autoGainControl: true };
  try {
    return await navigator.mediaDevices.getUserMedia({ audio, video: { width: { ideal: IMAGE_WIDTH } } });
  } catch (err) {
    if (err instanceof DOMException && (err.name === "NotFoundError" || err.name === "OverconstrainedError")) {
      return navigator.mediaDevices.getUserMedia({ audio }); // no camera: the call is spoken only
    }
    throw err;
  }
}

/** @param {unknown} err */
function errorText(err) {
  return err instanceof Error ? err.message : String(err);
}

/** @param {unknown} err */
function deviceError(err) {
  if (!window.isSecureContext || !navigator.mediaDevices) {
    return "This page needs a secure address (https://, or http://localhost) to use the microphone.";
  }
  if (err instanceof DOMException && err.name === "NotAllowedError") return "The browser was not allowed to use the microphone.";
  if (err instanceof DOMException && err.name === "NotFoundError") return "No microphone was found.";
  return `Could not start the call: ${errorText(err)}`;
}

async function startCall() {
  if (page.call) return;
  showError("");
  ui.start.disabled = true;
  setPill(ui.conn, "connecting", "Calling…");
  let stream;
  try {
    stream = await openDevices();
  } catch (err) {
    showError(deviceError(err));
    setPill(ui.conn, "idle", "No call");
    ui.start.disabled = false;
    return;
  }
  const video = stream.getVideoTracks()[0];
  if (video) {
    ui.preview.srcObject = new MediaStream([video]);
    ui.placeholder.hidden = true;
    ui.badge.dataset.live = "true";
    ui.badge.textContent = "Camera on";
  }
  const pc = new RTCPeerConnection();
  const channel = pc.createDataChannel("oai-events");
  /** @type {Call} */
  const call = { pc, channel, stream, id: null };
  page.call = call;
  pc.addTrack(stream.getAudioTracks()[0], stream);
  pc.ontrack = (event) => {
    ui.answer.srcObject = event.streams[0] || new MediaStream([event.track]);
  };
  pc.onconnectionstatechange = () => {
    ui.iceState.textContent = pc.connectionState;
    if (pc.connectionState === "connected") setPill(ui.conn, "open", "In a call");
    if (page.call === call && (pc.connectionState === "failed" || pc.connectionState === "closed")) {
      endCall(pc.connectionState === "failed" ? "The connection was lost." : "");
    }
  };
  channel.onopen = () => {
    send({ type: "session.update", session: SESSION });
    setPill(ui.state, "idle", "Listening: just speak");
  };
  channel.onmessage = (event) => onEvent(JSON.parse(event.data));
  channel.onclose = () => {
    if (page.call === call) endCall("");
  };
  try {
    // The offer goes before any candidate is gathered: the server learns this browser's address
    // from its connectivity checks.
    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    const response = await fetch(CALLS, {
      method: "POST",
      body: offer.sdp,
      headers: { "Content-Type": "application/sdp", ...authHeaders() },
    });
    if (response.status !== 201) throw new Error(await refusal(response));
    call.id = (response.headers.get("Location") || "").split("/").pop() || null;
    ui.callId.textContent = call.id || "–";
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    ui.hangup.disabled = false;
  } catch (err) {
    endCall(`The call could not start: ${errorText(err)}`);
  }
}

/** @param {object} event */
function send(event) {
  const call = page.call;
  if (call && call.channel.readyState === "open") call.channel.send(JSON.stringify(event));
}

/** The camera's picture now, as a conversation item (a JPEG data URL; the server downloads nothing). */
function sendPicture() {
  const video = ui.preview;
  if (!ui.sendCamera.checked || !video.srcObject || !video.videoWidth) return;
  const canvas = page.canvas;
  const context = canvas.getContext("2d");
  if (!context) return;
  const width = Math.min(IMAGE_WIDTH, video.videoWidth);
  canvas.width = width;
  canvas.height = Math.round((video.videoHeight * width) / video.videoWidth);
  context.drawImage(video, 0, 0, canvas.width, canvas.height);
  const content = [{ type: "input_image", image_url: canvas.toDataURL("image/jpeg", IMAGE_QUALITY) }];
  send({ type: "conversation.item.create", item: { type: "message", role: "user", content } });
}

function turn() {
  const li = document.createElement("li");
  li.className = "turn";
  ui.conversation.append(li);
  ui.empty.hidden = true;
  return li;
}

/**
 * A bubble of a turn (the question or the answer); its text element.
 * @param {HTMLElement} li
 * @param {"question" | "answer"} kind
 * @param {string} who
 */
function bubble(li, kind, who) {
  const div = document.createElement("div");
  div.className = `bubble ${kind}`;
  const label = document.createElement("span");
  label.className = "who";
  label.textContent = who;
  const text = document.createElement("p");
  text.className = `${kind}-text`;
  div.append(label, text);
  li.append(div);
  ui.conversation.scrollTop = ui.conversation.scrollHeight;
  return text;
}

/** @param {ServerEvent} event */
function onEvent(event) {
  page.events += 1;
  ui.eventCount.dataset.value = String(page.events);
  ui.eventCount.textContent = String(page.events);
  switch (event.type) {
    case "input_audio_buffer.speech_started":
      setPill(ui.state, "listening", "You are speaking");
      sendPicture();
      break;
    case "input_audio_buffer.speech_stopped":
      page.turnEndedAt = performance.now();
      setPill(ui.state, "thinking", "Thinking…");
      break;
    case "input_audio_buffer.committed": {
      const text = bubble(turn(), "question", "You");
      text.parentElement?.classList.add("unheard");
      page.questions.set(event.item_id || "", text);
      break;
    }
    case "conversation.item.input_audio_transcription.delta": {
      const text = page.questions.get(event.item_id || "");
      if (text) text.textContent += event.delta || "";
      break;
    }
    case "conversation.item.input_audio_transcription.completed": {
      const text = page.questions.get(event.item_id || "");
      if (text) {
        text.textContent = (event.transcript || "").trim();
        text.parentElement?.classList.remove("unheard");
      }
      break;
    }
    case "response.created": {
      const last = ui.conversation.lastElementChild;
      const li = last instanceof HTMLElement ? last : turn();
      page.answers.set(event.response?.id || "", li);
      bubble(li, "answer", "omniweb");
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta": {
      const text = page.answers.get(event.response_id || "")?.querySelector(".answer-text");
      if (text) text.textContent += event.delta || "";
      break;
    }
    case "response.done": {
      const response = event.response;
      const li = response && page.answers.get(response.id);
      if (li && response.status !== "completed") li.dataset.how = response.status === "cancelled" ? "interrupted" : "failed";
      break;
    }
    case "output_audio_buffer.started":
      setAudio("playing");
      setPill(ui.state, "speaking", "Answering");
      if (page.turnEndedAt !== null) {
        ui.firstAudio.textContent = `${Math.round(performance.now() - page.turnEndedAt)} ms`;
        page.turnEndedAt = null;
      }
      break;
    case "output_audio_buffer.stopped":
      setAudio("idle");
      setPill(ui.state, "idle", "Listening: just speak");
      break;
    case "output_audio_buffer.cleared": {
      setAudio("idle");
      const li = page.answers.get(event.response_id || "");
      if (li) li.dataset.how = "interrupted";
      break;
    }
    case "error":
      showError(event.error?.message || "The server reported an error");
      break;
    default:
      break;
  }
}

/** @param {string} message */
function endCall(message) {
  const ending = page.call;
  page.call = null;
  if (ending) {
    ending.channel.onclose = null;
    ending.pc.onconnectionstatechange = null;
    ending.pc.close();
    for (const track of ending.stream.getTracks()) track.stop();
  }
  ui.preview.srcObject = null;
  ui.answer.srcObject = null;
  ui.placeholder.hidden = false;
  ui.badge.dataset.live = "false";
  ui.badge.textContent = "Camera off";
  ui.start.disabled = false;
  ui.hangup.disabled = true;
  ui.iceState.textContent = "closed";
  setAudio("idle");
  setPill(ui.conn, "closed", "Call ended");
  setPill(ui.state, "idle", "Start a call to talk");
  if (message) showError(message);
}

async function hangUp() {
  const ending = page.call;
  if (!ending) return;
  ui.hangup.disabled = true;
  if (ending.id) {
    try {
      await fetch(`${CALLS}/${encodeURIComponent(ending.id)}/hangup`, { method: "POST", headers: authHeaders() });
    } catch {
      // the call ends here whatever the server said
    }
  }
  endCall("");
}

ui.start.addEventListener("click", startCall);
ui.hangup.addEventListener("click", hangUp);
window.addEventListener("pagehide", hangUp);
