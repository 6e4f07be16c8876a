#!/usr/bin/env python
"""What a person sees on the pages, measured in Debian's Chromium (headless, fake camera/mic).

Starts daphne (default pacing) unless ``--url`` names a server, then reads the pages' own readouts:

1. speech page, per delivery (streamed PCM with word timestamps; codec tokens decoded in the page):
   time to first audio (``input.done`` → first audio received), time to first sound (→ the
   AudioWorklet starts playing, after its 60 ms buffer), real-time factor, playback gaps;
2. video page: frame acknowledgement latency, and per typed question the time to the first answer
   text and the first answer audio.

Prints markdown tables. Usage (repository root, venv active)::

    python bench/browser_pages.py [--runs 10] [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright
from speech_latency import free_port, stats_cells

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from support.page_frames import launch  # noqa: E402  (Chromium with fake media, as the browser tests run it)

TEXT = "The quick brown fox jumps over the lazy dog. It was a bright cold day in April."


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="omniweb-browser-bench-", suffix=".log", delete=False)  # noqa: SIM115
    cmd = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            health = json.loads(urllib.request.urlopen(url + "/healthz", timeout=5).read())
            if health["ready"]:  # 503 (an HTTPError) while the models load
                return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"server did not start; see {log.name}")
        time.sleep(0.3)


def ms_value(page: Page, selector: str) -> float:
    return float(page.locator(selector).get_attribute("data-ms")) / 1000.0


def wait_state(page: Page, states: list[str], timeout: float = 60_000) -> str:
    js = "s => s.includes(document.querySelector('#state').dataset.state)"
    page.wait_for_function(js, arg=states, timeout=timeout)
    return page.locator("#state").get_attribute("data-state")


def speech_runs(page: Page, url: str, mode: str, runs: int) -> dict[str, Any]:
    page.goto(url + "/speech/")
    page.select_option("#mode", mode)
    page.fill("#text", TEXT)
    out: dict[str, Any] = {"ttfa": [], "ttfs": [], "rtf": [], "gaps": 0}
    for i in range(runs + 1):  # the first run opens the socket and loads the worklet (and codec): not counted
        page.click("#speak")
        if wait_state(page, ["done", "error"]) != "done":
            raise RuntimeError(page.locator("#error").text_content())
        if i == 0:
            continue
        out["ttfa"].append(ms_value(page, "#ttfa"))
        out["ttfs"].append(ms_value(page, "#ttfs"))
        out["rtf"].append(float(page.locator("#rtf").text_content()))
        out["gaps"] += int(page.locator("#underruns").get_attribute("data-value"))  # counted per utterance
    return out


def video_runs(page: Page, url: str, runs: int) -> dict[str, list[float]]:
    page.goto(url + "/video/")
    page.click("#start")
    page.wait_for_function("Number(document.querySelector('#accepted').dataset.value) >= 2", timeout=20_000)
    out: dict[str, list[float]] = {"ack": [], "text": [], "audio": []}
    for _ in range(runs):
        page.fill("#question", "What do you see?")
        page.click("#ask")
        if wait_state(page, ["done", "error"]) != "done":
            raise RuntimeError(page.locator("#error").text_content())
        out["ack"].append(ms_value(page, "#ack-latency"))
        out["text"].append(ms_value(page, "#first-text"))
        out["audio"].append(ms_value(page, "#first-audio"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--url", help="a running server (default: start daphne here)")
    args = parser.parse_args()
    proc, url = (None, args.url) if args.url else start_server()
    try:
        with sync_playwright() as p:
            browser = launch(p)
            # bypass_csp: the pages' CSP (script-src 'self') forbids the bench's wait_for_function strings
            page = browser.new_context(bypass_csp=True).new_page()
            speech = {mode: speech_runs(page, url, mode, args.runs) for mode in ("stream", "codec")}
            video = video_runs(page, url, max(3, args.runs // 2))
            browser.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)

    print(f"### Speech page, one utterance of two sentences (N={args.runs} per delivery)\n")
    print("| delivery | figure | p50 ms | p95 ms | min ms | max ms |")
    print("|---|---|---:|---:|---:|---:|")
    for mode, label in (("stream", "streamed PCM + word timestamps"), ("codec", "codec tokens, decoded in the page")):
        r = speech[mode]
        print(f"| {label} | time to first audio (input.done → first audio) | {stats_cells(r['ttfa'])} |")
        print(f"| {label} | time to first sound (→ worklet playing) | {stats_cells(r['ttfs'])} |")
    print()
    for mode in ("stream", "codec"):
        r = speech[mode]
        rtf = sorted(r["rtf"])
        median = rtf[len(rtf) // 2]
        print(f"- {mode}: real-time factor median {median:.3f}; playback gaps {r['gaps']} in {args.runs} utterances")
    n = len(video["text"])
    print(f"\n### Video page, typed question with 1 frame/s of fake camera (N={n})\n")
    print("| figure | p50 ms | p95 ms | min ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    print(f"| frame ack (capture → ack, last frame before the answer) | {stats_cells(video['ack'])} |")
    print(f"| first answer text (video.query → first text delta) | {stats_cells(video['text'])} |")
    print(f"| first answer audio (video.query → first audio delta) | {stats_cells(video['audio'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
