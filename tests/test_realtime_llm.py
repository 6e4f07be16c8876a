"""``/v1/realtime`` answered by a language model (``OMNIWEB_THINKER=llm``), driven by the official
``openai`` SDK's realtime client against a live daphne.

One server per source of the model (``support.llm.llm_daphne``): SmolLM2-135M embedded in the
engine (xllamacpp), and the same model behind llama.cpp's own HTTP server (``OMNIWEB_LLM_URL``).
Text and spoken questions, instructions, function tools (a whole round trip with the answer spoken
and heard back by the server's own Whisper), a named tool choice and a cancelled long answer. The
model is tiny and answers poorly: the tests check the plumbing, never the answers' quality. Last,
the default scene thinker (no language model) refuses tools and keeps the session as it was.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import time
import urllib.request
import wave
from collections.abc import AsyncIterator, Iterator
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest
from hibari import Hibari
from support.llm import llm_daphne
from support.realtime import recv, until
from support.servers import live_daphne

TOKEN = "test-token-for-the-realtime-llm"
RATE = 24000
CHUNK_MS = 100
QUESTION = "What is the capital of France?"
# What the scene thinker says to a question it cannot answer: never the model's answer.
SCENE_CANNOT = "I can't answer that from what the camera shows"

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city's name."}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Get the current local time in a time zone.",
    "parameters": {
        "type": "object",
        "properties": {"timezone": {"type": "string", "description": "An IANA time zone, e.g. Europe/Paris."}},
        "required": ["timezone"],
        "additionalProperties": False,
    },
}

pytestmark = pytest.mark.timeout(600)  # a server start (models, llama.cpp) on a busy 2-core box, then the test


@pytest.fixture(scope="module", params=["embedded", "http"])
def base(request: pytest.FixtureRequest) -> Iterator[str]:
    """daphne with the llm thinker on SmolLM2, embedded or behind llama.cpp's server."""
    with llm_daphne(request.param, OMNIWEB_API_TOKENS=TOKEN) as url:
        thinker = health(url)["thinker"]
        assert thinker["kind"] == "llm", thinker
        assert thinker["source"] == {"embedded": "embedded", "http": "server"}[request.param], thinker
        yield url


@pytest.fixture(scope="module")
def scene_base() -> Iterator[str]:
    """daphne with the default scene thinker (no language model)."""
    with live_daphne(OMNIWEB_API_TOKENS=TOKEN) as url:
        yield url


def health(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + "/healthz", timeout=10) as resp:
        return json.loads(resp.read())


def wait_engine_idle(base: str, seconds: float = 30) -> None:
    """Until the server's engine has no active request and no running step (fails with its state)."""
    deadline = time.monotonic() + seconds
    while (state := health(base)["engine"])["active"] or state["running_steps"]:
        assert time.monotonic() < deadline, f"engine still busy: {state}"
        time.sleep(0.05)


def metric(base: str, name: str) -> float:
    """A sample of the server's /metrics (Prometheus text) with no labels."""
    request = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        found = re.search(rf"^{name} (\S+)$", resp.read().decode(), re.M)
    assert found, f"{name} is not in /metrics"
    return float(found.group(1))


@pytest.fixture(autouse=True)
def engine_left_idle(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every response, finished or cancelled, leaves the engine of the server the test used idle."""
    bases = [request.getfixturevalue(name) for name in ("base", "scene_base") if name in request.fixturenames]
    yield
    for url in bases:
        wait_engine_idle(url)


@contextlib.asynccontextmanager
async def connected(base: str) -> AsyncIterator[Any]:
    """A realtime session through the SDK, past its ``session.created``."""
    client = openai.AsyncOpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0)
    try:
        async with client.realtime.connect(model="gpt-realtime") as connection:
            created = await recv(connection)
            assert created.type == "session.created", created
            yield connection
    finally:
        await client.close()


@pytest.fixture
async def conn(base: str) -> AsyncIterator[Any]:
    async with connected(base) as connection:
        yield connection


async def configure(conn: Any, **session: Any) -> Any:
    await conn.session.update(session={"type": "realtime", **session})
    updated = await recv(conn)
    assert updated.type == "session.updated", updated
    return updated.session


async def ask_text(conn: Any, text: str) -> None:
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    events = await until(conn, "conversation.item.done")
    assert [e.type for e in events] == ["conversation.item.added", "conversation.item.done"], events


async def respond(conn: Any, **response: Any) -> list[Any]:
    """``response.create`` (with ``response`` fields, if any) and its events up to ``response.done``."""
    await conn.response.create(**({"response": response} if response else {}))
    events = await until(conn, "response.done")
    assert "error" not in [e.type for e in events], [e for e in events if e.type == "error"]
    return events


def text_of(events: list[Any], kind: str) -> str:
    return "".join(e.delta for e in events if e.type == kind)


def words(text: str) -> set[str]:
    """The words of three letters or more, lower case."""
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 3}


def wav(pcm: bytes) -> bytes:
    """PCM16 24 kHz mono as a WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm)
    return out.getvalue()


