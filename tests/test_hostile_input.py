"""Hostile input on both endpoints (issue #11): every parse failure is an ``error``, nothing the
server sends is non-standard JSON, errors quote at most a short excerpt of the client's input, and
messages held during an utterance keep their order whatever fails among them."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from support.messages import expect_error, receive_json, receive_until_done
from support.video import VIDEO_PATH, b64, frame, jpeg, sync, video

from omniweb.base.errors import ErrorKind
from omniweb.base.protocol import MAX_ECHO_CHARS, ProtocolError, dumps, loads
from omniweb.engine.messages import End
from omniweb.engine.requests import AnswerRequest, FrameIn

HUGE_INT = "9" * 5000  # over Python's 4300-digit int limit: json.loads raises ValueError
LOCAL = pytest.mark.parametrize("engine", ["local"], indirect=True)  # transport rules: one engine path is enough


def strict(text: str) -> dict:
    """Parse as standard JSON only (Python's json accepts NaN and Infinity by default)."""

    def refuse(name: str) -> None:
        raise AssertionError(f"server sent non-standard JSON ({name}): {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def test_loads_refuses_what_standard_json_has_not():
    for raw, reason in [
        ('{"a": NaN}', "NaN is not a JSON number"),
        ('{"a": -Infinity}', "-Infinity is not a JSON number"),
        ('{"a": 1e400}', "number out of range"),
        ('{"a": ' + HUGE_INT + "}", "integer longer than 64 digits"),
    ]:
        with pytest.raises(ProtocolError) as info:
            loads(raw, "Invalid JSON message")
        assert info.value.message == f"Invalid JSON message: {reason}"
    with pytest.raises(ProtocolError, match=r"^Invalid JSON$"):
        loads("[" * 100_000)  # nesting: RecursionError inside the parser
    with pytest.raises(ValueError):
        dumps({"pts_ms": float("nan")})


@LOCAL
async def test_speech_huge_integer_is_an_error_and_the_session_lives(connect):
    comm = await connect()
    await comm.send_json_to({"type": "session.config", "response_format": "pcm", "stream_audio": True})
    await comm.send_to(text_data='{"type": "input.text", "text": "x", "n": ' + HUGE_INT + "}")
    assert await expect_error(comm) == "Invalid JSON message: integer longer than 64 digits"
    await comm.send_json_to({"type": "input.text", "text": "Still speaking."})
    await comm.send_json_to({"type": "input.done"})
    done = await receive_until_done(comm)
    assert [s.start["sentence_text"] for s in done.sentences()] == ["Still speaking."]


@LOCAL
async def test_held_messages_keep_their_order_when_one_of_them_fails(connect):
    comm = await connect()
    await comm.send_json_to({"type": "session.config", "response_format": "pcm", "stream_audio": True})
    texts = ["One two three.", "Four five six.", "Seven eight."]
    await comm.send_json_to({"type": "input.text", "text": texts[0]})
    await comm.send_json_to({"type": "input.done"})
    # held while the first utterance plays: a bad message between two good utterances
    await comm.send_to(text_data='{"type": "input.text", "n": ' + HUGE_INT + "}")
    await comm.send_to(text_data='{"type": "input.text", "n": NaN}')
    for text in texts[1:]:
        await comm.send_json_to({"type": "input.text", "text": text})
        await comm.send_json_to({"type": "input.done"})
    spoken, errors = [], []
    for _ in texts:
        done = await receive_until_done(comm)
        spoken += [s.start["sentence_text"] for s in done.sentences()]
        errors += done.errors
    assert spoken == texts
    assert errors == [
        "Invalid JSON message: integer longer than 64 digits",
        "Invalid JSON message: NaN is not a JSON number",
    ]


@LOCAL
async def test_errors_quote_only_a_short_excerpt(connect):
    comm = await connect()
    await comm.send_json_to({"type": "session.config"})
    await comm.send_json_to({"type": "x" * 120_000})
    message = await expect_error(comm)
    assert message.startswith("Unknown message type: xxx") and len(message) < 30 + MAX_ECHO_CHARS
    await comm.send_json_to({"type": ["y"] * 10_000})
    assert await expect_error(comm) == "Unknown message type: list"
    vid = await video(connect, modalities=["text"])
    await vid.send_json_to({"type": "z" * 1_000_000})
    message = await expect_error(vid)
    assert message.startswith("Unknown type: zzz") and len(message) < 30 + MAX_ECHO_CHARS
    await vid.send_json_to({"type": "session.config", "voice": "v" * 100_000})
    assert len(await expect_error(vid)) < 30 + MAX_ECHO_CHARS


@LOCAL
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e308", "-1e300", str(2**60)])
async def test_video_frame_with_an_absurd_timestamp_is_refused(connect, value):
    comm = await video(connect, modalities=["text"], enable_frame_filter=False)
    data = b64(jpeg())
    raw = f'{{"type": "video.frame", "frame_id": "f1", "data": "{data}", "pts_ms": {value}}}'
    await comm.send_to(text_data=raw)
    out = await comm.receive_output(10)
    msg = strict(out["text"])
    assert msg["type"] == "error"
    assert msg["message"].startswith("Invalid JSON") or msg["message"].startswith("Invalid pts_ms")
    await frame(comm, jpeg(), "f2", pts_ms=40, capture_ts_ms=1.5)  # the session goes on
    ack = await receive_json(comm)
    assert ack["type"] == "video.frame.ack" and ack["pts_ms"] == 40 and ack["accepted"]
    await sync(comm)


@LOCAL
async def test_video_first_message_with_huge_integer_is_a_clear_refusal(connect):
    comm = await connect(VIDEO_PATH)
    await comm.send_to(text_data='{"type": "session.config", "num_frames": ' + HUGE_INT + "}")
    assert await expect_error(comm) == "Invalid JSON in session.config: integer longer than 64 digits"


async def test_unknown_websocket_path_is_refused_without_a_traceback():
    from channels.testing import WebsocketCommunicator

    from omniweb.asgi import application

    for path in ["/no/such/path", "/v1/audio/speech/stream/extra", "/" + "a" * 10_000]:
        comm = WebsocketCommunicator(application, path)
        connected, _ = await comm.connect(timeout=5)  # before: the router raised ValueError (HTTP 500)
        assert connected is False
        await comm.wait(timeout=5)
        assert comm.future.exception() is None


async def test_a_failing_session_task_is_logged_once_and_never_left_unretrieved(caplog):
    import gc

    from omniweb.base.tasks import spawn

    loop = asyncio.get_running_loop()
    unretrieved: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))

    async def boom() -> None:
        raise RuntimeError("lost mid-turn")

    task = spawn(boom(), "test task")
    await asyncio.sleep(0.01)
    del task
    gc.collect()
    await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert unretrieved == []
    assert [r.getMessage() for r in caplog.records if r.name == "omniweb.base.tasks"] == ["test task failed"]


