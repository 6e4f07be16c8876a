#!/usr/bin/env python
"""Latency and throughput bench for the streaming TTS WebSocket (``/v1/audio/speech/stream``).

One run measures, against one server (started here unless ``--url`` names one):

1. time to first audio over the WebSocket at one session vs the engine's own first-audio time
   (an in-process ``LocalEngineClient`` in this bench process, same text, interleaved with the
   WebSocket utterances so both see the same machine state);
2. time to first audio of a 40-sentence flush vs a 1-sentence flush (same first sentence);
3. a concurrency sweep: N sessions, each its own connection, arriving spread over one ~9 s
   paragraph and then speaking paragraphs back to back at playback pace (N streams playing at
   once); per level: first-audio p50/p95, real-time factor per stream and playback gaps;
4. the same levels as a burst: every session flushes at the same instant (reported for information:
   on 2 cores the talker's ~20 ms per first sentence makes a 64-way cold start take ~0.7 s);
5. an LLM-style token stream (``split_granularity: "sentence"``, one word-token every 1/30 s): time
   from the ``input.text`` that completes the first sentence to its first audio, heard before the
   flush; the same stream with the default split (``none``) for comparison.

Sessions use the server's default ``split_granularity`` (``none``: one request per flush) unless
said otherwise.

and prints markdown tables plus PASS/FAIL per target. See bench/README.md.

``--burst`` runs only the burst of issue #15 instead: ``--burst-sessions`` (64) sessions flush
``BURST_TEXT`` at the same instant, ``--burst-rounds`` times; it prints the hardware floor (sessions
× (G2P + one talker run of the first sentence, measured alone in this process with one thread) /
cores, measured right before and right after the bursts), first audio p50/p95 over all rounds, the
p95 / floor ratio (target ≤ 1.25) and playback gaps, all from the same run; then the same bursts
straight into an in-process scheduler (engine only, the server stopped) with the thread CPU of the
steps run before the p95 first audio, by kind, so the engine's share of any gap is visible.

Usage (from the repository root, venv active)::

    python bench/speech_latency.py                 # full run, starts its own server
    python bench/speech_latency.py --quick         # smoke run
    python bench/speech_latency.py --url ws://127.0.0.1:8000 --levels 1,8,32,64
    python bench/speech_latency.py --burst         # the 64-session burst vs its floor only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets.exceptions
from websockets.asyncio.client import ClientConnection, connect

REPO = Path(__file__).resolve().parent.parent
WS_PATH = "/v1/audio/speech/stream"
SAMPLE_RATE = 24000
BYTES_PER_SECOND = SAMPLE_RATE * 2  # 16-bit mono PCM
perf = time.perf_counter

# Targets from the issue.
TARGET_WS_VS_ENGINE = 1.25
TARGET_LONG_VS_SHORT = 1.30
TARGET_P95_FIRST_AUDIO_S = 0.300
TARGET_LEVEL = 64
LONG_FLUSH_SENTENCES = 40
TOKENS_PER_SECOND = 30.0
TARGET_BURST_VS_FLOOR = 1.25
BURST_TEXT = "Streaming speech should never stall. Every listener hears a smooth voice."

# -- texts ------------------------------------------------------------------------------------------
SHORT_SENTENCE = "The weather is lovely today."
PARAGRAPH = (  # ~9 s of audio with the default voice (the run prints the measured length)
    "Streaming speech lets a listener hear the first words early. "
    "Each sentence is synthesized on its own. "
    "Meanwhile the server keeps working."
)
_SUBJECTS = [
    "The river",
    "A small bird",
    "My neighbour",
    "The old clock",
    "This report",
    "The night train",
    "Our garden",
    "The new library",
    "A quiet street",
    "The morning bus",
    "The kitchen window",
    "A paper boat",
    "The city council",
]
_PREDICATES = [
    "was finished before noon.",
    "looked different in the rain.",
    "made everyone smile again.",
]


def long_flush_text(n_sentences: int = 40) -> str:
    """``SHORT_SENTENCE`` followed by ``n_sentences - 1`` distinct sentences."""
    pool = [f"{s} {p}" for p in _PREDICATES for s in _SUBJECTS]
    assert len(pool) >= n_sentences - 1
    return " ".join([SHORT_SENTENCE, *pool[: n_sentences - 1]])


def config_msg(**fields: Any) -> str:
    return json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True, **fields})


def llm_tokens(text: str) -> list[str]:
    """Word tokens as an LLM streams them: each but the first carries its leading space."""
    words = text.split(" ")
    return [words[0], *(" " + w for w in words[1:])]


def text_msg(text: str) -> str:
    return json.dumps({"type": "input.text", "text": text})


DONE_MSG = json.dumps({"type": "input.done"})
CLOSE_MSG = json.dumps({"type": "session.close"})


# -- statistics -------------------------------------------------------------------------------------
def pct(values: Sequence[float], q: float) -> float:
    """Percentile with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def stats_cells(xs: Sequence[float]) -> str:
    """p50 | p95 | min | max of seconds, as milliseconds, for a markdown row."""
    return f"{ms(pct(xs, 50))} | {ms(pct(xs, 95))} | {ms(min(xs))} | {ms(max(xs))}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# -- one WebSocket utterance ------------------------------------------------------------------------
