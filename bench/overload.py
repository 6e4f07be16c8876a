"""Overload: hundreds of simultaneous speech requests are answered in time or refused at once.

One run, against the README's server started here (``manage.py runserver``, its default settings:
``OMNIWEB_ENGINE_ADMIT_BUDGET_MS`` 2000 unless set in the environment):

1. idle: a well-behaved real-time WebSocket session (one sentence at a time, PCM) measures its
   first audio, and a few HTTP requests warm the engine's cost estimates;
2. burst: ``--requests`` (300) simultaneous ``POST /v1/audio/speech`` (a two-sentence mp3,
   streamed) from another client address (127.0.0.2, a tenant of its own); meanwhile the same
   WebSocket session speaks again, ``--probes`` times, and measures its first audio. The session
   runs in a process of its own, as a client elsewhere would: in the flood's process its timings
   waited for that process's own work on hundreds of responses.

3. floor (unless ``--no-floor``): a second server with a 1 ms budget, which refuses every
   request, takes the same burst: how fast this machine's server answers that many requests at
   all, the floor under any refusal time.

It prints, side by side: how many requests were admitted and refused; the admitted ones' first
bytes (p50/p95/max) against the budget × 1.25; how fast the refusals came (p50/p95/max against
100 ms, and against the floor's) and whether each carried ``Retry-After``; the session's first
audio (streamed PCM) during the burst against its idle first audio (ratio; judged: the median
within 2x). Exit status 1 when a target is missed. ``--warmup 0`` measures a cold burst, on an
engine that has never been saturated.

    python bench/overload.py [--requests 300] [--probes 3] [--warmup 16] [--no-floor]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from speech_latency import Server, free_port, ws_connect, ws_utterance  # noqa: E402

TEXT = "The overload bench asks for two sentences. Each request is a short mp3 file."
PROBE = "A real-time session speaks while the server is busy."
FLOOD_ADDRESS = "127.0.0.2"  # loopback, but another client than the session's 127.0.0.1
REFUSAL_TARGET = 0.100
PROBE_RATIO = 2.0  # "keeps its first audio": ~20 ms idle here, so within a few steps of the engine


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.0f} ms"


async def http_speech(port: int, started: asyncio.Event) -> dict[str, Any]:
    """One raw ``POST /v1/audio/speech``: when its status line came, and (admitted) its first body bytes."""
    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "mp3"}).encode()
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(FLOOD_ADDRESS, 0))
    await started.wait()
    t0 = time.perf_counter()
    writer.write(head + body)
    await writer.drain()
    raw = await reader.readuntil(b"\r\n\r\n")
    t_status = time.perf_counter() - t0
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    out: dict[str, Any] = {"status": status, "t_status": t_status, "retry_after": headers.get("retry-after")}
    out["door"] = "x-frame-options" not in headers  # answered by the front door, before Django
    if status == 200:
        size_line = await reader.readuntil(b"\r\n")  # chunked: the first chunk's size, then its bytes
        if int(size_line.strip(), 16) > 0:
            await reader.readexactly(1)
        out["t_first"] = time.perf_counter() - t0
        rest = await reader.read()
        while rest:
            rest = await reader.read(1 << 16)
        out["t_end"] = time.perf_counter() - t0
    writer.close()
    return out


def local_engine(port: int) -> dict[str, Any]:
    """The embedded engine's record in /healthz (its estimates)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
        return next(w for w in json.loads(r.read())["workers"] if w["worker"] == "local")


async def probe(url: str, ws: Any) -> float:
    """The session's first audio for one sentence; NaN when it was refused."""
    utt = await ws_utterance(ws, PROBE)
    return float("nan") if utt.errors else utt.first_audio


async def session(url: str, probes: int, ready: Any, burst: Any) -> tuple[list[float], list[float]]:
    async with ws_connect(url) as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
        idle = [await probe(url, ws) for _ in range(5)]
        ready.set()
        await asyncio.to_thread(burst.wait)
        during: list[float] = []
        for i in range(probes):
            await asyncio.sleep(0.3 if i == 0 else 0.5)
            during.append(await probe(url, ws))
    return idle, during


def session_process(url: str, probes: int, ready: Any, burst: Any, out: Any) -> None:
    """The real-time session's own process: its idle first audio, then (from ``burst``) its probes."""
    out.send(asyncio.run(session(url, probes, ready, burst)))


async def floor(args: argparse.Namespace) -> list[float]:
    """The refusal times of the same burst at a server that refuses everything (1 ms budget)."""
    port = free_port()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"omniweb-overload-floor-{port}.log"
    saved = os.environ.get("OMNIWEB_ENGINE_ADMIT_BUDGET_MS")
    os.environ["OMNIWEB_ENGINE_ADMIT_BUDGET_MS"] = "1"
    try:
        server = Server(port, log_path)
    finally:
        if saved is None:
            del os.environ["OMNIWEB_ENGINE_ADMIT_BUDGET_MS"]
        else:
            os.environ["OMNIWEB_ENGINE_ADMIT_BUDGET_MS"] = saved
    try:
        await server.wait_accepting()
        go = asyncio.Event()
        go.set()
        await http_speech(port, go)  # the engine learns a first audio's cost; all else is refused
        started = asyncio.Event()
        flood = [asyncio.ensure_future(http_speech(port, started)) for _ in range(args.requests)]
        await asyncio.sleep(0.5)
        started.set()
        results = await asyncio.gather(*flood)
    finally:
        server.stop()
    return [r["t_status"] for r in results if r["status"] == 503]


