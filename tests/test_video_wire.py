"""The video endpoint's wire without a socket: one answer's writer (``video/answers.py``: the core's
typed turn events in, the endpoint's messages out, in order) and the session's wire state
(``video/session.py``: frame acks, audio and the server VAD, the turns a query starts), each driven
directly and asserted on the messages it sends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from support.video import b64, jpeg

from omniweb.base.errors import EngineError, ErrorKind
from omniweb.conversation import (
    ActiveTurn,
    AudioChunk,
    AudioRefused,
    BufferedFrame,
    FramesSelected,
    History,
    NoUsableFrames,
    Question,
    SentenceStart,
    SpeechSegment,
    TextDelta,
    TextEnd,
    Transcript,
    TurnEnd,
    TurnSpec,
)
from omniweb.conversation.vad import SemanticVoiceActivity, SpeechStarted, SpeechStopped, VoiceActivity
from omniweb.engine.messages import Status
from video import protocol
from video.answers import FAILED, Answer
from video.protocol import VideoSessionConfig
from video.session import LISTEN_MAX_BYTES, RECEIVED_MS, VideoSession

PCM = b"\x01\x00" * 2400  # 100 ms at 24 kHz: one audio delta
PCM16K = b"\x02\x00" * 1600  # 100 ms at 16 kHz: one audio.chunk
START = {"type": "response.start"}


def turn_of(request_id: str = "video-1") -> ActiveTurn:
    return ActiveTurn(TurnSpec(Question(text="?"), request_id=request_id))


def frame_with(frame_id: str | None, pts_ms: float = 10.0) -> BufferedFrame:
    meta = {"frame_id": frame_id, "pts_ms": pts_ms, "receiver_received_ts_ms": 5.0}
    return BufferedFrame(data=b"", received_ms=5.0, frame_id=frame_id, pts_ms=pts_ms, meta=meta)


def selected(*frames: BufferedFrame) -> FramesSelected:
    return FramesSelected(frames=frames, decoded_ready_ms=7.0, selected_ms=8.0)


def answer(sent: list[dict[str, Any]], question: str = "What is there?", **fields: Any) -> Answer:
    async def send(payload: dict[str, Any]) -> None:
        sent.append(payload)

    defaults: dict[str, Any] = {"modalities": ("text", "audio"), "with_ids": False, "history": History(8)}
    return Answer(send=send, request_id="video-1", question=question, **{**defaults, **fields})


async def run(answer: Answer, *events: Any, turn: ActiveTurn | None = None) -> None:
    turn = turn or turn_of()
    for event in events:
        await answer.emit(turn, event)


def types(sent: list[dict[str, Any]]) -> list[str]:
    return [m["type"] for m in sent]


# -- one answer ---------------------------------------------------------------------------------------
async def test_a_text_question_starts_at_once_and_streams_text_then_audio_in_order() -> None:
    sent: list[dict[str, Any]] = []
    writer = answer(sent, with_ids=True)
    frames = (frame_with("f1"), frame_with(None, 20.0))
    await run(writer, selected(*frames))
    assert sent == [START]  # the question is known: the response starts with the frames chosen
    await run(
        writer,
        SentenceStart(0, "Two people."),
        TextDelta("Two "),
        TextDelta(""),
        TextDelta("people."),
        TextEnd(),
        AudioChunk(PCM),
        AudioChunk(b""),
        TurnEnd(Status.OK, text="Two people."),
    )
    consumed = protocol.frames_consumed(
        "video-1", [f.meta for f in frames], model_selected_ms=8.0, decoded_ready_ms=7.0
    )
    assert sent[1] == consumed  # once, before the first piece of the answer
    assert sent[1]["frame_ids"] == ["f1"]
    assert sent[2:5] == [
        protocol.text_delta("Two "),
        protocol.text_delta("people."),
        protocol.text_done("Two people."),  # as soon as the text is complete, before its audio
    ]
    assert sent[5] == protocol.audio_delta(PCM)
    assert sent[6:] == [{"type": "response.audio.done"}]
    assert writer.history is not None
    assert writer.history.messages() == [
        {"role": "user", "content": "What is there?"},
        {"role": "assistant", "content": "Two people."},
    ]


async def test_a_spoken_question_is_transcribed_before_the_response_starts() -> None:
    sent: list[dict[str, Any]] = []
    writer = answer(sent, question="", modalities=("text",))
    await run(writer, selected(frame_with("f1")))
    assert sent == []  # the engine may transcribe first
    await run(writer, Transcript("How many?"), TextDelta("Two."), AudioChunk(PCM), TurnEnd(Status.OK, text="Two."))
    assert sent == [
        {"type": "input.transcript", "text": "How many?"},
        START,
        protocol.text_delta("Two."),  # text only: no audio delta, no audio.done
        protocol.text_done("Two."),
    ]
    assert writer.history is not None
    assert writer.history.messages()[0] == {"role": "user", "content": "How many?"}  # what was heard


async def test_an_answer_with_no_deltas_still_opens_and_closes_its_response() -> None:
    sent: list[dict[str, Any]] = []
    await run(answer(sent, question="", event_names="ga"), TurnEnd(Status.OK, text="Nothing.", transcript="Hm?"))
    assert sent == [START, protocol.text_done("Nothing.")]


async def test_the_ga_event_names_name_the_audio_events() -> None:
    sent: list[dict[str, Any]] = []
    await run(answer(sent, event_names="ga"), selected(), AudioChunk(PCM), TurnEnd(Status.OK, text=""))
    assert types(sent) == [
        "response.start",
        "response.output_audio.delta",
        "response.text.done",
        "response.output_audio.done",
    ]


async def test_a_failure_closes_what_was_opened_and_is_not_remembered() -> None:
    sent: list[dict[str, Any]] = []
    writer = answer(sent)
    await run(
        writer,
        selected(),
        TextDelta("Two"),
        AudioChunk(PCM),
        TurnEnd(Status.BUSY, ErrorKind.CAPACITY, "server is at capacity; retry shortly"),
    )
    assert sent[3:] == [
        protocol.error("server is at capacity; retry shortly", ErrorKind.CAPACITY),
        protocol.text_done("Two"),  # what was said
        {"type": "response.audio.done"},  # a player waiting for the end hears it
    ]
    assert writer.history is not None and writer.history.messages() == []


async def test_a_failure_without_a_message_of_its_own_is_the_endpoints_and_an_engine_error() -> None:
    sent: list[dict[str, Any]] = []
    await run(answer(sent), TurnEnd(Status.ERROR))
    assert sent == [START, protocol.error(FAILED, ErrorKind.ENGINE), protocol.text_done("")]


async def test_a_failure_after_the_text_was_done_does_not_close_the_text_twice() -> None:
    sent: list[dict[str, Any]] = []
    await run(answer(sent, modalities=("text",)), selected(), TextDelta("Hi."), TextEnd(), TurnEnd(Status.ERROR))
    assert types(sent) == ["response.start", "response.text.delta", "response.text.done", "error"]


async def test_no_usable_frames_is_reported_as_no_frames_buffered() -> None:
    sent: list[dict[str, Any]] = []
    await run(answer(sent), NoUsableFrames())
    assert sent == [protocol.error("No frames buffered")]


async def test_an_interrupted_turn_sends_nothing_more() -> None:
    sent: list[dict[str, Any]] = []
    writer = answer(sent)
    turn = turn_of()
    await run(writer, selected(), TextDelta("Two"), turn=turn)
    turn.interrupted = True
    await run(
        writer, TextDelta(" people."), AudioChunk(PCM), TurnEnd(Status.CANCELLED), TurnEnd(Status.ERROR), turn=turn
    )
    assert sent == [START, protocol.text_delta("Two")]


# -- the session's wire state -------------------------------------------------------------------------
class Wire:
    """A session driven without a socket: what it sent, and the frames its decoder reported."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.failed: list[BufferedFrame] = []
        self.turns: list[tuple[TurnSpec, Callable[..., Any]]] = []
        self.session = VideoSession(
            object(),  # type: ignore[arg-type]  # no engine call is made: turns are caught below
            self._send,
            stopped=lambda: False,
            report_decode_failure=self.failed.append,
            on_idle=lambda: None,
        )

    async def _send(self, payload: dict[str, Any]) -> None:
        self.sent.append(payload)

    def configure(self, **fields: Any) -> VideoSession:
        self.session.configure(VideoSessionConfig.model_validate(fields))
        # A turn is caught, not run: its spec, and the answer's emit to drive by hand.
        self.session.conversation.start_turn = lambda spec, emit, **_: self.turns.append((spec, emit))  # type: ignore[method-assign,assignment,return-value]
        return self.session

    def take(self) -> list[dict[str, Any]]:
        sent, self.sent = self.sent, []
        return sent


