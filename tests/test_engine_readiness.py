"""Readiness: the server takes connections while its models load and says so, and a pipeline that
fails to load takes down only the endpoints that need it.

Each test runs the runtime's own loading code (``runtime._load``) on a scheduler of its own, with
the real speech pipeline behind a gate (so the load lasts as long as the test needs) and a video
pipeline whose factory raises what a missing vision wheel raises (a fault the real models will not
produce on demand).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import cv2
import numpy as np
import pytest
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient
from support.messages import receive_json, receive_until_done

from omniweb.engine import runtime
from omniweb.engine.client import LocalEngineClient
from omniweb.engine.scheduler import Scheduler
from speech.tts.loops import PIPELINE as TTS
from speech.tts.loops import TtsPipeline
from video.engine.perception import ModelLoadError

VIDEO = "video.turn"
SPEECH_PATH = "/v1/audio/speech/stream"
VIDEO_PATH = "/v1/video/chat/stream"
HELLO = "Hello there."


class Loading:
    """A fresh engine whose speech models load once ``release()`` is called; video's never load."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, ready_wait: float) -> None:
        self.gate = threading.Event()

        def speech() -> TtsPipeline:
            self.gate.wait(60)
            return TtsPipeline()

        def broken_video() -> Any:
            raise ModelLoadError("mediapipe is not installed (pip install --no-deps -r requirements-vision.txt)")

        factories = {VIDEO: broken_video, TTS: speech}  # video fails first, while speech still loads
        self.scheduler = Scheduler({}, workers=2)
        loading = runtime._Loading(pipelines={name: runtime.PipelineLoad() for name in factories})
        for name in factories:
            self.scheduler.pipeline_loading(name)
        self.scheduler.start()
        monkeypatch.setattr(runtime, "_scheduler", self.scheduler)
        monkeypatch.setattr(runtime, "_loading", loading)
        monkeypatch.setattr(runtime, "_client", LocalEngineClient(self.scheduler, ready_wait=ready_wait))
        self.loading = loading
        self.thread = threading.Thread(target=runtime._load, args=(self.scheduler, factories, loading), daemon=True)
        self.thread.start()

    async def release(self) -> None:
        self.gate.set()
        await asyncio.to_thread(self.loading.done.wait, 60)

    def close(self) -> None:
        self.gate.set()
        self.thread.join(60)
        self.scheduler.stop()


@pytest.fixture
def embedded(settings: Any) -> None:
    settings.REDIS_URL = ""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def loading(embedded: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loading]:
    engine = Loading(monkeypatch, ready_wait=0.2)
    yield engine
    engine.close()


@pytest.fixture
async def sockets() -> AsyncIterator[list[WebsocketCommunicator]]:
    from omniweb.asgi import application

    opened: list[WebsocketCommunicator] = []

    async def open_socket(path: str) -> WebsocketCommunicator:
        comm = WebsocketCommunicator(application, path)
        connected, _ = await comm.connect(timeout=5)
        assert connected, "the handshake must complete while the models load"
        opened.append(comm)
        return comm

    yield open_socket  # type: ignore[misc]
    for comm in opened:
        await comm.disconnect()


async def health() -> tuple[int, dict[str, Any]]:
    response = await AsyncClient().get("/healthz")
    return response.status_code, json.loads(response.content)


async def speech_session(open_socket: Any) -> WebsocketCommunicator:
    comm = await open_socket(SPEECH_PATH)
    await comm.send_json_to({"type": "session.config", "response_format": "pcm"})
    return comm


async def say(comm: WebsocketCommunicator, text: str) -> Any:
    await comm.send_json_to({"type": "input.text", "text": text})
    await comm.send_json_to({"type": "input.done"})
    return await receive_until_done(comm)


async def test_while_loading_the_server_says_starting_and_then_serves(loading, sockets):
    status, body = await health()
    assert status == 503 and body["ready"] is False and body["status"] == "starting"
    assert body["engine"]["state"] == "loading" and body["engine"]["loading"] == [TTS]

    comm = await speech_session(sockets)  # the handshake completed while the voice loads
    refused = await say(comm, HELLO)
    assert refused.types == ["error", "session.done"]
    assert refused.json[0]["kind"] == "starting" and "starting" in refused.json[0]["message"]

    http = await AsyncClient().post(
        "/v1/audio/speech",
        {"model": "tts-1", "voice": "alloy", "input": HELLO, "response_format": "wav"},
        content_type="application/json",
    )
    assert http.status_code == 503 and http["Retry-After"] == "1"
    assert json.loads(http.content)["error"]["code"] == "server_starting"

    await loading.release()
    status, body = await health()
    assert status == 200 and body["ready"] is True and body["status"] == "degraded"
    assert body["engine"]["pipelines"][TTS]["state"] == "ready"
    assert body["engine"]["pipelines"][TTS]["load_seconds"] > 0
    assert body["engine"]["failed"] == {
        VIDEO: "ModelLoadError: "
        + str(ModelLoadError("mediapipe is not installed (pip install --no-deps -r requirements-vision.txt)"))
    }

    served = await say(comm, HELLO)  # the same session, now with the voice loaded
    assert served.errors == [] and any(isinstance(m, bytes) for m in served.events)
    assert served.json[-1] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


async def test_a_pipeline_that_failed_to_load_refuses_only_its_own_endpoint(loading, sockets):
    await loading.release()
    video = await sockets(VIDEO_PATH)
    await video.send_json_to({"type": "session.config"})
    _, jpeg = cv2.imencode(".jpg", np.full((120, 160, 3), 128, np.uint8))
    frame = base64.b64encode(jpeg.tobytes()).decode()
    await video.send_json_to({"type": "video.frame", "data": frame, "frame_id": "f1"})
    assert (await receive_json(video))["type"] == "video.frame.ack"
    await video.send_json_to({"type": "video.query", "text": "What do you see?"})
    error = await receive_json(video)
    while error["type"] == "response.start":  # the turn starts on the wire, then fails
        error = await receive_json(video)
    assert error["type"] == "error" and error["kind"] == "unavailable", error
    assert VIDEO in error["message"]

    speech = await speech_session(sockets)  # the other endpoints serve regardless
    served = await say(speech, HELLO)
    assert served.errors == [] and served.json[-1]["total_sentences"] == 1


async def test_a_request_waits_for_models_that_load_within_the_wait(embedded, monkeypatch, sockets):
    engine = Loading(monkeypatch, ready_wait=60)
    try:
        comm = await speech_session(sockets)
        await comm.send_json_to({"type": "input.text", "text": HELLO})
        await comm.send_json_to({"type": "input.done"})
        await asyncio.sleep(0.3)  # the request is waiting for the voice
        engine.gate.set()
        t = await receive_until_done(comm, timeout=60)
        assert t.errors == [] and t.json[-1]["total_sentences"] == 1
    finally:
        engine.close()
