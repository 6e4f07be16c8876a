"""Codec-token streaming (``output_mode: "codec_tokens"``) and PCM made by the server's codec decoder.

End to end through the ASGI app (both dispatch paths, via ``connect``), on the engine alone, and over a
real socket with ``manage.py speak --codec`` against a daphne.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import threading
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websockets
from channels.testing import WebsocketCommunicator
from django.conf import settings
from support.engine import typed_request, wait_engine_idle
from support.messages import (
    Transcript,
    expect_close,
    expect_error,
    expect_silence,
    receive_until,
    receive_until_done,
    session,
    speak,
)
from support.servers import ROOT, free_port, live_server

import speech.session
from omniweb.engine import runtime
from omniweb.engine.client import LocalEngineClient
from omniweb.engine.messages import Chunk, End, to_wire
from omniweb.engine.requests import SpeakRequest
from omniweb.engine.scheduler import Scheduler, SchedulerStats
from speech.codec import wire
from speech.codec.loops import CODEC_PIPELINE, CodecPipeline, shared_codec
from speech.codec.model import Codec, CodecTableError
from speech.protocol import CODEC_UNSUPPORTED
from speech.tts.loops import to_pcm16

FOX = "The quick brown fox jumps over the lazy dog."
JUGS = "Pack my box with five dozen liquor jugs."
TWO = f"{FOX} {JUGS}"
LONG = " ".join(f"This is sentence number {i} of a rather long flush that keeps going." for i in range(30))
# One sentence too long for one model call: hibari cuts it into several segments.
CLAUSE = "big brown dog and the small grey cat walked along the river bank while the sun went down,"
SEGMENTED = "The " + " the ".join([CLAUSE] * 6) + " and then it was night."
# Sentence by sentence: these tests follow the codec stream across sentence boundaries.
CODEC = {"output_mode": "codec_tokens", "split_granularity": "sentence"}
SERVER_PCM = {"response_format": "pcm", "stream_audio": True, "vocoder": "codec", "split_granularity": "sentence"}


@pytest.fixture(scope="module")
def codec() -> Codec:
    return shared_codec()


# -- reading a codec transcript ----------------------------------------------------------------------


@dataclass
class CodecSentence:
    start: dict[str, Any]
    packets: list[wire.CodecPacket] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    done: dict[str, Any] | None = None

    @property
    def rows(self) -> np.ndarray:
        return np.concatenate([p.codes for p in self.packets])

    def decode(self, codec: Codec) -> bytes:
        """What a client plays: one decoder per codec.start, pushed packet by packet, flushed at EOS."""
        decoder = codec.decoder()
        out = []
        for p in self.packets:
            out.append(decoder.push(p.codes))
            if p.eos:
                out.append(decoder.flush())
        return to_pcm16(np.concatenate(out))


def codec_sentences(t: Transcript) -> list[CodecSentence]:
    """Group the packets between each codec.start and its codec.done, checking the stream rules:
    seq from 0 without gaps, nothing after EOS, and an EOS packet in every stream that did not fail."""
    out: list[CodecSentence] = []
    current: CodecSentence | None = None
    reader: wire.CodecStreamReader | None = None
    for e in t.events:
        if isinstance(e, dict) and e.get("type") == "codec.start":
            assert current is None, f"codec.start inside an open stream: {e}"
            current, reader = CodecSentence(start=e), wire.CodecStreamReader.for_start(e)
        elif isinstance(e, dict) and e.get("type") == "codec.done":
            assert current is not None and reader is not None, f"codec.done without codec.start: {e}"
            assert reader.eos or e["error"], "a stream that did not fail ends with an EOS packet"
            assert e["total_frames"] == reader.total_frames
            assert e["seq_last"] == reader.next_seq - 1
            current.done = e
            out.append(current)
            current = reader = None
        elif isinstance(e, bytes):
            assert current is not None and reader is not None, "a binary packet outside codec.start … codec.done"
            current.packets.append(reader.feed(e))
            current.raw.append(e)
        else:
            assert not (isinstance(e, dict) and e.get("type", "").startswith("audio.")), e
    assert current is None, "a codec stream was left open"
    return out


def pcm_of(t: Transcript) -> bytes:
    return b"".join(b"".join(s.binary) for s in t.sentences())


# -- the codec session end to end ---------------------------------------------------------------------


async def test_codec_session_streams_each_sentence(connect, codec):
    comm = await session(connect, **CODEC, seed=3)
    await expect_silence(comm, 0.05)  # a valid config is answered with nothing
    t = await speak(comm, TWO)
    assert t.errors == []
    sentences = codec_sentences(t)
    assert [s.start["sentence_text"] for s in sentences] == [FOX, JUGS]
    for i, s in enumerate(sentences):
        assert s.start == {
            "type": "codec.start",
            "version": 1,
            "utterance_index": 0,
            "sentence_index": i,
            "sentence_text": s.start["sentence_text"],
            "model": None,
            "codebooks": codec.codebooks,
            "codebook_size": codec.codebook_size,
            "frame_rate_hz": 80.0,
            "sample_rate": 24000,
            "decoder_id": codec.decoder_id,
            "header_format": "<IHB",
        }
        sizes = [p.n_frames for p in s.packets]
        assert sizes[0] == settings.CODEC_FIRST_PACKET_FRAMES, "a small first packet leaves first"
        assert all(0 < n <= settings.CODEC_PACKET_FRAMES for n in sizes)
        assert len(sizes) > 3
        # EOS on the last packet only; SEGMENT_END there too when another sentence of the flush is known
        # to follow (the first sentence is spoken before the flush, when that may not be known yet)
        flags = [p.flags for p in s.packets]
        last = {wire.FLAG_EOS, wire.FLAG_EOS | wire.FLAG_SEGMENT_END} if i == 0 else {wire.FLAG_EOS}
        assert flags[:-1] == [0] * (len(flags) - 1) and flags[-1] in last
        assert s.done == {
            "type": "codec.done",
            "utterance_index": 0,
            "sentence_index": i,
            "total_frames": sum(sizes),
            "seq_last": len(sizes) - 1,
            "error": False,
            "cancelled": False,
        }
        seconds = len(s.decode(codec)) / 2 / 24000
        assert seconds == pytest.approx(sum(sizes) / 80.0)
        assert 1.0 < seconds < 5.0
    assert t.types[-1] == "session.done"
    assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}


async def test_codes_are_the_codec_encoding_of_the_talkers_frames(connect, codec, pipeline):
    """Packets span the talker's segments: the wire carries one continuous code sequence per sentence."""
    comm = await session(connect, **CODEC)
    [s] = codec_sentences(await speak(comm, SEGMENTED))
    # As the codec pipeline's talker makes them (no vocoder state): the encoder's float sums follow
    # the frames' memory layout, so the same layout gives the same ids.
    frames = pipeline.talker.talk("heart", 0, SEGMENTED, 1.0, np.random.default_rng(0), None, False, vocode=False)
    assert len(frames.acoustic) > 1
    expected = np.concatenate([codec.encode(seg) for seg in frames.acoustic])
    np.testing.assert_array_equal(s.rows, expected)