@pytest.fixture
async def wire() -> AsyncIterator[Wire]:
    wire = Wire()
    yield wire
    await wire.session.conversation.close()  # the decoder stops, the buffers' bytes go back


def frame_msg(data: bytes | str, frame_id: str | None = None, **extra: Any) -> dict[str, Any]:
    msg = {"type": "video.frame", "data": data if isinstance(data, str) else b64(data), RECEIVED_MS: 123.0, **extra}
    if frame_id is not None:
        msg["frame_id"] = frame_id
    return msg


def ack(frame_id: str, buffered: int, *, accepted: bool = True, **fields: Any) -> dict[str, Any]:
    return {
        "type": "video.frame.ack",
        "frame_id": frame_id,
        "pts_ms": fields.pop("pts_ms", None),
        "capture_ts_ms": None,
        "accepted": accepted,
        "buffered_frames": buffered,
        "server_receive_ts_ms": 123.0,
        **fields,
    }


async def test_the_config_sizes_the_buffers_and_caps_the_history(wire: Wire, settings: Any) -> None:
    settings.VIDEO_HISTORY_TURNS = 3
    session = wire.configure(max_frames=7, max_history_turns=2)
    assert session.frames.max_frames == 7
    assert session.audio.max_bytes == protocol.MAX_AUDIO_BUFFER_BYTES
    history = session.conversation.history
    assert history is not None and history.max_turns == 2  # the client's cap under the server's
    assert session.listener is None  # turns only by video.query


