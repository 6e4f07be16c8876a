"""Logs: times in UTC whatever the machine's zone, and one line when the models are loaded and ready."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_log_times_are_utc_whatever_the_zone():
    """A process in a zone far from UTC still logs UTC, marked with a Z."""
    script = (
        "import logging, logging.config, django; django.setup();"
        "from django.conf import settings;"
        "r = logging.LogRecord('x', logging.INFO, 'f', 1, 'hello', None, None); r.created = 0.0; r.msecs = 0;"
        "print(logging.getLogger().handlers[0].formatter.format(r))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings", "TZ": "Pacific/Kiritimati"}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1970-01-01T00:00:00.000Z INFO x: hello"


def test_one_line_says_the_models_are_loaded_and_the_engine_ready(caplog):
    from omniweb.engine import runtime

    runtime.shutdown()
    try:
        with caplog.at_level(logging.INFO, logger="omniweb.engine.runtime"):
            runtime.get_scheduler()
            runtime.get_scheduler()  # already up: no second line
        ready = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready: models loaded")]
        assert len(ready) == 1 and "speech.tts" in ready[0], ready
        # The loaded models are out of the collector's reach: a full collection no longer walks
        # them (it stopped every thread ~110 ms under a burst).
        assert gc.get_freeze_count() > 0
    finally:
        runtime.shutdown()


async def test_a_requests_log_lines_carry_its_request_id():
    """Every line logged while a request is served names its X-Request-Id (here Django's 'Not Found')."""
    from django.conf import settings
    from django.test import AsyncClient

    from omniweb.web import logs

    lines: list[str] = []
    handler = logging.Handler()
    handler.setFormatter(logs.UTCFormatter(settings.LOGGING["formatters"]["plain"]["fmt"]))
    handler.emit = lambda record: lines.append(handler.format(record))  # type: ignore[method-assign]
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        response = await AsyncClient().get("/no-such-page", headers={"X-Request-Id": "trace-42"})
        generated = await AsyncClient().get("/no-such-page")
    finally:
        logger.removeHandler(handler)
    assert response.status_code == 404 and response["X-Request-Id"] == "trace-42"
    assert generated["X-Request-Id"].startswith("req_")
    assert [line.split(" ", 2)[2] for line in lines] == [
        "django.request [trace-42]: Not Found: /no-such-page",
        f"django.request [{generated['X-Request-Id']}]: Not Found: /no-such-page",
    ]
