"""Audio on the wire with the real hibari voice: formats, streaming, splitting, seeds, speed, timestamps."""

from __future__ import annotations

import asyncio
import base64
import io
import wave

import numpy as np
import pytest
import soundfile
from hibari import Hibari
from support.messages import Sentence, Transcript, expect_silence, session, speak

SAMPLE_RATE = 24000
FOX = "The quick brown fox jumps over the lazy dog."
JUGS = "Pack my box with five dozen liquor jugs."
TWO = f"{FOX} {JUGS}"
WORD_TIMESTAMPS_ERROR = (
    "word_timestamps=true requires stream_audio=true and response_format='pcm' "
    "(timestamps ride the per-sentence PCM audio.chunk stream)."
)


def samples(pcm: bytes) -> np.ndarray:
    assert len(pcm) % 2 == 0, "16-bit PCM has an even byte count"
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def rms(pcm: bytes) -> float:
    x = samples(pcm)
    return float(np.sqrt(np.mean(x**2))) if x.size else 0.0


def assert_plausible_speech(pcm: bytes, text: str) -> None:
    """Duration in a human range for the number of words, and not silence."""
    seconds = len(pcm) / 2 / SAMPLE_RATE
    words = len(text.split())
    assert 0.15 * words <= seconds <= 1.0 * words, f"{seconds:.2f}s for {words} words: {text!r}"
    assert rms(pcm) > 200, f"audio is (nearly) silent: rms {rms(pcm):.1f}"


def assert_well_formed(t: Transcript, utterance: int = 0) -> list[Sentence]:
    """Every sentence is audio.start … audio.done with consecutive indexes, then one session.done."""
    assert t.errors == []
    sentences = t.sentences()
    assert [s.start["sentence_index"] for s in sentences] == list(range(len(sentences)))
    for s in sentences:
        assert s.done is not None
        assert s.start["utterance_index"] == s.done["utterance_index"] == utterance
        assert s.done["sentence_index"] == s.start["sentence_index"]
        assert s.done["error"] is False and "cancelled" not in s.done
    assert t.json[-1] == {"type": "session.done", "utterance_index": utterance, "total_sentences": len(sentences)}
    return sentences


def pcm_of(t: Transcript) -> bytes:
    return b"".join(s.audio for s in t.sentences())


# -- containers ------------------------------------------------------------------------------------


async def test_wav_one_file_per_sentence(connect):
    comm = await session(connect, split_granularity="sentence")
    t = await speak(comm, TWO)
    sentences = assert_well_formed(t)
    assert [s.start["sentence_text"] for s in sentences] == [FOX, JUGS]
    for s in sentences:
        assert s.start["format"] == "wav"
        assert "sample_rate" not in s.start and "word_timestamps" not in s.start
        [blob] = s.binary  # exactly one binary frame per sentence
        assert s.done["total_bytes"] == len(blob)
        with wave.open(io.BytesIO(blob)) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SAMPLE_RATE, 1, 2)
            pcm = w.readframes(w.getnframes())
        assert len(pcm) == w.getnframes() * 2 > 0
        assert_plausible_speech(pcm, s.start["sentence_text"])


async def test_pcm_not_streamed_is_one_raw_frame_per_sentence(connect):
    comm = await session(connect, response_format="pcm")
    t = await speak(comm, TWO)
    for s in assert_well_formed(t):
        assert s.start["format"] == "pcm" and "sample_rate" not in s.start
        [pcm] = s.binary
        assert pcm[:4] != b"RIFF"
        assert s.done["total_bytes"] == len(pcm)
        assert_plausible_speech(pcm, s.start["sentence_text"])


async def test_stream_audio_sends_several_pcm_frames_per_sentence(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True)
    t = await speak(comm, TWO)
    for s in assert_well_formed(t):
        assert s.start["format"] == "pcm" and s.start["sample_rate"] == SAMPLE_RATE
        assert len(s.binary) > 1, "stream_audio must stream, not send one blob"
        assert all(len(frame) % 2 == 0 and frame for frame in s.binary)
        assert s.done["total_bytes"] == sum(len(frame) for frame in s.binary)
        assert_plausible_speech(s.audio, s.start["sentence_text"])


