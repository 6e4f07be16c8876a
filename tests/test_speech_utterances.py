"""The speech endpoint's utterance writer without a socket: the core's typed events in, the wire's
messages out, in the reference's order (speech/utterances.py)."""

from __future__ import annotations

from typing import Any

import pytest

from omniweb.base import budget
from omniweb.base.errors import ErrorKind
from omniweb.conversation import (
    AudioChunk,
    CodecCodes,
    SentenceEnd,
    SentenceStart,
    SpeechTurn,
    TurnEnd,
    WordTiming,
)
from speech import protocol
from speech.codec import wire
from speech.protocol import SessionConfig
from speech.utterances import Utterance

PCM = b"\x01\x00" * 2400  # 100 ms at 24 kHz


def utterance(sent: list[Any], *, merge: bool = False, codec: dict[str, Any] | None = None, **config: Any) -> Utterance:
    async def send(payload: dict[str, Any] | bytes) -> None:
        sent.append(payload)

    speech = SpeechTurn(lambda pieces: {}, ["Hello there."])
    return Utterance(
        send=send,
        hold_file_audio=lambda held: True,
        config=SessionConfig.model_validate(config),
        index=0,
        text="Hello there.",
        merge=merge,
        speech=speech,
        codec=codec,
    )


def types(sent: list[Any]) -> list[str]:
    return [p["type"] if isinstance(p, dict) else f"<{len(p)} bytes>" for p in sent]


async def test_streamed_pcm_opens_each_sentence_sends_its_audio_and_closes_the_utterance():
    sent: list[Any] = []
    utt = utterance(sent, response_format="pcm", stream_audio=True)
    for event in (SentenceStart(0, "Hello there."), AudioChunk(PCM), AudioChunk(PCM), SentenceEnd(0), TurnEnd("ok")):
        await utt.emit(event)
    assert types(sent) == ["audio.start", "<4800 bytes>", "<4800 bytes>", "audio.done", "session.done"]
    assert sent[3]["total_bytes"] == 9600 and sent[4] == {
        "type": "session.done",
        "utterance_index": 0,
        "total_sentences": 1,
    }
    assert utt.over


async def test_merged_sentences_keep_one_audio_start_and_their_words_on_the_flushs_timeline():
    sent: list[Any] = []
    utt = utterance(sent, merge=True, response_format="pcm", stream_audio=True, word_timestamps=True)
    await utt.emit(SentenceStart(0, "Hello."))
    await utt.emit(AudioChunk(PCM))
    await utt.emit(SentenceEnd(0, (WordTiming("Hello", 0, 90),)))
    await utt.emit(SentenceStart(1, "There."))
    await utt.emit(AudioChunk(PCM))
    await utt.emit(SentenceEnd(1, (WordTiming("There", 0, 80),)))
    await utt.emit(TurnEnd("ok"))
    assert types(sent) == ["audio.start", "audio.chunk", "audio.chunk", "audio.chunk", "audio.done", "session.done"]
    final = sent[3]
    assert [w["start_ms"] for w in final["timestamps"]] == [0, 100]  # the second sentence starts 100 ms in


async def test_a_cancel_before_any_audio_still_pairs_start_and_done():
    sent: list[Any] = []
    utt = utterance(sent, response_format="pcm", stream_audio=True)
    await utt.end(cancelled=True)
    assert types(sent) == ["audio.start", "audio.done", "session.done"]
    assert sent[1]["cancelled"] is True and sent[1]["total_bytes"] == 0


async def test_a_failure_mid_sentence_says_what_was_sent_and_closes_it():
    sent: list[Any] = []
    utt = utterance(sent, response_format="pcm", stream_audio=True)
    await utt.emit(SentenceStart(0, "Hello there."))
    await utt.emit(AudioChunk(PCM))
    await utt.emit(TurnEnd("error", ErrorKind.ENGINE))
    assert types(sent) == ["audio.start", "<4800 bytes>", "error", "audio.done", "session.done"]
    assert sent[2]["message"] == "Generation failed for utterance 0, sentence 0" and sent[2]["partial_audio"] is True
    assert sent[3]["error"] is True