@dataclass
class Utterance:
    """What the client saw for one flush. Times are perf_counter seconds."""

    t_flush: float = 0.0  # just before input.done was sent
    t_first: float | None = None  # first binary frame
    t_end: float | None = None  # session.done
    audio_bytes: int = 0
    frames: int = 0
    sentences: int = 0
    max_late: float = 0.0  # worst (arrival - playback time) over frames; > 0 means a playback gap
    late_at: float = math.nan  # audio position (s) of the frame with the worst lateness
    late_frames: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def first_audio(self) -> float:
        return math.nan if self.t_first is None else self.t_first - self.t_flush

    @property
    def audio_seconds(self) -> float:
        return self.audio_bytes / BYTES_PER_SECOND

    @property
    def rtf(self) -> float:
        """Speed: audio seconds received per wall second, first audio to session.done (1/RTF, "× real time")."""
        if self.t_first is None or self.t_end is None:
            return math.nan
        wall = self.t_end - self.t_first
        return math.inf if wall <= 0 else self.audio_seconds / wall


async def send_flush(ws: ClientConnection, utt: Utterance) -> None:
    utt.t_flush = perf()
    await ws.send(DONE_MSG)


async def receive_utterance(ws: ClientConnection, utt: Utterance, cancel_after_first: bool = False) -> Utterance:
    """Read until session.done. Binary frames are only measured (len), never copied or decoded.

    Playback model: a player starts at the first frame and plays at 1x, so the frame that starts
    at byte offset B is due at t_first + B / BYTES_PER_SECOND; arriving after that is a gap.
    ``cancel_after_first`` sends input.cancel at the first audio (only first audio is measured;
    the server paces the rest at playback speed, so playing it out would take minutes).
    """
    t_first: float | None = None
    nbytes = 0
    max_late = 0.0
    late_at = math.nan
    late = 0
    frames = 0
    while True:
        msg = await ws.recv()
        now = perf()
        if type(msg) is bytes:
            if t_first is None:
                t_first = now
                if cancel_after_first:
                    await ws.send(json.dumps({"type": "input.cancel"}))
            else:
                lateness = now - (t_first + nbytes / BYTES_PER_SECOND)
                if lateness > 0:
                    late += 1
                    if lateness > max_late:
                        max_late = lateness
                        late_at = nbytes / BYTES_PER_SECOND
            nbytes += len(msg)
            frames += 1
            continue
        data = json.loads(msg)
        kind = data.get("type")
        if kind == "audio.start":
            utt.sentences += 1
        elif kind == "error":
            utt.errors.append(str(data.get("message")))
        elif kind == "session.done":
            utt.t_end = now
            break
    utt.t_first = t_first
    utt.audio_bytes = nbytes
    utt.frames = frames
    utt.max_late = max_late
    utt.late_at = late_at
    utt.late_frames = late
    return utt


async def ws_utterance(ws: ClientConnection, text: str, cancel_after_first: bool = False) -> Utterance:
    utt = Utterance()
    await ws.send(text_msg(text))
    await send_flush(ws, utt)
    return await receive_utterance(ws, utt, cancel_after_first)


def ws_connect(url: str) -> Any:
    # No permessage-deflate (the client would inflate every PCM frame), no proxy, no keepalive pings
    # (a busy server must not get a session killed for a late pong in the middle of a measurement).
    return connect(url, compression=None, proxy=None, max_size=None, ping_interval=None, open_timeout=60, max_queue=256)


# -- the in-process engine --------------------------------------------------------------------------
class InProcessEngine:
    """The engine's own first-audio time: LocalEngineClient in this process (its own model copy)."""

    def __init__(self) -> None:
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")
        import django

        django.setup()
        from omniweb.engine.runtime import get_engine_client

        self.client = get_engine_client()

    @staticmethod
    def request(text: str) -> Any:
        from omniweb.engine.requests import SpeakRequest

        return SpeakRequest(text=text)

    async def first_audio(self, text: str) -> float:
        """Seconds from submit (the stream's first step) to its first "audio" chunk; then aborts."""
        first = math.nan
        stream = self.client.stream(self.request(text))
        t0 = perf()
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                if chunk.TYPE == "audio":
                    first = perf() - t0
                    break  # leaving the aclosing block aborts the request
                if chunk.TYPE == "end" and not chunk.ok:
                    raise RuntimeError(f"engine ended with {chunk}")
        return first

    def shutdown(self) -> None:
        from omniweb.engine.runtime import shutdown

        shutdown()


