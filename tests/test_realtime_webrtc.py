"""``POST /v1/realtime/calls``: the Realtime API over WebRTC, with real clients against a live daphne.

One server for the module, started the documented way with an API token. The callers are real:
aiortc (``support.webrtc.Caller``: a microphone track speaking our own voice, the ``oai-events``
data channel, the answer track recorded and heard by Whisper), the official SDK's
``client.realtime.calls.create`` / ``.hangup``, and headless Chromium with a plain
``RTCPeerConnection`` that posts its offer before it has gathered a candidate, and the bundled
``/realtime/`` page. Nothing on the path is faked: SDP, ICE, DTLS, SCTP and Opus are the real
stacks' on loopback addresses. The answers come from the scene thinker about a real photo.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from support.page_frames import CHROMIUM, shot
from support.photos import jpeg, photo
from support.servers import live_daphne, redis_stack
from support.webrtc import Caller, heard, said

TOKEN = "test-token-for-webrtc-calls"
QUESTION = "How many people can you see?"
LONG_QUESTION = "Describe everything you can see in the picture."
AUTH = {"Authorization": f"Bearer {TOKEN}"}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with live_daphne(OMNIWEB_API_TOKENS=TOKEN) as url:
        yield url


def engine_state(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:
        return json.loads(resp.read())["engine"]


@pytest.fixture(autouse=True)
def engine_left_idle(base: str) -> Iterator[None]:
    """Every call, answered, interrupted or hung up, leaves the server's engine idle."""
    yield
    deadline = time.monotonic() + 30
    while (state := engine_state(base))["active"] or state["running_steps"]:
        assert time.monotonic() < deadline, f"engine still busy: {state}"
        time.sleep(0.05)


@pytest.fixture
async def caller() -> AsyncIterator[Caller]:
    c = Caller()
    yield c
    await c.close()


async def post_offer(base: str, sdp: str, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as http:
        return await http.post(
            base + "/v1/realtime/calls", content=sdp, headers={"Content-Type": "application/sdp", **AUTH, **headers}
        )


async def start(base: str, caller: Caller) -> str:
    """The raw-SDP way: the offer as ``application/sdp``; the call's id from ``Location``."""
    response = await post_offer(base, await caller.offer())
    assert response.status_code == 201, response.text
    assert response.headers["content-type"].startswith("application/sdp")
    answer = response.text
    assert "a=max-message-size:262144" in answer  # an image item fits on the channel
    assert "opus/48000/2" in answer and "PCMU" not in answer and "PCMA" not in answer  # Opus only
    await caller.answered(answer)
    created = await caller.until("session.created")
    assert created["session"]["type"] == "realtime"
    location = response.headers["location"]
    assert re.fullmatch(r"/v1/realtime/calls/rtc_\w+", location), location
    return location.rsplit("/", 1)[1]


def image_item(name: str = "astronaut") -> dict[str, Any]:
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg(photo(name))).decode()
    content = [{"type": "input_image", "image_url": url}]
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": content}}


async def show(caller: Caller) -> None:
    caller.send(image_item())
    await caller.until("conversation.item.done")


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


