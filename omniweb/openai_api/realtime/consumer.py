"""Transport for ``/v1/realtime``: OpenAI's Realtime API (GA) as an adapter over the conversation core.

One session per WebSocket. ``receive`` is the socket's single reader (Channels dispatches one
message at a time), so events are handled in arrival order: each is parsed by
``omniweb.openai_api.realtime.events`` into a typed event and goes to its one handler. A refused event is
answered with an ``error`` event (its ``event_id`` echoed) and the session goes on.

What the parts are for:

- The effective session (``session.Session``) and the conversation's items (``items.Conversation``)
  are this wire format's own; the thinker is given their text as history.
- Images (``input_image`` parts) enter the core's ``FrameBuffer``: the video endpoint's decoding
  guards, similarity filter and limits; a response looks at the latest of them.
- Input audio (PCM16 24 kHz) goes to the core's ``Listener``: its ``AudioBuffer`` at 24 kHz and, with
  ``server_vad``, ``omniweb.vad.VoiceActivity`` (Silero on the engine, fed 16 kHz by the core; with
  ``semantic_vad``, ``SemanticVoiceActivity``, whose pauses the engine's end-of-turn model judges):
  ``speech_started`` during a response cancels it (``interrupt_response``); ``speech_stopped`` commits
  the speech as a user item and, with ``create_response``, starts a response. The Listener also
  transcribes the speech early, at a silence inside it, so the question is usually transcribed by
  the time the turn is certain; ``input_audio_buffer.commit`` / ``.clear`` are its ``commit`` / ``clear``.
- A response is one core turn (``omniweb.conversation``): the video thinker → talker → vocoder on the
  engine, whose typed chunks become ``response.*`` events (``responses.ResponseStream`` writes one
  response's wire: its opening, deltas and closing events). The question is the last user item: its
  text, or its audio (the engine's Whisper transcribes it first, which is also the item's
  ``input_audio_transcription``; ``transcripts.InputTranscripts`` writes a transcript's events). The
  talker's word timings are kept with the assistant item, so ``conversation.item.truncate`` cuts its
  transcript to exactly the words heard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings

from omniweb import budget as process_budget
from omniweb import metrics
from omniweb.asr.pipeline import PIPELINE as TRANSCRIBE_PIPELINE
from omniweb.conversation import (
    ActiveTurn,
    AudioBuffer,
    AudioRefused,
    BufferedFrame,
    Conversation,
    EarlyTranscription,
    FrameBuffer,
    FrameSelection,
    Heard,
    History,
    Inbox,
    InboxLimits,
    Listener,
    NoUsableFrames,
    Question,
    SpeechSegment,
    Transcript,
    TurnEnd,
    TurnEvent,
    TurnSpec,
    now_ms,
)
from omniweb.conversation.clock import SessionClock
from omniweb.conversation.listening import FEED_MS
from omniweb.engine.client import EngineClient
from omniweb.engine.runtime import get_engine_client
from omniweb.engine.scheduler import BATCH_PRIORITY
from omniweb.errors import ErrorKind
from omniweb.media.frames import DEFAULT_FRAME_FILTER_THRESHOLD, FrameError
from omniweb.openai_api.protocol import voice_table
from omniweb.protocol import dumps
from omniweb.sessions import SessionConsumer
from omniweb.tasks import spawn
from omniweb.vad import SemanticVoiceActivity, SpeechStarted, SpeechStopped, VadParams, VoiceActivity
from speech.tts.model import capabilities

from . import events, items, server_events
from .audio import MAX_INPUT_AUDIO_MS, MIN_COMMIT_MS, SAMPLE_RATE, decode_pcm16, to_engine_rate
from .errors import RealtimeError, error_event, new_id
from .responses import ResponseStream, Status
from .session import DEFAULT_MODEL, AnySession, SemanticVad, Session, TranscriptionSession, new_session, update_session
from .transcripts import InputTranscripts

logger = logging.getLogger(__name__)

ENDPOINT = "/v1/realtime"
SUBPROTOCOL = "realtime"  # what OpenAI's browser clients offer next to openai-insecure-api-key.<token>
LARGE_MESSAGE = 1024 * 1024  # parse events above this size off the event loop
BYTES_PER_MS = SAMPLE_RATE * 2 // 1000
NUM_FRAMES = 4  # the latest images a response looks at
MAX_FRAMES = 16  # images kept for the conversation (oldest go first)
MAX_ITEMS = 200
# Events read, not yet handled: past these the reader waits (the socket paces the client), so a
# response.cancel behind a long run of appends waits at most this much.
INBOX_LIMITS = InboxLimits(max_messages=256, max_bytes=64 * 1024 * 1024, wait=True)


@dataclass(eq=False)
class _Running:
    """The response in flight: its wire (``stream``), its core turn and its latency clock."""

    stream: ResponseStream
    turn: ActiveTurn | None = None
    clock: metrics.TurnClock = field(default_factory=metrics.TurnClock)
    finished: bool = False  # it emits nothing more


class RealtimeConsumer(SessionConsumer):
    async def connect(self) -> None:
        # First use may load the models: off the event loop.
        self.engine: EngineClient = await asyncio.to_thread(get_engine_client)
        caps = capabilities()
        # Every name a session may use → the local voice: OpenAI's (as /v1/audio/speech maps them) and ours.
        self.voices = voice_table(settings.OPENAI_VOICE_MAP, caps.voices, caps.default_voice) | {
            v: v for v in caps.voices
        }
        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        model = (query.get("model") or [DEFAULT_MODEL])[0][:128]
        intent = (query.get("intent") or [None])[0]  # "transcription": a transcription session
        # SessionConsumer.config: never None here
        self.config: AnySession = new_session(self.voices, model=model, intent=intent)
        self.items = items.Conversation(MAX_ITEMS)
        self.vad_item_id: str | None = None  # the item id announced with speech_started
        self.transcripts = InputTranscripts()  # the input audio transcription's deltas per item
        self.running: _Running | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.handlers: dict[str, Callable[[Any], Awaitable[None]]] = {
            "session.update": self.on_session_update,
            "input_audio_buffer.append": self.on_audio_append,
            "input_audio_buffer.commit": self.on_audio_commit,
            "input_audio_buffer.clear": self.on_audio_clear,
            "conversation.item.create": self.on_item_create,
            "conversation.item.delete": self.on_item_delete,
            "conversation.item.retrieve": self.on_item_retrieve,
            "conversation.item.truncate": self.on_item_truncate,
            "response.create": self.on_response_create,
            "response.cancel": self.on_response_cancel,
        }
        self.closed = False  # from here on, _shutdown has something to stop
        # Events in arrival order (a refusal of one that did not parse keeps its place); one
        # processor handles them, so the reader stays free to stop a response at once.
        self.inbox: Inbox[events.ClientEvent | RealtimeError] = Inbox(
            self._handle, INBOX_LIMITS, gate=lambda: not self.closed
        )
        self.core = Conversation(self.engine, on_idle=self._touch)
        self.core.configure(
            frames=FrameBuffer(
                max_frames=MAX_FRAMES,
                max_bytes=settings.VIDEO_MAX_BUFFER_BYTES,
                max_pixels=settings.VIDEO_MAX_FRAME_PIXELS,
                # A camera client sends an image every second or so: one that looks like the last one
                # kept is not buffered again (its item still joins the conversation).
                filter_threshold=DEFAULT_FRAME_FILTER_THRESHOLD,
                on_decode_failed=self._decode_failed,
            ),
            audio=AudioBuffer(MAX_INPUT_AUDIO_MS * BYTES_PER_MS, SAMPLE_RATE),  # the input audio buffer
            history=History(0),  # the items are the history
        )
        assert self.core.audio is not None
        self.listener = Listener(
            None,  # _configure_vad gives it the session's detector
            self.core.audio,
            feed_ms=FEED_MS,
            early=EarlyTranscription(self._listened, stream_ms=settings.ASR_STREAM_INTERVAL_MS),
        )
        self._configure_vad()
        self.clock = SessionClock(
            config_timeout=settings.VIDEO_IDLE_TIMEOUT,
            idle_timeout=settings.VIDEO_IDLE_TIMEOUT,
            configured=lambda: True,
            paused=lambda: self.running is not None,  # no idle timeout while a response streams
            closed=lambda: self.closed,
            on_timeout=self.on_timeout,
        )
        offered = [str(p) for p in self.scope.get("subprotocols") or []]
        await self.accept(SUBPROTOCOL if SUBPROTOCOL in offered else None)
        self._spawn(self.clock.run(), "realtime session clock")
        self._spawn(self.inbox.run(), "realtime session inbox")
        await self.send_event(server_events.session_created(self.config))

    async def disconnect(self, code: int) -> None:
        await self._shutdown()
        logger.info("realtime session closed (code %s)", code)

    def _spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> None:
        """A task of the session (cancelled at its end); finished ones are forgotten."""
        self.tasks = [t for t in self.tasks if not t.done()]
        self.tasks.append(spawn(coro, what))

    def _touch(self) -> None:
        if getattr(self, "clock", None) is not None:
            self.clock.touch()

    # -- sending -----------------------------------------------------------------------------------
    async def send_event(self, payload: dict[str, Any]) -> None:
        if not self.closed:
            await self.send(text_data=dumps(payload))

    async def _send_all(self, payloads: Sequence[dict[str, Any]]) -> None:
        for payload in payloads:
            await self.send_event(payload)

    async def refuse(self, err: RealtimeError, kind: ErrorKind | None = None) -> None:
        if kind is None:
            kind = ErrorKind.ENGINE if err.type == "server_error" else ErrorKind.CLIENT
        metrics.count_error(kind.value)
        await self.send_event(error_event(err))

    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        """A fatal problem (the client stopped reading, the idle timeout): error, then close."""
        metrics.count_error(kind.value)
        err_type = "invalid_request_error" if kind in (ErrorKind.CLIENT, ErrorKind.TIMEOUT) else "server_error"
        await self.send_event(error_event(RealtimeError(message, code=kind.value, type=err_type)))
        await self._shutdown()
        await self.close()

    async def on_timeout(self, awaiting_config: bool) -> None:
        await self.fail("Idle timeout: no event from the client; session closed", ErrorKind.TIMEOUT)

    # -- the single reader -------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.closed:
            return
        self.clock.touch()
        raw: str | bytes = text_data if text_data is not None else (bytes_data or b"")
        item: events.ClientEvent | RealtimeError
        try:
            if len(raw) > LARGE_MESSAGE:
                item = await asyncio.to_thread(events.parse_event, raw, voices=self.voices)
            else:
                item = events.parse_event(raw, voices=self.voices)
        except RealtimeError as err:
            item = err
        if not isinstance(item, RealtimeError) and item.type == "response.cancel":
            await self._stop_generating()
        await self.inbox.deliver(item, len(raw))

    async def _stop_generating(self) -> None:
        """A ``response.cancel`` overtakes the events queued before it: the running response's
        engine request is aborted now and it emits nothing more; the cancel is then answered in
        order (``response.done`` cancelled). Not when a ``response.create`` waits before it: that
        one must still find this response running, as it would have."""
        running = self.running
        if running is None or running.finished:
            return
        if any(isinstance(queued, events.ResponseCreateEvent) for queued in self.inbox):
            return
        await self.core.interrupt()  # the turn emits nothing more; _cancel then finds it stopped

    async def _handle(self, item: events.ClientEvent | RealtimeError) -> None:
        """One event from the inbox: its handler, or its refusal (an error event, the session goes on)."""
        try:
            if isinstance(item, RealtimeError):
                raise item
            await self.handlers[item.type](item)
        except RealtimeError as err:
            await self.refuse(err)
        except Exception:  # a bug or an engine failure in one handler: report it, keep the session
            logger.exception("realtime event handler failed")
            err = RealtimeError("The server could not handle the event", code="server_error", type="server_error")
            await self.refuse(err, ErrorKind.ENGINE)

    # -- session -----------------------------------------------------------------------------------
    async def on_session_update(self, event: events.SessionUpdateEvent) -> None:
        try:
            session = update_session(self.config, event.session, self.voices)
        except RealtimeError as err:
            err.event_id = event.event_id
            raise
        before = self.config.turn_detection
        self.config = session
        if session.turn_detection != before:
            self._configure_vad()
        await self.send_event(server_events.session_updated(session))

    def _configure_vad(self) -> None:
        td = self.config.turn_detection
        if td is None:
            self.listener.listen_with(None)
            return
        if isinstance(td, SemanticVad):
            vad: VoiceActivity = SemanticVoiceActivity(self.engine, td.eagerness, sample_rate=SAMPLE_RATE)
        else:
            params = VadParams(td.threshold, td.prefix_padding_ms, td.silence_duration_ms)
            vad = VoiceActivity(self.engine, params, sample_rate=SAMPLE_RATE)
        self.listener.listen_with(vad)
        self.vad_item_id = None

    # -- input audio -------------------------------------------------------------------------------
    async def on_audio_append(self, event: events.AudioAppendEvent) -> None:
        try:
            pcm = decode_pcm16(event.audio)
        except RealtimeError as err:
            err.event_id = event.event_id
            raise
        try:
            heard = await self.listener.feed(pcm)
        except AudioRefused as exc:
            raise RealtimeError(exc.message, code="input_audio_buffer_overflow", event_id=event.event_id) from None
        except Exception as exc:  # the engine could not run the detector: say so, keep the session
            logger.warning("voice activity detection failed: %s", exc)
            message = getattr(exc, "client_message", None) or "Voice activity detection failed"
            raise RealtimeError(message, code="vad_failed", type="server_error") from None
        for vad_event in heard:
            if isinstance(vad_event, SpeechStarted):
                await self._speech_started(vad_event)
            elif isinstance(vad_event, SpeechStopped):
                await self._speech_stopped(vad_event)
            elif isinstance(vad_event, Heard):
                await self._heard(vad_event)
            else:
                await self._spoken(vad_event)

    async def _heard(self, event: Heard) -> None:
        """Streaming recognition: more of the speech in progress is certain; with transcription
        on it is the item's next delta (the item is the one speech_started named)."""
        item_id = self.vad_item_id
        if item_id is None or self.config.audio.input.transcription is None:
            return
        await self._send_all(self.transcripts.heard(item_id, event.delta))

    async def _speech_started(self, event: SpeechStarted) -> None:
        td = self.config.turn_detection
        self.vad_item_id = new_id("item")
        await self.send_event(server_events.speech_started(event.audio_start_ms, self.vad_item_id))
        if td is not None and td.interrupt_response and self.running is not None:
            await self._cancel(server_events.cancelled("turn_detected"))

    async def _speech_stopped(self, event: SpeechStopped) -> None:
        self.vad_item_id = self.vad_item_id or new_id("item")
        await self.send_event(server_events.speech_stopped(event.audio_end_ms, self.vad_item_id))

    async def _spoken(self, segment: SpeechSegment) -> None:
        """The speech that just stopped becomes a user item and, with ``create_response``, is answered."""
        item_id = self.vad_item_id or new_id("item")
        self.vad_item_id = None
        item = await self._commit(segment.audio, item_id, event_id=None, transcript=await segment.transcript())
        if item is not None and self.config.responds:
            if self.running is not None:  # interrupt_response was off: the new turn waits for no one
                await self._cancel(server_events.cancelled("turn_detected"))
            await self._respond(events.ResponseParams(), event_id=None)

    async def on_audio_commit(self, event: events.AudioCommitEvent) -> None:
        audio = self.core.audio
        assert audio is not None
        ms = audio.duration_ms
        if ms < MIN_COMMIT_MS:
            raise RealtimeError(
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {ms:.2f}ms of audio.",
                code="input_audio_buffer_commit_empty",
                event_id=event.event_id,
            )
        item_id = self.vad_item_id or new_id("item")
        self.vad_item_id = None
        await self._commit(self.listener.commit(), item_id, event_id=event.event_id)

    async def _commit(
        self, pcm: bytes, item_id: str, event_id: str | None, transcript: Sequence[str] | None = None
    ) -> items.Item | None:
        """The committed audio becomes a user item (committed, added, done); its transcript follows,
        unless it was made early (``transcript``)."""
        item = items.Item(id=item_id, role="user", content=[{"type": "input_audio", "transcript": None}], audio=pcm)
        if not self._add_item(item, None, event_id):
            return None
        previous = self.items.previous_of(item)
        await self.send_event(server_events.audio_committed(item.id, previous))
        await self.send_event(server_events.item_added(item, previous))
        await self.send_event(server_events.item_done(item, previous))
        if transcript is not None:
            await self._transcribed(item, transcript)
            return item
        responding = self.config.responds and event_id is None
        if self.config.audio.input.transcription is not None and not responding:
            self._spawn(self._transcribe(item), "realtime transcription")
        return item

    async def on_audio_clear(self, event: events.AudioClearEvent) -> None:
        self.listener.clear()
        self.vad_item_id = None
        await self.send_event(server_events.audio_cleared())

    async def _transcribe(self, item: items.Item) -> None:
        """The item's transcript when no response transcribes it."""
        segments = await self._transcript_of(item.audio, new_id("asr"))
        if segments is None:
            await self.send_event(server_events.transcription_failed(item.id, "Transcription failed"))
        else:
            await self._transcribed(item, segments)

    async def _listened(self, pcm24: bytes, *, prefix: str | None, partial: bool) -> list[str] | None:
        """The listener's transcriptions: early ones (at a silence in the speech) and, with
        transcription on, the streaming partials (batch priority: they wait for real-time work)."""
        if partial and self.config.audio.input.transcription is None:
            return None  # nobody reads the deltas
        return await self._transcript_of(pcm24, new_id("asr"), prefix=prefix, partial=partial)

    async def _transcript_of(
        self, pcm24: bytes, request_id: str, *, prefix: str | None = None, partial: bool = False
    ) -> list[str] | None:
        """Whisper's segment texts, on the engine (``audio.transcribe``, the model
        /v1/audio/transcriptions uses); None when the engine refused or failed."""
        transcription = self.config.audio.input.transcription
        request: dict[str, Any] = {
            "pipeline": TRANSCRIBE_PIPELINE,
            "audio": to_engine_rate(pcm24),
            "prompt": transcription.prompt if transcription is not None else None,
            "temperature": 0.0,
            "words": False,
            "timestamps": False,
            "prefix": prefix,
        }
        if partial:
            request["priority"] = BATCH_PRIORITY
        else:  # the turn's own transcript: its speaker waits for the answer
            request["admit_budget"] = settings.ENGINE_TURN_ADMIT_BUDGET_MS / 1000.0
        texts: list[str] = []
        async with contextlib.aclosing(self.engine.stream(request, request_id)) as stream:
            async for chunk in stream:
                if chunk.get("type") == "segment":
                    texts.append(str(chunk["segment"].get("text", "")))
                elif chunk.get("type") == "end" and chunk.get("status") != "ok":
                    logger.warning(
                        "realtime transcription ended with %s: %s", chunk.get("status"), chunk.get("message")
                    )
                    return None
        return texts

    async def _transcribed(self, item: items.Item, segments: Sequence[str]) -> None:
        """The item's transcript; with transcription on, its deltas (one per Whisper segment), then
        ``.completed``."""
        announce = self.config.audio.input.transcription is not None
        await self._send_all(self.transcripts.transcribed(item, segments, announce=announce))

    # -- items -------------------------------------------------------------------------------------
    def _add_item(self, item: items.Item, previous_item_id: str | None, event_id: str | None) -> bool:
        """Place an item; items over the cap go (their audio back to the process budget)."""
        if item.audio and not process_budget.reserve(len(item.audio)):
            raise RealtimeError(
                process_budget.FULL_MESSAGE, code="server_overloaded", type="server_error", event_id=event_id
            )
        try:
            _, dropped = self.items.add(item, previous_item_id)
        except RealtimeError as err:
            process_budget.release(len(item.audio))
            err.event_id = event_id
            raise
        for old in dropped:
            process_budget.release(len(old.audio))
        return True

    async def on_item_create(self, event: events.ItemCreateEvent) -> None:
        spec = event.item
        try:
            self.items.check_placement(spec.id, event.previous_item_id)
        except RealtimeError as err:
            err.event_id = event.event_id
            raise
        item = items.Item(id=spec.id or new_id("item"), role=spec.role, content=[])
        audio = bytearray()
        for index, part in enumerate(spec.content):
            param = f"item.content[{index}]"
            if part.type == "input_image":
                await self._add_image(item, part, f"{param}.image_url", event.event_id)
                item.content.append({"type": "input_image", "detail": part.detail})
            elif part.type == "input_audio":
                if part.audio:
                    max_bytes = MAX_INPUT_AUDIO_MS * BYTES_PER_MS
                    try:
                        audio += decode_pcm16(part.audio, max_bytes=max_bytes, param=f"{param}.audio")
                    except RealtimeError as err:
                        err.event_id = event.event_id
                        raise
                elif not part.transcript:
                    raise RealtimeError(
                        "An input_audio part needs audio or a transcript", param=param, event_id=event.event_id
                    )
                item.content.append({"type": "input_audio", "transcript": part.transcript})
            else:
                item.content.append(part.model_dump(exclude_none=True))
        item.audio = bytes(audio)
        self._add_item(item, event.previous_item_id, event.event_id)
        previous = self.items.previous_of(item)
        await self.send_event(server_events.item_added(item, previous))
        await self.send_event(server_events.item_done(item, previous))
        if item.audio and self.config.audio.input.transcription is not None and not item.text():
            self._spawn(self._transcribe(item), "realtime transcription")

    async def _add_image(self, item: items.Item, part: events.InputImage, param: str, event_id: str | None) -> None:
        b64 = events.image_from_data_url(part.image_url, param=param)
        frames = self.core.frames
        assert frames is not None
        try:
            # The buffer holds the image, not the item: its bytes leave with the buffer's oldest.
            await frames.add(b64, received_ms=now_ms(), meta={"item_id": item.id})
        except FrameError as exc:
            raise RealtimeError(exc.message, param=param, code="invalid_image", event_id=event_id) from None

    def _decode_failed(self, frame: BufferedFrame) -> None:
        frames = self.core.frames
        if frames is not None and frames.remove_failed(frame):
            item_id = frame.meta.get("item_id")
            err = RealtimeError(f"The image of item '{item_id}' could not be decoded", code="invalid_image")
            self._spawn(self.refuse(err), "realtime decode report")

    async def on_item_delete(self, event: events.ItemDeleteEvent) -> None:
        try:
            item = self.items.delete(event.item_id)
        except RealtimeError as err:
            err.event_id = event.event_id
            raise
        process_budget.release(len(item.audio))
        await self.send_event(server_events.item_deleted(item.id))

    async def on_item_retrieve(self, event: events.ItemRetrieveEvent) -> None:
        try:
            item = self.items.get(event.item_id)
        except RealtimeError as err:
            err.event_id = event.event_id
            raise
        await self.send_event(server_events.item_retrieved(item))

    async def on_item_truncate(self, event: events.ItemTruncateEvent) -> None:
        running = self.running
        if running is not None and running.stream.item.id == event.item_id:
            # The client stopped playing an answer still being written: stop writing it first.
            await self._cancel(server_events.cancelled("client_cancelled"))
        try:
            self.items.truncate(event.item_id, event.content_index, event.audio_end_ms)
        except RealtimeError as err:
            err.event_id = event.event_id
            raise
        await self.send_event(server_events.item_truncated(event.item_id, event.content_index, event.audio_end_ms))

    # -- responses ---------------------------------------------------------------------------------
    async def on_response_create(self, event: events.ResponseCreateEvent) -> None:
        if isinstance(self.config, TranscriptionSession):
            raise RealtimeError(
                "A transcription session creates no responses; connect to /v1/realtime for a conversation",
                code="invalid_event_type",
                event_id=event.event_id,
            )
        await self._respond(event.response or events.ResponseParams(), event.event_id)

    async def on_response_cancel(self, event: events.ResponseCancelEvent) -> None:
        running = self.running
        if running is None or (event.response_id is not None and event.response_id != running.stream.response.id):
            raise RealtimeError(
                "Cancellation failed: no active response found",
                code="response_cancel_not_active",
                param="response_id" if event.response_id is not None else None,
                event_id=event.event_id,
            )
        await self._cancel(server_events.cancelled("client_cancelled"))

    async def _respond(self, params: events.ResponseParams, event_id: str | None) -> None:
        if self.running is not None:
            raise RealtimeError(
                f"Conversation already has an active response in progress: {self.running.stream.response.id}. "
                "Wait until the response is finished before creating a new one.",
                code="conversation_already_has_active_response",
                event_id=event_id,
            )
        session = self.config
        assert isinstance(session, Session)  # a transcription session refused response.create
        stream = ResponseStream.create(params, session, self.items)
        question = stream.question
        instructions = "\n".join(
            t for t in (params.instructions or session.instructions, self.items.system_text()) if t
        )
        history = self.items.history(before=question)[-2 * max(0, settings.VIDEO_HISTORY_TURNS) :] if question else []
        frames = self.core.frames
        assert frames is not None
        text = question.text() if question is not None else ""
        spec = TurnSpec(
            question=Question(text=text, audio=to_engine_rate(question.audio) if question and not text else b""),
            frames=frames.snapshot(),
            selection=FrameSelection(NUM_FRAMES, "latest_frames"),
            history=history if question else self.items.history(),
            instructions=instructions or None,
            modalities=("text", "audio") if stream.response.audio else ("text",),
            voice=self.voices[stream.response.voice],
            require_frames=False,
            admit_budget=settings.ENGINE_TURN_ADMIT_BUDGET_MS / 1000.0,
            request_id=stream.response.id,
        )
        running = _Running(stream)
        self.running = running
        if stream.in_conversation:
            self._add_item(stream.item, None, event_id)
        await self._send_all(stream.start())
        if not spec.question.text and not spec.question.audio:
            details = server_events.failed("There is no question to answer: add a user item first", "no_input")
            await self._finish(running, "failed", details)
            return
        running.turn = self.core.start_turn(spec, self._emit, stopped=lambda: self.send_stalled or self.client_gone)

    async def _emit(self, turn: ActiveTurn, event: TurnEvent) -> None:
        """One typed event of the running turn → this wire format's events."""
        running = self.running
        if running is None or running.turn is not turn or running.finished:
            return
        stream = running.stream
        if isinstance(event, Transcript):
            if stream.question is not None:
                await self._transcribed(stream.question, [event.text])
        elif isinstance(event, TurnEnd | NoUsableFrames):
            end = stream.end(event)
            if end.refusal is not None:  # the engine did not take it: say so as an error too
                await self.refuse(end.refusal, end.kind)
            await self._finish(running, end.status, end.details)
        else:
            for payload in stream.write(event):
                await self.send_event(payload)
                if payload["type"] == "response.output_text.delta":
                    running.clock.text_sent()
                elif payload["type"] == "response.output_audio.delta":
                    running.clock.audio_sent()

    async def _cancel(self, details: dict[str, Any]) -> None:
        """Stop the running response at once (the engine request is aborted), then close it."""
        running = self.running
        if running is None or running.finished:
            return
        running.finished = True  # the turn emits nothing more from here
        await self.core.interrupt()
        running.finished = False
        await self._finish(running, "cancelled", details)

    async def _finish(self, running: _Running, status: Status, details: dict[str, Any] | None) -> None:
        """The closing events of a response, whatever ended it: content done, item done, response.done."""
        if running.finished:
            return
        running.finished = True
        if self.running is running:
            self.running = None
        *closing, done = running.stream.finish(status, details)
        await self._send_all(closing)
        if status in ("completed", "failed"):
            running.clock.ended(ok=status == "completed")
        if status == "failed":
            metrics.count_error(ErrorKind.ENGINE.value)
        await self.send_event(done)
        self._touch()

    # -- shutdown ----------------------------------------------------------------------------------
    async def _shutdown(self) -> None:
        if getattr(self, "closed", True) or not hasattr(self, "core"):  # closed, or connect never finished
            return
        self.closed = True
        self.running = None
        self.inbox.clear()  # a reader waiting for room goes on (and its event is dropped)
        self.listener.close()
        await self.core.close()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in self.tasks if t is not current), return_exceptions=True)
        self.tasks.clear()
        for item in self.items.items:
            process_budget.release(len(item.audio))
        self.items.items.clear()
        self.handlers.clear()
        self.clock = None  # type: ignore[assignment]
