"""The input audio of a Realtime session: ``input_audio_buffer.*``, the server VAD's turns and the
user items' transcripts.

Input audio (PCM16 24 kHz) goes to the core's ``Listener``: its ``AudioBuffer`` and, with
``server_vad``, ``omniweb.conversation.vad.VoiceActivity`` (with ``semantic_vad``, ``SemanticVoiceActivity``, whose
pauses the engine's end-of-turn model judges). ``speech_started`` names the item the speech will be
and, during a response with ``interrupt_response``, cancels it (over WebRTC it also silences the
answer track, which may still be playing an answer that is done); ``speech_stopped`` then the speech
(``SpeechSegment``) becomes that user item and, with ``create_response``, is answered. The Listener
transcribes the speech early, at a silence inside it, and streams what it is sure of (``Heard``: the
item's first transcript deltas). ``input_audio_buffer.commit`` / ``.clear`` are its ``commit`` /
``clear``. Appends come in the session's input format (G.711 is decoded and resampled here, at
the edge). With ``server_vad``'s ``idle_timeout_ms``, silence that long once the last answer has
played (``IdleTimer``) commits the buffer and answers it (``input_audio_buffer.timeout_triggered``).

``Transcriber`` transcribes a user item's audio on the engine when no response does, and sends its
transcript as ``transcripts.InputTranscripts`` writes it. Both write through ``send`` and reach the
session's responses through ``Responses``; the tests drive them without a socket.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from omniweb.base.tasks import spawn
from omniweb.conversation import AudioRefused, Heard, Listener, SpeechSegment
from omniweb.conversation.vad import SemanticVoiceActivity, SpeechStarted, SpeechStopped, VadParams, VoiceActivity
from omniweb.engine.client import EngineClient

from . import server_events
from .audio import MIN_COMMIT_MS, SAMPLE_RATE, InputDecoder, pcm_ms
from .conversation_items import ConversationItems, Send, for_event
from .errors import RealtimeError, new_id
from .events import AudioAppendEvent, AudioClearEvent, AudioCommitEvent, ResponseParams
from .items import Item
from .responding import AnswerAudio, Responses
from .responses import ResponseStream
from .session import AnySession, SemanticVad, ServerVad
from .transcripts import InputTranscripts

logger = logging.getLogger(__name__)


class TranscriptOf(Protocol):
    """Whisper's segment texts of PCM16 24 kHz audio, on the engine; None when it failed."""

    def __call__(self, pcm24: bytes, request_id: str) -> Awaitable[list[str] | None]: ...


class Transcriber:
    """The user items' input audio transcription: each transcript's events, in order."""

    def __init__(
        self,
        send: Send,
        session: Callable[[], AnySession],
        transcript_of: TranscriptOf,
        spawn: Callable[[Coroutine[Any, Any, Any], str], None],
    ) -> None:
        self.send = send
        self.session = session
        self.transcript_of = transcript_of
        self.spawn = spawn
        self.transcripts = InputTranscripts()  # the deltas streaming sent per item

    @property
    def on(self) -> bool:
        """Transcription is on (``audio.input.transcription``): the client gets the transcripts."""
        return self.session().audio.input.transcription is not None

    def start(self, item: Item) -> None:
        """With transcription on, the item's audio is transcribed in the background."""
        if self.on:
            self.spawn(self._transcribe(item), "realtime transcription")

    async def _transcribe(self, item: Item) -> None:
        segments = await self.transcript_of(item.audio, new_id("asr"))
        if segments is None:
            await self.send(server_events.transcription_failed(item.id, "Transcription failed"))
        else:
            await self.transcribed(item, segments)

    async def transcribed(self, item: Item, segments: Sequence[str]) -> None:
        """The item's transcript; with transcription on, its deltas (one per Whisper segment), then
        ``.completed``."""
        for payload in self.transcripts.transcribed(item, segments, announce=self.on):
            await self.send(payload)

    async def heard(self, item_id: str, delta: str) -> None:
        """Streaming recognition: with transcription on, the item's next delta."""
        if self.on:
            for payload in self.transcripts.heard(item_id, delta):
                await self.send(payload)