async def run(args: argparse.Namespace) -> int:
    port = free_port()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"omniweb-overload-{port}.log"
    server = Server(port, log_path)
    budget = float(os.environ.get("OMNIWEB_ENGINE_ADMIT_BUDGET_MS", "2000")) / 1000.0
    spawn = multiprocessing.get_context("spawn")
    ready, burst = spawn.Event(), spawn.Event()
    receive, send = spawn.Pipe(duplex=False)
    try:
        await server.wait_accepting()
        proc = spawn.Process(target=session_process, args=(server.url, args.probes, ready, burst, send))
        proc.start()
        await asyncio.to_thread(ready.wait, 120)
        warm = asyncio.Event()
        warm.set()
        # The engine learns what a first audio costs from the traffic it serves: a short burst
        # (every worker busy, as under the real one) before the measured burst.
        for _ in range(3):
            await asyncio.gather(*(http_speech(port, warm) for _ in range(args.warmup)))
        before = await asyncio.to_thread(local_engine, port)
        started = asyncio.Event()
        flood = [asyncio.ensure_future(http_speech(port, started)) for _ in range(args.requests)]
        await asyncio.sleep(0.5)  # every connection open before the burst
        started.set()
        burst.set()
        results = await asyncio.gather(*flood, return_exceptions=True)
        idle, during = await asyncio.to_thread(receive.recv)
        await asyncio.to_thread(proc.join, 30)
        after = await asyncio.to_thread(local_engine, port)
    finally:
        server.stop()
    floor_refusals = [] if args.no_floor else await floor(args)
    failures = [r for r in results if isinstance(r, BaseException)]
    done = [r for r in results if isinstance(r, dict)]
    admitted = [r for r in done if r["status"] == 200]
    refused = [r for r in done if r["status"] == 503]
    other = [r for r in done if r["status"] not in (200, 503)]
    firsts = [r["t_first"] for r in admitted]
    refusals = [r["t_status"] for r in refused]
    refused_probes = sum(1 for x in during if x != x)
    idle_med = statistics.median(idle)
    during_med = statistics.median([x for x in during if x == x] or [float("nan")])
    print(f"server log: {log_path}")
    for when, w in (("before the burst", before), ("after it", after)):
        waits, pace = w.get("estimated_wait_seconds"), w.get("start_pace_seconds")
        rate, slowdown = w.get("media_throughput"), w.get("slowdown")
        print(f"engine {when}: estimated waits {waits}, start pace {pace}, media/s {rate}, slowdown {slowdown}")
    print(f"budget (OMNIWEB_ENGINE_ADMIT_BUDGET_MS): {budget * 1000:.0f} ms; cores: {os.cpu_count()}")
    print(f"{args.requests} simultaneous POST /v1/audio/speech (mp3, 2 sentences) from {FLOOD_ADDRESS}")
    print(f"  admitted {len(admitted)}, refused (503) {len(refused)}, other {len(other)}, failed {len(failures)}")
    print("                       p50         p95         max      target")
    print(f"  admitted first byte {ms(pct(firsts, .5))} {ms(pct(firsts, .95))} {ms(max(firsts, default=0))}"
          f"   <= {ms(budget * 1.25)}")  # fmt: skip
    print(f"  refusal             {ms(pct(refusals, .5))} {ms(pct(refusals, .95))} {ms(max(refusals, default=0))}"
          f"   <= {ms(REFUSAL_TARGET)}")  # fmt: skip
    door = [r["t_status"] for r in refused if r["door"]]
    late = [r["t_status"] for r in refused if not r["door"]]
    for label, times in (("  at the front door", door), ("  after admission  ", late)):
        print(f"{label}  {ms(pct(times, 0.5))} {ms(pct(times, 0.95))} {ms(max(times, default=0))}   ({len(times)})")
    if floor_refusals:
        print(f"  floor: all refused   {ms(pct(floor_refusals, .5))} {ms(pct(floor_refusals, .95))}"
              f" {ms(max(floor_refusals))}   ({len(floor_refusals)} of {args.requests} at a 1 ms budget)")  # fmt: skip
        print(f"  refusal / floor       {pct(refusals, .5) / pct(floor_refusals, .5):8.2f}x"
              f"   {pct(refusals, .95) / pct(floor_refusals, .95):8.2f}x")  # fmt: skip
    ends = [r["t_end"] for r in admitted]
    print(f"  admitted whole file {ms(pct(ends, 0.5))} {ms(pct(ends, 0.95))} {ms(max(ends, default=0))}")
    with_retry = sum(1 for r in refused if r["retry_after"])
    print(f"  refusals with Retry-After: {with_retry} of {len(refused)}")
    print("real-time WebSocket session from 127.0.0.1 (one sentence, streamed PCM), first audio:")
    print(f"  idle   {', '.join(f'{x * 1000:.0f}' for x in idle)} ms (median {idle_med * 1000:.0f} ms)")
    print(f"  burst  {', '.join(f'{x * 1000:.0f}' for x in during)} ms (median {during_med * 1000:.0f} ms)")
    print(f"  ratio  {during_med / idle_med:.2f}x of idle; refused {refused_probes} of {len(during)}")
    checks = {
        "every admitted first byte within budget x 1.25": bool(firsts) and max(firsts) <= budget * 1.25,
        "every refusal under 100 ms": all(t <= REFUSAL_TARGET for t in refusals),
        "every refusal has Retry-After": with_retry == len(refused),
        "no request failed or got another status": not failures and not other,
        "some requests were refused (the burst overloads this machine)": bool(refused),
        "the real-time session was served every time": refused_probes == 0,
        f"the session kept its first audio (median within {PROBE_RATIO:g}x idle)": during_med <= PROBE_RATIO * idle_med,
    }
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    for exc in failures[:3]:
        print(f"  failure: {exc!r}")
    return 0 if all(checks.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--probes", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=16, help="simultaneous requests of each warm-up burst")
    parser.add_argument("--no-floor", action="store_true", help="skip the all-refused floor phase")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