async def test_streamed_and_whole_pcm_are_the_same_audio(connect):
    whole = await session(connect, response_format="pcm", seed=11)
    streamed = await session(connect, response_format="pcm", stream_audio=True, seed=11)
    a = await speak(whole, TWO)
    b = await speak(streamed, TWO)
    assert pcm_of(a) == pcm_of(b)


async def test_initial_codec_chunk_frames_bounds_the_first_frame(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True, initial_codec_chunk_frames=4)
    t = await speak(comm, FOX)
    [s] = assert_well_formed(t)
    assert 0 < len(s.binary[0]) <= 4 * 300 * 2  # at most 4 frames of 12.5 ms
    assert len(s.binary[0]) < len(s.binary[1])


@pytest.mark.parametrize("fmt", ["flac", "opus", "mp3"])
async def test_compressed_formats_decode(connect, fmt):
    pcm_comm = await session(connect, response_format="pcm", seed=3)
    reference = samples(pcm_of(await speak(pcm_comm, FOX)))
    comm = await session(connect, response_format=fmt, seed=3)
    t = await speak(comm, FOX)
    [s] = assert_well_formed(t)
    assert s.start["format"] == fmt
    [blob] = s.binary
    assert s.done["total_bytes"] == len(blob) > 0
    magic = {"flac": (b"fLaC",), "opus": (b"OggS",), "mp3": (b"ID3",)}[fmt]
    if fmt == "mp3":  # an ID3 tag or an MPEG audio frame sync (11 set bits)
        assert blob.startswith(magic) or (blob[0] == 0xFF and blob[1] & 0xE0 == 0xE0)
    else:
        assert blob.startswith(magic)
    if fmt == "mp3" and "MP3" not in soundfile.available_formats():
        return
    data, rate = soundfile.read(io.BytesIO(blob), dtype="int16")
    assert rate == SAMPLE_RATE and data.ndim == 1
    assert abs(len(data) - len(reference)) <= 0.05 * len(reference) + 2000
    if fmt == "flac":  # lossless
        assert np.array_equal(data.astype(np.float64), reference)
    assert rms(data.astype("<i2").tobytes()) > 200


# -- splitting -------------------------------------------------------------------------------------


SPLIT_TEXT = "First part, second part; third part. Then a new sentence, with a clause."


@pytest.mark.parametrize(
    ("granularity", "expected"),
    [
        ("sentence", ["First part, second part; third part.", "Then a new sentence, with a clause."]),
        ("clause", ["First part,", "second part;", "third part.", "Then a new sentence,", "with a clause."]),
        ("none", [SPLIT_TEXT]),
    ],
)
async def test_split_granularity(connect, granularity, expected):
    comm = await session(connect, response_format="pcm", split_granularity=granularity)
    t = await speak(comm, SPLIT_TEXT)
    sentences = assert_well_formed(t)
    assert [s.start["sentence_text"] for s in sentences] == expected
    assert all(rms(s.audio) > 200 for s in sentences)


async def test_default_granularity_is_none(connect):
    comm = await session(connect, response_format="pcm")
    t = await speak(comm, SPLIT_TEXT)
    assert [s.start["sentence_text"] for s in assert_well_formed(t)] == [SPLIT_TEXT]


# -- seeds, speed, length caps ---------------------------------------------------------------------


async def test_same_seed_same_bytes_different_seed_different_bytes(connect):
    comm = await session(connect, response_format="wav", seed=1234)
    first = await speak(comm, TWO)
    again = await speak(comm, TWO)
    assert [s.binary for s in first.sentences()] == [s.binary for s in again.sentences()]

    other = await session(connect, response_format="wav", seed=1234)
    assert [s.binary for s in (await speak(other, TWO)).sentences()] == [s.binary for s in first.sentences()]

    await comm.send_json_to({"type": "session.config", "response_format": "wav", "seed": 1235})
    different = await speak(comm, TWO)
    assert [s.binary for s in different.sentences()] != [s.binary for s in first.sentences()]
    # Only the noise differs: same text, same lengths.
    assert [len(s.audio) for s in different.sentences()] == [len(s.audio) for s in first.sentences()]