async def test_server_decoded_pcm_equals_client_decoded_codes(connect, codec):
    text = f"{TWO} {SEGMENTED}"
    codes = codec_sentences(await speak(await session(connect, **CODEC, seed=5), text))
    client = [s.decode(codec) for s in codes]
    server = (await speak(await session(connect, **SERVER_PCM, seed=5), text)).sentences()
    assert len(server) == len(client) == 3
    for s, pcm in zip(server, client, strict=True):
        assert s.audio == pcm, "the server's codec decoder and a client's decode the same samples"
        assert s.done is not None and s.done["total_bytes"] == len(pcm)
    # Non-streamed containers and timestamps work through the codec vocoder as through hibari's.
    wav = (
        await speak(await session(connect, split_granularity="sentence", response_format="wav", vocoder="codec"), FOX)
    ).sentences()
    with wave.open(io.BytesIO(wav[0].audio)) as w:
        assert w.readframes(w.getnframes()) == client[0]
    timed = await speak(
        await session(
            connect,
            split_granularity="sentence",
            response_format="pcm",
            stream_audio=True,
            word_timestamps=True,
            vocoder="codec",
        ),
        FOX,
    )
    [sentence] = timed.sentences()
    words = sentence.chunks[-1]["timestamps"]
    assert [w["word"] for w in words] == FOX.split()


