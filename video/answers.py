"""The video endpoint's wire for one answer: the core's typed turn events → its messages, in order.

What only this wire format knows of an answer lives here, so the consumer stays an adapter: the
seed's message order (``input.transcript`` before ``response.start`` when the question was spoken,
``video.frames.consumed`` once the thinker has its frames and the client gave them ids, the text and
audio deltas of the modalities asked for, ``response.text.done`` as soon as the text is complete, then
the audio's end), the audio events' names (``event_names``), the history the answered turn joins, and
how a failed turn still closes the response it opened. An interrupted turn sends nothing more.
``Answer.send`` is the only way out, so it runs without a socket in the tests.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from omniweb.base import clocks  # ops instrumentation: the turn's latency histograms
from omniweb.base.errors import ErrorKind
from omniweb.conversation import (
    ActiveTurn,
    AudioChunk,
    FramesSelected,
    History,
    NoUsableFrames,
    TextDelta,
    TextEnd,
    Transcript,
    TurnEnd,
    TurnEvent,
)

from . import protocol

logger = logging.getLogger(__name__)

FAILED = "Query processing failed"  # a failed turn's error when the engine gave no message of its own
NO_FRAMES = "No frames buffered"


@dataclass(eq=False)
class Answer:
    """One turn's answer on the wire: what has been said of it so far, and the messages each of the
    core's events adds. ``emit`` is the core's ``Emit`` (``Conversation.start_turn`` awaits it per
    event); ``send`` writes a message to the client (nothing once the session is closed)."""

    send: Callable[[dict[str, Any]], Awaitable[None]]
    request_id: str  # the turn's engine request, named in video.frames.consumed
    question: str
    modalities: tuple[str, ...]
    with_ids: bool  # video.frames.consumed only when the client gave frames ids to follow (as the seed)
    event_names: str = "seed"
    history: History | None = None  # the answered question and its text join it
    selected: FramesSelected | None = None
    started: bool = False  # response.start sent
    consumed_sent: bool = False
    text: list[str] = field(default_factory=list)
    transcript: str | None = None
    audio_deltas: int = 0
    text_done: bool = False  # response.text.done sent (as soon as the text is complete)
    clock: clocks.TurnClock = field(default_factory=clocks.video_turn)  # ops: omniweb_video_*

    async def emit(self, turn: ActiveTurn, event: TurnEvent) -> None:
        """One typed event of the turn → the wire."""
        if isinstance(event, NoUsableFrames):
            await self._send(turn, protocol.error(NO_FRAMES))
            return
        if isinstance(event, FramesSelected):
            self.selected = event
            if self.question.strip():  # else the engine may transcribe first: input.transcript precedes
                await self._start(turn)
            return
        if isinstance(event, TurnEnd):
            await self._end(turn, event)
            return
        if isinstance(event, Transcript):
            self.transcript = event.text
            await self._send(turn, protocol.input_transcript(event.text))
        await self._start(turn)
        if self.with_ids and not self.consumed_sent and self.selected is not None:
            self.consumed_sent = True
            consumed = protocol.frames_consumed(
                self.request_id,
                [f.meta for f in self.selected.frames],
                model_selected_ms=self.selected.selected_ms,
                decoded_ready_ms=self.selected.decoded_ready_ms,
            )
            await self._send(turn, consumed)
        if isinstance(event, TextDelta):
            self.text.append(event.delta)
            if "text" in self.modalities and event.delta:
                await self._send(turn, protocol.text_delta(event.delta))
                self.clock.text_sent()
        elif isinstance(event, TextEnd):  # the answer's text is complete; its audio may follow
            await self._complete_text(turn, "".join(self.text))
        elif isinstance(event, AudioChunk) and "audio" in self.modalities and event.pcm:
            self.audio_deltas += 1
            await self._send(turn, protocol.audio_delta(event.pcm, self.event_names))
            self.clock.audio_sent()

    async def _complete_text(self, turn: ActiveTurn, text: str) -> None:
        """response.text.done, and the turn joins the history: a client may ask its next question
        (interrupting the audio) as soon as it has the text."""
        if self.text_done:
            return
        self.text_done = True
        await self._send(turn, protocol.text_done(text))
        question = self.question if self.question.strip() else self.transcript or ""
        if self.history is not None:
            self.history.remember(question, text)

    async def _start(self, turn: ActiveTurn) -> None:
        if not self.started:
            self.started = True
            await self._send(turn, protocol.response_start())

    async def _end(self, turn: ActiveTurn, end: TurnEnd) -> None:
        if end.ok:
            if end.transcript is not None:
                self.transcript = end.transcript
            await self._start(turn)
            await self._complete_text(turn, end.text or "")
            if self.audio_deltas:
                await self._send(turn, protocol.audio_done(self.event_names))
            self.clock.ended(ok=True)
        elif end.status == "cancelled" and turn.interrupted:
            return
        else:
            # End messages are the engine's own fixed, client-safe texts (capacity, refusals, a lost
            # worker, an upstream model that failed), never exception text.
            kind = end.kind or ErrorKind.ENGINE
            logger.warning("video turn %s ended with %s (%s): %s", self.request_id, end.status, kind, end.message)
            await self._failed(turn, end.message or FAILED, kind)

    async def _failed(self, turn: ActiveTurn, message: str, kind: ErrorKind) -> None:
        """Failures still close the response: error, then response.text.done with what was said, and
        response.audio.done when audio had started (a player waiting for the end hears it)."""
        if not turn.interrupted:
            self.clock.ended(ok=False)
        await self._start(turn)
        await self._send(turn, protocol.error(message, kind))
        if not self.text_done:  # a failed answer is not remembered
            self.text_done = True
            await self._send(turn, protocol.text_done("".join(self.text)))
        if self.audio_deltas:
            await self._send(turn, protocol.audio_done(self.event_names))

    async def _send(self, turn: ActiveTurn, payload: dict[str, Any]) -> None:
        """An interrupted turn sends nothing more."""
        if not turn.interrupted:
            await self.send(payload)
