#!/usr/bin/env python
"""One command for a GPU worker host: the CUDA tests and the GPU benches, one table, at most 8 minutes.

On a machine with a CUDA device (and ``requirements-gpu.txt`` installed), from the repository root::

    python bench/gpu_check.py

runs, each in its own process with its own time limit:

1. the CUDA tests (``tests/test_gpu.py``: talker, vocoder and Whisper on the GPU vs the CPU;
   ``tests/test_vocoder_torch.py`` on cuda; ``tests/test_devices.py``);
2. the batched vocoder: 16 streams batched vs one by one on cuda (``bench/batching.py``, target ≥ 4×);
3. time to first audio at one session and a 64-session burst, against a server started with
   ``OMNIWEB_DEVICE=cuda`` (``bench/speech_latency.py --burst``);
4. Whisper on cuda vs the CPU: seconds to transcribe the same 5 s of speech, and 16 questions
   batched (one encode and one decode call per step, as the engine batches sessions) vs one by one;

and prints one markdown table (check, result, target, verdict) for docs/benchmarks.md. On a
machine without a CUDA device it says so and exits 0; on one whose torch or onnxruntime cannot use
the device it says which package is wrong and exits 1. Exit 0 when every check passed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOTAL_BUDGET_S = 8 * 60
LIMITS_S = {"tests": 150, "batching": 75, "ttfa1": 75, "burst": 120, "whisper": 60}


@dataclass
class Row:
    check: str
    result: str
    target: str
    ok: bool | None  # None: information only


def run(cmd: list[str], limit: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``cmd`` in the repository root; (exit status, output), 124 when it ran past ``limit``."""
    try:
        done = subprocess.run(
            cmd, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=limit
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        return 124, out
    return done.returncode, done.stdout + done.stderr


def gpu_present() -> str | None:
    """The GPUs nvidia-smi lists, if any (independent of the Python packages)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out or None


def environment() -> tuple[bool, list[str]]:
    """(usable, lines describing the device and the packages)."""
    lines: list[str] = []
    import torch

    cuda = torch.cuda.is_available()
    lines.append(f"torch {torch.__version__} (CUDA build {torch.version.cuda or 'none'}), cuda available: {cuda}")
    if cuda:
        lines.append(f"device 0: {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} device(s)")
    try:
        import onnxruntime as ort

        providers = ort.get_available_providers()
        lines.append(f"onnxruntime {ort.__version__}: {', '.join(providers)}")
        ort_cuda = "CUDAExecutionProvider" in providers
    except ImportError:
        ort_cuda = False
        lines.append("onnxruntime: not installed")
    try:
        import ctranslate2

        lines.append(f"ctranslate2 {ctranslate2.__version__}: {ctranslate2.get_cuda_device_count()} CUDA device(s)")
    except ImportError:
        lines.append("ctranslate2: not installed")
    return cuda and ort_cuda, lines


def tests_row(limit: float) -> Row:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["tests/test_gpu.py", "tests/test_vocoder_torch.py", "tests/test_devices.py"]
    code, out = run(cmd, limit)
    summary = next((line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed)", line)), "")
    result = summary.strip("= ") or f"exit {code}" + (" (time limit)" if code == 124 else "")
    return Row("CUDA tests (test_gpu, test_vocoder_torch on cuda, test_devices)", result, "all pass", code == 0)


def batching_row(limit: float) -> Row:
    cmd = [sys.executable, "bench/batching.py", "--device", "cuda", "--sessions", "16", "--repeats", "3"]
    code, out = run(cmd, limit)
    match = re.search(r"\| torch \(cuda[^|]*\) \| \*\*([\d.]+)×\*\*", out)
    if match is None:
        return Row("vocoder on cuda: 16 streams batched / one by one", f"no result (exit {code})", "≥ 4×", False)
    ratio = float(match.group(1))
    return Row("vocoder on cuda: 16 streams batched / one by one", f"{ratio:.2f}×", "≥ 4×", ratio >= 4.0)


def burst_rows(sessions: int, rounds: int, limit: float) -> list[Row]:
    # Whisper stays on the CPU here (it has its own row): a CTranslate2 without its CUDA libraries
    # must not keep the speech server from starting.
    env = {"OMNIWEB_DEVICE": "cuda", "OMNIWEB_ASR_DEVICE": "cpu"}
    cmd = [sys.executable, "bench/speech_latency.py", "--burst", "--burst-sessions", str(sessions)]
    code, out = run([*cmd, "--burst-rounds", str(rounds)], limit, env)
    match = re.search(r"\| all \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)× \| (\d+) \| (\d+) \|", out)
    name = "time to first audio, 1 session" if sessions == 1 else f"first audio, {sessions}-session burst"
    if match is None:
        tail = out.strip().splitlines()[-1:] or [""]
        return [Row(name, f"no result (exit {code}): {tail[0][:80]}", "", False)]
    p50, p95, _, ratio, gaps, failures = match.groups()
    result = f"p50 {p50} ms, p95 {p95} ms"
    if sessions == 1:
        return [Row(name, result, "info", None if failures == "0" else False)]
    return [
        Row(name, result, "info", None),
        Row(f"{sessions}-session burst: p95 / CPU-style floor", f"{ratio}×", "≤ 1.25× (CPU target)", None),
        Row(
            f"{sessions}-session burst: gaps, failures",
            f"{gaps} gaps, {failures} failures",
            "0, 0",
            gaps == failures == "0",
        ),
    ]


def whisper_rows(limit: float) -> list[Row]:
    """Whisper on cuda vs the CPU (5 s of speech, best of three), and 16 questions batched (one
    encode and one decode call per step, as the engine batches sessions) vs one by one, on cuda."""
    code, out = run([sys.executable, __file__, "--whisper-child"], limit)
    match = re.search(r"whisper cuda ([\d.]+) s cpu ([\d.]+) s text (.*)", out)
    if match is None:
        return [Row("Whisper tiny.en on cuda", f"no result (exit {code})", "transcribes", False)]
    cuda_s, cpu_s, text = float(match.group(1)), float(match.group(2)), match.group(3)
    ok = "quick brown fox" in text.lower()
    result = f"{cuda_s * 1000:.0f} ms vs CPU {cpu_s * 1000:.0f} ms ({cpu_s / cuda_s:.1f}×), {text!r}"
    rows = [Row("Whisper tiny.en on cuda: 5 s of speech", result, "transcribes correctly", ok)]
    batched = re.search(r"batched16 ([\d.]+) s alone16 ([\d.]+) s same (\w+)", out)
    if batched is None:
        rows.append(Row("Whisper on cuda: 16 questions batched", f"no result (exit {code})", "faster", False))
    else:
        together, alone, same = float(batched.group(1)), float(batched.group(2)), batched.group(3) == "True"
        rows.append(
            Row(
                "Whisper on cuda: 16 questions batched vs one by one",
                f"{together * 1000:.0f} ms vs {alone * 1000:.0f} ms ({alone / together:.1f}×), same text: {same}",
                "batched faster, same words",
                together < alone and same,
            )
        )
    return rows


def whisper_child() -> int:
    """In a child process: synthesize speech, transcribe it on cuda and on the CPU; then 16
    questions on cuda batched step by step (each step's plans in one batched call) vs one by one."""
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")
    import django

    django.setup()
    import numpy as np
    from django.test import override_settings
    from hibari import Hibari
    from scipy.signal import resample_poly

    from omniweb.asr.pipeline import Recognizer
    from omniweb.asr.whisper import Options, Whisper
    from omniweb.engine.contracts import Done

    def pcm16(text: str) -> bytes:
        wave = Hibari()(text, seed=1)
        return (np.clip(resample_poly(wave, 2, 3), -1, 1) * 32767).astype("<i2").tobytes()

    speech = pcm16("The quick brown fox jumps over the lazy dog. Then it runs into the quiet forest.")
    times: dict[str, float] = {}
    texts: dict[str, str] = {}
    recognizers: dict[str, Recognizer] = {}
    for device in ("cuda", "cpu"):
        with override_settings(ASR_DEVICE=device):
            recognizers[device] = recognizer = Recognizer(Whisper())
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            texts[device] = recognizer.run(recognizer.start(speech, Options())).text
            best = min(best, time.perf_counter() - t)
        times[device] = best
    print(f"whisper cuda {times['cuda']:.4f} s cpu {times['cpu']:.4f} s text {texts['cuda']}")

    gpu = recognizers["cuda"]
    question = pcm16("How many people can you see in the picture?")
    t = time.perf_counter()
    alone = [gpu.run(gpu.start(question, Options())).text for _ in range(16)]
    alone_s = time.perf_counter() - t
    t = time.perf_counter()
    recs = [gpu.start(question, Options()) for _ in range(16)]
    while True:
        plans = [(rec, plan) for rec in recs if not isinstance(plan := gpu.plan(rec), Done)]
        if not plans:
            break
        batch_run = plans[0][1].batch_run
        if batch_run is not None and all(p.shape == plans[0][1].shape for _, p in plans):
            results = batch_run([p for _, p in plans])
        else:
            results = [p.run() for _, p in plans]
        for (rec, _), result in zip(plans, results, strict=True):
            gpu.advance(rec, result)
    together_s = time.perf_counter() - t
    same = all(rec.text == alone[0] for rec in recs) and len(set(alone)) == 1
    print(f"batched16 {together_s:.4f} s alone16 {alone_s:.4f} s same {same}")
    return 0


def main() -> int:
    if "--whisper-child" in sys.argv:
        return whisper_child()
    started = time.monotonic()
    gpus = gpu_present()
    import torch

    if not torch.cuda.is_available():
        if gpus:
            print(f"A GPU is present ({gpus.splitlines()[0]}) but torch {torch.__version__} cannot use it.")
            print("Install requirements-gpu.txt (CUDA torch, onnxruntime-gpu) on this host; see README.")
            return 1
        print(f"No CUDA device on this machine (torch {torch.__version__} sees none): nothing to check.")
        return 0
    usable, lines = environment()
    print("## GPU check\n")
    for line in lines:
        print(f"- {line}")
    if not usable:
        print("\nonnxruntime has no CUDA provider: install requirements-gpu.txt (onnxruntime-gpu); see README.")
        return 1
    rows: list[Row] = []

    def left(step: str) -> float:
        return max(10.0, min(LIMITS_S[step], TOTAL_BUDGET_S - (time.monotonic() - started)))

    print("\nrunning the CUDA tests ...", file=sys.stderr)
    rows.append(tests_row(left("tests")))
    print("batched vocoder bench ...", file=sys.stderr)
    rows.append(batching_row(left("batching")))
    print("time to first audio at one session ...", file=sys.stderr)
    rows.extend(burst_rows(1, 10, left("ttfa1")))
    print("64-session burst ...", file=sys.stderr)
    rows.extend(burst_rows(64, 2, left("burst")))
    print("Whisper on cuda ...", file=sys.stderr)
    rows += whisper_rows(left("whisper"))

    print("\n| check | result | target | verdict |\n|---|---|---|---|")
    for r in rows:
        verdict = "info" if r.ok is None else ("PASS" if r.ok else "FAIL")
        print(f"| {r.check} | {r.result} | {r.target} | {verdict} |")
    print(f"\n{len(rows)} checks in {time.monotonic() - started:.0f} s")
    return 0 if all(r.ok is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
