"""``/v1/video/chat/stream`` as the tests drive it: open a session, send frames, wait for acks and
for everything sent to be processed (``sync``), collect a turn, camera-like frames of a person
(``scene_frames``), the engine's ``video.turn`` requests, and a question in our own voice."""

from __future__ import annotations

import base64
from typing import Any

import cv2
import numpy as np
from scipy.signal import resample_poly

from omniweb.engine.messages import PcmAudio
from omniweb.engine.requests import SpeakRequest
from support.camera_scenes import room, shoot, with_person
from support.messages import Transcript, receive_json, receive_until

VIDEO_PATH = "/v1/video/chat/stream"


def jpeg(level: int = 100, width: int = 160, height: int = 120) -> bytes:
    """A flat colour frame; frames with levels far apart are 'different' to any filter threshold."""
    img = np.zeros((height, width, 3), np.uint8)
    img[:] = (level, 255 - level, (level * 7) % 256)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return buf.tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def video(connect, **fields):
    comm = await connect(VIDEO_PATH)
    await comm.send_json_to({"type": "session.config", **fields})
    return comm


async def frame(comm, data: bytes | str, frame_id: str | None = None, **extra) -> None:
    msg = {"type": "video.frame", "data": data if isinstance(data, str) else b64(data), **extra}
    if frame_id is not None:
        msg["frame_id"] = frame_id
    await comm.send_json_to(msg)


async def ack(comm) -> dict:
    msg = await receive_json(comm)
    assert msg["type"] == "video.frame.ack", msg
    return msg


async def sync(comm) -> None:
    """Everything sent before has been processed: the pong comes after their replies."""
    await comm.send_json_to({"type": "ping"})
    assert await receive_json(comm) == {"type": "pong"}


QUESTION = "What do you see?"


def is_type(*kinds: str):
    return lambda m: isinstance(m, dict) and m.get("type") in kinds


async def collect_turn(comm, *, audio: bool = True, timeout: float = 30.0) -> Transcript:
    """One turn's messages through response.text.done, and with ``audio`` on to response.audio.done
    (the text is done as soon as it is complete: audio may follow it)."""
    t = await receive_until(comm, is_type("response.text.done"), timeout)
    assert not t.closed, t.types
    if audio:
        t.events += (await receive_until(comm, is_type("response.audio.done"), timeout)).events
    return t


async def scene_frames(comm, count: int = 2, *, ids: bool = True) -> None:
    """Camera-like frames of a person moving (each kept by the default filter)."""
    rng = np.random.default_rng(0)
    for i in range(count):
        data = shoot(with_person(room(), 200 + 40 * i, 170, arm_deg=20 * i), rng)
        await frame(comm, data, f"f{i}" if ids else None, pts_ms=500 * i)
        if ids:
            assert (await ack(comm))["accepted"] is True
    await sync(comm)


def video_requests(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation turns among the recorded requests (``requests_seen``: their wire form)."""
    return [r for r in seen if r.get("pipeline") == "video.turn"]


async def synthesize(text: str) -> bytes:
    """The question spoken by our own voice (the speech pipeline), as PCM16 16 kHz mono."""
    from omniweb.engine.runtime import get_engine_client

    pcm = b""
    async for chunk in get_engine_client().stream(SpeakRequest(text=text, seed=1)):
        if isinstance(chunk, PcmAudio):
            pcm += chunk.pcm
    samples = np.frombuffer(pcm, "<i2").astype(np.float32)
    return np.clip(resample_poly(samples, 2, 3), -32768, 32767).astype("<i2").tobytes()
