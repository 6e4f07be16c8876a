"""The conversation of a Realtime session: its items in order, placed as OpenAI places them, with what
the server keeps beside their content (a user's input audio, an answer's word timings).

``conversation.item.truncate`` keeps exactly the words whose audio ended by ``audio_end_ms``, from the
talker's word timings (OpenAI's server cannot place the cut precisely; a choice where OpenAI leaves
room, also in the README's realtime section).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from omniweb.base.protocol import excerpt
from omniweb.conversation.chunks import WordTiming

from .errors import RealtimeError, new_id


@dataclass(eq=False)
class Item:
    """A conversation item: its GA content parts and what the server keeps beside them."""

    id: str
    role: Literal["user", "assistant", "system"]
    content: list[dict[str, Any]]
    status: str = "completed"
    audio: bytes = b""  # a user's input audio (PCM16 24 kHz), for the thinker and retrieve
    words: list[WordTiming] = field(default_factory=list)  # an assistant's audio: word timings
    audio_ms: int = 0  # an assistant's audio length (after a truncate: what was heard)

    def wire(self, *, with_audio: bool = False) -> dict[str, Any]:
        content = []
        for part in self.content:
            part = dict(part)
            if part["type"] == "input_audio" and with_audio and self.audio:
                part["audio"] = base64.b64encode(self.audio).decode("ascii")
            content.append(part)
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "status": self.status,
            "role": self.role,
            "content": content,
        }

    def text(self) -> str:
        """What the item says, for the thinker's history (transcripts of audio parts)."""
        pieces = [part.get("text") or part.get("transcript") or "" for part in self.content]
        return " ".join(p.strip() for p in pieces if p and p.strip())


def truncate_transcript(words: Iterable[WordTiming], audio_end_ms: int) -> str:
    """Exactly the words heard by ``audio_end_ms``: those whose audio had ended."""
    return " ".join(w.word for w in words if w.end_ms <= audio_end_ms)


class Conversation:
    """The session's items in order, with OpenAI's placement rules (``previous_item_id``) and a cap;
    the oldest items go first when it is full."""

    def __init__(self, max_items: int = 200) -> None:
        self.id = new_id("conv")
        self.items: list[Item] = []
        self.max_items = max_items

    def find(self, item_id: str) -> Item | None:
        return next((i for i in self.items if i.id == item_id), None)

    def get(self, item_id: str, param: str = "item_id") -> Item:
        item = self.find(item_id)
        if item is None:
            raise RealtimeError(f"Item with item_id '{excerpt(item_id)}' not found", param=param, code="item_not_found")
        return item

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def check_placement(self, item_id: str | None, previous_item_id: str | None) -> None:
        if item_id is not None and self.find(item_id) is not None:
            raise RealtimeError(
                f"Item with id '{excerpt(item_id)}' already exists", param="item.id", code="item_exists"
            )
        if previous_item_id not in (None, "root"):
            self.get(previous_item_id, "previous_item_id")

    def add(self, item: Item, previous_item_id: str | None = None) -> tuple[str | None, list[Item]]:
        """Place ``item`` (after ``previous_item_id``; ``root`` = first; None = last): the id of the
        item before it, and the items dropped to stay under the cap."""
        self.check_placement(item.id, previous_item_id)
        if previous_item_id == "root":
            index = 0
        elif previous_item_id is None:
            index = len(self.items)
        else:
            index = self.items.index(self.get(previous_item_id, "previous_item_id")) + 1
        self.items.insert(index, item)
        previous = self.items[index - 1].id if index else None
        dropped: list[Item] = []
        while len(self.items) > self.max_items:
            dropped.append(self.items.pop(0 if self.items[0] is not item else 1))
        return previous, dropped

    def previous_of(self, item: Item) -> str | None:
        index = self.items.index(item)
        return self.items[index - 1].id if index else None

    def delete(self, item_id: str) -> Item:
        item = self.get(item_id)
        self.items.remove(item)
        return item

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> Item:
        """Cut an assistant's audio at ``audio_end_ms``; its transcript keeps exactly the words heard."""
        item = self.get(item_id)
        if item.role != "assistant":
            raise RealtimeError("Only assistant messages with audio can be truncated", param="item_id")
        if content_index >= len(item.content) or item.content[content_index]["type"] != "output_audio":
            raise RealtimeError(
                f"content_index {content_index} is not an output_audio part of item '{excerpt(item_id)}'",
                param="content_index",
            )
        if audio_end_ms > item.audio_ms:
            raise RealtimeError(
                f"audio_end_ms {audio_end_ms} is beyond the item's audio ({item.audio_ms} ms)",
                param="audio_end_ms",
            )
        item.words = [w for w in item.words if w.end_ms <= audio_end_ms]
        item.audio_ms = audio_end_ms
        item.content[content_index] = {
            "type": "output_audio",
            "transcript": truncate_transcript(item.words, audio_end_ms),
        }
        return item

    def history(self, before: Item | None = None) -> list[dict[str, str]]:
        """user/assistant turns for the thinker, up to ``before`` (excluded); system items are not here."""
        out = []
        for item in self.items:
            if item is before:
                break
            text = item.text()
            if item.role != "system" and text:
                out.append({"role": item.role, "content": text})
        return out

    def system_text(self) -> str:
        return "\n".join(t for i in self.items if i.role == "system" and (t := i.text()))
