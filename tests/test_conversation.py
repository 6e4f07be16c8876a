"""The protocol-neutral conversation core (omniweb/conversation/) driven directly, with the real
``video.turn`` pipeline: typed events in order, the spoken answer's word timings, usage, interrupt,
the frame buffer's limits and the process budget, history."""

from __future__ import annotations

import asyncio
import base64
import re
from dataclasses import replace

import numpy as np
import pytest
from support.camera_scenes import room, shoot, with_person
from support.video import jpeg

from omniweb.base import budget as process_budget
from omniweb.base.errors import ErrorKind
from omniweb.conversation import (
    AudioBuffer,
    AudioChunk,
    ChunkParser,
    Conversation,
    ConversationState,
    EarlyTranscription,
    FrameBuffer,
    FrameSelection,
    FramesSelected,
    Heard,
    History,
    IllegalTransition,
    Inbox,
    InboxFull,
    InboxLimits,
    Listener,
    NoUsableFrames,
    Question,
    SentenceStart,
    SpeechSegment,
    SpeechTurn,
    TextDelta,
    TextEnd,
    Transcript,
    TurnEnd,
    TurnSpec,
    WordTiming,
    now_ms,
    resample_pcm16,
    run_turn,
)
from omniweb.conversation.vad import SpeechStarted, SpeechStopped, VadParams, VoiceActivity
from omniweb.engine.messages import PcmAudio, Segment, SentenceEnd
from omniweb.engine.requests import SpeakRequest, TranscribeRequest
from omniweb.engine.runtime import get_engine_client, get_scheduler
from omniweb.media.frames import FrameError


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def buffer(**kw) -> FrameBuffer:
    failed: list = []
    args = {"max_frames": 8, "max_bytes": 64 * 1024 * 1024, "max_pixels": 4096 * 4096, "filter_threshold": None}
    fb = FrameBuffer(**{**args, **kw}, on_decode_failed=failed.append)
    fb.failed = failed  # type: ignore[attr-defined]
    return fb


async def camera_buffer(count: int = 2) -> FrameBuffer:
    fb = buffer()
    fb.start()
    rng = np.random.default_rng(0)
    for i in range(count):
        data = shoot(with_person(room(), 200 + 40 * i, 170, arm_deg=20 * i), rng)
        await fb.add(b64(data), received_ms=now_ms(), frame_id=f"f{i}", pts_ms=500.0 * i)
    return fb


async def events_of(spec: TurnSpec) -> list:
    get_scheduler()
    return [e async for e in run_turn(get_engine_client(), spec)]


def words_of(text: str) -> list[str]:
    return [w.strip(".,!?;:\"'").lower() for w in text.split()]


async def test_a_spoken_answer_carries_its_word_timings_on_the_answers_timeline():
    fb = await camera_buffer()
    spec = TurnSpec(Question(text="What do you see?"), frames=fb.snapshot(), modalities=("text", "audio"))
    events = await events_of(spec)
    await fb.close()
    assert isinstance(events[0], FramesSelected)
    assert [f.frame_id for f in events[0].frames] == ["f0", "f1"]
    end = events[-1]
    assert isinstance(end, TurnEnd) and end.ok, end
    assert end.text == "".join(e.delta for e in events if isinstance(e, TextDelta))
    assert sum(isinstance(e, TextEnd) for e in events) == 1
    audio = [e for e in events if isinstance(e, AudioChunk)]
    total_ms = sum(len(a.pcm) for a in audio) / 48
    assert total_ms > 500
    words: list[WordTiming] = [w for a in audio for w in a.words]
    # Every spoken word, in order, with the chunk in which it starts.
    assert [w.word.strip(".,!?;:\"'").lower() for w in words] == words_of(end.text)
    starts = [w.start_ms for w in words]
    assert starts == sorted(starts) and all(w.end_ms >= w.start_ms for w in words)
    assert words[-1].end_ms <= total_ms + 1
    for a in audio:
        if a.pcm:
            assert all(a.start_ms - 1 <= w.start_ms < a.start_ms + len(a.pcm) / 48 for w in a.words)
    # Later sentences are shifted by the audio of the ones before.
    sentences = [e for e in events if isinstance(e, SentenceStart)]
    if len(sentences) > 1:
        assert words[-1].start_ms > 1000
    assert end.usage is not None
    assert end.usage.input_text_tokens >= 5 and end.usage.input_image_tokens == 2 * 300  # 640x480: 20x15 patches
    assert end.usage.output_text_tokens == len(re.findall(r"\w+|[^\w\s]", end.text))
    assert end.usage.output_audio_tokens == pytest.approx(total_ms / 50, abs=1)
    assert end.usage.total_tokens == end.usage.input_tokens + end.usage.output_tokens