def manual(**session: Any) -> dict[str, Any]:
    """Session fields with manual turns (no VAD)."""
    return {"audio": {"input": {"turn_detection": None}}, **session}


async def text_answer(base: str, instructions: str) -> Any:
    """QUESTION asked in a fresh text session with ``instructions``; its ``response.done``."""
    async with connected(base) as conn:
        await configure(conn, **manual(output_modalities=["text"], instructions=instructions))
        await ask_text(conn, QUESTION)
        return (await respond(conn))[-1].response


# -- answers -----------------------------------------------------------------------------------------
async def test_a_text_question_is_answered_by_the_model(conn: Any) -> None:
    await configure(conn, **manual(output_modalities=["text"]))
    await ask_text(conn, QUESTION)
    events = await respond(conn)
    types = [e.type for e in events]
    assert types[0] == "response.created" and "response.output_audio.delta" not in types
    assert types[-5:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ], types
    answer = events[-5].text
    assert answer.strip() and SCENE_CANNOT not in answer, answer
    assert text_of(events, "response.output_text.delta") == answer
    done = events[-1].response
    assert done.status == "completed", done
    assert [item.type for item in done.output] == ["message"] and done.output[0].content[0].text == answer
    # the model's own counts: the prompt (default system message, the question) and what it wrote
    assert done.usage.input_token_details.text_tokens > 10, done.usage
    assert done.usage.output_token_details.text_tokens > 0, done.usage


async def test_the_instructions_reach_the_model(base: str) -> None:
    short = "Answer briefly."
    added = (
        " You are a patient geography teacher at a small school by the sea. Your pupils are ten years old,"
        " so use simple words, name the country with its capital, give one fact about the city that a child"
        " would remember, and never answer with more than two sentences. If you do not know, say so plainly."
    )
    few = (await text_answer(base, short)).usage.input_token_details.text_tokens
    many = (await text_answer(base, short + added)).usage.input_token_details.text_tokens
    # every plain English word is at least one token of the model's: most of them must have arrived
    assert many - few >= 0.75 * len(added.split()), (few, many, len(added.split()))


# -- tools -------------------------------------------------------------------------------------------
def the_call(events: list[Any]) -> Any:
    """A response that only called one function: its events in OpenAI's order; the call item."""
    types = [e.type for e in events]
    deltas = types.count("response.function_call_arguments.delta")
    assert deltas >= 1 and types == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        *["response.function_call_arguments.delta"] * deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ], types
    added, done_item, args = events[1], events[-3], events[-4]
    item = done_item.item
    assert added.item.type == item.type == "function_call" and added.item.id == item.id == events[2].item.id
    assert re.fullmatch(r"call_[0-9a-f]{24}", item.call_id), item.call_id
    assert args.item_id == item.id and args.call_id == item.call_id and args.arguments == item.arguments
    assert text_of(events, "response.function_call_arguments.delta") == item.arguments
    assert events[-2].item.id == item.id and events[-2].item.arguments == item.arguments
    response = events[-1].response
    assert response.status == "completed", response
    assert [(o.type, o.id) for o in response.output] == [("function_call", item.id)]  # no message item
    assert response.output[0].arguments == item.arguments and response.output[0].call_id == item.call_id
    return item


async def test_a_function_call_round_trip_ends_in_a_spoken_answer(conn: Any, base: str) -> None:
    session = await configure(conn, **manual(output_modalities=["audio"], tools=[WEATHER], tool_choice="required"))
    assert [t.name for t in session.tools] == ["get_weather"] and session.tool_choice == "required"
    await ask_text(conn, "What is the weather like in Paris today?")
    call = the_call(await respond(conn))
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])

    output = json.dumps({"city": "Paris", "sky": "sunny", "temperature_celsius": 21})
    await conn.conversation.item.create(
        item={"type": "function_call_output", "call_id": call.call_id, "output": output}
    )
    created = await until(conn, "conversation.item.done")
    assert [e.type for e in created] == ["conversation.item.added", "conversation.item.done"], created
    assert created[-1].item.type == "function_call_output" and created[-1].item.call_id == call.call_id

    events = await respond(conn, tool_choice="none")
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" not in types, types
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert len(audio) > RATE // 2, len(audio)  # over a quarter of a second of answer
    transcript = next(e for e in events if e.type == "response.output_audio_transcript.done").transcript
    assert transcript.strip() and text_of(events, "response.output_audio_transcript.delta") == transcript
    done = events[-1].response
    assert done.status == "completed", done
    assert [o.type for o in done.output] == ["message"] and done.output[0].content[0].transcript == transcript
    assert done.usage.input_token_details.text_tokens > 10 and done.usage.output_token_details.audio_tokens > 0

    # What is heard is what is written: the server's own Whisper on the answer's audio.
    client = openai.AsyncOpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0)
    try:
        heard = await client.audio.transcriptions.create(
            model="whisper-1", file=("answer.wav", wav(audio)), language="en"
        )
    finally:
        await client.close()
    # SmolLM2-135M sometimes answers a tool's output with a degenerate string ("A: A: A: ..."; once in
    # a full CI run): the plumbing under test is that what is heard is what was written, whatever it is.
    written = words(transcript) or letters(transcript)
    assert written, transcript
    share = len(written & (words(heard.text) | letters(heard.text))) / len(written)
    assert share >= 0.5, (transcript, heard.text)


