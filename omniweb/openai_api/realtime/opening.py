"""What a Realtime session opens with: its voices, its effective session and the core it runs on.

The URL's query picks the session: ``model`` (echoed back, whichever it names) and ``intent``
(``transcription``: a transcription session); a client secret's configuration picks it instead
(``session_from_config``: ``POST /v1/realtime/client_secrets`` checked it when it was made).
The core is the conversation core's ``Conversation`` with a ``FrameBuffer`` (the images: the video
endpoint's decoding guards, similarity filter and limits) and an ``AudioBuffer`` (the input audio
buffer, PCM16 24 kHz); the items are the history, so the core keeps none. Its ``Listener``
transcribes speech early and, every ``ASR_STREAM_INTERVAL_MS``, streams it (``listened``); the
session's detector is set on it later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings

from omniweb.conversation import (
    AudioBuffer,
    BufferedFrame,
    Conversation,
    EarlyTranscription,
    FrameBuffer,
    History,
    Listener,
)
from omniweb.conversation.listening import FEED_MS, Transcribe
from omniweb.engine.client import EngineClient
from omniweb.media.frames import DEFAULT_FRAME_FILTER_THRESHOLD
from omniweb.openai_api.protocol import voice_table
from omniweb.web.auth import CLIENT_SECRET_SCOPE_KEY

from .audio import SAMPLE_RATE
from .conversation_items import MAX_INPUT_AUDIO_BYTES
from .errors import RealtimeError
from .session import DEFAULT_MODEL, AnySession, new_session, update_session

logger = logging.getLogger(__name__)

MAX_FRAMES = 16  # images kept for the conversation (oldest go first)


def voice_names(voices: Sequence[str], default_voice: str) -> dict[str, str]:
    """Every name a session may use → the local voice: OpenAI's (as /v1/audio/speech maps them) and ours."""
    return voice_table(settings.OPENAI_VOICE_MAP, voices, default_voice) | {v: v for v in voices}


def session_from_query(query_string: bytes, voices: Mapping[str, str]) -> AnySession:
    """The session a client connects to: ``?model=`` (at most 128 characters) and ``?intent=``."""
    query = parse_qs(query_string.decode("latin1"))
    model = (query.get("model") or [DEFAULT_MODEL])[0][:128]
    intents = query.get("intent")
    intent = intents[0] if intents else None  # "transcription": a transcription session
    return new_session(voices, model=model, intent=intent)


def session_for(scope: Mapping[str, Any], voices: Mapping[str, str]) -> AnySession | None:
    """The session a connection opens: its client secret's configuration, else its URL's query.
    None: the secret's configuration no longer opens here (a voice it names was removed since)."""
    secret = scope.get(CLIENT_SECRET_SCOPE_KEY)
    if secret is None:
        return session_from_query(scope.get("query_string", b""), voices)
    try:
        return session_from_config(secret, voices, language_model=settings.THINKER.strip().lower() == "llm")
    except RealtimeError as err:
        logger.warning("a client secret's session cannot be opened: %s", err.message)
        return None


def session_from_config(config: Mapping[str, Any], voices: Mapping[str, str], *, language_model: bool) -> AnySession:
    """The session a client secret's configuration describes (a realtime or a transcription session,
    by its ``type``): OpenAI's defaults with the configuration applied as a ``session.update`` would
    apply it. Raises ``RealtimeError`` naming the field (``session.audio.output.voice``, ...)."""
    intent = "transcription" if config.get("type") == "transcription" else None
    return update_session(new_session(voices, intent=intent), config, voices, language_model=language_model)


def new_core(
    engine: EngineClient, *, on_idle: Callable[[], None], on_decode_failed: Callable[[BufferedFrame], None]
) -> Conversation:
    """The session's conversation core: its frame buffer and input audio buffer."""
    core = Conversation(engine, on_idle=on_idle)
    core.configure(
        frames=FrameBuffer(
            max_frames=MAX_FRAMES,
            max_bytes=settings.VIDEO_MAX_BUFFER_BYTES,
            max_pixels=settings.VIDEO_MAX_FRAME_PIXELS,
            # A camera client sends an image every second or so: one that looks like the last one
            # kept is not buffered again (its item still joins the conversation).
            filter_threshold=DEFAULT_FRAME_FILTER_THRESHOLD,
            on_decode_failed=on_decode_failed,
        ),
        audio=AudioBuffer(MAX_INPUT_AUDIO_BYTES, SAMPLE_RATE),  # the input audio buffer
        history=History(0),  # the items are the history
    )
    return core


def new_listener(core: Conversation, listened: Transcribe) -> Listener:
    """The listener over the core's input audio buffer, without a detector yet."""
    assert core.audio is not None
    return Listener(
        None,
        core.audio,
        feed_ms=FEED_MS,
        early=EarlyTranscription(listened, stream_ms=settings.ASR_STREAM_INTERVAL_MS),
    )
