"""``/healthz`` and ``/metrics``: embedded mode, a real speech session's metrics, and Redis mode.

Redis mode runs a real ``redis-server`` on a free port (skipped when it is not installed); a
heartbeat key written by the test stands for an engine worker.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import AsyncClient
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from support.messages import SPEECH_PATH, session, speak
from support.servers import free_port

from omniweb.base import metrics
from omniweb.engine import runtime

METRIC_NAMES = {
    "omniweb_sessions_open",
    "omniweb_engine_requests_active",
    "omniweb_engine_requests_queued",
    "omniweb_engine_running_steps",
    "omniweb_engine_batch_size",
    "omniweb_time_to_first_audio_seconds",
    "omniweb_errors",  # exposed as omniweb_errors_total
    "omniweb_worker_up",
    "omniweb_video_first_text_seconds",
    "omniweb_video_first_audio_seconds",
    "omniweb_video_turn_seconds",
    "omniweb_realtime_first_text_seconds",
    "omniweb_realtime_first_audio_seconds",
    "omniweb_realtime_response_seconds",
    "omniweb_audio_speech_first_audio_seconds",
}


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def scrape() -> dict[str, Any]:
    response = await AsyncClient().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def value(families: dict[str, Any], sample_name: str, **labels: str) -> float | None:
    """The value of the sample ``sample_name`` (e.g. ``x_total``, ``x_count``) with these labels."""
    for family in families.values():
        for s in family.samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def health() -> tuple[int, dict[str, Any]]:
    response = await AsyncClient().get("/healthz")
    assert response["Content-Type"] == "application/json"
    return response.status_code, json.loads(response.content)


def remote(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Workers other than this process's own engine."""
    return [w for w in body["workers"] if w["worker"] != "local"]


# -- embedded mode -----------------------------------------------------------------------------------
@pytest.fixture
def embedded(settings) -> None:
    """The embedded default's settings, whichever dispatch path the session has running."""
    settings.REDIS_URL = ""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def dispatch_path(request: pytest.FixtureRequest) -> str:
    return request.node.callspec.params["engine"]


async def test_healthz_embedded_never_starts_the_engine(embedded, monkeypatch):
    monkeypatch.setattr(runtime, "_scheduler", None)

    def refuse() -> None:
        raise AssertionError("a health check must not start the engine")

    monkeypatch.setattr(runtime, "get_scheduler", refuse)
    monkeypatch.setattr(runtime, "get_engine_client", refuse)
    status, body = await health()
    assert status == 503  # not ready: the models load with the first request (OMNIWEB_ENGINE_PRELOAD=0)
    assert body == {
        "ok": False,
        "ready": False,
        "status": "starting",
        "channel_layer": {"backend": "channels.layers.InMemoryChannelLayer", "reachable": True},
        "workers": [],
        "engine": {
            "mode": "embedded",
            "local_started": False,
            "state": "idle",
            "loading": [],
            "failed": {},
            "pipelines": {},
            "workers_up": 0,
            "workers_ready": 0,
            "active": 0,
            "queued": 0,
            "running_steps": 0,
        },
        "thinker": {"kind": "scene"},
    }
    assert runtime._scheduler is None


async def test_healthz_reports_the_dispatch_path_under_test(engine, request):
    status, body = await health()
    assert status == 200 and body["ok"] is True
    assert body["channel_layer"]["reachable"] is True
    fields = {"worker", "host", "pid", "active", "queued", "running_steps", "steps_total", "batches_total", "up"}
    if dispatch_path(request) == "local":
        assert body["channel_layer"]["backend"] == "channels.layers.InMemoryChannelLayer"
        [local] = body["workers"]
        assert local["worker"] == "local" and local["up"] is True and fields <= set(local)
        assert body["engine"]["mode"] == "embedded"
        assert body["engine"]["local_started"] is True and body["engine"]["workers_up"] == 1
    else:  # the conftest's two `runworker` processes, seen through their own heartbeats
        assert body["channel_layer"]["backend"] == "channels_redis.core.RedisChannelLayer"
        workers = remote(body)
        assert len(workers) == 2 and all(w["up"] and fields <= set(w) for w in workers)
        assert body["engine"]["mode"] == "redis" and body["engine"]["workers_up"] == 2


