"""``/v1/realtime`` as browsers, phone lines and long-lived agents reach it, against a live daphne with
an API token, each driven by the client that does it in the field:

- client secrets: the official SDK's ``client.realtime.client_secrets.create``, then sessions opened
  with the ``ek_`` as the SDK's API key (``Authorization: Bearer``) and as a browser offers it (the
  ``openai-insecure-api-key.`` subprotocol, with an ``Origin``); forged, expired and revoked ones
  refused;
- ``idle_timeout_ms``: the SDK's connection streaming silence, as a phone line does;
- G.711 (``audio/pcmu``, ``audio/pcma``): a spoken question encoded by FFmpeg (PyAV) into 20 ms
  frames as Twilio's media streams carry it, the answer decoded the same way and understood by
  Whisper;
- the whole conversation: LiveKit's realtime model reconnecting (it replays its conversation in a
  burst of ``conversation.item.create``), and such a burst sent raw with a duplicate item id.

The thinker is the default ``scene`` one; what it was given is read from ``usage``, which counts the
history the turn carried (``omniweb.conversation.usage``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import time
import wave
from collections.abc import Iterator
from typing import Any

import av
import numpy as np
import openai
import pytest
import websockets
from hibari import Hibari
from support.photos import jpeg, photo
from support.realtime import recv, until
from support.servers import live_daphne

from omniweb.conversation.usage import text_tokens as count_text_tokens
from omniweb.openai_api.realtime.client_secrets import verify_client_secret
from omniweb.web import auth

TOKEN = "test-token-for-the-realtime-reach"
QUESTION = "How many people can you see?"
RATE = 24000
WAIT = 180  # seconds: a generous ceiling for any one event on a shared 2-core machine

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with live_daphne(OMNIWEB_API_TOKENS=TOKEN) as url:
        yield url


def ws_url(base: str, path: str = "/v1/realtime") -> str:
    return base.replace("http", "ws", 1) + path


def sdk(base: str, key: str = TOKEN) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=key, base_url=base + "/v1", max_retries=0)


def data_url(name: str = "astronaut") -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg(photo(name))).decode()


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


@pytest.fixture(scope="module")
def spoken() -> bytes:
    """The question in our own voice, PCM16 24 kHz, 0.6 s of silence before and 1.2 s after."""
    wave_ = Hibari()(QUESTION, seed=7).astype(np.float32)
    pcm = (np.clip(wave_, -1, 1) * 32767).astype("<i2")
    silence = np.zeros(RATE * 6 // 10, "<i2")
    return np.concatenate([silence, pcm, silence, silence]).tobytes()


# -- client secrets ------------------------------------------------------------------------------------
async def test_a_client_secret_opens_sessions_with_its_configuration(base: str, settings: Any) -> None:
    client = sdk(base)
    before = int(time.time())
    made = await client.realtime.client_secrets.create(
        session={"type": "realtime", "instructions": "Answer briefly.", "output_modalities": ["text"]},
        expires_after={"anchor": "created_at", "seconds": 120},
    )
    after = int(time.time())
    await client.close()
    assert made.value.startswith("ek_") and before + 120 <= made.expires_at <= after + 120
    assert made.session.type == "realtime" and made.session.output_modalities == ["text"]
    assert made.session.instructions == "Answer briefly."
    # Signed, not kept: this process, which never saw it made, reads it with the same API token.
    settings.API_TOKENS = [TOKEN]
    assert verify_client_secret(made.value) == {
        "type": "realtime",
        "instructions": "Answer briefly.",
        "output_modalities": ["text"],
    }
    browser = sdk(base, made.value)  # the ek_ where the API key goes: Authorization: Bearer ek_...
    for _ in range(2):  # a secret opens sessions until it expires
        async with browser.realtime.connect(model="gpt-realtime") as conn:
            created = await recv(conn)
            assert created.type == "session.created"
            assert created.session.output_modalities == ["text"] and created.session.instructions == "Answer briefly."
            image = {"type": "input_image", "image_url": data_url()}
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [image]})
            text = {"type": "input_text", "text": QUESTION}
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [text]})
            await conn.response.create()
            events = await until(conn, "response.done", WAIT)
            assert [e for e in events if e.type == "error"] == []
            assert events[-1].response.status == "completed"
            assert "person" in events[-1].response.output[0].content[0].text.lower()
    await browser.close()


async def test_a_browser_offers_a_client_secret_as_a_subprotocol(base: str) -> None:
    client = sdk(base)
    made = await client.realtime.client_secrets.create(
        session={
            "type": "transcription",
            "audio": {"input": {"format": {"type": "audio/pcmu"}, "transcription": {"model": "whisper-1"}}},
        }
    )
    await client.close()
    assert made.session.type == "transcription"
    offered = ["realtime", "openai-insecure-api-key." + made.value]
    async with websockets.connect(ws_url(base), subprotocols=offered, origin=base, max_size=None) as ws:  # type: ignore[arg-type]
        assert ws.subprotocol == "realtime"  # the secret is never echoed
        created = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
        assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
        assert created["session"]["audio"]["input"]["format"] == {"type": "audio/pcmu"}


@pytest.mark.parametrize("how", ["bearer", "subprotocol"])
async def test_forged_expired_and_revoked_client_secrets_are_refused(base: str, how: str) -> None:
    client = sdk(base)
    made = await client.realtime.client_secrets.create(session={"type": "realtime"})
    good = made.value
    forged = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    expired = auth.sign_client_secret({"type": "realtime"}, int(time.time()) - 1, TOKEN)
    revoked = auth.sign_client_secret({"type": "realtime"}, int(time.time()) + 600, "a-token-the-server-lacks")
    for secret in (forged, expired, revoked):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            await open_with(base, secret, how)
        assert refused.value.response.status_code == 403  # daphne refuses a WebSocket handshake with 403
    with pytest.raises(websockets.exceptions.InvalidStatus):  # an ek_ opens /v1/realtime only
        await open_with(base, good, how, path="/v1/audio/speech/stream")
    async with await open_with(base, good, how) as ws:  # the good one still opens
        assert json.loads(await asyncio.wait_for(ws.recv(), WAIT))["type"] == "session.created"
    # Making one takes a real API token: not none, not a client secret.
    for key in ("wrong", good):
        with pytest.raises(openai.AuthenticationError):
            await sdk(base, key).realtime.client_secrets.create(session={"type": "realtime"})
    with pytest.raises(openai.BadRequestError) as bad:
        await client.realtime.client_secrets.create(
            session={"type": "realtime", "audio": {"output": {"voice": "nobody"}}}  # type: ignore[typeddict-item]
        )
    assert bad.value.body["param"] == "session.audio.output.voice"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        await client.realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": 5})
    assert bad.value.body["param"] == "expires_after.seconds"  # type: ignore[index]
    await client.close()


async def open_with(base: str, secret: str, how: str, path: str = "/v1/realtime") -> Any:
    if how == "bearer":
        return await websockets.connect(ws_url(base, path), additional_headers={"Authorization": f"Bearer {secret}"})
    offered = ["realtime", "openai-insecure-api-key." + secret]
    return await websockets.connect(ws_url(base, path), subprotocols=offered, origin=base)  # type: ignore[arg-type]


# -- idle timeout --------------------------------------------------------------------------------------
async def stream_silence(conn: Any, fmt: str = "audio/pcm") -> None:
    """A phone line's silence: 20 ms of it every 20 ms, until cancelled."""
    frame = bytes(RATE * 2 // 50) if fmt == "audio/pcm" else g711(bytes(RATE * 2 // 50), fmt)
    chunk = base64.b64encode(frame).decode()
    while True:
        await conn.input_audio_buffer.append(audio=chunk)
        await asyncio.sleep(0.02)


async def test_idle_timeout_commits_the_silence_and_the_response_completes(base: str) -> None:
    client = sdk(base)
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await recv(conn)
        image = {"type": "input_image", "image_url": data_url()}
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [image]})
        await until(conn, "conversation.item.done", WAIT)
        vad = {"type": "server_vad", "idle_timeout_ms": 1500}
        await conn.session.update(
            session={"type": "realtime", "output_modalities": ["text"], "audio": {"input": {"turn_detection": vad}}}
        )
        updated = (await until(conn, "session.updated", WAIT))[-1]
        assert updated.session.audio.input.turn_detection.idle_timeout_ms == 1500
        line = asyncio.create_task(stream_silence(conn))
        try:
            first = await until(conn, "response.done", WAIT)
            second = await until(conn, "input_audio_buffer.timeout_triggered", WAIT)  # once the answer is done
        finally:
            line.cancel()
    await client.close()
    types = [e.type for e in first]
    assert "error" not in types and "input_audio_buffer.speech_started" not in types
    fired = next(e for e in first if e.type == "input_audio_buffer.timeout_triggered")
    committed = next(e for e in first if e.type == "input_audio_buffer.committed")
    assert committed.item_id == fired.item_id and 0 <= fired.audio_start_ms <= fired.audio_end_ms
    assert types.index("input_audio_buffer.timeout_triggered") < types.index("input_audio_buffer.committed")
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
    done = first[-1].response
    assert done.status == "completed" and done.output[0].content[0].text  # it answers from the conversation
    assert second[-1].audio_start_ms >= fired.audio_end_ms  # the next silence counts after that answer


