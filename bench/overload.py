"""Overload: a burst is cut where the admission budget ends, fresh or warm; a burst that fits is
served whole; another process's CPU use refuses nothing (issue 36 §1).

Every part starts its own server the README's way (``manage.py runserver``, its default settings:
``OMNIWEB_ENGINE_ADMIT_BUDGET_MS`` 2000 unless set in the environment) and prints its figures side
by side with their floor:

``http``: ``--requests`` (300) simultaneous raw HTTP/1.1 ``POST /v1/audio/speech`` (``Connection:
   close``, two Harvard sentences as mp3, voices ``heart`` and ``alloy`` alternating), all connected
   first and sent at once from 127.0.0.2, on a FRESH server (no request before it: the first burst
   after a start, priced by the costs measured at load), then again on the same server, now warm.
   Admitted and refused, the admitted first bytes (p50/p95/max) against the budget, the refusal
   times and whether each carried ``Retry-After``; unless ``--no-floor``, the same burst at a third
   server with a 1 ms budget, which refuses all but what starts at once: how fast this machine
   answers that many requests at all. Targets: admitted first-byte p95 ≤ 1.25 × budget in both
   bursts, the admitted counts comparable (within 2× of each other), every refusal with
   ``Retry-After``, no other status.
``ws``: ``--sessions`` (64) speech WebSocket sessions (streamed PCM) flush at the same instant,
   ``--ws-rounds`` (3) times: served against refused ``capacity``, first audio p50/p95/max against
   the floor = talker unit × sessions / cores, the unit being one session's idle first audio
   measured in the same run (before and after the bursts), and, printed beside it, the engine's
   own price (``admission_costs`` of ``speech.tts`` in /healthz, measured at load). Targets: every
   session served, p95 ≤ 1.5 × the floor.
``busy``: ``--busy`` (3) CPU-bound processes (``while True: pass``) start, then the server beside
   them; ``--conversations`` (4) realtime conversations at once through the official ``openai``
   SDK (a photo as an ``input_image`` item, a spoken question appended at playback pace, turns
   found by server VAD), then ``--transcriptions`` (3) lone ``POST /v1/audio/transcriptions`` one
   after another (the SDK, no retries). Error events (``vad_failed``, ``capacity``...) and 503s
   are counted. Target: every client served. The busy processes are killed at the end.

Exit status 1 when a target is missed.

    python bench/overload.py [--part http|ws|busy ...] [--requests 300] [--no-floor]
                             [--sessions 64] [--ws-rounds 3] [--busy 3] [--conversations 4]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from harvard import HARVARD  # noqa: E402
from speech_latency import (  # noqa: E402
    BURST_TEXT,
    CLOSE_MSG,
    DONE_MSG,
    Server,
    config_msg,
    free_port,
    text_msg,
    ws_connect,
    ws_utterance,
)

FLOOD_ADDRESS = "127.0.0.2"  # loopback, but a client (a tenant) of its own
VOICES = ("heart", "alloy")
TTS = "speech.tts"
FIRST_BYTE_OVER_BUDGET = 1.25  # admitted first-byte p95 within this × the budget
ADMITTED_RATIO = 2.0  # fresh and warm admitted counts within this factor of each other
WS_FLOOR_RATIO = 1.5  # the burst of sessions: p95 first audio within this × its floor
IDLE_UTTERANCES = 10  # one session's first audio, measured before and after the bursts (2 dropped)
perf = time.perf_counter


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def budget_seconds() -> float:
    return float(os.environ.get("OMNIWEB_ENGINE_ADMIT_BUDGET_MS", "2000")) / 1000.0


def cores() -> int:
    return os.cpu_count() or 1


def engine_record(port: int) -> dict[str, Any]:
    """The embedded engine's record in /healthz: its estimated waits and admission costs."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
        return next(w for w in json.loads(r.read())["workers"] if w["worker"] == "local")