@pytest.mark.parametrize(("vad", "detector"), [("server_vad", VoiceActivity), ("semantic_vad", SemanticVoiceActivity)])
async def test_turn_detection_listens_with_its_detector(wire: Wire, vad: str, detector: type) -> None:
    session = wire.configure(turn_detection={"type": vad})
    assert session.listener is not None
    assert type(session.listener.vad) is detector


async def test_frames_are_acknowledged_filtered_and_evicted(wire: Wire) -> None:
    session = wire.configure(max_frames=2, frame_filter_threshold=0.9)
    await session.on_video_frame(frame_msg(jpeg(10), "f1", pts_ms=1))
    await session.on_video_frame(frame_msg(jpeg(10), "f2", pts_ms=2))  # the same picture again
    await session.on_video_frame(frame_msg(jpeg(120)))  # no frame_id: buffered, never acknowledged
    await session.on_video_frame(frame_msg(jpeg(240), "f4"))
    assert wire.take() == [
        ack("f1", 1, pts_ms=1),
        ack("f2", 1, accepted=False, pts_ms=2, reason="filtered"),
        ack("f4", 2, dropped_frame_id="f1"),
    ]


async def test_frames_the_wire_refuses_earn_their_errors(wire: Wire) -> None:
    session = wire.configure()
    await session.on_video_frame(frame_msg("", "empty"))  # ignored silently, as the seed
    await session.on_video_frame({"type": "video.frame", "data": 7, RECEIVED_MS: 1.0})
    await session.on_video_frame(frame_msg("A" * (protocol.MAX_FRAME_SIZE + 1)))
    await session.on_video_frame(frame_msg(jpeg(), "f", pts_ms=float("inf")))
    await session.on_video_frame(frame_msg("not base64!", "f"))
    sent = wire.take()
    assert [m["message"] for m in sent[:3]] == [
        "Invalid image data",
        "Frame too large",
        "Invalid pts_ms: must be a finite number of milliseconds within ±2^53",
    ]
    assert types(sent) == ["error"] * 4 and len(session.frames) == 0