# -- a spoken conversation ---------------------------------------------------------------------------
async def test_a_spoken_question_is_answered_on_the_answer_track(base: str, caller: Caller) -> None:
    """The microphone's question ends by the server's VAD; the answer comes as audio on the track
    (what Whisper hears in it is the response's transcript), the events on the data channel: the
    WebSocket's, with output_audio_buffer.started / .stopped around the audio and no audio deltas."""
    await start(base, caller)
    await show(caller)
    caller.mic.say(said(QUESTION))
    done = (await caller.until("response.done"))["response"]
    stopped = await caller.until("output_audio_buffer.stopped")
    types = caller.types()
    assert "response.output_audio.delta" not in types
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "output_audio_buffer.started",
        "response.done",
        "output_audio_buffer.stopped",
    ]
    assert [types.index(t) for t in order] == sorted(types.index(t) for t in order), types
    assert done["status"] == "completed"
    started = caller.of_type("output_audio_buffer.started")
    assert [e["response_id"] for e in started] == [stopped["response_id"]] == [done["id"]]
    transcript = done["output"][0]["content"][0]["transcript"]
    assert "person" in transcript.lower() or "one" in transcript.lower(), transcript
    # The track carried the answer: Whisper hears its words in what arrived between the two events.
    played = caller.recording.pcm(caller.at("output_audio_buffer.started"), caller.at("output_audio_buffer.stopped"))
    said_back = set(words(heard(played)))
    assert len(said_back & set(words(transcript))) >= 0.6 * len(set(words(transcript))), (said_back, transcript)
    # The question went through the same input audio buffer: its item was transcribed.
    question = next(
        e
        for e in caller.of_type("conversation.item.done")
        if e["item"]["role"] == "user" and e["item"]["content"][0]["type"] == "input_audio"
    )
    caller.send({"type": "conversation.item.retrieve", "item_id": question["item"]["id"]})
    retrieved = await caller.until("conversation.item.retrieved")
    assert "people" in (retrieved["item"]["content"][0]["transcript"] or "").lower()


async def test_speaking_over_the_answer_stops_the_track_and_cuts_the_item_to_what_was_played(
    base: str, caller: Caller
) -> None:
    """Barge-in: the answer track goes silent at once (output_audio_buffer.cleared), the item keeps
    what had been played (conversation.item.truncated, its transcript the words heard), and the
    new question is answered."""
    await start(base, caller)
    await show(caller)
    caller.mic.say(said(LONG_QUESTION))
    first = await caller.until("output_audio_buffer.started")
    while caller.recording.loud_ms(caller.at("output_audio_buffer.started")) < 800:  # heard some of it
        await asyncio.sleep(0.02)
    assert not caller.of_type("output_audio_buffer.stopped")
    caller.mic.say(said("How many people are there?"))
    cleared = await caller.until("output_audio_buffer.cleared")
    truncated = await caller.until("conversation.item.truncated")
    assert cleared["response_id"] == first["response_id"]
    assert not [e for e in caller.of_type("output_audio_buffer.stopped") if e["response_id"] == first["response_id"]]
    answer = next(e for e in caller.of_type("response.done") if e["response"]["id"] == first["response_id"])
    item = answer["response"]["output"][0]
    assert truncated["item_id"] == item["id"] and truncated["content_index"] == 0
    # What the item keeps is what the track played: no more than the time it was playing, no less
    # than the sound that arrived.
    started_at, cleared_at = caller.at("output_audio_buffer.started"), caller.at("output_audio_buffer.cleared")
    assert truncated["audio_end_ms"] <= (cleared_at - started_at) * 1000 + 200
    assert caller.recording.loud_ms(started_at, cleared_at) <= truncated["audio_end_ms"] + 100
    # The track went silent: of the old answer, at most what was on the way (the client's jitter
    # buffer holds a few packets) arrived after the cleared event.
    second = await caller.until("output_audio_buffer.started", count=2)
    assert second["response_id"] != first["response_id"]
    assert caller.recording.loud_ms(cleared_at, caller.at("output_audio_buffer.started", 1)) <= 200
    # Its transcript keeps the words heard: a beginning of the full one.
    caller.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    kept = (await caller.until("conversation.item.retrieved", where=lambda e: e["item"]["id"] == item["id"]))["item"]
    full = words(item["content"][0]["transcript"])
    cut = words(kept["content"][0]["transcript"])
    assert cut == full[: len(cut)] and len(cut) < len(full), (cut, full)
    await caller.until("output_audio_buffer.stopped", where=lambda e: e["response_id"] == second["response_id"])