async def test_the_codec_stream_is_twenty_times_smaller_than_pcm(connect):
    text = f"{TWO} How vexingly quick daft zebras jump."
    codes = codec_sentences(await speak(await session(connect, **CODEC), text))
    pcm = await speak(await session(connect, response_format="pcm", stream_audio=True), text)
    codec_bytes = sum(len(b) for s in codes for b in s.raw)
    pcm_bytes = len(pcm_of(pcm))
    assert codec_bytes * 20 <= pcm_bytes, f"codec {codec_bytes} B vs PCM {pcm_bytes} B"


async def test_codec_sessions_continue_and_switch_modes(connect, codec):
    comm = await session(connect, **CODEC)
    assert (await speak(comm, " ")).types == ["session.done"], "a blank flush streams nothing"
    first = codec_sentences(await speak(comm, FOX))
    second = await speak(comm, [JUGS[:10], JUGS[10:]])
    [s] = codec_sentences(second)
    assert s.start["utterance_index"] == 2 and s.start["sentence_index"] == 0
    assert s.packets[0].seq == 0, "seq starts from 0 in every stream"
    assert second.json[-1] == {"type": "session.done", "utterance_index": 2, "total_sentences": 1}
    assert first[0].packets[-1].flags == wire.FLAG_EOS, "the flush's last sentence has no SEGMENT_END"
    # Back to PCM on the same socket, then codec again with a model name echoed in codec.start.
    await comm.send_json_to({"type": "session.config", "response_format": "pcm", "stream_audio": True})
    pcm = await speak(comm, FOX)
    assert [a["utterance_index"] for a in pcm.of_type("audio.start")] == [3]
    await comm.send_json_to({"type": "session.config", "output_mode": "codec_tokens", "model": "hibari-tts"})
    [again] = codec_sentences(await speak(comm, FOX))
    assert again.start["model"] == "hibari-tts" and again.start["utterance_index"] == 4
    np.testing.assert_array_equal(again.rows, first[0].rows)


@pytest.mark.parametrize(
    "fields",
    [
        {"word_timestamps": True},
        {"response_format": "flac"},
        {"response_format": "pcm", "stream_audio": True, "initial_codec_chunk_frames": 1},
    ],
    ids=["timestamps", "flac", "stream_audio"],
)
async def test_audio_options_do_not_apply_to_codes(connect, codec, fields):
    """As in the reference, codec_tokens is decided before any audio precondition: codes stream."""
    comm = await session(connect, **CODEC, **fields)
    t = await speak(comm, FOX)
    assert t.errors == []
    [s] = codec_sentences(t)
    assert s.packets[0].n_frames == settings.CODEC_FIRST_PACKET_FRAMES


async def test_max_new_tokens_bounds_the_frames_of_each_sentence(connect):
    comm = await session(connect, **CODEC, max_new_tokens=7)
    sentences = codec_sentences(await speak(comm, TWO))
    assert [s.done["total_frames"] for s in sentences] == [7, 7]
    first = settings.CODEC_FIRST_PACKET_FRAMES
    assert [[p.n_frames for p in s.packets] for s in sentences] == [[first, 7 - first]] * 2


async def test_codec_and_server_vocoder_together_are_refused(connect):
    comm = await session(connect, **CODEC)
    await comm.send_json_to({"type": "session.config", **CODEC, "vocoder": "codec"})
    assert "vocoder" in await expect_error(comm)
    [s] = codec_sentences(await speak(comm, FOX))  # the previous config stays
    assert s.done["error"] is False
    # As a first config the same mistake is fatal, like every invalid first config.
    fresh = await connect()
    await fresh.send_json_to({"type": "session.config", **CODEC, "vocoder": "codec"})
    assert "with output_mode='codec_tokens' the client decodes" in await expect_error(fresh)
    await expect_close(fresh)


# -- cancel and disconnect -----------------------------------------------------------------------------


