"""A conversation's own transcriptions on the engine: what a stretch of input audio said.

The realtime session transcribes its user's speech (the item's transcript, the streaming partials)
with the model ``/v1/audio/transcriptions`` uses; this is the one place that asks the engine for it.
"""

from __future__ import annotations

import contextlib
import logging

from omniweb.engine.client import EngineClient
from omniweb.engine.messages import End, Segment
from omniweb.engine.requests import Priority, TranscribeRequest

logger = logging.getLogger(__name__)


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
