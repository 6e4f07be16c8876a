"""Real photos for the perception tests: scikit-image's bundled samples, and signs rendered in DejaVu.

scikit-image ships these photos inside its wheel (no download): ``astronaut`` (a smiling woman,
frontal), ``camera`` (a man behind a camera, half profile), ``coffee``, ``chelsea`` (a cat) and
``rocket``; ``page`` is a scanned page of text. The DejaVu fonts come with matplotlib's wheel.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import cv2
import matplotlib
import numpy as np
from PIL import Image, ImageDraw, ImageFont
from skimage import data

PHOTOS = ("astronaut", "camera", "coffee", "chelsea", "rocket")
WITHOUT_PEOPLE = ("coffee", "chelsea", "rocket")
FONTS = Path(matplotlib.get_data_path()) / "fonts" / "ttf"


@cache
def photo(name: str) -> np.ndarray:
    """A sample photo as a BGR uint8 array (grey ones as three channels)."""
    img = getattr(data, name)()
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    return np.ascontiguousarray(img[..., :3][..., ::-1])


def jpeg(img: np.ndarray, quality: int = 90) -> bytes:
    ok, out = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return out.tobytes()


def sign(lines: tuple[str, ...] = ("EXIT", "Platform 3"), tilt: float = 0.0) -> np.ndarray:
    """A green sign with white lettering on a textured wall, 640 x 480, BGR; optionally tilted."""
    rng = np.random.default_rng(3)
    wall = (np.full((480, 640, 3), (150, 145, 140), np.float32) + rng.normal(0, 8, (480, 640, 3))).clip(0, 255)
    img = Image.fromarray(wall.astype(np.uint8))
    draw = ImageDraw.Draw(img)
    draw.rounded_rectangle((110, 140, 530, 340), radius=14, fill=(25, 120, 45))
    bold = ImageFont.truetype(str(FONTS / "DejaVuSans-Bold.ttf"), 70)
    plain = ImageFont.truetype(str(FONTS / "DejaVuSans.ttf"), 44)
    draw.text((320, 195), lines[0], font=bold, fill="white", anchor="mm")
    for i, line in enumerate(lines[1:]):
        draw.text((320, 275 + 50 * i), line, font=plain, fill="white", anchor="mm")
    out = np.ascontiguousarray(np.asarray(img)[..., ::-1])
    if tilt:
        m = cv2.getRotationMatrix2D((320, 240), tilt, 1.0)
        out = cv2.warpAffine(out, m, (640, 480), borderMode=cv2.BORDER_REPLICATE)
    return out
