"""The conversation session: its state machine, buffers, history and the one turn that may run.

A turn runs as its own task (``start_turn``), so the adapter keeps reading its socket; its events go
to the adapter's ``emit`` one at a time, in order. ``interrupt`` stops the running turn at once: its
engine request is aborted, its task cancelled, and it emits nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from omniweb.engine.client import EngineClient
from omniweb.errors import ErrorKind
from omniweb.sessions import spawn

from .audio import AudioBuffer
from .chunks import TurnEnd
from .frames import FrameBuffer
from .history import History
from .turns import TurnEvent, TurnSpec, run_turn

logger = logging.getLogger(__name__)


class ConversationState(enum.Enum):
    AWAITING_CONFIG = "awaiting_config"
    READY = "ready"  # configured; buffering frames and audio
    ANSWERING = "answering"  # a turn streams its answer (frames and audio still buffer)
    FINISHING = "finishing"  # the client said it is done: the active turn completes, then the session ends
    CLOSED = "closed"


@dataclass(eq=False)
class ActiveTurn:
    spec: TurnSpec
    task: asyncio.Task[None] | None = None
    interrupted: bool = False  # once set, the turn sends nothing more

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


Emit = Callable[[ActiveTurn, TurnEvent], Awaitable[None]]


class Conversation:
    """One session's protocol-neutral core; the adapter owns the socket and the wire format."""

    def __init__(self, engine: EngineClient, *, on_idle: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.state = ConversationState.AWAITING_CONFIG
        self.frames: FrameBuffer | None = None
        self.audio: AudioBuffer | None = None
        self.history: History | None = None
        self.turn: ActiveTurn | None = None
        self._on_idle = on_idle  # a turn ended (the adapter restarts its idle clock)

    def configure(self, *, frames: FrameBuffer, audio: AudioBuffer, history: History) -> None:
        """The session is configured: buffers ready, frames decode ahead from now on."""
        self.frames, self.audio, self.history = frames, audio, history
        self.state = ConversationState.READY
        frames.start()

    @property
    def answering(self) -> bool:
        return self.turn is not None and self.turn.running

    def start_turn(self, spec: TurnSpec, emit: Emit, *, stopped: Callable[[], bool] = lambda: False) -> ActiveTurn:
        """Run ``spec`` as the session's turn (interrupt the previous one first); ``stopped`` is asked
        after each event whether the adapter can no longer deliver (its client is gone)."""
        if self.answering:
            raise RuntimeError("a turn is running: interrupt it first")
        turn = ActiveTurn(spec)
        self.turn = turn
        if self.frames is not None:
            self.frames.pin(spec.frames)
        if self.state is ConversationState.READY:
            self.state = ConversationState.ANSWERING
        turn.task = spawn(self._run(turn, emit, stopped), "conversation turn")
        return turn

    async def _run(self, turn: ActiveTurn, emit: Emit, stopped: Callable[[], bool]) -> None:
        try:
            async with contextlib.aclosing(run_turn(self.engine, turn.spec)) as events:
                async for event in events:
                    if turn.interrupted:
                        return
                    await emit(turn, event)
                    if stopped():
                        return
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("turn %s failed", turn.request_id)
            if not turn.interrupted:
                await emit(turn, TurnEnd("error", ErrorKind.ENGINE))
        finally:
            if self.turn is turn:
                self.turn = None
                if self.frames is not None:
                    self.frames.unpin()
                if self.state is ConversationState.ANSWERING:
                    self.state = ConversationState.READY
                if self._on_idle is not None:
                    self._on_idle()

    async def interrupt(self) -> bool:
        """Stop the running turn at once (False: none was running)."""
        turn = self.turn
        if turn is None or turn.task is None or turn.task.done():
            return False
        turn.interrupted = True
        await self.engine.abort(turn.request_id)
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
        self.state = ConversationState.CLOSED
        current = asyncio.current_task()
        turn = self.turn
        if turn is not None and turn.task is not None and turn.task is not current and not turn.task.done():
            turn.interrupted = True
            await self.engine.abort(turn.request_id)
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