async def test_idle_timeout_in_a_transcription_session_commits_and_transcribes_the_silence(base: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with websockets.connect(ws_url(base) + "?intent=transcription", additional_headers=headers) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), WAIT))["session"]["type"] == "transcription"
        vad = {"type": "server_vad", "idle_timeout_ms": 1000}
        update = {"type": "transcription", "audio": {"input": {"turn_detection": vad}}}
        await ws.send(json.dumps({"type": "session.update", "session": update}))
        silence = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(960)).decode()})
        events: list[dict[str, Any]] = []

        async def line() -> None:
            while True:
                await ws.send(silence)
                await asyncio.sleep(0.02)

        talking = asyncio.create_task(line())
        try:
            while not events or events[-1]["type"] != "conversation.item.input_audio_transcription.completed":
                events.append(json.loads(await asyncio.wait_for(ws.recv(), WAIT)))
        finally:
            talking.cancel()
    types = [e["type"] for e in events]
    assert "error" not in types and "response.created" not in types  # a transcription session answers nothing
    fired = events[types.index("input_audio_buffer.timeout_triggered")]
    assert types[types.index("input_audio_buffer.timeout_triggered") :][:4] == [
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert events[-1]["item_id"] == fired["item_id"] and events[-1]["transcript"] == ""


async def test_openai_agents_hears_the_idle_timeout_and_the_agent_answers(base: str) -> None:
    from agents import set_tracing_disabled
    from agents.realtime import RealtimeAgent, RealtimeRunner

    set_tracing_disabled(True)  # its trace export goes to api.openai.com
    agent = RealtimeAgent(name="Assistant", instructions="Keep the caller talking.")
    vad = {"type": "server_vad", "idle_timeout_ms": 1500}
    runner = RealtimeRunner(agent, config={"model_settings": {"output_modalities": ["text"], "turn_detection": vad}})  # type: ignore[typeddict-item]
    session = await runner.run(model_config={"url": ws_url(base) + "?model=gpt-realtime", "api_key": TOKEN})
    seen: list[str] = []
    errors: list[Any] = []
    async with session:
        async for event in session:
            if event.type == "error" or (event.type == "raw_model_event" and event.data.type == "error"):
                errors.append(event)
            seen.append(event.type)
            if event.type == "agent_end" and "input_audio_timeout_triggered" in seen:
                break
    assert errors == []
    assert "agent_start" in seen[seen.index("input_audio_timeout_triggered") :]  # the agent answered the silence


# -- G.711 ---------------------------------------------------------------------------------------------
MUXERS = {"audio/pcmu": ("mulaw", "pcm_mulaw"), "audio/pcma": ("alaw", "pcm_alaw")}


def g711(pcm24: bytes, fmt: str) -> bytes:
    """PCM16 24 kHz → G.711 8 kHz, by FFmpeg's resampler, encoder and raw muxer (PyAV)."""
    muxer, codec = MUXERS[fmt]
    out = io.BytesIO()
    with av.open(out, "w", format=muxer) as container:
        stream = container.add_stream(codec, rate=8000, layout="mono")
        resampler = av.AudioResampler(format="s16", layout="mono", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm24, "<i2").reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        for resampled in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(resampled):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def g711_wav(data: bytes, fmt: str) -> bytes:
    """G.711 8 kHz → a WAV file of it (PCM16 8 kHz), decoded by FFmpeg's raw demuxer (PyAV)."""
    with av.open(
        io.BytesIO(data), "r", format=MUXERS[fmt][0], options={"sample_rate": "8000", "ch_layout": "mono"}
    ) as c:
        pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(c.streams.audio[0])]).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["audio/pcmu", "audio/pcma"])
