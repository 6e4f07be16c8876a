"""The responses of a Realtime session: ``response.create`` / ``response.cancel`` over the core's turns.

One response runs at a time (``running``). It is one core turn (``omniweb.conversation``: the video
thinker → talker → vocoder on the engine), whose typed events ``responses.ResponseStream`` writes as
``response.*`` events. Its question is the last user item that says something: its text, or its
audio (the engine's Whisper transcribes it first, which is also the item's transcript:
``transcribed``); the items before it are the history, the frame buffer's latest images what it
looks at: the whole conversation the client built reaches the thinker (a language model's prompt
leaves out the oldest turns past its context). After a function's output (the last item) there is
no new question: the whole conversation is the history and the thinker answers with the output; so
too after an idle timeout that heard no words (``idle``): the thinker goes on from the conversation.
The tools in effect, the tool choice and the token limit go to the thinker with the turn. Whatever
stops a response (the client's cancel, speech in the input audio, a truncate of the item being
written, its turn's end), its closing events are written once. ``Responses`` writes through
``send`` (and ``refuse``: an ``error`` event), so it runs without a socket.

Over WebRTC the answer's audio plays on the call's outgoing track (``output``, an ``AnswerAudio``)
instead of going out as ``response.output_audio.delta``. The track plays it in real time, so it
may still be playing after ``response.done``: speech over it (``input_audio``) or the client's
``output_audio_buffer.clear`` silences it at once, says ``output_audio_buffer.cleared`` and cuts the
item to what had been played (``conversation.item.truncated``), which over a WebSocket the client
does with ``conversation.item.truncate``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings

from omniweb.base import clocks, metrics
from omniweb.base.errors import ErrorKind
from omniweb.conversation import (
    ActiveTurn,
    AudioChunk,
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
from .events import OutputAudioBufferClearEvent, ResponseCancelEvent, ResponseCreateEvent, ResponseParams
from .items import Item
from .responses import ResponseStream, Status
from .session import AnySession, Session, TranscriptionSession, engine_tool_choice

NUM_FRAMES = 4  # the latest images a response looks at

Refuse = Callable[[RealtimeError, ErrorKind | None], Awaitable[None]]


@dataclass(frozen=True)
class Played:
    """How much of a response's audio item an answer track had played when it was silenced."""

    response_id: str
    item_id: str
    audio_ms: int


class AnswerAudio(Protocol):
    """Where answers' audio plays instead of ``response.output_audio.delta`` (a WebRTC call's
    outgoing track), in real time; it says ``output_audio_buffer.started`` and ``.stopped`` itself."""

    def play(self, response_id: str, item_id: str, pcm: bytes) -> None:
        """Queue a piece of the response's audio (PCM16 24 kHz)."""

    async def finished(self, response_id: str) -> None:
        """The response is done: no more audio comes for it (stopped once what is queued has played)."""

    def silence(self) -> Played | None:
        """Silence now, dropping what is queued; what had played of the response being heard (None: none was)."""


@dataclass(eq=False)
class Running:
    """The response in flight: its wire (``stream``), its core turn and its latency clock."""

    stream: ResponseStream
    turn: ActiveTurn | None = None
    clock: clocks.TurnClock = field(default_factory=clocks.realtime_response)  # ops: omniweb_realtime_*
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
        output: AnswerAudio | None = None,
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
        self.output = output
        self.running: Running | None = None
        # Told when a response has ended (its audio may still be playing): the idle clock.
        self.on_finished: Callable[[ResponseStream], None] | None = None

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

    async def respond(self, params: ResponseParams, event_id: str | None, *, idle: Item | None = None) -> None:
        """Start a response as ``params`` ask (over the session's defaults): its opening events,
        then its turn runs. ``idle``: the item the idle timeout committed; the response's question
        only if words were heard in it (never an earlier item)."""
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
        if idle is not None and not (stream.question is idle and idle.text()):
            stream.question = None  # nothing was said: no question, the conversation goes on
        stream.place = lambda item: self.items.add(item, None, None)
        answers_a_call = self.items.conversation.answers_a_call()
        spec = self._turn(stream, params, session, idle is not None)
        running = Running(stream)
        self.running = running
        if stream.in_conversation and stream.item is not None:
            self.items.add(stream.item, None, event_id)
        for payload in stream.start():
            await self.send(payload)
        if not spec.question.text and not spec.question.audio and not answers_a_call and idle is None:
            details = server_events.failed("There is no question to answer: add a user item first", "no_input")
            await self._finish(running, "failed", details)
            return
        running.turn = self.core.start_turn(spec, self._emit, stopped=self.stopped)

    def _turn(self, stream: ResponseStream, params: ResponseParams, session: Session, idle: bool) -> TurnSpec:
        """The core turn of a response: its question, all the conversation before it (what the
        client built: a Realtime session's history is not the video endpoint's few turns), the
        latest images, the tools in effect. After a function's output, or an idle timeout that
        heard nothing, there is no question: everything is history."""
        conversation, question = self.items.conversation, stream.question
        own = params.instructions or session.instructions
        instructions = "\n".join(t for t in (own, conversation.system_text()) if t)
        if conversation.answers_a_call() or (idle and question is None):
            question = None
            history = conversation.history()
        elif question is not None:
            history = conversation.history(before=question)
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
            stream.write(event)  # counted in the usage: the thinker reads what was heard
            if stream.question is not None:
                await self.transcribed(stream.question, [event.text])
        elif isinstance(event, TurnEnd | NoUsableFrames):
            end = stream.end(event)
            if end.refusal is not None:  # the engine did not take it: say so as an error too
                await self.refuse(end.refusal, end.kind)
            await self._finish(running, end.status, end.details)
        else:
            for payload in stream.write(event):
                if payload["type"] == "response.output_audio.delta":
                    running.clock.audio_sent()
                    if self.output is not None:
                        continue  # it plays on the call's track
                await self.send(payload)
                if payload["type"] in ("response.output_text.delta", "response.output_audio_transcript.delta"):
                    running.clock.text_sent()
            if self.output is not None and isinstance(event, AudioChunk) and event.pcm and stream.item is not None:
                self.output.play(stream.response.id, stream.item.id, event.pcm)

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

    async def on_output_clear(self, event: OutputAudioBufferClearEvent) -> None:
        """``output_audio_buffer.clear`` (WebRTC): the answer's audio stops now, and the response
        still writing it stops generating it."""
        played = self.output.silence() if self.output is not None else None
        if played is None:
            return
        running = self.running
        if running is not None and running.stream.response.id == played.response_id:
            await self.cancel(server_events.cancelled("client_cancelled"))
        await self.cleared(played)

    async def cleared(self, played: Played) -> None:
        """The track was silenced: ``output_audio_buffer.cleared``, and the item keeps only the audio
        (and the words) that had been played."""
        await self.send(server_events.event("output_audio_buffer.cleared", response_id=played.response_id))
        item = self.items.conversation.find(played.item_id)
        if item is None or item.content[0].get("type") != "output_audio" or played.audio_ms >= item.audio_ms:
            return
        self.items.conversation.truncate(item.id, 0, played.audio_ms)
        await self.send(server_events.item_truncated(item.id, 0, played.audio_ms))

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
        if self.output is not None:
            await self.output.finished(running.stream.response.id)
        if self.on_finished is not None:
            self.on_finished(running.stream)
        self.on_idle()
