#!/usr/bin/env python
"""Turn detection on ``/v1/realtime``: ``server_vad`` against ``semantic_vad``, on questions with a
pause in the middle of the sentence.

Against one server (daphne started here, as the README starts it, unless ``--url`` names one), a
client streams each question in real time (20 ms audio messages, as a microphone delivers them),
then silence until the turn has ended. The questions are our own voice (``tests/support/paused_speech.py``):
read with a comma where the speaker hesitates, that gap stretched to 0.6-1.0 s ("What is the colour
of ... the cup on the table?"). Each question gets a session of its own, per detector.

By default the sessions are the video endpoint's (``/v1/video/chat/stream``, ``turn_detection`` with
``create_response: false``): only turn detection runs there, so only the detector is timed.
``--endpoint realtime`` uses ``/v1/realtime`` (also ``create_response: false``), where the server
also transcribes the speech at each pause (the early transcription): on a busy CPU that Whisper work
delays the events that follow a pause, whichever detector found it.

1. **Cut off early**: the share of questions whose first ``input_audio_buffer.speech_stopped`` came
   before the speech went on after the pause (the speaker was cut off mid-sentence).
2. **Delay at the real end**: from the end of the question's speech (the moment its last sound
   left the microphone) to the ``speech_stopped`` after it, as the client receives it: median and
   p90 (ms). A detector that never stops within ``--tail`` seconds counts as that long.

``server_vad`` runs with OpenAI's defaults (500 ms of silence), ``semantic_vad`` with
``--eagerness`` (default auto). Prints markdown to stdout, progress to stderr. Timings on a loaded
machine are higher than on an idle one: the load average is printed.

Usage (repository root, venv active)::

    python bench/semantic_turn.py               # 12 questions
    python bench/semantic_turn.py --quick       # 4 questions
    python bench/semantic_turn.py --endpoint realtime
    python bench/semantic_turn.py --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from speech_latency import free_port, load_average, pct, serving  # noqa: E402
from support.paused_speech import PausedQuestion, paused_question, pcm16  # noqa: E402

CHUNK_MS = 20
# Not the sentences the detector's windows and thresholds were chosen on (omniweb/conversation/vad.py).
QUESTIONS = [
    "What is the colour of, the cup on the table?",
    "Can you read the label on, the bottle in my hand?",
    "How many windows are there in, the room behind me?",
    "Is the light above the, door switched on?",
    "What is written at the top of, the whiteboard?",
    "Which of the two, chairs is closer to you?",
    "What kind of plant is standing next to, the sofa?",
    "How many pens are lying on, the desk?",
    "What is the person on the left, holding in her hand?",
    "Can you tell me the time on, the clock over there?",
    "What colour is the, jacket hanging on the hook?",
    "Is there anything on the plate in front of, the laptop?",
]
PAUSES_S = (0.6, 0.7, 0.8, 0.9, 1.0)
LEAD_S = 0.5
perf = time.perf_counter


@dataclass
class Outcome:
    cut_off: bool  # a speech_stopped before the speech went on after the pause
    delay_s: float  # end of speech → the speech_stopped after it (the tail, if none came)
    stopped: bool


@contextmanager
def server() -> Iterator[str]:
    """daphne as the README starts it, on a free loopback port."""
    port = free_port()
    args = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"]
    with serving(args, port) as base:
        yield base


@dataclass(frozen=True)
class Endpoint:
    path: str
    rate: int

    async def open(self, ws_url: str, api_key: str | None, turn_detection: dict[str, Any]) -> ClientConnection:
        """A session whose turns are detected (and not answered) with ``turn_detection``."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        ws = await connect(f"{ws_url}{self.path}", additional_headers=headers, max_size=None)
        turn_detection = {**turn_detection, "create_response": False}
        if self.path == REALTIME.path:
            created = json.loads(await ws.recv())
            assert created["type"] == "session.created", created
            audio = {"input": {"turn_detection": turn_detection}}
            update = {"type": "realtime", "output_modalities": ["text"], "audio": audio}
            await ws.send(json.dumps({"type": "session.update", "session": update}))
            while (event := json.loads(await ws.recv()))["type"] != "session.updated":
                if event["type"] == "error":
                    raise SystemExit(f"session.update refused: {event['error']['message']}")
        else:  # the video endpoint answers a valid session.config with nothing
            config = {"type": "session.config", "modalities": ["text"], "turn_detection": turn_detection}
            await ws.send(json.dumps(config))
        return ws

    def append(self, pcm: bytes) -> str:
        data = base64.b64encode(pcm).decode()
        if self.path == REALTIME.path:
            return json.dumps({"type": "input_audio_buffer.append", "audio": data})
        return json.dumps({"type": "audio.chunk", "data": data})


REALTIME = Endpoint("/v1/realtime?model=gpt-realtime", 24_000)
VIDEO = Endpoint("/v1/video/chat/stream", 16_000)


