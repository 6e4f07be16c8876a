"""Generated pictures for the video engine's tests: a 640x480 canvas, webcam-like softening and
noise, a square moving across a green background, JPEG encoding."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

W, H = 640, 480
GREY = (128, 128, 128)


def jpeg(img: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return data.tobytes()


def canvas(bgr: tuple[int, int, int] = GREY) -> np.ndarray:
    return np.full((H, W, 3), bgr, np.uint8)


def camera_like(img: np.ndarray, seed: int = 0) -> np.ndarray:
    """Soft focus and sensor noise, as a webcam gives."""
    rng = np.random.default_rng(seed)
    soft = cv2.GaussianBlur(img, (0, 0), 2)
    return np.clip(soft + rng.normal(0, 3, soft.shape), 0, 255).astype(np.uint8)


def square_frames(xs: Sequence[int], colour: tuple[int, int, int] = (0, 0, 255)) -> list[bytes]:
    """A square moving across a green background, one frame per x."""
    out = []
    for i, x in enumerate(xs):
        img = canvas((60, 140, 60))
        cv2.rectangle(img, (x, 200), (x + 90, 290), colour, -1)
        out.append(jpeg(camera_like(img, i)))
    return out