async def test_a_frame_that_does_not_decode_is_removed_and_reported_once(wire: Wire) -> None:
    session = wire.configure(enable_frame_filter=False)
    await session.on_video_frame(frame_msg(jpeg()[:-8], "cut"))  # its header is fine: checked ahead
    assert wire.take() == [ack("cut", 1)]
    for _ in range(500):
        if wire.failed:
            break
        await asyncio.sleep(0.01)
    [failed] = wire.failed
    await session.decode_failed(failed)
    await session.decode_failed(failed)  # already gone
    assert wire.take() == [protocol.error("Frame decode failed")]
    assert len(session.frames) == 0


async def test_audio_without_turn_detection_waits_in_the_buffer_for_a_query(wire: Wire) -> None:
    session = wire.configure()
    await session.on_audio_chunk({"type": "audio.chunk", "data": b64(PCM16K)})
    await session.on_audio_chunk({"type": "audio.chunk", "data": "%%%"})
    await session.on_audio_chunk({"type": "audio.chunk", "data": b64(b"\0" * protocol.MAX_AUDIO_BUFFER_BYTES)})
    assert [m["message"] for m in wire.take()] == [
        "Invalid audio data",
        "Audio buffer overflow",
    ]


class Heard:
    """The listener's ``feed``, scripted: what each call heard, and the audio it was given."""

    def __init__(self, *results: list[Any] | Exception) -> None:
        self.results = list(results)
        self.fed: list[bytes] = []

    async def __call__(self, pcm: bytes) -> list[Any]:
        self.fed.append(pcm)
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result


