"""Measurements over a turn's sampled frames: what the scene thinker is allowed to talk about.

Everything here is measured with OpenCV and numpy on the frames themselves: faces (the frontal-face
Haar cascade that ships in the opencv wheel) and where they are, the colours that cover the picture
named in plain words, brightness and sharpness, and what changed or moved between the frames.
No model guesses what objects are, so nothing here claims to know.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import cv2
import numpy as np

ANALYSIS_WIDTH = 320  # faces are searched at this width (a face must be >= ~40 px wide in a 640 px frame)
THUMB_SIZE = (80, 60)  # colours and motion are measured on thumbnails this size
MAX_ANALYSED_FRAMES = 8  # more sampled frames than this: evenly spaced ones, always with the last
CASCADE = "haarcascade_frontalface_alt2.xml"  # fewest false faces of the shipped frontal cascades
MIN_FACE_PX = 20
MOTION_PIXEL_DELTA = 30  # levels (0-255) a thumbnail pixel's colour channel must change by to count as changed
MIN_COLOUR_SHARE = 0.01  # colours covering less of the picture are not measured at all


@dataclass(frozen=True)
class Face:
    """A detected face; coordinates are fractions of the frame (0..1)."""

    cx: float
    cy: float
    width: float

    @property
    def side(self) -> str:
        return horizontal(self.cx)

    @property
    def distance(self) -> str:
        """How far from the camera, by the face's share of the frame width.

        With a typical webcam (about 60 degrees across) a face box fills a quarter of the width at
        roughly 0.6 m and an eighth at roughly 1.3 m.
        """
        if self.width >= 0.25:
            return "close"
        if self.width >= 0.12:
            return "middle"
        return "far"


@dataclass(frozen=True)
class ColourShare:
    name: str
    share: float  # fraction of the picture
    where: str | None  # "left" / "centre" / "right" when the colour sits mostly there


@dataclass(frozen=True)
class FrameStats:
    brightness: float  # mean luma, 0 (black) .. 255 (white)
    sharpness: float  # variance of the Laplacian at analysis width (low: blurred or featureless)
    colours: tuple[ColourShare, ...]  # largest share first
    centre_colours: tuple[ColourShare, ...]  # the middle third of the picture only
    faces: tuple[Face, ...]  # left to right


@dataclass(frozen=True)
class Motion:
    """What changed from the first analysed frame to the last."""

    changed: float  # fraction of the picture that changed between the first and the last frame (light levelled)
    region: str | None  # where the change is ("left", "centre", "right"), None when spread out
    direction: str | None  # "left", "right", "up", "down": a moving thing's path across the frames
    view_shift: str | None  # the whole picture moved this way ("left", "right", "up", "down"): the camera turned
    brightness_change: float  # last minus first mean luma
    span_ms: float | None  # time between the first and the last frame, when the client gave pts


@dataclass(frozen=True)
class Scene:
    now: FrameStats | None  # the last frame; None when no frame could be read
    before: FrameStats | None  # the first frame, when there are two or more
    motion: Motion | None  # None with fewer than two frames
    received: int  # frames in the request
    unreadable: int  # frames that did not decode (the transport should never send one)


def horizontal(x: float) -> str:
    return "left" if x < 1 / 3 else "right" if x > 2 / 3 else "centre"


@cache
def _face_cascade() -> cv2.CascadeClassifier:
    cascade = cv2.CascadeClassifier(cv2.data.haarcascades + CASCADE)
    if cascade.empty():
        raise RuntimeError(f"OpenCV's {CASCADE} did not load")
    return cascade


def warm_up() -> None:
    """Load the cascade and run every measurement once (first calls are slower)."""
    img = np.full((240, 320, 3), 128, np.uint8)
    ok, data = cv2.imencode(".jpg", img)
    assert ok
    analyse([data.tobytes(), data.tobytes()])


def pick(n: int, limit: int = MAX_ANALYSED_FRAMES) -> list[int]:
    """Indices of at most ``limit`` of ``n`` frames, evenly spaced, first and last included."""
    if n <= limit:
        return list(range(n))
    return sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})


def analyse(frames: Sequence[bytes], pts_ms: Sequence[float | None] | None = None) -> Scene:
    """Decode and measure the frames (oldest first).

    Every analysed frame gives a thumbnail for the motion measures; the full measures (faces are
    the costly part) are taken on the first and the last frame only: "now" and "before".
    """
    images: list[np.ndarray] = []
    kept_pts: list[float | None] = []
    unreadable = 0
    for i in pick(len(frames)):
        img = cv2.imdecode(np.frombuffer(frames[i], np.uint8), cv2.IMREAD_COLOR)
        if img is None or img.size == 0:
            unreadable += 1
            continue
        images.append(_resize_to_width(img, ANALYSIS_WIDTH))
        kept_pts.append(pts_ms[i] if pts_ms is not None and i < len(pts_ms) else None)
    thumbs = [cv2.resize(img, THUMB_SIZE, interpolation=cv2.INTER_AREA) for img in images]
    return Scene(
        now=measure(images[-1], thumbs[-1]) if images else None,
        before=measure(images[0], thumbs[0]) if len(images) >= 2 else None,
        motion=measure_motion(thumbs, kept_pts) if len(thumbs) >= 2 else None,
        received=len(frames),
        unreadable=unreadable,
    )


def measure(img: np.ndarray, thumb: np.ndarray) -> FrameStats:
    gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    third = THUMB_SIZE[0] // 3
    return FrameStats(
        brightness=float(cv2.cvtColor(thumb, cv2.COLOR_BGR2GRAY).mean()),
        sharpness=float(cv2.Laplacian(gray, cv2.CV_32F).var()),
        colours=name_colours(thumb),
        centre_colours=name_colours(thumb[:, third : 2 * third], locate=False),
        faces=find_faces(gray),
    )


def _resize_to_width(img: np.ndarray, width: int) -> np.ndarray:
    h, w = img.shape[:2]
    if w <= width:
        return img
    return cv2.resize(img, (width, max(1, round(h * width / w))), interpolation=cv2.INTER_AREA)


def find_faces(gray: np.ndarray) -> tuple[Face, ...]:
    """Frontal faces, left to right, as fractions of the frame."""
    h, w = gray.shape[:2]
    found = _face_cascade().detectMultiScale(gray, scaleFactor=1.1, minNeighbors=4, minSize=(MIN_FACE_PX, MIN_FACE_PX))
    faces = [Face(cx=(x + fw / 2) / w, cy=(y + fh / 2) / h, width=fw / w) for x, y, fw, fh in found]
    return tuple(sorted(faces, key=lambda f: f.cx))


# Hue bands on OpenCV's 0-179 hue scale, for saturated pixels.
_HUES = (
    (8, "red"),
    (21, "orange"),
    (34, "yellow"),
    (78, "green"),
    (99, "teal"),
    (131, "blue"),
    (158, "purple"),
    (170, "pink"),
    (180, "red"),
)


def colour_names(hsv: np.ndarray) -> np.ndarray:
    """A plain colour word for every pixel of an HSV image (OpenCV scales: H 0-179, S/V 0-255)."""
    h = hsv[..., 0].astype(np.int32)
    s = hsv[..., 1].astype(np.int32)
    v = hsv[..., 2].astype(np.int32)
    edges = np.array([edge for edge, _ in _HUES])
    names = np.array([name for _, name in _HUES], dtype=object)[np.searchsorted(edges, h, side="right")]
    orange = (h >= 8) & (h < 21)
    red = (h < 8) | (h >= 170)
    names[orange & (v < 150)] = "brown"
    names[orange & (s < 110) & (v >= 150)] = "beige"  # skin, sand, light wood
    names[red & (s < 110) & (v >= 150)] = "pink"
    names[red & (v < 90)] = "brown"
    names[s < 45] = "grey"
    names[(s < 45) & (v > 200)] = "white"
    names[v < 50] = "black"
    return names


def name_colours(bgr: np.ndarray, locate: bool = True) -> tuple[ColourShare, ...]:
    """The colours covering at least ``MIN_COLOUR_SHARE`` of the picture, largest first, with where they sit."""
    names = colour_names(cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV))
    total = names.size
    xs = np.broadcast_to(np.arange(names.shape[1]) / max(1, names.shape[1] - 1), names.shape)
    out = []
    values, counts = np.unique(names, return_counts=True)
    for name, count in sorted(zip(values, counts, strict=True), key=lambda vc: -vc[1]):
        share = count / total
        if share < MIN_COLOUR_SHARE:
            break
        col = xs[names == name]
        # Say where only when the colour is concentrated on one side (its x spread is narrow).
        where = horizontal(float(col.mean())) if locate and share < 0.5 and col.std() < 0.2 else None
        out.append(ColourShare(str(name), float(share), where))
    return tuple(out)


def measure_motion(thumbs: Sequence[np.ndarray], pts_ms: Sequence[float | None]) -> Motion:
    """Compare thumbnails: how much changed, where, which way a moving thing went, camera shifts.

    A pixel counts as changed when any colour channel moved by ``MOTION_PIXEL_DELTA``: a red thing
    on a green wall can have the wall's brightness, so grey levels alone would miss it. Frames are
    first scaled to the first frame's mean level, so the lights (or auto-exposure) going up or down
    is reported as a brightness change, not as the whole picture changing.
    """
    colour = [cv2.GaussianBlur(t, (5, 5), 0).astype(np.float32) for t in thumbs]
    level = float(colour[0].mean())
    levelled = [c * (level / max(1.0, float(c.mean()))) for c in colour]
    changed_mask = _differs(levelled[-1], levelled[0])
    changed = float(changed_mask.mean())
    grey_first, grey_last = (cv2.cvtColor(c, cv2.COLOR_BGR2GRAY) for c in (colour[0], colour[-1]))
    return Motion(
        changed=changed,
        region=_region(changed_mask),
        direction=_path(levelled) if len(levelled) >= 3 else None,
        view_shift=_view_shift(levelled[0], levelled[-1]) if changed > 0.02 else None,
        brightness_change=float(grey_last.mean() - grey_first.mean()),
        span_ms=None if pts_ms[0] is None or pts_ms[-1] is None else float(pts_ms[-1]) - float(pts_ms[0]),
    )


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b).max(axis=2) > MOTION_PIXEL_DELTA


def _region(mask: np.ndarray) -> str | None:
    xs = np.nonzero(mask)[1]
    if xs.size == 0:
        return None
    x = xs / max(1, mask.shape[1] - 1)
    return horizontal(float(x.mean())) if x.std() < 0.22 else None


def _path(frames: Sequence[np.ndarray]) -> str | None:
    """Direction of a moving thing: the centroid of where each frame differs from the background.

    The per-pixel median over the frames is the background when the thing keeps moving; each
    frame's difference from it is the thing itself in that frame.
    """
    background = np.median(np.stack(frames), axis=0)
    centres = []
    for f in frames:
        g = _differs(f, background)
        ys, xs = np.nonzero(g)
        if xs.size < 0.002 * g.size:
            return None  # the thing is not visible in every frame: no path to follow
        centres.append((xs.mean() / g.shape[1], ys.mean() / g.shape[0]))
    dx = centres[-1][0] - centres[0][0]
    dy = centres[-1][1] - centres[0][1]
    if max(abs(dx), abs(dy)) < 0.08:
        return None
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


def _view_shift(first: np.ndarray, last: np.ndarray) -> str | None:
    """Which way the whole picture moved (the camera turned the other way).

    Phase correlation finds the dominant shift; it counts as the camera only when moving the first
    frame by it explains most of the change (a person walking across a plain wall also produces a
    strong shift, but aligning the whole picture to it leaves the rest of the room mismatched).
    """
    grey_first, grey_last = (cv2.cvtColor(c, cv2.COLOR_BGR2GRAY) for c in (first, last))
    window = cv2.createHanningWindow(grey_first.shape[::-1], cv2.CV_32F)
    (dx, dy), response = cv2.phaseCorrelate(grey_first, grey_last, window)
    h, w = grey_first.shape
    if response < 0.3 or max(abs(dx) / w, abs(dy) / h) < 0.04:
        return None
    moved = cv2.warpAffine(first, np.float32([[1, 0, dx], [0, 1, dy]]), (w, h), borderMode=cv2.BORDER_REPLICATE)
    inner = (slice(h // 8, h - h // 8), slice(w // 8, w - w // 8))  # away from the edges the shift uncovers
    before = _differs(last, first)[inner].mean()
    after = _differs(last, moved)[inner].mean()
    if after > 0.3 * before:
        return None
    if abs(dx) / w >= abs(dy) / h:
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"