# -- the server under test --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``manage.py runserver --noreload`` in a subprocess, its output kept in a log file."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{WS_PATH}"

    async def wait_accepting(self, timeout: float = 180.0) -> None:
        deadline = perf() + timeout
        while perf() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.2)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            if await asyncio.to_thread(self._ready):  # handshakes complete while the models load
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"server was not ready within {timeout:.0f} s; see {self.log_path}")

    def _ready(self) -> bool:
        """/healthz says the models are loaded (503 until then)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return bool(json.loads(r.read())["ready"])
        except (OSError, ValueError, KeyError):
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self._log.close()


@contextlib.contextmanager
def serving(args: Sequence[str], port: int, env: dict[str, str] | None = None) -> Iterator[str]:
    """A server process (``args``, run from the repository) until its engine has started: yields
    its ``http://`` base URL; its output is shown only if it fails to start."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings", "PYTHONUNBUFFERED": "1", **(env or {})}
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(list(args), cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    with urllib.request.urlopen(base + "/healthz", timeout=2) as r:
                        if json.loads(r.read())["ready"]:  # 503 (an HTTPError) while the models load
                            break
                except (OSError, ValueError, KeyError):
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    out.seek(0)
                    raise SystemExit("server did not start:\n" + out.read().decode(errors="replace"))
                time.sleep(0.2)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


_NOISE = re.compile(r"WSCONNECTING|WSCONNECT|WSDISCONNECT|HTTP GET|speech session closed")


def log_findings(path: Path, limit: int = 12) -> tuple[int, list[str]]:
    """Server log lines that are not routine (warnings, errors, tracebacks), deduplicated."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return 0, []
    flagged = [
        line
        for line in lines
        if re.search(r"WARNING|ERROR|CRITICAL|Traceback|Exception", line) and not _NOISE.search(line)
    ]
    unique: list[str] = []
    for line in flagged:
        key = re.sub(r"^\S+ \S+ ", "", line)  # drop the timestamp
        key = re.sub(r"\b[0-9a-f]{32}\b|\d+", "#", key)
        if key not in {re.sub(r"\b[0-9a-f]{32}\b|\d+", "#", re.sub(r"^\S+ \S+ ", "", u)) for u in unique}:
            unique.append(line)
    return len(flagged), unique[:limit]


def print_log_findings(path: Path) -> None:
    """The server log's ``log_findings``, as the video benches end their reports."""
    count, lines = log_findings(path)
    print(f"\nserver log: {count} warning/error lines ({path})")
    for line in lines:
        print(f"    {line}")


def process_cpu_seconds(pid: int | None) -> float:
    """user + system CPU of a process (all its threads), from /proc; NaN when unknown."""
    if pid is None:
        return math.nan
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# -- the three measurements -------------------------------------------------------------------------
@dataclass
class Section1:
    ws: list[float]
    engine: list[float]
    audio_s: float
    errors: list[str]


async def measure_ws_vs_engine(url: str, engine: InProcessEngine, n: int, warmup: int) -> Section1:
    ws_times: list[float] = []
    engine_times: list[float] = []
    errors: list[str] = []
    audio_s = math.nan
    async with ws_connect(url) as ws:
        await ws.send(config_msg())
        for i in range(warmup + n):
            # interleaved, so drift (CPU frequency, caches, other tenants) hits both alike
            e = await engine.first_audio(SHORT_SENTENCE)
            utt = await ws_utterance(ws, SHORT_SENTENCE)
            errors += utt.errors
            if i >= warmup:
                engine_times.append(e)
                ws_times.append(utt.first_audio)
                audio_s = utt.audio_seconds
        await ws.send(CLOSE_MSG)
    return Section1(ws_times, engine_times, audio_s, errors)


@dataclass
class Section2:
    short: list[float]
    long: list[float]
    engine_short: list[float]
    engine_long: list[float]
    short_sentences: int
    long_sentences: int
    errors: list[str]


async def measure_flush_length(url: str, engine: InProcessEngine, n: int, warmup: int) -> Section2:
    """WebSocket 1- vs 40-sentence flushes, plus the same pair on the in-process engine (attribution)."""
    long_text = long_flush_text(LONG_FLUSH_SENTENCES)
    short: list[float] = []
    long: list[float] = []
    e_short: list[float] = []
    e_long: list[float] = []
    errors: list[str] = []
    n_short = n_long = 0
    async with ws_connect(url) as ws:
        await ws.send(config_msg())
        for i in range(warmup + n):
            a = await ws_utterance(ws, SHORT_SENTENCE)
            b = await ws_utterance(ws, long_text, cancel_after_first=True)
            ea = await engine.first_audio(SHORT_SENTENCE)
            eb = await engine.first_audio(long_text)
            errors += a.errors + b.errors
            if i >= warmup:
                short.append(a.first_audio)
                long.append(b.first_audio)
                e_short.append(ea)
                e_long.append(eb)
                n_short, n_long = a.sentences, LONG_FLUSH_SENTENCES  # b was cancelled at its first audio
        await ws.send(CLOSE_MSG)
    return Section2(short, long, e_short, e_long, n_short, n_long, errors)


@dataclass
class TokenRun:
    """One token-streamed utterance; times in seconds from its first token."""

    split: str
    sentence_done: float  # the token that ends the first sentence ("... early.") was sent
    sentence_known: float  # the next word's first token: the server can tell the sentence is complete
    flushed: float  # input.done sent (after the last token)
    first_audio: float
    errors: list[str]

    @property
    def from_complete(self) -> float:
        return self.first_audio - self.sentence_done

    @property
    def from_known(self) -> float:
        return self.first_audio - self.sentence_known


async def token_run(ws: ClientConnection, text: str, split: str) -> TokenRun:
    """Stream ``text`` token by token at TOKENS_PER_SECOND, flush, and time the first audio."""
    tokens = llm_tokens(text)
    first_end = next(i for i, t in enumerate(tokens) if t.rstrip().endswith((".", "!", "?")))
    first_audio: float | None = None
    errors: list[str] = []

    async def read() -> None:
        nonlocal first_audio
        while True:
            msg = await ws.recv()
            if type(msg) is bytes:
                if first_audio is None:
                    first_audio = perf()
                continue
            data = json.loads(msg)
            if data.get("type") == "error":
                errors.append(str(data.get("message")))
            elif data.get("type") == "session.done":
                return

    reader = asyncio.ensure_future(read())
    t0 = perf()
    sent: list[float] = []
    for i, token in enumerate(tokens):
        await asyncio.sleep(max(0.0, t0 + i / TOKENS_PER_SECOND - perf()))
        sent.append(perf())
        await ws.send(text_msg(token))
    flushed = perf()
    await ws.send(DONE_MSG)
    await asyncio.wait_for(reader, timeout=120)
    first = math.nan if first_audio is None else first_audio - t0
    return TokenRun(split, sent[first_end] - t0, sent[first_end + 1] - t0, flushed - t0, first, errors)


async def measure_token_stream(url: str, n: int, warmup: int) -> list[TokenRun]:
    """The token stream, alternating ``sentence`` (speaks before the flush) and ``none`` sessions."""
    runs: list[TokenRun] = []
    async with ws_connect(url) as speak_early, ws_connect(url) as one_request:
        await speak_early.send(config_msg(split_granularity="sentence"))
        await one_request.send(config_msg())
        for i in range(warmup + n):
            for ws, split in ((speak_early, "sentence"), (one_request, "none")):
                run = await token_run(ws, PARAGRAPH, split)
                if i >= warmup:
                    runs.append(run)
        for ws in (speak_early, one_request):
            await ws.send(CLOSE_MSG)
    return runs


@dataclass
class Level:
    mode: str  # "burst" or "sustained"
    sessions: int
    utts: list[Utterance]
    failed_connects: int
    wall_s: float
    server_cpu_s: float
    client_cpu_s: float

    @property
    def complete(self) -> list[Utterance]:
        return [u for u in self.utts if u.t_first is not None and u.t_end is not None and not u.errors]

    @property
    def firsts(self) -> list[float]:
        return [u.first_audio for u in self.utts if u.t_first is not None]

    @property
    def rtfs(self) -> list[float]:
        return [u.rtf for u in self.complete]

    @property
    def gap_streams(self) -> list[Utterance]:
        return [u for u in self.complete if u.late_frames > 0]

    @property
    def failures(self) -> int:
        return self.failed_connects + (len(self.utts) - len(self.complete))

    def meets_targets(self) -> tuple[bool, bool, bool]:
        rtfs = self.rtfs
        all_fast = self.failures == 0 and bool(rtfs) and min(rtfs) > 1.0
        no_gaps = self.failures == 0 and not self.gap_streams
        p95_ok = self.failures == 0 and pct(self.firsts, 95) <= TARGET_P95_FIRST_AUDIO_S
        return all_fast, no_gaps, p95_ok


async def measure_level(
    url: str,
    sessions: int,
    server_pid: int | None,
    mode: str = "burst",
    rounds: int = 3,
    para_s: float = 9.0,
    text: str = PARAGRAPH,
) -> Level:
    """``sessions`` connections, configured and holding the paragraph.

    burst: all flush at the same instant (a cold start of every session at once).
    sustained: session k starts ``k * para_s / sessions`` after the first (arrivals spread over one
    paragraph) and then speaks ``rounds`` paragraphs back to back, each flushed when the player has
    finished the previous one: ``sessions`` streams playing concurrently, as in a live deployment.
    """
    barrier = asyncio.Event()
    ready = 0
    all_ready = asyncio.Event()
    utts: list[Utterance] = []
    failed = 0

    def mark_ready() -> None:
        nonlocal ready
        ready += 1
        if ready == sessions:
            all_ready.set()

    async def session(index: int) -> None:
        nonlocal failed
        is_ready = measured = False
        try:
            async with ws_connect(url) as ws:
                await ws.send(config_msg())
                await ws.send(text_msg(text))
                is_ready = True
                mark_ready()
                await barrier.wait()
                if mode == "sustained":
                    await asyncio.sleep(index * para_s / sessions)
                for r in range(rounds if mode == "sustained" else 1):
                    if r:
                        await ws.send(text_msg(text))
                    utt = Utterance()
                    await send_flush(ws, utt)
                    try:
                        await asyncio.wait_for(receive_utterance(ws, utt), timeout=300)
                    except TimeoutError:
                        utt.errors.append("no session.done within 300 s")
                    utts.append(utt)
                    measured = True
                    if utt.t_first is not None:  # the next flush when this paragraph has played
                        await asyncio.sleep(max(0.0, utt.t_first + utt.audio_seconds - perf()))
                await ws.send(CLOSE_MSG)
        except Exception as exc:  # a refused or dropped connection counts as a failed stream
            if not measured:
                failed += 1
                print(f"  [{sessions} sessions] connection failed: {exc!r}", file=sys.stderr)
            if not is_ready:
                mark_ready()

    tasks = [asyncio.ensure_future(session(i)) for i in range(sessions)]
    await asyncio.wait_for(all_ready.wait(), timeout=120)
    await asyncio.sleep(0.2)  # let the server finish handling the configs before the flush
    cpu_server0, cpu_client0, t0 = process_cpu_seconds(server_pid), client_cpu_seconds(), perf()
    barrier.set()
    await asyncio.gather(*tasks)
    wall = perf() - t0
    server_cpu = process_cpu_seconds(server_pid) - cpu_server0
    return Level(mode, sessions, utts, failed, wall, server_cpu, client_cpu_seconds() - cpu_client0)


# -- the burst against its floor --------------------------------------------------------------------
def floor_unit_seconds(text: str, repeats: int = 40) -> float:
    """G2P + one talker run of ``text``'s first sentence, alone, one onnxruntime thread (median s).

    The talker's own ONNX session and G2P, loaded here in the bench process (not the server's).
    """
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")
    import django

    django.setup()
    import numpy as np
    import onnxruntime as ort
    from hibari import Hibari, voices

    from speech.tts.model import capabilities
    from speech.tts.text import model_text, split_text

    voice = capabilities().default_voice
    path = voices.voice_path(voice, download_missing=False)
    hib = Hibari(voice=voice, model=path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    first = split_text(text, "sentence")[0]

    def unit() -> None:
        for ps in hib.phonemize(model_text(first)):
            ids = hib.ids(ps)
            sess.run(None, {"ids": np.asarray([ids], np.int64), "speed": np.asarray([1.0], np.float32)})

    unit()
    times = []
    for _ in range(repeats):
        t0 = perf()
        unit()
        times.append(perf() - t0)
    return pct(times, 50)


@dataclass
class EngineBurst:
    """One burst straight into an in-process scheduler: no WebSocket, no consumer, no client."""

    firsts: list[float]  # seconds from the burst's submit to each request's first audio chunk
    cpu_before_p95: dict[str, float]  # thread CPU s of the steps that ran before the p95 first audio, by kind


def engine_burst(sessions: int, rounds: int) -> list[EngineBurst]:
    """``rounds`` bursts of ``sessions`` requests for ``BURST_TEXT`` submitted to a scheduler in this
    process at the same instant, with the server's engine settings; every step's thread CPU is
    accounted by kind (first-sentence talker, later talker, vocoder), so the share of the gap that
    is the engine's own work, not the transport's, is visible."""
    import threading

    from django.conf import settings

    from omniweb.engine.scheduler import Scheduler
    from speech.tts.loops import PIPELINE, TtsPipeline

    steps: list[tuple[float, float, str, float]] = []  # (start, end, kind, thread CPU s)

    class Accounted(Scheduler):
        @staticmethod
        def _run(plans):  # type: ignore[no-untyped-def]
            t0, c0 = perf(), time.thread_time()
            out = Scheduler._run(plans)
            kind = plans[0].kind
            if kind == "talker":
                kind = "talker, first sentence" if plans[0].label.endswith("sentence0") else "talker, later sentences"
            steps.append((t0, perf(), kind, time.thread_time() - c0))
            return out

    scheduler = Accounted(
        {PIPELINE: TtsPipeline()},
        workers=settings.ENGINE_WORKERS,
        max_batch=settings.ENGINE_MAX_BATCH,
        batch_wait=settings.ENGINE_BATCH_WAIT_MS / 1000.0,
        max_ahead=settings.ENGINE_MAX_AHEAD_SECONDS,
        first_media_budget=settings.ENGINE_FIRST_AUDIO_BUDGET_MS / 1000.0,
    )
    scheduler.start()
    results = []
    try:
        for r in range(rounds + 1):  # the first round warms up
            steps.clear()
            first: dict[int, float] = {}
            ended = threading.Semaphore(0)

            def sink(chunk: Any, i: int, first: dict[int, float] = first, ended: threading.Semaphore = ended) -> None:
                if chunk.TYPE == "audio" and i not in first:
                    first[i] = perf()
                if chunk.TYPE == "end":
                    ended.release()

            time.sleep(0.5)
            t0 = perf()
            for i in range(sessions):
                scheduler.submit(f"burst{r}-{i}", InProcessEngine.request(BURST_TEXT), lambda c, i=i: sink(c, i))
            for _ in range(sessions):
                ended.acquire(timeout=300)
            firsts = [first[i] - t0 for i in sorted(first)]
            t95 = t0 + pct(firsts, 95)
            cpu: dict[str, float] = {}
            for a, b, kind, c in steps:
                if a < t95:  # a step that straddles the p95 counts for its share before it
                    cpu[kind] = cpu.get(kind, 0.0) + c * (min(b, t95) - a) / max(b - a, 1e-9)
            if r:
                results.append(EngineBurst(firsts, cpu))
    finally:
        scheduler.stop()
    return results


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def target(args: argparse.Namespace) -> tuple[Server | None, int | None, str]:
    """The server to measure: ``--url`` (with ``--server-pid`` for its CPU), else one started here."""
    if args.url:
        return None, args.server_pid, endpoint(args.url)
    log_path = Path(args.log) if args.log else Path(tempfile.mkstemp(prefix="omniweb-bench-", suffix=".log")[1])
    server = Server(free_port(), log_path)
    return server, server.proc.pid, server.url


async def run_burst(args: argparse.Namespace) -> int:
    """Only the burst: floor, ``rounds`` bursts of ``sessions`` flushing ``BURST_TEXT``, floor again."""
    sessions, rounds = args.burst_sessions, args.burst_rounds
    server, server_pid, url = target(args)
    levels: list[Level] = []
    try:
        if server is not None:
            await server.wait_accepting()
        deadline = perf() + 180
        while True:  # daphne drops a handshake after 5 s: retry while the engine preloads
            try:
                async with ws_connect(url) as ws:
                    await ws.send(config_msg())
                    warm = await ws_utterance(ws, BURST_TEXT)
                    await ws.send(CLOSE_MSG)
                break
            except (OSError, websockets.exceptions.WebSocketException):
                if perf() > deadline:
                    raise
                await asyncio.sleep(1.0)
        if warm.errors or warm.t_first is None:
            raise RuntimeError(f"warm-up utterance failed: {warm.errors}")
        load_before = load_average()
        unit_before = await asyncio.to_thread(floor_unit_seconds, BURST_TEXT)
        for r in range(rounds):
            print(f"burst {r + 1}/{rounds}: {sessions} sessions ...", file=sys.stderr)
            await asyncio.sleep(1.0)
            levels.append(await measure_level(url, sessions, server_pid, mode="burst", text=BURST_TEXT))
        unit_after = await asyncio.to_thread(floor_unit_seconds, BURST_TEXT)
        load_after = load_average()
    finally:
        if server is not None:
            server.stop()
    # The same bursts with the engine alone, after the server has stopped (no CPU shared with it).
    engine_rounds = rounds if args.burst_engine_rounds is None else args.burst_engine_rounds
    engine_only: list[EngineBurst] = []
    if engine_rounds > 0:
        print(f"engine only: {engine_rounds} bursts of {sessions} requests in this process ...", file=sys.stderr)
        engine_only = await asyncio.to_thread(engine_burst, sessions, engine_rounds)
    cores = os.cpu_count() or 1
    unit = (unit_before + unit_after) / 2
    floor = sessions * unit / cores
    firsts = [f for lv in levels for f in lv.firsts]
    gaps = sum(len(lv.gap_streams) for lv in levels)
    worst = max((u.max_late for lv in levels for u in lv.complete), default=0.0)
    failures = sum(lv.failures for lv in levels)
    p50, p95 = pct(firsts, 50), pct(firsts, 95)
    ratio = p95 / floor
    print(f"\n## Burst: {sessions} sessions flush {BURST_TEXT!r} at once ({rounds} rounds)\n")
    print(f"- machine: {cores} CPUs, load average {load_before} before, {load_after} after (shared machine)")
    print(f"- engine settings: {engine_settings()}")
    print(
        f"- floor unit (G2P + one talker run of the first sentence, alone, 1 thread): {unit * 1000:.2f} ms "
        f"(before {unit_before * 1000:.2f}, after {unit_after * 1000:.2f})"
    )
    print(f"- floor = {sessions} × {unit * 1000:.2f} ms / {cores} cores = {floor * 1000:.1f} ms\n")
    print(
        "| round | first audio p50 ms | p95 ms | max ms | p95 / floor | utterances with gaps | failures "
        "| wall s | server CPU s | bench CPU s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, lv in enumerate(levels, 1):
        f = lv.firsts
        print(
            f"| {i} | {ms(pct(f, 50))} | {ms(pct(f, 95))} | {ms(max(f, default=math.nan))} | "
            f"{pct(f, 95) / floor:.2f}× | {len(lv.gap_streams)} | {lv.failures} | {lv.wall_s:.2f} | "
            f"{lv.server_cpu_s:.2f} | {lv.client_cpu_s:.2f} |"
        )
    wall, server_cpu, bench_cpu = (
        sum(getattr(lv, k) for lv in levels) for k in ("wall_s", "server_cpu_s", "client_cpu_s")
    )
    print(
        f"| all | {ms(p50)} | {ms(p95)} | {ms(max(firsts, default=math.nan))} | {ratio:.2f}× | {gaps} | {failures} "
        f"| {wall:.2f} | {server_cpu:.2f} | {bench_cpu:.2f} |"
    )
    if engine_only:
        report_engine_burst(engine_only, sessions, unit, floor)
    ok = ratio <= TARGET_BURST_VS_FLOOR and not gaps and not failures
    print(
        f"\n- {verdict(ok)}: p95 first audio {ms(p95)} ms ≤ {TARGET_BURST_VS_FLOOR}× floor ({ratio:.2f}×), "
        f"no playback gaps ({gaps}; worst lateness {ms(worst)} ms), no failures ({failures})"
    )
    return 0 if ok else 1


def report_engine_burst(engine_only: list[EngineBurst], sessions: int, unit: float, floor: float) -> None:
    """The engine-only bursts: first audio against the same floor, and the CPU spent before the p95."""
    print(
        "\nThe same bursts straight into a scheduler in this process (the server stopped; no WebSocket, "
        "no consumer, no client), and the thread CPU (ms) of the steps that ran before the p95 first audio:\n"
    )
    kinds = sorted({k for eb in engine_only for k in eb.cpu_before_p95})
    print("| round | first audio p50 ms | p95 ms | p95 / floor | " + " | ".join(f"{k} CPU ms" for k in kinds) + " |")
    print("|---:|---:|---:|---:|" + "---:|" * len(kinds))
    for i, eb in enumerate(engine_only, 1):
        cells = " | ".join(ms(eb.cpu_before_p95.get(k, 0.0)) for k in kinds)
        e95 = pct(eb.firsts, 95)
        print(f"| {i} | {ms(pct(eb.firsts, 50))} | {ms(e95)} | {e95 / floor:.2f}× | {cells} |")
    print(
        f"\n(The p95 first audio comes after about {0.95 * sessions:.0f} first sentences: "
        f"{0.95 * sessions:.0f} floor units are {0.95 * sessions * unit * 1000:.0f} ms of work.)"
    )


# -- report -----------------------------------------------------------------------------------------
def report_tokens(runs: list[TokenRun], verdicts: list[tuple[str, bool]]) -> None:
    out = print
    n_tokens = len(llm_tokens(PARAGRAPH))
    out(
        f"\n### 5. Token stream: {n_tokens} word tokens at {TOKENS_PER_SECOND:.0f}/s, then input.done "
        f"(N={len(runs) // 2} per split)\n"
    )
    out("| split | measured from | p50 ms | p95 ms | min ms | max ms |")
    out("|---|---|---:|---:|---:|---:|")
    early = [r for r in runs if r.split == "sentence"]
    late = [r for r in runs if r.split == "none"]
    rows = (
        ("sentence", "token ending the first sentence → first audio", [r.from_complete for r in early]),
        ("sentence", "next word's token (sentence known complete) → first audio", [r.from_known for r in early]),
        (
            "sentence",
            "input.done → first audio (negative: before the flush)",
            [r.first_audio - r.flushed for r in early],
        ),
        ("none (default)", "token ending the first sentence → first audio (info)", [r.from_complete for r in late]),
        ("none (default)", "input.done → first audio (info)", [r.first_audio - r.flushed for r in late]),
    )
    for split, label, xs in rows:
        out(f"| {split} | {label} | {stats_cells(xs)} |")
    errors = [e for r in runs for e in r.errors]
    heard_early = all(r.first_audio < r.flushed for r in early)
    p50 = pct([r.from_complete for r in early], 50)
    verdicts.append(
        (
            f"token stream: the first sentence is heard before the flush in every run "
            f"(p50 {ms(p50)} ms after its last token)",
            heard_early and bool(early) and not errors,
        )
    )


def report(s1: Section1, s2: Section2, levels: list[Level], meta: dict[str, Any]) -> list[tuple[str, bool]]:
    out = print
    verdicts: list[tuple[str, bool]] = []

    out(f"\n## Streaming TTS latency bench ({meta['mode']} mode)\n")
    out(f"- server: {meta['server']}")
    out(f"- machine: {os.cpu_count()} CPUs; engine settings: {meta['engine_settings']}")
    out(
        f"- texts: short = {SHORT_SENTENCE!r} ({s1.audio_s:.2f} s audio); paragraph = {meta['para_sent']} "
        f"sentences, {meta['para_audio']:.2f} s audio; long flush = {s2.long_sentences} sentences "
        "(cancelled at its first audio: only first audio is measured)"
    )

    out(f"\n### 1. Time to first audio, one session: WebSocket vs engine (N={len(s1.ws)})\n")
    out("| path | p50 ms | p95 ms | min ms | max ms |")
    out("|---|---:|---:|---:|---:|")
    for name, xs in (
        ("WebSocket (input.done → first binary frame)", s1.ws),
        ("engine in-process (submit → first audio chunk)", s1.engine),
    ):
        out(f"| {name} | {stats_cells(xs)} |")
    r50 = pct(s1.ws, 50) / pct(s1.engine, 50)
    r95 = pct(s1.ws, 95) / pct(s1.engine, 95)
    out(f"| **ratio WS / engine** | **{r50:.2f}×** | {r95:.2f}× | | |")
    verdicts.append(
        (
            f"WS first audio ≤ {TARGET_WS_VS_ENGINE}× engine (p50 ratio {r50:.2f}×)",
            r50 <= TARGET_WS_VS_ENGINE and not s1.errors,
        )
    )

    out(f"\n### 2. Time to first audio: 40-sentence flush vs 1-sentence flush, one session (N={len(s2.long)} each)\n")
    out("| flush | sentences | p50 ms | p95 ms | min ms | max ms |")
    out("|---|---:|---:|---:|---:|---:|")
    for name, n_sent, xs in (
        ("WebSocket, 1 sentence", s2.short_sentences, s2.short),
        ("WebSocket, 40 sentences", s2.long_sentences, s2.long),
    ):
        out(f"| {name} | {n_sent} | {stats_cells(xs)} |")
    f50 = pct(s2.long, 50) / pct(s2.short, 50)
    f95 = pct(s2.long, 95) / pct(s2.short, 95)
    out(f"| **WebSocket ratio 40 / 1** | | **{f50:.2f}×** | {f95:.2f}× | | |")
    for name, n_sent, xs in (
        ("engine in-process, 1 sentence (info)", s2.short_sentences, s2.engine_short),
        ("engine in-process, 40 sentences (info)", s2.long_sentences, s2.engine_long),
    ):
        out(f"| {name} | {n_sent} | {stats_cells(xs)} |")
    e50 = pct(s2.engine_long, 50) / pct(s2.engine_short, 50)
    e95 = pct(s2.engine_long, 95) / pct(s2.engine_short, 95)
    out(f"| engine ratio 40 / 1 (info) | | {e50:.2f}× | {e95:.2f}× | | |")
    verdicts.append(
        (
            f"40-sentence flush first audio ≤ {TARGET_LONG_VS_SHORT}× 1-sentence (p50 ratio {f50:.2f}×)",
            f50 <= TARGET_LONG_VS_SHORT and not s2.errors,
        )
    )

    titles = {
        "sustained": "### 3. Concurrency: N sessions streaming at once (arrivals spread over one paragraph, "
        "each speaking paragraphs back to back at playback pace; every utterance counted)",
        "burst": "### 4. Burst: N sessions flush at the same instant (cold start of all of them; info)",
    }
    for mode in ("sustained", "burst"):
        rows = [lv for lv in levels if lv.mode == mode]
        if not rows:
            continue
        out(f"\n{titles[mode]}\n")
        out(
            "| sessions | utterances ok | first audio p50 ms | p95 ms | max ms | × real time p50 | × real time min "
            "| utterances with gaps | worst lateness ms | late frames | wall s | server CPU s | bench CPU s |"
        )
        out("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for lv in rows:
            f, r = lv.firsts, lv.rtfs
            gaps = lv.gap_streams
            worst = max((u.max_late for u in lv.complete), default=math.nan)
            late_frames = sum(u.late_frames for u in lv.complete)
            out(
                f"| {lv.sessions} | {len(lv.complete)}/{len(lv.utts) + lv.failed_connects} | {ms(pct(f, 50))} | "
                f"{ms(pct(f, 95))} | {ms(max(f, default=math.nan))} | {pct(r, 50):.1f} | "
                f"{min(r, default=math.nan):.2f} | {len(gaps)} | {ms(worst) if gaps else '0'} | {late_frames} | "
                f"{lv.wall_s:.2f} | {lv.server_cpu_s:.2f} | {lv.client_cpu_s:.2f} |"
            )
        target_level = next((lv for lv in rows if lv.sessions == TARGET_LEVEL), None)
        if target_level is None:
            target_level = max(rows, key=lambda lv: lv.sessions)
            out(f"\n(no {TARGET_LEVEL}-session level was run; the targets below apply to {target_level.sessions})")
        n = target_level.sessions
        tag = "" if mode == "sustained" else " (burst, info)"
        all_fast, no_gaps, p95_ok = target_level.meets_targets()
        verdicts.append(
            (
                f"{n} sessions{tag}: every stream faster than real time (slowest "
                f"{min(target_level.rtfs, default=math.nan):.2f}× real time, failures {target_level.failures})",
                all_fast,
            )
        )
        verdicts.append(
            (f"{n} sessions{tag}: no playback gaps ({len(target_level.gap_streams)} utterances with gaps)", no_gaps)
        )
        verdicts.append(
            (
                f"{n} sessions{tag}: p95 first audio ≤ {TARGET_P95_FIRST_AUDIO_S * 1000:.0f} ms "
                f"({ms(pct(target_level.firsts, 95))} ms)",
                p95_ok,
            )
        )

    if meta.get("tokens"):
        report_tokens(meta["tokens"], verdicts)

    out("\n### Targets\n")
    for text, ok in verdicts:
        out(f"- {verdict(ok)}: {text}")

    errors = s1.errors + s2.errors + [e for lv in levels for u in lv.utts for e in u.errors]
    failed = sum(lv.failed_connects for lv in levels)
    if errors or failed:
        out(f"\nclient-side errors: {len(errors)} error messages, {failed} failed connections")
        for e in sorted(set(errors))[:10]:
            out(f"- {e}")
    if meta.get("log") is not None:
        count, lines = meta["log"]
        out(f"\nserver log: {count} warning/error lines ({meta['log_path']})")
        for line in lines:
            out(f"    {line}")
    return verdicts


# -- main -------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="use this running server (ws://host:port or the full endpoint URL)")
    p.add_argument("--quick", action="store_true", help="smaller N, for smoke runs")
    p.add_argument("--levels", default="1,8,32,64", help="concurrency levels, comma-separated")
    p.add_argument("--server-pid", type=int, help="with --url: the server's pid, to report its CPU time per level")
    p.add_argument("--log", help="where to keep the started server's log (default: a temp file)")
    p.add_argument("--burst", action="store_true", help="only the burst of BURST_TEXT against its floor")
    p.add_argument("--burst-sessions", type=int, default=64, help="with --burst: sessions per burst")
    p.add_argument("--burst-rounds", type=int, default=3, help="with --burst: bursts in the run")
    p.add_argument(
        "--burst-engine-rounds",
        type=int,
        help="with --burst: engine-only bursts after the server stops (default: --burst-rounds; 0: none)",
    )
    return p.parse_args(argv)


def endpoint(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith(WS_PATH) else url + WS_PATH


def engine_settings() -> str:
    from django.conf import settings

    names = (
        "DEVICE",
        "ENGINE_WORKERS",
        "ENGINE_MAX_BATCH",
        "TTS_THREADS",
        "TALKER_LOOKAHEAD",
        "VOCODER_CHUNK_FRAMES",
        "VOCODER_FIRST_CHUNK_FRAMES",
    )
    return ", ".join(f"{n}={getattr(settings, n)}" for n in names)


async def run(args: argparse.Namespace) -> int:
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    n1, n2, warm = (8, 4, 2) if args.quick else (30, 15, 3)

    server, server_pid, url = target(args)
    try:
        print(f"server: {'existing ' + url if args.url else f'pid {server.proc.pid} at {url}'}", file=sys.stderr)
        if server is not None:
            await server.wait_accepting()
        print("loading the in-process engine (its own model copy) ...", file=sys.stderr)
        engine = await asyncio.to_thread(InProcessEngine)
        # First session waits for the server's engine preload; doubles as the paragraph calibration.
        async with ws_connect(url) as ws:
            await ws.send(config_msg())
            para = await ws_utterance(ws, PARAGRAPH)
            if para.errors or para.t_first is None:
                raise RuntimeError(f"warm-up utterance failed: {para.errors}")
            await ws.send(CLOSE_MSG)

        print(f"1/3 WebSocket vs engine, N={n1} ...", file=sys.stderr)
        s1 = await measure_ws_vs_engine(url, engine, n1, warm)

        print(f"2/3 40-sentence vs 1-sentence flush, N={n2} ...", file=sys.stderr)
        s2 = await measure_flush_length(url, engine, n2, warm)
        engine.shutdown()  # its worker threads must not share the CPUs with what follows

        print(f"token stream at {TOKENS_PER_SECOND:.0f} tokens/s, N={n2} per split ...", file=sys.stderr)
        tokens = await measure_token_stream(url, n2, warm)

        results: list[Level] = []
        rounds = 2 if args.quick else 3
        for mode in ("sustained", "burst"):
            for n in levels:
                print(f"3/3 {mode} concurrency {n} ...", file=sys.stderr)
                await asyncio.sleep(1.0)  # let the previous level's sessions close
                results.append(
                    await measure_level(url, n, server_pid, mode=mode, rounds=rounds, para_s=para.audio_seconds)
                )
    finally:
        if server is not None:
            server.stop()

    meta = {
        "mode": "quick" if args.quick else "full",
        "server": f"started here ({url}, log {server.log_path})" if server else f"existing ({url})",
        "engine_settings": engine_settings(),
        "para_sent": len(re.findall(r"[.!?](?:\s|$)", PARAGRAPH)),
        "tokens": tokens,
        "para_audio": para.audio_seconds,
        "log": log_findings(server.log_path) if server else None,
        "log_path": server.log_path if server else None,
    }
    verdicts = report(s1, s2, results, meta)
    return 0 if all(ok for text, ok in verdicts if "(burst, info)" not in text) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return asyncio.run(run_burst(args) if args.burst else run(args))


if __name__ == "__main__":
    sys.exit(main())
