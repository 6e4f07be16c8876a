"""The Realtime API's input audio without a socket (``realtime/input_audio.py``): the input audio
buffer's append / commit / clear, the server VAD's turns (speech_started names the item, a running
response is interrupted, speech_stopped commits the speech and answers it), the user items'
transcripts, and what a connection opens with (``realtime/opening.py``). The VAD's events are
scripted on the core's ``Listener``; every event sent is one the official SDK parses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

import pytest
from support.realtime_parts import VOICES, RecordingEngine, Wire, b64, manual, pcm, refusal, session

from omniweb.conversation import AudioBuffer, Conversation, Heard, Listener, SpeechSegment
from omniweb.conversation.vad import SemanticVoiceActivity, SpeechStarted, SpeechStopped, VoiceActivity
from omniweb.openai_api.protocol import OPENAI_VOICES
from omniweb.openai_api.realtime.conversation_items import MAX_INPUT_AUDIO_BYTES, ConversationItems
from omniweb.openai_api.realtime.errors import RealtimeError
from omniweb.openai_api.realtime.events import AudioAppendEvent, AudioClearEvent, AudioCommitEvent, ResponseParams
from omniweb.openai_api.realtime.input_audio import InputAudio, Transcriber
from omniweb.openai_api.realtime.opening import new_core, new_listener, session_from_query, voice_names
from omniweb.openai_api.realtime.session import AnySession, Session, TranscriptionSession

TRANSCRIBED = {"audio": {"input": {"transcription": {"model": "whisper-1"}}}}
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


class Answering:
    """The session's responses as the input audio sees them: the one running, cancel, respond."""

    def __init__(self) -> None:
        self.running: object | None = None
        self.calls: list[tuple[str, Any]] = []

    async def cancel(self, details: dict[str, Any]) -> None:
        self.calls.append(("cancel", details["reason"]))
        self.running = None

    async def respond(self, params: ResponseParams, event_id: str | None) -> None:
        self.calls.append(("respond", event_id))


class Input:
    """A session's input audio as its consumer wires it, over the core ``opening`` makes; the
    transcriptions it starts wait in ``spawned`` (``settle`` runs them)."""

    def __init__(self, config: AnySession, segments: Sequence[str] | None = (" Hello.",), audio_bytes: int = 0) -> None:
        self.config = config
        self.segments = segments
        self.asked: list[bytes] = []  # the audio transcribed
        self.spawned: list[Coroutine[Any, Any, Any]] = []
        self.wire = Wire()
        self.core = new_core(RecordingEngine(), on_idle=lambda: None, on_decode_failed=lambda _: None)  # type: ignore[arg-type]
        assert self.core.frames is not None and self.core.audio is not None
        audio = AudioBuffer(audio_bytes, 24000) if audio_bytes else self.core.audio
        self.listener = Listener(None, audio) if audio_bytes else new_listener(self.core, self._listened)
        self.transcriber = Transcriber(self.wire.send, lambda: self.config, self._transcript_of, self._spawn)
        self.items = ConversationItems(
            self.wire.send, self.core.frames, transcribe=self.transcriber.start, stop_writing=self._stop_writing
        )
        self.responses = Answering()
        self.input = InputAudio(
            self.wire.send,
            self.listener,
            self.items,
            self.transcriber,
            self.responses,  # type: ignore[arg-type]
            session=lambda: self.config,
            engine=self.core.engine,
        )
        self.input.configure_vad()

    async def _transcript_of(self, pcm24: bytes, request_id: str) -> list[str] | None:
        assert request_id.startswith("asr_")
        self.asked.append(pcm24)
        return None if self.segments is None else list(self.segments)

    async def _listened(self, pcm24: bytes, *, prefix: str | None, partial: bool) -> list[str] | None:
        raise AssertionError("no early transcription without a VAD")

    def _spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> None:
        assert what == "realtime transcription"
        self.spawned.append(coro)

    async def _stop_writing(self, item_id: str) -> None:
        raise AssertionError("no truncate here")

    async def settle(self) -> None:
        while self.spawned:
            await self.spawned.pop(0)

    def hears(self, *script: list[Any]) -> None:
        """The VAD's events for each append to come, in order."""
        pending = list(script)

        async def feed(pcm24: bytes) -> list[Any]:
            return pending.pop(0)

        self.listener.feed = feed  # type: ignore[method-assign]

    async def append(self, data: bytes, event_id: str | None = None) -> None:
        event = AudioAppendEvent(type="input_audio_buffer.append", audio=b64(data), event_id=event_id)
        await self.input.on_append(event)

    async def commit(self, event_id: str | None = None) -> None:
        await self.input.on_commit(AudioCommitEvent(type="input_audio_buffer.commit", event_id=event_id))