async def test_extreme_seeds_are_deterministic(connect):
    lo = await session(connect, response_format="pcm", seed=-(2**63))
    hi = await session(connect, response_format="pcm", seed=2**63 - 1)
    a1, a2 = pcm_of(await speak(lo, FOX)), pcm_of(await speak(lo, FOX))
    b1 = pcm_of(await speak(hi, FOX))
    assert a1 == a2
    assert a1 != b1


async def test_without_seed_noise_varies(connect):
    comm = await session(connect, response_format="pcm")
    assert pcm_of(await speak(comm, FOX)) != pcm_of(await speak(comm, FOX))


async def test_speed_changes_duration(connect):
    durations = {}
    for speed in (0.5, 1.0, 2.0):
        comm = await session(connect, response_format="pcm", speed=speed, seed=1)
        t = await speak(comm, FOX)
        assert_well_formed(t)
        durations[speed] = len(pcm_of(t)) / 2 / SAMPLE_RATE
    assert durations[2.0] < 0.75 * durations[1.0]
    assert durations[0.5] > 1.3 * durations[1.0]


async def test_max_new_tokens_caps_every_sentence(connect):
    frames = 24  # 24 × 12.5 ms = 0.3 s
    capped = await session(connect, split_granularity="sentence", response_format="pcm", max_new_tokens=frames, seed=2)
    free = await session(connect, split_granularity="sentence", response_format="pcm", seed=2)
    capped_sentences = assert_well_formed(await speak(capped, TWO))
    free_sentences = assert_well_formed(await speak(free, TWO))
    assert len(capped_sentences) == len(free_sentences) == 2
    for c, f in zip(capped_sentences, free_sentences, strict=True):
        assert 0 < len(c.audio) <= frames * 300 * 2
        assert len(f.audio) > frames * 300 * 2  # the cap is what shortened it
        assert c.done["total_bytes"] == len(c.audio)


async def test_max_new_tokens_caps_streamed_audio(connect):
    comm = await session(
        connect, split_granularity="sentence", response_format="pcm", stream_audio=True, max_new_tokens=10
    )
    for s in assert_well_formed(await speak(comm, TWO)):
        assert 0 < s.done["total_bytes"] == len(s.audio) <= 10 * 300 * 2


# -- word timestamps -------------------------------------------------------------------------------


def check_timestamp_sentence(s: Sentence) -> list[dict]:
    """audio.chunk stream of one sentence; returns its word timings."""
    assert s.start["word_timestamps"] is True and s.start["sample_rate"] == SAMPLE_RATE
    assert s.binary == [], "word_timestamps mode sends audio as JSON audio.chunk, never binary"
    chunks = s.chunks
    assert len(chunks) == len(s.events) >= 3
    *audio, final = chunks
    assert [c["chunk_id"] for c in chunks] == list(range(len(chunks)))
    position = 0
    total = 0
    for c in audio:
        assert c["utterance_index"] == s.start["utterance_index"]
        assert c["sentence_index"] == s.start["sentence_index"]
        assert c["sample_rate"] == SAMPLE_RATE and c["timestamps"] is None
        pcm = base64.b64decode(c["audio_b64"])
        assert pcm and len(pcm) % 2 == 0
        assert c["chunk_start_ms"] == position, "chunks must be contiguous"
        total += len(pcm)
        assert c["chunk_end_ms"] == round(total / 2 / SAMPLE_RATE * 1000)
        position = c["chunk_end_ms"]
    assert final["audio_b64"] == ""
    assert final["chunk_start_ms"] == 0 and final["chunk_end_ms"] == position
    assert s.done["total_bytes"] == total
    words = final["timestamps"]
    assert isinstance(words, list)
    previous_end = 0
    for w in words:
        assert set(w) == {"word", "start_ms", "end_ms"}
        assert previous_end <= w["start_ms"] <= w["end_ms"] <= position
        previous_end = w["end_ms"]
    assert [w["word"] for w in words] == s.start["sentence_text"].split()
    return words


