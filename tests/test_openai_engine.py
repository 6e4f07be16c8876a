"""The OpenAI API's views on both dispatch paths: the embedded engine and Redis workers.

In-process (Django's ``AsyncClient``, no server): the views submit to ``get_engine_client()``, so
on the ``redis`` path the speech and the ``audio.transcribe`` pipeline run on two real
``manage.py runworker`` processes. What a live server adds (chunked bodies, disconnects, the SDK)
is in test_openai_api.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys

import av
import pytest
from django.test import AsyncClient

FOX = "The quick brown fox jumps over the lazy dog."


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


async def speech(fmt: str, text: str = FOX, **fields: object) -> tuple[int, bytes, dict[str, str]]:
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": fmt, **fields}
    response = await AsyncClient().post("/v1/audio/speech", json.dumps(body), content_type="application/json")
    if not response.streaming:
        return response.status_code, response.content, dict(response.headers)
    data = b"".join([part async for part in response.streaming_content])
    return response.status_code, data, dict(response.headers)


async def test_speech_then_transcription_round_trip(engine):
    status, mp3, headers = await speech("mp3", FOX + " " + FOX)
    assert status == 200 and headers["Content-Type"] == "audio/mpeg"
    with av.open(io.BytesIO(mp3)) as container:
        assert sum(f.samples for f in container.decode(audio=0)) / 24000 > 4.0
    upload = io.BytesIO(mp3)
    upload.name = "fox.mp3"
    form = {"model": "whisper-1", "response_format": "verbose_json", "timestamp_granularities[]": ["word"]}
    response = await AsyncClient().post("/v1/audio/transcriptions", {**form, "file": upload})
    assert response.status_code == 200, response.content
    result = json.loads(response.content)
    assert words(result["text"]) == words(FOX) * 2
    assert [w["word"].lower().strip(".,") for w in result["words"]] == words(FOX) * 2


async def test_sse_speech_on_both_paths(engine):
    status, body, headers = await speech("pcm", stream_format="sse")
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events = [json.loads(line.removeprefix("data: ")) for line in body.decode().split("\n\n") if line]
    assert events[-1]["type"] == "speech.audio.done" and len(events) > 2


@pytest.mark.parametrize("method", ["get", "put"])
async def test_wrong_method_is_an_openai_shaped_405(method):
    response = await getattr(AsyncClient(), method)("/v1/audio/speech")
    assert response.status_code == 405 and json.loads(response.content)["error"]["code"] == "method_not_allowed"


# A fresh process: Django's test client reconnects close_old_connections after each of its requests.
_HOOKS_PROBE = """
import asyncio, asgiref.sync, django
django.setup()
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
hops = []
real = asgiref.sync.SyncToAsync.__call__
async def counted(self, *args, **kwargs):
    hops.append(repr(self.func))
    return await real(self, *args, **kwargs)
asgiref.sync.SyncToAsync.__call__ = counted
sent = []
async def main():
    scope = {"type": "http", "method": "GET", "path": "/v1/models", "query_string": b"", "headers": [],
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000)}
    messages = [{"type": "http.request", "body": b"", "more_body": False}]
    async def receive():
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)
    async def send(message):
        sent.append(message)
    await ASGIHandler()(scope, receive, send)
asyncio.run(main())
assert sent[0]["status"] == 200, sent[0]
assert signals.request_started.receivers == [], signals.request_started.receivers
assert not [h for h in hops if "sync_send" in h], hops
print("ok")
"""


def test_a_request_runs_no_database_hooks_in_a_thread():
    # omniweb has no database, so Django's per-request database hooks are disconnected: under ASGI
    # each sync receiver of request_started costs a thread hop before the view runs.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings"}
    done = subprocess.run([sys.executable, "-c", _HOOKS_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


async def test_a_stream_leaves_a_spare_encoder_that_the_next_one_takes(engine, monkeypatch):
    from omniweb.openai_api import views

    monkeypatch.setattr(views, "_SPARES", views._SpareEncoders())
    assert views._SPARES.take("opus") is None
    status, first, _ = await speech("opus")
    await asyncio.sleep(views.SPARE_DELAY + 0.5)  # the spare opens in a thread after the first bytes
    spare = views._SPARES.take("opus")
    assert status == 200 and spare is not None
    views._SPARES._ready["opus"] = spare
    status, second, _ = await speech("opus")
    assert status == 200 and views._SPARES.take("opus") is not spare  # taken: what waits now is a new one
    for body in (first, second):  # a spare writes the same stream as an encoder opened on the spot
        with av.open(io.BytesIO(body)) as container:
            assert sum(f.samples for f in container.decode(audio=0)) / 48000 > 1.0
