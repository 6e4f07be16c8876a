"""One session's inbox: the client's messages between the socket's one reader and one processor.

Every WebSocket adapter puts what its reader decodes here instead of queueing it its own way. The
inbox is bounded (messages, bytes, and the process-wide budget through ``hold``), keeps arrival
order, and is read by exactly one processor task (``run``), so a handler that waits on the engine
(a VAD round trip, a frame decode) never blocks the reader:

- an **urgent** message (a cancel, an interrupt) is handled by the reader at once, overtaking
  whatever is queued or being handled;
- the **gate** holds queued messages while the session may not take them (the speech endpoint's
  flushed utterance: what the client writes meanwhile is handled, in order, once it is over);
  ``reopen()`` makes the processor look again;
- ``inline``: a message that finds the inbox empty and the gate open is handled by the reader
  itself, so the socket's own flow control still paces a client that sends faster than it is
  served (the speech endpoint); without it every message goes through the queue, so the processor
  can see what queued up behind the one it handles (``peek``: the video endpoint hears a run of
  queued audio chunks in one VAD call);
- when full, ``deliver`` refuses (``InboxFull``: the session is failed) or, with
  ``InboxLimits.wait``, waits for room (the realtime endpoint: a client may append a long
  recording as fast as it can send it, and is not failed for it).

Pure asyncio: no Channels, no Django.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from omniweb.base.errors import ErrorKind

T = TypeVar("T")


async def _ignore(item: object) -> None:
    """A closed inbox's handler."""


def _shut() -> bool:
    """A closed inbox's gate."""
    return False


class InboxFull(Exception):
    """The inbox cannot take a message: the adapter fails the session with this message and kind."""

    def __init__(self, message: str, kind: ErrorKind) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


@dataclass(frozen=True)
class InboxLimits:
    """Bounds on what waits in an inbox, and what to say when a message would pass them."""

    max_messages: int
    max_bytes: int
    full_message: str = ""  # too many messages or bytes queued (ErrorKind.CLIENT: the client floods)
    budget_message: str = ""  # the process-wide budget refused them (ErrorKind.CAPACITY)
    wait: bool = False  # full: the reader waits for room instead (a message alone always fits)


class Inbox(Generic[T]):
    """A bounded FIFO with one processor; see the module docstring."""

    def __init__(
        self,
        handle: Callable[[T], Awaitable[None]],
        limits: InboxLimits,
        *,
        hold: Callable[[int, bool], bool] | None = None,
        gate: Callable[[], bool] = lambda: True,
        inline: bool = False,
    ) -> None:
        self._handle = handle
        self._limits = limits
        # hold(bytes queued, alone): the process budget's verdict on the bytes waiting here; alone:
        # the message would be the only one (an endpoint may let one message always pass).
        self._hold = hold
        self._gate = gate
        self._inline = inline
        self._queue: collections.deque[tuple[T, int | None]] = collections.deque()  # size None: posted
        self._count = 0  # the client's messages queued (what ``post`` adds is not counted)
        self._bytes = 0
        self._wake = asyncio.Event()
        self._room = asyncio.Event()  # set when a message leaves the queue
        self._busy = False  # a message is being handled (by the processor or, inline, the reader)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[T]:
        """The queued messages, oldest first."""
        return (item for item, _ in self._queue)

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def peek(self) -> T | None:
        """The next message the processor will take, if one is queued."""
        return self._queue[0][0] if self._queue else None

    async def deliver(self, item: T, size: int, *, urgent: bool = False) -> None:
        """The reader's one call per message. Raises ``InboxFull`` when it cannot be kept."""
        if urgent:
            await self._handle(item)
            return
        if self._inline and not self._queue and not self._busy and self._gate():
            self._busy = True
            try:
                await self._handle(item)
            finally:
                self._busy = False
                self._wake.set()  # the handler may have queued work behind a closed gate
            return
        await self._admit(size)
        self._queue.append((item, size))
        self._wake.set()

    def post(self, item: T) -> None:
        """A message of the server's own (a decoder's report): queued in order, never refused."""
        self._queue.append((item, None))
        self._wake.set()

    async def _admit(self, size: int) -> None:
        limits = self._limits
        while self._count >= limits.max_messages or self._bytes + size > limits.max_bytes:
            if not limits.wait:
                raise InboxFull(limits.full_message, ErrorKind.CLIENT)
            if not self._count:
                break  # alone it always fits
            self._room.clear()
            await self._room.wait()
        total = self._bytes + size
        if self._hold is not None and not self._hold(total, not self._bytes):
            raise InboxFull(limits.budget_message, ErrorKind.CAPACITY)
        self._count += 1
        self._bytes = total

    def reopen(self) -> None:
        """The gate may have opened: the processor looks again."""
        self._wake.set()

    def clear(self) -> None:
        self._queue.clear()
        self._count = 0
        self._release(self._bytes)
        self._room.set()

    def close(self) -> None:
        """Drop what is queued and the callbacks: they refer to the session, so a closed session is
        freed at once instead of waiting for the cyclic collector."""
        self.clear()
        self._handle = _ignore
        self._hold = None
        self._gate = _shut

    def _release(self, size: int) -> None:
        self._bytes -= size
        if self._hold is not None:
            self._hold(self._bytes, True)

    async def run(self) -> None:
        """The processor: handle queued messages in order while the gate is open, until cancelled."""
        while True:
            while not self._queue or not self._gate() or self._busy:
                self._wake.clear()
                await self._wake.wait()
            item, size = self._queue.popleft()
            if size is not None:
                self._count -= 1
                self._release(size)
                self._room.set()
            self._busy = True
            try:
                await self._handle(item)
            finally:
                self._busy = False
