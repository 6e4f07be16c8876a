"""The core runs without Django: no settings module, nothing configured but what it is given.

Each check runs in a Python process of its own with a clean environment (no
``DJANGO_SETTINGS_MODULE``, nothing imported by pytest's plugins), so an import of Django or a read
of its settings anywhere on the way fails it, and so does a Django or Channels module loaded at all.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("django", "channels", "channels_redis", "asgiref", "daphne")


def run_alone(code: str) -> str:
    """Run ``code`` in a fresh interpreter with only the repository on its path; its stdout."""
    check = f"\nimport sys\nassert not [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}], sys.modules\n"
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + check],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_the_conversation_core_buffers_audio_with_no_django_settings():
    out = run_alone(
        """
        import os
        assert "DJANGO_SETTINGS_MODULE" not in os.environ
        from omniweb.base import budget
        from omniweb.conversation.audio import AudioBuffer

        buffer = AudioBuffer(max_bytes=64_000)
        assert buffer.append(b"\\x01\\x00" * 160) is None  # 10 ms at 16 kHz
        assert len(buffer) == 320 and budget.held() == 320
        budget.configure(400)  # what the wiring does with OMNIWEB_PROCESS_BUFFER_BUDGET
        assert buffer.append(b"\\x00" * 320) == budget.FULL_MESSAGE and budget.held() == 0
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_the_engine_runtime_starts_from_the_config_it_is_given():
    out = run_alone(
        """
        from omniweb.engine import runtime

        try:
            runtime.start_engine()
        except RuntimeError as exc:
            assert "not configured" in str(exc)
        else:
            raise AssertionError("an unconfigured engine started")
        runtime.configure(runtime.EngineConfig(
            workers=1, max_active=4, max_queued=4, max_batch=1, batch_wait=0.0, max_ahead=0.0,
            first_media_budget=0.15, first_media_settle=0.0, admit_budget=0.0, ready_wait=0.0,
        ))
        client = runtime.get_engine_client()  # no remote given: the in-process engine
        assert runtime.wait_loaded(30) and runtime.engine_status()["state"] == "ready"
        assert runtime.local_scheduler() is not None and runtime.loaded_engine_client() is client
        runtime.shutdown()
        print("ok")
        """
    )
    assert out.strip() == "ok"