async def test_a_phone_call_in_g711_is_heard_and_answered_in_g711(base: str, spoken: bytes, fmt: str) -> None:
    client = sdk(base)
    call = g711(spoken, fmt)
    assert len(call) == len(spoken) // 6  # 8 kHz, a byte a sample
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await recv(conn)
        audio = {
            "input": {"format": {"type": fmt}, "transcription": {"model": "whisper-1", "language": "en"}},
            "output": {"format": {"type": fmt}, "voice": "alloy"},
        }
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"], "audio": audio})
        updated = (await until(conn, "session.updated", WAIT))[-1]
        assert updated.session.audio.input.format.type == fmt and updated.session.audio.output.format.type == fmt
        image = {"type": "input_image", "image_url": data_url()}
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [image]})
        for i in range(0, len(call), 160):  # 20 ms frames, as Twilio's media streams carry them
            await conn.input_audio_buffer.append(audio=base64.b64encode(call[i : i + 160]).decode())
        events = await until(conn, "response.done", WAIT)
    assert [e for e in events if e.type == "error"] == []
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert "people" in words(heard.transcript)
    answer = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    transcript = next(e for e in events if e.type == "response.output_audio_transcript.done").transcript
    done = events[-1].response
    assert done.status == "completed" and len(answer) > 8000  # over a second of 8 kHz answer
    understood = await client.audio.transcriptions.create(
        file=("answer.wav", g711_wav(answer, fmt)), model="whisper-1", language="en"
    )
    await client.close()
    said, heard_back = set(words(transcript)), set(words(understood.text))
    assert len(said & heard_back) >= len(said) // 2, (transcript, understood.text)


