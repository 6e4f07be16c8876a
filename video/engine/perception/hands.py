"""Hands: MediaPipe Hands (palm detector + 21 landmarks) read as fingers held up and common gestures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._mediapipe import solutions
from .types import Body, Face, Hand

MAX_HANDS = 4
MIN_SCORE = 0.6
FINGERS = ("thumb", "index", "middle", "ring", "little")
# Landmark indices: 0 wrist; thumb 1-4; then (MCP, PIP, DIP, TIP) for index, middle, ring, little.
_JOINTS = ((5, 6, 7, 8), (9, 10, 11, 12), (13, 14, 15, 16), (17, 18, 19, 20))
STRAIGHT_DEGREES = 150.0  # a finger whose joints are this straight is held up


def load() -> Any:
    return solutions().hands.Hands(
        static_image_mode=True, max_num_hands=MAX_HANDS, model_complexity=1, min_detection_confidence=MIN_SCORE
    )


def detect(model: Any, rgb: np.ndarray, faces: Sequence[Face], body: Body | None) -> tuple[Hand, ...]:
    result = model.process(rgb)
    if not result.multi_hand_landmarks:
        return ()
    h, w = rgb.shape[:2]
    hands = []
    for marks, handedness in zip(result.multi_hand_landmarks, result.multi_handedness, strict=True):
        points = [(lm.x * w / h, lm.y) for lm in marks.landmark]
        # MediaPipe labels hands as if the picture were mirrored (a selfie view); camera frames are
        # not, so its "Left" is the person's right hand.
        label = handedness.classification[0].label.lower()
        which = "right" if label == "left" else "left"
        hands.append(read_hand(points, which, aspect=w / h, faces=faces, body=body))
    return tuple(sorted(hands, key=lambda hand: hand.cx))


def read_hand(
    points: Sequence[tuple[float, float]],
    which: str,
    aspect: float,
    faces: Sequence[Face] = (),
    body: Body | None = None,
) -> Hand:
    """Fingers, gesture and whether the hand is raised, from 21 landmarks ``(x * aspect, y)``.

    Pure, so the rules are tested on landmark sets without a photo.
    """
    up = fingers_up(points)
    wrist_y = points[0][1]
    raised: bool | None = None
    if body is not None:
        raised = wrist_y < body.cy
    elif faces:
        face = min(faces, key=lambda f: abs(f.cx - points[0][0] / aspect))
        raised = wrist_y < face.cy + face.height / 2
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    return Hand(
        cx=(min(xs) + max(xs)) / 2 / aspect,
        cy=(min(ys) + max(ys)) / 2,
        which=which,
        fingers=up,
        gesture=gesture(up, points),
        raised=raised,
    )


def _angle(a: Sequence[float], b: Sequence[float], c: Sequence[float]) -> float:
    v1 = (a[0] - b[0], a[1] - b[1])
    v2 = (c[0] - b[0], c[1] - b[1])
    n = math.hypot(*v1) * math.hypot(*v2)
    if n == 0:
        return 0.0
    return math.degrees(math.acos(max(-1.0, min(1.0, (v1[0] * v2[0] + v1[1] * v2[1]) / n))))


def _dist(a: Sequence[float], b: Sequence[float]) -> float:
    return math.hypot(a[0] - b[0], a[1] - b[1])


def fingers_up(points: Sequence[tuple[float, float]]) -> tuple[str, ...]:
    """The fingers that are straight and point away from the palm."""
    wrist = points[0]
    palm = max(_dist(wrist, points[9]), 1e-6)  # wrist to the middle finger's knuckle
    up = []
    thumb_straight = _angle(points[2], points[3], points[4]) >= STRAIGHT_DEGREES - 10
    thumb_out = _dist(points[4], points[5]) > 0.55 * palm and _dist(points[4], points[17]) > _dist(
        points[3], points[17]
    )
    if thumb_straight and thumb_out:
        up.append("thumb")
    for name, (mcp, pip, _dip, tip) in zip(FINGERS[1:], _JOINTS, strict=True):
        straight = _angle(points[mcp], points[pip], points[tip]) >= STRAIGHT_DEGREES
        if straight and _dist(wrist, points[tip]) > _dist(wrist, points[pip]) * 1.1:
            up.append(name)
    return tuple(up)


def gesture(up: Sequence[str], points: Sequence[tuple[float, float]]) -> str | None:
    """A common gesture the fingers make, or None."""
    palm = max(_dist(points[0], points[9]), 1e-6)
    rest = set(up) - {"thumb"}
    if len(up) == 5:
        return "open palm"
    if not up:
        return "fist"
    if list(up) == ["thumb"]:
        dy = points[4][1] - points[2][1]  # image y grows downwards
        if dy < -0.3 * palm:
            return "thumbs up"
        if dy > 0.3 * palm:
            return "thumbs down"
        return None
    if rest == {"index"}:
        return "pointing"
    if rest == {"index", "middle"}:
        return "victory"
    return None