async def test_only_get_is_served():
    assert (await AsyncClient().post("/healthz")).status_code == 405
    assert (await AsyncClient().post("/metrics")).status_code == 405


async def test_metrics_exposition_has_every_metric(engine, request):
    metrics.observe_batch("vocoder", 3)
    families = await scrape()
    assert set(families) >= METRIC_NAMES
    assert families["omniweb_errors"].type == "counter"
    assert families["omniweb_engine_batch_size"].type == "histogram"
    assert families["omniweb_time_to_first_audio_seconds"].type == "histogram"
    for kind in metrics.ERROR_KINDS:
        assert value(families, "omniweb_errors_total", kind=kind) is not None
    assert value(families, "omniweb_engine_batch_size_count", kind="vocoder") >= 1
    # The engine gauges are computed at scrape time, per worker.
    if dispatch_path(request) == "local":
        workers = ["local"]
    else:
        workers = [s.labels["worker"] for s in families["omniweb_worker_up"].samples if s.labels["worker"] != "local"]
        assert len(workers) == 2
    for worker in workers:
        assert value(families, "omniweb_worker_up", worker=worker) == 1
        for name in (
            "omniweb_engine_requests_active",
            "omniweb_engine_requests_queued",
            "omniweb_engine_running_steps",
        ):
            assert value(families, name, worker=worker) == 0


async def test_a_speech_session_is_measured(connect):
    stream_before = sample("omniweb_time_to_first_audio_seconds_count", mode="stream")
    file_before = sample("omniweb_time_to_first_audio_seconds_count", mode="file")
    open_before = sample("omniweb_sessions_open", endpoint=SPEECH_PATH)
    client_before = sample("omniweb_errors_total", kind="client_error")

    comm = await session(connect, response_format="pcm", stream_audio=True, split_granularity="sentence")
    assert sample("omniweb_sessions_open", endpoint=SPEECH_PATH) == open_before + 1
    t = await speak(comm, "Hello there. How are you?")
    assert t.errors == [] and len(t.of_type("audio.done")) == 2
    # Once per utterance, not per sentence or chunk.
    assert sample("omniweb_time_to_first_audio_seconds_count", mode="stream") == stream_before + 1
    await comm.send_json_to({"type": "session.config", "response_format": "wav"})
    t = await speak(comm, "A file this time.")
    assert t.errors == [] and len(t.binary) == 1
    assert sample("omniweb_time_to_first_audio_seconds_count", mode="file") == file_before + 1
    await comm.send_json_to({"type": "no.such.message"})
    t = await speak(comm, "")  # flush nothing: session.done after the error
    assert len(t.errors) == 1
    assert sample("omniweb_errors_total", kind="client_error") == client_before + 1

    families = await scrape()
    assert value(families, "omniweb_sessions_open", endpoint=SPEECH_PATH) == open_before + 1
    assert value(families, "omniweb_time_to_first_audio_seconds_count", mode="stream") == stream_before + 1
    assert value(families, "omniweb_time_to_first_audio_seconds_sum", mode="stream") > 0

    await comm.disconnect(timeout=5)
    assert sample("omniweb_sessions_open", endpoint=SPEECH_PATH) == open_before
    families = await scrape()
    assert value(families, "omniweb_sessions_open", endpoint=SPEECH_PATH) == open_before


async def test_an_http_speech_request_is_timed_apart_from_the_websocket(engine):
    http_before = sample("omniweb_audio_speech_first_audio_seconds_count")
    ws_before = sample("omniweb_time_to_first_audio_seconds_count", mode="stream")
    body = {"model": "tts-1", "voice": "alloy", "input": "Hello there.", "response_format": "pcm"}
    response = await AsyncClient().post("/v1/audio/speech", json.dumps(body), content_type="application/json")
    assert response.status_code == 200 and b"".join([part async for part in response.streaming_content])
    assert sample("omniweb_audio_speech_first_audio_seconds_count") == http_before + 1
    assert sample("omniweb_time_to_first_audio_seconds_count", mode="stream") == ws_before