@pytest.fixture
async def opened() -> AsyncIterator[list[Input]]:
    """The sessions a test opens, closed after it (the core's frame decoder stops)."""
    made: list[Input] = []
    yield made
    for one in made:
        await one.core.close()


def opening(made: list[Input], config: AnySession, **kwargs: Any) -> Input:
    made.append(Input(config, **kwargs))
    return made[-1]


def item_id_of(parts: Input) -> str:
    return next(e["item_id"] for e in parts.wire.sent if e["type"] == "input_audio_buffer.committed")


# -- manual turns ------------------------------------------------------------------------------------
async def test_a_commit_makes_the_buffer_a_user_item_then_transcribes_it(opened: list[Input]) -> None:
    parts = opening(opened, manual(**TRANSCRIBED), segments=[" How many", " people?"])
    await parts.append(pcm(120))
    await parts.append(pcm(80))
    assert parts.wire.sent == []  # without a VAD, appends only buffer
    await parts.commit(event_id="evt_1")
    item_id = item_id_of(parts)
    user = {"id": "<item:1>", "object": "realtime.item", "type": "message", "status": "completed", "role": "user"}
    spoken = user | {"content": [{"type": "input_audio", "transcript": None}]}
    assert parts.wire.events(item_id) == [
        {"type": "input_audio_buffer.committed", "previous_item_id": None, "item_id": "<item:1>"},
        {"type": "conversation.item.added", "previous_item_id": None, "item": spoken},
        {"type": "conversation.item.done", "previous_item_id": None, "item": spoken},
    ]
    [item] = parts.items.conversation.items
    assert item.audio == pcm(200) and parts.listener.audio.duration_ms == 0
    await parts.settle()
    assert parts.asked == [pcm(200)]
    assert parts.wire.events(item_id)[3:] == [
        {"type": DELTA, "item_id": "<item:1>", "content_index": 0, "delta": "How many"},
        {"type": DELTA, "item_id": "<item:1>", "content_index": 0, "delta": " people?"},
        {"type": COMPLETED, "item_id": "<item:1>", "content_index": 0}
        | {"transcript": "How many people?", "usage": {"type": "duration", "seconds": 0.2}},
    ]
    assert item.text() == "How many people?"
    parts.items.close()


async def test_without_transcription_a_commit_is_not_transcribed_and_a_failure_is_reported(
    opened: list[Input],
) -> None:
    parts = opening(opened, manual())
    await parts.append(pcm(100))
    await parts.commit()
    assert parts.spawned == [] and len(parts.wire.sent) == 3
    failing = opening(opened, manual(**TRANSCRIBED), segments=None)
    await failing.append(pcm(100))
    await failing.commit()
    await failing.settle()
    assert failing.wire.events(item_id_of(failing))[-1] == {
        "type": "conversation.item.input_audio_transcription.failed",
        "item_id": "<item:1>",
        "content_index": 0,
        "error": {"type": "server_error", "code": "transcription_failed", "message": "Transcription failed"}
        | {"param": None},
    }
    parts.items.close()
    failing.items.close()