class InputAudio:
    """The input audio buffer and the server VAD's turns over ``listener``."""

    def __init__(
        self,
        send: Send,
        listener: Listener,
        items: ConversationItems,
        transcriber: Transcriber,
        responses: Responses,
        *,
        session: Callable[[], AnySession],
        engine: EngineClient,
        output: AnswerAudio | None = None,
        post: Callable[[IdleTimedOut], None] | None = None,
    ) -> None:
        self.send = send
        self.listener = listener
        self.items = items
        self.transcriber = transcriber
        self.responses = responses
        self.session = session
        self.engine = engine
        self.output = output  # a WebRTC call's answer track: speech over it silences it
        self.vad_item_id: str | None = None  # the item id announced with speech_started
        self.decoder = InputDecoder()  # appends in the session's input format → PCM16 24 kHz
        # server_vad's idle_timeout_ms: its report comes back through ``post`` (the session's inbox),
        # in order with the client's events; without one there is no idle timeout.
        self.idle = IdleTimer(post, self._written_ms) if post is not None else None
        responses.on_finished = self._response_finished

    def configure_vad(self) -> None:
        """The session's ``turn_detection`` from now on: its detector, or none (manual turns)."""
        td = self.session().turn_detection
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
        self._arm_idle()  # from now, unless a response is running (its end arms it)

    async def on_append(self, event: AudioAppendEvent) -> None:
        fmt = self.session().audio.input.format.type
        if self.decoder.format != fmt:  # G.711 keeps a resampler across appends: one per format
            self.decoder = InputDecoder(fmt)
        with for_event(event.event_id):
            pcm = self.decoder.decode(event.audio)
        await self.feed(pcm, event.event_id)

    async def feed(self, pcm: bytes, event_id: str | None = None) -> None:
        """Input audio (PCM16 24 kHz: an append's, or a WebRTC call's track) into the buffer and
        the VAD, whose turns are acted on."""
        try:
            heard = await self.listener.feed(pcm)
        except AudioRefused as exc:
            raise RealtimeError(exc.message, code="input_audio_buffer_overflow", event_id=event_id) from None
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
                if self.vad_item_id is not None:  # the item speech_started named
                    await self.transcriber.heard(self.vad_item_id, vad_event.delta)
            else:
                await self._spoken(vad_event)

    async def _speech_started(self, event: SpeechStarted) -> None:
        td = self.session().turn_detection
        self.vad_item_id = new_id("item")
        if self.idle is not None:
            self.idle.stop()
        await self.send(server_events.speech_started(event.audio_start_ms, self.vad_item_id))
        if td is not None and td.interrupt_response:
            played = self.output.silence() if self.output is not None else None  # the answer track goes silent first
            if self.responses.running is not None:
                await self.responses.cancel(server_events.cancelled("turn_detected"))
            if played is not None:
                await self.responses.cleared(played)

    async def _speech_stopped(self, event: SpeechStopped) -> None:
        self.vad_item_id = self.vad_item_id or new_id("item")
        await self.send(server_events.speech_stopped(event.audio_end_ms, self.vad_item_id))

    async def _spoken(self, segment: SpeechSegment) -> None:
        """The speech that just stopped becomes a user item and, with ``create_response``, is answered."""
        item_id = self.vad_item_id or new_id("item")
        self.vad_item_id = None
        await self._commit(segment.audio, item_id, event_id=None, transcript=await segment.transcript())
        if self.session().responds:
            if self.responses.running is not None:  # interrupt_response was off: the new turn waits for no one
                await self.responses.cancel(server_events.cancelled("turn_detected"))
            await self.responses.respond(ResponseParams(), event_id=None)
        else:  # nothing answers the turn: the silence after it counts from now
            self._arm_idle()

    async def on_commit(self, event: AudioCommitEvent) -> None:
        ms = self.listener.audio.duration_ms
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
    ) -> Item:
        """The committed audio becomes a user item (committed, added, done), returned; its transcript
        follows, unless it was made early (``transcript``) or the response it starts makes it."""
        item = Item(id=item_id, role="user", content=[{"type": "input_audio", "transcript": None}], audio=pcm)
        self.items.add(item, None, event_id)
        previous = self.items.conversation.previous_of(item)
        await self.send(server_events.audio_committed(item.id, previous))
        await self.send(server_events.item_added(item, previous))
        await self.send(server_events.item_done(item, previous))
        if transcript is not None:
            await self.transcriber.transcribed(item, transcript)
        elif not (self.session().responds and event_id is None):
            self.transcriber.start(item)
        return item

    async def on_clear(self, event: AudioClearEvent) -> None:
        self.listener.clear()
        self.vad_item_id = None
        await self.send(server_events.audio_cleared())

    # -- idle timeout --------------------------------------------------------------------------------
    def _written_ms(self) -> int:
        """The input audio written so far (ms: OpenAI's offsets), whatever the buffer still holds."""
        return self.listener.audio.appended * 1000 // (2 * SAMPLE_RATE)

    def _idle_timeout_ms(self) -> int | None:
        td = self.session().turn_detection
        return td.idle_timeout_ms if isinstance(td, ServerVad) else None

    def _arm_idle(self, playback_ms: int = 0) -> None:
        """The idle clock starts over: ``idle_timeout_ms`` after ``playback_ms`` (the answer's audio
        still to play), unless a response is running; without an idle timeout it stops."""
        if self.idle is None:
            return
        timeout = self._idle_timeout_ms()
        if timeout is None or self.responses.running is not None:
            self.idle.stop()
        else:
            self.idle.start(playback_ms, timeout)

    def _response_finished(self, stream: ResponseStream) -> None:
        """A response ended: the idle clock starts once its audio has played (OpenAI: response.done
        plus the audio's duration)."""
        item = stream.item
        self._arm_idle(item.audio_ms if item is not None and stream.response.audio else 0)

    async def on_idle_timeout(self, report: IdleTimedOut) -> None:
        """The idle timeout passed with no speech: ``input_audio_buffer.timeout_triggered``, the buffer
        committed as a user item (what it holds, maybe nothing) and, in a conversation, answered. A
        report overtaken by speech or a response (or by another report) is dropped."""
        if self.idle is None or not self.idle.take(report):
            return
        if self.listener.speaking or self.responses.running is not None:
            return
        item_id = new_id("item")
        await self.send(server_events.timeout_triggered(report.audio_start_ms, report.audio_end_ms, item_id))
        self.vad_item_id = None
        pcm = self.listener.commit()
        # Speech the VAD did not take for a turn may still be words: transcribed first, they are the
        # question; none, and the response continues the conversation without one.
        heard = await self.transcriber.transcript_of(pcm, new_id("asr")) if pcm_ms(pcm) >= MIN_COMMIT_MS else []
        item = await self._commit(pcm, item_id, event_id=None, transcript=heard or [])
        if self.session().responds:
            await self.responses.respond(ResponseParams(), event_id=None, idle=item)

    def close(self) -> None:
        """The session ended: no idle timeout fires."""
        if self.idle is not None:
            self.idle.stop()


