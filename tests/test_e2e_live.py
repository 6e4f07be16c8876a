"""End to end over a real socket: the README's runserver and the documented production daphne command."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import wave
from collections.abc import Iterator

import numpy as np
import pytest
import websockets
from support.servers import DAPHNE_ARGS, ROOT, free_port, live_server

SERVERS = {
    "runserver": ["manage.py", "runserver", "127.0.0.1:{port}", "--noreload"],
    "daphne": [
        "-m", "daphne", *DAPHNE_ARGS, "--proxy-headers", "-b", "127.0.0.1", "-p", "{port}", "omniweb.asgi:application",
    ],
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request) -> Iterator[str]:
    port = free_port()
    with live_server([part.format(port=port) for part in SERVERS[request.param]], port) as base:
        yield base.replace("http://", "ws://") + "/v1/audio/speech/stream"


async def converse(url: str, config: dict, texts: list[str]) -> list[object]:
    """Send one utterance; return every message up to session.done (JSON decoded, binary as bytes)."""
    out: list[object] = []
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", **config}))
        for text in texts:
            await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
        while True:
            raw = await asyncio.wait_for(ws.recv(), 30)
            msg = raw if isinstance(raw, bytes) else json.loads(raw)
            out.append(msg)
            if isinstance(msg, dict) and msg["type"] in ("session.done",):
                break
        await ws.send(json.dumps({"type": "session.close"}))
    return out


def test_streamed_speech_over_a_real_socket(server):
    msgs = asyncio.run(
        converse(server, {"response_format": "pcm", "stream_audio": True}, ["Hello there. ", "How are you today?"])
    )
    starts = [m for m in msgs if isinstance(m, dict) and m["type"] == "audio.start"]
    dones = [m for m in msgs if isinstance(m, dict) and m["type"] == "audio.done"]
    # the default split (none): the flush is one request, as the reference sends it
    assert [s["sentence_text"] for s in starts] == ["Hello there. How are you today?"]
    assert all(s["sample_rate"] == 24000 and s["channels"] == 1 for s in starts)
    audio = [m for m in msgs if isinstance(m, bytes)]
    assert len(audio) > 4  # vocoder chunks, not one blob per sentence
    assert sum(d["total_bytes"] for d in dones) == sum(len(a) for a in audio)
    pcm = np.frombuffer(b"".join(audio), "<i2") / 32768.0
    assert 1.5 < pcm.size / 24000 < 5.0 and np.sqrt(np.mean(pcm**2)) > 0.02
    assert msgs[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}


def test_wav_per_sentence_over_a_real_socket(server):
    msgs = asyncio.run(converse(server, {}, ["One sentence only."]))
    (blob,) = [m for m in msgs if isinstance(m, bytes)]
    with wave.open(io.BytesIO(blob)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        assert 0.6 < w.getnframes() / 24000 < 3.0


def test_large_session_config_is_admitted(server):
    """3 MiB is over daphne's 1 MiB default but within the protocol's 4 MiB for session.config."""
    padding = "x" * (3 * 1024 * 1024)
    msgs = asyncio.run(converse(server, {"client_note": padding}, ["Still fine."]))
    assert msgs[-1]["type"] == "session.done" and msgs[-1]["total_sentences"] == 1


def test_oversized_message_gets_the_protocol_error(server):
    async def run() -> dict:
        async with websockets.connect(server, max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "client_note": "x" * (5 * 1024 * 1024)}))
            return json.loads(await asyncio.wait_for(ws.recv(), 10))

    assert asyncio.run(run()) == {"type": "error", "message": "WebSocket message too large", "kind": "client_error"}


def test_cross_site_origin_is_refused(server):
    async def run() -> None:
        async with websockets.connect(server, origin="https://evil.example") as ws:
            await ws.recv()

    with pytest.raises(websockets.exceptions.InvalidStatus):
        asyncio.run(run())


def test_speak_command_writes_a_wav(server, tmp_path):
    base = server.rsplit("/v1/", 1)[0]
    out = tmp_path / "out.wav"
    result = subprocess.run(
        [sys.executable, "manage.py", "speak", "Testing one two three.", "-o", str(out), "--url", base, "--timestamps"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Testing" in result.stdout and "time to first audio" in result.stdout
    with wave.open(str(out)) as w:
        assert w.getframerate() == 24000 and w.getnframes() > 24000 * 0.8


@pytest.mark.parametrize("delay", [0.3, 1.0, 2.0])
def test_stopping_while_the_models_load_exits_cleanly(delay):
    """SIGTERM during start-up (models still loading) ends daphne with status 0, not an abort.

    ``delay`` after the port opens lands the signal in different phases of the model load.
    """
    port = free_port()
    args = [part.format(port=port) for part in SERVERS["daphne"]]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings"}
    out, err = subprocess.DEVNULL, subprocess.PIPE
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while True:  # listening: the preload thread is running by then
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