async def test_codec_packets_end_with_an_eos_packet_and_codec_done():
    sent: list[Any] = []
    spec = {"codebooks": 2, "codebook_size": 1024, "frame_rate_hz": 25.0, "sample_rate": 24000}
    utt = utterance(sent, codec=spec, response_format="pcm", stream_audio=True, output_mode="codec_tokens")
    codes = b"\x01\x00\x02\x00" * 3  # three frames of two codebooks
    await utt.emit(SentenceStart(0, "Hello there."))
    await utt.emit(CodecCodes(codes, 3, last=False, more=False))
    await utt.emit(TurnEnd("error", ErrorKind.ENGINE))
    kinds = types(sent)
    assert kinds[0] == "codec.start" and kinds[-2:] == ["codec.done", "session.done"]
    assert "error" in kinds and sent[-2]["error"] is True


SPEC = {"codebooks": 2, "codebook_size": 1024, "frame_rate_hz": 25.0, "sample_rate": 24000}


def file_utterance(sent: list[Any], holds: list[int], *, budget_bytes: int = 1 << 30, **config: Any) -> Utterance:
    """A file-mode utterance whose budget holds are recorded (and refused beyond ``budget_bytes``)."""

    async def send(payload: dict[str, Any] | bytes) -> None:
        sent.append(payload)

    def hold(held: int) -> bool:
        holds.append(held)
        return held <= budget_bytes

    return Utterance(
        send=send,
        hold_file_audio=hold,
        config=SessionConfig.model_validate({"stream_audio": False, **config}),
        index=3,
        text="One. Two.",
        merge=False,
        speech=SpeechTurn(lambda pieces: {}, ["One.", "Two."]),
    )


async def test_file_mode_sends_each_sentence_as_one_file_and_releases_its_budget_hold():
    sent: list[Any] = []
    holds: list[int] = []
    utt = file_utterance(sent, holds, response_format="wav")
    events = [SentenceStart(0, "One."), AudioChunk(PCM), AudioChunk(PCM), SentenceEnd(0)]
    events += [SentenceStart(1, "Two."), AudioChunk(PCM), SentenceEnd(1), TurnEnd("ok")]
    for event in events:
        await utt.emit(event)
    first, second = protocol.encode_audio(PCM * 2, "wav"), protocol.encode_audio(PCM, "wav")
    assert sent == [
        {"type": "audio.start", "utterance_index": 3, "sentence_index": 0, "sentence_text": "One.", "format": "wav"},
        first,
        {"type": "audio.done", "utterance_index": 3, "sentence_index": 0, "total_bytes": len(first), "error": False},
        {"type": "audio.start", "utterance_index": 3, "sentence_index": 1, "sentence_text": "Two.", "format": "wav"},
        second,
        {"type": "audio.done", "utterance_index": 3, "sentence_index": 1, "total_bytes": len(second), "error": False},
        {"type": "session.done", "utterance_index": 3, "total_sentences": 2},
    ]
    assert holds == [4800, 9600, 0, 4800, 0]  # a sentence's PCM is held until its file went out
    assert utt.speech.media_seconds == pytest.approx(0.3)  # paced by the files sent


async def test_file_audio_the_budget_refuses_fails_the_sentence_with_nothing_sent():
    sent: list[Any] = []
    holds: list[int] = []
    utt = file_utterance(sent, holds, budget_bytes=6000, response_format="wav")
    for event in (SentenceStart(0, "One."), AudioChunk(PCM), AudioChunk(PCM)):
        await utt.emit(event)
    assert sent[1:] == [
        {
            "type": "error",
            "message": f"Generation failed for utterance 3, sentence 0: {budget.AUDIO_FULL_MESSAGE}",
            "kind": "capacity",
        },
        {"type": "audio.done", "utterance_index": 3, "sentence_index": 0, "total_bytes": 0, "error": True},
        {"type": "session.done", "utterance_index": 3, "total_sentences": 1},
    ]
    assert holds == [4800, 9600] and utt.over