async def test_a_run_of_chunks_is_heard_in_one_vad_call_and_its_events_go_out(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = wire.configure(turn_detection={"type": "server_vad"})
    heard = Heard([SpeechStarted(300), SpeechStopped(900)])
    monkeypatch.setattr(session.listener, "feed", heard)
    for _ in range(3):
        await session.on_audio_chunk({"type": "audio.chunk", "data": b64(PCM16K)})
    assert heard.fed == [] and wire.sent == []  # held until the run of chunks ends
    await session.listen()
    await session.listen()  # nothing new: no call
    assert heard.fed == [PCM16K * 3]
    assert wire.take() == [protocol.speech_started(300), protocol.speech_stopped(900)]


async def test_five_seconds_of_audio_are_heard_without_waiting_for_the_run_to_end(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = wire.configure(turn_detection={"type": "server_vad"})
    heard = Heard([])
    monkeypatch.setattr(session.listener, "feed", heard)
    await session.on_audio_chunk({"type": "audio.chunk", "data": b64(b"\0" * LISTEN_MAX_BYTES)})
    assert heard.fed == [b"\0" * LISTEN_MAX_BYTES]


async def test_bad_audio_is_reported_after_what_came_before_it_is_heard(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = wire.configure(turn_detection={"type": "server_vad"})
    unavailable = EngineError(ErrorKind.CAPACITY, "queue full", client_message="server is at capacity")
    heard = Heard([SpeechStarted(0)], AudioRefused("Audio buffer overflow"), EngineError(ErrorKind.ENGINE, "x"))
    monkeypatch.setattr(session.listener, "feed", heard)
    await session.on_audio_chunk({"type": "audio.chunk", "data": b64(PCM16K)})
    await session.on_audio_chunk({"type": "audio.chunk", "data": 5})
    for _ in range(2):
        await session.on_audio_chunk({"type": "audio.chunk", "data": b64(PCM16K)})
        await session.listen()
    assert wire.take() == [
        protocol.speech_started(0),
        protocol.error("Invalid audio data: expected a base64 string"),
        protocol.error("Audio buffer overflow"),
        protocol.error("Voice activity detection failed", ErrorKind.ENGINE),  # no client message of its own
    ]
    heard.results.append(unavailable)
    await session.on_audio_chunk({"type": "audio.chunk", "data": b64(PCM16K)})
    await session.listen()
    assert wire.take() == [protocol.error("server is at capacity", ErrorKind.CAPACITY)]


async def test_a_query_needs_frames_and_a_string(wire: Wire) -> None:
    session = wire.configure()
    await session.on_video_query({"type": "video.query", "text": 3})
    await session.on_video_query({"type": "video.query", "text": "What?", "audio_data": "%%%"})
    await session.on_audio_chunk({"type": "audio.chunk", "data": b64(PCM16K)})
    await session.on_video_query({"type": "video.query"})
    assert wire.take() == [
        protocol.error("video.query text must be a string"),
        protocol.error("Invalid audio data"),
        protocol.error("No frames buffered"),
        protocol.error("No frames buffered"),
    ]
    assert wire.turns == []


async def test_a_query_starts_a_turn_as_configured_and_its_answer_joins_the_history(wire: Wire) -> None:
    session = wire.configure(
        num_frames=2,
        sampling_strategy="latest_seconds",
        system_prompt="Be brief.",
        modalities=["text"],
        model="m",
    )
    await session.on_video_frame(frame_msg(jpeg(10), "f1"))
    await session.on_audio_chunk({"type": "audio.chunk", "data": b64(PCM16K)})
    await session.on_video_query({"type": "video.query", "text": "Who?", "audio_data": b64(PCM16K)})
    wire.take()
    [(spec, emit)] = wire.turns
    assert spec.question == Question(text="Who?", audio=PCM16K * 2)  # the streamed audio, then the query's
    assert (spec.selection.num_frames, spec.selection.strategy) == (2, "latest_seconds")
    assert spec.selection.window_seconds == protocol.DEFAULT_WINDOW_SECONDS
    assert (spec.instructions, spec.modalities, spec.model, list(spec.history)) == ("Be brief.", ("text",), "m", [])
    assert spec.request_id.startswith("video-") and [f.frame_id for f in spec.frames] == ["f1"]
    turn = ActiveTurn(spec)
    for event in (selected(*spec.frames), TextDelta("Alice."), TurnEnd(Status.OK, text="Alice.")):
        await emit(turn, event)
    consumed = wire.sent[1]
    assert consumed["type"] == "video.frames.consumed" and consumed["request_id"] == spec.request_id
    assert types(wire.take()) == [
        "response.start",
        "video.frames.consumed",
        "response.text.delta",
        "response.text.done",
    ]
    await session.on_video_query({"type": "video.query", "text": "And now?"})
    assert wire.turns[1][0].history == [
        {"role": "user", "content": "Who?"},
        {"role": "assistant", "content": "Alice."},
    ]


async def test_a_spoken_turn_starts_when_the_speaker_stops_and_nothing_is_sent_once_closed(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = wire.configure(turn_detection={"type": "server_vad"})
    segment = SpeechSegment(audio=PCM16K, audio_start_ms=0, audio_end_ms=100)
    heard = Heard([segment], [segment])
    monkeypatch.setattr(session.listener, "feed", heard)
    await session.on_audio_chunk({"type": "audio.chunk", "data": b64(PCM16K)})
    await session.listen()
    assert wire.take() == [protocol.error("No frames buffered")]
    await session.on_video_frame(frame_msg(jpeg(10)))
    await session.on_audio_chunk({"type": "audio.chunk", "data": b64(PCM16K)})
    await session.listen()
    [(spec, emit)] = wire.turns
    assert spec.question == Question(text="", audio=PCM16K)
    await session.conversation.close()
    await emit(ActiveTurn(spec), TurnEnd(Status.OK, text="Hello."))
    assert wire.sent == []
