#!/usr/bin/env python
"""The camera page hands-free, timed in Debian's Chromium: turn detection, answer, barge-in.

Starts daphne (default settings) unless ``--url`` names a server. The page's camera is Chromium's
fake one; its microphone is a WebAudio graph the bench plays our voice into on cue
(tests/js/cued-microphone.js), which also timestamps every message the page receives and every
change of the answer's audio state with the page's own clock. Each round, on one page:

1. the bench says a question ("Describe everything you can see."), the page streams it, the
   server's VAD finds the turn and answers it;
2. 300 ms into the answer's audio, the bench says a second question over it (barge-in), and waits
   for that one's answer.

Speech times inside each clip (its onset and end: 10 ms RMS within 30 dB of its loudest) are
measured on the clip, so the figures count from the speech itself, not from the clip's lead-in:

- onset → ``speech_started`` at the page (the 40 ms microphone chunks, the VAD's 64 ms minimum
  speech, the network);
- speech end → ``speech_stopped`` at the page (includes the 500 ms of silence that ends a turn);
- ``speech_stopped`` → first answer text / first answer audio at the page, and the end of the
  speech → first answer audio (what the person waits);
- barge-in: onset of the second question → ``speech_started``; ``speech_started`` → the page's
  player stopped (``#audio-state`` "stopped").

Prints markdown tables. Usage (repository root, venv active)::

    python bench/video_handsfree.py [--rounds 5] [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from browser_pages import start_server
from playwright.sync_api import Page, sync_playwright
from speech_latency import stats_cells
from support.page_frames import launch  # on the path through browser_pages (tests/)

REPO = Path(__file__).resolve().parent.parent
CUED_MIC = (REPO / "tests" / "js" / "cued-microphone.js").read_text()
FIRST = "Describe everything you can see."
SECOND = "Is it dark in here?"
RATE = 24_000


def speech_extent_s(audio: np.ndarray) -> tuple[float, float]:
    """Where the speech is in a 24 kHz clip: 10 ms RMS within 30 dB of its loudest."""
    rms = np.sqrt(np.convolve(audio**2, np.ones(240) / 240, "same"))
    loud = np.flatnonzero(rms > rms.max() * 10 ** (-30 / 20))
    return loud[0] / RATE, loud[-1] / RATE


def cue(page: Page, name: str, audio: np.ndarray) -> None:
    data = base64.b64encode(audio.astype("<f4").tobytes()).decode()
    page.evaluate(
        """([name, data]) => {
             const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
             window.__cues[name] = new Float32Array(bytes.buffer);
           }""",
        [name, data],
    )


def first_after(events: list[dict[str, Any]], kind: str, t: float) -> float | None:
    return next((e["t"] for e in events if e["type"] == kind and e["t"] >= t), None)


def one_round(page: Page, extents: dict[str, tuple[float, float]]) -> dict[str, float]:
    """One question and one barge-in; the round's figures in seconds."""
    mark = page.evaluate("performance.now()")
    turns = page.locator(".turn").count()
    page.evaluate("__say('first')")
    page.wait_for_function(
        "t => __events.some((e) => e.type === 'audio-state:playing' && e.t > t)", arg=mark, timeout=60_000
    )
    page.wait_for_timeout(300)
    page.evaluate("__say('second')")
    page.wait_for_function(
        "n => { const t = document.querySelectorAll('.turn');"
        " return t.length >= n && !['waiting', 'answering'].includes(t[n - 1].dataset.how); }",
        arg=turns + 2,
        timeout=60_000,
    )
    page.wait_for_selector("#state[data-state='done']", timeout=60_000)
    events = page.evaluate("__events")
    said = {s["name"]: s["t"] for s in page.evaluate("__said") if s["t"] >= mark}
    onset1 = said["first"] + 1000 * extents["first"][0]
    end1 = said["first"] + 1000 * extents["first"][1]
    onset2 = said["second"] + 1000 * extents["second"][0]
    started1 = first_after(events, "input_audio_buffer.speech_started", said["first"])
    stopped1 = first_after(events, "input_audio_buffer.speech_stopped", said["first"])
    text1 = first_after(events, "response.text.delta", stopped1)
    audio1 = first_after(events, "response.audio.delta", stopped1)
    started2 = first_after(events, "input_audio_buffer.speech_started", said["second"])
    halted = first_after(events, "audio-state:stopped", started2)
    if None in (started1, stopped1, text1, audio1, started2, halted):
        raise RuntimeError(f"an event is missing: {[e['type'] for e in events if e['t'] >= mark]}")
    return {
        "onset": (started1 - onset1) / 1000,
        "stop": (stopped1 - end1) / 1000,
        "text": (text1 - stopped1) / 1000,
        "audio": (audio1 - stopped1) / 1000,
        "wait": (audio1 - end1) / 1000,
        "barge_onset": (started2 - onset2) / 1000,
        "barge_stop": (halted - started2) / 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", help="a running server (default: start daphne here)")
    args = parser.parse_args()
    from hibari import Hibari

    voice = Hibari()
    clips = {"first": voice(FIRST, seed=7).astype(np.float32), "second": voice(SECOND, seed=7).astype(np.float32)}
    extents = {name: speech_extent_s(clip) for name, clip in clips.items()}
    proc, url = (None, args.url) if args.url else start_server()
    rounds: list[dict[str, float]] = []
    try:
        with sync_playwright() as p:
            browser = launch(p)
            # bypass_csp: the bench's wait_for_function strings are eval'd in the page
            page = browser.new_context(viewport={"width": 1100, "height": 900}, bypass_csp=True).new_page()
            page.add_init_script(CUED_MIC)
            page.goto(url + "/video/")
            page.click("#start")
            page.wait_for_selector("#listening[data-state='listening']", timeout=20_000)
            page.wait_for_function("Number(document.querySelector('#accepted').dataset.value) >= 1", timeout=20_000)
            for name, clip in clips.items():
                cue(page, name, clip)
            for i in range(args.rounds):
                rounds.append(one_round(page, extents))
                print(f"  round {i + 1}: {rounds[-1]}", file=sys.stderr)
            browser.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)

    def col(key: str) -> list[float]:
        return [r[key] for r in rounds]

    load = os.getloadavg()
    print(f"### Video page hands-free (N={len(rounds)} rounds; load average {load[0]:.2f} at the end)\n")
    print("| figure | p50 ms | p95 ms | min ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    print(f"| speech onset → `speech_started` at the page | {stats_cells(col('onset'))} |")
    print(f"| speech end → `speech_stopped` at the page (incl. 500 ms of silence) | {stats_cells(col('stop'))} |")
    print(f"| `speech_stopped` → first answer text | {stats_cells(col('text'))} |")
    print(f"| `speech_stopped` → first answer audio | {stats_cells(col('audio'))} |")
    print(f"| speech end → first answer audio (the wait) | {stats_cells(col('wait'))} |")
    print(f"| barge-in: onset → `speech_started` at the page | {stats_cells(col('barge_onset'))} |")
    print(f"| barge-in: `speech_started` → the page's audio stopped | {stats_cells(col('barge_stop'))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
