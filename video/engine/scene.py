"""Measurements over a turn's sampled frames: what the scene thinker is allowed to talk about.

The perception models (``video.engine.perception``: faces, pose, hands, expression, the main
object, text on demand) look at the last frame, and faces and pose at the first one too, so a
change in who is there is told from counts; OpenCV and numpy measure the rest on the frames
themselves: the colours named in plain words and where each sits, the light, sharpness, and what
changed or moved between the frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np

from omniweb.media.frames import FrameError, decode_picture

from .perception import MODELS, PEOPLE_MODELS, Observations, Perception
from .perception.types import Face, horizontal, vertical

__all__ = ["Face", "FrameStats", "Motion", "Scene", "analyse", "horizontal"]

THUMB_SIZE = (80, 60)  # colours and motion are measured on thumbnails this size
REGION_SIZE = (160, 120)  # coloured regions are located at this size
MAX_ANALYSED_FRAMES = 8  # more sampled frames than this: evenly spaced ones, always with the last
MOTION_PIXEL_DELTA = 30  # levels (0-255) a thumbnail pixel's colour channel must change by to count as changed
MIN_COLOUR_SHARE = 0.01  # colours covering less of the picture are not listed in its colours
MIN_REGION_SHARE = 0.003  # a coloured patch this big (a ball across a room) is located when asked about


@dataclass(frozen=True)
class ColourShare:
    name: str
    share: float  # fraction of the picture
    where: str | None  # "left" / "centre" / "right" when the colour sits mostly there


@dataclass(frozen=True)
class ColourRegion:
    """The largest patch of one colour; coordinates are fractions of the frame."""

    name: str
    share: float  # of the whole picture, all patches of the colour together
    cx: float
    cy: float
    width: float
    height: float

    @property
    def where(self) -> str:
        v, h = vertical(self.cy), horizontal(self.cx)
        if v == "middle":
            return "in the centre" if h == "centre" else f"on the {h}"
        return f"at the {v}" if h == "centre" else f"at the {v} {h}"

    def contains(self, x: float, y: float, margin: float = 0.0) -> bool:
        return abs(x - self.cx) <= self.width / 2 + margin and abs(y - self.cy) <= self.height / 2 + margin


@dataclass(frozen=True)
class FrameStats:
    brightness: float  # mean HSV value (the brightest channel), 0 (black) .. 255: how lit, whatever the hue
    sharpness: float  # variance of the Laplacian at analysis width (low: blurred or featureless)
    colours: tuple[ColourShare, ...]  # largest share first
    centre_colours: tuple[ColourShare, ...]  # the middle third of the picture only
    seen: Observations = field(default_factory=Observations)  # what the perception models found
    regions: dict[str, ColourRegion] = field(default_factory=dict)  # colour name -> its largest patch
    luma: float | None = None  # mean luma, when measured (brightness changes are told from it)

    @property
    def faces(self) -> tuple[Face, ...]:
        return self.seen.faces


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


def warm_up(perception: Perception) -> None:
    """Run every measurement once (first calls are slower)."""
    img = np.full((240, 320, 3), 128, np.uint8)
    ok, data = cv2.imencode(".jpg", img)
    assert ok
    analyse([data.tobytes(), data.tobytes()], perception=perception, read=True)


def pick(n: int, limit: int = MAX_ANALYSED_FRAMES) -> list[int]:
    """Indices of at most ``limit`` of ``n`` frames, evenly spaced, first and last included."""
    if n <= limit:
        return list(range(n))
    return sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})


def analyse(
    frames: Sequence[bytes],
    pts_ms: Sequence[float | None] | None = None,
    *,
    perception: Perception | None = None,
    models: frozenset[str] = MODELS,
    read: bool = False,
) -> Scene:
    """Decode and measure the frames (oldest first).

    Every analysed frame gives a thumbnail for the motion measures; the named ``models`` run on the
    last frame ("now"; the text reader only when ``read``), and those of them that count people on
    the first ("before"). Without ``perception`` only the OpenCV measures are taken.
    """
    images: list[np.ndarray] = []
    kept_pts: list[float | None] = []
    unreadable = 0
    for i in pick(len(frames)):
        try:  # at the analysis width (omniweb.media.frames.PICTURE_WIDTH), a large JPEG at a reduced DCT scale
            images.append(decode_picture(frames[i]))
        except FrameError:
            unreadable += 1
            continue
        kept_pts.append(pts_ms[i] if pts_ms is not None and i < len(pts_ms) else None)
    thumbs = [cv2.resize(img, THUMB_SIZE, interpolation=cv2.INTER_AREA) for img in images]
    return Scene(
        now=measure(images[-1], thumbs[-1], perception, models, read=read) if images else None,
        before=measure(images[0], thumbs[0], perception, models & PEOPLE_MODELS) if len(images) >= 2 else None,
        motion=measure_motion(thumbs, kept_pts) if len(thumbs) >= 2 else None,
        received=len(frames),
        unreadable=unreadable,
    )


def measure(
    img: np.ndarray, thumb: np.ndarray, perception: Perception | None, models: frozenset[str], *, read: bool = False
) -> FrameStats:
    gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    small = _resize_to_width(gray, 320)  # sharpness at a fixed scale, whatever the frame size
    third = THUMB_SIZE[0] // 3
    if perception is not None and (models or read):
        seen = perception.observe(img, models=models, read=read)
    else:
        seen = Observations()
    return FrameStats(
        brightness=float(cv2.cvtColor(thumb, cv2.COLOR_BGR2HSV)[..., 2].mean()),
        sharpness=float(cv2.Laplacian(small, cv2.CV_32F).var()),
        colours=name_colours(thumb),
        centre_colours=name_colours(thumb[:, third : 2 * third], locate=False),
        seen=seen,
        regions=colour_regions(cv2.resize(img, REGION_SIZE, interpolation=cv2.INTER_AREA)),
        luma=float(cv2.cvtColor(thumb, cv2.COLOR_BGR2GRAY).mean()),
    )


def _resize_to_width(img: np.ndarray, width: int) -> np.ndarray:
    h, w = img.shape[:2]
    if w <= width:
        return img
    return cv2.resize(img, (width, max(1, round(h * width / w))), interpolation=cv2.INTER_AREA)


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
    names = colour_names(cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV)).astype("U6")
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


def colour_regions(bgr: np.ndarray) -> dict[str, ColourRegion]:
    """For each colour covering at least ``MIN_REGION_SHARE``: its largest connected patch and total share."""
    names = colour_names(cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV)).astype("U6")  # fixed-width: a C sort, not Python's
    h, w = names.shape
    out: dict[str, ColourRegion] = {}
    for name in np.unique(names):
        mask = (names == name).astype(np.uint8)
        share = float(mask.mean())
        if share < MIN_REGION_SHARE:
            continue
        mask = cv2.morphologyEx(mask, cv2.MORPH_OPEN, np.ones((2, 2), np.uint8))  # single stray pixels out
        count, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
        if count < 2:
            continue
        biggest = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
        x, y, bw, bh, area = stats[biggest]
        if area < MIN_REGION_SHARE * h * w:
            continue
        out[str(name)] = ColourRegion(str(name), share, (x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h)
    return out


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
    moved = cv2.warpAffine(
        first, np.array([[1, 0, dx], [0, 1, dy]], np.float32), (w, h), borderMode=cv2.BORDER_REPLICATE
    )
    inner = (slice(h // 8, h - h // 8), slice(w // 8, w - w // 8))  # away from the edges the shift uncovers
    before = _differs(last, first)[inner].mean()
    after = _differs(last, moved)[inner].mean()
    if after > 0.3 * before:
        return None
    if abs(dx) / w >= abs(dy) / h:
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"