async def test_word_timestamps_stream(connect):
    comm = await session(
        connect, split_granularity="sentence", response_format="pcm", stream_audio=True, word_timestamps=True
    )
    t = await speak(comm, TWO)
    sentences = assert_well_formed(t)
    assert len(sentences) == 2
    words = [w for s in sentences for w in check_timestamp_sentence(s)]
    assert [w["word"] for w in words] == TWO.split()
    for s in sentences:  # speech has real extent, not zero-length spans everywhere
        audio = b"".join(base64.b64decode(c["audio_b64"]) for c in s.chunks)
        assert_plausible_speech(audio, s.start["sentence_text"])
        spoken = check_timestamp_sentence(s)
        assert spoken[-1]["end_ms"] - spoken[0]["start_ms"] > 100 * len(spoken)


async def test_word_timestamps_keep_every_word_as_sent(connect):
    text = "On the 3rd of March 2024, 1,250 people paid $9.99 each. Dr. Smith said: wow!"
    comm = await session(connect, response_format="pcm", stream_audio=True, word_timestamps=True)
    t = await speak(comm, [text[:17], text[17:40], text[40:]])
    sentences = assert_well_formed(t)
    words = [w for s in sentences for w in check_timestamp_sentence(s)]
    assert [w["word"] for w in words] == text.split()


async def test_word_timestamps_with_clause_split(connect):
    comm = await session(
        connect, response_format="pcm", stream_audio=True, word_timestamps=True, split_granularity="clause"
    )
    t = await speak(comm, SPLIT_TEXT)
    sentences = assert_well_formed(t)
    assert len(sentences) == 5
    assert [w["word"] for s in sentences for w in check_timestamp_sentence(s)] == SPLIT_TEXT.split()


@pytest.mark.parametrize("granularity", ["sentence", "clause"])
async def test_word_timestamps_keep_closing_quotes(connect, granularity):
    text = 'He said "Stop." Then (quietly.) he left.'
    comm = await session(
        connect, response_format="pcm", stream_audio=True, word_timestamps=True, split_granularity=granularity
    )
    t = await speak(comm, text)
    sentences = assert_well_formed(t)
    assert " ".join(s.start["sentence_text"] for s in sentences).split() == text.split()
    assert [w["word"] for s in sentences for w in check_timestamp_sentence(s)] == text.split()


@pytest.mark.parametrize(
    "fields",
    [
        {"word_timestamps": True},
        {"word_timestamps": True, "response_format": "pcm"},
        {"word_timestamps": True, "response_format": "flac"},
    ],
)
async def test_word_timestamps_need_stream_audio(connect, fields):
    comm = await session(connect, **fields)
    await expect_silence(comm, 0.05)  # the config itself is accepted, as in the reference
    t = await speak(comm, FOX)
    assert t.errors == [WORD_TIMESTAMPS_ERROR]
    assert t.types == ["error", "session.done"]
    assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}


async def test_word_timestamps_across_model_segments(connect):
    # One sentence too long for a single model call: hibari cuts it at clause punctuation into
    # several segments (over 400 phonemes; without commas it would stay one long segment).
    clause = "the big brown dog, and the small grey cat, walked along the river bank, while the sun went down, and"
    text = " ".join([clause] * 6) + " then it was night."
    assert len(Hibari().phonemize(text)) >= 2, "the premise: the model speaks it in several segments"
    comm = await session(connect, response_format="pcm", stream_audio=True, word_timestamps=True)
    t = await speak(comm, text)
    [s] = assert_well_formed(t)
    words = check_timestamp_sentence(s)
    assert [w["word"] for w in words] == text.split()
    assert all(w["end_ms"] > w["start_ms"] for w in words), "every spoken word has a real extent"
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts), "the second segment's words follow the first's"


# -- concurrency -----------------------------------------------------------------------------------


async def test_concurrent_sessions_with_the_same_seed_get_identical_audio(connect):
    text = f"{TWO} How vexingly quick daft zebras jump."
    solo = pcm_of(
        await speak(
            await session(connect, split_granularity="sentence", response_format="pcm", stream_audio=True, seed=7), text
        )
    )
    comms = [
        await session(connect, split_granularity="sentence", response_format="pcm", stream_audio=True, seed=7)
        for _ in range(4)
    ]
    results = await asyncio.gather(*(speak(comm, text) for comm in comms))
    for t in results:
        assert len(assert_well_formed(t)) == 3
        assert pcm_of(t) == solo, "batching with other sessions must not change a seeded voice"