async def ask(ws: ClientConnection, endpoint: Endpoint, q: PausedQuestion, tail_s: float) -> Outcome:
    """Stream the question in real time, then silence until the turn after its end has stopped."""
    stops: list[tuple[int, float]] = []  # (audio_end_ms, received at)
    errors: list[str] = []
    done = asyncio.Event()

    async def listen() -> None:
        async for raw in ws:
            event = json.loads(raw)
            if event["type"] == "input_audio_buffer.speech_stopped":
                stops.append((event["audio_end_ms"], perf()))
                if event["audio_end_ms"] > q.speech_end_ms:
                    done.set()
            elif event["type"] == "error":
                errors.append(event.get("message") or event["error"]["message"])

    listener = asyncio.create_task(listen())
    audio = pcm16(q.audio) + bytes(int(endpoint.rate * tail_s) * 2)
    chunk_bytes = endpoint.rate * 2 * CHUNK_MS // 1000
    start = perf()
    for i, at in enumerate(range(0, len(audio), chunk_bytes)):
        if done.is_set():
            break
        # a microphone hands over each 20 ms once it has been recorded
        await asyncio.sleep(max(0.0, start + (i + 1) * CHUNK_MS / 1000 - perf()))
        await ws.send(endpoint.append(audio[at : at + chunk_bytes]))
    if not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=0.5)
    listener.cancel()
    await asyncio.gather(listener, return_exceptions=True)
    if errors:
        raise SystemExit(f"the server sent errors: {errors}")
    final = next((at for end, at in stops if end > q.speech_end_ms), None)
    return Outcome(
        cut_off=any(end < q.pause_end_ms for end, _ in stops),
        delay_s=(final - (start + q.speech_end_ms / 1000)) if final is not None else tail_s,
        stopped=final is not None,
    )


async def run(base: str, api_key: str | None, endpoint: Endpoint, n: int, eagerness: str, tail_s: float) -> int:
    from hibari import Hibari

    voice = Hibari()
    questions = [
        paused_question(voice, text, PAUSES_S[i % len(PAUSES_S)], lead_s=LEAD_S, tail_s=0.0, rate=endpoint.rate)
        for i, text in enumerate(QUESTIONS[:n])
    ]
    ws_url = base.replace("http://", "ws://").replace("https://", "wss://")
    detectors = {
        "server_vad": {"type": "server_vad"},
        f"semantic_vad ({eagerness})": {"type": "semantic_vad", "eagerness": eagerness},
    }
    results: dict[str, list[Outcome]] = {name: [] for name in detectors}
    for i, q in enumerate(questions):
        for name, turn_detection in detectors.items():
            ws = await endpoint.open(ws_url, api_key, turn_detection)
            outcome = await ask(ws, endpoint, q, tail_s)
            await ws.close()
            results[name].append(outcome)
            print(
                f"{i + 1:2}/{len(questions)} pause {PAUSES_S[i % len(PAUSES_S)]:.1f} s {name:20}: "
                f"{'CUT OFF' if outcome.cut_off else 'kept   '} delay {1000 * outcome.delay_s:6.0f} ms",
                file=sys.stderr,
            )
    where = endpoint.path.split("?")[0]
    print(f"## Turn detection on {where}: {len(questions)} questions with a 0.6-1.0 s pause mid-sentence\n")
    print(f"load average at the end: {load_average()}\n")
    print("| detector | cut off early | delay at the real end, median (ms) | p90 (ms) | no stop within the tail |")
    print("|---|---|---|---|---|")
    for name, outcomes in results.items():
        cut = 100.0 * sum(o.cut_off for o in outcomes) / len(outcomes)
        delays = [o.delay_s * 1000 for o in outcomes]
        missing = sum(not o.stopped for o in outcomes)
        print(f"| {name} | {cut:.0f} % | {pct(delays, 50):.0f} | {pct(delays, 90):.0f} | {missing} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start daphne here)")
    parser.add_argument("--api-key", default=os.environ.get("OMNIWEB_API_TOKEN"))
    parser.add_argument("--n", type=int, default=len(QUESTIONS), help="questions (at most %(default)s)")
    parser.add_argument("--endpoint", default="video", choices=["video", "realtime"])
    parser.add_argument("--eagerness", default="auto", choices=["low", "medium", "high", "auto"])
    parser.add_argument("--tail", type=float, default=4.5, help="seconds of silence after a question, at most")
    parser.add_argument("--quick", action="store_true", help="4 questions")
    args = parser.parse_args()
    n = 4 if args.quick else min(args.n, len(QUESTIONS))
    endpoint = REALTIME if args.endpoint == "realtime" else VIDEO
    print(f"load average at start: {load_average()}", file=sys.stderr)
    if args.url:
        return asyncio.run(run(args.url.rstrip("/"), args.api_key, endpoint, n, args.eagerness, args.tail))
    with server() as base:
        return asyncio.run(run(base, args.api_key, endpoint, n, args.eagerness, args.tail))


if __name__ == "__main__":
    sys.exit(main())
