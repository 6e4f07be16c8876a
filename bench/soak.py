#!/usr/bin/env python
"""Hostile clients against one server, with a canary session whose first audio must stay normal.

Starts its own server (``manage.py runserver`` on a free loopback port, the README's command; with
``--redis`` the Redis-mode deploy instead: a throwaway ``redis-server``, one ``deploy/daphne.sh`` and
one ``deploy/worker.sh``, all on free loopback ports, as tests/test_deploy_stack.py starts them) and
runs each attack class of issue #11 in turn, bounded (a few messages each), printing per class what
the client saw and what it cost the server: RSS growth, CPU the server kept burning after the
attacker left, log lines written, and the canary's time to first audio while the attack runs. In
Redis mode RSS and CPU are those of daphne and the worker together, and the log is theirs together.

    python bench/soak.py                # every class
    python bench/soak.py long_text nan  # some classes
    python bench/soak.py --redis        # every class against daphne + runworker + redis-server
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import websockets
from speech_latency import free_port  # this directory is on sys.path when run as a script

REPO = Path(__file__).resolve().parent.parent
SPEECH = "/v1/audio/speech/stream"
VIDEO = "/v1/video/chat/stream"
TICK = os.sysconf("SC_CLK_TCK")
# 4,000 characters without a clause mark: one talker step before the bound (+1.3 GB on 2 cores)
LONG_WORDS = " ".join(["blue"] * 800)
# A tiny valid JPEG (8x8 grey, baseline)
JPEG_B64 = (
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIsIxwcKDcpLDAxNDQ0Hyc5"
    "PTgyPC4zNDL/wAALCAAIAAgBAREA/8QAFAABAAAAAAAAAAAAAAAAAAAACf/EABQQAQAAAAAAAAAAAAAAAAAAAAD/2gAIAQEAAD8AKp//2Q=="
)


def proc_stats(pids: tuple[int, ...]) -> tuple[int, float]:
    """(RSS in kB, CPU seconds) of the server's processes together."""
    rss, cpu = 0, 0.0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            rss += int(f.read().split("VmRSS:")[1].split()[0])
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / TICK
    return rss, cpu