async def test_word_timestamps_stream_chunks_then_a_final_chunk_with_the_sentences_words():
    sent: list[Any] = []
    utt = utterance(sent, response_format="pcm", stream_audio=True, word_timestamps=True)
    await utt.emit(SentenceStart(0, "Hello there."))
    await utt.emit(AudioChunk(PCM))
    await utt.emit(AudioChunk(PCM))
    await utt.emit(SentenceEnd(0, (WordTiming("Hello", 0, 90), WordTiming("there", 100, 180))))
    await utt.emit(TurnEnd("ok"))
    assert sent[0] == {
        "type": "audio.start",
        "utterance_index": 0,
        "sentence_index": 0,
        "sentence_text": "Hello there.",
        "format": "pcm",
        "sample_rate": 24000,
        "channels": 1,
        "word_timestamps": True,
    }
    assert sent[1] == protocol.audio_chunk(0, 0, 0, PCM, 0, None)
    assert sent[2] == protocol.audio_chunk(0, 0, 1, PCM, 4800, None)
    assert (sent[2]["chunk_start_ms"], sent[2]["chunk_end_ms"]) == (100, 200)
    words = [{"word": "Hello", "start_ms": 0, "end_ms": 90}, {"word": "there", "start_ms": 100, "end_ms": 180}]
    assert sent[3] == {**protocol.audio_chunk(0, 0, 2, b"", 0, words), "chunk_end_ms": 200}
    assert sent[4:] == [
        {"type": "audio.done", "utterance_index": 0, "sentence_index": 0, "total_bytes": 9600, "error": False},
        {"type": "session.done", "utterance_index": 0, "total_sentences": 1},
    ]


async def test_codec_packets_are_numbered_and_the_last_one_carries_eos():
    sent: list[Any] = []
    utt = utterance(sent, codec=SPEC, response_format="pcm", stream_audio=True, output_mode="codec_tokens")
    codes = b"\x01\x00\x02\x00" * 3  # three frames of two codebooks
    await utt.emit(SentenceStart(0, "Hello there."))
    await utt.emit(CodecCodes(codes, 3, last=False, more=False))
    await utt.emit(CodecCodes(codes[:4], 1, last=True, more=True))  # another sentence follows in the stream
    await utt.emit(SentenceEnd(0))
    await utt.emit(TurnEnd("ok"))
    assert sent[0] == wire.codec_start_message(
        utterance_index=0, sentence_index=0, sentence_text="Hello there.", spec=SPEC, model=utt.config.model
    )
    rows = [[1, 2]] * 3
    assert sent[1] == wire.pack_codec_frame(0, rows, codebooks=2)
    assert sent[2] == wire.pack_codec_frame(1, rows[:1], eos=True, segment_end=True, codebooks=2)
    packet = wire.unpack_codec_frame(sent[2], 2)
    assert (packet.seq, packet.n_frames, packet.flags) == (1, 1, wire.FLAG_EOS | wire.FLAG_SEGMENT_END)
    assert sent[3:] == [
        protocol.codec_done(0, 0, 4, 1),
        {"type": "session.done", "utterance_index": 0, "total_sentences": 1},
    ]
    assert sent[3]["seq_last"] == 1 and sent[3]["total_frames"] == 4


async def test_a_codec_stream_cancelled_before_any_packet_still_ends_with_an_empty_eos_packet():
    sent: list[Any] = []
    utt = utterance(sent, codec=SPEC, response_format="pcm", stream_audio=True, output_mode="codec_tokens")
    await utt.end(cancelled=True)
    assert sent[0]["type"] == "codec.start" and sent[0]["sentence_text"] == ""
    assert sent[1] == wire.pack_codec_frame(0, None, eos=True, codebooks=2)
    assert sent[2:] == [
        {
            "type": "codec.done",
            "utterance_index": 0,
            "sentence_index": 0,
            "total_frames": 0,
            "seq_last": 0,
            "error": False,
            "cancelled": True,
        },
        {"type": "session.done", "utterance_index": 0, "total_sentences": 1},
    ]


async def test_an_engine_that_is_busy_before_any_audio_lets_the_client_retry():
    sent: list[Any] = []
    utt = utterance(sent, response_format="pcm", stream_audio=True)
    await utt.emit(TurnEnd("busy", ErrorKind.CAPACITY, message="the engine is full; retry shortly"))
    assert sent == [
        {"type": "error", "message": "the engine is full; retry shortly", "kind": "capacity"},
        {"type": "session.done", "utterance_index": 0, "total_sentences": 0},
    ]
