"""The shape of a flush on the wire: one request per flush by default (seed 003), pipelined inside;
sentence/clause split spoken before the flush; ``channels`` on streamed PCM."""

from __future__ import annotations

import base64
import io
import itertools
import wave
from types import SimpleNamespace

import pytest
import soundfile
from support.messages import Transcript, is_type, receive_until, receive_until_done, session, speak

from omniweb.conversation import utterance

FOX = "The quick brown fox jumps over the lazy dog."
JUGS = "Pack my box with five dozen liquor jugs."
ZEBRAS = "How vexingly quick daft zebras jump."
THREE = f"{FOX} {JUGS} {ZEBRAS}"


def assert_one_request(t: Transcript, text: str, utterance: int = 0) -> None:
    """The seed's flush: audio.start (sentence 0, the whole text) … audio.done, session.done of 1."""
    assert t.errors == []
    [s] = t.sentences()
    assert s.start["sentence_index"] == 0 and s.start["sentence_text"] == text
    assert s.start["utterance_index"] == s.done["utterance_index"] == utterance
    assert s.done["error"] is False and "cancelled" not in s.done
    assert t.json[-1] == {"type": "session.done", "utterance_index": utterance, "total_sentences": 1}


def pcm_of(t: Transcript) -> bytes:
    return b"".join(s.audio for s in t.sentences())


# -- 1. the default: one request per flush -----------------------------------------------------------
async def test_the_flush_is_one_engine_request_split_by_sentence_inside(connect, requests_seen):
    await speak(await session(connect, response_format="wav"), THREE)
    await speak(await session(connect, response_format="pcm", stream_audio=True), THREE)
    file_request, stream_request = [r for r in requests_seen if r["pipeline"] == "speech.tts"]
    assert file_request["text"] == stream_request["text"] == THREE
    assert file_request["split"] == stream_request["split"] == "sentence"
    assert file_request["max_frames_scope"] == "request"
    # a file is sent when the flush is whole: it is made as fast as the engine can, not paced
    assert file_request["paced"] is False and stream_request["paced"] is True


async def test_default_flush_is_one_request_however_long(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True)
    t = await speak(comm, THREE)
    assert_one_request(t, THREE)
    assert t.of_type("audio.start")[0] == {
        "type": "audio.start",
        "utterance_index": 0,
        "sentence_index": 0,
        "sentence_text": THREE,
        "format": "pcm",
        "sample_rate": 24000,
        "channels": 1,
    }
    assert len(t.binary) > 3, "the audio streams in vocoder-sized chunks"
    t = await speak(comm, FOX)  # the next flush on the same socket
    assert_one_request(t, FOX, utterance=1)


async def test_streamed_pcm_runs_across_internal_sentences_without_a_gap(connect):
    """The flush's stream is exactly the sentences' audio back to back (same seed): nothing added
    or dropped at the internal boundaries, and the same noise as one request sentence by sentence."""
    whole = await speak(await session(connect, response_format="pcm", stream_audio=True, seed=9), THREE)
    split = await speak(
        await session(connect, response_format="pcm", stream_audio=True, seed=9, split_granularity="sentence"), THREE
    )
    assert [s.start["sentence_text"] for s in split.sentences()] == [FOX, JUGS, ZEBRAS]
    assert pcm_of(whole) == pcm_of(split)
    [s] = whole.sentences()
    assert s.done["total_bytes"] == len(s.audio)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
async def test_a_file_per_flush_is_one_valid_file(connect, fmt):
    pcm = pcm_of(await speak(await session(connect, response_format="pcm", seed=4), THREE))
    t = await speak(await session(connect, response_format=fmt, seed=4), THREE)
    assert_one_request(t, THREE)
    [s] = t.sentences()
    [blob] = s.binary  # one file for the whole flush
    assert s.done["total_bytes"] == len(blob)
    data, rate = soundfile.read(io.BytesIO(blob), dtype="int16")
    assert rate == 24000 and data.ndim == 1
    if fmt == "wav":
        with wave.open(io.BytesIO(blob)) as w:
            assert w.readframes(w.getnframes()) == pcm
    elif fmt == "flac":
        assert data.tobytes() == pcm  # lossless
    else:  # lossy codecs: the same duration within the codec's padding
        assert abs(len(data) - len(pcm) // 2) < 0.1 * 24000


async def test_word_timestamps_cover_the_whole_flush(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True, word_timestamps=True)
    t = await speak(comm, THREE)
    assert_one_request(t, THREE)
    [s] = t.sentences()
    chunks = s.chunks
    assert [c["chunk_id"] for c in chunks] == list(range(len(chunks)))
    assert all(c["channels"] == 1 and c["sentence_index"] == 0 for c in chunks)
    *audio, final = chunks
    assert all(c["timestamps"] is None for c in audio) and final["audio_b64"] == ""
    pcm = b"".join(base64.b64decode(c["audio_b64"]) for c in audio)
    total_ms = round(len(pcm) / 2 / 24000 * 1000)
    for before, after in itertools.pairwise(audio):
        assert after["chunk_start_ms"] == before["chunk_end_ms"], "chunk times run on across sentences"
    words = final["timestamps"]
    assert [w["word"] for w in words] == THREE.split()
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts) and all(w["end_ms"] >= w["start_ms"] for w in words)
    assert words[-1]["end_ms"] <= total_ms == final["chunk_end_ms"]
    # the later sentences' words are on the flush's timeline, not restarted at 0
    first_sentence_end = words[len(FOX.split()) - 1]["end_ms"]
    assert words[len(FOX.split())]["start_ms"] >= first_sentence_end > 1000