async def test_a_text_only_turn_has_no_audio_and_no_word_timings():
    fb = await camera_buffer(1)
    spec = TurnSpec(Question(text="Is it dark?"), frames=fb.snapshot(), modalities=("text",))
    events = await events_of(spec)
    await fb.close()
    assert not [e for e in events if isinstance(e, AudioChunk | SentenceStart)]
    assert isinstance(events[-1], TurnEnd) and events[-1].ok and events[-1].usage.output_audio_tokens == 0


async def test_frames_that_do_not_decode_never_reach_the_turn():
    fb = buffer()
    fb.start()
    await fb.add(b64(jpeg()[:-40]), received_ms=now_ms(), frame_id="broken")
    events = await events_of(TurnSpec(Question(text="Hi"), frames=fb.snapshot()))
    assert events == [NoUsableFrames()]
    assert [f.frame_id for f in fb.failed] == ["broken"]
    assert fb.remove_failed(fb.failed[0]) and len(fb) == 0
    await fb.close()


def test_chunk_parser_moves_each_sentences_words_onto_the_answers_timeline():
    parser = ChunkParser()
    words = (WordTiming("Hello", 0, 300), WordTiming("there.", 300, 900))
    chunks = [
        SentenceStart(0, "Hello there.", words),
        PcmAudio(b"\0" * 48 * 500, 24000, 0),
        PcmAudio(b"\0" * 48 * 500, 24000, 0),
        SentenceEnd(0, words),
        SentenceStart(1, "Bye.", (WordTiming("Bye.", 0, 300),)),
        PcmAudio(b"\0" * 48 * 200, 24000, 1),
    ]
    audio = [c for raw in chunks for c in parser.feed(raw) if isinstance(c, AudioChunk)]
    assert [a.words for a in audio] == [
        (WordTiming("Hello", 0, 300), WordTiming("there.", 300, 900)),
        (),
        (WordTiming("Bye.", 1000, 1300),),
    ]
    assert [a.start_ms for a in audio] == [0, 500, 1000]


async def test_interrupt_aborts_the_engine_request_and_emits_nothing_more():
    conversation = Conversation(get_engine_client())
    fb = await camera_buffer()
    conversation.configure(frames=fb, audio=AudioBuffer(1 << 20), history=History(4))
    seen: list = []
    first = asyncio.Event()

    async def emit(turn, event) -> None:
        seen.append(event)
        if isinstance(event, TextDelta):
            first.set()

    spec = TurnSpec(Question(text="Describe everything you see in detail."), frames=fb.snapshot())
    turn = conversation.start_turn(spec, emit)
    assert conversation.state is ConversationState.ANSWERING
    await asyncio.wait_for(first.wait(), 30)
    assert await conversation.interrupt()
    count = len(seen)
    await asyncio.sleep(0.3)
    assert len(seen) == count and not any(isinstance(e, TurnEnd) for e in seen)
    assert turn.interrupted and not turn.running
    assert conversation.state is ConversationState.READY and conversation.turn is None
    assert not await conversation.interrupt()  # nothing is running now
    await conversation.close()
    assert conversation.state is ConversationState.CLOSED


def test_the_session_state_moves_only_by_its_methods_and_refuses_illegal_moves():
    conversation = Conversation(get_engine_client())
    with pytest.raises(AttributeError):
        conversation.state = ConversationState.READY  # type: ignore[misc]
    with pytest.raises(IllegalTransition):
        conversation.finish()  # not configured yet
    conversation.configure()
    conversation.configure()  # a new session.config
    conversation.finish()
    with pytest.raises(IllegalTransition):
        conversation.configure()  # the client said it is done
    conversation.stop_input()
    assert conversation.state is ConversationState.CLOSED
    with pytest.raises(IllegalTransition):
        conversation.finish()