async def test_cancel_mid_stream_ends_with_eos_and_cancelled(connect):
    comm = await session(connect, **CODEC)
    await comm.send_json_to({"type": "input.text", "text": LONG})
    await comm.send_json_to({"type": "input.done"})
    head = await receive_until(comm, lambda m: isinstance(m, bytes))
    await comm.send_json_to({"type": "input.cancel"})
    tail = await receive_until_done(comm)
    t = Transcript(events=head.events + tail.events)
    sentences = codec_sentences(t)
    assert 0 < len(sentences) < 30, "the stream stopped"
    *finished, last = sentences
    assert all(s.done["cancelled"] is False and s.done["error"] is False for s in finished)
    assert last.done["cancelled"] is True and last.done["error"] is False
    assert last.packets[-1].eos, "the cancelled stream still ends with an EOS packet"
    assert [s.start["sentence_index"] for s in sentences] == list(range(len(sentences)))
    assert t.types[-1] == "session.done" and t.json[-1]["total_sentences"] == len(sentences)
    assert t.errors == [] and not t.of_type("input.cancelled")
    await expect_silence(comm, 0.2)
    wait_engine_idle()
    # The session carries on.
    [again] = codec_sentences(await speak(comm, FOX))
    assert again.start["utterance_index"] == 1


async def test_cancel_before_the_first_packet_keeps_start_done_pairs(connect):
    comm = await session(connect, **CODEC)
    await comm.send_json_to({"type": "input.text", "text": LONG})
    await comm.send_json_to({"type": "input.done"})
    await comm.send_json_to({"type": "input.cancel"})
    sentences = codec_sentences(await receive_until_done(comm))
    assert sentences and sentences[-1].done["cancelled"] is True
    assert sentences[-1].packets[-1].eos


async def test_disconnect_mid_stream_frees_the_engine(connect):
    comms = [await session(connect, **CODEC), await session(connect, **SERVER_PCM)]
    for comm in comms:
        await comm.send_json_to({"type": "input.text", "text": LONG})
        await comm.send_json_to({"type": "input.done"})
    for comm in comms:
        await receive_until(comm, lambda m: isinstance(m, bytes))
        await comm.disconnect(timeout=5)
    wait_engine_idle()  # aborted: unaborted, the paced long flush would keep it busy for minutes


async def test_concurrent_codec_sessions_get_the_same_codes(connect, codec):
    text = f"{TWO} How vexingly quick daft zebras jump."
    solo = [s.rows for s in codec_sentences(await speak(await session(connect, **CODEC), text))]
    comms = [await session(connect, **(CODEC if i % 2 else SERVER_PCM)) for i in range(4)]
    results = await asyncio.gather(*(speak(comm, text) for comm in comms))
    client_pcm = b"".join(to_pcm16(_decode_rows(codec, rows)) for rows in solo)
    for i, t in enumerate(results):
        if i % 2:
            assert [s.rows.tolist() for s in codec_sentences(t)] == [r.tolist() for r in solo]
        else:
            assert pcm_of(t) == client_pcm, "batching with other sessions must not change the decoded audio"


def _decode_rows(codec: Codec, rows: np.ndarray) -> np.ndarray:
    decoder = codec.decoder()
    return np.concatenate([decoder.push(rows), decoder.flush()])


# -- the engine alone -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline() -> CodecPipeline:
    return CodecPipeline()


def run_requests(
    pipeline: CodecPipeline, requests: list[dict[str, Any]], **sched: Any
) -> tuple[list[list[dict[str, Any]]], SchedulerStats]:
    """Submit the requests at once to a scheduler of their own: each one's chunks, in order, and the stats."""
    scheduler = Scheduler({CODEC_PIPELINE: pipeline}, **{"workers": 2, **sched})
    scheduler.start()
    chunks: list[list[dict[str, Any]]] = [[] for _ in requests]
    ended = [threading.Event() for _ in requests]

    def sink(i: int):
        def put(chunk: Chunk) -> None:
            chunks[i].append(to_wire(chunk))
            if isinstance(chunk, End):
                ended[i].set()

        return put

    try:
        for i, req in enumerate(requests):
            scheduler.submit(f"r{i}", typed_request(SpeakRequest, pipeline=CODEC_PIPELINE, **req), sink(i))
        assert all(e.wait(60) for e in ended)
        stats = scheduler.stats()
    finally:
        scheduler.stop()
    return chunks, stats


