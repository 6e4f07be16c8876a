#!/usr/bin/env python
"""Batch priority bench: ``manage.py speak`` writing a long file, and real-time sessions beside it.

One run, against one server started here with the deployed pacing (``OMNIWEB_ENGINE_MAX_AHEAD_SECONDS``
30 s unless set), measures side by side:

1. first audio of short real-time utterances on an otherwise idle server;
2. ``manage.py speak`` with its default options (batch priority, ``--split sentence``: the sentences
   complete in its one ``input.text`` are spoken as one request, the last one after ``input.done``)
   writing a 40-sentence file: wall time over the file's duration (target <= 0.25), the command's
   start-up included; the run is refused unless the file came as 40 sentences;
3. first audio of the same real-time utterances while that file is being written (target: p50 within
   1.5x of step 1 and p95 under 300 ms);
4. with ``--paced``, the same file with ``speak --realtime`` (paced like a listener), for contrast.

Prints a markdown report and PASS/FAIL per target; exit status 1 when one fails.

Usage (from the repository root, venv active)::

    python bench/speak_batch.py            # ~1-2 min on 2 cores
    python bench/speak_batch.py --paced    # adds the paced run (takes about the file's duration - 30 s)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import websockets
from speech_latency import (
    CLOSE_MSG,
    SHORT_SENTENCE,
    Server,
    config_msg,
    free_port,
    long_flush_text,
    pct,
    ws_connect,
    ws_utterance,
)

REPO = Path(__file__).resolve().parent.parent
N_SENTENCES = 40
TARGET_FILE_RATIO = 0.25
TARGET_P50_RATIO = 1.5
TARGET_P95_S = 0.300


async def realtime_first_audio(url: str, n: int, stop: asyncio.Event | None = None) -> list[float]:
    """First audio of ``n`` short utterances, one after another on one real-time session."""
    out: list[float] = []
    async with ws_connect(url) as ws:
        await ws.send(config_msg())
        for _ in range(n):
            if stop is not None and stop.is_set():
                break
            utt = await ws_utterance(ws, SHORT_SENTENCE)
            if utt.errors:
                raise RuntimeError(f"real-time utterance failed: {utt.errors}")
            out.append(utt.first_audio)
            await asyncio.sleep(0.3)
        await ws.send(CLOSE_MSG)
    return out


async def warm_up(url: str, timeout: float = 180.0) -> None:
    """Two utterances once the models have loaded (a handshake during the load may be dropped)."""
    deadline = time.perf_counter() + timeout
    while True:
        try:
            await realtime_first_audio(url, 2)
            return
        except (OSError, websockets.exceptions.WebSocketException):
            if time.perf_counter() > deadline:
                raise
            await asyncio.sleep(1.0)


async def speak_file(
    base: str, text: str, path: Path, *extra: str, making: asyncio.Event | None = None
) -> tuple[float, float]:
    """Run ``manage.py speak`` (its defaults plus ``extra``); (wall seconds, seconds of audio in the file).
    ``making`` is set when its first sentence has come (past the command's start-up).

    It must have spoken the text sentence by sentence (the default ``--split sentence``, several engine
    requests): a file that came as one sentence measures another path."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "manage.py", "speak", text, "-o", str(path), "--url", base, *extra,
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    sentences = 0
    async for line in proc.stdout:
        if line.startswith(b"sentence "):
            sentences += 1
            if making is not None:
                making.set()
    err = await proc.stderr.read()
    await proc.wait()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"speak failed: {err.decode().strip()}")
    if sentences != N_SENTENCES:
        raise RuntimeError(f"speak sent {sentences} sentences, not {N_SENTENCES}: not the --split sentence default")
    with wave.open(str(path)) as w:
        return wall, w.getnframes() / w.getframerate()


def row(name: str, xs: list[float]) -> str:
    if not xs:
        return f"| {name} | 0 | - | - | - |"
    cells = " | ".join(f"{pct(xs, q) * 1000:.0f}" for q in (50, 95)) + f" | {max(xs) * 1000:.0f}"
    return f"| {name} | {len(xs)} | {cells} |"


async def run(args: argparse.Namespace) -> int:
    port = free_port()
    log = Path(tempfile.gettempdir()) / f"speak-batch-{port}.log"
    server = Server(port, log)
    base = f"ws://127.0.0.1:{port}"
    try:
        await server.wait_accepting()
        await warm_up(server.url)
        text = long_flush_text(N_SENTENCES)
        with tempfile.TemporaryDirectory() as tmp:
            alone = await realtime_first_audio(server.url, args.n)
            stop, making = asyncio.Event(), asyncio.Event()
            job = asyncio.ensure_future(speak_file(base, text, Path(tmp) / "batch.wav", making=making))
            await making.wait()  # past the command's start-up: the file is being made
            beside = asyncio.ensure_future(realtime_first_audio(server.url, args.n, stop))
            wall, seconds = await job
            stop.set()
            during = await beside
            paced = await speak_file(base, text, Path(tmp) / "paced.wav", "--realtime") if args.paced else None
    finally:
        server.stop()
    ratio = wall / seconds
    p50_alone, p50_during, p95_during = pct(alone, 50), pct(during, 50), pct(during, 95)
    checks = [
        (f"{N_SENTENCES}-sentence file in {wall:.1f} s for {seconds:.1f} s of audio: "
         f"{ratio:.3f}x <= {TARGET_FILE_RATIO}",
         ratio <= TARGET_FILE_RATIO),
        (f"real-time first audio p50 beside the batch {p50_during * 1000:.0f} ms vs alone "
         f"{p50_alone * 1000:.0f} ms: <= {TARGET_P50_RATIO}x", p50_during <= TARGET_P50_RATIO * p50_alone),
        (f"real-time first audio p95 beside the batch {p95_during * 1000:.0f} ms <= {TARGET_P95_S * 1000:.0f} ms",
         p95_during <= TARGET_P95_S),
    ]  # fmt: skip
    print(f"pacing (OMNIWEB_ENGINE_MAX_AHEAD_SECONDS): {os.environ.get('OMNIWEB_ENGINE_MAX_AHEAD_SECONDS', '30')} s")
    print(f"engine workers: {os.environ.get('OMNIWEB_ENGINE_WORKERS', 'min(2, CPUs)')}, CPUs: {os.cpu_count()}\n")
    print("| file | wall s | audio s | wall / audio |\n|---|---|---|---|")
    print(f"| speak (defaults: batch priority, --split sentence) | {wall:.1f} | {seconds:.1f} | {ratio:.3f} |")
    if paced is not None:
        print(f"| speak --realtime (paced) | {paced[0]:.1f} | {paced[1]:.1f} | {paced[0] / paced[1]:.3f} |")
    print("\n| real-time first audio | utterances | p50 ms | p95 ms | max ms |\n|---|---|---|---|---|")
    print(row("idle server", alone))
    print(row("while speak writes the file", during))
    print()
    for text_, ok in checks:
        print(f"- {'PASS' if ok else 'FAIL'}: {text_}")
    return 0 if all(ok for _, ok in checks) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=12, help="real-time utterances per phase")
    parser.add_argument("--paced", action="store_true", help="also write the file paced (speak --realtime)")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
