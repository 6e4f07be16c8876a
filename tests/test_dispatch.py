"""The engine over channels_redis: real redis-server, real ``runworker`` processes, real faults.

The speech protocol suite already runs over this path (conftest's ``engine`` fixture); these tests
provoke what a normal session never does: a worker killed with SIGKILL, Redis restarted, a full
channel, a client that walks away, payloads near the layer's 1 MB message limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from channels_redis.core import RedisChannelLayer
from support.servers import ROOT, free_port, stop

from omniweb.base.errors import CAPACITY_MESSAGE
from omniweb.engine.dispatch import (
    AUDIO_SPLIT_BYTES,
    BLOB_MIN_BYTES,
    ENGINE_UNREACHABLE,
    MAX_MESSAGE_BYTES,
    ChannelEngineClient,
    blob_keys,
    message_size,
    offload_blobs,
    restore_blobs,
)
from omniweb.engine.messages import PcmAudio, split_audio, to_wire
from omniweb.engine.requests import AnswerRequest, EngineRequest, FrameIn, SpeakRequest
from omniweb.engine.requests import from_wire as request_from_wire
from omniweb.engine.requests import to_wire as request_to_wire

pytestmark = [
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (.ci/run installs it)"),
    pytest.mark.timeout(120),
]

LONG = " ".join(f"Sentence number {i} keeps this worker busy for a while longer." for i in range(40))


def request(text: str, **fields: Any) -> SpeakRequest:
    return SpeakRequest(text=text, split="sentence", seed=1, **fields)


class Stack:
    """redis-server on a fixed port (so it can be restarted) and named engine workers."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.redis: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}

    def start_redis(self) -> None:
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while self.run_redis(lambda r: r.ping()) is not True:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def stop_redis(self) -> None:
        assert self.redis is not None
        self.redis.kill()
        self.redis.wait(5)

    def start_worker(self, name: str, **settings: str) -> None:
        env = {**os.environ, "OMNIWEB_REDIS_URL": self.url, "OMNIWEB_WORKER_ID": name, **settings}
        cmd = [sys.executable, "manage.py", "runworker", "omniweb-engine"]
        proc = self.workers[name] = subprocess.Popen(cmd, cwd=ROOT, env=env)
        deadline = time.monotonic() + 60
        # Its own heartbeat (not a dead namesake's key) saying its models are loaded.
        while (beat := self.beat(name)) is None or beat["pid"] != proc.pid or not beat.get("ready"):
            assert time.monotonic() < deadline, f"worker {name} did not come up"
            assert self.workers[name].poll() is None, f"worker {name} exited"
            time.sleep(0.1)

    def run_redis(self, fn: Any) -> Any:
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=5)
        try:
            return fn(client)
        except redis.RedisError:
            return None
        finally:
            client.close()

    def beat(self, name: str) -> dict[str, Any] | None:
        raw = self.run_redis(lambda r: r.get(f"omniweb:worker:{name}"))
        return json.loads(raw) if raw else None

    def stop(self) -> None:
        stop([*self.workers.values(), *([self.redis] if self.redis else [])])


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = Stack()
    try:
        s.start_redis()
        s.start_worker("w1")
        s.start_worker("w2")
        yield s
    finally:
        s.stop()


def client_for(stack: Stack, **kw: Any) -> ChannelEngineClient:
    layer = RedisChannelLayer(hosts=[stack.url], **kw)
    return ChannelEngineClient(layer, "omniweb-engine", lease=3.0, accept_timeout=5.0, redis_url=stack.url)


async def collect(client: ChannelEngineClient, req: EngineRequest, log: list[tuple[float, dict[str, Any]]]) -> None:
    """The stream's chunks as their wire form (as they crossed Redis), to compare as data."""
    async for chunk in client.stream(req):
        log.append((time.monotonic(), to_wire(chunk)))


