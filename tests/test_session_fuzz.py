"""Property: whatever a client throws at a session, the server keeps serving valid requests and
leaves no task or engine work behind."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omniweb.asgi import application
from omniweb.engine.runtime import get_engine_client, get_scheduler

PATH = "/v1/audio/speech/stream"
TYPES = ["session.config", "input.text", "input.done", "input.cancel", "session.close", "nonsense", ""]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
valid = st.sampled_from(
    [
        {"type": "session.config"},
        {"type": "session.config", "response_format": "pcm", "stream_audio": True},
        {"type": "session.config", "response_format": "pcm", "stream_audio": True, "word_timestamps": True},
        {"type": "input.text", "text": "Hi there."},
        {"type": "input.text", "text": "Two. Sentences."},
        {"type": "input.done"},
        {"type": "input.cancel"},
    ]
)
field_names = st.sampled_from(
    ["type", "text", "voice", "speaker", "speed", "seed", "response_format", "stream_audio", "word_timestamps",
     "split_granularity", "max_new_tokens", "initial_codec_chunk_frames", "output_mode", "ref_audio", "model"]
)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    msg = dict(draw(valid))
    for _ in range(draw(st.integers(1, 3))):
        if msg and draw(st.booleans()):
            msg.pop(draw(st.sampled_from(sorted(msg))))
        else:
            msg[draw(field_names)] = draw(json_values | st.sampled_from(TYPES))
    return msg


# Hostile JSON (issue #11): integers over Python's digit limit, non-finite numbers, an absurd type.
hostile_literal = st.sampled_from(["9" * 5000, "-" + "1" * 4400, "NaN", "Infinity", "-Infinity", "1e400", "1e308"])


@st.composite
def hostile(draw: st.DrawFn) -> str:
    msg = json.dumps(draw(valid))
    field = draw(st.sampled_from(["seed", "speed", "text", "type", "max_new_tokens"]))
    return msg[:-1] + f', "{field}": {draw(hostile_literal)}}}'


message = st.one_of(
    valid.map(json.dumps),
    mutated().map(json.dumps),
    json_values.map(json.dumps),
    hostile(),
    st.text(max_size=50),
    st.binary(max_size=50),
)


async def fresh_session_works() -> None:
    comm = WebsocketCommunicator(application, PATH)
    connected, _ = await comm.connect()
    assert connected
    await comm.send_json_to({"type": "session.config", "response_format": "pcm"})
    await comm.send_json_to({"type": "input.text", "text": "Still here."})
    await comm.send_json_to({"type": "input.done"})
    while True:
        out = await comm.receive_output(timeout=20)
        if out["type"] == "websocket.send" and out.get("text"):
            msg = json.loads(out["text"])
            if msg["type"] == "session.done":
                assert msg["total_sentences"] == 1
                break
    await comm.disconnect()


def _not_json(name: str) -> None:
    raise AssertionError(f"the server sent {name}, which is not JSON")


async def episode(messages: list[str | bytes]) -> None:
    comm = WebsocketCommunicator(application, PATH)
    connected, _ = await comm.connect()
    assert connected
    for m in messages:  # send_input, not send_to: empty frames are legal on the wire
        key = "bytes" if isinstance(m, bytes) else "text"
        await comm.send_input({"type": "websocket.receive", key: m})
    # Drain for a moment, then leave the way a real client might: mid-whatever.
    # (receive_output cancels the application when it times out, so poll with receive_nothing.)
    closed = False
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline and not closed:
        if await comm.receive_nothing(timeout=0.05):
            continue
        out = await comm.receive_output(timeout=1)
        closed = out["type"] == "websocket.close"
        if out["type"] == "websocket.send" and out.get("text"):
            msg = json.loads(out["text"], parse_constant=_not_json)  # strict: never NaN on the wire
            assert isinstance(msg, dict) and "type" in msg
            if msg["type"] == "error":
                assert "Traceback" not in msg["message"] and len(msg["message"]) < 400
        else:
            assert out["type"] != "websocket.close" or out.get("code") != 1011, "a parse failure crashed the session"
    await comm.disconnect()
    await fresh_session_works()
    # Nothing left behind: no engine request, no running step, no consumer task.
    deadline = time.monotonic() + 3
    while True:
        stats = get_scheduler().stats()
        if stats.active == stats.queued == stats.running_steps == 0:
            break
        assert time.monotonic() < deadline, f"engine work left behind: {stats}"
        await asyncio.sleep(0.02)
    current = asyncio.current_task()
    await asyncio.sleep(0)
    leftovers = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert not leftovers, leftovers


@pytest.fixture(scope="module", autouse=True)
def engine_loaded() -> None:
    """Models load before the first example (a connect waiting on the load would time out)."""
    get_engine_client()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(message, min_size=1, max_size=12))
def test_random_and_mutated_messages_never_break_the_server(messages):
    asyncio.run(episode(messages))
