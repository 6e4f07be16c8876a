"""Transcriptions on the engine: what a recording, or a stretch of a conversation's input audio, said.

``transcribe`` is a recording's (``/v1/audio/transcriptions``): its segments as Whisper decodes them,
then the request's ``End``. ``segment_texts`` is a conversation's own: the realtime session
transcribes its user's speech (the item's transcript, the streaming partials) with the same model.
This is the one place that asks the engine for either.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

from omniweb.engine.client import EngineClient
from omniweb.engine.messages import End, Segment
from omniweb.engine.requests import Priority, TranscribeRequest

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16000  # Whisper's PCM16 mono input
# A recording longer than one Whisper window is not a turn: batch priority, so that the questions of
# live conversations go first (shorter ones are voice agents' turns: someone waits).
BULK_TRANSCRIBE_SECONDS = 30.0


async def transcribe(
    engine: EngineClient,
    pcm16k: bytes,
    *,
    prompt: str | None = None,
    temperature: float = 0.0,
    words: bool = False,
) -> AsyncIterator[Segment | End]:
    """A recording's ``Segment``s (PCM16 16 kHz mono in), as Whisper decodes them, then its ``End``
    (failed: why; ok: the ``duration`` heard). Closing the iterator early aborts the request."""
    bulk = len(pcm16k) > BULK_TRANSCRIBE_SECONDS * SAMPLE_RATE * 2
    request = TranscribeRequest(
        audio=pcm16k,
        prompt=prompt,
        temperature=temperature,
        words=words,
        priority=Priority.BATCH if bulk else Priority.REALTIME,
    )
    async with contextlib.aclosing(engine.stream(request, uuid.uuid4().hex)) as stream:
        async for chunk in stream:
            if isinstance(chunk, Segment | End):
                yield chunk
            if isinstance(chunk, End):
                return


async def segment_texts(
    engine: EngineClient,
    pcm16k: bytes,
    request_id: str,
    *,
    prompt: str | None = None,
    prefix: str | None = None,
    partial: bool = False,
    admit_budget: float | None = None,
) -> list[str] | None:
    """Whisper's segment texts of ``pcm16k`` (PCM16 16 kHz mono); None when the engine refused or failed.

    ``partial``: a streaming partial nobody waits on (batch priority); otherwise the turn's own
    transcript, admitted with ``admit_budget`` (its speaker waits for the answer).
    """
    request = TranscribeRequest(
        audio=pcm16k,
        prompt=prompt,
        timestamps=False,
        prefix=prefix,
        priority=Priority.BATCH if partial else Priority.REALTIME,
        admit_budget=None if partial else admit_budget,
        admitted=True,  # the session's own recognition: part of the work admitted with it
    )
    texts: list[str] = []
    async with contextlib.aclosing(engine.stream(request, request_id)) as stream:
        async for chunk in stream:
            if isinstance(chunk, Segment):
                texts.append(chunk.text)
            elif isinstance(chunk, End) and not chunk.ok:
                logger.warning("transcription ended with %s: %s", chunk.status, chunk.message)
                return None
    return texts