LIMITS = InboxLimits(max_messages=3, max_bytes=100, full_message="full", budget_message="budget")


async def test_the_inbox_keeps_order_and_an_urgent_message_overtakes_the_queue():
    handled: list[str] = []
    release = asyncio.Event()

    async def handle(item: str) -> None:
        if item == "slow":
            await release.wait()  # a handler waiting on the engine
        handled.append(item)

    inbox: Inbox[str] = Inbox(handle, LIMITS)
    processor = asyncio.ensure_future(inbox.run())
    for item in ("slow", "a", "b"):
        await inbox.deliver(item, 1)  # the reader never waits for a handler
    await asyncio.sleep(0.05)
    assert handled == [] and inbox.peek() == "a"
    await inbox.deliver("cancel", 1, urgent=True)
    assert handled == ["cancel"]  # at once, ahead of the queue and of the handler in progress
    release.set()
    await asyncio.sleep(0.05)
    assert handled == ["cancel", "slow", "a", "b"] and inbox.queued_bytes == 0
    processor.cancel()
    await asyncio.gather(processor, return_exceptions=True)


async def test_the_inbox_is_bounded_by_messages_bytes_and_the_process_budget():
    async def handle(item: str) -> None:
        pass

    inbox: Inbox[str] = Inbox(handle, LIMITS)  # no processor: everything stays queued
    for _ in range(3):
        await inbox.deliver("x", 10)
    with pytest.raises(InboxFull) as full:
        await inbox.deliver("x", 10)
    assert (full.value.message, full.value.kind) == ("full", ErrorKind.CLIENT)
    inbox.clear()
    with pytest.raises(InboxFull):
        await inbox.deliver("x", 101)
    held: list[tuple[int, bool]] = []
    budgeted: Inbox[str] = Inbox(handle, LIMITS, hold=lambda queued, alone: held.append((queued, alone)) or alone)
    await budgeted.deliver("x", 10)  # alone: the budget lets it through
    with pytest.raises(InboxFull) as refused:
        await budgeted.deliver("y", 10)
    assert (refused.value.message, refused.value.kind) == ("budget", ErrorKind.CAPACITY)
    assert held == [(10, True), (20, False)]
    budgeted.post("decoder report")  # the server's own: never refused, not counted
    assert len(budgeted) == 2 and budgeted.queued_bytes == 10


async def test_the_inbox_gate_holds_messages_and_inline_ones_are_handled_by_the_reader():
    handled: list[str] = []
    open_ = False

    async def handle(item: str) -> None:
        handled.append(item)

    inbox: Inbox[str] = Inbox(handle, LIMITS, gate=lambda: open_, inline=True)
    processor = asyncio.ensure_future(inbox.run())
    await inbox.deliver("held", 1)  # the gate is closed (an utterance plays): it waits
    await asyncio.sleep(0.05)
    assert handled == [] and len(inbox) == 1
    open_ = True
    inbox.reopen()
    await asyncio.sleep(0.05)
    assert handled == ["held"]
    await inbox.deliver("now", 1)  # empty and open: the reader handles it before returning
    assert handled == ["held", "now"]
    processor.cancel()
    await asyncio.gather(processor, return_exceptions=True)


async def test_the_frame_buffer_evicts_by_count_filters_and_gives_its_bytes_back():
    before = process_budget.held()
    fb = buffer(max_frames=2, filter_threshold=0.9996)
    fb.start()
    added = [await fb.add(b64(jpeg(level)), received_ms=now_ms(), frame_id=str(level)) for level in (10, 90, 170)]
    assert [a.accepted for a in added] == [True, True, True]
    assert [f.frame_id for f in added[2].dropped] == ["10"]
    assert [f.frame_id for f in fb] == ["90", "170"]
    assert not (await fb.add(b64(jpeg(170)), received_ms=now_ms())).accepted  # the same picture again
    assert process_budget.held() - before == fb.nbytes > 0
    with pytest.raises(FrameError, match="Invalid image data"):
        await fb.add("not base64!", received_ms=now_ms())
    await fb.close()
    assert process_budget.held() == before and len(fb) == 0


