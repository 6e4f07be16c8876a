#!/usr/bin/env python
"""The Realtime API over WebRTC (``POST /v1/realtime/calls``) against the WebSocket, same question, same run.

Against one server (daphne started here, as the README starts it, unless ``--url`` names one), with
the real models: the question "How many people can you see?" in our own voice about a photo (an
``input_image`` item first), the turn ended by the server's VAD, the answer spoken by the talker.
The two paths alternate, N turns each, each turn a new session, the question preceded by 0, 20, 40,
60 or 80 ms of silence turn by turn, alike on both paths (the server's VAD hears audio in 96 ms
batches: where in a batch the speech ends moves the turn's end by up to that, and a WebSocket turn
that always starts with the question would always end at the same point of a batch):

- **WebSocket**: the official SDK's realtime client appending the question at playback pace (20 ms
  appends), the answer as ``response.output_audio.delta``;
- **WebRTC**: aiortc as the caller (``tests/support/webrtc.py``): the question on its microphone
  track (Opus, 20 ms frames in real time), the answer on the remote track, decoded and recorded.

**Speech end → first answer audio**: from the moment the question's last loud sample left the client
(appended / handed to the Opus encoder) to the moment the answer's first audible sample can play:
on WebRTC, when the first frame with sound comes out of the caller's decoder (its jitter buffer
included); on the WebSocket, when the first delta arrived plus the answer audio before its first
loud sample (a player starting at the first delta plays that sample then). Target: WebRTC median
≤ 1.2× the WebSocket median.

**The Opus path's added delay** (WebRTC only): the first audible sample's arrival minus the arrival
of ``output_audio_buffer.started`` (the server says it as it hands the answer's first frame to the
encoder) and the answer's lead before its first loud sample: encoding, RTP, the caller's jitter
buffer (aiortc holds 4 packets) and decoding. The input side's counterpart shows in
"speech end → speech_stopped" (the server's jitter buffer and decoder before its VAD).

Prints markdown to stdout, progress to stderr; exit status 1 when the target fails. Timings on a
loaded machine are higher than on an idle one: run ``uptime`` alongside.

Usage (repository root, venv active)::

    python bench/webrtc_latency.py                # N=10 turns each
    python bench/webrtc_latency.py --quick        # N=3
    python bench/webrtc_latency.py --url http://127.0.0.1:8000 --api-key TOKEN
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from speech_latency import free_port, serving  # noqa: E402
from support.photos import jpeg, photo  # noqa: E402
from support.webrtc import SILENT, Caller, said  # noqa: E402

RATE = 24000
CHUNK_MS = 20
QUESTION = "How many people can you see?"
TARGET_RATIO = 1.2
LEADS_MS = (0, 20, 40, 60, 80)  # silence before the question, turn by turn (both paths alike)
IMAGE = "data:image/jpeg;base64," + base64.b64encode(jpeg(photo("astronaut"))).decode()
SESSION = {
    "type": "realtime",
    "output_modalities": ["audio"],
    "audio": {"input": {"transcription": {"model": "whisper-1", "language": "en"}}},
}
IMAGE_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": IMAGE}]}
perf = time.perf_counter


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def server() -> Iterator[str]:
    """daphne as the README starts it, on a free loopback port."""
    port = free_port()
    args = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"]
    with serving(args, port) as base:
        yield base


@dataclass
class Turn:
    """One spoken turn as the client saw it (perf-counter times)."""

    speech_end: float
    speech_stopped: float
    first_audible: float
    lead_ms: float | None = None  # WebSocket: the answer's audio before its first loud sample
    started: float | None = None  # WebRTC: output_audio_buffer.started's arrival
    first_delta: float | None = None  # WebSocket: the first response.output_audio.delta's arrival

    @property
    def first_audio_ms(self) -> float:
        return (self.first_audible - self.speech_end) * 1000

    @property
    def vad_ms(self) -> float:
        return (self.speech_stopped - self.speech_end) * 1000


def last_loud(pcm: bytes) -> int:
    """The byte offset just past the last loud sample."""
    idx = np.flatnonzero(np.abs(np.frombuffer(pcm, "<i2")) > SILENT)
    return (int(idx[-1]) + 1) * 2


async def websocket_turn(client: openai.AsyncOpenAI, question: bytes) -> Turn:
    async with client.realtime.connect(model="gpt-realtime") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session=SESSION)
        assert (await conn.recv()).type == "session.updated"
        await conn.conversation.item.create(item=IMAGE_ITEM)
        while (await conn.recv()).type != "conversation.item.done":
            pass
        end_at = last_loud(question)
        speech_end: list[float] = []

        async def speak() -> None:
            step = RATE * 2 * CHUNK_MS // 1000
            start = perf()
            for n, i in enumerate(range(0, len(question), step)):
                await conn.input_audio_buffer.append(audio=base64.b64encode(question[i : i + step]).decode())
                if not speech_end and i + step >= end_at:
                    speech_end.append(perf())
                delay = start + (n + 1) * CHUNK_MS / 1000 - perf()
                if delay > 0:
                    await asyncio.sleep(delay)

        sender = asyncio.create_task(speak())
        stopped = first_delta = first_audible = lead_ms = None
        answer_bytes = 0
        while True:
            event = await asyncio.wait_for(conn.recv(), 120)
            now = perf()
            if event.type == "input_audio_buffer.speech_stopped" and stopped is None:
                stopped = now
            elif event.type == "response.output_audio.delta":
                pcm = base64.b64decode(event.delta)
                first_delta = first_delta or now
                loud = np.flatnonzero(np.abs(np.frombuffer(pcm, "<i2")) > SILENT)
                if first_audible is None and loud.size:
                    lead_ms = (answer_bytes + 2 * int(loud[0])) / (2 * RATE) * 1000
                    first_audible = max(now, first_delta + lead_ms / 1000)
                answer_bytes += len(pcm)
            elif event.type == "response.done":
                break
        await sender
    assert stopped is not None and first_audible is not None and speech_end
    return Turn(speech_end[0], stopped, first_audible, lead_ms=lead_ms, first_delta=first_delta)


async def webrtc_turn(base: str, api_key: str, question: bytes) -> Turn:
    caller = Caller()
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            response = await http.post(
                base + "/v1/realtime/calls",
                content=await caller.offer(),
                headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {api_key}"},
            )
        response.raise_for_status()
        await caller.answered(response.text)
        await caller.until("session.created")
        caller.send({"type": "session.update", "session": SESSION})
        await caller.until("session.updated")
        caller.send({"type": "conversation.item.create", "item": IMAGE_ITEM})
        await caller.until("conversation.item.done")
        caller.mic.say(question)
        await caller.until("output_audio_buffer.stopped")
        started = caller.at("output_audio_buffer.started")
        first_audible = caller.recording.first_loud(started - 0.5)
        assert first_audible is not None, "no sound on the answer track"
        return Turn(
            caller.mic.speech_ended[0], caller.at("input_audio_buffer.speech_stopped"), first_audible, started=started
        )
    finally:
        await caller.close()


def stats(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):.0f} / {p90:.0f}"


async def run(base: str, api_key: str, n: int) -> int:
    question = said(QUESTION)
    client = openai.AsyncOpenAI(api_key=api_key, base_url=base + "/v1", max_retries=0)
    log("warming up (one turn each, not counted)")
    await websocket_turn(client, question)
    await webrtc_turn(base, api_key, question)
    ws: list[Turn] = []
    rtc: list[Turn] = []
    for i in range(n):
        # The VAD hears audio in batches (FEED_MS, 96 ms): where the speech ends in a batch moves
        # the turn's end by up to that. The same lead of silence, turn by turn, on both paths.
        spoken = bytes(LEADS_MS[i % len(LEADS_MS)] * RATE * 2 // 1000) + question
        ws.append(await websocket_turn(client, spoken))
        rtc.append(await webrtc_turn(base, api_key, spoken))
        log(f"turn {i + 1}/{n}: WebSocket {ws[-1].first_audio_ms:.0f} ms, WebRTC {rtc[-1].first_audio_ms:.0f} ms")
    await client.close()
    lead = statistics.median(t.lead_ms for t in ws if t.lead_ms is not None)
    opus = [(t.first_audible - (t.started or 0)) * 1000 - lead for t in rtc]
    ratio = statistics.median(t.first_audio_ms for t in rtc) / statistics.median(t.first_audio_ms for t in ws)
    print(f"### WebRTC vs WebSocket: speech end → first answer audio (N={n} each, alternating)\n")
    print(f"Server {base}, `{os.uname().nodename}`, load average {os.getloadavg()[0]:.2f} at the end.\n")
    print(
        "| path | speech end → first answer audio (ms, p50 / p90) | speech end → `speech_stopped` "
        "| `speech_stopped` → first answer audio |"
    )
    print("|---|---|---|---|")
    for name, turns in (("WebSocket", ws), ("WebRTC", rtc)):
        after = [(t.first_audible - t.speech_stopped) * 1000 for t in turns]
        first, vad = stats([t.first_audio_ms for t in turns]), stats([t.vad_ms for t in turns])
        print(f"| {name} | {first} | {vad} | {stats(after)} |")
    print()
    print(f"- WebRTC / WebSocket (medians): **{ratio:.2f}×** (target ≤ {TARGET_RATIO}×).")
    print(
        f"- The Opus path's added delay on the answer (p50 / p90): **{stats(opus)} ms** "
        f"(`output_audio_buffer.started` → its first loud sample out of the caller's decoder, less the "
        f"answer's {lead:.0f} ms lead before that sample)."
    )
    return 0 if ratio <= TARGET_RATIO else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start daphne here)")
    parser.add_argument("--api-key", default=os.environ.get("OMNIWEB_API_TOKEN", "unused"))
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="N=3")
    args = parser.parse_args()
    n = 3 if args.quick else args.n
    if args.url:
        return asyncio.run(run(args.url.rstrip("/"), args.api_key, n))
    with server() as base:
        return asyncio.run(run(base, args.api_key, n))


if __name__ == "__main__":
    sys.exit(main())