# -- the whole conversation ----------------------------------------------------------------------------
def conversation(n: int = 40) -> list[tuple[str, str]]:
    """``n`` alternating items, a long agent conversation's worth, the last one a question."""
    out = []
    for i in range(n):
        role = "user" if (n - 1 - i) % 2 == 0 else "assistant"
        out.append((role, f"Remark number {i} of the long conversation mentions the colour {i * 7 % 13} and a dog."))
    return out


async def test_livekit_reconnect_replays_the_whole_conversation_to_the_thinker(base: str) -> None:
    from livekit.agents import llm, utils
    from livekit.plugins import openai as lk_openai

    said = conversation()
    server: list[dict[str, Any]] = []
    client: list[dict[str, Any]] = []
    errors: list[Any] = []
    reconnected = asyncio.Event()
    async with utils.http_context.open():
        # max_session_duration: the connection is recycled (20 minutes by default; here at once).
        model = lk_openai.realtime.RealtimeModel(
            base_url=base + "/v1", api_key=TOKEN, modalities=["text"], max_session_duration=3
        )
        session = model.session()
        session.on("openai_server_event_received", server.append)
        session.on("openai_client_event_queued", client.append)
        session.on("error", errors.append)
        session.on("session_reconnected", lambda _: reconnected.set())
        try:
            context = llm.ChatContext()
            for role, text in said:
                context.add_message(role=role, content=text)  # type: ignore[arg-type]
            await session.update_chat_ctx(context)  # a 40-item burst; LiveKit fails it unless acked within 5 s
            await asyncio.wait_for(reconnected.wait(), WAIT)  # a new connection, the conversation replayed
            replay = client[-(len(said) + 1) :]
            generation = await asyncio.wait_for(session.generate_reply(), WAIT)
            text = ""
            async for message in generation.message_stream:
                text += "".join([str(piece) async for piece in message.text_stream])
        finally:
            await session.aclose()
    assert errors == []
    assert replay[0]["type"] == "session.update"
    assert [e["type"] for e in replay[1:]] == ["conversation.item.create"] * len(said)
    assert replay[1]["previous_item_id"] == "root"
    assert text
    done = [e for e in server if e["type"] == "response.done"][-1]["response"]
    instructions = next(
        e["session"].get("instructions") or "" for e in reversed(client) if e["type"] == "session.update"
    )
    given = sum(count_text_tokens(t) for _, t in said) + count_text_tokens(instructions)
    assert done["status"] == "completed"
    assert done["usage"]["input_token_details"]["text_tokens"] == given  # all 40 items reached the thinker


async def test_a_replay_burst_is_acked_in_order_and_a_duplicate_id_is_answered_as_such(base: str) -> None:
    said = conversation()
    ids = [f"item_replay_{i:02d}" for i in range(len(said))]
    burst: list[dict[str, Any]] = [
        {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}
    ]
    for i, (role, text) in enumerate(said):
        kind = "input_text" if role == "user" else "output_text"
        item = {"id": ids[i], "type": "message", "role": role, "content": [{"type": kind, "text": text}]}
        previous = "root" if i == 0 else ids[i - 1]
        burst.append(
            {"type": "conversation.item.create", "event_id": f"evt_{i}", "previous_item_id": previous, "item": item}
        )
        if i == 20:  # a reconnecting client sends an unconfirmed item again
            again = {**burst[11], "event_id": "evt_again"}
            burst.append(again)
    burst.append({"type": "response.create"})
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with websockets.connect(ws_url(base), additional_headers=headers, max_size=None) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), WAIT))["type"] == "session.created"
        for event in burst:  # without waiting for any answer
            await ws.send(json.dumps(event))
        events = []
        while not events or events[-1]["type"] != "response.done":
            events.append(json.loads(await asyncio.wait_for(ws.recv(), WAIT)))
    added = [e["item"]["id"] for e in events if e["type"] == "conversation.item.added" and e["item"]["id"] in ids]
    assert added == ids  # each acked once, in order
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert [(e["code"], e["event_id"], e["param"]) for e in errors] == [
        ("item_create_duplicate_item_id", "evt_again", "item.id")
    ]
    done = events[-1]["response"]
    assert done["status"] == "completed"
    assert done["usage"]["input_token_details"]["text_tokens"] == sum(count_text_tokens(t) for _, t in said)
