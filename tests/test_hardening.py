"""Hardening of the pages and the deployment (issue #11): CSP without inline script, camera and
microphone for the site itself only, and no start with the example secret key outside DEBUG."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", ["/", "/speech/", "/video/"])
def test_pages_carry_a_strict_csp_and_permissions_policy(path):
    response = Client(HTTP_HOST="127.0.0.1").get(path)
    assert response.status_code == 200
    csp = dict(part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))
    assert csp["script-src"] == "'self'" and csp["style-src"] == "'self'"
    assert csp["frame-ancestors"] == "'none'" and csp["object-src"] == "'none'"
    assert "unsafe" not in response["Content-Security-Policy"]
    policy = response["Permissions-Policy"]
    assert "camera=(self)" in policy and "microphone=(self)" in policy


def test_templates_have_no_inline_script_or_style():
    """What the CSP would block: inline <script>, <style>, style="..." and on*="..." attributes."""
    for template in (ROOT / "templates").glob("*.html"):
        html = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", html):
            assert "src=" in tag, f"{template.name}: inline script {tag}"
        assert "<style" not in html, template.name
        assert not re.search(r"\sstyle\s*=", html), template.name
        assert not re.search(r"\son[a-z]+\s*=", html), template.name


def _settings_load(**env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings", **env}
    code = "import django; django.setup()"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True)


def test_example_secret_key_is_refused_outside_debug():
    refused = _settings_load(OMNIWEB_SECRET_KEY="change-me", OMNIWEB_DEBUG="0")
    assert refused.returncode != 0 and "OMNIWEB_SECRET_KEY is the example value" in refused.stderr
    assert _settings_load(OMNIWEB_SECRET_KEY="change-me", OMNIWEB_DEBUG="1").returncode == 0
    assert _settings_load(OMNIWEB_SECRET_KEY="", OMNIWEB_DEBUG="0").returncode == 0  # README: random key


async def test_named_origins_are_compared_with_their_port(settings):
    from channels.testing import WebsocketCommunicator

    from omniweb.web.security import browser_origin_validator

    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})

    settings.ALLOWED_ORIGINS = ["https://speech.example.org:8443"]
    validator = browser_origin_validator(app)
    results = {}
    for origin in [
        "https://speech.example.org:8443",
        "https://speech.example.org:9999",
        "http://speech.example.org:8443",
    ]:
        comm = WebsocketCommunicator(validator, "/v1/audio/speech/stream", headers=[(b"origin", origin.encode())])
        results[origin], _ = await comm.connect()
        await comm.disconnect()
    assert results == {
        "https://speech.example.org:8443": True,
        "https://speech.example.org:9999": False,  # another port of the same host is another site
        "http://speech.example.org:8443": False,
    }
