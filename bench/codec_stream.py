#!/usr/bin/env python
"""Codec-token streaming on the wire: bytes and first-packet latency vs streamed PCM.

Against one server (started here unless ``--url`` names one), for the same texts:

1. bytes on the wire per utterance: ``output_mode: "codec_tokens"`` (binary packets with their 7-byte
   headers, plus the JSON control messages) vs streamed PCM (``response_format: "pcm"``,
   ``stream_audio: true``), the ratio, and the codec stream's bitrate per second of audio;
2. time to the first binary frame after ``input.done`` (N utterances per mode, modes interleaved on
   one connection each): codec packets, PCM from hibari's vocoder, and PCM from the server's codec
   decoder (``vocoder: "codec"``).

Prints markdown tables. Usage (repository root, venv active)::

    python bench/codec_stream.py                  # starts its own runserver
    python bench/codec_stream.py --n 50 --url ws://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import websockets
from speech_latency import Server, free_port, stats_cells  # this directory is on sys.path as a script

WS_PATH = "/v1/audio/speech/stream"
SAMPLE_RATE = 24000
# Sentence by sentence in every mode, so the three compare the same work (with the default split,
# "none", codec_tokens would make the whole text's talker step before its first packet).
MODES: dict[str, dict[str, Any]] = {
    "codec_tokens": {"output_mode": "codec_tokens", "split_granularity": "sentence"},
    "pcm (hibari vocoder)": {"response_format": "pcm", "stream_audio": True, "split_granularity": "sentence"},
    "pcm (server codec decoder)": {
        "response_format": "pcm",
        "stream_audio": True,
        "vocoder": "codec",
        "split_granularity": "sentence",
    },
}
TEXTS = [
    "The weather is lovely today.",
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump!",
    "She sells sea shells by the sea shore, and the shells she sells are surely seashells.",
    "A long paragraph tests the steady state. It has several sentences of ordinary length. "
    "Each one is spoken in turn. The listener hears them without gaps. That is the point of streaming.",
]


@dataclass
class Result:
    binary_bytes: int = 0
    binary_frames: int = 0
    json_bytes: int = 0
    first_binary: float = float("nan")
    audio_seconds: float = 0.0


async def utterance(ws: Any, text: str, codec: bool) -> Result:
    """One flush; counts what came back up to session.done."""
    res = Result()
    await ws.send(json.dumps({"type": "input.text", "text": text}))
    started = time.perf_counter()
    await ws.send(json.dumps({"type": "input.done"}))
    while True:
        raw = await asyncio.wait_for(ws.recv(), 60)
        if isinstance(raw, bytes):
            if res.binary_frames == 0:
                res.first_binary = time.perf_counter() - started
            res.binary_frames += 1
            res.binary_bytes += len(raw)
            if not codec:
                res.audio_seconds += len(raw) / 2 / SAMPLE_RATE
            continue
        res.json_bytes += len(raw.encode())
        msg = json.loads(raw)
        if msg["type"] == "error":
            raise RuntimeError(msg["message"])
        if msg["type"] == "codec.done":
            res.audio_seconds += msg["total_frames"] / 80.0
        if msg["type"] == "session.done":
            return res


async def measure(url: str, n: int) -> tuple[list[tuple[str, Result, Result]], dict[str, list[float]]]:
    socks = {}
    for mode, fields in MODES.items():
        socks[mode] = await websockets.connect(url, max_size=None)
        await socks[mode].send(json.dumps({"type": "session.config", **fields}))
    try:
        sizes = []
        for text in TEXTS:
            codec = await utterance(socks["codec_tokens"], text, True)
            pcm = await utterance(socks["pcm (hibari vocoder)"], text, False)
            sizes.append((text, codec, pcm))
        latency: dict[str, list[float]] = {mode: [] for mode in MODES}
        for i in range(n + 3):
            for mode, ws in socks.items():
                res = await utterance(ws, TEXTS[0], mode == "codec_tokens")
                if i >= 3:  # warm-up dropped
                    latency[mode].append(res.first_binary)
        return sizes, latency
    finally:
        for ws in socks.values():
            await ws.close()


def report(sizes: list[tuple[str, Result, Result]], latency: dict[str, list[float]], meta: str) -> None:
    print(f"## Codec-token streaming on the wire (`bench/codec_stream.py`)\n\n{meta}\n")
    print(
        "| text | audio s | codec packets | codec binary B | codec JSON B | PCM binary B | PCM / codec | codec kbit/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    tot_c = tot_p = tot_s = tot_j = 0.0
    for text, c, p in sizes:
        short = text if len(text) <= 40 else text[:37] + "..."
        kbps = c.binary_bytes * 8 / c.audio_seconds / 1000
        ratio = p.binary_bytes / c.binary_bytes
        print(
            f"| {short} | {c.audio_seconds:.2f} | {c.binary_frames} | {c.binary_bytes} | {c.json_bytes} | "
            f"{p.binary_bytes} | {ratio:.1f}x | {kbps:.2f} |"
        )
        tot_c += c.binary_bytes
        tot_p += p.binary_bytes
        tot_s += c.audio_seconds
        tot_j += c.json_bytes
    print(
        f"| **all** | {tot_s:.2f} | | {tot_c:.0f} | {tot_j:.0f} | {tot_p:.0f} | {tot_p / tot_c:.1f}x | "
        f"{tot_c * 8 / tot_s / 1000:.2f} |"
    )
    print(
        f"\nWith the JSON control messages (codec.start/done) counted too: PCM / codec = "
        f"{tot_p / (tot_c + tot_j):.1f}x. PCM16 at 24 kHz is 384 kbit/s.\n"
    )
    n = len(next(iter(latency.values())))
    print(f"Time from `input.done` to the first binary frame, `{TEXTS[0]}` (N={n} per mode, interleaved):\n")
    print("| mode | p50 ms | p95 ms | min ms | max ms |")
    print("|---|---|---|---|---|")
    for mode, xs in latency.items():
        print(f"| {mode} | {stats_cells(xs)} |")


async def run(args: argparse.Namespace) -> int:
    server = None
    url = args.url
    if url is None:
        log = Path(tempfile.mkstemp(prefix="codec-stream-", suffix=".log")[1])
        server = Server(free_port(), log)
        await server.wait_accepting()
        url = server.url
        print(f"started runserver on {url} (log {log})", file=sys.stderr)
    elif not url.endswith(WS_PATH):
        url = url.rstrip("/") + WS_PATH
    try:
        deadline = time.monotonic() + 120
        while True:  # the server preloads its models before the first session is served
            try:
                async with websockets.connect(url) as ws:
                    await ws.send(json.dumps({"type": "session.config", **MODES["codec_tokens"]}))
                    await utterance(ws, "Ready.", True)
                break
            except (OSError, websockets.exceptions.WebSocketException, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        sizes, latency = await measure(url, args.n)
    finally:
        if server is not None:
            server.stop()
    report(sizes, latency, f"Server: {url}; {time.strftime('%Y-%m-%d', time.gmtime())}.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="use a running server (ws://host:port)")
    parser.add_argument("--n", type=int, default=30, help="utterances per mode for the latency table")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
