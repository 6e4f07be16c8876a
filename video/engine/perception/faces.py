"""Faces: MediaPipe's full-range face detector (frontal and half profile, up to ~5 m)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._mediapipe import solutions
from .types import Face

MIN_SCORE = 0.6  # below this the detector's hits on photos without people start to appear


def load() -> Any:
    return solutions().face_detection.FaceDetection(model_selection=1, min_detection_confidence=MIN_SCORE)


def detect(model: Any, rgb: np.ndarray) -> tuple[Face, ...]:
    """Faces left to right; boxes are clipped to the frame."""
    found = model.process(rgb).detections or []
    faces = []
    for d in found:
        box = d.location_data.relative_bounding_box
        x0, y0 = max(0.0, box.xmin), max(0.0, box.ymin)
        x1, y1 = min(1.0, box.xmin + box.width), min(1.0, box.ymin + box.height)
        if x1 <= x0 or y1 <= y0:
            continue
        faces.append(Face(cx=(x0 + x1) / 2, cy=(y0 + y1) / 2, width=x1 - x0, height=y1 - y0, score=float(d.score[0])))
    return tuple(sorted(faces, key=lambda f: f.cx))