def test_frame_selection_latest_frames():
    frames = [type("F", (), {"pts_ms": float(i), "received_ms": 0.0})() for i in range(6)]
    assert [f.pts_ms for f in FrameSelection(2, "latest_frames").pick(frames)] == [4.0, 5.0]
    assert [f.pts_ms for f in FrameSelection(3).pick(frames)] == [0.0, 2.0, 5.0]


def test_audio_buffer_and_history_limits():
    before = process_budget.held()
    audio = AudioBuffer(max_bytes=10)
    assert audio.append(b"\1" * 8) is None and len(audio) == 8
    assert audio.append(b"\1" * 4) == "Audio buffer overflow" and len(audio) == 0  # cleared, reported
    assert audio.append(b"\2" * 4) is None and audio.take() == b"\2" * 4 and len(audio) == 0
    assert process_budget.held() == before
    history = History(max_turns=1)
    history.remember("q1", "a1")
    history.remember("q2", "a2")
    assert history.messages() == [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]


async def test_a_question_with_text_and_audio_hears_the_audio_when_asked_to():
    from support.video import synthesize

    speech = await synthesize("How many people are there?")
    fb = await camera_buffer(1)
    spec = TurnSpec(
        Question(text="Look at me.", audio=speech, transcribe=True), frames=fb.snapshot(), modalities=("text",)
    )
    events = await events_of(spec)
    heard = [e for e in events if isinstance(e, Transcript)]
    assert len(heard) == 1 and "how many people" in heard[0].text.lower()
    assert events.index(heard[0]) < min(i for i, e in enumerate(events) if isinstance(e, TextDelta))
    end = events[-1]
    assert (
        end.ok
        and end.transcript == heard[0].text
        and end.usage.input_audio_tokens == pytest.approx(len(speech) / 3200, abs=1)
    )
    # Without transcribe, text wins and the audio is not listened to (the video endpoint's rule).
    events = await events_of(
        TurnSpec(Question(text="Look at me.", audio=speech), frames=fb.snapshot(), modalities=("text",))
    )
    assert not [e for e in events if isinstance(e, Transcript)] and events[-1].ok
    await fb.close()


def test_resampling_a_24_khz_question_to_16_khz():
    tone = (np.sin(2 * np.pi * 440 * np.arange(24000) / 24000) * 8000).astype("<i2").tobytes()
    out = resample_pcm16(tone, 24000, 16000)
    assert len(out) == 2 * 16000
    samples = np.frombuffer(out, "<i2").astype(np.float64)
    peak = np.argmax(np.abs(np.fft.rfft(samples)))
    assert abs(peak - 440) <= 1  # 1 Hz bins over one second


def test_parse_chunk_types_every_engine_chunk_an_endpoint_reads():
    from omniweb.base.errors import ErrorKind
    from omniweb.conversation import CodecCodes, parse_chunk
    from omniweb.engine.messages import End, Status, VoiceProbabilities

    codes = CodecCodes(b"\0" * 6, 3, True, False)
    assert parse_chunk(codes) == codes  # the engine's own types pass as they are
    assert parse_chunk(PcmAudio(b"\0\0", 16000)) == AudioChunk(b"\0\0", sample_rate=16000)
    assert parse_chunk(End(rng_state="{}")) == TurnEnd(Status.OK, rng_state="{}")
    busy = parse_chunk(End.failed(ErrorKind.CAPACITY, "full"))
    assert (busy.ok, busy.kind, busy.message) == (False, ErrorKind.CAPACITY, "full")
    assert parse_chunk(End(status=Status.INVALID)).kind is ErrorKind.CLIENT  # an older engine: by status
    assert parse_chunk(VoiceProbabilities((0.5,), 32.0, b"")) is None  # no conversation reads these


