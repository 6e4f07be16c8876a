#!/usr/bin/env python
"""Cost of server voice-activity detection per 32 ms window: the Silero model alone, and through the engine.

1. **Model alone** (``SileroVad.probs``): k windows per call for k in ``--windows`` (1 is what a
   client streaming 20 ms chunks mostly causes; larger k is a client sending bigger chunks). Each
   configuration runs for about ``--seconds`` of wall time, the configurations interleaved over
   ``--repeats`` rounds; reported: the median wall and process-CPU time per window.
2. **Through the engine**: S sessions (``--sessions``), each a ``VoiceActivity`` on an in-process
   engine that holds only the ``audio.vad`` pipeline (2 workers, as the default server), stream
   ``--audio-seconds`` of speech-and-silence audio in 20 ms chunks as fast as the engine answers
   (unpaced: a load test, not real time), at 16 kHz and at 24 kHz (resampled in the session).
   ``max_batch`` 16 (the default) and 1 run side by side. Reported: wall and process CPU time per
   window (all sessions' windows), and the real-time sessions one CPU core could serve at that
   cost (1000 ms ÷ (CPU ms per window × 31.25 windows per second)).

The process CPU time includes the session side (resampling, asyncio, the scheduler's threads),
so it is the whole cost of VAD on an embedded server. Timing on a shared machine varies; the CPU
figures are steadier than the wall ones. Prints a markdown report to stdout.

Usage (from the repository root, venv active)::

    python bench/vad.py            # ~1 min on 2 cores
    python bench/vad.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")

import django  # noqa: E402

django.setup()

from scipy.signal import resample_poly  # noqa: E402

from omniweb.asr.vad_engine import PIPELINE, WINDOW_BYTES, WINDOW_MS, SileroVad, VadPipeline  # noqa: E402
from omniweb.conversation.vad import VadParams, VoiceActivity  # noqa: E402
from omniweb.engine.client import LocalEngineClient  # noqa: E402
from omniweb.engine.scheduler import Scheduler  # noqa: E402

WINDOWS_PER_SECOND = 1000.0 / WINDOW_MS


def speech_audio(seconds: float) -> np.ndarray:
    """Our voice saying questions with pauses between them, at 24 kHz, float32, ``seconds`` long."""
    from hibari import Hibari

    voice = Hibari()
    lines = ["How many people can you see in the room?", "Is it dark in here?", "What colour is the wall?"]
    parts, total = [], 0
    while total < seconds * 24_000:
        for line in lines:
            parts += [voice(line, seed=7).astype(np.float32), np.zeros(12_000, np.float32)]
            total += parts[-2].size + 12_000
    return np.concatenate(parts)[: int(seconds * 24_000)]


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def model_alone(model: SileroVad, pcm: bytes, ks: list[int], seconds: float, repeats: int) -> dict[int, tuple]:
    walls: dict[int, list[float]] = {k: [] for k in ks}
    cpus: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(repeats):
        for k in ks:
            size = k * WINDOW_BYTES
            calls = [pcm[i : i + size] for i in range(0, len(pcm) - size + 1, size)]
            state, n, wall0, cpu0 = None, 0, time.perf_counter(), time.process_time()
            while time.perf_counter() - wall0 < seconds:
                for chunk in calls:
                    _, state = model.probs(chunk, state)
                    n += k
            walls[k].append((time.perf_counter() - wall0) / n * 1000)
            cpus[k].append((time.process_time() - cpu0) / n * 1000)
    return {k: (statistics.median(walls[k]), statistics.median(cpus[k])) for k in ks}


async def stream_sessions(client: LocalEngineClient, pcm: bytes, rate: int, sessions: int) -> int:
    """Every session streams ``pcm`` in 20 ms chunks; the windows processed in all."""
    step = rate // 50 * 2

    async def one() -> int:
        vad = VoiceActivity(client, VadParams(), sample_rate=rate)
        turns = 0
        for i in range(0, len(pcm), step):
            turns += len(await vad.feed(pcm[i : i + step]))
        assert turns >= 2, "the bench audio must hold speech the detector finds"
        return int(vad.detector.clock_ms / WINDOW_MS)

    return sum(await asyncio.gather(*(one() for _ in range(sessions))))


def through_engine(pipeline: VadPipeline, audio24: np.ndarray, sessions: list[int], batches: list[int]) -> list[tuple]:
    audio16 = resample_poly(audio24, 2, 3).astype(np.float32)
    inputs = {16_000: pcm16(audio16), 24_000: pcm16(audio24)}
    rows = []
    for s in sessions:
        for rate, pcm in inputs.items():
            for max_batch in batches:
                sched = Scheduler({PIPELINE: pipeline}, workers=2, max_batch=max_batch)
                sched.start()
                try:
                    client = LocalEngineClient(sched)
                    wall0, cpu0 = time.perf_counter(), time.process_time()
                    windows = asyncio.run(stream_sessions(client, pcm, rate, s))
                    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                    stats = sched.stats()
                finally:
                    sched.stop()
                batched = stats.batched_steps_total / max(1, stats.steps_total)
                rows.append((s, rate, max_batch, windows, wall / windows * 1000, cpu / windows * 1000, batched))
                print(
                    f"  sessions={s} rate={rate} max_batch={max_batch}: {cpu / windows * 1000:.3f} ms CPU/window",
                    file=sys.stderr,
                )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", default="1,2,4,16,64", help="windows per model call (part 1)")
    parser.add_argument("--seconds", type=float, default=1.0, help="wall seconds per part-1 measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sessions", default="1,16,64", help="concurrent sessions (part 2)")
    parser.add_argument("--audio-seconds", type=float, default=10.0, help="audio each session streams (part 2)")
    parser.add_argument("--quick", action="store_true", help="smoke run: short and small")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.repeats, args.sessions, args.audio_seconds = 0.2, 1, "1,4", 3.0
    ks = [int(k) for k in args.windows.split(",")]
    sessions = [int(s) for s in args.sessions.split(",")]

    print("loading the model and making the audio...", file=sys.stderr)
    pipeline = VadPipeline()
    model = pipeline.loops[0]._model
    audio24 = speech_audio(args.audio_seconds)
    pcm16k = pcm16(resample_poly(audio24, 2, 3).astype(np.float32))
    print("part 1: the model alone", file=sys.stderr)
    alone = model_alone(model, pcm16k, ks, args.seconds, args.repeats)
    print("part 2: through the engine", file=sys.stderr)
    engine = through_engine(pipeline, audio24, sessions, [16, 1])

    load = os.getloadavg()
    print("# Server VAD cost (`bench/vad.py`)\n")
    print(f"Machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end.\n")
    print("### 1. Silero VAD alone (onnxruntime, 1 thread), per 32 ms window\n")
    print("| windows per call | wall ms / window | CPU ms / window | real-time sessions per core |")
    print("|---:|---:|---:|---:|")
    for k, (wall, cpu) in alone.items():
        print(f"| {k} | {wall:.3f} | {cpu:.3f} | {1000 / (cpu * WINDOWS_PER_SECOND):.0f} |")
    print("\n### 2. Through the engine: `VoiceActivity` → in-process scheduler (2 workers) → `audio.vad`\n")
    print(f"Each session streams {args.audio_seconds:.0f} s of speech and pauses in 20 ms chunks, unpaced.\n")
    print(
        "| sessions | input rate | max_batch | windows | wall ms / window | CPU ms / window "
        "| steps batched | real-time sessions per core |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s, rate, max_batch, windows, wall, cpu, batched in engine:
        print(
            f"| {s} | {rate // 1000} kHz | {max_batch} | {windows} | {wall:.3f} | {cpu:.3f} | {batched:.0%} "
            f"| {1000 / (cpu * WINDOWS_PER_SECOND):.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
