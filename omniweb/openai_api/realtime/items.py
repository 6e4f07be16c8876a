"""The conversation of a Realtime session: its items in order, placed as OpenAI places them, with what
the server keeps beside their content (a user's input audio, an answer's word timings).

Items are messages, function calls and functions' outputs. ``Conversation.history`` is what the
thinker is told of them: user and assistant words, an assistant's function calls (those of one
response in one entry, with its words) and each call's output after it (``HistoryEntry``).

``conversation.item.truncate`` keeps exactly the words whose audio ended by ``audio_end_ms``, from the
talker's word timings (OpenAI's server cannot place the cut precisely; a choice where OpenAI leaves
room, also in the README's realtime section).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from omniweb.base.protocol import excerpt
from omniweb.conversation.chunks import WordTiming
from omniweb.engine.requests import FunctionCall, HistoryEntry, Role

from .audio import PCM, encode_clip
from .errors import RealtimeError, new_id

ItemType = Literal["message", "function_call", "function_call_output"]
# One message of the thinker's history: a plain {"role", "content"} for words alone, a
# ``HistoryEntry`` for an assistant's function calls and a function's output (role "tool").
HistoryMessage = Mapping[str, str] | HistoryEntry


@dataclass(eq=False)
class Item:
    """A conversation item: a message (its GA content parts), a function call or a function's
    output, and what the server keeps beside them."""

    id: str
    role: Literal["user", "assistant", "system"] | None  # None: a function call or output
    content: list[dict[str, Any]]
    status: str = "completed"
    audio: bytes = b""  # a user's input audio (PCM16 24 kHz), for the thinker and retrieve
    words: list[WordTiming] = field(default_factory=list)  # an assistant's audio: word timings
    audio_ms: int = 0  # an assistant's audio length (after a truncate: what was heard)
    type: ItemType = "message"
    call_id: str = ""  # a function call and its output
    name: str = ""  # a function call: the function
    arguments: str = ""  # a function call: JSON text
    output: str = ""  # a function's output
    response_id: str | None = None  # the response that wrote it (None: the client's)

    @classmethod
    def function_call(
        cls,
        item_id: str,
        call_id: str,
        name: str,
        arguments: str,
        *,
        status: str = "completed",
        response_id: str | None = None,
    ) -> Item:
        return cls(
            id=item_id,
            role=None,
            content=[],
            status=status,
            type="function_call",
            call_id=call_id,
            name=name,
            arguments=arguments,
            response_id=response_id,
        )

    @classmethod
    def function_output(cls, item_id: str, call_id: str, output: str) -> Item:
        return cls(id=item_id, role=None, content=[], type="function_call_output", call_id=call_id, output=output)

    def wire(self, *, with_audio: bool = False, audio_format: str = PCM) -> dict[str, Any]:
        """The item as the events carry it; ``with_audio``: a user's input audio too, in
        ``audio_format`` (the session's input format)."""
        if self.type == "function_call":
            return {
                "id": self.id,
                "object": "realtime.item",
                "type": "function_call",
                "status": self.status,
                "name": self.name,
                "call_id": self.call_id,
                "arguments": self.arguments,
            }
        if self.type == "function_call_output":
            return {
                "id": self.id,
                "object": "realtime.item",
                "type": "function_call_output",
                "status": self.status,
                "call_id": self.call_id,
                "output": self.output,
            }
        content = []
        for part in self.content:
            part = dict(part)
            if part["type"] == "input_audio" and with_audio and self.audio:
                part["audio"] = base64.b64encode(encode_clip(audio_format, self.audio)).decode("ascii")
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
                f"Item with id '{excerpt(item_id)}' already exists",
                param="item.id",
                code="item_create_duplicate_item_id",  # OpenAI's code: LiveKit's replay takes it as "already there"
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

    def function_call(self, call_id: str) -> Item | None:
        """The ``function_call`` item of ``call_id``."""
        return next((i for i in self.items if i.type == "function_call" and i.call_id == call_id), None)

    def function_output(self, call_id: str) -> Item | None:
        """The ``function_call_output`` item answering ``call_id``."""
        return next((i for i in self.items if i.type == "function_call_output" and i.call_id == call_id), None)

    def answers_a_call(self) -> bool:
        """The last item is a function's output: a response now answers with it (no new question)."""
        return bool(self.items) and self.items[-1].type == "function_call_output"

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

    def history(self, before: Item | None = None) -> list[HistoryMessage]:
        """The conversation for the thinker, up to ``before`` (excluded); system items are not here.

        Words are ``{"role", "content"}``; a function call is an assistant ``HistoryEntry`` with
        ``calls``: the calls of one response (or consecutive ones of the client's) are one entry,
        with the words that response wrote next to them; an output is a ``tool`` entry. An output
        whose call is not before it (deleted, or placed ahead of it) is left out.
        """
        out: list[HistoryMessage] = []
        last: Item | None = None  # the item behind out[-1]
        for item in self.items:
            if item is before:
                break
            if item.type == "function_call":
                call = FunctionCall(call_id=item.call_id, name=item.name, arguments=item.arguments.strip() or "{}")
                if out and last is not None and _one_turn(last, item):
                    prev = _entry(out[-1])
                    out[-1] = HistoryEntry(role=Role.ASSISTANT, content=prev.content, calls=(*prev.calls, call))
                else:
                    out.append(HistoryEntry(role=Role.ASSISTANT, calls=(call,)))
            elif item.type == "function_call_output":
                out.append(HistoryEntry(role=Role.TOOL, call_id=item.call_id, content=item.output))
            elif item.role != "system" and (text := item.text()):
                if item.role == "assistant" and out and last is not None and _one_turn(last, item):
                    prev = _entry(out[-1])  # the words a response wrote after its calls
                    content = f"{prev.content} {text}" if prev.content else text
                    out[-1] = HistoryEntry(role=Role.ASSISTANT, content=content, calls=prev.calls)
                else:
                    # a message: only calls and outputs (handled above) have no role
                    out.append({"role": cast(str, item.role), "content": text})
            else:
                continue
            last = item
        return without_orphans(out)

    def system_text(self) -> str:
        return "\n".join(t for i in self.items if i.role == "system" and (t := i.text()))


def _entry(message: HistoryMessage) -> HistoryEntry:
    if isinstance(message, HistoryEntry):
        return message
    return HistoryEntry(role=Role(message["role"]), content=message["content"])


def _one_turn(last: Item, item: Item) -> bool:
    """Whether ``item`` joins the assistant entry ``last`` made: a function call after the words or
    calls of the same response (or the client's consecutive ones); words after the calls of the same
    response (the model called, then spoke)."""
    if last.response_id != item.response_id:
        return False
    if item.type == "function_call":
        return last.type == "function_call" or (last.type == "message" and last.role == "assistant")
    return last.type == "function_call" and item.response_id is not None


def without_orphans(history: Sequence[HistoryMessage]) -> list[HistoryMessage]:
    """The history without the functions' outputs whose calls are not before them in it."""
    called: set[str] = set()
    out: list[HistoryMessage] = []
    for message in history:
        if isinstance(message, HistoryEntry):
            if message.role == "tool" and message.call_id not in called:
                continue
            called.update(c.call_id for c in message.calls)
        out.append(message)
    return out