# -- the speech turn: a turn whose events come from another runner ---------------------------------
def tts(pieces, seed: int | None = 7) -> SpeakRequest:
    from speech.protocol import SessionConfig, tts_request
    from speech.tts.loops import PIPELINE

    config = SessionConfig.model_validate({"seed": seed, "split_granularity": "sentence", "word_timestamps": True})
    return tts_request("\n".join(pieces), config, PIPELINE)


def pcm_of(events) -> bytes:
    return b"".join(e.pcm for e in events if isinstance(e, AudioChunk))


async def test_a_speech_turn_speaks_its_pieces_as_they_come_through_the_same_session():
    get_scheduler()
    conversation = Conversation(get_engine_client())
    conversation.configure()  # the speech endpoint buffers no frames or audio
    seen: list = []
    over = asyncio.Event()

    async def emit(turn, event) -> None:
        seen.append(event)

    async def ended(turn) -> None:
        assert conversation.state is ConversationState.READY and conversation.turn is None
        over.set()

    speech = SpeechTurn(tts, ["The first sentence is here."], input_done=False, max_ahead_seconds=30)
    conversation.start_turn(speech, emit, ended=ended, input_open=True)
    assert conversation.state is ConversationState.SPEAKING  # it speaks while the client still writes
    await asyncio.sleep(0.2)
    speech.add(["And then a second one."])
    conversation.input_closed()
    assert conversation.state is ConversationState.ANSWERING
    speech.finish(["A third ends it."])
    await asyncio.wait_for(over.wait(), 60)
    starts = [e for e in seen if isinstance(e, SentenceStart)]
    assert [s.text for s in starts] == ["The first sentence is here.", "And then a second one.", "A third ends it."]
    assert starts[0].index == 0 and all(s.words for s in starts)  # words relative to each sentence
    end = seen[-1]
    assert isinstance(end, TurnEnd) and end.ok and end.rng_state and speech.finished
    assert sum(isinstance(e, TurnEnd) for e in seen) == 1  # the requests' own ends stay in the runner
    # The noise generator is carried from request to request: the audio equals one request's.
    whole = [e async for e in SpeechTurn(tts, [s.text for s in starts]).run(get_engine_client())]
    assert pcm_of(seen) == pcm_of(whole)
    assert speech.media_seconds == 0  # nothing was said to be played: the adapter says what it sent
    await conversation.close()


async def test_interrupting_a_speech_turn_aborts_its_request_and_ends_nothing_on_its_behalf():
    get_scheduler()
    conversation = Conversation(get_engine_client())
    conversation.configure()
    seen: list = []
    first = asyncio.Event()
    ended_calls: list = []

    async def emit(turn, event) -> None:
        seen.append(event)
        if isinstance(event, AudioChunk):
            first.set()

    async def ended(turn) -> None:
        ended_calls.append(turn)

    text = " ".join(f"Sentence number {i} goes on for a while before it stops." for i in range(12))
    turn = conversation.start_turn(SpeechTurn(tts, [text]), emit, ended=ended)
    await asyncio.wait_for(first.wait(), 30)
    assert turn.request_id is not None  # the engine request now streaming
    assert await conversation.interrupt()
    count = len(seen)
    await asyncio.sleep(0.3)
    assert len(seen) == count and not any(isinstance(e, TurnEnd) for e in seen)
    assert ended_calls == [] and conversation.state is ConversationState.READY  # the interrupter takes over
    assert turn.request_id is None
    await conversation.close()


async def test_an_interrupt_lets_the_event_being_written_complete():
    get_scheduler()
    conversation = Conversation(get_engine_client())
    conversation.configure()
    writing = asyncio.Event()
    written: list = []

    async def emit(turn, event) -> None:
        if isinstance(event, AudioChunk) and not written:
            writing.set()
            await asyncio.sleep(0.2)  # a slow send: its bytes are counted only once it returns
            written.append(event)

    conversation.start_turn(SpeechTurn(tts, ["One sentence that is long enough to stream."]), emit)
    await asyncio.wait_for(writing.wait(), 30)
    assert await conversation.interrupt()
    assert len(written) == 1  # completed, not cut in the middle; nothing after it
    await conversation.close()