def print_engine(label: str, port: int) -> dict[str, Any]:
    record = engine_record(port)
    print(
        f"- engine {label}: estimated_wait_seconds {record.get('estimated_wait_seconds')}, "
        f"admission_costs {record.get('admission_costs')}"
    )
    return record


def log_path(name: str, port: int) -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"omniweb-overload-{name}-{port}.log"


@asynccontextmanager
async def server(name: str, **env: str) -> AsyncIterator[Server]:
    """``manage.py runserver`` (speech_latency's ``Server``) with ``env`` over this environment,
    ready (its models loaded and calibrated) and no request sent to it."""
    port = free_port()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        srv = Server(port, log_path(name, port))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        await srv.wait_accepting(timeout=600)
        yield srv
    finally:
        srv.stop()


# -- the raw-HTTP burst -----------------------------------------------------------------------------
def speech_body(i: int) -> bytes:
    """Request ``i``: two Harvard sentences, the voices alternating."""
    n = len(HARVARD)
    text = f"{HARVARD[2 * i % n]} {HARVARD[(2 * i + 1) % n]}"
    return json.dumps({"model": "tts-1", "voice": VOICES[i % 2], "response_format": "mp3", "input": text}).encode()


async def http_speech(port: int, i: int, started: asyncio.Event) -> dict[str, Any]:
    """One raw ``POST /v1/audio/speech``, connected before ``started``: when its status line came
    and (admitted) its first body bytes and its end."""
    body = speech_body(i)
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(FLOOD_ADDRESS, 0))
    try:
        await started.wait()
        t0 = perf()
        writer.write(head + body)
        await writer.drain()
        raw = await reader.readuntil(b"\r\n\r\n")
        out: dict[str, Any] = {"t_status": perf() - t0}
        lines = raw.decode("latin-1").split("\r\n")
        out["status"] = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        out["retry_after"] = headers.get("retry-after")
        out["door"] = "x-frame-options" not in headers  # refused by the front door, before Django
        if out["status"] == 200:
            size_line = await reader.readuntil(b"\r\n")  # chunked: the first chunk's size, then its bytes
            if int(size_line.strip(), 16) > 0:
                await reader.readexactly(1)
                out["t_first"] = perf() - t0
            while await reader.read(1 << 16):
                pass
            out["t_end"] = perf() - t0
        return out
    finally:
        writer.close()


async def http_burst(port: int, requests: int) -> list[dict[str, Any] | BaseException]:
    """``requests`` connected first, then sent at the same instant."""
    started = asyncio.Event()
    flood = [asyncio.ensure_future(asyncio.wait_for(http_speech(port, i, started), 600)) for i in range(requests)]
    await asyncio.sleep(0.5)  # every connection open before the burst
    started.set()
    return await asyncio.gather(*flood, return_exceptions=True)


@dataclass
class Burst:
    """What the clients of one HTTP burst saw."""

    results: list[dict[str, Any] | BaseException]

    @property
    def done(self) -> list[dict[str, Any]]:
        return [r for r in self.results if isinstance(r, dict)]

    @property
    def failures(self) -> list[BaseException]:
        return [r for r in self.results if isinstance(r, BaseException)]

    @property
    def admitted(self) -> list[dict[str, Any]]:
        return [r for r in self.done if r["status"] == 200]

    @property
    def refused(self) -> list[dict[str, Any]]:
        return [r for r in self.done if r["status"] == 503]

    @property
    def other(self) -> list[dict[str, Any]]:
        return [r for r in self.done if r["status"] not in (200, 503)]

    @property
    def firsts(self) -> list[float]:
        return [r["t_first"] for r in self.admitted if "t_first" in r]

    @property
    def silent(self) -> int:
        """Admitted, then ended without audio."""
        return sum(1 for r in self.admitted if "t_first" not in r)

    @property
    def refusals(self) -> list[float]:
        return [r["t_status"] for r in self.refused]

    @property
    def with_retry_after(self) -> int:
        return sum(1 for r in self.refused if r["retry_after"])


