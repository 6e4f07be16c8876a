"""A whole video session through the README's server (``manage.py runserver``, daphne) over a real
socket: camera frames, a 10 MB frame admitted by the server, a question spoken by our own voice
(synthesized on the same server's speech endpoint), the streamed text and spoken answer, video.done."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import wave
from collections.abc import Iterator

import numpy as np
import pytest
import websockets
from scipy.signal import resample_poly
from support.camera_scenes import room, shoot, with_person
from support.servers import free_port, live_server
from websockets.exceptions import InvalidHandshake, InvalidMessage

from video import protocol


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    with live_server(["manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"], port) as base:
        yield base.replace("http://", "ws://")


async def open_ws(url: str):
    """Connect once the engine has loaded (daphne drops a handshake the app holds over 5 s)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return await websockets.connect(url, max_size=None, open_timeout=30)
        except (OSError, InvalidHandshake, InvalidMessage):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def spoken(base: str, text: str) -> bytes:
    """``text`` in our voice from the speech endpoint, as PCM16 16 kHz mono."""
    ws = await open_ws(base + "/v1/audio/speech/stream")
    async with ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "wav"}))
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
        wavs = []
        while True:
            msg = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(msg, bytes):
                wavs.append(msg)
            elif json.loads(msg)["type"] == "session.done":
                break
    pcm = b""
    for blob in wavs:
        with wave.open(io.BytesIO(blob)) as w:
            pcm += w.readframes(w.getnframes())
    samples = resample_poly(np.frombuffer(pcm, "<i2").astype(np.float32), 2, 3)
    return np.clip(samples, -32768, 32767).astype("<i2").tobytes()


async def test_full_session_with_a_spoken_question(server):
    question_audio = await spoken(server, "Is there anyone in the room?")
    ws = await open_ws(server + "/v1/video/chat/stream")
    async with ws:

        async def recv() -> dict:
            return json.loads(await asyncio.wait_for(ws.recv(), 60))

        await ws.send(json.dumps({"type": "session.config", "num_frames": 4}))
        rng = np.random.default_rng(1)
        for i in range(3):
            data = base64.b64encode(shoot(with_person(room(), 220 + 60 * i, 170), rng)).decode()
            await ws.send(json.dumps({"type": "video.frame", "data": data, "frame_id": f"cam{i}", "pts_ms": 200 * i}))
            assert (await recv())["accepted"] is True
        # The largest frame the protocol allows: daphne admits the ~10 MB message, the session buffers it.
        body = shoot(with_person(room(), 500, 170, arm_deg=60), rng)
        padded = base64.b64encode(body + b"\0" * (protocol.MAX_FRAME_SIZE // 4 * 3 - len(body))).decode()
        assert len(padded) == protocol.MAX_FRAME_SIZE
        await ws.send(json.dumps({"type": "video.frame", "data": padded, "frame_id": "big", "pts_ms": 600}))
        big = await recv()
        assert (big["type"], big["frame_id"], big["accepted"], big["buffered_frames"]) == (
            "video.frame.ack",
            "big",
            True,
            4,
        )
        await ws.send(json.dumps({"type": "video.frame", "data": padded + "AAAA", "frame_id": "huge"}))
        assert await recv() == {"type": "error", "message": "Frame too large", "kind": "client_error"}

        half = len(question_audio) // 4 * 2
        await ws.send(json.dumps({"type": "audio.chunk", "data": base64.b64encode(question_audio[:half]).decode()}))
        await ws.send(
            json.dumps(
                {"type": "video.query", "text": "", "audio_data": base64.b64encode(question_audio[half:]).decode()}
            )
        )
        await ws.send(json.dumps({"type": "video.done"}))
        messages = []
        while not messages or messages[-1]["type"] != "session.done":
            messages.append(await recv())
        types = [m["type"] for m in messages]
        assert types[:3] == ["input.transcript", "response.start", "video.frames.consumed"], types
        assert "anyone in the room" in messages[0]["text"].lower()
        assert messages[2]["frame_ids"] == ["cam0", "cam1", "cam2", "big"]
        assert types[-2:] == ["response.audio.done", "session.done"]
        text = "".join(m["delta"] for m in messages if m["type"] == "response.text.delta")
        [done] = [m for m in messages if m["type"] == "response.text.done"]
        assert text and done["text"] == text
        audio = [m for m in messages if m["type"] == "response.audio.delta"]
        assert sum(len(base64.b64decode(a["data"])) - 44 for a in audio) > 24000  # over half a second of speech
        assert "error" not in types
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
