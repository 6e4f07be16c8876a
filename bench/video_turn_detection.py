#!/usr/bin/env python
"""Server turn detection on ``/v1/video/chat/stream`` (``turn_detection: server_vad``), end to end.

Against one server (started here unless ``--url`` names one), a client streams its microphone in
real time (20 ms ``audio.chunk``s: a spoken question in our own voice, then silence) with camera
frames buffered, and measures:

1. the speech's end on the stream (measured on the waveform) → ``input_audio_buffer.speech_stopped``
   (by design at least ``silence_duration_ms``, 500 ms), and speech_stopped → ``input.transcript``,
   ``response.start``, the first text delta and the first audio delta;
2. barge-in: a question spoken while a long answer (asked by ``video.query``) is being spoken: the
   speech onset on the stream → ``speech_started`` received, and how many messages of that answer
   still arrived after it (0: the answer stopped at once);
3. the cost of the answer's word timings (the talker's alignment, asked for by every spoken video
   answer now): one talker step per sentence with and without timings, side by side in-process.

Usage (repository root, venv active)::

    python bench/video_turn_detection.py            # 5 turns, starts its own server
    python bench/video_turn_detection.py --quick    # 2 turns
    python bench/video_turn_detection.py --url ws://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.signal import resample_poly
from speech_latency import Server, free_port, load_average, ms, pct, print_log_findings, verdict
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidMessage

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support.camera_scenes import room, shoot, with_person  # noqa: E402

WS_PATH = "/v1/video/chat/stream"
RATE = 16_000
CHUNK_MS = 20
SILENCE_MS = 500
QUESTIONS = ["How many people can you see?", "Is it dark in here?", "What colour is the wall?"]
BARGE_IN = "Wait, stop, what is on the desk?"
LONG_QUESTION = "Describe everything you see in detail."
TARGET_STOP_S = SILENCE_MS / 1000 + 0.15  # the silence itself, then at most a few windows and a send
TARGET_BARGE_IN_S = 0.150  # onset on the stream → speech_started (detection needs ~2 windows)
perf = time.perf_counter


def spoken(text: str, seed: int = 7) -> np.ndarray:
    """Our voice at 16 kHz, float32."""
    from hibari import Hibari

    return resample_poly(Hibari()(text, seed=seed), 2, 3).astype(np.float32)


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def quiet(ms_: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.001, RATE * ms_ // 1000).astype(np.float32)


def extent_ms(audio: np.ndarray) -> tuple[float, float]:
    """Where the speech is on the waveform: 10 ms RMS within 30 dB of its loudest."""
    rms = np.sqrt(np.convolve(audio.astype(np.float64) ** 2, np.ones(160) / 160, "same"))
    loud = np.flatnonzero(rms > rms.max() * 10 ** (-30 / 20))
    return 1000.0 * loud[0] / RATE, 1000.0 * loud[-1] / RATE


def camera_frames(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [
        base64.b64encode(shoot(with_person(room(), 200 + 40 * i, 170, arm_deg=20 * i), rng)).decode() for i in range(n)
    ]


class Listener:
    """Every message the server sends, with its arrival time."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.got: list[tuple[float, dict[str, Any]]] = []
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        async for raw in self.ws:
            self.got.append((perf(), json.loads(raw)))

    def first(self, kind: str, after: float = 0.0) -> float | None:
        return next((t for t, m in self.got if m.get("type") == kind and t >= after), None)

    async def wait(self, kind: str, after: float = 0.0, timeout: float = 60.0) -> float:
        deadline = perf() + timeout
        while perf() < deadline:
            if (t := self.first(kind, after)) is not None:
                return t
            await asyncio.sleep(0.005)
        raise TimeoutError(f"no {kind} within {timeout} s")


async def stream_real_time(ws: ClientConnection, pcm: bytes, started: float) -> None:
    """20 ms chunks, each sent when its audio would have been captured."""
    step = RATE * 2 * CHUNK_MS // 1000
    for i, at in enumerate(range(0, len(pcm), step)):
        delay = started + (i + 1) * CHUNK_MS / 1000 - perf()
        if delay > 0:
            await asyncio.sleep(delay)
        await ws.send(json.dumps({"type": "audio.chunk", "data": base64.b64encode(pcm[at : at + step]).decode()}))


async def one_turn(url: str, frames: list[str], question: np.ndarray, barge: np.ndarray | None) -> dict[str, float]:
    config = {
        "type": "session.config",
        "turn_detection": {"type": "server_vad", "silence_duration_ms": SILENCE_MS},
    }
    out: dict[str, float] = {}
    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps(config))
        for f in frames:
            await ws.send(json.dumps({"type": "video.frame", "data": f}))
        seen = Listener(ws)
        lead = quiet(600, 1)
        audio = np.concatenate([lead, question, quiet(SILENCE_MS + 400, 2)])
        _, end = extent_ms(question)
        t0 = perf()
        await stream_real_time(ws, pcm16(audio), t0)
        stopped = await seen.wait("input_audio_buffer.speech_stopped", t0)
        out["stop"] = stopped - (t0 + (len(lead) / RATE + end / 1000))
        for key, kind in (
            ("transcript", "input.transcript"),
            ("start", "response.start"),
            ("text", "response.text.delta"),
            ("audio", "response.audio.delta"),
        ):
            out[key] = await seen.wait(kind, stopped) - stopped
        if barge is not None:
            # A long answer, so the barge-in lands while it is being spoken.
            await seen.wait("response.text.done", stopped)
            await asyncio.sleep(0.5)  # the first answer's audio may go on; a new query interrupts it
            asked = perf()
            await ws.send(json.dumps({"type": "video.query", "text": LONG_QUESTION}))
            await seen.wait("response.start", asked)  # the answer is being written and spoken
            onset, _ = extent_ms(barge)
            t1 = perf()
            await stream_real_time(ws, pcm16(np.concatenate([barge, quiet(SILENCE_MS + 400, 4)])), t1)
            started = await seen.wait("input_audio_buffer.speech_started", t1)
            out["barge"] = started - (t1 + onset / 1000)
            first_answer = {"response.audio.delta", "response.text.delta", "response.audio.done", "response.text.done"}
            next_start = seen.first("response.start", started) or float("inf")
            out["after"] = sum(1 for t, m in seen.got if started < t < next_start and m.get("type") in first_answer)
            done = seen.first("response.audio.done", asked)
            out["first_finished"] = float(done is not None and done < started)
            await seen.wait("response.text.done", started)
        seen.task.cancel()
    return out