async def part_http(args: argparse.Namespace) -> list[tuple[str, bool]]:
    budget = budget_seconds()
    n = args.requests
    print(f"\n## Raw-HTTP burst: {n} simultaneous POST /v1/audio/speech (mp3, two Harvard sentences)\n")
    print(f"- budget (OMNIWEB_ENGINE_ADMIT_BUDGET_MS): {budget * 1000:.0f} ms; {cores()} CPUs; from {FLOOD_ADDRESS}")
    async with server("http") as srv:
        print(f"- server log: {srv.log_path}")
        print_engine("fresh, before any request", srv.port)
        log(f"http: fresh burst of {n}")
        fresh = Burst(await http_burst(srv.port, n))
        print_engine("after the fresh burst", srv.port)
        await asyncio.sleep(2.0)
        log(f"http: warm burst of {n}")
        warm = Burst(await http_burst(srv.port, n))
        print_engine("after the warm burst", srv.port)
    floor: Burst | None = None
    if not args.no_floor:
        async with server("floor", OMNIWEB_ENGINE_ADMIT_BUDGET_MS="1") as srv:
            log(f"http: floor burst of {n} (1 ms budget)")
            floor = Burst(await http_burst(srv.port, n))
    bursts = [("fresh", fresh), ("warm", warm)] + ([("floor: 1 ms budget", floor)] if floor else [])
    print()
    print("| " + " | ".join(["burst"] + [name for name, _ in bursts]) + " | target |")
    print("|---|" + "---:|" * len(bursts) + "---|")

    def row(label: str, cells: list[str], target: str = "") -> None:
        print(f"| {label} | {' | '.join(cells)} | {target} |")

    row("admitted", [str(len(b.admitted)) for _, b in bursts], f"comparable fresh / warm (within {ADMITTED_RATIO:g}×)")
    row("admitted, ended without audio", [str(b.silent) for _, b in bursts])
    row("refused (503)", [str(len(b.refused)) for _, b in bursts])
    row("other status / failed", [f"{len(b.other)} / {len(b.failures)}" for _, b in bursts], "0 / 0")
    for q, name in ((0.5, "p50"), (0.95, "p95")):
        target = f"≤ {ms(budget * FIRST_BYTE_OVER_BUDGET)}" if name == "p95" else ""
        row(f"admitted first byte {name} ms", [ms(pct(b.firsts, q)) for _, b in bursts], target)
    row("admitted first byte max ms", [ms(max(b.firsts, default=math.nan)) for _, b in bursts])
    row("admitted whole file p50 ms", [ms(pct([r["t_end"] for r in b.admitted], 0.5)) for _, b in bursts])
    for q, name in ((0.5, "p50"), (0.95, "p95")):
        row(f"refusal {name} ms", [ms(pct(b.refusals, q)) for _, b in bursts])
    row("refusal max ms", [ms(max(b.refusals, default=math.nan)) for _, b in bursts])
    row(
        "refused at the front door / after it",
        [f"{sum(r['door'] for r in b.refused)} / {sum(not r['door'] for r in b.refused)}" for _, b in bursts],
    )
    row("refusals with Retry-After", [f"{b.with_retry_after} of {len(b.refused)}" for _, b in bursts], "all")
    if floor and floor.refusals:
        ratios = [f"{pct(b.refusals, 0.95) / pct(floor.refusals, 0.95):.2f}×" for _, b in bursts]
        row("refusal p95 / floor's", ratios)
    for _, b in bursts:
        for exc in b.failures[:3]:
            print(f"\n- failure: {exc!r}")
    checks = []
    for name, b in (("fresh", fresh), ("warm", warm)):
        p95 = pct(b.firsts, 0.95)
        checks.append(
            (
                f"http {name}: admitted first-byte p95 {ms(p95)} ms ≤ {FIRST_BYTE_OVER_BUDGET}× budget "
                f"({ms(budget * FIRST_BYTE_OVER_BUDGET)} ms)",
                bool(b.firsts) and p95 <= budget * FIRST_BYTE_OVER_BUDGET,
            )
        )
        checks.append(
            (
                f"http {name}: every refusal carries Retry-After, no other status or failure",
                b.with_retry_after == len(b.refused) and not b.other and not b.failures and not b.silent,
            )
        )
    a, w = len(fresh.admitted), len(warm.admitted)
    checks.append(
        (
            f"http: admitted counts comparable, fresh {a} / warm {w} within {ADMITTED_RATIO:g}×",
            a > 0 and w > 0 and max(a, w) <= ADMITTED_RATIO * min(a, w),
        )
    )
    return checks


