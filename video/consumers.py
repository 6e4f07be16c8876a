"""Transport for ``/v1/video/chat/stream``: the video wire format over the conversation core.

This consumer is an adapter: it parses the wire messages, hands typed values to the session's
``omniweb.conversation.Conversation`` (state machine, frame buffer, audio buffer, turn runner,
interrupt, history) and serializes the core's typed events back into the endpoint's messages.

``receive`` is the socket's single reader (Channels dispatches one message at a time). It checks the
first ``session.config`` itself, then parses each later message and puts it on the session's bounded
inbox (the core's ``Inbox``). Its one processor task takes the inbox in order, with one handler per
message type, so frames, audio and queries keep their arrival order while the reader stays free.

Frames are checked on the acknowledgement path on the decode pool (video/decoding.py, through the
core's ``FrameBuffer``): strict base64, JPEG/PNG header, pixel budget, JPEG scan count, the
similarity thumbnail (a decode, which proves the frame decodes); without the filter, checked ahead of
time at 1/8 scale, also on that pool (once per frame either way: video/frames.py). A frame that does
not decode is removed from the buffer and reported; a turn waits for its frames' checks, so the
thinker only ever gets frames known to decode.

A turn (``video.query``) runs as the core's turn task; a newer query interrupts it (the engine
request is aborted and the old turn sends nothing more). With ``turn_detection`` (server VAD, or
semantic VAD, whose pauses an end-of-turn model judges; our extension) the streamed ``audio.chunk``s
also go through the core's ``Listener``: the speaker stopping starts a turn over what was said, the
speaker starting interrupts the answer. Chunks queued behind a VAD call are heard together in the
next one (up to 5 s), so a busy engine or a client sending faster than real time does not delay
detection by one round trip per chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from omniweb import budget as process_budget
from omniweb import metrics
from omniweb.conversation import (
    ActiveTurn,
    AudioBuffer,
    AudioChunk,
    AudioRefused,
    BufferedFrame,
    Conversation,
    ConversationState,
    FrameBuffer,
    FrameSelection,
    FramesSelected,
    History,
    Inbox,
    InboxFull,
    InboxLimits,
    Listener,
    NoUsableFrames,
    Question,
    SpeechSegment,
    TextDelta,
    TextEnd,
    Transcript,
    TurnEnd,
    TurnEvent,
    TurnSpec,
    now_ms,  # the server clock of every *_ts_ms field: monotonic milliseconds, as in the seed
)
from omniweb.conversation.clock import SessionClock
from omniweb.conversation.listening import FEED_MS
from omniweb.engine.client import EngineClient
from omniweb.engine.runtime import get_engine_client
from omniweb.errors import EngineError, ErrorKind
from omniweb.media.frames import FrameError
from omniweb.protocol import excerpt
from omniweb.sessions import SessionConsumer
from omniweb.tasks import spawn
from omniweb.vad import SemanticVoiceActivity, SpeechStarted, SpeechStopped, VadParams, VoiceActivity
from speech.tts.model import capabilities

from . import protocol
from .protocol import ProtocolError, VideoSessionConfig

logger = logging.getLogger(__name__)

LARGE_MESSAGE = 1024 * 1024  # parse messages above this size off the event loop
FAILED = "Query processing failed"  # a failed turn's error when the engine gave no message of its own

SessionState = ConversationState  # the session's states are the core's


@dataclass(frozen=True)
class _DecodeFailed:
    """The decoder's report to the processor; a Python object, so no client can forge it."""

    frame: BufferedFrame


@dataclass(eq=False)
class _Reply:
    """What the wire has said of one turn's answer so far."""

    question: str
    modalities: tuple[str, ...]
    with_ids: bool  # video.frames.consumed only when the client gave frames ids to follow (as the seed)
    selected: FramesSelected | None = None
    started: bool = False  # response.start sent
    consumed_sent: bool = False
    text: list[str] = field(default_factory=list)
    transcript: str | None = None
    audio_deltas: int = 0
    text_done: bool = False  # response.text.done sent (as soon as the text is complete)
    clock: metrics.TurnClock = field(default_factory=metrics.TurnClock)  # ops: latency histograms


_Item = dict[str, Any] | _DecodeFailed
LISTEN_MAX_BYTES = 5 * 2 * protocol.INPUT_SAMPLE_RATE  # at most 5 s of queued audio per VAD call
INBOX_FULL = "Too many messages queued: the session cannot keep up; session closed"


def _is_audio_chunk(item: _Item | None) -> bool:
    return isinstance(item, dict) and item.get("type") == "audio.chunk"