async def warm_up(url: str, frames: list[str], question: np.ndarray, timeout: float = 180.0) -> None:
    """One turn once the engine has loaded (daphne drops handshakes that wait longer than 5 s)."""
    deadline = perf() + timeout
    while True:
        try:
            await one_turn(url, frames, question, None)
            return
        except (OSError, InvalidHandshake, InvalidMessage):
            if perf() > deadline:
                raise
            await asyncio.sleep(1.0)


def word_timing_cost(repeats: int) -> tuple[float, float]:
    """Seconds per talker step (one sentence) without and with word timings, interleaved."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")
    import django

    django.setup()
    from speech.tts.model import HibariTalker

    talker = HibariTalker()
    voice = talker.caps.default_voice
    sentence = "I can see one person at the desk, and the room is brightly lit."
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(repeats):
        for timestamps in (False, True):
            t = perf()
            talker.talk(voice, 0, sentence, 1.0, np.random.default_rng(i), None, timestamps, exact_noise=False)
            times[timestamps].append(perf() - t)
    return pct(times[False], 50), pct(times[True], 50)


async def run(args: argparse.Namespace) -> int:
    n = 2 if args.quick else args.turns
    print("making the spoken questions ...", file=sys.stderr)
    questions = [spoken(QUESTIONS[i % len(QUESTIONS)], seed=7 + i) for i in range(n)]
    barge = spoken(BARGE_IN)
    frames = camera_frames(4)
    server: Server | None = None
    if args.url:
        url = args.url.rstrip("/") + WS_PATH
    else:
        log_path = Path(tempfile.mkstemp(prefix="omniweb-vadbench-", suffix=".log")[1])
        server = Server(free_port(), log_path)
        url = f"ws://127.0.0.1:{server.port}{WS_PATH}"
    runs: list[dict[str, float]] = []
    try:
        if server is not None:
            await server.wait_accepting()
        print(f"server at {url}; warming up ...", file=sys.stderr)
        await warm_up(url, frames, questions[0])
        for i in range(n):
            print(f"turn {i + 1}/{n} ...", file=sys.stderr)
            runs.append(await one_turn(url, frames, questions[i], barge))
    finally:
        if server is not None:
            server.stop()
    plain, timed = word_timing_cost(10 if args.quick else 30)

    def row(label: str, key: str) -> str:
        xs = [r[key] for r in runs]
        return f"| {label} | {ms(pct(xs, 50))} | {ms(max(xs))} |"

    print(f"\n## Server turn detection on the video protocol ({n} turns; load average {load_average()})\n")
    print("| interval | p50 ms | max ms |\n|---|---|---|")
    print(row(f"speech end → speech_stopped (silence_duration_ms {SILENCE_MS})", "stop"))
    print(row("speech_stopped → input.transcript", "transcript"))
    print(row("speech_stopped → response.start", "start"))
    print(row("speech_stopped → first text delta", "text"))
    print(row("speech_stopped → first audio delta", "audio"))
    print(row("barge-in: speech onset → speech_started", "barge"))
    after = [r["after"] for r in runs]
    finished = sum(r["first_finished"] for r in runs)
    print(f"\nMessages of the interrupted answer after speech_started: max {max(after):.0f} over {n} barge-ins")
    print(f"(answers the server had finished sending before the barge-in was detected: {finished:.0f};")
    print("a client stops playing those on speech_started)")
    print("\n| talker step, one sentence | p50 ms |\n|---|---|")
    print(f"| without word timings | {plain * 1000:.1f} |\n| with word timings | {timed * 1000:.1f} |")
    print(f"\nword timings add {100 * (timed / plain - 1):.1f} % to a talker step")
    stop_p50 = pct([r["stop"] for r in runs], 50)
    barge_p50 = pct([r["barge"] for r in runs], 50)
    verdicts = [
        (f"speech end → speech_stopped p50 ≤ {TARGET_STOP_S * 1000:.0f} ms", stop_p50 <= TARGET_STOP_S),
        (f"barge-in onset → speech_started p50 ≤ {TARGET_BARGE_IN_S * 1000:.0f} ms", barge_p50 <= TARGET_BARGE_IN_S),
        ("nothing of an interrupted answer after speech_started", max(after) == 0),
    ]
    print("\n### Targets\n")
    for text, ok in verdicts:
        print(f"- {verdict(ok)}: {text}")
    if server is not None:
        print_log_findings(server.log_path)
    return 0 if all(ok for _, ok in verdicts) else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server's ws:// base URL (default: start one here)")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
