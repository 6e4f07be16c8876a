"""The perception models load and run with the network blocked, and load only where the engine runs.

Each check runs in a fresh interpreter, so nothing loaded by another test hides a download or an
import: a broken wheel (a missing dependency, a protobuf it cannot use) fails here by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNTIMES = ("mediapipe", "rapidocr", "ai_edge_litert", "efficientnet_lite_pytorch", "onnxruntime", "torch")

OFFLINE = """
import socket, sys
attempts = []

def refuse(*args, **kwargs):
    attempts.append(args)
    raise OSError("network blocked by the test")

socket.socket.connect = socket.socket.connect_ex = refuse
socket.create_connection = socket.getaddrinfo = refuse
sys.path.insert(0, "tests")
from support.photos import photo, sign
from video.engine.perception import Perception

models = Perception()
for img in (photo("astronaut"), photo("coffee"), sign()):
    seen = models.observe(img, read=True)
print(len(models.observe(photo("astronaut")).faces), [t.text for t in seen.text])
assert not attempts, attempts
"""

WEB = """
import sys, django
django.setup()
import omniweb.asgi  # the daphne process's application, with its routes and consumers
loaded = sorted(name for name in {names} if name in sys.modules)
assert not loaded, f"the web process imported {{loaded}}"
print("ok")
"""


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings", **env}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True, timeout=600, check=False
    )


def test_every_model_loads_and_runs_without_the_network(tmp_path):
    done = _run(OFFLINE, XDG_CACHE_HOME=str(tmp_path))  # an empty cache: the classifier's export runs too
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "1 ['EXIT', 'Platform 3']"


def test_web_processes_in_redis_mode_load_no_model_runtime():
    done = _run(WEB.format(names=RUNTIMES[:4]), OMNIWEB_REDIS_URL="redis://127.0.0.1:1/0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_a_missing_model_package_is_a_start_up_error_naming_it():
    code = (
        "import sys; sys.modules['rapidocr'] = None\n"
        "from video.engine.perception import ModelLoadError, Perception\n"
        "try:\n    Perception()\nexcept ModelLoadError as exc:\n    print(exc)\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("the rapidocr package failed to load its model")


def test_the_classifier_is_exported_once_and_later_starts_skip_torch(tmp_path):
    code = (
        "import sys\nfrom video.engine.perception import objects\n"
        "objects.load()\nprint(sorted(p.name for p in objects.cache_dir().iterdir()), 'torch' in sys.modules)\n"
    )
    first = _run(code, XDG_CACHE_HOME=str(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    second = _run(code, XDG_CACHE_HOME=str(tmp_path))
    assert second.returncode == 0, second.stderr[-3000:]
    (name,) = list((tmp_path / "omniweb").iterdir())
    assert name.name.startswith("efficientnet-lite0-") and name.suffix == ".onnx"
    assert first.stdout.strip().endswith("True")  # exported with torch
    assert second.stdout.strip() == f"['{name.name}'] False"  # loaded from the cache, torch never imported