async def test_a_commit_of_too_little_audio_and_a_clear(opened: list[Input]) -> None:
    parts = opening(opened, manual())
    await parts.append(pcm(50))
    with pytest.raises(RealtimeError) as refused:
        await parts.commit(event_id="evt_2")
    assert refusal(refused.value) == {
        "type": "invalid_request_error",
        "code": "input_audio_buffer_commit_empty",
        "message": "Error committing input audio buffer: buffer too small. Expected at least 100ms of audio, "
        "but buffer only has 50.00ms of audio.",
        "param": None,
        "event_id": "evt_2",
    }
    await parts.append(pcm(100))
    await parts.input.on_clear(AudioClearEvent(type="input_audio_buffer.clear"))
    assert parts.wire.types() == ["input_audio_buffer.cleared"]
    assert parts.listener.audio.duration_ms == 0 and parts.items.conversation.items == []


async def test_refused_appends_echo_the_event(opened: list[Input]) -> None:
    parts = opening(opened, manual())
    with pytest.raises(RealtimeError) as refused:
        await parts.input.on_append(AudioAppendEvent(type="input_audio_buffer.append", audio="@@", event_id="evt_3"))
    assert {k: refusal(refused.value)[k] for k in ("code", "param", "event_id")} == {
        "code": "invalid_base64",
        "param": "audio",
        "event_id": "evt_3",
    }
    small = opening(opened, manual(), audio_bytes=len(pcm(100)))
    await small.append(pcm(60))
    with pytest.raises(RealtimeError) as overflow:
        await small.append(pcm(60), event_id="evt_4")
    error = refusal(overflow.value)
    assert (error["code"], error["event_id"]) == ("input_audio_buffer_overflow", "evt_4")
    assert small.listener.audio.duration_ms == 0  # an overflow empties the buffer


# -- server VAD ----------------------------------------------------------------------------------------
async def early(*segments: str) -> list[str]:
    return list(segments)


async def test_a_spoken_turn_interrupts_the_answer_and_is_committed_and_answered(opened: list[Input]) -> None:
    parts = opening(opened, session(**TRANSCRIBED))
    assert isinstance(parts.listener.vad, VoiceActivity)
    parts.responses.running = object()  # an answer is being spoken
    transcript = asyncio.ensure_future(early(" How many", " people?"))
    parts.hears(
        [SpeechStarted(120), Heard("How"), Heard(" many")],
        [SpeechStopped(900), SpeechSegment(pcm(780), 120, 900, early=transcript, heard="How many")],
    )
    await parts.append(pcm(500))
    assert parts.responses.calls == [("cancel", "turn_detected")]  # interrupt_response
    await parts.append(pcm(500))
    item_id = item_id_of(parts)
    at = {"item_id": "<item:1>", "content_index": 0}
    assert [(e["type"], e.get("delta") or e.get("transcript")) for e in parts.wire.events(item_id)] == [
        ("input_audio_buffer.speech_started", None),
        (DELTA, "How"),
        (DELTA, " many"),
        ("input_audio_buffer.speech_stopped", None),
        ("input_audio_buffer.committed", None),
        ("conversation.item.added", None),
        ("conversation.item.done", None),
        (DELTA, " people?"),  # the rest of the early transcript
        (COMPLETED, "How many people?"),
    ]
    events = parts.wire.events(item_id)
    assert events[0] == {"type": "input_audio_buffer.speech_started", "audio_start_ms": 120, "item_id": "<item:1>"}
    assert events[1] == {"type": DELTA, **at, "delta": "How"}
    assert events[3] == {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 900, "item_id": "<item:1>"}
    assert parts.responses.calls[1:] == [("respond", None)]  # create_response
    assert parts.spawned == [] and parts.asked == []  # transcribed early: no other transcription
    parts.items.close()