# -- the WebSocket burst ----------------------------------------------------------------------------
@dataclass
class Session:
    """What one WebSocket session of a burst saw."""

    first_audio: float | None = None
    done: bool = False
    kinds: list[str] = field(default_factory=list)  # the error kinds it got
    failure: str | None = None  # the connection failed or hung

    @property
    def served(self) -> bool:
        return self.done and self.first_audio is not None and not self.kinds and self.failure is None

    @property
    def refused(self) -> bool:
        return self.kinds == ["capacity"] and self.first_audio is None


async def ws_session(url: str, ready: asyncio.Semaphore, go: asyncio.Event) -> Session:
    """Configured and holding ``BURST_TEXT`` before ``go``; flushed at it; read to session.done."""
    s = Session()
    released = False
    try:
        async with ws_connect(url) as ws:
            await ws.send(config_msg())
            await ws.send(text_msg(BURST_TEXT))
            ready.release()
            released = True
            await go.wait()
            t0 = perf()
            await ws.send(DONE_MSG)
            async with asyncio.timeout(300):
                while True:
                    msg = await ws.recv()
                    if isinstance(msg, bytes):
                        if s.first_audio is None:
                            s.first_audio = perf() - t0
                        continue
                    data = json.loads(msg)
                    if data.get("type") == "error":
                        s.kinds.append(str(data.get("kind")))
                    elif data.get("type") == "session.done":
                        s.done = True
                        break
            await ws.send(CLOSE_MSG)
    except Exception as exc:
        s.failure = repr(exc)
    finally:
        if not released:
            ready.release()
    return s


async def ws_burst(url: str, sessions: int) -> list[Session]:
    ready = asyncio.Semaphore(0)
    go = asyncio.Event()
    tasks = [asyncio.ensure_future(ws_session(url, ready, go)) for _ in range(sessions)]
    for _ in range(sessions):
        await asyncio.wait_for(ready.acquire(), 120)
    await asyncio.sleep(0.2)  # the server has handled every config before the flush
    go.set()
    return await asyncio.gather(*tasks)


async def idle_first_audio(url: str) -> list[float]:
    """One session alone: its first audio for ``BURST_TEXT``, the first two utterances dropped."""
    async with ws_connect(url) as ws:
        await ws.send(config_msg())
        times = []
        for _ in range(IDLE_UTTERANCES):
            utt = await ws_utterance(ws, BURST_TEXT)
            if utt.errors or utt.t_first is None:
                raise RuntimeError(f"idle utterance failed: {utt.errors}")
            times.append(utt.first_audio)
        await ws.send(CLOSE_MSG)
    return times[2:]