async def test_a_session_closed_by_the_server_is_counted_down_once(connect):
    open_before = sample("omniweb_sessions_open", endpoint=SPEECH_PATH)
    comm = await connect()
    await comm.send_json_to({"type": "input.text", "text": "no config first"})
    msg = await comm.receive_json_from(timeout=5)
    assert msg["type"] == "error"
    assert (await comm.receive_output(timeout=5))["type"] == "websocket.close"
    await comm.disconnect(timeout=5)
    assert sample("omniweb_sessions_open", endpoint=SPEECH_PATH) == open_before


def test_errors_are_counted_by_the_kind_they_carry_not_their_text():
    before = {kind: sample("omniweb_errors_total", kind=kind) for kind in metrics.ERROR_KINDS}
    metrics.count_error_message({"type": "error", "message": "Generation failed", "kind": "upstream_failure"})
    metrics.count_error_message({"type": "error", "message": "at capacity", "kind": "capacity"})
    metrics.count_error_message({"type": "error", "message": "Idle timeout"})  # no kind: the client's
    metrics.count_error_message({"type": "audio.done"})
    after = {kind: sample("omniweb_errors_total", kind=kind) for kind in metrics.ERROR_KINDS}
    changed = {kind: after[kind] - before[kind] for kind in after if after[kind] != before[kind]}
    assert changed == {"upstream_failure": 1, "capacity": 1, "client_error": 1}


# -- Redis mode --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            assert proc.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
async def redis_mode(settings, redis_url) -> Any:
    """Settings as in a Redis deployment; a client on the test's Redis, emptied first."""
    import redis.asyncio as redis

    settings.REDIS_URL = redis_url
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [redis_url]}}
    }
    client = redis.from_url(redis_url)
    await client.flushdb()
    yield client
    await client.aclose()


def heartbeat(worker: str, *, age: float = 0.0, active: int = 3, **fields: Any) -> str:
    return json.dumps(
        {
            "worker": worker,
            "host": "gpu-host-1",
            "pid": 4242,
            "active": active,
            "queued": 1,
            "running_steps": 2,
            "steps_total": 1000,
            "batches_total": 100,
            "ts": time.time() - age,
            **fields,
        }
    )


async def test_redis_mode_without_workers_is_unhealthy(redis_mode):
    status, body = await health()
    assert status == 503 and body["ok"] is False
    assert body["channel_layer"] == {"backend": "channels_redis.core.RedisChannelLayer", "reachable": True}
    assert remote(body) == [] and body["engine"]["mode"] == "redis" and body["engine"]["workers_up"] == 0


