"""A Realtime session's parts as the tests drive them without a socket: ``Wire`` keeps what a part
sends (each event one the official SDK parses), ``session`` is the effective session after a client's
``session.update``, ``refusal`` the ``error`` event a refused event is answered with; PCM16 24 kHz of
a given length, base64 and data URLs, an engine that only records aborts."""

from __future__ import annotations

import base64
from typing import Any

from omniweb.openai_api.protocol import OPENAI_VOICES
from omniweb.openai_api.realtime.errors import RealtimeError, error_event
from omniweb.openai_api.realtime.session import AnySession, new_session, update_session
from support.realtime import normalized, sdk_parses

VOICES = {**dict.fromkeys(OPENAI_VOICES, "heart"), "heart": "heart"}


class Wire:
    """What a part sent, in order."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, payload: dict[str, Any]) -> None:
        sdk_parses(payload)
        self.sent.append(payload)

    def types(self) -> list[str]:
        return [p["type"] for p in self.sent]

    def events(self, *known: str) -> list[dict[str, Any]]:
        """The events sent, their generated ids by relation (``known`` ids first), event ids left out."""
        out = normalized(self.sent, known)
        for event in out:
            event.pop("event_id")
        return out

    def clear(self) -> None:
        self.sent.clear()


def session(voices: dict[str, str] = VOICES, intent: str | None = None, **update: Any) -> AnySession:
    """The effective session once a client sent ``session.update`` with ``update``."""
    return update_session(new_session(voices, intent=intent), update, voices)


def manual(**update: Any) -> AnySession:
    """A session without turn detection (the client commits the input audio itself), then ``update``."""
    return update_session(session(audio={"input": {"turn_detection": None}}), update, VOICES)


def refusal(err: RealtimeError) -> dict[str, Any]:
    """The ``error`` event's ``error`` a refusal is answered with (the SDK parses it)."""
    return sdk_parses(error_event(err)).error.model_dump()


def pcm(ms: int) -> bytes:
    """PCM16 24 kHz mono of ``ms`` milliseconds."""
    return b"\x01\x00" * (24 * ms)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def jpeg_url(data: bytes) -> str:
    return "data:image/jpeg;base64," + b64(data)


class RecordingEngine:
    """An engine that is never asked for anything but aborts, which it records."""

    def __init__(self) -> None:
        self.aborted: list[str] = []

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