def ended(log: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    return log[-1][1]


async def wait_busy(stack: Stack, names: list[str]) -> str:
    """The name of a worker that reports work in progress."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for name in names:
            beat = stack.beat(name)
            if beat and beat["active"]:
                return name
        await asyncio.sleep(0.05)
    raise AssertionError("no worker reported active work")


async def test_streams_over_redis_equal_the_local_engine(stack):
    client = client_for(stack)
    log: list[tuple[float, dict[str, Any]]] = []
    await collect(client, request("Two sentences. Over Redis."), log)
    chunks = [c for _, c in log]
    assert [c["type"] for c in chunks if c["type"] != "audio"] == [
        "sentence.start",
        "sentence.end",
        "sentence.start",
        "sentence.end",
        "end",
    ]
    end = dict(chunks[-1])
    assert isinstance(end.pop("rng_state"), str)
    assert end == {"type": "end", "status": "ok", "sentences": 2}
    assert sum(len(c["pcm"]) for c in chunks if c["type"] == "audio") > 24000


async def test_the_web_tier_sheds_when_no_worker_has_room_and_sends_nothing(stack):
    asked: list[str] = []

    async def full(pipeline: str, budget: float | None) -> float | None:
        asked.append(pipeline)
        return 1.5

    layer = RedisChannelLayer(hosts=[stack.url])
    client = ChannelEngineClient(layer, "omniweb-engine", lease=3.0, accept_timeout=5.0, redis_url=stack.url, room=full)
    log: list[tuple[float, dict[str, Any]]] = []
    claims = set(stack.run_redis(lambda r: r.keys("omniweb:claim:*")))
    await collect(client, request("Refused at the web tier."), log)
    assert [c for _, c in log] == [
        {"type": "end", "status": "busy", "kind": "capacity", "message": CAPACITY_MESSAGE, "retry_after": 1.5}
    ]
    assert asked == [request("x").pipeline]
    assert set(stack.run_redis(lambda r: r.keys("omniweb:claim:*"))) == claims  # no worker was asked


async def test_a_killed_workers_streams_fail_as_worker_lost_and_the_others_go_on(stack):
    client = client_for(stack)
    logs: list[list[tuple[float, dict[str, Any]]]] = [[] for _ in range(6)]
    tasks = [asyncio.ensure_future(collect(client, request(LONG), log)) for log in logs]
    while not all(log for log in logs):  # every stream has started
        await asyncio.sleep(0.02)
    victim = await wait_busy(stack, ["w1", "w2"])
    killed_at = time.monotonic()
    os.kill(stack.workers[victim].pid, signal.SIGKILL)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    failed = [log for log in logs if ended(log)["status"] == "error"]
    finished = [log for log in logs if ended(log)["status"] == "ok"]
    assert failed, "the killed worker served none of the streams"
    assert len(failed) + len(finished) == len(logs)
    for log in failed:
        assert ended(log)["message"] == "engine worker lost"
        assert ended(log)["kind"] == "worker_lost"  # chosen where the silence was noticed
        assert log[-1][0] > killed_at  # ended after the kill, by the lease (a hang fails the gather's ceiling)
    stack.workers[victim].wait(5)
    # New requests go to the live worker.
    again: list[tuple[float, dict[str, Any]]] = []
    await asyncio.wait_for(collect(client, request("After the crash."), again), 20)
    assert ended(again)["status"] == "ok"
    stack.start_worker(victim)  # leave two workers for the next test


def terminate(stack: Stack, name: str, within: float) -> float:
    """SIGTERM a worker; it must exit cleanly within ``within`` seconds and drop its heartbeat key."""
    sent = time.monotonic()
    proc = stack.workers[name]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(within) == 0
    assert stack.beat(name) is None, "a stopped worker still looks alive to /healthz"
    return sent


async def test_sigterm_lets_running_requests_finish_and_new_ones_go_elsewhere(stack):
    client = client_for(stack)
    logs: list[list[tuple[float, dict[str, Any]]]] = [[] for _ in range(4)]
    # Long enough for a heartbeat to show the work (a few seconds), well inside the 10 s drain.
    text = " ".join(f"Sentence {i} of a stream that the stopping worker finishes." for i in range(10))
    tasks = [asyncio.ensure_future(collect(client, request(text), log)) for log in logs]
    while not all(log for log in logs):
        await asyncio.sleep(0.02)
    victim = await wait_busy(stack, ["w1", "w2"])
    await asyncio.to_thread(terminate, stack, victim, 15)
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert [ended(log)["status"] for log in logs] == ["ok"] * 4
    assert all(ended(log)["sentences"] == 10 for log in logs)
    again: list[tuple[float, dict[str, Any]]] = []
    await asyncio.wait_for(collect(client, request("After a clean stop."), again), 20)
    assert ended(again)["status"] == "ok"
    stack.start_worker(victim)


async def test_sigterm_past_the_drain_time_fails_streams_at_once_not_after_the_lease(stack):
    for name in ("w1", "w2"):  # idle workers stop at once
        await asyncio.to_thread(terminate, stack, name, 5)
    stack.start_worker("w1", OMNIWEB_WORKER_DRAIN_SECONDS="0.3")
    client = client_for(stack)
    logs: list[list[tuple[float, dict[str, Any]]]] = [[] for _ in range(3)]
    tasks = [asyncio.ensure_future(collect(client, request(LONG), log)) for log in logs]
    while not all(log for log in logs):
        await asyncio.sleep(0.02)
    await asyncio.to_thread(terminate, stack, "w1", 10)
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    for log in logs:
        # Ended by the stopping worker itself ("engine stopped"), not by the session's lease running
        # out on a silent worker ("engine worker lost", kind worker_lost).
        assert ended(log) == {"type": "end", "status": "error", "kind": "engine_failure", "message": "engine stopped"}
    stack.start_worker("w1")
    stack.start_worker("w2")


async def only_a_witness_left(stack: Stack, client: ChannelEngineClient) -> None:
    """Start a witness (a LONG stream) and wait until heartbeats written after it started show it alone
    on the workers while its client has heard under half of its sentences: every other request left
    the engine before half of LONG could be spoken, so it was stopped, not run on (each had more than
    that still to say). Fails if the witness gets halfway first; the witness is dropped after."""
    half = len(LONG.split(". ")) // 2
    witness: list[tuple[float, dict[str, Any]]] = []
    going = asyncio.ensure_future(collect(client, request(LONG), witness))
    try:
        while not witness:
            await asyncio.sleep(0.02)
        since = time.time()  # heartbeats carry wall-clock times
        deadline = time.monotonic() + 60  # a ceiling only: the witness getting halfway is the failure
        while True:
            beats = [await asyncio.to_thread(stack.beat, name) for name in ("w1", "w2")]
            heard = sum(1 for _, c in witness if c["type"] == "sentence.start")  # read after the beats
            fresh = all(b is not None and b["ts"] > since for b in beats)
            if fresh and sum(b["active"] for b in beats if b is not None) == 1 and heard < half:
                return
            assert heard < half and not going.done(), f"the witness got halfway first; other work ran on: {beats}"
            assert time.monotonic() < deadline, f"workers still busy: {beats}"
            await asyncio.sleep(0.05)
    finally:
        going.cancel()  # its stream's abort frees the worker for the next test
        await asyncio.gather(going, return_exceptions=True)


async def test_a_client_walking_away_frees_the_worker_before_its_stream_ends(stack):
    client = client_for(stack)
    stream = client.stream(request(" ".join([LONG] * 3)))  # far more than a witness's half still to say
    async for chunk in stream:
        if isinstance(chunk, PcmAudio):
            break
    await stream.aclose()  # what a disconnecting session does
    await only_a_witness_left(stack, client)


async def test_paused_worker_stops_the_requests_its_clients_gave_up_on(stack):
    """SIGSTOP past the lease, then SIGCONT: the worker must not generate on for nobody (issue #11)."""
    client = client_for(stack)
    logs: list[list[tuple[float, dict[str, Any]]]] = [[] for _ in range(4)]
    tasks = [asyncio.ensure_future(collect(client, request(LONG), log)) for log in logs]
    while not all(log for log in logs):
        await asyncio.sleep(0.02)
    victim = await wait_busy(stack, ["w1", "w2"])
    pid = stack.workers[victim].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert any(ended(log)["message"] == "engine worker lost" for log in logs if ended(log)["status"] == "error")
    # The abandoned requests had heard a sentence or two of 40: the resumed worker drops them.
    await only_a_witness_left(stack, client)


async def test_redis_restart_fails_in_flight_requests_and_recovers(stack):
    client = client_for(stack)
    log: list[tuple[float, dict[str, Any]]] = []
    task = asyncio.ensure_future(collect(client, request(LONG), log))
    while not log:
        await asyncio.sleep(0.02)
    stack.stop_redis()
    await asyncio.wait_for(task, 10)
    assert ended(log)["kind"] in ("engine_unreachable", "worker_lost")
    assert ended(log)["status"] == ("unavailable" if ended(log)["kind"] == "engine_unreachable" else "error")
    # While Redis is down, a new request is told the engine is unreachable, and to retry.
    down: list[tuple[float, dict[str, Any]]] = []
    await asyncio.wait_for(collect(client_for(stack), request("Nobody home."), down), 10)
    assert ended(down) == {
        "type": "end",
        "status": "unavailable",
        "kind": "engine_unreachable",
        "message": ENGINE_UNREACHABLE,
    }
    stack.start_redis()
    # Workers reconnect on their own; a new request works without restarting anything.
    deadline = time.monotonic() + 20
    while True:
        again: list[tuple[float, dict[str, Any]]] = []
        await asyncio.wait_for(collect(client_for(stack), request("Redis is back."), again), 20)
        if ended(again)["status"] == "ok":
            break
        assert time.monotonic() < deadline, f"no recovery: {ended(again)}"
        await asyncio.sleep(0.5)
    assert all(w.poll() is None for w in stack.workers.values())


async def test_full_worker_channel_is_a_clear_busy_error(stack):
    client = client_for(stack, channel_capacity={"omniweb-engine": 0})
    log: list[tuple[float, dict[str, Any]]] = []
    await collect(client, request("Never sent."), log)
    assert [c for _, c in log] == [
        {"type": "end", "status": "busy", "kind": "capacity", "message": "server is at capacity; retry shortly"}
    ]


async def test_requests_over_the_message_limit_are_refused_not_sent(stack):
    client = client_for(stack)
    log: list[tuple[float, dict[str, Any]]] = []
    await collect(client, request("x" * (MAX_MESSAGE_BYTES + 1)), log)
    assert ended(log)["status"] == "invalid" and ended(log)["kind"] == "client_error"
    # The largest utterance the protocol allows (100 000 characters) fits.
    ok: list[tuple[float, dict[str, Any]]] = []
    stream = client.stream(request("Word. " * 16_000))
    async for chunk in stream:
        ok.append((time.monotonic(), to_wire(chunk)))
        if isinstance(chunk, PcmAudio):
            break
    await stream.aclose()
    assert ok[-1][1]["type"] == "audio"


def test_large_audio_chunks_are_split_under_the_limit():
    pcm = bytes(range(256)) * 4000  # ~1 MB
    parts = split_audio(PcmAudio(pcm, 24000, 3), AUDIO_SPLIT_BYTES)
    assert len(parts) > 1 and b"".join(p.pcm for p in parts) == pcm
    assert all(p.sentence == 3 and p.sample_rate == 24000 and len(p.pcm) % 2 == 0 for p in parts)
    small = PcmAudio(b"\x00\x01", 24000)
    assert split_audio(small, AUDIO_SPLIT_BYTES) == [small]


def test_large_byte_strings_leave_the_message_and_come_back_intact():
    frame = FrameIn(frame_id="f1", data=os.urandom(3 * BLOB_MIN_BYTES), pts_ms=0)
    small = FrameIn(frame_id="f2", data=b"tiny", pts_ms=40)
    request = AnswerRequest(audio=os.urandom(BLOB_MIN_BYTES), frames=(frame, small))
    light, blobs = offload_blobs(request_to_wire(request), "omniweb:blob:r1:")
    assert sorted(blobs) == ["omniweb:blob:r1:0", "omniweb:blob:r1:1"]
    assert light["frames"][1] == {"frame_id": "f2", "data": b"tiny", "pts_ms": 40}
    assert blob_keys(light) == ["omniweb:blob:r1:0", "omniweb:blob:r1:1"]
    assert message_size(light) < 1000
    assert request_from_wire(restore_blobs(light, blobs)) == request
    with pytest.raises(KeyError):
        restore_blobs(light, {})


def noisy_red_png(width: int, height: int) -> bytes:
    """A red picture with sensor-like noise: PNG cannot shrink it, so it is well over 1 MB."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(7)
    image = np.zeros((height, width, 3), np.uint8)
    image[:] = (40, 40, 200)  # BGR: red
    image = np.clip(image.astype(np.int16) + rng.integers(-30, 31, image.shape), 0, 255).astype(np.uint8)
    ok, data = cv2.imencode(".png", image)
    assert ok
    return data.tobytes()


async def test_requests_over_the_message_limit_reach_the_worker_through_redis_keys(stack):
    png = noisy_red_png(1280, 720)
    assert len(png) > 2 * MAX_MESSAGE_BYTES
    frames = (FrameIn(frame_id="big", data=png, pts_ms=0),)
    request = AnswerRequest(question="What colour is it?", frames=frames, modalities=("text",))
    log: list[tuple[float, dict[str, Any]]] = []
    await asyncio.wait_for(collect(client_for(stack), request, log), 30)
    assert ended(log)["status"] == "ok", ended(log)
    assert "red" in ended(log)["text"].lower()  # the worker saw the picture itself
    assert stack.run_redis(lambda r: r.keys("omniweb:blob:*")) == []  # taken, nothing left behind


async def test_a_request_the_worker_refuses_comes_back_with_its_kind(stack):
    """The kind is chosen on the worker (its pipeline's validation) and travels back over Redis."""
    log: list[tuple[float, dict[str, Any]]] = []
    await collect(client_for(stack), request("Hello.", voice="no-such-voice"), log)
    assert [c["type"] for _, c in log] == ["end"]
    assert ended(log)["status"] == "invalid" and ended(log)["kind"] == "client_error"
    assert "Unknown voice" in ended(log)["message"]


async def test_a_stream_left_before_its_worker_accepted_is_still_aborted():
    """The client walks away between submit and accept: the worker that accepts later is told to stop."""
    from channels.layers import InMemoryChannelLayer

    layer = InMemoryChannelLayer()
    client = ChannelEngineClient(layer, "omniweb-engine", lease=3.0, accept_timeout=5.0)
    stream = client.stream(SpeakRequest(text="Hello."), "r-early")
    pending = asyncio.ensure_future(stream.__anext__())  # submits, then waits for the accept
    submit = await layer.receive("omniweb-engine")
    pending.cancel()  # the session closes before any worker answered
    await asyncio.gather(pending, return_exceptions=True)
    await stream.aclose()
    owner = await layer.new_channel()
    await layer.send(submit["reply_to"], {"type": "engine.accepted", "request_id": "r-early", "owner": owner})
    abort = await asyncio.wait_for(layer.receive(owner), 30)
    assert abort == {"type": "engine.abort", "request_id": "r-early"}