async def part_ws(args: argparse.Namespace) -> list[tuple[str, bool]]:
    n, rounds = args.sessions, args.ws_rounds
    print(f"\n## WebSocket burst: {n} speech sessions flush {BURST_TEXT!r} at once ({rounds} rounds)\n")
    async with server("ws") as srv:
        print(f"- server log: {srv.log_path}")
        calibrated = print_engine("fresh (costs measured at load)", srv.port)
        log("ws: idle first audio")
        idle = await idle_first_audio(srv.url)
        rounds_seen: list[list[Session]] = []
        for r in range(rounds):
            log(f"ws: burst {r + 1}/{rounds} of {n}")
            await asyncio.sleep(1.0)
            rounds_seen.append(await ws_burst(srv.url, n))
        idle += await idle_first_audio(srv.url)
        after = print_engine("after the bursts", srv.port)
    unit = statistics.median(idle)
    floor = unit * n / cores()
    engine_units = [
        ((rec.get("admission_costs") or {}).get(TTS) or {}).get("first", math.nan) for rec in (calibrated, after)
    ]
    engine_floors = [u * n / cores() for u in engine_units]
    print(
        f"- talker unit, one session's idle first audio (median of {len(idle)}, before and after): "
        f"{unit * 1000:.1f} ms; floor = {n} × {unit * 1000:.1f} ms / {cores()} CPUs = {floor * 1000:.0f} ms"
    )
    print(
        f"- the engine's price (admission_costs {TTS} first): at load {engine_units[0] * 1000:.1f} ms, "
        f"after the bursts {engine_units[1] * 1000:.1f} ms; floor at load {engine_floors[0] * 1000:.0f} ms\n"
    )
    print(
        "| round | served | refused `capacity` | other | first audio p50 ms | p95 ms | max ms "
        "| p95 / floor | p95 / engine-price floor |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    every = [s for sessions in rounds_seen for s in sessions]
    for label, sessions in [*((str(i + 1), ss) for i, ss in enumerate(rounds_seen)), ("all", every)]:
        firsts = [s.first_audio for s in sessions if s.served and s.first_audio is not None]
        served = sum(s.served for s in sessions)
        refused = sum(s.refused for s in sessions)
        p95 = pct(firsts, 0.95)
        print(
            f"| {label} | {served} | {refused} | {len(sessions) - served - refused} | {ms(pct(firsts, 0.5))} "
            f"| {ms(p95)} | {ms(max(firsts, default=math.nan))} | {p95 / floor:.2f}× | {p95 / engine_floors[0]:.2f}× |"
        )
    for s in every:
        if not s.served and not s.refused:
            print(f"\n- not served: kinds {s.kinds}, failure {s.failure}")
            break
    firsts = [s.first_audio for s in every if s.served and s.first_audio is not None]
    p95 = pct(firsts, 0.95)
    served = sum(s.served for s in every)
    return [
        (f"ws: every session served ({served} of {len(every)})", served == len(every)),
        (
            f"ws: first audio p95 {ms(p95)} ms ≤ {WS_FLOOR_RATIO}× floor ({ms(floor * WS_FLOOR_RATIO)} ms)",
            bool(firsts) and p95 <= WS_FLOOR_RATIO * floor,
        ),
    ]


# -- ordinary clients beside busy processes ---------------------------------------------------------
def wav_bytes(pcm: bytes, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return buf.getvalue()


async def conversation(client: Any, pcm: bytes) -> Any:
    """A photo, then a spoken question at playback pace; server VAD ends the turn. Its ``Turn``."""
    from realtime_latency import Turn, open_conn, paced_audio, read_turn

    audio = {
        "input": {"transcription": {"model": "whisper-1", "language": "en"}, "turn_detection": {"type": "server_vad"}}
    }
    manager, conn = await open_conn(client, audio=audio)
    try:
        turn = Turn()
        sender = asyncio.create_task(paced_audio(conn, pcm))
        try:
            await read_turn(conn, turn)
        except TimeoutError:  # an event ended the turn without its response (e.g. the VAD failed)
            turn.errors.append("no event for 120 s: the turn was never answered")
        finally:
            sender.cancel()
            with suppress(asyncio.CancelledError):
                await sender
        return turn
    finally:
        await manager.__aexit__(None, None, None)


async def transcription(client: Any, audio: bytes) -> tuple[float, str | None]:
    """One ``POST /v1/audio/transcriptions`` (no retries): its time and its error, if any."""
    import openai

    t0 = perf()
    try:
        await client.audio.transcriptions.create(model="whisper-1", file=("q.wav", audio, "audio/wav"))
    except openai.APIStatusError as exc:
        return perf() - t0, f"{exc.status_code} {exc.message}"
    except openai.APIError as exc:
        return perf() - t0, repr(exc)
    return perf() - t0, None


async def part_busy(args: argparse.Namespace) -> list[tuple[str, bool]]:
    import openai
    from realtime_latency import RATE, spoken_question

    n = args.conversations
    print(f"\n## Beside {args.busy} busy processes: {n} realtime conversations at once, then lone transcriptions\n")
    pcm = await asyncio.to_thread(spoken_question)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        async with server("busy") as srv:
            print(f"- server log: {srv.log_path}; {cores()} CPUs; busy pids {[p.pid for p in busy]}")
            print(f"- load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            print_engine("before the clients", srv.port)
            client = openai.AsyncOpenAI(api_key="unused", base_url=f"http://127.0.0.1:{srv.port}/v1", max_retries=0)
            log(f"busy: {n} conversations")
            turns = await asyncio.gather(
                *(asyncio.wait_for(conversation(client, pcm), 300) for _ in range(n)), return_exceptions=True
            )
            question = wav_bytes(pcm[RATE : -3 * RATE], RATE)  # the question without its silence
            lone = []
            for i in range(args.transcriptions):
                log(f"busy: lone transcription {i + 1}/{args.transcriptions}")
                lone.append(await transcription(client, question))
            print_engine("after the clients", srv.port)
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()
    print("\n| client | served | error events / status | first answer audio after speech end ms |")
    print("|---|---|---|---:|")
    served = 0
    for i, t in enumerate(turns):
        if isinstance(t, BaseException):
            print(f"| conversation {i + 1} | no | {t!r} | - |")
            continue
        ok = t.status == "completed" and not t.errors and t.first_audio is not None
        served += ok
        wait = ms(t.first_audio - t.speech_stopped) if t.first_audio and t.speech_stopped else "-"
        print(f"| conversation {i + 1} | {'yes' if ok else 'no'} | {'; '.join(t.errors) or t.status} | {wait} |")
    for i, (took, error) in enumerate(lone):
        print(f"| lone transcription {i + 1} | {'no' if error else 'yes'} | {error or '200'} | ({ms(took)} in all) |")
    errors = sum(len(t.errors) if not isinstance(t, BaseException) else 1 for t in turns)
    refused = sum(1 for _, e in lone if e and e.startswith("503"))
    print(f"\n- error events in the conversations: {errors}; 503s to the lone transcriptions: {refused}")
    return [
        (f"busy: every conversation served ({served} of {n})", served == n),
        (
            f"busy: every lone transcription served ({sum(e is None for _, e in lone)} of {len(lone)})",
            all(e is None for _, e in lone),
        ),
    ]


# -- main -------------------------------------------------------------------------------------------
PARTS = {"http": part_http, "ws": part_ws, "busy": part_busy}


async def run(args: argparse.Namespace) -> int:
    checks: list[tuple[str, bool]] = []
    for part in args.part or list(PARTS):
        t0 = time.monotonic()
        checks += await PARTS[part](args)
        log(f"{part}: {time.monotonic() - t0:.0f} s")
    print("\n### Targets\n")
    for name, ok in checks:
        print(f"- {'PASS' if ok else 'FAIL'}: {name}")
    return 0 if all(ok for _, ok in checks) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", action="append", choices=list(PARTS), help="run only this part (repeatable)")
    parser.add_argument("--requests", type=int, default=300, help="http: simultaneous requests per burst")
    parser.add_argument("--no-floor", action="store_true", help="http: skip the 1 ms-budget floor burst")
    parser.add_argument("--sessions", type=int, default=64, help="ws: sessions per burst")
    parser.add_argument("--ws-rounds", type=int, default=3, help="ws: bursts in the run")
    parser.add_argument("--busy", type=int, default=3, help="busy: CPU-bound processes beside the server")
    parser.add_argument("--conversations", type=int, default=4, help="busy: realtime conversations at once")
    parser.add_argument("--transcriptions", type=int, default=3, help="busy: lone transcriptions after them")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