async def test_without_interrupt_response_the_new_turn_still_replaces_the_answer(opened: list[Input]) -> None:
    parts = opening(opened, session(audio={"input": {"turn_detection": {"interrupt_response": False}}}))
    parts.responses.running = object()
    parts.hears([SpeechStarted(0)], [SpeechStopped(600), SpeechSegment(pcm(600), 0, 600)])
    await parts.append(pcm(300))
    assert parts.responses.calls == []
    await parts.append(pcm(300))
    assert parts.responses.calls == [("cancel", "turn_detected"), ("respond", None)]
    assert parts.wire.types()[-3:] == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert parts.spawned == []  # transcription off; the response transcribes it
    parts.items.close()


async def test_a_transcription_session_commits_and_transcribes_each_turn_without_answering(
    opened: list[Input],
) -> None:
    parts = opening(opened, session(intent="transcription"))
    parts.hears([SpeechStarted(0), SpeechStopped(400), SpeechSegment(pcm(400), 0, 400)])
    await parts.append(pcm(400))
    await parts.settle()
    assert parts.responses.calls == [] and parts.asked == [pcm(400)]
    assert parts.wire.types()[-2:] == [DELTA, COMPLETED]
    parts.items.close()


async def test_a_failed_detector_is_reported_without_the_event(opened: list[Input]) -> None:
    parts = opening(opened, session())

    class Busy(Exception):
        client_message = "The engine is busy"

    async def feed(pcm24: bytes) -> list[Any]:
        raise Busy

    parts.listener.feed = feed  # type: ignore[method-assign]
    with pytest.raises(RealtimeError) as refused:
        await parts.append(pcm(100), event_id="evt_5")
    assert refusal(refused.value) == {
        "type": "server_error",
        "code": "vad_failed",
        "message": "The engine is busy",
        "param": None,
        "event_id": None,
    }


async def test_the_detector_follows_the_sessions_turn_detection(opened: list[Input]) -> None:
    parts = opening(opened, session())
    vad = parts.listener.vad
    assert isinstance(vad, VoiceActivity) and (vad.params.threshold, vad.params.silence_duration_ms) == (0.5, 500)
    parts.input.vad_item_id = "item_said"
    parts.config = session(audio={"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}})
    parts.input.configure_vad()
    assert isinstance(parts.listener.vad, SemanticVoiceActivity) and parts.input.vad_item_id is None
    parts.config = manual()
    parts.input.configure_vad()
    assert parts.listener.vad is None


async def test_streamed_words_need_transcription_on_and_an_announced_item(opened: list[Input]) -> None:
    parts = opening(opened, session())
    parts.hears([Heard("Hi")], [SpeechStarted(0), Heard("Hi")])
    await parts.append(pcm(100))  # no speech_started yet: no item to name
    await parts.append(pcm(100))  # transcription off
    assert parts.wire.types() == ["input_audio_buffer.speech_started"]


# -- opening -----------------------------------------------------------------------------------------
def test_the_query_picks_the_session_and_every_voice_name_maps_to_a_local_voice() -> None:
    voices = voice_names(("heart", "bella"), "heart")
    assert voices == dict.fromkeys(OPENAI_VOICES, "heart") | {"heart": "heart", "bella": "bella"}
    realtime = session_from_query(b"model=" + b"m" * 200, VOICES)
    assert isinstance(realtime, Session) and realtime.model == "m" * 128
    assert realtime.audio.output.voice == "alloy"
    assert isinstance(session_from_query(b"intent=transcription", VOICES), TranscriptionSession)
    assert session_from_query(b"", VOICES).model == Session().model


async def test_the_core_keeps_the_images_and_the_input_audio_and_no_history() -> None:
    core: Conversation = new_core(RecordingEngine(), on_idle=lambda: None, on_decode_failed=lambda _: None)  # type: ignore[arg-type]
    assert core.frames is not None and core.audio is not None and core.history is not None
    assert (core.frames.max_frames, core.audio.max_bytes, core.audio.sample_rate) == (16, MAX_INPUT_AUDIO_BYTES, 24000)
    assert core.history.max_turns == 0
    listener = new_listener(core, Input._listened)  # type: ignore[arg-type]
    assert listener.vad is None and listener.audio is core.audio
    await core.close()