@LOCAL
async def test_closed_sessions_are_freed_without_the_cyclic_collector(engine):
    """A closed session's buffers go at once: no reference cycle keeps its frames alive (gc disabled)."""
    import gc

    from channels.testing import WebsocketCommunicator

    from omniweb.asgi import application
    from speech.consumers import SpeechStreamConsumer
    from video.consumers import VideoStreamConsumer

    def alive(cls: type) -> int:
        return sum(1 for o in gc.get_objects() if isinstance(o, cls))

    gc.collect()
    gc.disable()
    try:
        before = alive(VideoStreamConsumer), alive(SpeechStreamConsumer)
        comm = WebsocketCommunicator(application, VIDEO_PATH)
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "session.config", "modalities": ["text"], "enable_frame_filter": False})
        for i in range(3):
            await frame(comm, jpeg(level=i * 80, width=640, height=480), f"f{i}")
            assert (await receive_json(comm))["accepted"]
        await comm.disconnect()
        comm = WebsocketCommunicator(application, "/v1/audio/speech/stream")
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "session.config", "response_format": "pcm", "stream_audio": True})
        await comm.send_json_to({"type": "input.text", "text": "Freed at once."})
        await comm.send_json_to({"type": "input.done"})
        await receive_until_done(comm)
        await comm.send_json_to({"type": "input.text", "text": "Buffered, never flushed."})
        await comm.disconnect()
        del comm
        await asyncio.sleep(0.1)
        assert (alive(VideoStreamConsumer), alive(SpeechStreamConsumer)) == before
    finally:
        gc.enable()


