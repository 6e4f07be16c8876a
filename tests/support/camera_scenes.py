"""Camera-like test frames: a room with a person, shot through a noisy sensor and a JPEG encoder.

Used by the frame filter's tests and by ``bench/video_latency.py`` (which measures the filter on the
same pairs): each pair is two consecutive frames a webcam could send, one case per kind of change.
"""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np

WIDTH, HEIGHT = 640, 480


def room(seed: int = 1) -> np.ndarray:
    """A lit wall with texture, a window, a desk, a monitor and a mug (float32 BGR, 0-255)."""
    rng = np.random.default_rng(seed)
    img = np.empty((HEIGHT, WIDTH, 3), np.float32)
    img[:] = np.linspace(150, 200, WIDTH)[None, :, None] * np.array([0.95, 1.0, 1.05])[None, None, :]
    img += cv2.GaussianBlur(rng.normal(0, 12, img.shape).astype(np.float32), (0, 0), 3)
    cv2.rectangle(img, (430, 60), (600, 230), (235, 240, 245), -1)
    cv2.rectangle(img, (0, 330), (640, 480), (60, 80, 110), -1)
    cv2.rectangle(img, (40, 200), (180, 330), (40, 40, 45), -1)
    cv2.rectangle(img, (470, 280), (520, 330), (30, 120, 200), -1)
    return img


def with_person(img: np.ndarray, x: int, y: int, *, arm_deg: float = 0.0, scale: float = 1.0) -> np.ndarray:
    """A person (head, hair, shirt, one arm) whose face centre is at (x, y)."""
    out = img.copy()
    s = scale
    shirt, skin = (140, 70, 40), (120, 160, 215)
    cv2.rectangle(out, (int(x - 60 * s), int(y + 70 * s)), (int(x + 60 * s), int(y + 260 * s)), shirt, -1)
    cv2.ellipse(out, (x, y), (int(40 * s), int(52 * s)), 0, 0, 360, skin, -1)
    cv2.ellipse(out, (x, int(y - 35 * s)), (int(42 * s), int(22 * s)), 0, 180, 360, (30, 30, 40), -1)
    ax, ay = int(x + 60 * s), int(y + 90 * s)
    ex = int(ax + 70 * s * np.cos(np.radians(arm_deg)))
    ey = int(ay - 70 * s * np.sin(np.radians(arm_deg)))
    cv2.line(out, (ax, ay), (ex, ey), shirt, max(1, int(22 * s)))
    cv2.circle(out, (ex, ey), max(1, int(13 * s)), skin, -1)
    return out


def shoot(
    img: np.ndarray,
    rng: np.random.Generator,
    *,
    noise: float = 4.0,
    gain: float = 1.0,
    pan_px: int = 0,
    quality: int = 80,
) -> bytes:
    """The scene through a sensor (read noise plus shot noise), exposure gain and a JPEG encoder."""
    x = img * gain
    if pan_px:
        x = np.roll(x, pan_px, axis=1)
    x = x + rng.normal(0, noise, x.shape) + rng.normal(0, 1, x.shape) * noise * 0.02 * np.sqrt(np.clip(x, 0, 255))
    ok, buf = cv2.imencode(".jpg", np.clip(x, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


Pair = Callable[[np.random.Generator], tuple[bytes, bytes]]


def _pairs() -> dict[str, tuple[bool | None, Pair]]:
    bg = room()
    p0 = with_person(bg, 320, 170)
    far = with_person(bg, 200, 250, scale=0.5)
    return {
        # (a good filter drops it: True, keeps it: False, either: None; the pair)
        "still camera, sensor noise σ4": (True, lambda r: (shoot(p0, r), shoot(p0, r))),
        "still camera, dim room, noise σ12, q60": (
            True,
            lambda r: (shoot(p0 * 0.4, r, noise=12, quality=60), shoot(p0 * 0.4, r, noise=12, quality=60)),
        ),
        "still camera, dark room, noise σ20, q50": (
            True,
            lambda r: (shoot(p0 * 0.2, r, noise=20, quality=50), shoot(p0 * 0.2, r, noise=20, quality=50)),
        ),
        "auto-exposure flicker +2 %": (True, lambda r: (shoot(p0, r), shoot(p0, r, gain=1.02))),
        "person breathing (3 px)": (None, lambda r: (shoot(p0, r), shoot(with_person(bg, 320, 173), r))),
        "far person waves": (
            None,
            lambda r: (shoot(far, r), shoot(with_person(bg, 200, 250, scale=0.5, arm_deg=60), r)),
        ),
        "person raises a hand": (False, lambda r: (shoot(p0, r), shoot(with_person(bg, 320, 170, arm_deg=60), r))),
        "person leans (12 px)": (False, lambda r: (shoot(p0, r), shoot(with_person(bg, 332, 170), r))),
        "far person steps aside (30 px)": (
            False,
            lambda r: (shoot(far, r), shoot(with_person(bg, 230, 250, scale=0.5), r)),
        ),
        "person steps aside (60 px)": (False, lambda r: (shoot(p0, r), shoot(with_person(bg, 380, 170), r))),
        "person leaves the room": (False, lambda r: (shoot(p0, r), shoot(bg, r))),
        "camera pans 20 px": (False, lambda r: (shoot(p0, r), shoot(p0, r, pan_px=20))),
        "lights dimmed 40 %": (False, lambda r: (shoot(p0, r), shoot(p0, r, gain=0.6))),
    }


PAIRS = _pairs()
