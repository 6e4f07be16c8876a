"""``/v1/realtime`` driven by the official ``openai`` SDK's realtime client against a live daphne.

One server for the module, started the documented way (``daphne omniweb.asgi:application``) with
an API token. The models are the real ones: questions are spoken by our own voice (24 kHz, padded
with silence), turns are found by Silero VAD on the engine, answers come from the video thinker
about a real photo and are spoken by the talker.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import openai
import pytest
import websockets
from hibari import Hibari
from prometheus_client.parser import text_string_to_metric_families
from support.photos import jpeg, photo
from support.realtime import recv, until
from support.servers import live_daphne

TOKEN = "test-token-for-the-realtime-api"
QUESTION = "How many people can you see?"
RATE = 24000
CHUNK_MS = 100

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with live_daphne(OMNIWEB_API_TOKENS=TOKEN) as url:
        yield url


def engine_state(base: str) -> dict:
    with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:
        return json.loads(resp.read())["engine"]


@pytest.fixture(autouse=True)
def engine_left_idle(base: str) -> Iterator[None]:
    """Every response, finished, cancelled or interrupted, leaves the server's engine idle."""
    yield
    deadline = time.monotonic() + 10
    while (state := engine_state(base))["active"] or state["running_steps"]:
        assert time.monotonic() < deadline, f"engine still busy: {state}"
        time.sleep(0.05)


@pytest.fixture
async def conn(base: str) -> AsyncIterator[Any]:
    client = openai.AsyncOpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0)
    async with client.realtime.connect(model="gpt-realtime") as connection:
        created = await recv(connection)
        assert created.type == "session.created"
        yield connection
    await client.close()


async def expect_error(conn: Any, param: str | None = None, code: str | None = None) -> Any:
    event = await recv(conn, 30)
    assert event.type == "error", event
    if param is not None:
        assert event.error.param == param, event.error
    if code is not None:
        assert event.error.code == code, event.error
    return event.error


async def configure(conn: Any, **session: Any) -> Any:
    await conn.session.update(session={"type": "realtime", **session})
    updated = await recv(conn)
    assert updated.type == "session.updated", updated
    return updated.session


def data_url(name: str = "astronaut") -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg(photo(name))).decode()


async def show(conn: Any, name: str = "astronaut") -> None:
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": data_url(name)}]}
    )
    events = await until(conn, "conversation.item.done")
    assert [e.type for e in events] == ["conversation.item.added", "conversation.item.done"]


async def ask_text(conn: Any, text: str) -> None:
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await until(conn, "conversation.item.done")


@pytest.fixture(scope="module")
def spoken() -> bytes:
    """The question in our own voice, PCM16 24 kHz, with 0.6 s of silence before and 1.2 s after."""
    wave = Hibari()(QUESTION, seed=7).astype(np.float32)
    pcm = (np.clip(wave, -1, 1) * 32767).astype("<i2")
    silence = np.zeros(RATE * 6 // 10, "<i2")
    return np.concatenate([silence, pcm, silence, silence]).tobytes()


async def stream_audio(conn: Any, pcm: bytes, chunk_ms: int = CHUNK_MS) -> None:
    step = RATE * 2 * chunk_ms // 1000
    for i in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + step]).decode())


def text_of(events: list[Any], kind: str) -> str:
    return "".join(e.delta for e in events if e.type == kind)