async def test_max_new_tokens_caps_the_whole_flush(connect):
    frames = 100  # 1.25 s: less than the first sentence
    t = await speak(await session(connect, response_format="pcm", max_new_tokens=frames), THREE)
    assert_one_request(t, THREE)
    assert 0 < len(pcm_of(t)) <= frames * 300 * 2
    each = await speak(
        await session(connect, response_format="pcm", max_new_tokens=frames, split_granularity="sentence"), THREE
    )
    assert [0 < len(s.audio) <= frames * 300 * 2 for s in each.sentences()] == [True] * 3


async def test_cancel_stops_the_one_request(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True)
    long = " ".join(f"Sentence number {i} of a long flush." for i in range(20))
    await comm.send_json_to({"type": "input.text", "text": long})
    await comm.send_json_to({"type": "input.done"})
    await receive_until(comm, lambda m: isinstance(m, bytes))
    await comm.send_json_to({"type": "input.cancel"})
    t = await receive_until_done(comm)
    [done] = t.of_type("audio.done")
    assert done["sentence_index"] == 0 and done["cancelled"] is True
    assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}


# -- 2. sentence / clause: speaking before the flush -------------------------------------------------


async def test_a_completed_sentence_is_spoken_before_the_flush(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True, split_granularity="sentence")
    await comm.send_json_to({"type": "input.text", "text": f"{FOX} Pa"})  # "Pa": the first one is complete
    first = await receive_until(comm, is_type("audio.done"))
    assert first.of_type("audio.start")[0]["sentence_text"] == FOX
    assert first.of_type("audio.start")[0]["channels"] == 1
    assert len(first.binary) > 0 and first.of_type("audio.done")[0]["sentence_index"] == 0
    await comm.send_json_to({"type": "input.text", "text": JUGS[2:]})  # completes nothing yet
    await comm.send_json_to({"type": "input.done"})  # flushes the rest
    rest = await receive_until_done(comm)
    assert rest.errors == []
    assert [m["sentence_text"] for m in rest.of_type("audio.start")] == [JUGS]
    assert [m["sentence_index"] for m in rest.of_type("audio.start")] == [1]
    assert rest.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}


async def test_a_batch_session_is_never_held_for_playback_between_its_requests(
    connect, settings, monkeypatch, requests_seen
):
    """``priority: "batch"`` (a file writer, as ``manage.py speak``): the pieces completed after the
    first request go out when it ends, however far its audio is ahead of playback. The listener's
    clock is frozen here, so a turn paced across requests would hold the second one for ever."""
    settings.ENGINE_MAX_AHEAD_SECONDS = 0.5
    monkeypatch.setattr(utterance, "time", SimpleNamespace(monotonic=lambda: 0.0))
    config = {"response_format": "pcm", "stream_audio": True, "split_granularity": "sentence", "priority": "batch"}
    comm = await session(connect, **config)
    await comm.send_json_to({"type": "input.text", "text": THREE})  # FOX and JUGS complete: the first request
    first = await receive_until(comm, is_type("audio.done"))  # it speaks (seconds ahead of the frozen clock)
    await comm.send_json_to({"type": "input.done"})  # ZEBRAS: the second request
    rest = await receive_until_done(comm)
    assert first.errors == rest.errors == []
    sentences = [m["sentence_text"] for t in (first, rest) for m in t.of_type("audio.start")]
    assert sentences == [FOX, JUGS, ZEBRAS] and rest.json[-1]["total_sentences"] == 3
    tts = [r for r in requests_seen if r["pipeline"] == "speech.tts"]
    assert [r["text"] for r in tts] == [f"{FOX}\n{JUGS}", ZEBRAS] and {r["priority"] for r in tts} == {"batch"}


