"""``/v1/video/chat/stream`` on the wire, the paths that need no answer: session.config, frames and
their acks, the similarity filter, the buffer, bad and oversized frames, audio, ping, errors,
limits and timeouts. (Turns, interrupts and video.done after a turn: tests/test_video_turns.py.)"""

from __future__ import annotations

import asyncio
import struct
import threading
import zlib

import pytest
from support.messages import expect_close, expect_error, expect_silence, receive_json
from support.video import VIDEO_PATH, ack, b64, frame, jpeg, sync, video

from omniweb.media import frames
from video import protocol


def png_bomb(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        frames.PNG_SIGNATURE
        + struct.pack(">I", 13)
        + b"IHDR"
        + ihdr
        + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
        + b"\0" * 64
    )


# -- session.config -------------------------------------------------------------------------------
async def test_valid_config_gets_no_reply(connect):
    comm = await video(connect)
    await expect_silence(comm)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"type": "video.frame", "data": ""}', "Expected session.config, got: video.frame"),
        ('{"type": "ping"}', "Expected session.config, got: ping"),
        ("not json", "Invalid JSON in session.config"),
        ('{"type": "session.config", "num_frames": 0}', "Invalid session config: num_frames"),
        ('{"type": "session.config", "max_frames": 300}', "Invalid session config: max_frames"),
        ('{"type": "session.config", "evs_threshold": 2}', "Invalid session config: evs_threshold"),
        ('{"type": "session.config", "modalities": ["image"]}', "Invalid session config: modalities"),
        ('{"type": "session.config", "voice": "nobody"}', "Invalid session config: unknown voice 'nobody'"),
    ],
)
async def test_anything_but_a_valid_first_config_is_an_error_and_close(connect, raw, message):
    comm = await connect(VIDEO_PATH)
    await comm.send_to(text_data=raw)
    assert (await expect_error(comm)).startswith(message)
    await expect_close(comm)


async def test_binary_before_config_is_fatal(connect):
    comm = await connect(VIDEO_PATH)
    await comm.send_to(bytes_data=b"\x00\x01")
    assert "Binary messages are not accepted" in await expect_error(comm)
    await expect_close(comm)


async def test_config_timeout(connect, settings):
    settings.VIDEO_CONFIG_TIMEOUT = 0.3
    comm = await connect(VIDEO_PATH)
    assert await expect_error(comm) == "Timeout waiting for session.config"
    await expect_close(comm)


async def test_a_second_config_is_an_unknown_type(connect):
    comm = await video(connect)
    await comm.send_json_to({"type": "session.config", "num_frames": 2})
    assert await expect_error(comm) == "Unknown type: session.config"
    await sync(comm)


async def test_legacy_aliases_reach_the_filter(connect):
    """evs_enabled=false: identical frames are all kept; evs_threshold=0: everything after the first drops."""
    comm = await video(connect, evs_enabled=False)
    for i in range(3):
        await frame(comm, jpeg(), f"f{i}")
        assert (await ack(comm))["accepted"] is True
    comm = await video(connect, evs_threshold=0.0)
    await frame(comm, jpeg(0), "a")
    assert (await ack(comm))["accepted"] is True
    await frame(comm, jpeg(255), "b")
    assert (await ack(comm))["reason"] == "filtered"


# -- video.frame ----------------------------------------------------------------------------------
async def test_ack_carries_every_seed_field(connect):
    comm = await video(connect)
    await frame(comm, jpeg(), "f0", pts_ms=40, capture_ts_ms=1700000000123.5, quality_profile="hd")
    msg = await ack(comm)
    assert set(msg) == {
        "type",
        "frame_id",
        "pts_ms",
        "capture_ts_ms",
        "accepted",
        "buffered_frames",
        "server_receive_ts_ms",
    }
    assert (msg["frame_id"], msg["pts_ms"], msg["capture_ts_ms"]) == ("f0", 40, 1700000000123.5)
    assert (msg["accepted"], msg["buffered_frames"]) == (True, 1)
    assert isinstance(msg["server_receive_ts_ms"], float)


async def test_no_ack_without_a_string_frame_id(connect):
    comm = await video(connect, enable_frame_filter=False)
    await frame(comm, jpeg())
    await frame(comm, jpeg(), "")
    await comm.send_json_to({"type": "video.frame", "data": b64(jpeg()), "frame_id": 7})
    await sync(comm)
    await frame(comm, jpeg(), "counted")
    assert (await ack(comm))["buffered_frames"] == 4  # the silent ones were buffered all the same