async def test_a_failed_request_ends_the_speech_turn_with_its_kind():
    get_scheduler()

    def refused(pieces) -> SpeakRequest:
        return replace(tts(pieces), speed=1000.0)  # the pipeline's own validation refuses it

    events = [e async for e in SpeechTurn(refused, ["Hello there.", "Never spoken."]).run(get_engine_client())]
    assert len(events) == 1 and isinstance(events[0], TurnEnd)
    assert not events[0].ok and events[0].kind is ErrorKind.CLIENT


# -- listening: the Realtime endpoint's input audio (24 kHz, batched VAD, early transcript, commit/clear)
RATE24 = 24000
BYTES_PER_MS24 = RATE24 * 2 // 1000


def test_the_audio_buffer_cuts_by_stream_position_and_keeps_what_follows():
    audio = AudioBuffer(10_000 * BYTES_PER_MS24, RATE24)
    ramp = np.arange(24000, dtype="<i2").tobytes()  # one second; sample n = n, so cuts are checkable
    assert audio.append(ramp) is None and audio.duration_ms == 1000
    peek = np.frombuffer(audio.peek(audio.position(100), audio.position(200)), "<i2")
    assert (peek[0], len(peek)) == (2400, 2400) and audio.duration_ms == 1000  # peek leaves it all there
    audio.keep_last(audio.position(600))  # silence before speech is dropped: stream positions stay right
    assert audio.start == audio.position(400)
    audio.drop_before(audio.position(500))
    taken = np.frombuffer(audio.take_before(audio.position(800)), "<i2")
    assert (taken[0], taken[-1], len(taken)) == (12000, 19199, 7200)
    assert audio.start == audio.position(800) and audio.duration_ms == 200  # what followed stays
    assert np.frombuffer(audio.take(), "<i2")[0] == 19200
    small = AudioBuffer(100 * BYTES_PER_MS24, RATE24)
    assert small.append(bytes(80 * BYTES_PER_MS24)) is None
    assert small.append(bytes(80 * BYTES_PER_MS24)) is not None and len(small) == 0  # emptied on overflow