async def test_token_streamed_text_gives_the_same_audio_as_one_message(connect):
    """LLM-style tokens: the pieces are cut exactly as in one message, with the same seeded noise."""
    config = {"response_format": "pcm", "stream_audio": True, "seed": 5, "split_granularity": "sentence"}
    tokens = [w + " " for w in THREE.split()]
    streamed = await speak(await session(connect, **config), tokens)
    at_once = await speak(await session(connect, **config), THREE)
    assert [s.start["sentence_text"] for s in streamed.sentences()] == [FOX, JUGS, ZEBRAS]
    assert pcm_of(streamed) == pcm_of(at_once)
    assert streamed.json[-1]["total_sentences"] == 3


async def test_clauses_are_spoken_before_the_flush(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True, split_granularity="clause")
    await comm.send_json_to({"type": "input.text", "text": "First part, second"})
    first = await receive_until(comm, is_type("audio.done"))
    assert [m["sentence_text"] for m in first.of_type("audio.start")] == ["First part,"]
    await comm.send_json_to({"type": "input.text", "text": " part."})
    await comm.send_json_to({"type": "input.done"})
    rest = await receive_until_done(comm)
    assert [m["sentence_text"] for m in rest.of_type("audio.start")] == ["second part."]
    assert rest.json[-1]["total_sentences"] == 2


async def test_cancel_before_the_flush_drops_what_is_queued_and_stops_what_plays(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True, split_granularity="sentence")
    long = " ".join(f"Sentence number {i} is queued behind the first." for i in range(10))
    await comm.send_json_to({"type": "input.text", "text": f"{long} And an unfinished"})
    await receive_until(comm, lambda m: isinstance(m, bytes))
    await comm.send_json_to({"type": "input.cancel"})
    t = await receive_until_done(comm)
    dones = t.of_type("audio.done")
    assert dones[-1]["cancelled"] is True
    assert t.json[-1]["total_sentences"] == len(dones) < 10
    # nothing of the cancelled utterance is left: the next flush has only the new text
    t = await speak(comm, FOX)
    assert [m["sentence_text"] for m in t.of_type("audio.start")] == [FOX]
    assert t.json[-1] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


async def test_config_is_refused_while_speaking_before_the_flush(connect):
    comm = await session(connect, response_format="pcm", split_granularity="sentence")
    await comm.send_json_to({"type": "input.text", "text": f"{FOX} {JUGS}"})
    await comm.send_json_to({"type": "session.config", "response_format": "wav"})
    await comm.send_json_to({"type": "input.done"})
    t = await receive_until_done(comm)
    assert t.errors == ["session.config cannot be applied while input is buffered; send input.done first"]
    assert [m["format"] for m in t.of_type("audio.start")] == ["pcm", "pcm"]


async def test_unknown_config_fields_are_accepted(connect):
    comm = await session(connect, response_format="pcm", some_future_field=[1, 2], temperature=0.3)
    t = await speak(comm, FOX)
    assert_one_request(t, FOX)


async def test_server_codec_vocoder_flush_is_one_request_too(connect):
    config = {"response_format": "pcm", "stream_audio": True, "vocoder": "codec"}
    whole = await speak(await session(connect, **config), THREE)
    split = await speak(await session(connect, **config, split_granularity="sentence"), THREE)
    assert_one_request(whole, THREE)
    assert len(split.sentences()) == 3 and pcm_of(whole) == pcm_of(split)


async def test_codec_tokens_flush_is_one_code_stream(connect):
    t = await speak(await session(connect, output_mode="codec_tokens"), THREE)
    assert t.errors == []
    [start] = t.of_type("codec.start")
    assert start["sentence_index"] == 0 and start["sentence_text"] == THREE
    [done] = t.of_type("codec.done")
    assert done["error"] is False and done["total_frames"] > 3 * 80  # over three seconds of codes
    assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}


async def test_messages_held_during_an_utterance_replay_into_one_spoken_before_the_flush(connect):
    """Held behind a playing utterance, text that completes a sentence starts the next utterance
    while the rest of what was held (more text, the flush) still follows in order."""
    comm = await session(connect, response_format="pcm", stream_audio=True, split_granularity="sentence")
    await comm.send_json_to({"type": "input.text", "text": FOX})
    await comm.send_json_to({"type": "input.done"})
    await comm.send_json_to({"type": "input.text", "text": f"{JUGS} How"})  # held, completes JUGS
    await comm.send_json_to({"type": "input.text", "text": " vexingly quick daft zebras jump."})
    await comm.send_json_to({"type": "input.done"})
    first = await receive_until_done(comm)
    assert [m["sentence_text"] for m in first.of_type("audio.start")] == [FOX]
    second = await receive_until_done(comm)
    assert second.errors == []
    assert [m["sentence_text"] for m in second.of_type("audio.start")] == [JUGS, ZEBRAS]
    assert second.json[-1] == {"type": "session.done", "utterance_index": 1, "total_sentences": 2}
