#!/usr/bin/env python
"""Ask the default video thinker questions over a real WebSocket, with real photos as camera frames.

Against a running server (``python manage.py runserver``), one connection per question: three
frames of one photo (scikit-image's samples, a rendered sign) with fresh sensor noise each, then
``video.query``; prints each answer verbatim with the first text and first audio after the query.
Usage, from the repository root with the venv active::

    python bench/video_questions.py --url ws://127.0.0.1:8000/v1/video/chat/stream
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np
import websockets
from support.photos import jpeg, photo, sign


def frames_of(img: np.ndarray) -> list[bytes]:
    """Three frames of a still camera: the photo at its own size with fresh sensor noise each time."""
    rng = np.random.default_rng(0)
    return [jpeg(np.clip(img + rng.normal(0, 2, img.shape), 0, 255).astype(np.uint8), 85) for _ in range(3)]


CASES = [
    ("coffee", photo("coffee"), "What is this?"),
    ("chelsea", photo("chelsea"), "What is this?"),
    ("sign", sign(("EXIT", "Platform 3")), "What does the sign say?"),
    ("astronaut", photo("astronaut"), "Am I smiling?"),
    ("camera", photo("camera"), "Am I smiling?"),
    ("astronaut", photo("astronaut"), "Can you see my hand?"),
    ("astronaut", photo("astronaut"), "What do you see?"),
    ("camera", photo("camera"), "What do you see?"),
    ("coffee", photo("coffee"), "What do you see?"),
    ("astronaut", photo("astronaut"), "Who is this?"),
    ("astronaut", photo("astronaut"), "Where is the red thing?"),
    ("rocket", photo("rocket"), "What is this?"),
]


async def ask(url: str, name: str, img: np.ndarray, question: str) -> tuple[str | None, float, float]:
    async with websockets.connect(url, origin="http://127.0.0.1", max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "num_frames": 4}))
        for i, f in enumerate(frames_of(img)):
            await ws.send(
                json.dumps(
                    {
                        "type": "video.frame",
                        "data": base64.b64encode(f).decode(),
                        "frame_id": f"{name}{i}",
                        "pts_ms": i * 200,
                    }
                )
            )
        await ws.send(json.dumps({"type": "ping"}))
        while json.loads(await ws.recv())["type"] != "pong":
            pass
        t0 = time.perf_counter()
        first_text = first_audio = None
        text = None
        await ws.send(json.dumps({"type": "video.query", "text": question}))
        while True:
            m = json.loads(await ws.recv())
            t = (time.perf_counter() - t0) * 1000
            if m["type"] == "response.text.delta" and first_text is None:
                first_text = t
            if m["type"] == "response.audio.delta" and first_audio is None:
                first_audio = t
            if m["type"] == "response.text.done":
                text = m["text"]
            if m["type"] == "error":
                print("ERROR", m)
                break
            if m["type"] == "response.audio.done":
                break
        await ws.send(json.dumps({"type": "video.done"}))
        return text, first_text, first_audio


async def main(url: str) -> None:
    for name, img, q in CASES:
        text, ft, fa = await ask(url, name, img, q)
        print(f"[{name}] {q}\n  -> {text}\n  first text {ft:.0f} ms, first audio {fa:.0f} ms", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/video/chat/stream")
    asyncio.run(main(parser.parse_args().url))
