"""WebSocket sessions as the tests see them: what the server sent (``Transcript``, ``Sentence``,
``Closed``), collecting it (``receive``, ``receive_until``, ``receive_until_done``, ...), and the
speech endpoint's moves (``configure``, ``session``, ``speak``). ``session`` takes the ``connect``
fixture (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from channels.testing import WebsocketCommunicator

SPEECH_PATH = "/v1/audio/speech/stream"
RECEIVE_TIMEOUT = 20.0  # generous: a slow CI box still answers a short flush in well under a second


@dataclass(frozen=True)
class Closed:
    """The server closed the socket (``websocket.close``)."""

    code: int | None


Message = dict[str, Any] | bytes | Closed


@dataclass
class Transcript:
    """What the server sent, in order: JSON messages as dicts, binary frames as bytes."""

    events: list[Message] = field(default_factory=list)

    @property
    def json(self) -> list[dict[str, Any]]:
        return [e for e in self.events if isinstance(e, dict)]

    @property
    def binary(self) -> list[bytes]:
        return [e for e in self.events if isinstance(e, bytes)]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.json if e.get("type") == kind]

    @property
    def types(self) -> list[str]:
        """One label per event: the JSON ``type``, ``"<binary>"`` or ``"<close>"``."""
        out = []
        for e in self.events:
            if isinstance(e, dict):
                out.append(e.get("type", "?"))
            elif isinstance(e, bytes):
                out.append("<binary>")
            else:
                out.append("<close>")
        return out

    @property
    def errors(self) -> list[str]:
        return [e["message"] for e in self.of_type("error")]

    @property
    def closed(self) -> bool:
        return any(isinstance(e, Closed) for e in self.events)

    def sentences(self) -> list[Sentence]:
        """Group the events between each audio.start and its audio.done."""
        out: list[Sentence] = []
        current: Sentence | None = None
        for e in self.events:
            if isinstance(e, dict) and e.get("type") == "audio.start":
                assert current is None, f"audio.start inside an open sentence: {e}"
                current = Sentence(start=e)
            elif isinstance(e, dict) and e.get("type") == "audio.done":
                assert current is not None, f"audio.done without audio.start: {e}"
                current.done = e
                out.append(current)
                current = None
            elif current is not None:
                current.events.append(e)
        assert current is None, "a sentence was left open"
        return out


@dataclass
class Sentence:
    start: dict[str, Any]
    events: list[Message] = field(default_factory=list)
    done: dict[str, Any] | None = None

    @property
    def binary(self) -> list[bytes]:
        return [e for e in self.events if isinstance(e, bytes)]

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if isinstance(e, dict) and e.get("type") == "audio.chunk"]

    @property
    def audio(self) -> bytes:
        return b"".join(self.binary)


async def receive(comm: WebsocketCommunicator, timeout: float = RECEIVE_TIMEOUT) -> Message:
    """The next thing the server sent: a JSON dict, binary bytes, or ``Closed``."""
    out = await comm.receive_output(timeout)
    if out["type"] == "websocket.close":
        return Closed(out.get("code"))
    assert out["type"] == "websocket.send", out
    if out.get("text") is not None:
        return json.loads(out["text"])
    return out["bytes"]


async def receive_until(
    comm: WebsocketCommunicator,
    stop: Callable[[Message], bool],
    timeout: float = RECEIVE_TIMEOUT,
) -> Transcript:
    """Collect messages up to and including the first one for which ``stop`` is true (or a close)."""
    transcript = Transcript()
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        assert remaining > 0, f"timed out; got {transcript.types}"
        msg = await receive(comm, remaining)
        transcript.events.append(msg)
        if isinstance(msg, Closed) or stop(msg):
            return transcript


def is_type(kind: str) -> Callable[[Message], bool]:
    return lambda m: isinstance(m, dict) and m.get("type") == kind


async def receive_until_done(comm: WebsocketCommunicator, timeout: float = RECEIVE_TIMEOUT) -> Transcript:
    """Collect one utterance's messages up to and including its ``session.done``."""
    transcript = await receive_until(comm, is_type("session.done"), timeout)
    assert not transcript.closed, f"socket closed before session.done: {transcript.types} {transcript.errors}"
    return transcript


async def receive_json(comm: WebsocketCommunicator, timeout: float = RECEIVE_TIMEOUT) -> dict[str, Any]:
    msg = await receive(comm, timeout)
    assert isinstance(msg, dict), f"expected a JSON message, got {msg!r:.200}"
    return msg


async def expect_error(comm: WebsocketCommunicator, timeout: float = RECEIVE_TIMEOUT) -> str:
    msg = await receive_json(comm, timeout)
    assert msg["type"] == "error", msg
    return msg["message"]


async def expect_close(comm: WebsocketCommunicator, timeout: float = RECEIVE_TIMEOUT) -> Closed:
    msg = await receive(comm, timeout)
    assert isinstance(msg, Closed), f"expected the socket to close, got {msg!r:.200}"
    return msg


async def expect_silence(comm: WebsocketCommunicator, seconds: float = 0.2) -> None:
    """Nothing more arrives (and the socket stays open) for ``seconds``."""
    assert await comm.receive_nothing(timeout=seconds, interval=0.01)


async def speak(comm: WebsocketCommunicator, text: str | list[str], timeout: float = RECEIVE_TIMEOUT) -> Transcript:
    """Send the text (one or several input.text messages), flush, and collect through session.done."""
    for part in [text] if isinstance(text, str) else text:
        await comm.send_json_to({"type": "input.text", "text": part})
    await comm.send_json_to({"type": "input.done"})
    return await receive_until_done(comm, timeout)


async def configure(comm: WebsocketCommunicator, **fields: Any) -> None:
    """Send a session.config that must be accepted (the server answers a valid config with nothing)."""
    await comm.send_json_to({"type": "session.config", **fields})


async def session(connect: Callable[..., Any], **fields: Any) -> WebsocketCommunicator:
    """A connected socket with a session.config already sent."""
    comm = await connect()
    await configure(comm, **fields)
    return comm