@dataclass(frozen=True, eq=False)
class IdleTimedOut:
    """``idle_timeout_ms`` passed with no speech (the input audio from ``audio_start_ms``, where the
    last answer had played, to ``audio_end_ms``, now): handled in order with the client's events."""

    audio_start_ms: int
    audio_end_ms: int
    type: ClassVar[Literal["input_audio_buffer.idle_timeout"]] = "input_audio_buffer.idle_timeout"


class IdleTimer:
    """One idle clock: ``start`` it (again) and, after the answer's playback and then the timeout, it
    posts an ``IdleTimedOut`` (the input audio positions from ``position_ms``); ``take`` says whether a
    report is the one still due (``stop`` and a new ``start`` make older ones stale)."""

    def __init__(self, post: Callable[[IdleTimedOut], None], position_ms: Callable[[], int]) -> None:
        self.post = post
        self.position_ms = position_ms
        self._task: asyncio.Task[None] | None = None
        self._due: IdleTimedOut | None = None

    def start(self, playback_ms: int, timeout_ms: int) -> None:
        self.stop()
        self._task = spawn(self._run(playback_ms, timeout_ms), "realtime idle timeout")

    def stop(self) -> None:
        task, self._task, self._due = self._task, None, None
        if task is not None and not task.done():
            task.cancel()

    def take(self, report: IdleTimedOut) -> bool:
        if report is not self._due:
            return False
        self._due = None
        return True

    async def _run(self, playback_ms: int, timeout_ms: int) -> None:
        await asyncio.sleep(playback_ms / 1000)
        start_ms = self.position_ms()  # the answer has played: the silence counts from here
        await asyncio.sleep(timeout_ms / 1000)
        self._task = None
        self._due = report = IdleTimedOut(start_ms, self.position_ms())
        self.post(report)
