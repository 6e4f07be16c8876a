"""Pose: MediaPipe Pose (one person, 33 landmarks) read as arms raised, leaning, standing or sitting.

Only ``model_complexity=1`` ships in the wheel; the other complexities download a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._mediapipe import solutions
from .types import Body, Face

MIN_VISIBILITY = 0.5  # a landmark less visible than this is treated as out of view
LEG_VISIBILITY = 0.8  # knees and ankles: the model guesses legs below a portrait at 0.55-0.71
LEAN_DEGREES = 12.0  # the torso this far from vertical is leaning
NOSE, L_SHOULDER, R_SHOULDER, L_WRIST, R_WRIST = 0, 11, 12, 15, 16
L_HIP, R_HIP, L_KNEE, R_KNEE, L_ANKLE, R_ANKLE = 23, 24, 25, 26, 27, 28


def load() -> Any:
    return solutions().pose.Pose(static_image_mode=True, model_complexity=1, min_detection_confidence=0.5)


def detect(model: Any, rgb: np.ndarray, faces: Sequence[Face] = ()) -> Body | None:
    """The body of the person with the largest face, or of whoever is in view when no face is.

    With a face, the model looks at the region around and below it (three face widths each side,
    six face heights down): the pose detector misses people who fill little of the frame, and one
    pass per frame keeps the cost bounded. Without a face (or when that region is nearly the whole
    frame) it looks at the whole frame.
    """
    h, w = rgb.shape[:2]
    x0, y0, x1, y1 = 0, 0, w, h
    if faces:
        face = max(faces, key=lambda f: f.width)
        fw, fh = face.width * w, max(face.height * h, face.width * w)
        cx0, cx1 = int(max(0, face.cx * w - 3 * fw)), int(min(w, face.cx * w + 3 * fw))
        cy0, cy1 = int(max(0, face.cy * h - 1.5 * fh)), int(min(h, face.cy * h + 6 * fh))
        if (cx1 - cx0) * (cy1 - cy0) < 0.8 * w * h:
            x0, y0, x1, y1 = cx0, cy0, cx1, cy1
    result = model.process(np.ascontiguousarray(rgb[y0:y1, x0:x1])).pose_landmarks
    if result is None:
        return None
    cw, ch = x1 - x0, y1 - y0
    # Back to whole-frame coordinates, x in height units so that angles are true.
    points = [((x0 + lm.x * cw) / h, (y0 + lm.y * ch) / h, lm.visibility) for lm in result.landmark]
    return read_pose(points, aspect=w / h)


def read_pose(points: Sequence[tuple[float, float, float]], aspect: float) -> Body | None:
    """Posture from landmarks ``(x, y, visibility)`` with x scaled by the frame's aspect (x / aspect is 0..1).

    Pure, so the rules are tested on landmark sets without a photo.
    """

    def seen(i: int) -> bool:
        """Visible, and inside the frame: the model also guesses landmarks beyond the edges."""
        x, y, visibility = points[i]
        needed = LEG_VISIBILITY if i in (L_KNEE, R_KNEE, L_ANKLE, R_ANKLE) else MIN_VISIBILITY
        return visibility >= needed and 0.0 <= x <= aspect and 0.0 <= y <= 1.0

    if not (seen(L_SHOULDER) or seen(R_SHOULDER)):
        return None  # a pose without shoulders in view is not a body we can read
    shoulders = [points[i] for i in (L_SHOULDER, R_SHOULDER) if seen(i)]
    sx = sum(p[0] for p in shoulders) / len(shoulders)
    sy = sum(p[1] for p in shoulders) / len(shoulders)
    raised, above_head = [], []
    for side, shoulder, wrist in (("left", L_SHOULDER, L_WRIST), ("right", R_SHOULDER, R_WRIST)):
        if seen(shoulder) and seen(wrist) and points[wrist][1] < points[shoulder][1]:
            raised.append(side)
            if seen(NOSE) and points[wrist][1] < points[NOSE][1] - 0.5 * (points[shoulder][1] - points[NOSE][1]):
                above_head.append(side)
    leaning = None
    posture = None
    if seen(L_HIP) and seen(R_HIP) and seen(L_SHOULDER) and seen(R_SHOULDER):
        hx = (points[L_HIP][0] + points[R_HIP][0]) / 2
        hy = (points[L_HIP][1] + points[R_HIP][1]) / 2
        angle = math.degrees(math.atan2(sx - hx, hy - sy))
        if abs(angle) >= LEAN_DEGREES:
            leaning = "left" if angle < 0 else "right"
        posture = _posture(points, seen)
    return Body(
        cx=sx / aspect,
        cy=sy,
        raised=tuple(raised),
        above_head=tuple(above_head),
        leaning=leaning,
        posture=posture,
    )


def _posture(points: Sequence[tuple[float, float, float]], seen: Any) -> str | None:
    """Standing: straight legs under the hips; sitting: thighs near horizontal or knees bent sharply."""
    verdicts = []
    for hip, knee, ankle in ((L_HIP, L_KNEE, L_ANKLE), (R_HIP, R_KNEE, R_ANKLE)):
        if not (seen(hip) and seen(knee)):
            continue
        (hx, hy, _), (kx, ky, _) = points[hip], points[knee]
        thigh_down = ky - hy
        if abs(kx - hx) > thigh_down:  # thigh closer to horizontal than vertical
            verdicts.append("sitting")
            continue
        if not seen(ankle):
            continue
        ax, ay, _ = points[ankle]
        knee_angle = _angle((hx, hy), (kx, ky), (ax, ay))
        if knee_angle >= 150:
            verdicts.append("standing")
        elif knee_angle <= 120:
            verdicts.append("sitting")
    if verdicts and all(v == verdicts[0] for v in verdicts):
        return verdicts[0]
    return None


def _angle(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    """The angle at ``b`` in degrees."""
    v1 = (a[0] - b[0], a[1] - b[1])
    v2 = (c[0] - b[0], c[1] - b[1])
    n = math.hypot(*v1) * math.hypot(*v2)
    if n == 0:
        return 180.0
    cos = max(-1.0, min(1.0, (v1[0] * v2[0] + v1[1] * v2[1]) / n))
    return math.degrees(math.acos(cos))
