"""One ``/v1/video/chat/stream`` session's wire state over the conversation core, without a socket.

The consumer parses the socket's messages and hands them here in order; ``VideoSession`` turns each
into calls on the core (``Conversation`` with its ``FrameBuffer``, ``AudioBuffer`` and ``History``;
with ``turn_detection`` a ``Listener``) and writes what the wire says back through ``send``: frame
acks, the errors a message earns, the VAD's speech events. Each turn's answer is written by an
``Answer`` (video/answers.py). ``send`` is the only way out, so the tests drive it without a socket.

Frames are checked on the acknowledgement path on the decode pool (omniweb/media/decoding.py, through the
core's ``FrameBuffer``): strict base64, JPEG/PNG header, pixel budget, JPEG scan count, the
similarity thumbnail (a decode, which proves the frame decodes); without the filter, checked ahead of
time at 1/8 scale, also on that pool (once per frame either way: omniweb/media/frames.py). A frame that does
not decode is removed from the buffer and reported; a turn waits for its frames' checks, so the
thinker only ever gets frames known to decode.

A turn (``video.query``) runs as the core's turn task; a newer query interrupts it (the engine
request is aborted and the old turn sends nothing more). With ``turn_detection`` (server VAD, or
semantic VAD, whose pauses an end-of-turn model judges; our extension) the streamed ``audio.chunk``s
also go through the core's ``Listener``: the speaker stopping starts a turn over what was said, the
speaker starting interrupts the answer. Chunks queued behind a VAD call are heard together in the
next one (up to 5 s; the consumer calls ``listen`` once no ``audio.chunk`` is queued next), so a busy
engine or a client sending faster than real time does not delay detection by one round trip per chunk.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from omniweb.base.errors import EngineError
from omniweb.conversation import (
    AudioBuffer,
    AudioRefused,
    BufferedFrame,
    Conversation,
    ConversationState,
    FrameBuffer,
    FrameSelection,
    History,
    Listener,
    Question,
    SpeechSegment,
    TurnSpec,
)
from omniweb.conversation.listening import FEED_MS, Heard
from omniweb.conversation.vad import SemanticVoiceActivity, SpeechStarted, SpeechStopped, VadParams, VoiceActivity
from omniweb.engine.client import EngineClient
from omniweb.media.frames import FrameError

from . import protocol
from .answers import NO_FRAMES, Answer
from .protocol import ProtocolError, VideoSessionConfig

RECEIVED_MS = "_received_ms"  # the reader's receive time of a video.frame, carried in its message
LISTEN_MAX_BYTES = 5 * 2 * protocol.INPUT_SAMPLE_RATE  # at most 5 s of queued audio per VAD call

Send = Callable[[dict[str, Any]], Awaitable[None]]


class VideoSession:
    """The session's state as this wire format sees it; one handler per client message type.

    ``send`` writes a message to the client; ``stopped`` says the client can no longer be written to
    (a turn stops after the event being written); ``report_decode_failure`` hands a frame the decode
    pool rejected back to the consumer's processor (``decode_failed`` then reports it, in order);
    ``on_idle`` is called when a turn ends."""

    def __init__(
        self,
        engine: EngineClient,
        send: Send,
        *,
        stopped: Callable[[], bool],
        report_decode_failure: Callable[[BufferedFrame], None],
        on_idle: Callable[[], None],
    ) -> None:
        self.engine = engine
        self.send = send
        self.stopped = stopped
        self.report_decode_failure = report_decode_failure
        self.conversation = Conversation(engine, on_idle=on_idle)
        self.config: VideoSessionConfig | None = None
        self.listener: Listener | None = None  # with turn_detection: server VAD over the audio
        self.unheard = bytearray()  # audio.chunk PCM not yet through the listener

    @property
    def frames(self) -> FrameBuffer:
        assert self.conversation.frames is not None
        return self.conversation.frames

    @property
    def audio(self) -> AudioBuffer:
        assert self.conversation.audio is not None
        return self.conversation.audio

    def configure(self, config: VideoSessionConfig) -> None:
        """The accepted ``session.config``: the buffers, the history and, with ``turn_detection``, the listener."""
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
                on_decode_failed=self.report_decode_failure,
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

    # -- frames ------------------------------------------------------------------------------------
    async def on_video_frame(self, msg: dict[str, Any]) -> None:
        received_ms = msg.pop(RECEIVED_MS)
        text = msg.get("data", "")
        if not text:
            return  # the seed ignores empty frames silently
        if not isinstance(text, str):
            await self.send(protocol.error("Invalid image data"))
            return
        if len(text) > protocol.MAX_FRAME_SIZE:
            await self.send(protocol.error("Frame too large"))
            return
        try:
            protocol.check_frame_timestamps(msg)
        except ProtocolError as exc:
            await self.send(protocol.error(exc.message))
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
            await self.send(protocol.error(exc.message))
            return
        if not added.accepted:
            await self._send_ack(msg, accepted=False, received_ms=received_ms, reason="filtered")
            return
        dropped_id = added.dropped[-1].meta.get("frame_id") if added.dropped else None
        await self._send_ack(msg, accepted=True, received_ms=received_ms, dropped_frame_id=dropped_id)

    async def _send_ack(self, msg: dict[str, Any], **fields: Any) -> None:
        ack = protocol.frame_ack(msg, buffered_frames=len(self.frames), **fields)
        if ack is not None:
            await self.send(ack)

    async def decode_failed(self, frame: BufferedFrame) -> None:
        if self.frames.remove_failed(frame):
            await self.send(protocol.error("Frame decode failed"))

    # -- audio and the server VAD ------------------------------------------------------------------
    async def on_audio_chunk(self, msg: dict[str, Any]) -> None:
        try:
            pcm = protocol.decode_audio(msg.get("data", ""))
        except ProtocolError as exc:
            await self.listen()  # what came before it is heard first: replies keep the chunks' order
            await self.send(protocol.error(exc.message))
            return
        if self.listener is None:
            if problem := self.audio.append(pcm):
                await self.send(protocol.error(problem))
            return
        self.unheard += pcm  # heard with the rest of the run of chunks queued behind it
        if len(self.unheard) >= LISTEN_MAX_BYTES:
            await self.listen()

    async def listen(self) -> None:
        """Run the audio received since the last call through the server VAD (none: nothing to do)."""
        if not self.unheard:
            return
        assert self.listener is not None
        pcm = bytes(self.unheard)
        self.unheard.clear()
        try:
            events = await self.listener.feed(pcm)
        except AudioRefused as exc:
            await self.send(protocol.error(exc.message))
            return
        except EngineError as exc:  # the VAD call failed (capacity, a lost worker): this audio is unheard
            message = exc.client_message or "Voice activity detection failed"
            await self.send(protocol.error(message, exc.kind))
            return
        for event in events:
            assert not isinstance(event, Heard)  # no streaming transcription here: its listener has no ``early``
            await self.on_heard(event)

    async def on_heard(self, event: SpeechStarted | SpeechStopped | SpeechSegment) -> None:
        """Server VAD: barge-in on speech start, a turn over the speech once it stopped."""
        config = self.config
        assert config is not None and config.turn_detection is not None
        if isinstance(event, SpeechStarted):
            if config.turn_detection.interrupt_response:
                await self.conversation.interrupt()  # as a new query does: the answer stops at once
            await self.send(protocol.speech_started(event.audio_start_ms))
        elif isinstance(event, SpeechStopped):
            await self.send(protocol.speech_stopped(event.audio_end_ms))
        elif event.audio:  # create_response: answered as a video.query without text would be
            await self.conversation.interrupt()
            if not len(self.frames):
                await self.send(protocol.error(NO_FRAMES))
                return
            self.start_turn("", event.audio)

    # -- turns -------------------------------------------------------------------------------------
    async def on_video_query(self, msg: dict[str, Any]) -> None:
        text = msg.get("text", "")
        if not isinstance(text, str):
            await self.send(protocol.error("video.query text must be a string"))
            return
        audio_data = msg.get("audio_data")
        if audio_data:
            try:
                pcm = protocol.decode_audio(audio_data)
            except ProtocolError as exc:
                await self.send(protocol.error(exc.message))
            else:
                append = self.listener.append_unheard if self.listener is not None else self.audio.append
                if problem := append(pcm):
                    await self.send(protocol.error(problem))
        await self.conversation.interrupt()
        if not len(self.frames):
            await self.send(protocol.error(NO_FRAMES))
            return
        if self.listener is not None:
            self.listener.taken()
        self.start_turn(text, self.audio.take())

    def start_turn(self, text: str, audio: bytes) -> None:
        """A turn over the buffered frames: the question's text and/or its audio."""
        config = self.config
        assert config is not None
        snapshot = self.frames.snapshot()
        history = self.conversation.history
        spec = TurnSpec(
            question=Question(text=text, audio=audio),
            frames=snapshot,
            selection=FrameSelection(
                num_frames=config.num_frames,
                strategy=config.sampling_strategy,
                window_seconds=config.window_seconds or protocol.DEFAULT_WINDOW_SECONDS,
            ),
            history=history.messages() if history is not None else (),
            instructions=config.system_prompt,
            modalities=tuple(config.modalities),
            voice=config.voice,
            model=config.model,
            admit_budget=settings.ENGINE_TURN_ADMIT_BUDGET_MS / 1000.0,
            request_id=f"video-{uuid.uuid4().hex[:12]}",
        )
        answer = Answer(
            send=self._send_while_open,
            request_id=spec.request_id,
            question=text,
            modalities=tuple(config.modalities),
            with_ids=any(f.meta.get("frame_id") for f in snapshot),
            event_names=config.event_names,
            history=history,
        )
        self.conversation.start_turn(spec, answer.emit, stopped=self.stopped)

    async def _send_while_open(self, payload: dict[str, Any]) -> None:
        """A turn's messages stop once the session is closed."""
        if self.conversation.state is not ConversationState.CLOSED:
            await self.send(payload)