# -- turns -------------------------------------------------------------------------------------------
async def test_a_text_turn_about_an_image(conn: Any) -> None:
    session = await configure(conn, output_modalities=["text"], instructions="Answer briefly.")
    assert session.output_modalities == ["text"] and session.instructions == "Answer briefly."
    await show(conn)
    await ask_text(conn, QUESTION)
    await conn.response.create()
    events = await until(conn, "response.done")
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert types[-5:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert "error" not in types and "response.output_audio.delta" not in types
    done = events[-1].response
    answer = events[-5].text
    assert answer and text_of(events, "response.output_text.delta") == answer
    assert done.status == "completed" and done.output[0].content[0].text == answer
    assert done.usage.output_tokens > 0 and done.usage.input_token_details.image_tokens > 0
    assert "person" in answer.lower() or "people" in answer.lower() or "one" in answer.lower()


def scrape(base: str) -> dict[str, float]:
    """The server's /metrics samples, by name and labels (``name{label="value"}``)."""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


async def test_a_response_is_timed_in_the_realtime_histograms_not_the_video_ones(conn: Any, base: str) -> None:
    await configure(conn, output_modalities=["audio"], audio={"input": {"turn_detection": None}})
    await show(conn)
    await ask_text(conn, QUESTION)
    before = scrape(base)
    await conn.response.create()
    events = await until(conn, "response.done")
    assert events[-1].response.status == "completed"
    after = scrape(base)
    counted = [
        "omniweb_realtime_first_text_seconds_count",  # the spoken answer's first transcript delta
        "omniweb_realtime_first_audio_seconds_count",
        'omniweb_realtime_response_seconds_count{outcome="ok"}',
    ]
    assert [after[name] - before[name] for name in counted] == [1, 1, 1]
    video = [name for name in after if name.startswith("omniweb_video_") and name.split("{")[0].endswith("_count")]
    assert len(video) == 4 and all(after[name] == before[name] for name in video)


async def test_a_spoken_question_about_an_image_with_server_vad(conn: Any, spoken: bytes) -> None:
    await configure(
        conn,
        output_modalities=["audio"],
        audio={
            "input": {"transcription": {"model": "whisper-1", "language": "en"}},
            "output": {"voice": "alloy"},
        },
    )
    await show(conn)
    await stream_audio(conn, spoken)
    events = await until(conn, "response.done")
    types = [e.type for e in events]
    assert "error" not in types, [e for e in events if e.type == "error"]
    started = next(e for e in events if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e.type == "input_audio_buffer.speech_stopped")
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    assert started.item_id == stopped.item_id == committed.item_id
    # the speech begins after 0.6 s of silence (and the voice's own lead-in); 300 ms of prefix padding
    assert 300 <= started.audio_start_ms < stopped.audio_end_ms <= len(spoken) // 48
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert heard.item_id == committed.item_id and "people" in heard.transcript.lower()
    deltas = [e for e in events if e.type == "conversation.item.input_audio_transcription.delta"]
    assert deltas and all(d.item_id == committed.item_id for d in deltas)  # Whisper's segments, then completed
    assert "".join(d.delta for d in deltas) == heard.transcript
    assert types.index("conversation.item.input_audio_transcription.delta") < types.index(
        "conversation.item.input_audio_transcription.completed"
    )
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert len(audio) > RATE  # over half a second of answer
    transcript = next(e for e in events if e.type == "response.output_audio_transcript.done").transcript
    assert transcript and text_of(events, "response.output_audio_transcript.delta") == transcript
    done = events[-1].response
    assert done.status == "completed" and done.output[0].content[0].transcript == transcript
    assert done.usage.output_token_details.audio_tokens > 0


async def test_manual_turns_commit_and_answer_an_audio_item(conn: Any, spoken: bytes) -> None:
    await configure(conn, output_modalities=["text"], audio={"input": {"turn_detection": None}})
    await stream_audio(conn, spoken)
    await conn.input_audio_buffer.commit()
    events = await until(conn, "conversation.item.done")
    assert [e.type for e in events] == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    await show(conn)  # the image comes after the question: the question is still the spoken one
    committed = events[0].item_id
    await conn.response.create()
    events = await until(conn, "response.done")
    assert events[-1].response.status == "completed"
    assert events[-1].response.output[0].content[0].text
    # transcription is off, so no transcription event, but the response's own Whisper pass filled it in
    assert "conversation.item.input_audio_transcription.completed" not in [e.type for e in events]
    await conn.conversation.item.retrieve(item_id=committed)
    item = (await until(conn, "conversation.item.retrieved"))[-1].item
    assert item.role == "user" and "people" in (item.content[0].transcript or "").lower()
    assert base64.b64decode(item.content[0].audio)  # the committed audio comes back with retrieve


# -- stopping answers --------------------------------------------------------------------------------
async def test_response_cancel_stops_the_answer(conn: Any) -> None:
    await configure(conn, output_modalities=["audio"], audio={"input": {"turn_detection": None}})
    await show(conn)
    await ask_text(conn, "Describe everything you can see in the picture.")
    await conn.response.create()
    await until(conn, "response.output_audio.delta")
    await conn.response.cancel()
    events = await until(conn, "response.done", timeout=10)
    done = events[-1].response
    assert done.status == "cancelled" and done.status_details.reason == "client_cancelled"
    assert done.output[0].status == "incomplete"
    await conn.response.cancel()  # nothing to cancel any more
    await expect_error(conn, code="response_cancel_not_active")


async def test_speaking_over_an_answer_stops_it(conn: Any, spoken: bytes) -> None:
    await configure(conn, output_modalities=["audio"])  # server_vad with interrupt_response by default
    await show(conn)
    await ask_text(conn, "Describe everything you can see in the picture.")
    await conn.response.create()
    await until(conn, "response.output_audio.delta")
    await stream_audio(conn, spoken)
    events = await until(conn, "input_audio_buffer.speech_started")
    events += await until(conn, "response.done", timeout=10)
    types = [e.type for e in events]
    assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
    done = events[-1].response
    assert done.status == "cancelled" and done.status_details.reason == "turn_detected"
    # the spoken question then gets its own answer
    answer = await until(conn, "response.done")
    assert answer[-1].response.status == "completed"


async def test_truncate_keeps_exactly_the_words_heard(conn: Any) -> None:
    await configure(conn, output_modalities=["audio"], audio={"input": {"turn_detection": None}})
    await show(conn)
    await ask_text(conn, "Describe everything you can see in the picture.")
    await conn.response.create()
    events = await until(conn, "response.done")
    item = events[-1].response.output[0]
    full = item.content[0].transcript
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    total_ms = len(audio) // 48
    assert len(full.split()) >= 4, full
    await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=total_ms // 2)
    truncated = await recv(conn)
    assert truncated.type == "conversation.item.truncated" and truncated.audio_end_ms == total_ms // 2
    await conn.conversation.item.retrieve(item_id=item.id)
    heard = (await recv(conn)).item.content[0].transcript
    assert 0 < len(heard.split()) < len(full.split()) and full.startswith(heard)
    await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=total_ms + 1000)
    await expect_error(conn, param="audio_end_ms")


