#!/usr/bin/env python
"""Throughput of the vocoder step (acoustic frames → PCM) for N concurrent sessions: batched
across sessions vs one work unit per call, in the same run.

The talker output for every session is built once up front (real hibari network output, one
ONNX run per phoneme segment, noise drawn per session with ``draw_noise``). Session *k* speaks
``--sentences-per-session`` Harvard sentences starting at sentence *k*, so every session has
different audio at any moment. A **work unit** is the next chunk of at most ``--chunk-frames``
frames of a session's current segment, exactly what the engine's vocoder loop plans. Each round
takes one work unit from every session that still has frames, and then:

- **one-by-one**: each work unit is its own ``run_chunks_batched([unit], backend)`` call,
  round-robin across sessions (a scheduler without batching);
- **batched**: one ``run_chunks_batched(units_of_the_round, backend)`` call per round.

Both modes run the same work units in the same order through the same code path; only the
number of units per call differs. This is done for the torch backend on ``--device`` and for the
numpy backend (the default). Every measurement is repeated ``--repeats`` times, the four
configurations alternating in order (forward, then reversed), and the median is reported.
Streams are rebuilt (excitation, outside the clock) before each measurement.

Reported per configuration: vocoded audio seconds per wall second, work units per second, calls,
the share of wall time spent inside the backend's spectral step (the rest is stacking the inputs
on the host, the per-stream overlap-add and Python), process CPU time and CPU ÷ wall (threads
used; on a shared machine the CPU-time figures are steadier than the wall-clock ones). A second
table times the spectral step alone (fastest of ~1 s of calls) at 1, ``--chunk-frames`` and
``--chunk-frames × --sessions`` rows, to separate the fixed per-call cost from the per-frame cost.
Before timing, the audio of both modes and both backends is compared (max abs difference, must
be < 1e-4). Exit status 0 when the torch ratio meets the 4× target and the audio matches.

Usage (from the repository root, venv active)::

    python bench/batching.py                            # torch on $OMNIWEB_DEVICE or cpu, vs numpy
    python bench/batching.py --device cuda --threads 2  # torch.set_num_threads(2)
    python bench/batching.py --quick                    # smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from harvard import HARVARD  # noqa: E402  (bench/ is on the path when run as a script)

from speech.tts.vocoder import (  # noqa: E402
    HOP,
    NUMPY_BACKEND,
    SAMPLE_RATE,
    AcousticFrames,
    SpectralBackend,
    VocoderStream,
    draw_noise,
    run_chunks_batched,
)

TARGET_RATIO = 4.0
AUDIO_TOL = 1e-4  # max abs difference allowed between modes and backends
perf = time.perf_counter

SENTENCES = HARVARD[:16]  # one per session

NetOut = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- talker output, built once ----------------------------------------------------------------------
def talker_outputs(texts: Sequence[str]) -> list[list[NetOut]]:
    """Real network outputs per sentence: one (lh, th, ln, lr, phi, f0) per phoneme segment."""
    from hibari import Hibari

    t = Hibari()
    res = []
    for text in texts:
        segs = []
        for ps in t.phonemize(text):
            ids = t.ids(ps)
            if len(ids) < 3:
                continue
            out = t.sess.run(None, {"ids": np.asarray([ids], np.int64), "speed": np.asarray([1.0], np.float32)})
            segs.append(tuple(o[0] for o in out[:6]))
        res.append(segs)
    return res


def session_frames(outputs: list[list[NetOut]], sessions: int, per_session: int) -> list[list[AcousticFrames]]:
    """Session k speaks sentences k, k+1, ... (mod len); its noise comes from its own generator."""
    res = []
    for k in range(sessions):
        rng = np.random.default_rng(1000 + k)
        segs = []
        for j in range(per_session):
            for arrs in outputs[(k + j) % len(outputs)]:
                segs.append(AcousticFrames(*arrs, noise=draw_noise(rng, arrs[5].shape[0])))
        res.append(segs)
    return res


# -- the measured loop ------------------------------------------------------------------------------
class Session:
    """A session's vocoder work: its segments in order, cut into work units as the engine does."""

    def __init__(self, frames: list[AcousticFrames]) -> None:
        self.streams = [VocoderStream(f) for f in frames]  # excitation built here, off the clock
        self.seg = 0

    def next_unit(self, chunk: int) -> tuple[VocoderStream, int, int] | None:
        while self.seg < len(self.streams) and self.streams[self.seg].done:
            self.seg += 1
        if self.seg == len(self.streams):
            return None
        s = self.streams[self.seg]
        start, stop = s.plan(chunk)
        return s, start, stop


