"""The Realtime API's server events as a test reads them: what the official SDK makes of one
(``sdk_parses``), and a run of them with their generated ids replaced by placeholders numbered by
first appearance (``normalized``: ``<item:1>``, ``<resp:1>``, ``<event:3>``), so a test states which
event names which item, response or conversation, and the audio as ``<base64 N bytes>``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from typing import Any

from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from support.golden import Normalizer

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)


def sdk_parses(payload: dict[str, Any]) -> Any:
    """What the official SDK makes of a server event: its own GA type, field for field."""
    parsed = SERVER_EVENT.validate_python(payload)
    assert parsed.type == payload["type"]
    assert json.loads(json.dumps(payload)) == payload  # plain JSON values only
    return parsed


def normalized(payloads: Iterable[dict[str, Any]], known: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The events with their generated ids as placeholders; ``known`` ids are numbered first (the
    items a test made before the events: ``<item:1>`` is the first of them)."""
    norm = Normalizer()
    for value in known:
        norm.text(value)
    return [norm.value(p) for p in payloads]


async def recv(conn: Any, timeout: float = 60) -> Any:
    """The official SDK realtime connection's next event, within ``timeout`` seconds."""
    return await asyncio.wait_for(conn.recv(), timeout)


async def until(conn: Any, kind: str, timeout: float = 180) -> list[Any]:
    """The SDK connection's events up to and including the first of type ``kind``."""
    events = []
    deadline = time.monotonic() + timeout
    while True:
        event = await recv(conn, max(0.1, deadline - time.monotonic()))
        events.append(event)
        if event.type == kind:
            return events