# -- errors: each one answered, the session goes on ----------------------------------------------------
async def test_every_error_case_keeps_the_session(conn: Any) -> None:
    await conn.send_raw("{not json")
    await expect_error(conn, code="invalid_json")
    await conn.send({"type": "session.delete", "event_id": "evt_1"})
    err = await expect_error(conn, param="type", code="invalid_event_type")
    assert err.event_id == "evt_1"
    await conn.send({"type": "input_audio_buffer.append", "audio": "not base64!", "event_id": "evt_2"})
    err = await expect_error(conn, param="audio", code="invalid_base64")
    assert err.event_id == "evt_2"
    await conn.send_raw(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (13 * 1024 * 1024)}))
    await expect_error(conn, code="event_too_large")
    await conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": "nobody"}}})
    await expect_error(conn, param="session.audio.output.voice")
    await conn.session.update(session={"type": "realtime", "audio": {"input": {"format": {"type": "audio/g729"}}}})
    await expect_error(conn, param="session.audio.input.format.type")
    await conn.session.update(session={"type": "realtime", "output_modalities": ["video"]})
    await expect_error(conn, param="session.output_modalities[0]")
    await conn.input_audio_buffer.commit()
    await expect_error(conn, code="input_audio_buffer_commit_empty")
    await conn.response.cancel()
    await expect_error(conn, code="response_cancel_not_active")
    await conn.conversation.item.truncate(item_id="item_missing", content_index=0, audio_end_ms=10)
    await expect_error(conn, param="item_id", code="item_not_found")
    await conn.conversation.item.delete(item_id="item_missing")
    await expect_error(conn, code="item_not_found")
    await conn.conversation.item.retrieve(item_id="item_missing")
    await expect_error(conn, code="item_not_found")
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.jpg"}]}
    )
    await expect_error(conn, param="item.content[0].image_url")
    await conn.conversation.item.create(
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}],
        }
    )
    await expect_error(conn, param="item.content[0].image_url", code="invalid_image")
    await conn.conversation.item.create(
        previous_item_id="item_missing",
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    )
    await expect_error(conn, param="previous_item_id")
    await conn.response.create()  # with no user item: the response fails, cleanly
    events = await until(conn, "response.done")
    assert events[-1].response.status == "failed"
    # a response while one is running
    await configure(conn, output_modalities=["audio"], audio={"input": {"turn_detection": None}})
    await show(conn)
    await ask_text(conn, "Describe everything you can see in the picture.")
    await conn.response.create()
    await until(conn, "response.created")
    await conn.response.create()
    events = await until(conn, "error")
    assert events[-1].error.code == "conversation_already_has_active_response"
    await conn.response.cancel()
    await until(conn, "response.done")
    # and after all that the session still answers
    await configure(conn, output_modalities=["text"])
    await ask_text(conn, QUESTION)
    await conn.response.create()
    assert (await until(conn, "response.done"))[-1].response.status == "completed"


