#!/usr/bin/env python
"""CPU per video frame spent decoding it: the branch point's steps against today's, side by side.

Before (issue #11's branch point): the ack path decoded the filter thumbnail (reduced DCT scale),
the session's decoder task then decoded every frame in full only to check that it decodes, and the
engine decoded each frame it analyses in full again and scaled it to the analysis width. Now: the
thumbnail decode is the check (no second decode), without the filter the check is one 1/8-scale
decode, and the engine decodes its frames at a reduced DCT scale when they are at least twice the
analysis width (omniweb/media/frames.py). Both columns are measured in this one run, on the same frames.

    python bench/frame_decode.py            # 640x480 and 1280x720 camera-like JPEGs
    python bench/frame_decode.py --repeat 200
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")

from omniweb.media import frames  # after the path is set


def camera_frame(width: int, height: int, seed: int) -> bytes:
    """A JPEG (quality 80) with a camera's texture: smooth shapes, edges and sensor noise."""
    rng = np.random.default_rng(seed)
    img = cv2.GaussianBlur(rng.integers(0, 255, (height // 8, width // 8, 3)).astype(np.uint8), (3, 3), 1)
    img = cv2.resize(img, (width, height), interpolation=cv2.INTER_CUBIC)
    img = np.clip(img.astype(np.int16) + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
    return cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 80])[1].tobytes()


def cpu_ms(repeat: int, fn: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """Median CPU milliseconds of one call (process time, so other load on the machine counts less)."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn(*args, **kwargs)
        times.append(time.process_time() - t0)
    return float(np.median(times)) * 1000.0


def old_full_decode(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)


def old_engine_picture(data: bytes) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    h, w = img.shape[:2]
    if w <= frames.PICTURE_WIDTH:
        return img
    return cv2.resize(img, (frames.PICTURE_WIDTH, round(h * frames.PICTURE_WIDTH / w)), interpolation=cv2.INTER_AREA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (CPU times, medians of {args.repeat} calls)")
    print(
        "frame      | filter | transport before | transport now | engine before | engine now "
        "| buffered frame before/now | analysed frame before/now"
    )
    for width, height in ((640, 480), (1280, 720)):
        data = camera_frame(width, height, seed=width)
        text = base64.b64encode(data).decode()
        header = frames.read_header(data)
        n = args.repeat
        engine_before = cpu_ms(n, old_engine_picture, data)
        engine_now = cpu_ms(n, frames.decode_picture, data)
        for with_filter in (True, False):
            checks = cpu_ms(n, frames.prepare_frame, text, max_pixels=1 << 26, with_thumbnail=False)
            thumb = cpu_ms(n, frames.thumbnail, data, header) if with_filter else 0.0
            full = cpu_ms(n, old_full_decode, data)
            check_now = 0.0 if with_filter else cpu_ms(n, frames.verify_decodes, data)
            before = checks + thumb + full
            now = checks + thumb + check_now
            print(
                f"{f'{width}x{height}':10} | {'on' if with_filter else 'off':6} | {before:13.2f} ms | {now:10.2f} ms "
                f"| {engine_before:10.2f} ms | {engine_now:7.2f} ms "
                f"| {before:.2f} / {now:.2f} ms ({before / now:.2f}x) "
                f"| {before + engine_before:.2f} / {now + engine_now:.2f} ms "
                f"({(before + engine_before) / (now + engine_now):.2f}x)"
            )


if __name__ == "__main__":
    main()
