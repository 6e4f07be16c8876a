"""Transport for ``/v1/realtime``: OpenAI's Realtime API (GA) over a WebSocket.

One session (``running.RealtimeSession``) per WebSocket; this consumer is its transport. ``receive``
is the socket's single reader (Channels dispatches one message at a time) and hands each message to
the session; the session's events go out as text frames through ``SessionConsumer.send`` (its stall
checks: a client that stops reading fails the session). The session's parts, shared with a WebRTC
call (``webrtc``), are described in ``running``:

- ``opening``: what a connection opens with (the session its URL asks for, the core: frame buffer,
  input audio buffer, ``Listener``).
- ``conversation_items.ConversationItems``: ``conversation.item.*``.
- ``input_audio.InputAudio``: ``input_audio_buffer.*`` and the server VAD's turns;
  ``input_audio.Transcriber``: the user items' transcripts.
- ``responding.Responses``: ``response.create`` / ``.cancel``, each response one core turn written
  by ``responses.ResponseStream``.
"""

from __future__ import annotations

import asyncio
import logging

from omniweb.base.errors import ErrorKind
from omniweb.conversation import Listener
from omniweb.engine.runtime import get_engine_client
from omniweb.engine.voice import voice
from omniweb.web.sessions import SessionConsumer

from .opening import session_for, voice_names
from .running import RealtimeSession

logger = logging.getLogger(__name__)

ENDPOINT = "/v1/realtime"
SUBPROTOCOL = "realtime"  # what OpenAI's browser clients offer next to openai-insecure-api-key.<token>


class RealtimeConsumer(SessionConsumer):
    session: RealtimeSession | None = None

    async def connect(self) -> None:
        # First use may load the models: off the event loop.
        engine = await asyncio.to_thread(get_engine_client)
        caps = voice().capabilities()
        voices = voice_names(caps.voices, caps.default_voice)
        config = session_for(self.scope, voices)  # a client secret's configuration, or the URL's
        if config is None:
            await self.close()  # the handshake is refused
            return
        self.session = RealtimeSession(self, engine, config, voices=voices)
        offered = [str(p) for p in self.scope.get("subprotocols") or []]
        await self.accept(SUBPROTOCOL if SUBPROTOCOL in offered else None)
        await self.session.start()

    @property
    def listener(self) -> Listener:
        """The session's listener (its VAD over the input audio buffer)."""
        assert self.session is not None
        return self.session.listener

    async def disconnect(self, code: int) -> None:
        if self.session is not None:
            await self.session.shutdown()
        logger.info("realtime session closed (code %s)", code)

    # -- the session's transport -------------------------------------------------------------------
    async def send_text(self, text: str) -> None:
        await self.send(text_data=text)

    @property
    def gone(self) -> bool:
        return self.send_stalled or self.client_gone

    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        """A fatal problem (the client stopped reading): error, then close."""
        if self.session is not None:
            await self.session.fail(message, kind)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.session is not None:
            await self.session.receive(text_data if text_data is not None else (bytes_data or b""))