async def test_output_audio_buffer_clear_silences_an_answer_that_is_done(base: str, caller: Caller) -> None:
    """agents-realtime's interrupt over WebRTC: output_audio_buffer.clear while the answer still
    plays (the response is done: the engine writes faster than it is heard): cleared, the item cut."""
    await start(base, caller)
    await show(caller)
    caller.mic.say(said(LONG_QUESTION))
    first = await caller.until("output_audio_buffer.started")
    await caller.until("response.done")
    while caller.recording.loud_ms(caller.at("output_audio_buffer.started")) < 600:
        await asyncio.sleep(0.02)
    assert not caller.of_type("output_audio_buffer.stopped")
    caller.send({"type": "output_audio_buffer.clear", "event_id": "clear_1"})
    cleared = await caller.until("output_audio_buffer.cleared")
    truncated = await caller.until("conversation.item.truncated")
    assert cleared["response_id"] == first["response_id"]
    assert truncated["audio_end_ms"] >= 600 - 100
    assert "error" not in caller.types()
    await asyncio.sleep(0.5)  # were the track still playing, half a second of it would arrive now
    # At most what was on the way: the event overtakes the audio already sent, which waits in the
    # client's jitter buffer (aiortc holds 4 packets of 20 ms before it decodes) and its decoder.
    assert caller.recording.loud_ms(caller.at("output_audio_buffer.cleared")) <= 200
    assert not caller.of_type("output_audio_buffer.stopped")


# -- the official SDK ----------------------------------------------------------------------------------
async def test_the_sdks_calls_create_configures_the_session_and_hangup_ends_the_call(base: str) -> None:
    """``client.realtime.calls.create(sdp=, session=)`` posts OpenAI's multipart form: the session part
    is the call's session; ``calls.hangup`` ends it (the peer's channel closes; the id is gone)."""
    client = openai.AsyncOpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0)
    caller = Caller()
    try:
        session = {
            "type": "realtime",
            "instructions": "Answer briefly.",
            "output_modalities": ["audio"],
            "audio": {"output": {"voice": "ash"}, "input": {"transcription": {"model": "whisper-1"}}},
        }
        raw = await client.realtime.calls.with_raw_response.create(sdp=await caller.offer(), session=session)
        assert raw.status_code == 201
        call_id = raw.headers["location"].rsplit("/", 1)[1]
        answer = raw.parse()
        await caller.answered(answer.text)
        created = (await caller.until("session.created"))["session"]
        assert created["instructions"] == "Answer briefly."
        assert created["audio"]["output"]["voice"] == "ash"
        assert created["audio"]["input"]["transcription"]["model"] == "whisper-1"
        await show(caller)
        caller.mic.say(said(QUESTION))
        heard_question = await caller.until("conversation.item.input_audio_transcription.completed")
        assert "people" in heard_question["transcript"].lower()
        await caller.until("response.done")
        await client.realtime.calls.hangup(call_id)
        await asyncio.wait_for(caller.channel_closed.wait(), 30)
        with pytest.raises(openai.NotFoundError) as gone:
            await client.realtime.calls.hangup(call_id)
        assert gone.value.body["code"] == "call_not_found"
    finally:
        await caller.close()
        await client.close()