# -- model names ---------------------------------------------------------------------------------------
async def test_openais_realtime_and_transcription_names_are_accepted(base: str) -> None:
    """Frameworks connect with their own default model (dated or not) and transcribe with gpt-transcribe."""
    client = openai.AsyncOpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0)
    async with client.realtime.connect(model="gpt-realtime-mini-2025-10-06") as connection:
        created = await recv(connection)
        assert created.type == "session.created" and created.session.model == "gpt-realtime-mini-2025-10-06"
        transcription = {"model": "gpt-transcribe-2026-01-15", "language": "en"}
        session = await configure(
            connection, model="gpt-4o-realtime-preview", audio={"input": {"transcription": transcription}}
        )
        assert session.model == "gpt-4o-realtime-preview"
        assert session.audio.input.transcription.model == "gpt-transcribe-2026-01-15"
    await client.close()


# -- transcription sessions ---------------------------------------------------------------------------
async def raw_events(ws: Any, kind: str, timeout: float = 60) -> list[dict[str, Any]]:
    """Raw JSON events up to and including the first of type ``kind``."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not events or events[-1]["type"] != kind:
        events.append(json.loads(await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic()))))
    return events


async def test_a_transcription_session_transcribes_each_turn_and_answers_none(base: str, spoken: bytes) -> None:
    """What openai-agents' StreamedAudioInput sends (its defaults: gpt-transcribe, semantic_vad)."""
    url = base.replace("http", "ws", 1) + "/v1/realtime?intent=transcription"
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        created = (await raw_events(ws, "session.created"))[-1]["session"]
        assert created["type"] == "transcription" and created["object"] == "realtime.transcription_session"
        audio_input = {
            "format": {"type": "audio/pcm", "rate": 24000},
            "transcription": {"model": "gpt-transcribe", "languages": ["en"]},
            "turn_detection": {"type": "semantic_vad"},
        }
        await ws.send(
            json.dumps(
                {"type": "session.update", "session": {"type": "transcription", "audio": {"input": audio_input}}}
            )
        )
        updated = (await raw_events(ws, "session.updated"))[-1]["session"]
        assert updated["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
        step = RATE * 2 * CHUNK_MS // 1000
        for i in range(0, len(spoken), step):
            chunk = base64.b64encode(spoken[i : i + step]).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        events = await raw_events(ws, "conversation.item.input_audio_transcription.completed")
        types = [e["type"] for e in events]
        assert "error" not in types, events
        committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
        assert types.index("input_audio_buffer.speech_stopped") < types.index("input_audio_buffer.committed")
        assert events[-1]["item_id"] == committed["item_id"] and "people" in events[-1]["transcript"].lower()
        # Nothing is answered, and asking for an answer is refused with the session kept.
        await ws.send(json.dumps({"type": "response.create", "event_id": "evt-1"}))
        refused = (await raw_events(ws, "error"))[-1]["error"]
        assert refused["code"] == "invalid_event_type" and refused["event_id"] == "evt-1"
        assert "response.created" not in types
        # The end of input as the SDK ends it: a commit of what is left (the trailing silence: an
        # item whose transcript is empty, or refused as too short), then a clear.
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "final"}))
        last = (await raw_events(ws, "input_audio_buffer.committed"))[-1]
        done = (await raw_events(ws, "conversation.item.input_audio_transcription.completed"))[-1]
        assert done["item_id"] == last["item_id"] and not done["transcript"].strip()
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "empty"}))
        empty = (await raw_events(ws, "error"))[-1]["error"]
        assert empty["code"] == "input_audio_buffer_commit_empty" and empty["event_id"] == "empty"
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        assert (await raw_events(ws, "input_audio_buffer.cleared"))[-1]["type"] == "input_audio_buffer.cleared"


