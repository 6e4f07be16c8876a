"""The responses of a Realtime session: ``response.create`` / ``response.cancel`` over the core's turns.

One response runs at a time (``running``). It is one core turn (``omniweb.conversation``: the video
thinker → talker → vocoder on the engine), whose typed events ``responses.ResponseStream`` writes as
``response.*`` events. Its question is the last user item that says something: its text, or its
audio (the engine's Whisper transcribes it first, which is also the item's transcript:
``transcribed``); the items before it are the history, the frame buffer's latest images what it
looks at. After a function's output (the last item) there is no new question: the whole
conversation is the history and the thinker answers with the output. The tools in effect, the tool
choice and the token limit go to the thinker with the turn. Whatever stops a response (the client's
cancel, speech in the input audio, a truncate of the item being written, its turn's end), its
closing events are written once. ``Responses`` writes
through ``send`` (and ``refuse``: an ``error`` event), so it runs without a socket.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from omniweb.base import metrics
from omniweb.base.errors import ErrorKind
from omniweb.conversation import (
    ActiveTurn,
    Conversation,
    FrameSelection,
    NoUsableFrames,
    Question,
    Transcript,
    TurnEnd,
    TurnEvent,
    TurnSpec,
)

from . import server_events
from .audio import to_engine_rate
from .conversation_items import ConversationItems, Send, for_event
from .errors import RealtimeError
from .events import ResponseCancelEvent, ResponseCreateEvent, ResponseParams
from .items import Item, last_turns
from .responses import ResponseStream, Status
from .session import AnySession, Session, TranscriptionSession, engine_tool_choice

NUM_FRAMES = 4  # the latest images a response looks at

Refuse = Callable[[RealtimeError, ErrorKind | None], Awaitable[None]]


@dataclass(eq=False)
class Running:
    """The response in flight: its wire (``stream``), its core turn and its latency clock."""

    stream: ResponseStream
    turn: ActiveTurn | None = None
    clock: metrics.TurnClock = field(default_factory=metrics.TurnClock)
    finished: bool = False  # it emits nothing more


class Responses:
    """The session's responses. ``stopped`` says the client can no longer be written to (the turn
    stops); ``on_idle`` is called when a response ends."""

    def __init__(
        self,
        core: Conversation,
        items: ConversationItems,
        send: Send,
        refuse: Refuse,
        *,
        session: Callable[[], AnySession],
        voices: Mapping[str, str],
        transcribed: Callable[[Item, Sequence[str]], Awaitable[None]],
        stopped: Callable[[], bool],
        on_idle: Callable[[], None],
    ) -> None:
        self.core = core
        self.items = items
        self.send = send
        self.refuse = refuse
        self.session = session
        self.voices = voices
        self.transcribed = transcribed
        self.stopped = stopped
        self.on_idle = on_idle
        self.running: Running | None = None

    async def on_create(self, event: ResponseCreateEvent) -> None:
        if isinstance(self.session(), TranscriptionSession):
            raise RealtimeError(
                "A transcription session creates no responses; connect to /v1/realtime for a conversation",
                code="invalid_event_type",
                event_id=event.event_id,
            )
        await self.respond(event.response or ResponseParams(), event.event_id)

    async def on_cancel(self, event: ResponseCancelEvent) -> None:
        running = self.running
        if running is None or (event.response_id is not None and event.response_id != running.stream.response.id):
            raise RealtimeError(
                "Cancellation failed: no active response found",
                code="response_cancel_not_active",
                param="response_id" if event.response_id is not None else None,
                event_id=event.event_id,
            )
        await self.cancel(server_events.cancelled("client_cancelled"))

    async def respond(self, params: ResponseParams, event_id: str | None) -> None:
        """Start a response as ``params`` ask (over the session's defaults): its opening events,
        then its turn runs."""
        if self.running is not None:
            raise RealtimeError(
                f"Conversation already has an active response in progress: {self.running.stream.response.id}. "
                "Wait until the response is finished before creating a new one.",
                code="conversation_already_has_active_response",
                event_id=event_id,
            )
        session = self.session()
        assert isinstance(session, Session)  # a transcription session refused response.create
        with for_event(event_id):
            stream = ResponseStream.create(params, session, self.items.conversation)
        stream.place = lambda item: self.items.add(item, None, None)
        answers_a_call = self.items.conversation.answers_a_call()
        spec = self._turn(stream, params, session)
        running = Running(stream)
        self.running = running
        if stream.in_conversation and stream.item is not None:
            self.items.add(stream.item, None, event_id)
        for payload in stream.start():
            await self.send(payload)
        if not spec.question.text and not spec.question.audio and not answers_a_call:
            details = server_events.failed("There is no question to answer: add a user item first", "no_input")
            await self._finish(running, "failed", details)
            return
        running.turn = self.core.start_turn(spec, self._emit, stopped=self.stopped)

    def _turn(self, stream: ResponseStream, params: ResponseParams, session: Session) -> TurnSpec:
        """The core turn of a response: its question, the history before it (the last
        ``VIDEO_HISTORY_TURNS`` exchanges), the latest images, the tools in effect. After a
        function's output there is no question: everything is history."""
        conversation, question = self.items.conversation, stream.question
        own = params.instructions or session.instructions
        instructions = "\n".join(t for t in (own, conversation.system_text()) if t)
        # A language model gets the whole conversation (its prompt leaves out the oldest turns past
        # its context); the scene thinker only reads the last few exchanges.
        turns = 0 if settings.THINKER == "llm" else 2 * max(0, settings.VIDEO_HISTORY_TURNS)
        if conversation.answers_a_call():
            question = None
            history = last_turns(conversation.history(), turns)
        elif question is not None:
            history = last_turns(conversation.history(before=question), turns)
        else:
            history = conversation.history()
        frames = self.core.frames
        assert frames is not None
        text = question.text() if question is not None else ""
        tools = stream.tools
        choice, tool_name = engine_tool_choice(tools.choice)
        limit = stream.response.max_output_tokens
        return TurnSpec(
            question=Question(text=text, audio=to_engine_rate(question.audio) if question and not text else b""),
            frames=frames.snapshot(),
            selection=FrameSelection(NUM_FRAMES, "latest_frames"),
            history=history,
            instructions=instructions or None,
            tools=tuple(t.engine() for t in tools.tools),
            tool_choice=choice,
            tool_name=tool_name,
            parallel_tool_calls=tools.parallel if tools.parallel is not None else True,
            max_tokens=limit if isinstance(limit, int) else None,
            modalities=("text", "audio") if stream.response.audio else ("text",),
            voice=self.voices[stream.response.voice],
            require_frames=False,
            admit_budget=settings.ENGINE_TURN_ADMIT_BUDGET_MS / 1000.0,
            request_id=stream.response.id,
        )

    async def _emit(self, turn: ActiveTurn, event: TurnEvent) -> None:
        """One typed event of the running turn → this wire format's events."""
        running = self.running
        if running is None or running.turn is not turn or running.finished:
            return
        stream = running.stream
        if isinstance(event, Transcript):
            if stream.question is not None:
                await self.transcribed(stream.question, [event.text])
        elif isinstance(event, TurnEnd | NoUsableFrames):
            end = stream.end(event)
            if end.refusal is not None:  # the engine did not take it: say so as an error too
                await self.refuse(end.refusal, end.kind)
            await self._finish(running, end.status, end.details)
        else:
            for payload in stream.write(event):
                await self.send(payload)
                if payload["type"] == "response.output_text.delta":
                    running.clock.text_sent()
                elif payload["type"] == "response.output_audio.delta":
                    running.clock.audio_sent()

    async def interrupt(self) -> None:
        """Abort the running response's engine request now: it emits nothing more (``cancel`` then
        finds it stopped and closes it)."""
        running = self.running
        if running is not None and not running.finished:
            await self.core.interrupt()

    async def stop_writing(self, item_id: str) -> None:
        """The client stopped playing the answer being written as ``item_id``: cancel it."""
        running = self.running
        if running is not None and running.stream.item is not None and running.stream.item.id == item_id:
            await self.cancel(server_events.cancelled("client_cancelled"))

    async def cancel(self, details: dict[str, Any]) -> None:
        """Stop the running response at once (the engine request is aborted), then close it."""
        running = self.running
        if running is None or running.finished:
            return
        running.finished = True  # the turn emits nothing more from here
        await self.core.interrupt()
        running.finished = False
        await self._finish(running, "cancelled", details)

    async def _finish(self, running: Running, status: Status, details: dict[str, Any] | None) -> None:
        """The closing events of a response, whatever ended it: content done, item done, response.done."""
        if running.finished:
            return
        running.finished = True
        if self.running is running:
            self.running = None
        *closing, done = running.stream.finish(status, details)
        for payload in closing:
            await self.send(payload)
        if status in ("completed", "failed"):
            running.clock.ended(ok=status == "completed")
        if status == "failed":
            metrics.count_error(ErrorKind.ENGINE.value)
        await self.send(done)
        self.on_idle()