async def test_refusals_are_openai_errors(base: str) -> None:
    """What the browser SDK reads: ``{"error": {"message", "type", "code"}}`` with the status."""
    client = openai.AsyncOpenAI(api_key="wrong", base_url=base + "/v1", max_retries=0)
    caller = Caller()
    try:
        offer = await caller.offer()
        with pytest.raises(openai.AuthenticationError):
            await client.realtime.calls.create(sdp=offer)
        forged = client.with_options(api_key="ek_" + "x" * 40)
        with pytest.raises(openai.AuthenticationError) as refused:
            await forged.realtime.calls.create(sdp=offer)
        assert refused.value.body["code"] == "invalid_api_key"
        client = client.with_options(api_key=TOKEN)
        with pytest.raises(openai.BadRequestError) as bad:
            await client.realtime.calls.create(sdp="hello")
        assert bad.value.body["code"] == "invalid_offer" and bad.value.body["type"] == "invalid_request_error"
        with pytest.raises(openai.BadRequestError) as bad:
            await client.realtime.calls.create(sdp=offer, session={"type": "realtime", "output_modalities": ["video"]})
        assert bad.value.body["param"].startswith("session.output_modalities")
        # A data channel alone: no audio to answer on.
        channel_only = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        channel_only.createDataChannel("oai-events")
        try:
            await channel_only.setLocalDescription(await channel_only.createOffer())
            with pytest.raises(openai.BadRequestError) as bad:
                await client.realtime.calls.create(sdp=channel_only.localDescription.sdp)
            assert bad.value.body["code"] == "invalid_offer" and "audio" in bad.value.body["message"]
        finally:
            await channel_only.close()
        response = await post_offer(base, offer, **{"Content-Type": "text/plain"})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "unsupported_content_type"
    finally:
        await caller.close()
        await client.close()


# -- Redis mode --------------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (.ci/run installs it)")
async def test_a_call_is_answered_by_engine_workers_over_redis() -> None:
    """In Redis mode the engine is in ``runworker`` processes: the call's peer, in daphne, is an adapter
    like the WebSocket consumer and its turns go to the workers the same way."""
    with redis_stack() as url, live_daphne(redis_url=url, OMNIWEB_API_TOKENS=TOKEN) as redis_base:
        assert engine_state(redis_base)["mode"] == "redis"
        caller = Caller()
        try:
            await start(redis_base, caller)
            await show(caller)
            caller.mic.say(said(QUESTION))
            done = (await caller.until("response.done"))["response"]
            await caller.until("output_audio_buffer.stopped")
            assert done["status"] == "completed"
            transcript = done["output"][0]["content"][0]["transcript"]
            played = caller.recording.pcm(caller.at("output_audio_buffer.started"))
            said_back = set(words(heard(played)))
            assert len(said_back & set(words(transcript))) >= 0.6 * len(set(words(transcript))), (said_back, transcript)
        finally:
            await caller.close()


# -- Chromium ------------------------------------------------------------------------------------------
# Sync Playwright, after every async test: its module-wide browser holds an event loop in this thread.
CUED_MIC = (Path(__file__).parent / "js" / "cued-microphone.js").read_text()
# Every data channel's messages (with when they arrived) and what the page sent on it.
CHANNEL_LOG = """
(() => {
  window.__received = [];
  window.__sent = [];
  const create = RTCPeerConnection.prototype.createDataChannel;
  RTCPeerConnection.prototype.createDataChannel = function (...args) {
    const channel = create.apply(this, args);
    channel.addEventListener("message", (e) => window.__received.push({ ...JSON.parse(e.data), t: performance.now() }));
    const send = channel.send.bind(channel);
    channel.send = (data) => { window.__sent.push(JSON.parse(data)); send(data); };
    return channel;
  };
})();
"""
# The answer track as the page heard it: 16 kHz samples with the time each block arrived.
RECORD_ANSWER = """
(stream) => {
  window.__heard = [];
  const el = new Audio();
  el.srcObject = stream;
  el.muted = true;  // Chromium feeds a remote track to Web Audio only while an element plays it
  el.play();
  const ctx = new AudioContext({ sampleRate: 16000 });
  const tap = ctx.createScriptProcessor(2048, 1, 1);
  tap.onaudioprocess = (e) =>
    window.__heard.push({ t: performance.now(), data: Array.from(e.inputBuffer.getChannelData(0)) });
  ctx.createMediaStreamSource(stream).connect(tap);
  tap.connect(ctx.destination);
}
"""


def browser_page(browser: Any) -> Any:
    context = browser.new_context(viewport={"width": 1100, "height": 900}, bypass_csp=True)
    pg = context.new_page()
    pg.errors = []
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    pg.add_init_script(CUED_MIC)
    pg.add_init_script(CHANNEL_LOG)
    return pg