def test_engine_batches_codec_vocoder_chunks_across_requests(pipeline, codec):
    n = 6
    outs, stats = run_requests(
        pipeline, [{"text": TWO, "codec_output": "pcm"} for _ in range(n)], max_batch=16, batch_wait=0.02
    )
    assert stats.batches_total > 0, "equal-size chunks of different requests ran as one decode_batch call"
    pcm = [b"".join(c["pcm"] for c in out if c["type"] == "audio") for out in outs]
    assert len(set(pcm)) == 1
    [codes], _ = run_requests(pipeline, [{"text": TWO, "codec_output": "codes"}])
    rows = [np.frombuffer(c["codes"], "<i2").reshape(-1, codec.codebooks) for c in codes if c["type"] == "codes"]
    per_sentence: list[list[np.ndarray]] = [[]]
    for c, r in zip([c for c in codes if c["type"] == "codes"], rows, strict=True):
        per_sentence[-1].append(r)
        if c["last"]:
            per_sentence.append([])
    expected = b"".join(to_pcm16(_decode_rows(codec, np.concatenate(s))) for s in per_sentence if s)
    assert pcm[0] == expected
    assert {k: v for k, v in outs[0][-1].items() if k != "rng_state"} == {
        "type": "end",
        "status": "ok",
        "sentences": 2,
    }


def test_engine_codes_request_announces_sentences_around_packets(pipeline):
    [chunks], _ = run_requests(pipeline, [{"text": TWO, "codec_output": "codes"}])
    kinds = [(c["type"], c.get("index")) for c in chunks if c["type"] != "codes"]
    assert kinds == [
        ("sentence.start", 0),
        ("sentence.end", 0),
        ("sentence.start", 1),
        ("sentence.end", 1),
        ("end", None),
    ]
    lasts = [(c["index"], c["more"]) for c in chunks if c["type"] == "codes" and c["last"]]
    assert lasts == [(0, True), (1, False)]


def test_engine_refuses_bad_codec_requests(pipeline):
    with pytest.raises(ValueError, match="codec_output"):
        pipeline.validate(typed_request(SpeakRequest, pipeline=CODEC_PIPELINE, text="Hi.", codec_output="mp3"))
    with pytest.raises(ValueError, match="text"):  # refused where it is built, as the Redis worker does
        typed_request(SpeakRequest, pipeline=CODEC_PIPELINE, text=None)


def test_engine_refuses_codec_requests_when_the_table_is_bad(monkeypatch):
    def bad_table() -> Codec:
        raise CodecTableError("codec table x has sha256 0, expected 1")

    monkeypatch.setattr("speech.codec.loops.shared_codec", bad_table)
    refusing = CodecPipeline()
    assert refusing.loops == ()
    with pytest.raises(ValueError, match="the codec is unavailable: codec table x has sha256 0"):
        refusing.validate(typed_request(SpeakRequest, pipeline=CODEC_PIPELINE, text="Hi."))


# -- faults, on a scheduler of the test's own (in-process) ---------------------------------------------


class FailingCodec:
    """Test double: the real codec, whose encoder raises from its ``fail_at``-th call on."""

    def __init__(self, codec: Codec, fail_at: int) -> None:
        self._codec, self._fail_at, self.calls = codec, fail_at, 0

    def encode(self, frames: Any) -> np.ndarray:
        self.calls += 1
        if self.calls >= self._fail_at:
            raise RuntimeError("encoder fault provoked by the test")
        return self._codec.encode(frames)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._codec, name)


@pytest.fixture
def faulty_engine(pipeline, codec, monkeypatch) -> Iterator[FailingCodec]:
    """Sessions opened in the test use a scheduler whose codec encoder fails at its N-th packet."""
    broken = CodecPipeline(talker=pipeline.talker)
    failing = FailingCodec(codec, fail_at=10**9)  # the scheduler measures the pipeline first: no fault there
    broken.loops[1]._codec = failing
    sched = Scheduler({CODEC_PIPELINE: broken}, workers=2)
    failing.calls = 0
    failing._fail_at = 3
    sched.start()
    monkeypatch.setattr(runtime, "_client", LocalEngineClient(sched))
    yield failing
    wait_engine_idle()
    sched.stop()


