"""The conversation session: its state machine, buffers, history and the one turn that may run.

A turn is any engine-driven answer: a ``Turn`` names the runner its events come from (``TurnSpec``:
one question about the camera, ``run_turn``; ``SpeechTurn``: text spoken as the client writes it).
It runs as its own task (``start_turn``), so the adapter keeps reading its socket; its events go to
the adapter's ``emit`` one at a time, in order. ``interrupt`` is the one way to stop it early (a
cancel, a newer question, barge-in): the engine request is aborted at once, the event being
emitted (if any) completes, the task is cancelled, and the turn emits nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from omniweb.base.errors import ErrorKind
from omniweb.base.tasks import spawn
from omniweb.engine.client import EngineClient
from omniweb.engine.messages import Status

from .audio import AudioBuffer
from .chunks import TurnEnd
from .frames import BufferedFrame, FrameBuffer
from .history import History

logger = logging.getLogger(__name__)


class ConversationState(enum.Enum):
    AWAITING_CONFIG = "awaiting_config"
    READY = "ready"  # configured; buffering frames and audio
    ANSWERING = "answering"  # a turn streams its answer (frames and audio still buffer)
    SPEAKING = "speaking"  # a turn answers while its input still arrives (speech: pieces before the flush)
    FINISHING = "finishing"  # the client said it is done: the active turn completes, then the session ends
    CLOSED = "closed"


# The moves a session may make; anything else is a bug in the adapter, refused (IllegalTransition).
_MOVES: dict[ConversationState, frozenset[ConversationState]] = {
    ConversationState.AWAITING_CONFIG: frozenset({ConversationState.READY, ConversationState.CLOSED}),
    ConversationState.READY: frozenset(
        {
            ConversationState.READY,  # a new session.config
            ConversationState.ANSWERING,
            ConversationState.SPEAKING,
            ConversationState.FINISHING,
            ConversationState.CLOSED,
        }
    ),
    ConversationState.SPEAKING: frozenset(
        {ConversationState.ANSWERING, ConversationState.READY, ConversationState.FINISHING, ConversationState.CLOSED}
    ),
    ConversationState.ANSWERING: frozenset(
        {ConversationState.READY, ConversationState.FINISHING, ConversationState.CLOSED}
    ),
    ConversationState.FINISHING: frozenset({ConversationState.CLOSED}),
    ConversationState.CLOSED: frozenset({ConversationState.CLOSED}),
}


class IllegalTransition(RuntimeError):
    """An adapter asked the session for a move its state does not allow."""


EventT = TypeVar("EventT")
EventT_co = TypeVar("EventT_co", covariant=True)


class Turn(Protocol[EventT_co]):
    """What ``start_turn`` runs: the runner of one engine-driven answer, whose events are ``EventT_co``s
    (``TurnSpec``: ``TurnEvent``s; ``SpeechTurn``: the engine's chunks)."""

    @property
    def request_id(self) -> str | None:
        """The engine request now open (aborted by ``interrupt``); None between requests."""

    @property
    def frames(self) -> Sequence[BufferedFrame]:
        """The buffered frames the turn looks at (kept decodable while it runs)."""

    def run(self, engine: EngineClient) -> AsyncGenerator[EventT_co, None]:
        """The turn's events, in order; closing it early abandons the engine request."""


@dataclass(eq=False)
class ActiveTurn:
    spec: Turn[Any]
    task: asyncio.Task[None] | None = None
    interrupted: bool = False  # once set, the turn sends nothing more
    emitting: bool = False  # an event is being written: an interrupt lets it complete

    @property
    def request_id(self) -> str | None:
        return self.spec.request_id

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


# The adapter's writer of a turn's events: ``Emit[E | TurnEnd]`` for a ``Turn[E]`` (a turn that fails ends
# with the core's own ``TurnEnd``).
Emit = Callable[[ActiveTurn, EventT], Awaitable[None]]
Ended = Callable[[ActiveTurn], Awaitable[None]]


class Conversation:
    """One session's protocol-neutral core; the adapter owns the socket and the wire format."""

    def __init__(self, engine: EngineClient, *, on_idle: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self._state = ConversationState.AWAITING_CONFIG
        self.frames: FrameBuffer | None = None
        self.audio: AudioBuffer | None = None
        self.history: History | None = None
        self.turn: ActiveTurn | None = None
        self._on_idle = on_idle  # a turn ended (the adapter restarts its idle clock)

    @property
    def state(self) -> ConversationState:
        """Read-only: the state changes only through the methods below, which refuse illegal moves."""
        return self._state

    def _move(self, to: ConversationState) -> None:
        if to not in _MOVES[self._state]:
            raise IllegalTransition(f"{self._state.value} -> {to.value}")
        self._state = to

    def configure(
        self, *, frames: FrameBuffer | None = None, audio: AudioBuffer | None = None, history: History | None = None
    ) -> None:
        """The session is configured: buffers ready (those the endpoint uses), frames decode ahead from now on."""
        self._move(ConversationState.READY)
        self.frames, self.audio, self.history = frames, audio, history
        if frames is not None:
            frames.start()

    @property
    def answering(self) -> bool:
        return self.turn is not None and self.turn.running

    def start_turn(
        self,
        spec: Turn[EventT],
        emit: Emit[EventT | TurnEnd],
        *,
        stopped: Callable[[], bool] = lambda: False,
        ended: Ended | None = None,
        input_open: bool = False,
    ) -> ActiveTurn:
        """Run ``spec`` as the session's turn (interrupt the previous one first).

        ``stopped`` is asked after each event whether the adapter can no longer deliver (its client
        is gone, or it ended the turn on the wire itself); ``ended`` is awaited once the turn is over
        on its own (never after an interrupt: its caller takes over), the session READY again.
        ``input_open``: the client still writes the turn's input (SPEAKING until ``input_closed``).
        """
        if self.answering:
            raise RuntimeError("a turn is running: interrupt it first")
        turn = ActiveTurn(spec)
        self.turn = turn
        if self.frames is not None:
            self.frames.pin(spec.frames)
        if self._state is ConversationState.READY:
            self._move(ConversationState.SPEAKING if input_open else ConversationState.ANSWERING)
        turn.task = spawn(self._run(turn, emit, stopped, ended), "conversation turn")
        return turn

    def input_closed(self) -> None:
        """The running turn's input is complete (SPEAKING → ANSWERING)."""
        if self._state is ConversationState.SPEAKING:
            self._move(ConversationState.ANSWERING)

    def finish(self) -> None:
        """The client is done: the running turn (if any) completes, nothing new is taken; ``close`` ends it."""
        self._move(ConversationState.FINISHING)

    def stop_input(self) -> None:
        """The session takes nothing more (its socket is closing); ``close`` then frees it."""
        self._move(ConversationState.CLOSED)

    async def _run(
        self, turn: ActiveTurn, emit: Emit[EventT | TurnEnd], stopped: Callable[[], bool], ended: Ended | None
    ) -> None:
        try:
            await self._deliver(turn, emit, stopped)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("turn %s failed", turn.request_id)
            if not turn.interrupted:
                await emit(turn, TurnEnd(Status.ERROR, ErrorKind.ENGINE))
        finally:
            if self.turn is turn:
                self.turn = None
                if self.frames is not None:
                    self.frames.unpin()
                if self._state in (ConversationState.ANSWERING, ConversationState.SPEAKING):
                    self._move(ConversationState.READY)
                if self._on_idle is not None:
                    self._on_idle()
        if ended is not None and not turn.interrupted:
            await ended(turn)

    async def _deliver(self, turn: ActiveTurn, emit: Emit[EventT], stopped: Callable[[], bool]) -> None:
        """The runner's events to ``emit`` until it ends, is interrupted or the adapter stops it."""
        async with contextlib.aclosing(turn.spec.run(self.engine)) as events:
            async for event in events:
                if turn.interrupted:
                    return
                turn.emitting = True
                try:
                    await emit(turn, event)
                finally:
                    turn.emitting = False
                if turn.interrupted or stopped():
                    return

    async def interrupt(self) -> bool:
        """Stop the running turn at once (False: none was running). The engine request is aborted
        first; an event being written completes (so an adapter's own accounting of what it sent
        stays true), then the task is cancelled and the turn emits nothing more."""
        turn = self.turn
        if turn is None or turn.task is None or turn.task.done():
            return False
        turn.interrupted = True
        if (request_id := turn.request_id) is not None:
            await self.engine.abort(request_id)
        if not turn.emitting:  # else it returns by itself once that event is written
            turn.task.cancel()
        await asyncio.gather(turn.task, return_exceptions=True)
        return True

    async def wait(self) -> None:
        """Until the running turn (if any) has ended on its own."""
        turn = self.turn
        if turn is not None and turn.task is not None:
            await asyncio.gather(turn.task, return_exceptions=True)

    async def close(self) -> None:
        """End the session: abort the running turn (unless it is the caller), stop the decoder, free
        the buffers (their bytes go back to the process budget)."""
        self._move(ConversationState.CLOSED)
        current = asyncio.current_task()
        turn = self.turn
        if turn is not None and turn.task is not None and turn.task is not current and not turn.task.done():
            turn.interrupted = True
            if (request_id := turn.request_id) is not None:
                await self.engine.abort(request_id)
            turn.task.cancel()
            await asyncio.gather(turn.task, return_exceptions=True)
        if self.frames is not None:
            await self.frames.close()
        if self.audio is not None:
            self.audio.clear()
        if self.history is not None:
            self.history.clear()
        self.turn = None
        self._on_idle = None
