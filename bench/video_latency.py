#!/usr/bin/env python
"""Latency and throughput bench for the streaming video WebSocket (``/v1/video/chat/stream``).

One run measures, against one server (started here unless ``--url`` names one):

0. the similarity filter on camera-like frame pairs (tests/support/camera_scenes.py): similarity, RMS
   difference in 8-bit levels, and what the seed's 0.95 and our default decide (no server needed);
1. frame acknowledgement latency for 640x480 camera-like JPEGs, one frame at a time (send → ack);
2. sustained frames per second acknowledged, 1 and 8 sessions each keeping a window of frames in
   flight for a few seconds (the filter on, as by default; filtered frames are acknowledged too);
3. time from ``video.query`` to ``response.start``, the first ``response.text.delta`` and the first
   ``response.audio.delta`` (one session, 4 buffered frames, the scene thinker);
4. interrupts: a second query sent while the first turn is speaking; the time until the first turn's
   last message arrives (0 when nothing more came) and until the second turn's ``response.start``.

and prints markdown tables plus PASS/FAIL per target. Usage (repository root, venv active)::

    python bench/video_latency.py              # full run, starts its own server
    python bench/video_latency.py --quick      # smoke run
    python bench/video_latency.py --filter     # section 0 only
    python bench/video_latency.py --url ws://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from speech_latency import Server, free_port, ms, pct, print_log_findings, stats_cells, verdict
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidMessage

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support.camera_scenes import PAIRS, room, shoot, with_person  # noqa: E402

from omniweb.media import frames as vframes  # noqa: E402
from omniweb.media.frames import DEFAULT_FRAME_FILTER_THRESHOLD  # noqa: E402

WS_PATH = "/v1/video/chat/stream"
SEED_THRESHOLD = 0.95
perf = time.perf_counter

TARGET_ACK_P50_S = 0.005
TARGET_FIRST_TEXT_S = 0.150
TARGET_FIRST_AUDIO_S = 0.300
TARGET_INTERRUPT_S = 0.050
QUESTION = "What do you see?"
LONG_QUESTION = "Describe everything you see in detail."


def camera_frames(count: int) -> list[str]:
    """640x480 JPEGs of a person walking and waving in a room, base64 (encoded once, up front)."""
    rng = np.random.default_rng(0)
    bg = room()
    out = []
    for i in range(count):
        x = 160 + (i * 23) % 320
        out.append(base64.b64encode(shoot(with_person(bg, x, 170, arm_deg=(i * 37) % 90), rng)).decode())
    return out


def ws_connect(url: str) -> Any:
    return connect(url, max_size=None, open_timeout=60, ping_interval=None, compression=None)


async def configure(ws: ClientConnection, **fields: Any) -> None:
    await ws.send(json.dumps({"type": "session.config", **fields}))


def frame_msg(data: str, frame_id: str, pts_ms: float) -> str:
    return json.dumps({"type": "video.frame", "data": data, "frame_id": frame_id, "pts_ms": pts_ms})


async def next_json(ws: ClientConnection, timeout: float = 30.0) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


# -- 0. the filter ------------------------------------------------------------------------------------
@dataclass
class FilterRow:
    name: str
    expected: bool | None
    similarity: float
    rms: float


def measure_filter(trials: int) -> list[FilterRow]:
    rows = []
    for name, (expected, pair) in PAIRS.items():
        sims = []
        for seed in range(trials):
            a, b = pair(np.random.default_rng(seed))
            ta = vframes.thumbnail(a, vframes.read_header(a))
            tb = vframes.thumbnail(b, vframes.read_header(b))
            sims.append(vframes.similarity(ta, tb))
        worst = min(sims) if expected is False else max(sims)  # the trial closest to the other side
        rows.append(FilterRow(name, expected, worst, 255.0 * float(np.sqrt(max(0.0, 1.0 - worst)))))
    return rows


def filter_report(rows: list[FilterRow], trials: int) -> list[tuple[str, bool]]:
    def decide(sim: float, threshold: float) -> str:
        return "drop" if sim >= threshold else "keep"

    print(f"\n### 0. Similarity filter on camera-like 640x480 JPEG pairs ({trials} noise draws each)\n")
    print(
        f"Similarity is 1 − MSE/255² between 64×48 thumbnails; RMS is the same difference in 8-bit levels. "
        f"Seed default {SEED_THRESHOLD} = RMS {vframes.threshold_rms_levels(SEED_THRESHOLD):.1f} levels; "
        f"ours {DEFAULT_FRAME_FILTER_THRESHOLD} = RMS "
        f"{vframes.threshold_rms_levels(DEFAULT_FRAME_FILTER_THRESHOLD):.1f} levels.\n"
    )
    print("| consecutive frames | a good filter | similarity | RMS levels | seed 0.95 | ours |")
    print("|---|---|---:|---:|---|---|")
    wrong_seed = wrong_ours = 0
    for r in rows:
        want = {True: "drops", False: "keeps", None: "either"}[r.expected]
        seed, ours = decide(r.similarity, SEED_THRESHOLD), decide(r.similarity, DEFAULT_FRAME_FILTER_THRESHOLD)
        if r.expected is not None:
            wrong_seed += (seed == "drop") != r.expected
            wrong_ours += (ours == "drop") != r.expected
        print(f"| {r.name} | {want} | {r.similarity:.6f} | {r.rms:.2f} | {seed} | {ours} |")
    print(f"\nwrong decisions: seed 0.95: {wrong_seed}; ours: {wrong_ours}")
    return [(f"filter default decides every camera-like case as expected ({wrong_ours} wrong)", wrong_ours == 0)]


# -- 1. ack latency -------------------------------------------------------------------------------------
async def measure_ack_latency(url: str, data: list[str], n: int) -> list[float]:
    out = []
    async with ws_connect(url) as ws:
        await configure(ws)
        for i in range(n + 5):
            t0 = perf()
            await ws.send(frame_msg(data[i % len(data)], f"a{i}", i * 33.3))
            msg = await next_json(ws)
            assert msg["type"] == "video.frame.ack", msg
            if i >= 5:  # warm-up
                out.append(perf() - t0)
        await ws.send(json.dumps({"type": "video.done"}))
    return out


# -- 2. sustained frames per second ---------------------------------------------------------------------
@dataclass
class Throughput:
    sessions: int
    seconds: float
    acked: int = 0
    kept: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def fps(self) -> float:
        return self.acked / self.seconds


async def stream_frames(url: str, data: list[str], seconds: float, window: int, result: Throughput) -> None:
    async with ws_connect(url) as ws:
        await configure(ws)
        sent: dict[str, float] = {}
        credit = asyncio.Semaphore(window)
        stop_at = perf() + seconds

        async def sender() -> None:
            i = 0
            while perf() < stop_at:
                await credit.acquire()
                fid = f"s{i}"
                sent[fid] = perf()
                await ws.send(frame_msg(data[i % len(data)], fid, i * 33.3))
                i += 1

        async def receiver() -> None:
            while perf() < stop_at or sent:
                msg = await next_json(ws, timeout=10)
                if msg["type"] == "video.frame.ack":
                    t_sent = sent.pop(msg["frame_id"])
                    if perf() <= stop_at:
                        result.acked += 1
                        result.kept += bool(msg["accepted"])
                        result.latencies.append(perf() - t_sent)
                    credit.release()
                elif msg["type"] == "error":
                    result.errors += 1

        await asyncio.gather(sender(), receiver())
        await ws.send(json.dumps({"type": "video.done"}))


async def measure_throughput(url: str, data: list[str], sessions: int, seconds: float, window: int) -> Throughput:
    result = Throughput(sessions, seconds)
    await asyncio.gather(*(stream_frames(url, data, seconds, window, result) for _ in range(sessions)))
    return result


# -- 3. query latency -------------------------------------------------------------------------------------
@dataclass
class QueryTimes:
    start: list[float] = field(default_factory=list)
    first_text: list[float] = field(default_factory=list)
    first_audio: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def buffer_frames(ws: ClientConnection, data: list[str], count: int = 4) -> None:
    for i in range(count):
        await ws.send(frame_msg(data[i * 7 % len(data)], f"q{i}", i * 500.0))
        msg = await next_json(ws)
        assert msg["type"] == "video.frame.ack", msg


async def measure_queries(url: str, data: list[str], n: int, warmup: int) -> QueryTimes:
    times = QueryTimes()
    async with ws_connect(url) as ws:
        await configure(ws)
        await buffer_frames(ws, data)
        for i in range(n + warmup):
            t0 = perf()
            await ws.send(json.dumps({"type": "video.query", "text": QUESTION}))
            got: dict[str, float] = {}
            while True:
                msg = await next_json(ws)
                kind = msg["type"]
                got.setdefault(kind, perf() - t0)
                if kind == "error":
                    times.errors.append(msg["message"])
                if kind == "response.audio.done" or (kind == "response.text.done" and "error" in got):
                    break
            if i < warmup:
                continue
            times.start.append(got.get("response.start", float("nan")))
            times.first_text.append(got.get("response.text.delta", float("nan")))
            times.first_audio.append(got.get("response.audio.delta", float("nan")))
            times.total.append(perf() - t0)
        await ws.send(json.dumps({"type": "video.done"}))
    return times


async def warm_up(url: str, data: list[str], timeout: float = 180.0) -> None:
    """One turn once the engine has loaded (daphne drops handshakes that wait longer than 5 s)."""
    deadline = perf() + timeout
    while True:
        try:
            await measure_queries(url, data, 1, 1)
            return
        except (OSError, InvalidHandshake, InvalidMessage):
            if perf() > deadline:
                raise
            await asyncio.sleep(1.0)


# -- 4. interrupts ------------------------------------------------------------------------------------------
@dataclass
class Interrupts:
    old_turn_stops: list[float] = field(default_factory=list)
    new_turn_starts: list[float] = field(default_factory=list)
    late_messages: list[int] = field(default_factory=list)


async def measure_interrupts(url: str, data: list[str], n: int) -> Interrupts:
    result = Interrupts()
    async with ws_connect(url) as ws:
        await configure(ws)
        await buffer_frames(ws, data)
        for _ in range(n):
            await ws.send(json.dumps({"type": "video.query", "text": LONG_QUESTION}))
            while (await next_json(ws))["type"] != "response.audio.delta":
                pass  # the first turn is speaking
            t0 = perf()
            await ws.send(json.dumps({"type": "video.query", "text": QUESTION}))
            last_old, late = 0.0, 0
            while True:
                msg = await next_json(ws)
                if msg["type"] == "response.start":  # the new turn's first message
                    result.new_turn_starts.append(perf() - t0)
                    break
                last_old, late = perf() - t0, late + 1
            result.old_turn_stops.append(last_old)
            result.late_messages.append(late)
            while (await next_json(ws))["type"] != "response.audio.done":
                pass
        await ws.send(json.dumps({"type": "video.done"}))
    return result


# -- report -------------------------------------------------------------------------------------------------
def report(
    ack: list[float], levels: list[Throughput], q: QueryTimes, intr: Interrupts, meta: dict[str, Any]
) -> list[tuple[str, bool]]:
    verdicts: list[tuple[str, bool]] = []
    print(
        f"\n### 1. Frame acknowledgement latency, 640x480 JPEG (~{meta['frame_kb']:.0f} KB), "
        f"one at a time (N={len(ack)})\n"
    )
    print("| path | p50 ms | p95 ms | min ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    print(f"| video.frame → video.frame.ack | {stats_cells(ack)} |")
    verdicts.append(
        (f"ack p50 ≤ {TARGET_ACK_P50_S * 1000:.0f} ms ({ms(pct(ack, 50))} ms)", pct(ack, 50) <= TARGET_ACK_P50_S)
    )

    print(
        f"\n### 2. Sustained frames acknowledged ({meta['window']} frames in flight per session, "
        f"{meta['seconds']:.0f} s)\n"
    )
    print(
        "| sessions | frames/s total | frames/s per session | kept by the filter | ack p50 ms | ack p95 ms | errors |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for lv in levels:
        print(
            f"| {lv.sessions} | {lv.fps:.0f} | {lv.fps / lv.sessions:.0f} | {lv.kept}/{lv.acked} | "
            f"{ms(pct(lv.latencies, 50))} | {ms(pct(lv.latencies, 95))} | {lv.errors} |"
        )

    print(f"\n### 3. video.query → first output, one session, 4 buffered frames (N={len(q.total)})\n")
    print("| after video.query | p50 ms | p95 ms | min ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for name, xs in (
        ("response.start", q.start),
        ("first response.text.delta", q.first_text),
        ("first response.audio.delta", q.first_audio),
        ("response.audio.done (whole turn)", q.total),
    ):
        print(f"| {name} | {stats_cells(xs)} |")
    verdicts.append(
        (
            f"first text ≤ {TARGET_FIRST_TEXT_S * 1000:.0f} ms (p50 {ms(pct(q.first_text, 50))} ms)",
            pct(q.first_text, 50) <= TARGET_FIRST_TEXT_S and not q.errors,
        )
    )
    verdicts.append(
        (
            f"first audio ≤ {TARGET_FIRST_AUDIO_S * 1000:.0f} ms (p50 {ms(pct(q.first_audio, 50))} ms)",
            pct(q.first_audio, 50) <= TARGET_FIRST_AUDIO_S and not q.errors,
        )
    )

    print(f"\n### 4. Interrupt: a second query while the first turn speaks (N={len(intr.old_turn_stops)})\n")
    print("| after the second video.query | p50 ms | p95 ms | min ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    print(f"| first turn's last message arrives (0: none came) | {stats_cells(intr.old_turn_stops)} |")
    print(f"| second turn's response.start | {stats_cells(intr.new_turn_starts)} |")
    print(f"\nmessages of the first turn that arrived after the second query: max {max(intr.late_messages, default=0)}")
    stop95 = pct(intr.old_turn_stops, 95)
    verdicts.append(
        (f"interrupt ≤ {TARGET_INTERRUPT_S * 1000:.0f} ms (p95 {ms(stop95)} ms)", stop95 <= TARGET_INTERRUPT_S)
    )
    return verdicts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="an existing server (ws://host:port); default: start one here")
    p.add_argument("--quick", action="store_true", help="fewer samples (smoke run)")
    p.add_argument("--filter", action="store_true", help="only the filter table (no server)")
    p.add_argument("--log", help="server log file (default: a temporary file)")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    trials = 3 if args.quick else 10
    verdicts = filter_report(measure_filter(trials), trials)
    if args.filter:
        return 0 if all(ok for _, ok in verdicts) else 1
    n_ack, n_query, n_intr, seconds = (60, 8, 5, 2.0) if args.quick else (300, 30, 20, 5.0)
    window = 8
    data = camera_frames(30)
    server: Server | None = None
    if args.url:
        url = args.url.rstrip("/") + WS_PATH
    else:
        log_path = Path(args.log) if args.log else Path(tempfile.mkstemp(prefix="omniweb-vbench-", suffix=".log")[1])
        server = Server(free_port(), log_path)
        url = f"ws://127.0.0.1:{server.port}{WS_PATH}"
    try:
        if server is not None:
            await server.wait_accepting()
        print(f"server at {url}; warming up ...", file=sys.stderr)
        await warm_up(url, data)
        print("1/4 ack latency ...", file=sys.stderr)
        ack = await measure_ack_latency(url, data, n_ack)
        levels = []
        for sessions in (1, 8):
            print(f"2/4 throughput, {sessions} sessions ...", file=sys.stderr)
            levels.append(await measure_throughput(url, data, sessions, seconds, window))
            await asyncio.sleep(1.0)
        print("3/4 query latency ...", file=sys.stderr)
        q = await measure_queries(url, data, n_query, 2)
        print("4/4 interrupts ...", file=sys.stderr)
        intr = await measure_interrupts(url, data, n_intr)
    finally:
        if server is not None:
            server.stop()
    meta = {
        "frame_kb": float(np.mean([len(d) * 3 / 4 for d in data])) / 1024,
        "window": window,
        "seconds": seconds,
    }
    verdicts += report(ack, levels, q, intr, meta)
    print("\n### Targets\n")
    for text, ok in verdicts:
        print(f"- {verdict(ok)}: {text}")
    if q.errors:
        print(f"\nerrors during queries: {sorted(set(q.errors))}")
    if server is not None:
        print_log_findings(server.log_path)
    return 0 if all(ok for _, ok in verdicts) else 1


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
