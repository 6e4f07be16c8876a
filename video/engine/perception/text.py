"""Text: RapidOCR (PP-OCR detection + recognition, ONNX models inside the wheel), run on demand.

Only the bundled default models are used: another language, model type or OCR version downloads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .types import TextLine

MIN_SCORE = 0.9  # photos without text give hits like "8" or "0000" at 0.73-0.89
MIN_CHARS = 2
READ_SIDE = 640  # the longer side is scaled to at most this before detection


def load() -> Any:
    from rapidocr import RapidOCR

    return RapidOCR(
        params={
            "Global.log_level": "error",
            "Global.use_cls": False,  # camera text is upright; the direction classifier doubles the cost
            "Det.limit_type": "max",
            "Det.limit_side_len": READ_SIDE,
            # One thread: the worker pool is the parallelism (two threads were slower on a busy machine).
            "EngineConfig.onnxruntime.intra_op_num_threads": 1,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
    )


def read(engine: Any, bgr: np.ndarray) -> tuple[TextLine, ...]:
    """The lines read, in reading order (top to bottom, then left to right within a row)."""
    result = engine(np.ascontiguousarray(bgr))
    if result.boxes is None or not result.txts:
        return ()
    h, w = bgr.shape[:2]
    lines = []
    for box, text, score in zip(result.boxes, result.txts, result.scores, strict=True):
        text = " ".join(str(text).split())
        if score < MIN_SCORE or sum(ch.isalnum() for ch in text) < MIN_CHARS:
            continue
        box = np.asarray(box, np.float32)
        height = float(box[:, 1].max() - box[:, 1].min()) / h
        lines.append((TextLine(text, float(score), float(box[:, 0].mean()) / w, float(box[:, 1].mean()) / h), height))
    return tuple(line for line, _ in _reading_order(lines))


def _reading_order(lines: list[tuple[TextLine, float]]) -> list[tuple[TextLine, float]]:
    """Rows by vertical position (lines whose centres are within half a line height share a row)."""
    rows: list[list[tuple[TextLine, float]]] = []
    for item in sorted(lines, key=lambda item: item[0].cy):
        if rows and abs(item[0].cy - rows[-1][0][0].cy) < 0.5 * max(item[1], rows[-1][0][1]):
            rows[-1].append(item)
        else:
            rows.append([item])
    return [item for row in rows for item in sorted(row, key=lambda item: item[0].cx)]