class VideoStreamConsumer(SessionConsumer):
    async def connect(self) -> None:
        self.config: VideoSessionConfig | None = None
        # All sessions together (omniweb/budget.py); one message at a time always passes, so a client
        # that waits for its acks meets the budget as refused frames, a flooding one as a close.
        self.inbox: Inbox[_Item] = Inbox(
            self._handle,
            InboxLimits(
                max_messages=protocol.MAX_QUEUED_MESSAGES,
                max_bytes=protocol.MAX_QUEUED_BYTES,
                full_message=INBOX_FULL,
                budget_message=process_budget.INBOX_FULL_MESSAGE,
            ),
            hold=lambda queued, alone: self.budget_share.hold("inbox", queued, force=alone),
            gate=lambda: self.state is not SessionState.CLOSED,
        )
        self.tasks: list[asyncio.Task[None]] = []
        self.replies: dict[ActiveTurn, _Reply] = {}
        self.listener: Listener | None = None  # with turn_detection: server VAD over the audio
        self.to_hear = bytearray()  # audio.chunk PCM not yet through the listener
        # First use may load the models: off the event loop, and before the handshake so the config
        # clock only starts once the session can be served.
        self.engine: EngineClient = await asyncio.to_thread(get_engine_client)
        self.conversation = Conversation(self.engine, on_idle=self._on_turn_idle)
        self.caps = capabilities()
        self.clock = SessionClock(
            config_timeout=settings.VIDEO_CONFIG_TIMEOUT,
            idle_timeout=settings.VIDEO_IDLE_TIMEOUT,
            configured=lambda: self.config is not None,
            # no idle timeout while a turn streams or the session finishes
            paused=lambda: self.state in (SessionState.ANSWERING, SessionState.FINISHING),
            closed=lambda: self.state is SessionState.CLOSED,
            on_timeout=self.on_timeout,
        )
        await self.accept()
        self.tasks.append(spawn(self.clock.run(), "video session clock"))
        self.handlers: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {
            "video.frame": self.on_video_frame,
            "audio.chunk": self.on_audio_chunk,
            "video.query": self.on_video_query,
            "video.done": self.on_video_done,
            "ping": self.on_ping,
        }

    @property
    def state(self) -> ConversationState:
        conversation = getattr(self, "conversation", None)
        return conversation.state if conversation is not None else SessionState.CLOSED

    @property
    def frames(self) -> FrameBuffer:
        assert self.conversation.frames is not None
        return self.conversation.frames

    @property
    def audio(self) -> AudioBuffer:
        assert self.conversation.audio is not None
        return self.conversation.audio

    async def disconnect(self, code: int) -> None:
        await self._shutdown()
        self._release()
        logger.info("video session closed (code %s)", code)

    def _release(self) -> None:
        """Drop the references that make the session a cycle (clock and handler closures, the core's
        callbacks, tasks), so a closed session is freed at once, not at the cyclic collector's leisure."""
        for name in ("tasks", "handlers", "replies"):
            with contextlib.suppress(AttributeError):  # connect may have failed before setting it
                getattr(self, name).clear()
        with contextlib.suppress(AttributeError):
            self.inbox.close()  # held messages, and its callbacks (closures over the session)
        self.clock = None
        self.conversation = None
        self.listener = None

    def _on_turn_idle(self) -> None:
        if self.clock is not None:
            self.clock.touch()  # the idle clock restarts when the turn ends

    # -- the single reader -------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        received_ms = now_ms()
        self.clock.touch()
        if self.state in (SessionState.CLOSED, SessionState.FINISHING):
            return  # nothing after video.done is read, as in the seed
        if text_data is None:
            await self.reject("Binary messages are not accepted; send JSON text messages")
            return
        if self.state is SessionState.AWAITING_CONFIG:
            await self.on_session_config(text_data)
            return
        try:
            if len(text_data) > LARGE_MESSAGE:
                msg = await asyncio.to_thread(protocol.parse_message, text_data)
            else:
                msg = protocol.parse_message(text_data)
        except ProtocolError as exc:
            await self.send_json(protocol.error(exc.message))
            return
        if msg.get("type") == "video.frame":
            msg["_received_ms"] = received_ms
        try:
            await self.inbox.deliver(msg, len(text_data))
        except InboxFull as full:
            await self.fail(full.message, full.kind)
            return
        if msg.get("type") == "video.done":
            self.conversation.finish()  # nothing after it is read

    async def on_session_config(self, text_data: str) -> None:
        try:
            config = protocol.parse_config(text_data, self.caps)
        except ProtocolError as exc:
            await self.fail(exc.message)
            return
        self.config = config
        turns = max(0, settings.VIDEO_HISTORY_TURNS)  # the server's cap
        if config.max_history_turns is not None:
            turns = min(turns, config.max_history_turns)
        self.conversation.configure(
            frames=FrameBuffer(
                max_frames=config.max_frames,
                max_bytes=settings.VIDEO_MAX_BUFFER_BYTES,
                max_pixels=settings.VIDEO_MAX_FRAME_PIXELS,
                filter_threshold=config.frame_filter_threshold if config.enable_frame_filter else None,
                on_decode_failed=lambda frame: self.inbox.post(_DecodeFailed(frame)),
            ),
            audio=AudioBuffer(protocol.MAX_AUDIO_BUFFER_BYTES, protocol.INPUT_SAMPLE_RATE),
            history=History(turns),
        )
        if (vad := config.turn_detection) is not None:
            if isinstance(vad, protocol.SemanticVad):
                detector: VoiceActivity = SemanticVoiceActivity(self.engine, vad.eagerness, protocol.INPUT_SAMPLE_RATE)
            else:
                params = VadParams(vad.threshold, vad.prefix_padding_ms, vad.silence_duration_ms)
                detector = VoiceActivity(self.engine, params, protocol.INPUT_SAMPLE_RATE)
            self.listener = Listener(
                detector,
                self.audio,
                take_segments=vad.create_response,
                feed_ms=FEED_MS,  # the page sends 40 ms chunks: one VAD request per ~100 ms, not per chunk
            )
        self.tasks.append(spawn(self.inbox.run(), "video session processor"))

    # -- the processor: one handler per message type -----------------------------------------------
    async def _handle(self, item: _Item) -> None:
        """One message of the inbox. Audio waits to be heard while more ``audio.chunk``s are queued
        behind it, so the server VAD hears a run of them in one engine call instead of one round
        trip each (a client that sends faster than real time, or any client while the engine is busy)."""
        if isinstance(item, _DecodeFailed):
            await self.on_decode_failed(item.frame)
            return
        msg_type = item.get("type")
        handler = self.handlers.get(msg_type) if isinstance(msg_type, str) else None
        if handler is None:
            await self.send_json(protocol.error(f"Unknown type: {excerpt(msg_type)}"))
            return
        await handler(item)
        if self.to_hear and not _is_audio_chunk(self.inbox.peek()):
            await self._listen()

    async def on_video_frame(self, msg: dict[str, Any]) -> None:
        received_ms = msg.pop("_received_ms")
        text = msg.get("data", "")
        if not text:
            return  # the seed ignores empty frames silently
        if not isinstance(text, str):
            await self.send_json(protocol.error("Invalid image data"))
            return
        if len(text) > protocol.MAX_FRAME_SIZE:
            await self.send_json(protocol.error("Frame too large"))
            return
        try:
            protocol.check_frame_timestamps(msg)
        except ProtocolError as exc:
            await self.send_json(protocol.error(exc.message))
            return
        frame_id = msg.get("frame_id")
        try:
            added = await self.frames.add(
                text,
                received_ms=received_ms,
                frame_id=frame_id if isinstance(frame_id, str) else None,
                pts_ms=protocol.number_or_none(msg.get("pts_ms")),
                meta=protocol.frame_metadata(msg, received_ms),
            )
        except FrameError as exc:
            await self.send_json(protocol.error(exc.message))
            return
        if not added.accepted:
            await self._send_ack(msg, accepted=False, received_ms=received_ms, reason="filtered")
            return
        dropped_id = added.dropped[-1].meta.get("frame_id") if added.dropped else None
        await self._send_ack(msg, accepted=True, received_ms=received_ms, dropped_frame_id=dropped_id)

    async def _send_ack(self, msg: dict[str, Any], **fields: Any) -> None:
        ack = protocol.frame_ack(msg, buffered_frames=len(self.frames), **fields)
        if ack is not None:
            await self.send_json(ack)

    async def on_decode_failed(self, frame: BufferedFrame) -> None:
        if self.frames.remove_failed(frame):
            await self.send_json(protocol.error("Frame decode failed"))

    async def on_audio_chunk(self, msg: dict[str, Any]) -> None:
        try:
            pcm = protocol.decode_audio(msg.get("data", ""))
        except ProtocolError as exc:
            if self.to_hear:  # what came before it is heard first: replies keep the chunks' order
                await self._listen()
            await self.send_json(protocol.error(exc.message))
            return
        if self.listener is None:
            if problem := self.audio.append(pcm):
                await self.send_json(protocol.error(problem))
            return
        self.to_hear += pcm  # heard with the rest of the run of chunks queued behind it (_process)
        if len(self.to_hear) >= LISTEN_MAX_BYTES:
            await self._listen()

    async def _listen(self) -> None:
        """Run the audio received since the last call through the server VAD."""
        assert self.listener is not None
        pcm = bytes(self.to_hear)
        self.to_hear.clear()
        try:
            events = await self.listener.feed(pcm)
        except AudioRefused as exc:
            await self.send_json(protocol.error(exc.message))
            return
        except EngineError as exc:  # the VAD call failed (capacity, a lost worker): this audio is unheard
            message = exc.client_message or "Voice activity detection failed"
            await self.send_json(protocol.error(message, exc.kind))
            return
        for event in events:
            await self.on_heard(event)

    async def on_heard(self, event: SpeechStarted | SpeechStopped | SpeechSegment) -> None:
        """Server VAD: barge-in on speech start, a turn over the speech once it stopped."""
        config = self.config
        assert config is not None and config.turn_detection is not None
        if isinstance(event, SpeechStarted):
            if config.turn_detection.interrupt_response:
                await self.conversation.interrupt()  # as a new query does: the answer stops at once
            await self.send_json(protocol.speech_started(event.audio_start_ms))
        elif isinstance(event, SpeechStopped):
            await self.send_json(protocol.speech_stopped(event.audio_end_ms))
        elif event.audio:  # create_response: answered as a video.query without text would be
            await self.conversation.interrupt()
            if not len(self.frames):
                await self.send_json(protocol.error("No frames buffered"))
                return
            self._start_turn("", event.audio)

    async def on_video_query(self, msg: dict[str, Any]) -> None:
        text = msg.get("text", "")
        if not isinstance(text, str):
            await self.send_json(protocol.error("video.query text must be a string"))
            return
        audio_data = msg.get("audio_data")
        if audio_data:
            try:
                pcm = protocol.decode_audio(audio_data)
            except ProtocolError as exc:
                await self.send_json(protocol.error(exc.message))
            else:
                append = self.listener.append_unheard if self.listener is not None else self.audio.append
                if problem := append(pcm):
                    await self.send_json(protocol.error(problem))
        await self.conversation.interrupt()
        if not len(self.frames):
            await self.send_json(protocol.error("No frames buffered"))
            return
        if self.listener is not None:
            self.listener.taken()
        self._start_turn(text, self.audio.take())

    def _start_turn(self, text: str, audio: bytes) -> None:
        """A turn over the buffered frames: the question's text and/or its audio."""
        config = self.config
        assert config is not None
        snapshot = self.frames.snapshot()
        spec = TurnSpec(
            question=Question(text=text, audio=audio),
            frames=snapshot,
            selection=FrameSelection(
                num_frames=config.num_frames,
                strategy=config.sampling_strategy,
                window_seconds=config.window_seconds or protocol.DEFAULT_WINDOW_SECONDS,
            ),
            history=self.conversation.history.messages() if self.conversation.history is not None else (),
            instructions=config.system_prompt,
            modalities=tuple(config.modalities),
            voice=config.voice,
            model=config.model,
            admit_budget=settings.ENGINE_TURN_ADMIT_BUDGET_MS / 1000.0,
            request_id=f"video-{uuid.uuid4().hex[:12]}",
        )
        reply = _Reply(
            question=text,
            modalities=tuple(config.modalities),
            with_ids=any(f.meta.get("frame_id") for f in snapshot),
        )
        turn = self.conversation.start_turn(spec, self._emit, stopped=lambda: self.send_stalled or self.client_gone)
        self.replies = {turn: reply}

    async def on_video_done(self, msg: dict[str, Any]) -> None:
        await self.conversation.wait()
        await self.send_json(protocol.session_done())
        await self._close_session()

    async def on_ping(self, msg: dict[str, Any]) -> None:
        await self.send_json(protocol.pong())

    # -- the core's events → the wire --------------------------------------------------------------
    async def _emit(self, turn: ActiveTurn, event: TurnEvent) -> None:
        reply = self.replies.get(turn)
        if reply is None:
            return
        if isinstance(event, NoUsableFrames):
            await self._send_turn(turn, protocol.error("No frames buffered"))
            return
        if isinstance(event, FramesSelected):
            reply.selected = event
            if reply.question.strip():  # else the engine may transcribe first: input.transcript precedes
                await self._start_response(turn, reply)
            return
        if isinstance(event, TurnEnd):
            await self._end_turn(turn, reply, event)
            return
        if isinstance(event, Transcript):
            reply.transcript = event.text
            await self._send_turn(turn, protocol.input_transcript(event.text))
        await self._start_response(turn, reply)
        if reply.with_ids and not reply.consumed_sent and reply.selected is not None:
            reply.consumed_sent = True
            consumed = protocol.frames_consumed(
                turn.request_id,
                [f.meta for f in reply.selected.frames],
                model_selected_ms=reply.selected.selected_ms,
                decoded_ready_ms=reply.selected.decoded_ready_ms,
            )
            await self._send_turn(turn, consumed)
        if isinstance(event, TextDelta):
            reply.text.append(event.delta)
            if "text" in reply.modalities and event.delta:
                await self._send_turn(turn, protocol.text_delta(event.delta))
                reply.clock.text_sent()
        elif isinstance(event, TextEnd):  # the answer's text is complete; its audio may follow
            await self._complete_text(turn, reply, "".join(reply.text))
        elif isinstance(event, AudioChunk) and "audio" in reply.modalities and event.pcm:
            reply.audio_deltas += 1
            await self._send_turn(turn, protocol.audio_delta(event.pcm, self._event_names()))
            reply.clock.audio_sent()

    async def _complete_text(self, turn: ActiveTurn, reply: _Reply, text: str) -> None:
        """response.text.done, and the turn joins the history: a client may ask its next question
        (interrupting the audio) as soon as it has the text."""
        if reply.text_done:
            return
        reply.text_done = True
        await self._send_turn(turn, protocol.text_done(text))
        question = reply.question if reply.question.strip() else reply.transcript or ""
        if self.conversation is not None and self.conversation.history is not None:
            self.conversation.history.remember(question, text)

    async def _start_response(self, turn: ActiveTurn, reply: _Reply) -> None:
        if not reply.started:
            reply.started = True
            await self._send_turn(turn, protocol.response_start())

    async def _end_turn(self, turn: ActiveTurn, reply: _Reply, end: TurnEnd) -> None:
        if end.ok:
            if end.transcript is not None:
                reply.transcript = end.transcript
            await self._start_response(turn, reply)
            await self._complete_text(turn, reply, end.text or "")
            if reply.audio_deltas:
                await self._send_turn(turn, protocol.audio_done(self._event_names()))
            reply.clock.ended(ok=True)
        elif end.status == "cancelled" and turn.interrupted:
            return
        else:
            # End messages are the engine's own fixed, client-safe texts (capacity, refusals, a lost
            # worker, an upstream model that failed), never exception text.
            kind = end.kind or ErrorKind.ENGINE
            logger.warning("video turn %s ended with %s (%s): %s", turn.request_id, end.status, kind, end.message)
            await self._turn_failed(turn, reply, end.message or FAILED, kind)

    async def _turn_failed(self, turn: ActiveTurn, reply: _Reply, message: str, kind: ErrorKind) -> None:
        """Failures still close the response: error, then response.text.done with what was said, and
        response.audio.done when audio had started (a player waiting for the end hears it)."""
        if not turn.interrupted:
            reply.clock.ended(ok=False)
        await self._start_response(turn, reply)
        await self._send_turn(turn, protocol.error(message, kind))
        if not reply.text_done:  # a failed answer is not remembered
            reply.text_done = True
            await self._send_turn(turn, protocol.text_done("".join(reply.text)))
        if reply.audio_deltas:
            await self._send_turn(turn, protocol.audio_done(self._event_names()))

    def _event_names(self) -> str:
        return self.config.event_names if self.config is not None else "seed"

    async def _send_turn(self, turn: ActiveTurn, payload: dict[str, Any]) -> None:
        """An interrupted turn sends nothing more."""
        if not turn.interrupted and self.state is not SessionState.CLOSED:
            await self.send_json(payload)

    # -- errors, timeouts, shutdown ----------------------------------------------------------------
    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        await self.send_json(protocol.error(message, kind))
        await self._close_session()

    async def _close_session(self) -> None:
        if self.state is SessionState.CLOSED:
            return
        await self._shutdown()
        await self.close()

    async def _shutdown(self) -> None:
        """Stop every task of the session (the active turn's engine request is aborted)."""
        current = asyncio.current_task()
        tasks = [t for t in getattr(self, "tasks", []) if t is not current]
        for task in tasks:
            if not task.done():
                task.cancel()
        conversation = getattr(self, "conversation", None)
        if conversation is not None:
            await conversation.close()  # the state is CLOSED before the cancelled tasks run again
        await asyncio.gather(*tasks, return_exceptions=True)

    async def on_timeout(self, awaiting_config: bool) -> None:
        await self.fail("Timeout waiting for session.config" if awaiting_config else "Idle timeout", ErrorKind.TIMEOUT)