async def test_similar_frame_is_filtered_and_a_changed_one_kept(connect):
    comm = await video(connect)
    await frame(comm, jpeg(10), "a")
    assert (await ack(comm))["accepted"] is True
    await frame(comm, jpeg(10), "b", pts_ms=33)
    filtered = await ack(comm)
    assert (filtered["accepted"], filtered["reason"], filtered["buffered_frames"]) == (False, "filtered", 1)
    assert filtered["pts_ms"] == 33
    await frame(comm, jpeg(200), "c")
    kept = await ack(comm)
    assert (kept["accepted"], kept["buffered_frames"]) == (True, 2)
    assert "reason" not in kept


async def test_buffer_keeps_max_frames_and_names_the_dropped_one(connect):
    comm = await video(connect, max_frames=2, enable_frame_filter=False)
    for i in range(2):
        await frame(comm, jpeg(), f"f{i}")
        msg = await ack(comm)
        assert "dropped_frame_id" not in msg
    await frame(comm, jpeg(), "f2")
    msg = await ack(comm)
    assert (msg["buffered_frames"], msg["dropped_frame_id"]) == (2, "f0")
    await frame(comm, jpeg(), "f3")
    assert (await ack(comm))["dropped_frame_id"] == "f1"


async def test_buffer_is_bounded_in_bytes_too(connect, settings):
    size = len(jpeg())
    settings.VIDEO_MAX_BUFFER_BYTES = 2 * size + size // 2
    comm = await video(connect, enable_frame_filter=False)
    for i in range(2):
        await frame(comm, jpeg(), f"f{i}")
        assert "dropped_frame_id" not in await ack(comm)
    await frame(comm, jpeg(), "f2")
    msg = await ack(comm)
    assert (msg["buffered_frames"], msg["dropped_frame_id"]) == (2, "f0")
    big = jpeg(width=640, height=480)
    assert len(big) > 2 * size
    await frame(comm, big + b"\0" * (2 * size - len(big) + size), "big")  # more than the whole budget
    msg = await ack(comm)
    assert (msg["buffered_frames"], msg["dropped_frame_id"]) == (1, "f2")  # everything older went


async def test_empty_frame_data_is_ignored(connect):
    comm = await video(connect)
    await frame(comm, "", "empty")
    await sync(comm)


@pytest.mark.parametrize(
    "data",
    ["not base64!", "QUJD RA==", "QUJDRA", b64(b"GIF89a" + b"\0" * 20), b64(b"hello world")],
    ids=["alphabet", "whitespace", "padding", "gif", "text"],
)
async def test_invalid_image_data(connect, data):
    comm = await video(connect)
    await frame(comm, data, "bad")
    assert (await expect_error(comm)).startswith("Invalid image data")
    await frame(comm, jpeg(), "good")
    assert (await ack(comm))["buffered_frames"] == 1  # the session carries on; nothing bad was buffered


async def test_non_string_frame_data(connect):
    comm = await video(connect)
    await comm.send_json_to({"type": "video.frame", "data": 12345, "frame_id": "x"})
    assert await expect_error(comm) == "Invalid image data"


async def test_frame_over_10_mb_is_too_large(connect):
    comm = await video(connect)
    await frame(comm, "A" * (protocol.MAX_FRAME_SIZE + 4), "huge")
    assert await expect_error(comm) == "Frame too large"
    await sync(comm)


async def test_frame_of_exactly_10_mb_is_admitted(connect):
    """A JPEG padded (after its end marker) to a base64 length of exactly 10 MiB is buffered."""
    body = jpeg()
    raw_len = protocol.MAX_FRAME_SIZE // 4 * 3
    data = b64(body + b"\0" * (raw_len - len(body)))
    assert len(data) == protocol.MAX_FRAME_SIZE
    comm = await video(connect)
    await frame(comm, data, "big")
    msg = await ack(comm)
    assert msg["accepted"] is True


async def test_decompression_bomb_is_refused(connect):
    comm = await video(connect)
    await frame(comm, png_bomb(60000, 60000), "bomb")
    assert (await expect_error(comm)).startswith("Frame too large: 60000x60000 pixels")
    await sync(comm)


async def test_pixel_budget_is_a_setting(connect, settings):
    settings.VIDEO_MAX_FRAME_PIXELS = 100 * 100
    comm = await video(connect)
    await frame(comm, jpeg(width=101, height=100), "x")
    assert (await expect_error(comm)).startswith("Frame too large: 101x100 pixels")
    await frame(comm, jpeg(width=100, height=100), "y")
    assert (await ack(comm))["accepted"] is True


async def test_undecodable_frame_is_invalid_when_the_filter_reads_it(connect):
    comm = await video(connect)
    await frame(comm, jpeg()[:200], "cut")
    assert await expect_error(comm) == "Invalid image data"


async def test_undecodable_frame_is_acked_then_removed_and_reported(connect):
    """Without the filter nothing decodes on the ack path: the decoder finds it, ahead of any query."""
    comm = await video(connect, enable_frame_filter=False)
    await frame(comm, jpeg(), "good")
    assert (await ack(comm))["buffered_frames"] == 1
    await frame(comm, jpeg()[:-40], "cut")
    assert (await ack(comm))["buffered_frames"] == 2
    assert await expect_error(comm) == "Frame decode failed"
    await frame(comm, jpeg(), "next")
    assert (await ack(comm))["buffered_frames"] == 2  # "cut" left the buffer


