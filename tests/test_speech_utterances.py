"""The speech endpoint's utterance writer without a socket: the core's typed events in, the wire's
messages out, in the reference's order (speech/utterances.py)."""

from __future__ import annotations

from typing import Any

from omniweb.conversation import (
    AudioChunk,
    CodecCodes,
    SentenceEnd,
    SentenceStart,
    SpeechTurn,
    TurnEnd,
    WordTiming,
)
from omniweb.errors import ErrorKind
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