async def test_redis_mode_lists_a_worker_heartbeat_until_it_expires(redis_mode):
    beat = heartbeat("gpu-1")
    await redis_mode.set("omniweb:worker:gpu-1", beat, ex=60)  # read well before it expires, however slow
    status, body = await health()
    read_by = time.time()
    assert status == 200 and body["ok"] is True
    [worker] = remote(body)
    assert worker["worker"] == "gpu-1" and worker["host"] == "gpu-host-1" and worker["up"] is True
    # Its age runs from the heartbeat's own time to the read (to the millisecond it is rounded to).
    assert worker["active"] == 3 and 0 <= worker["age_seconds"] <= read_by - json.loads(beat)["ts"] + 0.001
    assert body["engine"]["workers_up"] == 1 and body["engine"]["active"] == 3

    families = await scrape()
    assert value(families, "omniweb_worker_up", worker="gpu-1") == 1
    assert value(families, "omniweb_engine_requests_active", worker="gpu-1") == 3
    assert value(families, "omniweb_engine_requests_queued", worker="gpu-1") == 1
    assert value(families, "omniweb_engine_running_steps", worker="gpu-1") == 2
    assert value(families, "omniweb_engine_steps_total", worker="gpu-1") == 1000

    await redis_mode.pexpire("omniweb:worker:gpu-1", 1)  # its time to live runs out
    deadline = time.monotonic() + 30  # a ceiling only
    while await redis_mode.exists("omniweb:worker:gpu-1"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status, body = await health()
    assert status == 503 and body["ok"] is False and remote(body) == []
    families = await scrape()
    assert value(families, "omniweb_worker_up", worker="gpu-1") is None


async def test_redis_mode_stale_heartbeat_is_down(redis_mode):
    await redis_mode.set("omniweb:worker:gpu-2", heartbeat("gpu-2", age=60), ex=10)
    await redis_mode.set("omniweb:worker:broken", b"not json", ex=10)
    status, body = await health()
    assert status == 503
    [worker] = remote(body)
    assert worker["worker"] == "gpu-2" and worker["up"] is False and worker["age_seconds"] >= 60
    families = await scrape()
    assert value(families, "omniweb_worker_up", worker="gpu-2") == 0


async def test_redis_mode_one_live_worker_is_enough(redis_mode):
    await redis_mode.set("omniweb:worker:gpu-2", heartbeat("gpu-2", age=60), ex=10)
    await redis_mode.set("omniweb:worker:gpu-3", heartbeat("gpu-3", active=0), ex=10)
    status, body = await health()
    assert status == 200
    assert [(w["worker"], w["up"]) for w in remote(body)] == [("gpu-2", False), ("gpu-3", True)]


async def test_unreachable_redis_is_reported_not_waited_for(settings):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings.REDIS_URL = url
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [url]}}
    }
    # The check has its own 1 s ping timeout: it answers rather than hang (10 s: a wait, not a limit).
    status, body = await asyncio.wait_for(health(), 10)
    assert status == 503 and body["ok"] is False
    assert body["channel_layer"]["reachable"] is False
    assert (await AsyncClient().get("/metrics")).status_code == 200  # metrics still render


async def test_redis_mode_counts_only_ready_workers(redis_mode):
    """A worker heartbeats while its models load; the web tier is not ready until one has them."""
    loading = {"ready": False, "pipelines": {"speech.tts": "loading", "video.turn": "loading"}}
    await redis_mode.set("omniweb:worker:gpu-1", heartbeat("gpu-1", **loading), ex=10)
    status, body = await health()
    assert status == 503 and body["status"] == "starting"
    assert body["engine"]["workers_up"] == 1 and body["engine"]["workers_ready"] == 0
    assert body["engine"]["state"] == "loading" and set(body["engine"]["loading"]) == {"speech.tts", "video.turn"}
    degraded = {
        "ready": True,
        "pipelines": {"speech.tts": "ready", "video.turn": "failed"},
        "failed": {"video.turn": "ModelLoadError: mediapipe is missing"},
    }
    await redis_mode.set("omniweb:worker:gpu-1", heartbeat("gpu-1", **degraded), ex=10)
    status, body = await health()
    assert status == 200 and body["status"] == "degraded" and body["engine"]["workers_ready"] == 1
    assert body["engine"]["failed"] == {"video.turn": "ModelLoadError: mediapipe is missing"}
    families = await scrape()
    assert value(families, "omniweb_engine_ready", worker="gpu-1") == 1


async def test_the_web_tier_refuses_when_no_ready_worker_has_room(redis_mode):
    from omniweb.engine.heartbeats import WorkerRoom

    full = {"ready": True, "estimated_wait_seconds": {"speech.tts": 3.5}}
    await redis_mode.set("omniweb:worker:gpu-1", heartbeat("gpu-1", **full), ex=10)
    await redis_mode.set("omniweb:worker:gpu-2", heartbeat("gpu-2", **{**full, "ready": False}), ex=10)
    assert await WorkerRoom(2.0)("speech.tts") == pytest.approx(1.5)  # the loading worker does not count
    assert await WorkerRoom(2.0)("video.turn") is None  # nothing estimated: the workers decide
    room = {"ready": True, "estimated_wait_seconds": {"speech.tts": 0.4}}
    await redis_mode.set("omniweb:worker:gpu-3", heartbeat("gpu-3", **room), ex=10)
    assert await WorkerRoom(2.0)("speech.tts") is None
