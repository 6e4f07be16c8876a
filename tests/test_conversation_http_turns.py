"""The core calls the HTTP views make (omniweb/openai_api/views.py), driven on a scripted engine:
a recording's ``transcribe`` (its request, its priority, what it yields, closing early) and a
``SpeechTurn`` of one piece (one request, its chunks, a refusal's ``retry_after``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from omniweb.base.errors import ErrorKind
from omniweb.conversation import AudioChunk, SentenceStart, SpeechTurn, TurnEnd
from omniweb.conversation.transcription import BULK_TRANSCRIBE_SECONDS, transcribe
from omniweb.engine.messages import Chunk, End, PcmAudio, Segment, SentenceEnd, Status, TextDelta
from omniweb.engine.requests import EngineRequest, Priority, SpeakRequest, TranscribeRequest


class ScriptedEngine:
    """Answers every request with ``chunks``; records the requests and which streams were left
    before their ``End`` (the real client aborts those)."""

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self.chunks = list(chunks)
        self.requests: list[tuple[str | None, EngineRequest]] = []
        self.left_early: list[str | None] = []

    async def stream(self, request: EngineRequest, request_id: str | None = None) -> AsyncIterator[Chunk]:
        self.requests.append((request_id, request))
        ended = False
        try:
            for chunk in self.chunks:
                ended = isinstance(chunk, End)
                yield chunk
        finally:
            if not ended:
                self.left_early.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.left_early.append(request_id)


def segment(text: str) -> Segment:
    return Segment(text=text, fields={"text": text}, words=({"word": text, "start": 0.0, "end": 0.5},))


def pcm16k(seconds: float) -> bytes:
    return b"\x00\x00" * round(16000 * seconds)


async def test_a_recording_is_transcribed_segment_by_segment_then_its_end():
    done = End(duration=2.0, segments=2)
    engine = ScriptedEngine([segment("Hello."), TextDelta("not a transcription's"), segment("There."), done])
    out = [c async for c in transcribe(engine, pcm16k(2.0), prompt="names", temperature=0.2, words=True)]  # type: ignore[arg-type]
    assert out == [segment("Hello."), segment("There."), done]
    [(request_id, request)] = engine.requests
    assert isinstance(request, TranscribeRequest) and request_id and engine.left_early == []
    assert (request.prompt, request.temperature, request.words) == ("names", 0.2, True)
    assert request.timestamps and request.priority is Priority.REALTIME  # a voice agent's turn: someone waits


async def test_a_recording_longer_than_one_whisper_window_runs_at_batch_priority():
    window = BULK_TRANSCRIBE_SECONDS
    for seconds, priority in ((window, Priority.REALTIME), (window + 0.1, Priority.BATCH)):
        engine = ScriptedEngine([End(duration=seconds)])
        assert [c async for c in transcribe(engine, pcm16k(seconds))] == [End(duration=seconds)]  # type: ignore[arg-type]
        assert engine.requests[0][1].priority is priority


async def test_closing_a_transcription_early_leaves_its_engine_stream_before_the_end():
    engine = ScriptedEngine([segment("One."), segment("Two."), End()])
    chunks = transcribe(engine, pcm16k(1.0))  # type: ignore[arg-type]
    assert await anext(chunks) == segment("One.")
    await chunks.aclose()  # a client gone: the real engine client aborts the request here
    assert engine.left_early == [engine.requests[0][0]]


async def test_a_failed_transcription_ends_with_the_engines_end():
    busy = End.failed(ErrorKind.CAPACITY, "at capacity", retry_after=2.5)
    engine = ScriptedEngine([busy])
    assert [c async for c in transcribe(engine, pcm16k(1.0))] == [busy]  # type: ignore[arg-type]


def one_piece(pieces: Sequence[str]) -> SpeakRequest:
    assert len(pieces) == 1
    return SpeakRequest(text=pieces[0], split="sentence")


async def test_a_speech_turn_of_one_piece_is_one_request_and_its_chunks():
    audio = PcmAudio(pcm=b"\x01\x00" * 2400, sample_rate=24000)
    engine = ScriptedEngine([SentenceStart(0, "Hi."), audio, SentenceEnd(0), End(rng_state="r1")])
    out = [c async for c in SpeechTurn(one_piece, ["Hi."]).run(engine)]  # type: ignore[arg-type]
    assert [type(c) for c in out] == [SentenceStart, AudioChunk, SentenceEnd, TurnEnd]
    assert out[1].pcm == audio.pcm and out[1].seconds == audio.seconds == 0.1  # type: ignore[union-attr]
    assert out[-1] == TurnEnd(Status.OK, rng_state="r1")
    [(_, request)] = engine.requests
    assert request == SpeakRequest(text="Hi.", split="sentence")  # the view's request, untouched (no rng_state)
    assert engine.left_early == []


async def test_a_refused_speech_turn_ends_with_the_refusals_retry_after():
    engine = ScriptedEngine([End.failed(ErrorKind.CAPACITY, "at capacity", retry_after=1.7)])
    out = [c async for c in SpeechTurn(one_piece, ["Hi."]).run(engine)]  # type: ignore[arg-type]
    assert out == [TurnEnd(Status.BUSY, ErrorKind.CAPACITY, "at capacity", retry_after=1.7)]


async def test_closing_a_speech_turn_mid_stream_leaves_its_engine_stream():
    audio = PcmAudio(pcm=b"\x01\x00" * 240, sample_rate=24000)
    engine = ScriptedEngine([audio, audio, End()])
    chunks = SpeechTurn(one_piece, ["Hi."]).run(engine)  # type: ignore[arg-type]
    assert isinstance(await anext(chunks), AudioChunk)
    await chunks.aclose()  # a client gone mid-body
    assert engine.left_early == [engine.requests[0][0]]