def test_a_client_that_stops_reading_gets_an_error_before_daphnes_keepalive():
    """Paced audio fills no byte cap quickly; the session still ends within seconds of the client's
    last read (its error is queued first, though a client that never reads may not see it)."""
    import base64
    import os
    import socket
    import time

    from support.servers import DAPHNE_ARGS, free_port, live_server

    def frame_to_server(payload: dict) -> bytes:
        data, mask = json.dumps(payload).encode(), os.urandom(4)
        n = len(data)
        header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
        return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))

    port = free_port()
    args = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), *DAPHNE_ARGS, "omniweb.asgi:application"]
    with live_server(args, port, OMNIWEB_SESSION_SEND_STALL_SECONDS="3", OMNIWEB_ENGINE_MAX_AHEAD_SECONDS="30"):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET /v1/audio/speech/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 101")
        sock.sendall(frame_to_server({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
        text = " ".join(f"Sentence {i} of a long flush that is never read." for i in range(120))
        sock.sendall(frame_to_server({"type": "input.text", "text": text}))
        sock.sendall(frame_to_server({"type": "input.done"}))
        time.sleep(15)  # not reading: daphne's first keepalive ping goes out at 20 s
        received = bytearray()
        ended = False  # the server ended the session: its error read, or the socket closed under us
        sock.settimeout(0.5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not ended:
            try:
                data = sock.recv(1 << 20)
            except TimeoutError:
                continue
            except ConnectionResetError:  # the server dropped a socket whose client would not read
                ended = True
                break
            received += data
            ended = not data or b"Client is not reading: nothing delivered for 3 s" in received
        sock.close()
    assert ended, f"the session was still streaming 25 s after its client stopped reading ({len(received)} bytes)"


def _scan_bomb(repeats: int) -> bytes:
    """A progressive JPEG whose smallest scan repeats: small on the wire, a pass per scan to decode."""
    import cv2
    import numpy as np

    img = cv2.GaussianBlur(np.random.default_rng(0).integers(0, 255, (240, 320, 3)).astype(np.uint8), (9, 9), 3)
    data = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes()
    eoi = data.rfind(b"\xff\xd9")
    starts = [i for i in range(len(data) - 1) if data[i : i + 2] == b"\xff\xda"] + [eoi]
    smallest = min(itertools.pairwise(starts), key=lambda se: se[1] - se[0])
    return data[:eoi] + data[smallest[0] : smallest[1]] * repeats + data[eoi:]


def test_jpeg_scans_are_counted_through_scan_data():
    from omniweb.media import frames

    assert frames.count_jpeg_scans(jpeg()) == 1
    assert frames.count_jpeg_scans(_scan_bomb(0)) == 10  # libjpeg's progression for colour
    assert frames.count_jpeg_scans(_scan_bomb(500), limit=10_000) == 510
    assert frames.count_jpeg_scans(_scan_bomb(500)) == frames.MAX_JPEG_SCANS + 1  # stops counting early


@LOCAL
async def test_a_jpeg_scan_bomb_is_refused_and_decodes_run_on_their_own_pool(connect, monkeypatch):
    import threading

    from omniweb.media import frames

    threads: set[str] = set()
    prepare = frames.prepare_frame

    def spy(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(frames, "prepare_frame", spy)
    comm = await video(connect, modalities=["text"], enable_frame_filter=False)
    await frame(comm, _scan_bomb(500), "bomb")
    assert await expect_error(comm) == "Frame refused: over 32 JPEG scans (got at least 33); decode cost too high"
    await frame(comm, _scan_bomb(0), "progressive")  # an ordinary progressive JPEG is welcome
    assert (await receive_json(comm))["accepted"]
    await sync(comm)
    assert threads and all(name.startswith("frame-decode") for name in threads)


@LOCAL
async def test_process_wide_buffer_budget_refuses_frames_beyond_it_and_frees_on_close(connect, settings):
    from omniweb.base import budget

    data = jpeg(level=10, width=320, height=240)
    start = budget.held()
    settings.PROCESS_BUFFER_BUDGET = start + 3 * len(data)  # room for three frames in the whole process
    first = await video(connect, modalities=["text"], enable_frame_filter=False)
    for i in range(2):
        await frame(first, jpeg(level=10 + 40 * i, width=320, height=240), f"a{i}")
        assert (await receive_json(first))["accepted"]
    second = await video(connect, modalities=["text"], enable_frame_filter=False)
    await frame(second, data, "b0")
    assert (await receive_json(second))["accepted"]
    await frame(second, jpeg(level=200, width=320, height=240), "b1")  # each session is far under its own cap
    assert await expect_error(second) == budget.FULL_MESSAGE
    await first.disconnect()
    assert budget.held() <= start + len(data) + 64  # the closed session's frames were given back
    await frame(second, jpeg(level=250, width=320, height=240), "b2")
    assert (await receive_json(second))["accepted"]
    await second.disconnect()
    assert budget.held() == start


async def test_both_engine_modes_refuse_the_same_oversize_request():
    """One documented limit (64 MiB of frames and audio per request), one message, in either mode."""
    from omniweb.engine.client import MAX_REQUEST_BYTES, REQUEST_TOO_LARGE, LocalEngineClient
    from omniweb.engine.dispatch import ChannelEngineClient

    frame_bytes = b"\0" * (MAX_REQUEST_BYTES // 4 + 1)
    request = AnswerRequest(frames=tuple(FrameIn(data=frame_bytes) for _ in range(4)), question="?")
    local = LocalEngineClient(scheduler=None)  # refused before it reaches any scheduler
    redis = ChannelEngineClient(None, "omniweb-engine", lease=3, accept_timeout=5, redis_url="redis://unused")
    for client in (local, redis):
        chunks = [chunk async for chunk in client.stream(request)]
        assert chunks == [End.failed(ErrorKind.CLIENT, REQUEST_TOO_LARGE)]


async def test_sends_after_the_client_left_are_dropped_quietly():
    """daphne raises Disconnected on a send racing the disconnect; work in flight must not crash on it."""
    from autobahn.exception import Disconnected

    from omniweb.web.sessions import SessionConsumer

    sent: list[dict] = []

    async def gone(message: dict) -> None:
        sent.append(message)
        raise Disconnected("Attempt to send on a closed protocol")

    consumer = SessionConsumer()
    consumer.scope = {"type": "websocket"}
    consumer.base_send = gone
    await consumer.send(bytes_data=b"\0\0")
    await consumer.send_json({"type": "audio.done"})  # no second attempt, no exception
    assert consumer.client_gone and len(sent) == 1


@LOCAL
async def test_a_decode_whose_session_has_gone_never_runs_and_lets_go_of_its_frame(connect, monkeypatch):
    """A decode queued behind others' slow decodes, its session closed: dropped at once, never run."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from omniweb.media import decoding, frames

    pool = ThreadPoolExecutor(1, thread_name_prefix="frame-decode")
    monkeypatch.setattr(decoding, "_pool", pool)  # one thread, held by the slow decode below
    unblock, started = threading.Event(), threading.Event()
    prepare = frames.prepare_frame
    decoded: list[int] = []

    def slow(text, **kwargs):
        if len(text) == len(b64(slow_frame)):
            started.set()
            unblock.wait(30)  # a slow decode of another session holds the pool's only thread
        decoded.append(len(text))
        return prepare(text, **kwargs)

    monkeypatch.setattr(frames, "prepare_frame", slow)
    slow_frame, gone_frame = jpeg(width=320, height=240), jpeg(width=640, height=480)
    busy = await video(connect, modalities=["text"], enable_frame_filter=False)
    leaving = await video(connect, modalities=["text"], enable_frame_filter=False)
    try:
        await frame(busy, slow_frame, "slow")
        assert await asyncio.to_thread(started.wait, 10)
        await frame(leaving, gone_frame, "gone")
        for _ in range(200):
            if decoding.waiting() == 1:
                break
            await asyncio.sleep(0.01)
        assert decoding.waiting() == 1  # the leaving session's decode waits, holding its frame
        await leaving.disconnect()
        assert decoding.waiting() == 0  # let go at once, while the pool is still busy
    finally:
        unblock.set()
    assert (await receive_json(busy))["accepted"]
    await sync(busy)
    await asyncio.to_thread(pool.shutdown)
    assert decoded == [len(b64(slow_frame))]  # the closed session's frame was never decoded
    await busy.disconnect()