async def test_a_transcription_session_streams_the_transcript_while_the_person_speaks(base: str) -> None:
    """Streaming recognition in a transcription session (openai-agents' StreamedAudioInput settings):
    audio appended at a microphone's pace has transcription deltas for the item that speech_started
    named before speech_stopped, and the deltas join to the completed transcript."""
    wave = Hibari()("Please tell me how many people you can see in the room right now.", seed=7)
    pcm = (np.clip(wave.astype(np.float32), -1, 1) * 32767).astype("<i2")
    audio = np.concatenate([np.zeros(RATE // 2, "<i2"), pcm, np.zeros(RATE * 2, "<i2")]).tobytes()
    url = base.replace("http", "ws", 1) + "/v1/realtime?intent=transcription"
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        await raw_events(ws, "session.created")
        audio_input = {
            "transcription": {"model": "gpt-transcribe", "languages": ["en"]},
            "turn_detection": {"type": "semantic_vad"},
        }
        session = {"type": "transcription", "audio": {"input": audio_input}}
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        await raw_events(ws, "session.updated")
        step = RATE * 2 * CHUNK_MS // 1000
        for i in range(0, len(audio), step):  # 100 ms of audio per 100 ms
            await ws.send(
                json.dumps(
                    {"type": "input_audio_buffer.append", "audio": base64.b64encode(audio[i : i + step]).decode()}
                )
            )
            await asyncio.sleep(CHUNK_MS / 1000)
        events = await raw_events(ws, "conversation.item.input_audio_transcription.completed")
    types = [e["type"] for e in events]
    assert "error" not in types, events
    item_id = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")["item_id"]
    stopped = types.index("input_audio_buffer.speech_stopped")
    delta = "conversation.item.input_audio_transcription.delta"
    assert [e["item_id"] for e in events[:stopped] if e["type"] == delta], types  # some, during the speech
    assert all(e["item_id"] == item_id for e in events if e["type"] == delta)
    deltas = "".join(e["delta"] for e in events if e["type"] == delta)
    assert events[-1]["item_id"] == item_id and deltas == events[-1]["transcript"]
    assert {"people", "room"} <= set(re.findall(r"[a-z]+", deltas.lower()))


async def test_a_session_keeps_its_type(conn: Any) -> None:
    await conn.session.update(session={"type": "transcription"})
    error = await expect_error(conn, param="session.type", code="invalid_value")
    assert "intent=transcription" in error.message
    assert (await configure(conn, instructions="Still a conversation.")).instructions == "Still a conversation."


# -- access --------------------------------------------------------------------------------------------
async def test_a_missing_or_wrong_token_is_refused(base: str) -> None:
    client = openai.AsyncOpenAI(api_key="wrong", base_url=base + "/v1", max_retries=0)
    with pytest.raises(websockets.InvalidStatus) as info:
        async with client.realtime.connect(model="gpt-realtime"):
            pass
    assert info.value.response.status_code == 403
    await client.close()


async def test_browsers_send_the_token_as_a_subprotocol(base: str) -> None:
    url = base.replace("http", "ws") + "/v1/realtime?model=gpt-realtime"
    protocols = ["realtime", f"openai-insecure-api-key.{TOKEN}"]
    async with websockets.connect(url, subprotocols=protocols, origin=base) as ws:  # type: ignore[arg-type]
        assert ws.subprotocol == "realtime"
        created = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert created["type"] == "session.created" and created["session"]["model"] == "gpt-realtime"
        request = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert 'omniweb_sessions_open{endpoint="/v1/realtime"} 1.0' in resp.read().decode()
    with pytest.raises(websockets.InvalidStatus):  # a page on another site
        async with websockets.connect(url, subprotocols=protocols, origin="https://evil.example"):  # type: ignore[arg-type]
            pass