def cue(pg: Any, name: str, pcm: bytes) -> None:
    """A clip for the fake microphone (``__say(name)`` plays it), as 24 kHz float samples."""
    samples = (np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0).round(5).tolist()
    pg.evaluate("([name, samples]) => { window.__cues[name] = new Float32Array(samples); }", [name, samples])


def received(pg: Any, kind: str) -> list[dict[str, Any]]:
    return pg.evaluate("(kind) => window.__received.filter((e) => e.type === kind)", kind)


def wait_for_event(pg: Any, kind: str, timeout_ms: int = 120_000) -> dict[str, Any]:
    pg.wait_for_function("(kind) => window.__received.some((e) => e.type === kind)", arg=kind, timeout=timeout_ms)
    return received(pg, kind)[0]


def played_out(pg: Any, since: float) -> bytes:
    """The answer the page's recording heard after ``since`` (a page time), as PCM16 16 kHz, once it has
    played out: sound, then a second of quiet. The browser's jitter buffer decides when it plays (it
    grows with the jitter it has seen), not the events."""
    pg.wait_for_function(
        """(since) => {
          const blocks = window.__heard.filter((x) => x.t >= since);
          const loud = blocks.map((x) => x.data.some((v) => Math.abs(v) > 0.01));
          const last = loud.lastIndexOf(true);
          return last >= 0 && blocks.length - 1 - last >= 8;
        }""",
        arg=since,
        timeout=120_000,
    )
    blocks = pg.evaluate("(since) => window.__heard.filter((x) => x.t >= since).map((x) => x.data)", since)
    wave = np.concatenate([np.asarray(b, np.float32) for b in blocks]) if blocks else np.zeros(0, np.float32)
    return (np.clip(wave, -1, 1) * 32767).astype("<i2").tobytes()


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (/usr/bin/chromium)")
def test_a_browsers_plain_peer_connection_holds_a_spoken_call_with_a_client_secret(browser: Any, base: str) -> None:
    """Chromium's own RTCPeerConnection, as OpenAI's browser quick start writes it: a client secret
    (``ek_``, made with the SDK's ``client_secrets.create``) as the key, the offer posted at once (no
    candidate gathered yet: the server learns the browser from its checks), the fake microphone
    asks; the session is the secret's, and the answer track plays what the response's transcript
    says."""
    server = openai.OpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0)
    secret = server.realtime.client_secrets.create(
        session={"type": "realtime", "instructions": "Answer briefly.", "audio": {"output": {"voice": "ash"}}},
        expires_after={"anchor": "created_at", "seconds": 600},
    ).value
    server.close()
    assert secret.startswith("ek_")
    pg = browser_page(browser)
    try:
        pg.goto(base + "/realtime/")
        cue(pg, "question", said(QUESTION))
        posted = pg.evaluate(
            """async ({ token, record }) => {
              const stream = await navigator.mediaDevices.getUserMedia({ audio: true, video: true });
              const pc = new RTCPeerConnection();
              window.__pc = pc;
              pc.addTrack(stream.getAudioTracks()[0], stream);
              pc.createDataChannel("oai-events");
              pc.ontrack = (e) => eval(record)(e.streams[0]);
              const offer = await pc.createOffer();
              await pc.setLocalDescription(offer);
              const response = await fetch("/v1/realtime/calls", {
                method: "POST", body: offer.sdp,
                headers: { "Content-Type": "application/sdp", Authorization: `Bearer ${token}` },
              });
              const answer = await response.text();
              await pc.setRemoteDescription({ type: "answer", sdp: answer });
              return { status: response.status, candidates: (offer.sdp.match(/a=candidate/g) || []).length };
            }""",
            {"token": secret, "record": RECORD_ANSWER},
        )
        assert posted == {"status": 201, "candidates": 0}
        created = wait_for_event(pg, "session.created")["session"]
        assert created["instructions"] == "Answer briefly." and created["audio"]["output"]["voice"] == "ash"
        pg.evaluate("() => __say('question')")
        done = wait_for_event(pg, "response.done")["response"]
        stopped = wait_for_event(pg, "output_audio_buffer.stopped")
        started = wait_for_event(pg, "output_audio_buffer.started")
        assert done["status"] == "completed" and started["response_id"] == stopped["response_id"] == done["id"]
        assert not received(pg, "response.output_audio.delta")
        transcript = done["output"][0]["content"][0]["transcript"]
        said_back = set(words(heard(played_out(pg, started["t"]), rate=16000)))
        assert len(said_back & set(words(transcript))) >= 0.6 * len(set(words(transcript))), (said_back, transcript)
        assert pg.evaluate("() => window.__pc.connectionState") == "connected"
        assert not pg.errors, pg.errors
    finally:
        pg.context.close()


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (/usr/bin/chromium)")
def test_the_call_page_holds_a_spoken_conversation_with_the_camera(browser: Any, base: str) -> None:
    """/realtime/: Start call opens the camera and microphone and calls; speaking sends the camera's
    picture with the question; the question and the answer appear, the answer plays in the page's
    audio element; Hang up ends the call on the server too."""
    pg = browser_page(browser)
    try:
        pg.goto(f"{base}/realtime/?key={TOKEN}")
        cue(pg, "question", said(QUESTION))
        pg.click("#start")
        pg.wait_for_selector("#conn[data-state='open']", timeout=30_000)
        wait_for_event(pg, "session.updated")  # the page turned input transcription on
        pg.evaluate("() => __say('question')")
        pg.wait_for_selector("#audio-state[data-state='playing']", state="attached", timeout=120_000)
        assert pg.evaluate("() => !document.getElementById('answer').paused")
        pg.wait_for_selector("#audio-state[data-state='idle']", state="attached", timeout=120_000)
        question = pg.wait_for_selector(".turn .question:not(.unheard) .question-text", timeout=60_000)
        assert "people" in question.inner_text().lower()
        answer = pg.inner_text(".turn .answer .answer-text")
        done = wait_for_event(pg, "response.done")["response"]
        assert answer == done["output"][0]["content"][0]["transcript"] and answer
        assert pg.inner_text("#first-audio").endswith(" ms")
        # The camera's picture went with the question, before it, and the server kept it.
        sent = pg.evaluate("() => window.__sent.map((e) => [e.type, e.item ? e.item.content[0].type : null])")
        assert ["conversation.item.create", "input_image"] in sent
        images = [e for e in received(pg, "conversation.item.done") if e["item"]["content"][0]["type"] == "input_image"]
        committed = received(pg, "input_audio_buffer.committed")[0]
        assert images and images[0]["t"] < committed["t"]
        shot(pg, "realtime-call")
        pg.click("#hangup")
        pg.wait_for_selector("#conn[data-state='closed']", timeout=30_000)
        assert not pg.errors, pg.errors
    finally:
        pg.context.close()


