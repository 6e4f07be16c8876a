#!/usr/bin/env python
"""What the perception models cost on this machine, and what they add to the first text and audio.

1. Per model, per 640×480 frame, on real photos (scikit-image's samples; a rendered sign for the
   reader): faces, pose, hands, expression, main object, text (only run for reading questions),
   and the whole per-frame set without and with reading.
2. A typed question through the engine (in-process scheduler, the real pipeline): submit → first
   text delta and → first audio chunk, for "What do you see?" (no reading) and "What does the sign
   say?" (reading), side by side in one run, 4 sampled frames per question.

Targets (issue #10): per-frame set ≤ 100 ms, reading ≤ 400 ms per frame, first text ≤ 150 ms without
reading and ≤ 600 ms with it. Usage, from the repository root with the venv active (scikit-image,
from requirements-dev.txt, provides the photos)::

    python bench/video_perception.py            # N=10 per row
    python bench/video_perception.py --n 3      # quicker
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")

import django  # noqa: E402

django.setup()

import cv2  # noqa: E402
import numpy as np  # noqa: E402
from django.conf import settings  # noqa: E402
from support.photos import jpeg, photo, sign  # noqa: E402

from omniweb.engine.messages import Chunk, End  # noqa: E402
from omniweb.engine.requests import from_wire as request_from_wire  # noqa: E402
from omniweb.engine.scheduler import Scheduler  # noqa: E402
from video.engine.pipeline import PIPELINE, VideoTurnPipeline  # noqa: E402

perf = time.perf_counter
TARGETS_MS = {"set": 100, "read": 400, "text": 150, "text_read": 600}


def stats_row(label: str, ms: Sequence[float]) -> str:
    ms = sorted(ms)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"| {label} | {statistics.median(ms):.1f} | {p95:.1f} | {ms[0]:.1f} | {ms[-1]:.1f} |"


def frame(img: np.ndarray, shift: int = 0) -> np.ndarray:
    """The photo as a 640×480 camera frame, optionally shifted a few pixels (a hand-held camera)."""
    out = cv2.resize(img, (640, 480), interpolation=cv2.INTER_AREA)
    return np.roll(out, shift, axis=1) if shift else out


def turn_times(sched: Scheduler, request: dict[str, Any]) -> dict[str, float]:
    firsts: dict[str, float] = {}
    ended = threading.Event()
    t0 = perf()

    def sink(chunk: Chunk) -> None:
        firsts.setdefault(chunk.TYPE, (perf() - t0) * 1000)
        if isinstance(chunk, End):
            ended.set()

    typed = request_from_wire({"kind": "AnswerRequest", **request})  # frames as plain dicts
    sched.submit(f"b{time.monotonic_ns()}", typed, sink)
    assert ended.wait(120)
    return firsts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10, help="samples per row")
    n = parser.parse_args().n

    t0 = perf()
    pipeline = VideoTurnPipeline()
    load_s = perf() - t0
    models = pipeline.thinker.perception
    people = [frame(photo(name)) for name in ("astronaut", "camera")]
    things = [frame(photo(name)) for name in ("coffee", "chelsea")]
    signs = [sign(("EXIT", "Platform 3")), sign(("STOP", "Staff only"), tilt=8)]
    labels = {
        "faces": "faces (MediaPipe full range)",
        "pose": "pose (MediaPipe Pose, complexity 1)",
        "hands": "hands (MediaPipe Hands)",
        "expression": "expression (fer via LiteRT), the faces found",
        "objects": "main object (EfficientNet-Lite0)",
        "text": "text (RapidOCR), a sign",
    }
    per_model: dict[str, list[float]] = {label: [] for label in labels.values()}
    whole: dict[str, list[float]] = {"set": [], "read": []}
    for i in range(n):
        for img, read in ((people[i % 2], False), (things[i % 2], False), (signs[i % 2], True)):
            t = perf()
            seen = models.observe(img, read=read)
            whole["read" if read else "set"].append((perf() - t) * 1000)
            for key, ms in seen.timings_ms.items():
                if key != "text" or read:
                    per_model[labels[key]].append(ms)

    def frames_of(imgs: list[np.ndarray]) -> list[dict[str, Any]]:
        return [{"frame_id": str(i), "data": jpeg(img, 80), "pts_ms": i * 250} for i, img in enumerate(imgs)]

    look = frames_of([frame(photo("camera"), s) for s in (0, 4, 8, 12)])
    read = frames_of([np.roll(signs[0], s, axis=1) for s in (0, 4, 8, 12)])
    sched = Scheduler({PIPELINE: pipeline}, workers=settings.ENGINE_WORKERS)
    sched.start()
    turns: dict[str, list[dict[str, float]]] = {"see": [], "read": []}
    try:
        turn_times(sched, {"question": "What do you see?", "frames": look})  # warm
        for _ in range(n):  # interleaved, so both see the same machine load
            turns["see"].append(turn_times(sched, {"question": "What do you see?", "frames": look}))
            turns["read"].append(turn_times(sched, {"question": "What does the sign say?", "frames": read}))
    finally:
        sched.stop()

    print(
        f"Pipeline load (hibari + Whisper + perception models): {load_s:.2f} s; "
        f"workers: {settings.ENGINE_WORKERS}; N={n}"
    )
    print()
    print("| per 640×480 frame | p50 ms | p95 ms | min ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for label, ms in per_model.items():
        print(stats_row(label, ms))
    print(stats_row("whole per-frame set (no reading)", whole["set"]))
    print(stats_row("whole per-frame set with reading", whole["read"]))
    print()
    print("| typed question, 4 frames | first text p50 ms | p95 | first audio p50 ms | p95 |")
    print("|---|---:|---:|---:|---:|")
    for key, label in (("see", '"What do you see?" (no reading)'), ("read", '"What does the sign say?" (reading)')):
        t = sorted(x["text"] for x in turns[key])
        a = sorted(x["audio"] for x in turns[key])
        p95 = min(len(t) - 1, round(0.95 * (len(t) - 1)))
        print(f"| {label} | {statistics.median(t):.1f} | {t[p95]:.1f} | {statistics.median(a):.1f} | {a[p95]:.1f} |")
    print()
    results = {
        "set": statistics.median(whole["set"]),
        "read": statistics.median(per_model[labels["text"]]),
        "text": statistics.median(x["text"] for x in turns["see"]),
        "text_read": statistics.median(x["text"] for x in turns["read"]),
    }
    names = {
        "set": "per-frame set",
        "read": "reading, per frame",
        "text": "first text, no reading",
        "text_read": "first text, reading",
    }
    ok = True
    for key, value in results.items():
        passed = value <= TARGETS_MS[key]
        ok &= passed
        print(f"- {names[key]} p50 {value:.1f} ms (target ≤ {TARGETS_MS[key]} ms): {'PASS' if passed else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
