"""A Realtime session's parts as the tests drive them without a socket: ``Wire`` keeps what a part
sends (each event one the official SDK parses), ``session`` is the effective session after a client's
``session.update``, ``refusal`` the ``error`` event a refused event is answered with; PCM16 24 kHz of
a given length, base64 and data URLs, an engine that only records aborts, and ``ScriptedResponses``:
a session's items and responses wired as its consumer wires them, over scripted turns."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from omniweb.base.errors import ErrorKind
from omniweb.conversation import TurnEvent, TurnSpec
from omniweb.openai_api.protocol import OPENAI_VOICES
from omniweb.openai_api.realtime.conversation_items import ConversationItems
from omniweb.openai_api.realtime.errors import RealtimeError, error_event
from omniweb.openai_api.realtime.events import ResponseCreateEvent
from omniweb.openai_api.realtime.items import Item
from omniweb.openai_api.realtime.opening import new_core
from omniweb.openai_api.realtime.responding import Responses
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


class ScriptedResponses:
    """A session's responses as its consumer wires them, over a core whose turns are scripted:
    each turn yields ``script`` then, when ``endless``, runs until it is stopped."""

    def __init__(
        self, config: AnySession, monkeypatch: pytest.MonkeyPatch, voices: dict[str, str] = VOICES | {"ash": "bella"}
    ) -> None:
        self.config = config
        self.wire = Wire()
        self.engine = RecordingEngine()
        self.refused: list[tuple[str | None, ErrorKind | None]] = []
        self.transcribed: list[tuple[Item, Sequence[str]]] = []
        self.idle = 0
        self.specs: list[TurnSpec] = []
        self.script: list[TurnEvent] = []
        self.endless = False
        self.core = new_core(self.engine, on_idle=lambda: None, on_decode_failed=lambda _: None)  # type: ignore[arg-type]
        assert self.core.frames is not None
        self.items = ConversationItems(
            self.wire.send, self.core.frames, transcribe=lambda item: None, stop_writing=self._stop_writing
        )
        self.responses = Responses(
            self.core,
            self.items,
            self.wire.send,
            self._refuse,
            session=lambda: self.config,
            voices=voices,
            transcribed=self._transcribed,
            stopped=lambda: False,
            on_idle=self._on_idle,
        )
        parts = self

        def run(spec: TurnSpec, engine: Any) -> AsyncIterator[TurnEvent]:
            parts.specs.append(spec)
            return parts._events()

        monkeypatch.setattr(TurnSpec, "run", run)

    async def _events(self) -> AsyncIterator[TurnEvent]:
        for event in self.script:
            yield event
        if self.endless:
            await asyncio.Event().wait()

    async def _stop_writing(self, item_id: str) -> None:
        await self.responses.stop_writing(item_id)

    async def _refuse(self, err: RealtimeError, kind: ErrorKind | None) -> None:
        self.refused.append((err.code, kind))

    async def _transcribed(self, item: Item, segments: Sequence[str]) -> None:
        self.transcribed.append((item, segments))

    def _on_idle(self) -> None:
        self.idle += 1

    def say(self, role: str, text: str, **fields: Any) -> Item:
        kind = "output_text" if role == "assistant" else "input_text"
        item = Item(id=f"item_{len(self.items.conversation.items)}", role=role, content=[{"type": kind, "text": text}])  # type: ignore[arg-type]
        for name, value in fields.items():
            setattr(item, name, value)
        self.items.add(item, None, None)
        return item

    async def create(self, event_id: str | None = None, **response: Any) -> None:
        event = ResponseCreateEvent(type="response.create", response=response or None, event_id=event_id)
        await self.responses.on_create(event)

    async def answered(self) -> list[dict[str, Any]]:
        """Until the response is done: every event sent."""
        while "response.done" not in self.wire.types():
            await asyncio.sleep(0)
        return self.wire.sent

    async def written(self, kind: str) -> None:
        while kind not in self.wire.types():
            await asyncio.sleep(0)