# -- audio.chunk ----------------------------------------------------------------------------------
async def test_audio_chunk_is_buffered_silently(connect):
    comm = await video(connect)
    await comm.send_json_to({"type": "audio.chunk", "data": b64(b"\0\0" * 1600)})
    await sync(comm)


@pytest.mark.parametrize("data", ["***", "AAA", 42, None])
async def test_invalid_audio_chunk_is_reported(connect, data):
    comm = await video(connect)
    await comm.send_json_to({"type": "audio.chunk", "data": data})
    assert (await expect_error(comm)).startswith("Invalid audio data")
    await sync(comm)


async def test_audio_buffer_overflow_is_reported_and_clears_the_buffer(connect):
    comm = await video(connect)
    half = b64(b"\0" * (protocol.MAX_AUDIO_BUFFER_BYTES // 2))
    await comm.send_json_to({"type": "audio.chunk", "data": half})
    await comm.send_json_to({"type": "audio.chunk", "data": half})  # exactly full: fine
    await sync(comm)
    await comm.send_json_to({"type": "audio.chunk", "data": b64(b"\0\0")})
    assert await expect_error(comm) == "Audio buffer overflow"
    await comm.send_json_to({"type": "audio.chunk", "data": half})  # room again: it was cleared
    await sync(comm)


# -- other messages -------------------------------------------------------------------------------
async def test_ping_pong(connect):
    comm = await video(connect)
    for _ in range(3):
        await comm.send_json_to({"type": "ping"})
    for _ in range(3):
        assert await receive_json(comm) == {"type": "pong"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"type": "video.pause"}', "Unknown type: video.pause"),
        ('{"data": 1}', "Unknown type: None"),
        ('{"type": "_internal.frame_decode_failed", "b64": "AAAA"}', "Unknown type: _internal.frame_decode_failed"),
        ('{"type": "_internal.anything"}', "Unknown type: _internal.anything"),
        ("{broken", "Invalid JSON"),
        ("[1]", "Messages must be JSON objects"),
    ],
)
async def test_bad_messages_are_reported_and_the_session_continues(connect, raw, message):
    comm = await video(connect)
    await comm.send_to(text_data=raw)
    assert await expect_error(comm) == message
    await frame(comm, jpeg(), "after")
    assert (await ack(comm))["accepted"] is True


async def test_binary_after_config_is_reported(connect):
    comm = await video(connect)
    await comm.send_to(bytes_data=b"\xff\xd8")
    assert "Binary messages are not accepted" in await expect_error(comm)
    await sync(comm)


async def test_query_without_frames(connect):
    comm = await video(connect)
    await comm.send_json_to({"type": "video.query", "text": "What is there?"})
    assert await expect_error(comm) == "No frames buffered"
    await sync(comm)


async def test_video_done_without_a_turn_ends_the_session(connect):
    comm = await video(connect)
    await frame(comm, jpeg(), "f")
    await ack(comm)
    await comm.send_json_to({"type": "video.done"})
    await comm.send_json_to({"type": "ping"})  # after video.done nothing is read
    assert await receive_json(comm) == {"type": "session.done"}
    await expect_close(comm)


async def test_idle_timeout(connect, settings):
    settings.VIDEO_IDLE_TIMEOUT = 0.3
    comm = await video(connect)
    assert await expect_error(comm) == "Idle timeout"
    await expect_close(comm)


async def test_idle_clock_restarts_on_every_message(connect, settings):
    settings.VIDEO_IDLE_TIMEOUT = 0.5
    comm = await video(connect)
    for _ in range(4):
        await asyncio.sleep(0.25)
        await sync(comm)
    assert await expect_error(comm, timeout=30) == "Idle timeout"


async def test_inbound_queue_is_bounded(connect, monkeypatch):
    """A client that outruns the session is told so and closed, instead of growing memory without end."""
    release = threading.Event()
    prepare = frames.prepare_frame

    def slow_prepare(*args, **kwargs):  # holds the processor on the first frame
        release.wait(10)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(frames, "prepare_frame", slow_prepare)
    monkeypatch.setattr(protocol, "MAX_QUEUED_MESSAGES", 5)
    comm = await video(connect)
    await frame(comm, jpeg(), "stuck")
    for _ in range(6):
        await comm.send_json_to({"type": "ping"})
    try:
        msg = await receive_json(comm)
    finally:
        release.set()
    assert msg == {
        "type": "error",
        "message": "Too many messages queued: the session cannot keep up; session closed",
        "kind": "client_error",
    }
    await expect_close(comm)