class TimedBackend:
    """Wraps a backend to add up the time spent in its spectral step (both modes use it).

    A device backend with device-resident streams (``run_batch``: torch) is timed over its whole
    step, spectral work and overlap-add on the device and the one copy back.
    """

    def __init__(self, inner: SpectralBackend) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.calls = 0
        if hasattr(inner, "run_batch"):
            self.run_batch = self._run_batch

    def _run_batch(self, items: list[tuple[VocoderStream, int, int]]) -> list[np.ndarray]:
        t = perf()
        try:
            return self.inner.run_batch(items)  # type: ignore[attr-defined]
        finally:
            self.seconds += perf() - t
            self.calls += 1

    def windowed_frames(self, src: np.ndarray, **arrays: np.ndarray) -> np.ndarray:
        t = perf()
        try:
            return self.inner.windowed_frames(src, **arrays)
        finally:
            self.seconds += perf() - t
            self.calls += 1


@dataclass
class Run:
    wall: float
    cpu: float
    spectral: float
    calls: int
    units: int
    samples: int
    outputs: list[list[np.ndarray]] = field(default_factory=list)


def vocode_all(
    frames: list[list[AcousticFrames]], backend: SpectralBackend, chunk: int, batched: bool, keep: bool = False
) -> Run:
    sessions = [Session(f) for f in frames]
    timed = TimedBackend(backend)
    outputs: list[list[np.ndarray]] = [[] for _ in sessions]
    units = samples = 0
    c0, t0 = time.process_time(), perf()
    while True:
        round_ = [(i, u) for i, s in enumerate(sessions) if (u := s.next_unit(chunk)) is not None]
        if not round_:
            break
        units += len(round_)
        if batched:
            waves = run_chunks_batched([u for _, u in round_], timed)
        else:
            waves = [run_chunks_batched([u], timed)[0] for _, u in round_]
        for (i, _), w in zip(round_, waves, strict=True):
            samples += w.size
            if keep:
                outputs[i].append(w)
    wall, cpu = perf() - t0, time.process_time() - c0
    return Run(wall, cpu, timed.seconds, timed.calls, units, samples, outputs)