def letters(text: str) -> set[str]:
    """Every run of letters, lower case (for an answer with no word of three letters)."""
    return set(re.findall(r"[a-z]+", text.lower()))


async def test_a_named_tool_choice_calls_that_function(conn: Any) -> None:
    await configure(conn, **manual(output_modalities=["text"], tools=[WEATHER, TIME]))
    await ask_text(conn, "What is the weather like in Paris today?")
    # the question asks for the weather; the choice names the other function
    call = the_call(await respond(conn, tool_choice={"type": "function", "name": "get_time"}))
    assert call.name == "get_time", call
    jsonschema.validate(json.loads(call.arguments), TIME["parameters"])


# -- stopping ----------------------------------------------------------------------------------------
async def test_response_cancel_stops_the_model_mid_answer(conn: Any, base: str) -> None:
    await configure(conn, **manual(output_modalities=["text"], max_output_tokens=4096))
    await ask_text(
        conn, "Write a very long story, at least two thousand words, about a dragon who learns to bake bread."
    )
    await conn.response.create()
    before = await until(conn, "response.output_text.delta")
    assert "response.done" not in [e.type for e in before], before
    await conn.response.cancel()
    events = await until(conn, "response.done", timeout=60)
    assert "error" not in [e.type for e in events], events
    done = events[-1].response
    assert done.status == "cancelled" and done.status_details.reason == "client_cancelled", done
    assert done.output and done.output[0].status == "incomplete", done.output
    wait_engine_idle(base)  # the engine has nothing left to run, and no answer is being generated
    assert metric(base, "omniweb_llm_answers_active") == 0
    # and the session goes on
    await configure(conn, max_output_tokens="inf")
    await ask_text(conn, QUESTION)
    assert (await respond(conn))[-1].response.status == "completed"


# -- speech ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spoken() -> bytes:
    """QUESTION in our own voice, PCM16 24 kHz, with 0.6 s of silence before and 1.2 s after."""
    voice = Hibari()(QUESTION, seed=7).astype(np.float32)
    pcm = (np.clip(voice, -1, 1) * 32767).astype("<i2")
    silence = np.zeros(RATE * 6 // 10, "<i2")
    return np.concatenate([silence, pcm, silence, silence]).tobytes()


async def test_a_spoken_question_is_transcribed_and_answered_by_the_model(conn: Any, spoken: bytes) -> None:
    await configure(
        conn,
        output_modalities=["audio"],
        audio={"input": {"transcription": {"model": "whisper-1", "language": "en"}}, "output": {"voice": "alloy"}},
    )
    step = RATE * 2 * CHUNK_MS // 1000
    for i in range(0, len(spoken), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(spoken[i : i + step]).decode())
    events = await until(conn, "response.done")
    types = [e.type for e in events]
    assert "error" not in types, [e for e in events if e.type == "error"]
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert heard.item_id == committed.item_id and words(heard.transcript) & {"capital", "france"}, heard
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
    assert any(e.type == "response.output_audio.delta" for e in events)
    transcript = next(e for e in events if e.type == "response.output_audio_transcript.done").transcript
    assert transcript.strip() and SCENE_CANNOT not in transcript, transcript
    done = events[-1].response
    assert done.status == "completed" and done.output[-1].content[0].transcript == transcript, done
    assert done.usage.input_token_details.text_tokens > 10, done.usage


# -- without a language model ------------------------------------------------------------------------
async def test_the_scene_thinker_refuses_tools_and_keeps_the_session(scene_base: str) -> None:
    async with connected(scene_base) as conn:
        await conn.session.update(
            session={"type": "realtime", "tools": [WEATHER], "instructions": "Call tools."}, event_id="evt_tools"
        )
        refused = await recv(conn)
        assert refused.type == "error", refused
        assert "OMNIWEB_THINKER=llm" in refused.error.message and refused.error.event_id == "evt_tools", refused
        assert (refused.error.param or "").startswith("session.tools"), refused.error
        session = await configure(conn, output_modalities=["text"])
        assert not session.tools and session.instructions != "Call tools.", session