async def canary(url: str) -> float:
    """Seconds from input.done to the first audio byte of a short sentence."""
    async with websockets.connect(url + SPEECH, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
        await ws.send(json.dumps({"type": "input.text", "text": "The canary is still singing."}))
        t0 = time.monotonic()
        await ws.send(json.dumps({"type": "input.done"}))
        first = None
        async for msg in ws:
            if isinstance(msg, bytes) and first is None:
                first = time.monotonic() - t0
            elif isinstance(msg, str) and json.loads(msg)["type"] == "session.done":
                break
        return first if first is not None else float("nan")


async def recv_all(ws: Any, seconds: float) -> list[Any]:
    """Everything the server sends within ``seconds`` (or until it closes)."""
    out: list[Any] = []
    with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
        async with asyncio.timeout(seconds):
            async for msg in ws:
                out.append(msg)
    return out


def _standard_json(text: str) -> bool:
    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return True


def summary(msgs: list[Any], ws: Any) -> str:
    texts = [m for m in msgs if isinstance(m, str)]
    errors = [json.loads(t).get("message", "")[:80] for t in texts if '"error"' in t[:40]]
    invalid = sum(1 for t in texts if not _standard_json(t))
    close = ws.close_code if ws.close_code is not None else "open"
    longest = max(map(len, texts), default=0)
    return f"errors={errors[:2]} non-standard-json={invalid} longest-text={longest} close={close}"


# -- attack classes -------------------------------------------------------------------------------


async def long_text(url: str, pids: tuple[int, ...]) -> str:
    """4,000 unpunctuated characters; leave after the first audio byte; what does the server keep doing?"""
    rss0, _ = proc_stats(pids)
    peak = rss0
    t0 = time.monotonic()
    async with websockets.connect(url + SPEECH, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
        await ws.send(json.dumps({"type": "input.text", "text": LONG_WORDS}))
        await ws.send(json.dumps({"type": "input.done"}))
        first = None
        while first is None:
            msg = await asyncio.wait_for(ws.recv(), 300)
            peak = max(peak, proc_stats(pids)[0])
            if isinstance(msg, bytes):
                first = time.monotonic() - t0
    _, cpu_left = proc_stats(pids)
    for _ in range(20):  # 10 s after the client left
        await asyncio.sleep(0.5)
        peak = max(peak, proc_stats(pids)[0])
    _, cpu1 = proc_stats(pids)
    return (
        f"first audio {first:.2f} s; RSS peak +{(peak - rss0) / 1024:.0f} MB; "
        f"CPU after the client left (10 s window) {cpu1 - cpu_left:.1f} s"
    )


async def huge_int(url: str, pids: tuple[int, ...]) -> str:
    """A JSON integer over Python's 4300-digit limit, first idle, then while an utterance plays."""
    big = "9" * 5000
    async with websockets.connect(url + SPEECH, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
        await ws.send('{"type": "input.text", "text": "x", "n": ' + big + "}")
        idle = summary(await recv_all(ws, 2), ws)
    async with websockets.connect(url + SPEECH, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
        sent = []
        for i, words in enumerate(["One two three.", None, "Four five six.", "Seven eight."]):
            if words is None:
                await ws.send('{"type": "input.text", "text": "x", "n": ' + big + "}")
                continue
            await ws.send(json.dumps({"type": "input.text", "text": words}))
            await ws.send(json.dumps({"type": "input.done"}))
            sent.append(words)
            del i
        msgs = await recv_all(ws, 30)
        spoken = [json.loads(m)["sentence_text"] for m in msgs if isinstance(m, str) and "audio.start" in m]
        held = summary(msgs, ws)
    return f"idle: {idle} | mid-utterance: {held}; spoken in order {spoken == sent} ({spoken})"


async def nan(url: str, pids: tuple[int, ...]) -> str:
    """Frames with NaN / Infinity / 1e308 timestamps, then a question."""
    parts = []
    for value in ("NaN", "Infinity", "1e308"):
        async with websockets.connect(url + VIDEO, max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "modalities": ["text"], "enable_frame_filter": False}))
            await ws.send(
                f'{{"type": "video.frame", "frame_id": "f1", "data": "{JPEG_B64}", '
                f'"pts_ms": {value}, "capture_ts_ms": {value}}}'
            )
            await ws.send(json.dumps({"type": "video.query", "text": "What do you see?"}))
            parts.append(f"{value}: {summary(await recv_all(ws, 8), ws)}")
    return " | ".join(parts)


async def unknown_path(url: str, pids: tuple[int, ...], log: Any) -> str:
    """Ten handshakes on a path no route serves: the status and the log lines they cost."""
    log.seek(0, 2)
    before = log.tell()
    statuses = []
    for _ in range(10):
        try:
            async with websockets.connect(url + "/no/such/path"):
                statuses.append("open")
        except websockets.InvalidStatus as exc:
            statuses.append(str(exc.response.status_code))
        except (OSError, websockets.WebSocketException) as exc:
            statuses.append(type(exc).__name__)
    await asyncio.sleep(0.5)
    log.seek(before)
    written = log.read().decode(errors="replace").count("\n")
    return f"statuses {sorted(set(statuses))}; {written} log lines for 10 attempts"


async def echo(url: str, pids: tuple[int, ...]) -> str:
    """An unknown type 120 KiB long (speech) and 1 MiB long (video): how much of it comes back?"""
    async with websockets.connect(url + SPEECH, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config"}))
        await ws.send(json.dumps({"type": "x" * 120_000}))
        speech = summary(await recv_all(ws, 2), ws)
    async with websockets.connect(url + VIDEO, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "modalities": ["text"]}))
        await ws.send(json.dumps({"type": "y" * 1_000_000}))
        video = summary(await recv_all(ws, 2), ws)
    return f"speech: {speech} | video: {video}"


async def leave_mid_turn(url: str, pids: tuple[int, ...], log: Any) -> str:
    """Clients that leave while their utterance streams: 'never retrieved' lines in the log."""
    log.seek(0, 2)
    before = log.tell()
    for _ in range(5):
        async with websockets.connect(url + SPEECH, max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
            await ws.send(json.dumps({"type": "input.text", "text": "Leaving early. " * 5}))
            await ws.send(json.dumps({"type": "input.done"}))
            while not isinstance(await ws.recv(), bytes):
                pass
    await asyncio.sleep(2)
    log.seek(before)
    text = log.read().decode(errors="replace")
    lines = text.splitlines()
    errors = sorted(
        {
            lines[i + 1 + j][:140]
            for i, line in enumerate(lines)
            if line.startswith("Traceback")
            for j in range(0, 40)
            if i + 1 + j < len(lines) and lines[i + 1 + j][:1] not in (" ", "")
        }
    )
    return f"'never retrieved' {text.count('never retrieved')}; tracebacks {text.count('Traceback')} {errors[:3]}"


def scan_bomb(repeats: int = 2500) -> str:
    """A 4096x4096 progressive JPEG (the pixel limit) whose smallest scan repeats: ~130 KB, base64."""
    import base64
    import itertools

    import cv2
    import numpy as np

    img = np.full((4096, 4096, 3), 128, np.uint8)
    data = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes()
    eoi = data.rfind(b"\xff\xd9")
    starts = [i for i in range(len(data) - 1) if data[i : i + 2] == b"\xff\xda"] + [eoi]
    a, b = min(itertools.pairwise(starts), key=lambda se: se[1] - se[0])
    return base64.b64encode(data[:eoi] + data[a:b] * repeats + data[eoi:]).decode()


async def wav_canary(url: str) -> float:
    """Seconds from input.done to a short sentence's WAV (encoded in a thread pool, as by default)."""
    async with websockets.connect(url + SPEECH, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config"}))
        await ws.send(json.dumps({"type": "input.text", "text": "The canary is still singing."}))
        t0 = time.monotonic()
        await ws.send(json.dumps({"type": "input.done"}))
        async for msg in ws:
            if isinstance(msg, bytes):
                return time.monotonic() - t0
        return float("nan")


async def jpeg_bomb(url: str, pids: tuple[int, ...]) -> str:
    """Seven sessions send one scan-bomb frame each (more decodes than the default thread pool has
    threads); a WAV session then asks for audio. Server CPU and the WAV's wait."""
    bomb = scan_bomb(1200)
    _, cpu0 = proc_stats(pids)
    sockets = []
    replies = []
    for i in range(7):
        ws = await websockets.connect(url + VIDEO, max_size=None)
        sockets.append(ws)
        await ws.send(json.dumps({"type": "session.config", "modalities": ["text"], "enable_frame_filter": False}))
        await ws.send(json.dumps({"type": "video.frame", "frame_id": f"b{i}", "data": bomb}))
        replies.append(await asyncio.wait_for(ws.recv(), 60))
    await asyncio.sleep(1)
    wav = await asyncio.wait_for(wav_canary(url), 300)
    for ws in sockets:
        await ws.close()
    idle = 0
    while idle < 3:  # until the server's CPU stops climbing (abandoned decodes finish or never ran)
        _, before = proc_stats(pids)
        await asyncio.sleep(1)
        idle = idle + 1 if proc_stats(pids)[1] - before < 0.2 else 0
    _, cpu1 = proc_stats(pids)
    kinds = sorted({json.loads(r).get("type") + ":" + str(json.loads(r).get("message", ""))[:40] for r in replies})
    return (
        f"{len(bomb) * 3 // 4 // 1024} KB frames; replies {kinds}; WAV first audio behind them {wav:.2f} s; "
        f"server CPU {cpu1 - cpu0:.1f} s"
    )


async def not_reading(url: str, pids: tuple[int, ...], log: Any) -> str:
    """A raw client flushes a long text and never reads: when does the server end the session?"""
    import base64
    import socket

    log.seek(0, 2)
    before = log.tell()
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {SPEECH} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    sock.recv(1024)
    text = " ".join(f"Sentence {i} of a long flush that is never read." for i in range(150))
    for payload in (
        {"type": "session.config", "response_format": "pcm", "stream_audio": True},
        {"type": "input.text", "text": text},
        {"type": "input.done"},
    ):
        sock.sendall(ws_frame(payload))
    t0 = time.monotonic()
    how = "still streaming after 70 s"
    while time.monotonic() - t0 < 70:
        await asyncio.sleep(0.5)
        log.seek(before)
        seen = log.read().decode(errors="replace")
        if "stopped reading" in seen:
            how = f"ended by the server (not reading) after {time.monotonic() - t0:.1f} s"
            break
        if "memory budget is spent" in seen:
            how = f"ended by the server (process memory budget spent) after {time.monotonic() - t0:.1f} s"
            break
        if "speech session closed (code 1006)" in seen:
            how = f"closed without an error (daphne keepalive?) after {time.monotonic() - t0:.1f} s"
            break
    sock.close()
    return how


async def frame_cpu(url: str, pids: tuple[int, ...]) -> str:
    """One video session sends 40 camera-like 1280x720 frames (the filter on, as by default), one
    at a time, then asks a question: server CPU per buffered frame, and for the turn. The canary of
    this class runs before the frames, not during them."""
    import base64

    from frame_decode import camera_frame  # this directory is on sys.path when run as a script

    frames = [base64.b64encode(camera_frame(1280, 720, seed=i)).decode() for i in range(40)]
    await asyncio.sleep(3)  # the canary started with the attack has spoken: its CPU is not counted
    async with websockets.connect(url + VIDEO, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "modalities": ["text"]}))
        _, cpu0 = proc_stats(pids)
        acks = []
        for i, data in enumerate(frames):
            t0 = time.monotonic()
            await ws.send(json.dumps({"type": "video.frame", "frame_id": f"f{i}", "data": data}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
            acks.append(time.monotonic() - t0)
            if reply.get("type") != "video.frame.ack":
                return f"frame {i} answered {reply}"
        await asyncio.sleep(1)  # the decoder task's work ahead of any turn, if any, is done
        _, cpu1 = proc_stats(pids)
        await ws.send(json.dumps({"type": "video.query", "text": "What do you see?"}))
        while json.loads(await asyncio.wait_for(ws.recv(), 120)).get("type") != "response.text.done":
            pass
        _, cpu2 = proc_stats(pids)
    acks.sort()
    return (
        f"server CPU per frame {1000 * (cpu1 - cpu0) / len(frames):.1f} ms (40 frames incl. 1 s idle); "
        f"ack median {1000 * acks[len(acks) // 2]:.1f} ms; turn CPU {1000 * (cpu2 - cpu1):.0f} ms"
    )


def ws_frame(payload: dict[str, Any]) -> bytes:
    """One masked client text frame (the not-reading client is a raw socket)."""
    data, mask = json.dumps(payload).encode(), os.urandom(4)
    n = len(data)
    header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


ATTACKS: dict[str, Callable[..., Awaitable[str]]] = {
    "long_text": long_text,
    "huge_int": huge_int,
    "nan": nan,
    "unknown_path": unknown_path,
    "echo": echo,
    "leave_mid_turn": leave_mid_turn,
    "jpeg_bomb": jpeg_bomb,
    "not_reading": not_reading,
    "frame_cpu": frame_cpu,
}
NEEDS_LOG = {"unknown_path", "leave_mid_turn", "not_reading"}


async def run(names: list[str], url: str, pids: tuple[int, ...], log: Any) -> None:
    base = [await canary(url) for _ in range(3)]
    print(f"canary first audio, idle server: {', '.join(f'{b:.3f}' for b in base)} s", flush=True)
    for name in names:
        attack = ATTACKS[name]
        args = (url, pids, log) if name in NEEDS_LOG else (url, pids)
        task = asyncio.ensure_future(attack(*args))
        await asyncio.sleep(0.3)
        try:
            during = f"{await asyncio.wait_for(canary(url), 120):.3f} s"
        except Exception as exc:  # a canary the server could not serve is a finding, not a crash
            during = f"failed ({type(exc).__name__}: {str(exc)[:80]})"
        try:
            result = await task
        except Exception as exc:
            result = f"attack raised {type(exc).__name__}: {str(exc)[:120]}"
        print(f"{name}: {result}; canary first audio during it {during}", flush=True)


Procs = list[subprocess.Popen[bytes]]


def wait_ready(port: int, ready: Callable[[dict[str, Any]], bool], procs: Procs, log: Any) -> None:
    """Until /healthz says the engine can serve (its models loaded: embedded, or a worker up)."""
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                if ready(json.loads(resp.read())["engine"]):
                    return
        except (OSError, ValueError, KeyError, urllib.error.URLError):
            pass
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            log.seek(0)
            sys.exit(f"server did not start:\n{log.read().decode(errors='replace')}")
        time.sleep(0.3)


def start_embedded(port: int, env: dict[str, str], log: Any) -> Procs:
    """The README's server: ``manage.py runserver``, the engine in the same process."""
    cmd = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
    server = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_ready(port, lambda engine: engine["state"] in ("ready", "degraded"), [server], log)
    return [server]


def start_redis_mode(port: int, env: dict[str, str], log: Any, data_dir: str) -> Procs:
    """redis-server, one engine worker and one daphne, as docs/deploy.md runs them (no nginx)."""
    redis_port = free_port()
    env.update(
        OMNIWEB_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        OMNIWEB_SECRET_KEY=os.urandom(24).hex(),  # one key for both processes (not the example one)
        OMNIWEB_PYTHON=sys.executable,
    )
    redis_cmd = ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    procs = [subprocess.Popen([*redis_cmd, "--dir", data_dir], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)]
    for cmd in (["bash", "deploy/worker.sh"], ["bash", "deploy/daphne.sh", str(port)]):
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    wait_ready(port, lambda engine: engine["workers_ready"] >= 1, procs, log)
    return procs


def main() -> None:
    redis_mode = "--redis" in sys.argv[1:]
    names = [a for a in sys.argv[1:] if a != "--redis"] or list(ATTACKS)
    port = free_port()
    url = f"ws://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not (redis_mode and k.startswith("OMNIWEB_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("OMNIWEB_ENGINE_MAX_AHEAD_SECONDS", None)  # the README's server: default pacing
    print(f"mode: {'redis (daphne + runworker + redis-server)' if redis_mode else 'embedded (runserver)'}", flush=True)
    procs: Procs = []
    with tempfile.TemporaryFile() as log, tempfile.TemporaryDirectory() as data_dir:
        try:
            procs = start_redis_mode(port, env, log, data_dir) if redis_mode else start_embedded(port, env, log)
            servers = tuple(p.pid for p in procs[1:]) if redis_mode else (procs[0].pid,)  # not redis-server
            asyncio.run(run(names, url, servers, log))
        finally:
            for proc in reversed(procs):
                proc.terminate()
            for proc in reversed(procs):
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    main()