async def open_session(**fields: Any) -> WebsocketCommunicator:
    from omniweb.asgi import application

    comm = WebsocketCommunicator(application, "/v1/audio/speech/stream")
    connected, _ = await comm.connect(timeout=20)
    assert connected
    await comm.send_json_to({"type": "session.config", **fields})
    return comm


@pytest.mark.parametrize("fail_at", [1, 3])
async def test_a_failing_stream_reports_the_error_without_eos(faulty_engine, fail_at):
    faulty_engine._fail_at = fail_at
    comm = await open_session(**CODEC)
    try:
        t = await speak(comm, TWO)
    finally:
        await comm.disconnect()
    [s] = codec_sentences(t)
    sent = fail_at - 1  # packets that went out before the fault
    assert len(s.packets) == sent and not any(p.eos for p in s.packets)
    assert s.start["sentence_index"] == 0 and s.start["sentence_text"] == (FOX if sent else "")
    partial = {"partial_audio": True, "action": "discard"} if sent else {}
    assert t.of_type("error") == [
        {
            "type": "error",
            "message": "Codec stream failed for utterance 0, sentence 0",
            "kind": "engine_failure",
            **partial,
        }
    ]
    assert s.done == {
        "type": "codec.done",
        "utterance_index": 0,
        "sentence_index": 0,
        "total_frames": sum(p.n_frames for p in s.packets),
        "seq_last": sent - 1,
        "error": True,
        "cancelled": False,
    }
    assert t.types[-3:] == ["error", "codec.done", "session.done"]
    assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (CODEC, CODEC_UNSUPPORTED),
        (SERVER_PCM, "vocoder='codec' is not available: the codec could not be loaded."),
    ],
    ids=["codec_tokens", "vocoder"],
)
async def test_codec_modes_are_refused_at_flush_when_the_table_is_bad(connect, monkeypatch, fields, message):
    def bad_table() -> Codec:
        raise CodecTableError("codec table x has sha256 0, expected 1")

    monkeypatch.setattr(speech.session, "shared_codec", bad_table)
    comm = await session(connect, **fields)
    t = await speak(comm, FOX)
    assert t.errors == [message]
    assert t.of_type("error")[0]["kind"] == "engine_failure"  # the server's table, not the client's ask
    assert t.types == ["error", "session.done"]
    assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}
    blank = await speak(comm, [])  # a blank flush has nothing to refuse
    assert blank.types == ["session.done"] and blank.json[0]["utterance_index"] == 1
    await comm.send_json_to({"type": "session.config", "response_format": "pcm", "stream_audio": True})
    assert len((await speak(comm, FOX)).sentences()) == 1, "the PCM path is unaffected"


# -- `manage.py speak --codec` against a live daphne ------------------------------------------------------


@pytest.fixture(scope="module")
def daphne() -> Iterator[str]:
    """A daphne serving the app on a free loopback port, with its models loaded."""
    port = free_port()
    with live_server(["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"], port) as base:
        yield base.replace("http://", "ws://")


async def _server_pcm(url: str, text: str) -> bytes:
    """The same text as PCM decoded by the server's codec vocoder."""
    audio = bytearray()
    async with websockets.connect(url + "/v1/audio/speech/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", **SERVER_PCM}))
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
        while True:
            raw = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(raw, bytes):
                audio += raw
            elif json.loads(raw)["type"] == "session.done":
                return bytes(audio)


def test_speak_codec_writes_the_decoded_wav(daphne, tmp_path: Path):
    out = tmp_path / "fox.wav"
    proc = subprocess.run(
        [sys.executable, "manage.py", "speak", TWO, "-o", str(out), "--codec", "--url", daphne],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings"},
    )
    assert proc.returncode == 0, proc.stderr
    assert f"sentence 0: {FOX}" in proc.stdout and f"sentence 1: {JUGS}" in proc.stdout
    assert "codec packets:" in proc.stdout and "time to first packet" in proc.stdout
    with wave.open(str(out)) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (24000, 2, 1)
        decoded = w.readframes(w.getnframes())
    assert decoded == asyncio.run(_server_pcm(daphne, TWO)), "client decode == server decode"


def test_speak_codec_refuses_timestamps(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "manage.py", "speak", FOX, "-o", str(tmp_path / "x.wav"), "--codec", "--timestamps"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "--timestamps is not available with --codec" in proc.stderr