@pytest.fixture(scope="module")
def question24() -> bytes:
    from hibari import Hibari

    speech = Hibari()("How many people can you see in the room?", seed=7)
    pcm = (np.clip(speech, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    return bytes(RATE24 * 2) + pcm + bytes(RATE24 * 3)  # 1 s silence, the question, 1.5 s of silence


async def whisper(pcm24: bytes, prefix: str | None = None, partial: bool = False) -> list[str]:
    """Whisper's segment texts (the engine's ``audio.transcribe``)."""
    request = TranscribeRequest(
        audio=resample_pcm16(pcm24, RATE24, 16000),
        temperature=0.0,
        prefix=prefix,
        priority="batch" if partial else "realtime",
    )
    return [c.text async for c in get_engine_client().stream(request) if isinstance(c, Segment)]


async def listen(listener: Listener, pcm: bytes, chunk_ms: int = 20, paced: bool = False) -> list:
    """Feed the audio in pieces, at once or (``paced``) as a microphone would."""
    step = chunk_ms * BYTES_PER_MS24
    out: list = []
    start = asyncio.get_running_loop().time()
    for n, i in enumerate(range(0, len(pcm), step)):
        out += await listener.feed(pcm[i : i + step])
        if paced:
            await asyncio.sleep(max(0.0, start + (n + 1) * chunk_ms / 1000 - asyncio.get_running_loop().time()))
    return out


def loud_from_ms(pcm: bytes) -> float:
    """Where the audio first gets loud (the speech), in ms from its start."""
    samples = np.abs(np.frombuffer(pcm, "<i2").astype(np.float32))
    return float(np.flatnonzero(samples > 0.05 * samples.max())[0]) / (RATE24 / 1000)


async def test_a_24_khz_question_is_heard_batched_and_transcribed_before_the_turn_is_certain(question24):
    get_scheduler()
    audio = AudioBuffer(60_000 * BYTES_PER_MS24, RATE24)
    early_calls: list[int] = []

    async def transcribe(pcm: bytes, *, prefix: str | None, partial: bool) -> list[str]:
        early_calls.append(len(pcm))
        return await whisper(pcm, prefix, partial)

    vad = VoiceActivity(get_engine_client(), VadParams(), RATE24)
    listener = Listener(vad, audio, feed_ms=96, early=EarlyTranscription(transcribe))
    events = await listen(listener, question24)
    started, stopped, segment = events
    assert isinstance(started, SpeechStarted) and isinstance(stopped, SpeechStopped)
    assert isinstance(segment, SpeechSegment)
    assert (segment.audio_start_ms, segment.audio_end_ms) == (started.audio_start_ms, stopped.audio_end_ms)
    assert 200 <= loud_from_ms(segment.audio) <= 400  # the 300 ms prefix padding, then the question
    assert len(segment.audio) == (stopped.audio_end_ms - started.audio_start_ms) * BYTES_PER_MS24
    assert early_calls  # started at the silence, before silence_duration_ms had passed
    heard = await segment.transcript()
    assert heard is not None and {"people", "room"} <= set(words_of("".join(heard)))
    assert audio.duration_ms <= 300 + 100 + 96  # between turns only the padding's worth of silence stays
    listener.close()


async def test_streaming_hands_out_agreed_words_while_the_question_is_spoken(question24):
    """Streaming recognition: hypotheses every 480 ms of speech; what two in a row agree on comes
    out as Heard events before the speech stops; the early transcription starts with it."""
    get_scheduler()
    calls: list[tuple[str | None, bool]] = []

    async def transcribe(pcm: bytes, *, prefix: str | None, partial: bool) -> list[str]:
        calls.append((prefix, partial))
        return await whisper(pcm, prefix, partial)

    vad = VoiceActivity(get_engine_client(), VadParams(), RATE24)
    audio = AudioBuffer(60_000 * BYTES_PER_MS24, RATE24)
    listener = Listener(vad, audio, feed_ms=96, early=EarlyTranscription(transcribe, stream_ms=480))
    events = await listen(listener, question24, paced=True)
    kinds = [type(e) for e in events]
    assert kinds[0] is SpeechStarted and kinds[-2:] == [SpeechStopped, SpeechSegment]
    heard = "".join(e.delta for e in events if isinstance(e, Heard))
    assert Heard in kinds[: kinds.index(SpeechStopped)] and heard  # words came while speaking
    segment = events[-1]
    assert segment.heard == heard
    transcript = "".join(await segment.transcript() or ()).strip()
    assert transcript.startswith(heard) and {"people", "room"} <= set(words_of(transcript))
    assert any(partial for _, partial in calls)  # the hypotheses, at batch priority
    assert (heard, False) in calls  # the early transcription was made to start with the words given out
    listener.close()


async def test_commit_and_clear_start_afresh_and_keep_the_cuts_where_the_speech_is(question24):
    get_scheduler()
    audio = AudioBuffer(60_000 * BYTES_PER_MS24, RATE24)
    listener = Listener(None, audio, feed_ms=96)  # turn_detection null: audio only buffers
    assert await listen(listener, bytes(200 * BYTES_PER_MS24)) == []
    assert len(listener.commit()) == 200 * BYTES_PER_MS24 and len(audio) == 0
    await listen(listener, bytes(50 * BYTES_PER_MS24))
    listener.clear()
    assert len(audio) == 0
    # A detector from here on (session.update): it hears only what comes next; a commit that takes
    # audio it has not heard yet (the batch not yet fed) leaves its cuts where the speech is.
    listener.listen_with(VoiceActivity(get_engine_client(), VadParams(), RATE24))
    assert await listen(listener, bytes(130 * BYTES_PER_MS24)) == []
    assert len(listener.commit()) == 130 * BYTES_PER_MS24
    events = await listen(listener, question24)
    segment = next(e for e in events if isinstance(e, SpeechSegment))
    assert len(segment.audio) == (segment.audio_end_ms - segment.audio_start_ms) * BYTES_PER_MS24
    assert 200 <= loud_from_ms(segment.audio) <= 400  # the 300 ms prefix padding, then the question
    assert await segment.transcript() is None  # no early transcription asked for
    listener.close()
