"""The input audio transcription's wire: what each user item's transcript sends, in order.

While the speech goes on, streaming recognition sends the item's first deltas (``heard``); once the
speech is transcribed (``transcribed``: Whisper's segments), the item's ``input_audio`` part gets its
transcript and the client the rest of it, one delta per segment (or one delta: what streaming had
not sent yet), then ``.completed``. ``InputTranscripts`` keeps what streaming sent for each item; it
sends nothing, so it runs without a socket in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import server_events
from .audio import pcm_ms
from .items import Item


class InputTranscripts:
    """The session's input audio transcripts: the deltas streaming sent for each item so far."""

    def __init__(self) -> None:
        self.streamed: dict[str, str] = {}  # item id → the transcript deltas streaming sent for it

    def heard(self, item_id: str, delta: str) -> list[dict[str, Any]]:
        """More of the speech in progress is certain: the item's next delta."""
        self.streamed[item_id] = self.streamed.get(item_id, "") + delta
        return [server_events.transcription_delta(item_id, delta)]

    def transcribed(self, item: Item, segments: Sequence[str], *, announce: bool) -> list[dict[str, Any]]:
        """The item's transcript, kept in its ``input_audio`` part; with ``announce`` (transcription
        on), the deltas streaming had not sent, then ``.completed``."""
        transcript, deltas = server_events.transcript_deltas(segments)
        streamed = self.streamed.pop(item.id, "")
        if streamed:  # streaming gave out the beginning already: the rest is one delta
            rest = transcript[len(streamed) :] if transcript.startswith(streamed) else ""
            deltas = [rest] if rest else []
        if item.content and item.content[0].get("type") == "input_audio":
            item.content[0]["transcript"] = transcript
        if not announce:
            return []
        return [
            *(server_events.transcription_delta(item.id, delta) for delta in deltas),
            server_events.transcription_completed(item.id, transcript, pcm_ms(item.audio)),
        ]