AGENTS_BUNDLE = Path(__file__).parent / "js" / "node_modules" / "@openai" / "agents-realtime" / "dist" / "bundle"


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (/usr/bin/chromium)")
@pytest.mark.skipif(
    not AGENTS_BUNDLE.is_dir(),
    reason="@openai/agents-realtime is not installed (npm ci --prefix tests/js, which .ci/run does)",
)
def test_openai_agents_realtime_default_webrtc_transport_holds_a_call_and_interrupts(browser: Any, base: str) -> None:
    """``@openai/agents-realtime`` (its browser bundle, as published) in Chromium: a ``RealtimeSession``
    on its default browser transport (``OpenAIRealtimeWebRTC``, given the fake microphone's stream) with
    an ``ek_`` connects (its session.update acknowledged), hears the spoken question, and its history
    gets the answer the server spoke; ``session.interrupt()`` during the answer sends
    ``output_audio_buffer.clear`` and the server cuts the answer (cleared, truncated)."""
    server = openai.OpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0)
    secret = server.realtime.client_secrets.create(session={"type": "realtime"}).value
    server.close()
    pg = browser_page(browser)
    try:
        pg.route(
            f"{base}/agents-realtime/*",
            lambda route: route.fulfill(
                path=str(AGENTS_BUNDLE / route.request.url.rsplit("/", 1)[1]), content_type="text/javascript"
            ),
        )
        pg.goto(base + "/realtime/")
        cue(pg, "question", said(LONG_QUESTION))
        pg.evaluate(
            """async ({ key, image }) => {
              const { RealtimeAgent, RealtimeSession, OpenAIRealtimeWebRTC } =
                await import("/agents-realtime/openai-realtime-agents.mjs");
              const mediaStream = await navigator.mediaDevices.getUserMedia({ audio: true, video: true });
              const agent = new RealtimeAgent({ name: "Assistant", instructions: "Answer briefly." });
              const session = new RealtimeSession(agent, {
                model: "gpt-realtime",
                transport: new OpenAIRealtimeWebRTC({ mediaStream }),
              });
              window.__agents = { session, history: [], errors: [] };
              session.on("history_updated", (history) => { window.__agents.history = history; });
              session.on("error", (e) => window.__agents.errors.push(String(e.error && e.error.message || e.error)));
              await session.connect({ apiKey: key, url: location.origin + "/v1/realtime/calls" });
              session.transport.sendEvent({ type: "conversation.item.create", item: image });
            }""",
            {"key": secret, "image": image_item()["item"]},
        )
        assert wait_for_event(pg, "session.updated")["session"]["instructions"] == "Answer briefly."
        wait_for_event(pg, "conversation.item.done")
        pg.evaluate("() => __say('question')")
        started = wait_for_event(pg, "output_audio_buffer.started")
        pg.wait_for_timeout(1000)  # a second of the answer is heard, then the user interrupts it
        pg.evaluate("() => window.__agents.session.interrupt()")
        cleared = wait_for_event(pg, "output_audio_buffer.cleared")
        truncated = wait_for_event(pg, "conversation.item.truncated")
        assert cleared["response_id"] == started["response_id"]
        sent = pg.evaluate("() => window.__sent.map((e) => e.type)")
        assert "output_audio_buffer.clear" in sent, sent
        assert not received(pg, "error"), received(pg, "error")
        done = wait_for_event(pg, "response.done")["response"]
        assert truncated["item_id"] == done["output"][0]["id"]
        # The SDK's own history holds the answer as the server kept it.
        pg.wait_for_function(
            """(id) => window.__agents.history.some((i) => i.itemId === id)""", arg=truncated["item_id"], timeout=30_000
        )
        assert pg.evaluate("() => window.__agents.errors") == []
        assert not pg.errors, pg.errors
    finally:
        pg.context.close()


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (/usr/bin/chromium)")
def test_the_call_page_runs_under_its_csp_and_fits_a_phone(browser: Any, base: str) -> None:
    """With the Content-Security-Policy enforced the page's module calls and hangs up (nothing the
    policy blocks; WebRTC is not a fetch), and at 360 px wide it does not scroll sideways."""
    context = browser.new_context(viewport={"width": 360, "height": 740}, is_mobile=True, has_touch=True)
    try:
        pg = context.new_page()
        violations: list[str] = []
        pg.on("console", lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None)
        pg.on("pageerror", lambda exc: violations.append(str(exc)))
        pg.goto(f"{base}/realtime/?key={TOKEN}")
        assert pg.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
        pg.click("#start")
        pg.wait_for_selector("#conn[data-state='open']", timeout=30_000)
        shot(pg, "realtime-phone")
        pg.click("#hangup")
        pg.wait_for_selector("#conn[data-state='closed']", timeout=30_000)
        assert not violations, violations
    finally:
        context.close()
