#!/usr/bin/env python
"""What one client that stops reading costs the server, and whether other sessions notice.

Starts its own server (``manage.py runserver`` on a free port), then in one run:

1. baseline: 8 normal sessions, one short utterance each in turn, time to first audio;
2. a raw-socket client that flushes a long text (150 sentences, ~10 min of audio) with a tiny
   receive buffer and never reads; while it is stalled, the same 8 sessions run again;
3. reports the server's RSS growth while the stalled session lives, whether and when the server
   ended it (the session's queued-bytes cap, ``OMNIWEB_SESSION_SEND_BUFFER_MAX``; with the default
   pacing the first 30 s of audio arrive at once and the rest at playback speed, so the cap is
   reached about a minute in), and the first-audio figures side by side.

    python bench/stalled_client.py
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import websockets
from speech_latency import free_port  # this directory is on sys.path when run as a script

REPO = Path(__file__).resolve().parent.parent
PATH = "/v1/audio/speech/stream"
LONG_TEXT = " ".join(f"Sentence {i} of a very long flush that may never be read." for i in range(150))


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0])


def ws_frame(payload: dict) -> bytes:
    """One masked client text frame (the stalled client is a raw socket, so it can refuse to read)."""
    data = json.dumps(payload).encode()
    mask = os.urandom(4)
    n = len(data)
    header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def stalled_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    assert sock.recv(1024).startswith(b"HTTP/1.1 101")
    text = LONG_TEXT
    sock.sendall(ws_frame({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
    for i in range(0, len(text), 4000):
        sock.sendall(ws_frame({"type": "input.text", "text": text[i : i + 4000]}))
    sock.sendall(ws_frame({"type": "input.done"}))
    return sock


async def first_audio(url: str) -> float:
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
        await ws.send(json.dumps({"type": "input.text", "text": "The weather is lovely today."}))
        started = time.perf_counter()
        await ws.send(json.dumps({"type": "input.done"}))
        first = None
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                first = first or time.perf_counter() - started
            elif json.loads(msg)["type"] == "session.done":
                return first or float("nan")


async def read_long_flush(url: str, pid: int, seconds: float) -> int:
    """Stream the long flush with a client that reads everything; peak server RSS (KiB)."""
    peak = rss_kb(pid)
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
        await ws.send(json.dumps({"type": "input.text", "text": LONG_TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ws.recv(), 0.2)
            peak = max(peak, rss_kb(pid))
    return peak


async def sample(url: str, n: int = 8) -> list[float]:
    return [await first_audio(url) for _ in range(n)]


def main() -> int:
    port = free_port()
    log = open("/tmp/omniweb-stalled-bench.log", "w")  # noqa: SIM115 - kept open for the server's life
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"ws://127.0.0.1:{port}{PATH}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "server did not start"
                time.sleep(0.2)
        asyncio.run(sample(url, 3))  # warm-up: models, allocator arenas
        baseline = asyncio.run(sample(url))
        # The same long flush read by a client that keeps up, for 3 s: what synthesis itself costs.
        rss_reader0 = rss_kb(server.pid)
        reader_peak = asyncio.run(read_long_flush(url, server.pid, 3.0))
        rss_before = rss_kb(server.pid)
        sock = stalled_client(port)
        stalled_at = time.monotonic()
        during = asyncio.run(sample(url))
        peak = rss_before
        closed_after = None
        how = ""
        while time.monotonic() - stalled_at < 150 and closed_after is None:
            peak = max(peak, rss_kb(server.pid))
            with open("/tmp/omniweb-stalled-bench.log") as f:
                text = f.read()
            # Ended by our queued-bytes cap, or by daphne's keepalive (the stalled client answers
            # no ping, so daphne drops it: the only abnormal close, code 1006, in this run).
            if "client stopped reading" in text or "closed (code 1006)" in text:
                closed_after = time.monotonic() - stalled_at
                how = "queued-bytes cap" if "client stopped reading" in text else "daphne's ping timeout"
            time.sleep(0.2)
        sock.close()
    finally:
        server.terminate()
        server.wait(10)

    def row(name: str, xs: list[float]) -> str:
        xs = sorted(xs)
        return f"| {name} | {statistics.median(xs) * 1000:.1f} | {xs[-1] * 1000:.1f} |"

    print("| first audio, 8 sessions one after another | p50 ms | max ms |")
    print("|---|---:|---:|")
    print(row("no stalled client", baseline))
    print(row("while one client has stopped reading", during))
    print()
    print(f"- session queued-bytes cap: {os.environ.get('OMNIWEB_SESSION_SEND_BUFFER_MAX', 4 * 1024 * 1024)} bytes")
    ended = f"{closed_after:.1f} s ({how})" if closed_after else "not ended"
    print(f"- stalled session ended by the server after: {ended}")
    print(
        f"- server RSS growth while a reading client streamed the same flush for 3 s: "
        f"{(reader_peak - rss_reader0) / 1024:.1f} MiB"
    )
    print(f"- server RSS growth while the stalled session lived (after that): {(peak - rss_before) / 1024:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
