#!/usr/bin/env python
"""Per-step timings of the ``video.turn`` pipeline on this machine (engine only, no WebSocket).

Measures, with the real models on an in-process scheduler (``OMNIWEB_ENGINE_WORKERS`` workers):

1. the steps alone: scene analysis (perception models and measures) of 4 sampled 640×480 JPEG
   frames, Whisper tiny.en on a ~2 s spoken question, and the talker's first sentence;
2. a typed question through the engine: submit → first text delta, → first audio chunk, → end;
3. a spoken question through the engine: submit → transcript, → first text, → first audio;
4. the ``llm`` thinker (``OMNIWEB_LLM_URL``) against a local chat-completions server that answers at
   once (so the figure is omniweb's own overhead: the perception models' facts on the frames,
   connection, reader thread, event parsing, step hand-over).

Prints markdown tables and PASS/FAIL for the issue's targets (first text ≤ 150 ms and first audio
≤ 300 ms after a typed question). Usage, from the repository root with the venv active::

    python bench/video_engine.py            # N=20 per row
    python bench/video_engine.py --n 5      # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")

import django

django.setup()

import cv2  # noqa: E402
import numpy as np  # noqa: E402
from django.conf import settings  # noqa: E402
from django.test import override_settings  # noqa: E402
from hibari import Hibari  # noqa: E402
from scipy.signal import resample_poly  # noqa: E402

from omniweb.asr.whisper import Options as AsrOptions  # noqa: E402
from omniweb.engine.messages import Chunk, End  # noqa: E402
from omniweb.engine.requests import from_wire as request_from_wire  # noqa: E402
from omniweb.engine.scheduler import Scheduler  # noqa: E402
from speech.tts.model import HibariTalker  # noqa: E402
from video.engine import scene  # noqa: E402
from video.engine.pipeline import PIPELINE, VideoTurnPipeline  # noqa: E402

perf = time.perf_counter
TARGET_FIRST_TEXT = 0.150
TARGET_FIRST_AUDIO = 0.300
QUESTION = "What do you see?"
SPOKEN = "How many people can you see?"


def camera_frames(n: int = 4) -> list[bytes]:
    """640×480 JPEGs like a webcam's: a face, a red object moving across, soft focus and noise."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        img = np.full((480, 640, 3), (170, 175, 180), np.uint8)
        cv2.rectangle(img, (0, 330), (640, 480), (60, 90, 120), -1)  # a table
        cx, cy, w = 420, 210, 150
        cv2.ellipse(img, (cx, cy), (w // 2, int(w * 0.65)), 0, 0, 360, (150, 180, 225), -1)
        for s in (-1, 1):
            cv2.ellipse(img, (cx + s * w // 5, cy - w // 8), (w // 7, w // 12), 0, 0, 360, (105, 126, 158), -1)
            cv2.circle(img, (cx + s * w // 5, cy - w // 8), w // 22, (40, 30, 20), -1)
        cv2.ellipse(img, (cx, cy + w // 3), (w // 6, w // 18), 0, 0, 180, (70, 70, 160), 4)
        x = 40 + 60 * i
        cv2.rectangle(img, (x, 360), (x + 70, 430), (30, 30, 200), -1)
        img = cv2.GaussianBlur(img, (0, 0), 1.5)
        img = np.clip(img + rng.normal(0, 3, img.shape), 0, 255).astype(np.uint8)
        ok, data = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 80])
        assert ok
        out.append(data.tobytes())
    return out


def spoken(text: str) -> bytes:
    wave = Hibari()(text, seed=3)
    return (np.clip(resample_poly(wave, 2, 3), -1, 1) * 32767).astype("<i2").tobytes()


def stats_row(label: str, samples: Sequence[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"| {label} | {statistics.median(ms):.1f} | {p95:.1f} | {ms[0]:.1f} | {ms[-1]:.1f} |"


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = perf()
        fn()
        out.append(perf() - t0)
    return out


def turn_times(sched: Scheduler, request: dict[str, Any]) -> dict[str, float]:
    """Seconds from submit to the first chunk of each kind, and to the end."""
    firsts: dict[str, float] = {}
    ended = threading.Event()
    t0 = perf()

    def sink(chunk: Chunk) -> None:
        firsts.setdefault(chunk.TYPE, perf() - t0)
        if isinstance(chunk, End):
            if not chunk.ok:
                print(f"turn ended with {chunk}", file=sys.stderr)
            ended.set()

    typed = request_from_wire({"kind": "AnswerRequest", **request})  # frames as plain dicts
    sched.submit(f"b{time.monotonic_ns()}", typed, sink)
    assert ended.wait(60)
    return firsts


class _Answer(BaseHTTPRequestHandler):
    """A chat-completions server that streams a fixed two-sentence answer at once."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in ("I see ", "a person. ", "The light ", "is good."):
            chunk = {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20, help="samples per row")
    n = parser.parse_args().n

    frames = camera_frames()
    request_frames = [{"frame_id": str(i), "data": f, "pts_ms": i * 250} for i, f in enumerate(frames)]
    question_pcm = spoken(SPOKEN)
    t0 = perf()
    pipeline = VideoTurnPipeline()
    load_s = perf() - t0
    recognizer = pipeline.recognizer
    talker = HibariTalker()  # the voice's talker, as the pipeline's loops build it
    rng = np.random.default_rng(0)

    rows = ["| step | p50 ms | p95 ms | min ms | max ms |", "|---|---:|---:|---:|---:|"]
    models = pipeline.thinker.perception
    analyse = lambda: scene.analyse(frames, perception=models)  # noqa: E731
    rows.append(stats_row("scene analysis with the perception models, 4 frames 640×480 JPEG", timed(analyse, n)))
    rows.append(
        stats_row(
            f"Whisper tiny.en, {len(question_pcm) / 32000:.1f} s question",
            timed(lambda: recognizer.run(recognizer.start(question_pcm, AsrOptions())), max(3, n // 4)),
        )
    )
    rows.append(
        stats_row(
            "talker, first sentence of the answer",
            timed(lambda: talker.talk("heart", 0, "I can see one person.", 1.0, rng, None, False), n),
        )
    )

    sched = Scheduler({PIPELINE: pipeline}, workers=settings.ENGINE_WORKERS)
    sched.start()
    try:
        turn_times(sched, {"question": QUESTION, "frames": request_frames})  # warm
        typed = [turn_times(sched, {"question": QUESTION, "frames": request_frames}) for _ in range(n)]
        typed_text_only = [
            turn_times(sched, {"question": QUESTION, "frames": request_frames, "modalities": ["text"]})
            for _ in range(n)
        ]
        voice = [
            turn_times(sched, {"question": "", "audio": question_pcm, "frames": request_frames})
            for _ in range(max(3, n // 4))
        ]
    finally:
        sched.stop()

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    with override_settings(THINKER="llm", LLM_URL=url, LLM_MODEL_PATH=""):
        llm_pipeline = VideoTurnPipeline()
    usched = Scheduler({PIPELINE: llm_pipeline}, workers=settings.ENGINE_WORKERS)
    usched.start()
    try:
        turn_times(usched, {"question": QUESTION, "frames": request_frames})
        llm = [turn_times(usched, {"question": QUESTION, "frames": request_frames}) for _ in range(n)]
    finally:
        usched.stop()
        server.shutdown()

    def col(samples: list[dict[str, float]], kind: str) -> list[float]:
        return [s[kind] for s in samples]

    rows += [
        stats_row("typed question: submit → first text", col(typed, "text")),
        stats_row("typed question: submit → first audio", col(typed, "audio")),
        stats_row("typed question: submit → end (answer fully spoken)", col(typed, "end")),
        stats_row("typed question, text only: submit → first text", col(typed_text_only, "text")),
        stats_row("spoken question: submit → transcript", col(voice, "transcript")),
        stats_row("spoken question: submit → first text", col(voice, "text")),
        stats_row("spoken question: submit → first audio", col(voice, "audio")),
        stats_row("llm thinker (local server, instant answer): submit → first text", col(llm, "text")),
        stats_row("llm thinker: submit → first audio", col(llm, "audio")),
    ]
    print(
        f"Pipeline load (hibari + Whisper + perception models): {load_s:.2f} s; "
        f"engine workers: {settings.ENGINE_WORKERS}; N={n}"
    )
    print()
    print("\n".join(rows))
    first_text = statistics.median(col(typed, "text"))
    first_audio = statistics.median(col(typed, "audio"))
    ok_text = first_text <= TARGET_FIRST_TEXT
    ok_audio = first_audio <= TARGET_FIRST_AUDIO
    print()
    print(f"- first text p50 {first_text * 1000:.1f} ms (target ≤ 150 ms): {'PASS' if ok_text else 'FAIL'}")
    print(f"- first audio p50 {first_audio * 1000:.1f} ms (target ≤ 300 ms): {'PASS' if ok_audio else 'FAIL'}")
    return 0 if ok_text and ok_audio else 1


if __name__ == "__main__":
    sys.exit(main())