# -- spectral step alone ----------------------------------------------------------------------------
def spectral_inputs(rows: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Random arrays of the backend's input shapes, in realistic ranges."""
    x = [rng.standard_normal((rows, 1200), dtype=np.float32)]
    x += [(rng.standard_normal((rows, 601), dtype=np.float32) - 2).astype(np.float32) for _ in range(5)]
    x.append(rng.standard_normal((rows, 1202), dtype=np.float32).view(np.complex64))
    return x


def time_spectral(backend: SpectralBackend, rows: int, budget_s: float) -> float:
    """Fastest of repeated windowed_frames calls at ``rows`` rows (fresh input copies each
    call): the per-call cost with the least interference from the rest of the machine."""
    base = spectral_inputs(rows, np.random.default_rng(rows))
    backend.windowed_frames(*[a.copy() for a in base])
    times = []
    end = perf() + budget_s
    while perf() < end or len(times) < 5:
        args = [a.copy() for a in base]
        t = perf()
        backend.windowed_frames(*args)
        times.append(perf() - t)
    return min(times)


# -- report -----------------------------------------------------------------------------------------
def fmt_load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=os.environ.get("OMNIWEB_DEVICE", "cpu"), help="torch device (cpu, cuda...)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--chunk-frames", type=int, default=16)
    ap.add_argument("--sentences-per-session", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 sentences per session, 3 repeats")
    args = ap.parse_args(argv)
    if args.quick:
        args.sentences_per_session, args.repeats = 2, 3

    import torch

    from speech.tts.vocoder_torch import TorchBackend

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        torch_backend = TorchBackend(args.device)
    except ValueError as e:
        log(f"error: {e}")
        return 2
    backends: dict[str, SpectralBackend] = {f"torch ({torch_backend.device})": torch_backend, "numpy": NUMPY_BACKEND}

    load_before = fmt_load()
    log(f"talker output for {len(SENTENCES)} sentences...")
    outputs = talker_outputs(SENTENCES)
    frames = session_frames(outputs, args.sessions, args.sentences_per_session)
    total_frames = sum(f.n_frames for s in frames for f in s)
    audio_s = total_frames * HOP / SAMPLE_RATE

    # Correctness first: batched == one-by-one for each backend, torch ≈ numpy.
    log("checking outputs...")
    ref: list[np.ndarray] | None = None
    diffs: dict[str, float] = {}
    for name, be in backends.items():
        one = vocode_all(frames, be, args.chunk_frames, batched=False, keep=True)
        bat = vocode_all(frames, be, args.chunk_frames, batched=True, keep=True)
        a = [np.concatenate(o) for o in one.outputs]
        b = [np.concatenate(o) for o in bat.outputs]
        assert one.samples == bat.samples == total_frames * HOP, (one.samples, bat.samples, total_frames * HOP)
        diffs[f"{name}: batched vs one-by-one"] = max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))
        if ref is None:
            ref = b
        else:
            diffs[f"{name} vs first backend"] = max(float(np.abs(x - y).max()) for x, y in zip(b, ref, strict=True))

    configs = [(name, batched) for name in backends for batched in (False, True)]
    results: dict[tuple[str, bool], list[Run]] = {c: [] for c in configs}
    log("warm-up...")
    for name, batched in configs:
        vocode_all(frames, backends[name], args.chunk_frames, batched)
    for rep in range(args.repeats):
        order = configs if rep % 2 == 0 else configs[::-1]
        for name, batched in order:
            results[(name, batched)].append(vocode_all(frames, backends[name], args.chunk_frames, batched))
        log(f"repeat {rep + 1}/{args.repeats} done")

    rows_one, rows_all = args.chunk_frames, args.chunk_frames * args.sessions
    spectral = {
        name: {r: time_spectral(be, r, 0.4 if args.quick else 1.0) for r in (1, rows_one, rows_all)}
        for name, be in backends.items()
    }

    # -- print ------------------------------------------------------------------------------------
    units = results[configs[0]][0].units
    rounds = results[(configs[1][0], True)][0].calls
    print("## Vocoder step: batched across sessions vs one-by-one\n")
    print(
        f"{args.sessions} sessions × {args.sentences_per_session} sentences = {audio_s:.1f} s of audio, "
        f"{total_frames} frames, {units} work units of ≤ {args.chunk_frames} frames in {rounds} rounds "
        f"(mean {units / rounds:.1f} units per batched call). Median of {args.repeats} repeats, "
        "configurations alternating in order.\n"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, {platform.machine()}, torch {torch.__version__}, "
        f"torch threads {torch.get_num_threads()} (interop {torch.get_num_interop_threads()}), "
        f"torch device {torch_backend.device}, numpy {np.__version__}, "
        f"load average (1/5/15 min) before: {load_before}, after: {fmt_load()}\n"
    )
    print(
        "| backend | mode | audio s / wall s | work units / s | calls | wall ms | in spectral step "
        "| CPU ms | CPU / wall | audio s / CPU s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    thr: dict[tuple[str, bool], float] = {}
    thr_cpu: dict[tuple[str, bool], float] = {}
    for name, batched in configs:
        rs = results[(name, batched)]
        wall, cpu = median([r.wall for r in rs]), median([r.cpu for r in rs])
        thr[(name, batched)], thr_cpu[(name, batched)] = audio_s / wall, audio_s / cpu
        print(
            f"| {name} | {'batched' if batched else 'one-by-one'} | {audio_s / wall:.1f} | {units / wall:.0f} | "
            f"{rs[0].calls} | {wall * 1e3:.1f} | {median([r.spectral / r.wall for r in rs]) * 100:.0f}% | "
            f"{cpu * 1e3:.1f} | {median([r.cpu / r.wall for r in rs]):.2f} | {audio_s / cpu:.1f} |"
        )
    print()
    print("| backend | batched / one-by-one (wall) | (CPU time) |")
    print("|---|---:|---:|")
    ratios = {name: thr[(name, True)] / thr[(name, False)] for name in backends}
    for name, r in ratios.items():
        print(f"| {name} | **{r:.2f}×** | {thr_cpu[(name, True)] / thr_cpu[(name, False)]:.2f}× |")
    print()
    print("### Spectral step alone (`windowed_frames`), fastest call of ~1 s of calls\n")
    head = (
        f"| backend | 1 row µs | {rows_one} rows µs | {rows_all} rows µs | µs per row at {rows_all} | fixed µs (fit) |"
    )
    print(head)
    print("|---|---:|---:|---:|---:|---:|")
    for name, t in spectral.items():
        per_row = (t[rows_all] - t[rows_one]) / (rows_all - rows_one)
        print(
            f"| {name} | {t[1] * 1e6:.0f} | {t[rows_one] * 1e6:.0f} | {t[rows_all] * 1e6:.0f} | "
            f"{t[rows_all] / rows_all * 1e6:.1f} | {(t[rows_one] - per_row * rows_one) * 1e6:.0f} |"
        )
    print()
    print("max abs differences: " + "; ".join(f"{k} {v:.1e}" for k, v in diffs.items()) + "\n")
    name = next(iter(backends))
    same = max(diffs.values()) < AUDIO_TOL
    if not same:
        print(f"- FAIL: audio differs between modes or backends by more than {AUDIO_TOL:g}")
    ok = ratios[name] >= TARGET_RATIO and same
    print(
        f"- {'PASS' if ok else 'FAIL'}: {name} batched ≥ {TARGET_RATIO:g}× one-by-one "
        f"({args.sessions} sessions, chunk {args.chunk_frames}): {ratios[name]:.2f}×"
    )
    print(f"- info: numpy batched / one-by-one: {ratios['numpy']:.2f}×")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
