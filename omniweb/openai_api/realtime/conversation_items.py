"""The conversation items of a Realtime session: ``conversation.item.*`` over ``items.Conversation``.

What the server keeps beside an item's content costs memory, so a user's input audio is held in the
process budget (``omniweb.base.budget``) while its item is in the conversation; the items over the cap go,
their audio with them. The images of ``input_image`` parts enter the core's ``FrameBuffer``: the
buffer holds them, not the items (its decoding guards and limits, its oldest leave first), and a
response looks at its latest. ``ConversationItems`` writes each event through ``send``; what an item
asks of the rest of the session it asks through callables (``transcribe``: its audio has no transcript
yet; ``stop_writing``: a truncate of the answer still being written), so it runs without a socket.

Besides messages a client adds function calls (``function_call``: a call the model made, replayed)
and functions' outputs (``function_call_output``). An output answers a call already in the
conversation (as OpenAI checks), one output per call; a call's ``call_id`` is its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from omniweb.base import budget as process_budget
from omniweb.base.protocol import excerpt
from omniweb.conversation import BufferedFrame, FrameBuffer, now_ms
from omniweb.media.frames import FrameError

from . import server_events
from .audio import MAX_INPUT_AUDIO_MS, PCM, SAMPLE_RATE, decode_clip
from .errors import RealtimeError, new_id
from .events import (
    AnyItemCreateEvent,
    FunctionCallCreateEvent,
    FunctionCallOutputCreateEvent,
    InputAudio,
    InputImage,
    ItemCreateEvent,
    ItemDeleteEvent,
    ItemRetrieveEvent,
    ItemTruncateEvent,
    image_from_data_url,
)
from .items import Conversation, Item

MAX_ITEMS = 200
MAX_INPUT_AUDIO_BYTES = MAX_INPUT_AUDIO_MS * SAMPLE_RATE * 2 // 1000  # the input audio buffer; one input_audio part

Send = Callable[[dict[str, Any]], Awaitable[None]]


@contextmanager
def for_event(event_id: str | None) -> Iterator[None]:
    """A refusal raised inside answers the client event ``event_id`` (its ``error.event_id``)."""
    try:
        yield
    except RealtimeError as err:
        err.event_id = event_id
        raise


class ConversationItems:
    """The session's items, their audio held in the process budget, their images in ``frames``."""

    def __init__(
        self,
        send: Send,
        frames: FrameBuffer,
        *,
        transcribe: Callable[[Item], None],
        stop_writing: Callable[[str], Awaitable[None]],
        max_items: int = MAX_ITEMS,
        input_format: Callable[[], str] = lambda: PCM,
    ) -> None:
        self.send = send
        self.frames = frames
        self.transcribe = transcribe
        self.stop_writing = stop_writing
        self.input_format = input_format  # the session's: input_audio parts come in it, retrieve answers in it
        self.conversation = Conversation(max_items)

    def add(self, item: Item, previous_item_id: str | None, event_id: str | None) -> None:
        """Place an item, its audio reserved first; the items over the cap go (their audio back)."""
        if item.audio and not process_budget.reserve(len(item.audio)):
            raise RealtimeError(
                process_budget.FULL_MESSAGE, code="server_overloaded", type="server_error", event_id=event_id
            )
        try:
            _, dropped = self.conversation.add(item, previous_item_id)
        except RealtimeError as err:
            process_budget.release(len(item.audio))
            err.event_id = event_id
            raise
        for old in dropped:
            process_budget.release(len(old.audio))

    async def on_create(self, event: AnyItemCreateEvent) -> None:
        """The client's item placed, announced (added, done)."""
        if isinstance(event, ItemCreateEvent):
            await self._create_message(event)
            return
        with for_event(event.event_id):
            self.conversation.check_placement(event.item.id, event.previous_item_id)
            item = self._function_item(event)
        self.add(item, event.previous_item_id, event.event_id)
        previous = self.conversation.previous_of(item)
        await self.send(server_events.item_added(item, previous))
        await self.send(server_events.item_done(item, previous))

    def _function_item(self, event: FunctionCallCreateEvent | FunctionCallOutputCreateEvent) -> Item:
        """A function call (its own ``call_id``, one made when it has none) or a function's output (of a
        call in the conversation that has none yet)."""
        spec = event.item
        item_id = spec.id or new_id("item")
        if isinstance(event, FunctionCallCreateEvent):
            call = event.item
            call_id = call.call_id or new_id("call")
            if self.conversation.function_call(call_id) is not None:
                raise RealtimeError(
                    f"A function_call item with call_id '{excerpt(call_id)}' is already in the conversation",
                    param="item.call_id",
                )
            return Item.function_call(item_id, call_id, call.name, call.arguments)
        output = event.item
        if self.conversation.function_call(output.call_id) is None:
            raise RealtimeError(
                f"No function_call item with call_id '{excerpt(output.call_id)}' in the conversation: "
                "a function_call_output answers a call the conversation holds",
                param="item.call_id",
            )
        if (answered := self.conversation.function_output(output.call_id)) is not None:
            raise RealtimeError(
                f"The function call '{excerpt(output.call_id)}' already has its output (item '{answered.id}'); "
                "delete that item first to replace it",
                param="item.call_id",
            )
        return Item.function_output(item_id, output.call_id, output.output)

    async def _create_message(self, event: ItemCreateEvent) -> None:
        """The client's message, its parts decoded (audio, images into the frame buffer), then placed;
        audio without a transcript is transcribed."""
        spec = event.item
        with for_event(event.event_id):
            self.conversation.check_placement(spec.id, event.previous_item_id)
        item = Item(id=spec.id or new_id("item"), role=spec.role, content=[])
        audio = bytearray()
        for index, part in enumerate(spec.content):
            param = f"item.content[{index}]"
            if part.type == "input_image":
                await self._add_image(item, part, f"{param}.image_url", event.event_id)
                item.content.append({"type": "input_image", "detail": part.detail})
            elif part.type == "input_audio":
                audio += self._part_audio(part, param, event.event_id)
                item.content.append({"type": "input_audio", "transcript": part.transcript})
            else:
                item.content.append(part.model_dump(exclude_none=True))
        item.audio = bytes(audio)
        self.add(item, event.previous_item_id, event.event_id)
        previous = self.conversation.previous_of(item)
        await self.send(server_events.item_added(item, previous))
        await self.send(server_events.item_done(item, previous))
        if item.audio and not item.text():
            self.transcribe(item)

    def _part_audio(self, part: InputAudio, param: str, event_id: str | None) -> bytes:
        """An ``input_audio`` part's PCM (it comes in the session's input format); a part needs its
        audio or its transcript."""
        if part.audio:
            with for_event(event_id):
                return decode_clip(
                    self.input_format(), part.audio, max_bytes=MAX_INPUT_AUDIO_BYTES, param=f"{param}.audio"
                )
        if not part.transcript:
            raise RealtimeError("An input_audio part needs audio or a transcript", param=param, event_id=event_id)
        return b""

    async def _add_image(self, item: Item, part: InputImage, param: str, event_id: str | None) -> None:
        b64 = image_from_data_url(part.image_url, param=param)
        try:
            # The buffer holds the image, not the item: its bytes leave with the buffer's oldest.
            await self.frames.add(b64, received_ms=now_ms(), meta={"item_id": item.id})
        except FrameError as exc:
            raise RealtimeError(exc.message, param=param, code="invalid_image", event_id=event_id) from None

    def decode_failed(self, frame: BufferedFrame) -> RealtimeError | None:
        """An image the decode pool rejected leaves the buffer; the refusal to report (None: it had left)."""
        if not self.frames.remove_failed(frame):
            return None
        item_id = frame.meta.get("item_id")
        return RealtimeError(f"The image of item '{item_id}' could not be decoded", code="invalid_image")

    async def on_delete(self, event: ItemDeleteEvent) -> None:
        with for_event(event.event_id):
            item = self.conversation.delete(event.item_id)
        process_budget.release(len(item.audio))
        await self.send(server_events.item_deleted(item.id))

    async def on_retrieve(self, event: ItemRetrieveEvent) -> None:
        with for_event(event.event_id):
            item = self.conversation.get(event.item_id)
        await self.send(server_events.item_retrieved(item, self.input_format()))

    async def on_truncate(self, event: ItemTruncateEvent) -> None:
        """The client stopped playing an answer: cut it to what was heard (one still being written
        stops first)."""
        await self.stop_writing(event.item_id)
        with for_event(event.event_id):
            self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms)
        await self.send(server_events.item_truncated(event.item_id, event.content_index, event.audio_end_ms))

    def close(self) -> None:
        """The session ended: every item's audio goes back to the process budget."""
        for item in self.conversation.items:
            process_budget.release(len(item.audio))
        self.conversation.items.clear()
