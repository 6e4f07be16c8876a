#!/usr/bin/env python
"""``/v1/realtime`` as a voice agent sees it, driven by the official ``openai`` SDK's realtime client.

Against one server (daphne started here, as the README starts it, unless ``--url`` names one), with
the real models: questions in our own voice (PCM16 24 kHz) streamed at playback pace (20 ms
appends), turns found by the server's VAD, answers from the video thinker about a photo, spoken.

1. **Speech end → first answer audio**: from ``input_audio_buffer.speech_stopped`` to the first
   ``response.output_audio.delta`` (both as the client receives them), also to the first transcript
   delta. In between: the response starts, Whisper transcribes the question, the thinker answers,
   the talker and vocoder make the first chunk. Target ≤ 350 ms (median). Also when the first
   input transcript delta came (streaming recognition): before ``speech_stopped`` (target, for a
   question longer than 1.5 s).
2. **Barge-in**: an answer is playing; the client speaks over it. From
   ``input_audio_buffer.speech_started`` to ``response.done`` (status ``cancelled``, reason
   ``turn_detected``), and how much answer audio arrived after ``speech_started``. Target ≤ 100 ms.
3. **16 concurrent conversations** (starts spread over 1 s), each a spoken question and its spoken
   answer. A player starts each answer at its first delta after a 100 ms jitter buffer; a gap is
   any time it would run dry before the answer's last delta. Target: no gap in any conversation.
   Also without a jitter buffer (info), and speech end → first audio under that load against its
   **floor**: the work those turns need after their speech ends (Whisper on the question, and a
   typed question's response to its first audio, each measured alone in this run) times the
   number of conversations, spread over the CPUs. Target: p90 ≤ 1.5× the floor.
4. **64 concurrent conversations** (``--many``): every one answered, or refused with a clear
   ``capacity`` error; none left waiting.

The server started here runs with ``OMNIWEB_ENGINE_MAX_AHEAD_SECONDS=5`` (the engine stays 5 s
ahead of playback; the default 30 s writes a short answer whole at once, so nothing would be left to
stop by the time a barge-in is detected: the client then stops its own playback and truncates).

Prints markdown to stdout, progress to stderr; exit status 1 when a target fails. Timings on a
loaded machine are higher than on an idle one: run ``uptime`` alongside.

Usage (repository root, venv active)::

    python bench/realtime_latency.py                # N=10 for 1 and 2, 16 conversations, 64 at once
    python bench/realtime_latency.py --quick        # N=3, 8 conversations, no crowd
    python bench/realtime_latency.py --url http://127.0.0.1:8000 --api-key TOKEN
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import openai

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from speech_latency import free_port, serving  # noqa: E402
from support.photos import jpeg, photo  # noqa: E402

RATE = 24000
CHUNK_MS = 20
QUESTION = "How many people can you see?"
LONG_QUESTION = "Describe everything you can see in the picture."
TARGET_FIRST_AUDIO = 0.350
TARGET_FLOOR_RATIO = 1.5
MIN_STREAMED_SECONDS = 1.5  # a question at least this long has its first transcript delta while spoken
TARGET_BARGE_IN = 0.100
JITTER_BUFFER = 0.100
# The engine stays this far ahead of playback (a voice agent's setting: an answer spoken over is
# still being written, so barge-in has something to stop, and less synthesis is wasted on it).
MAX_AHEAD_SECONDS = 5.0
perf = time.perf_counter


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def server() -> Iterator[str]:
    """daphne as the README starts it, on a free loopback port."""
    port = free_port()
    env = {
        "OMNIWEB_ENGINE_MAX_AHEAD_SECONDS": os.environ.get("OMNIWEB_ENGINE_MAX_AHEAD_SECONDS", str(MAX_AHEAD_SECONDS))
    }
    args = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"]
    with serving(args, port, env) as base:
        yield base


def spoken_question() -> bytes:
    from hibari import Hibari

    wave = Hibari()(QUESTION, seed=7).astype(np.float32)
    pcm = (np.clip(wave, -1, 1) * 32767).astype("<i2")
    silence = np.zeros(RATE // 2, "<i2")
    return np.concatenate([silence, pcm, silence, silence, silence]).tobytes()  # 0.5 s before, 1.5 s after


IMAGE = "data:image/jpeg;base64," + base64.b64encode(jpeg(photo("astronaut"))).decode()


@dataclass
class Turn:
    """Arrival times (perf counter) of one response's events as the client saw them."""

    speech_started: float | None = None
    speech_stopped: float | None = None
    transcribed: float | None = None  # conversation.item.input_audio_transcription.completed
    first_input_delta: float | None = None  # conversation.item.input_audio_transcription.delta
    first_transcript: float | None = None
    first_audio: float | None = None
    done: float | None = None
    status: str | None = None
    reason: str | None = None
    deltas: list[tuple[float, int]] = field(default_factory=list)  # (arrival, bytes)
    errors: list[str] = field(default_factory=list)


async def open_conn(client: openai.AsyncOpenAI, **session: Any) -> Any:
    manager = client.realtime.connect(model="gpt-realtime")
    conn = await manager.__aenter__()
    assert (await conn.recv()).type == "session.created"
    transcription = {"input": {"transcription": {"model": "whisper-1", "language": "en"}}}
    await conn.session.update(
        session={"type": "realtime", "output_modalities": ["audio"], "audio": transcription, **session}
    )
    assert (await conn.recv()).type == "session.updated"
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": IMAGE}]}
    )
    while (await conn.recv()).type != "conversation.item.done":
        pass
    return manager, conn


async def paced_audio(conn: Any, pcm: bytes) -> None:
    """Append at playback pace, as a microphone would."""
    step = RATE * 2 * CHUNK_MS // 1000
    start = perf()
    for n, i in enumerate(range(0, len(pcm), step)):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + step]).decode())
        delay = start + (n + 1) * CHUNK_MS / 1000 - perf()
        if delay > 0:
            await asyncio.sleep(delay)


async def read_turn(conn: Any, turn: Turn, *, stop_on: str = "response.done") -> None:
    while True:
        event = await asyncio.wait_for(conn.recv(), 120)
        now = perf()
        kind = event.type
        if kind == "input_audio_buffer.speech_started" and turn.speech_started is None:
            turn.speech_started = now
        elif kind == "input_audio_buffer.speech_stopped" and turn.speech_stopped is None:
            turn.speech_stopped = now
        elif kind == "conversation.item.input_audio_transcription.completed" and turn.transcribed is None:
            turn.transcribed = now
        elif kind == "conversation.item.input_audio_transcription.delta" and turn.first_input_delta is None:
            turn.first_input_delta = now
        elif kind == "response.output_audio_transcript.delta" and turn.first_transcript is None:
            turn.first_transcript = now
        elif kind == "response.output_audio.delta":
            if turn.first_audio is None:
                turn.first_audio = now
            turn.deltas.append((now, len(base64.b64decode(event.delta))))
        elif kind == "error":
            turn.errors.append(f"{event.error.code}: {event.error.message}")
        elif kind == "response.done":
            turn.done, turn.status = now, event.response.status
            details = event.response.status_details
            turn.reason = details.reason if details is not None else None
            if kind == stop_on:
                return


async def spoken_turn(client: openai.AsyncOpenAI, pcm: bytes) -> Turn:
    manager, conn = await open_conn(client)
    try:
        turn = Turn()
        sender = asyncio.create_task(paced_audio(conn, pcm))
        await read_turn(conn, turn)
        await sender
        return turn
    finally:
        await manager.__aexit__(None, None, None)


async def barge_in(client: openai.AsyncOpenAI, pcm: bytes) -> tuple[Turn, int]:
    """An answer plays; the question is spoken over it. Returns the cancelled turn and the bytes of
    answer audio that arrived after speech_started."""
    manager, conn = await open_conn(client)
    try:
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_QUESTION}]}
        )
        await conn.response.create()
        turn = Turn()
        while turn.first_audio is None:
            event = await asyncio.wait_for(conn.recv(), 120)
            if event.type == "response.output_audio.delta":
                turn.first_audio = perf()
        sender = asyncio.create_task(paced_audio(conn, pcm))
        await read_turn(conn, turn)  # up to the cancelled response's done
        late = sum(n for t, n in turn.deltas if turn.speech_started is not None and t > turn.speech_started)
        sender.cancel()
        return turn, late
    finally:
        await manager.__aexit__(None, None, None)


async def typed_turn(client: openai.AsyncOpenAI) -> float:
    """The question typed, not spoken: from response.create to the first answer audio (the
    thinker, the talker and the vocoder's first chunk, with no Whisper)."""
    manager, conn = await open_conn(client)
    try:
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
        )
        while (await conn.recv()).type != "conversation.item.done":
            pass
        start = perf()
        await conn.response.create()
        turn = Turn()
        await read_turn(conn, turn)
        if turn.first_audio is None:
            raise RuntimeError(f"typed turn: no audio ({turn.status} {turn.errors})")
        return turn.first_audio - start
    finally:
        await manager.__aexit__(None, None, None)


async def whisper_alone(client: openai.AsyncOpenAI, pcm: bytes) -> float:
    """The same question through /v1/audio/transcriptions (the same Whisper): the share of the
    turn's latency that is Whisper's on this machine right now."""
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm)
    start = perf()
    await client.audio.transcriptions.create(model="whisper-1", file=("q.wav", buf.getvalue(), "audio/wav"))
    return perf() - start


def gaps(turn: Turn, buffer_s: float) -> float:
    """Seconds a player would run dry, starting at the first delta plus ``buffer_s``."""
    if not turn.deltas:
        return float("inf")
    clock = turn.deltas[0][0] + buffer_s  # when the queued audio starts playing
    dry = 0.0
    for arrival, nbytes in turn.deltas:
        if arrival > clock:
            dry += arrival - clock
            clock = arrival
        clock += nbytes / 2 / RATE
    return dry


def ms(x: float) -> str:
    return f"{x * 1000:.0f}"


def row(label: str, xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    return f"| {label} | {len(xs)} | {ms(statistics.median(xs))} | {ms(p90)} | {ms(xs[-1])} |"


async def run(base: str, api_key: str, reps: int, concurrent: int, many: int) -> int:
    client = openai.AsyncOpenAI(api_key=api_key, base_url=base + "/v1", max_retries=0)
    pcm = spoken_question()
    failures = []
    log("warm-up")
    await spoken_turn(client, pcm)

    print("## Realtime API (`bench/realtime_latency.py`)\n")
    print(f"`uptime` at the start: {os.getloadavg()[0]:.2f} (1-min load), {os.cpu_count()} CPUs\n")
    first_audio, first_text, transcribed, whisper, typed, input_delta = [], [], [], [], [], []
    speech = pcm[RATE : -3 * RATE]  # the question without its silence (bytes: 0.5 s before, 1.5 s after)
    spoken_s = len(speech) / 2 / RATE
    for i in range(reps):
        log(f"spoken turn {i + 1}/{reps}")
        whisper.append(await whisper_alone(client, speech))
        typed.append(await typed_turn(client))
        turn = await spoken_turn(client, pcm)
        if turn.errors or turn.status != "completed" or turn.first_audio is None or turn.speech_stopped is None:
            failures.append(f"spoken turn {i}: {turn.status} {turn.errors}")
            continue
        first_audio.append(turn.first_audio - turn.speech_stopped)
        if turn.transcribed is not None:
            transcribed.append(turn.transcribed - turn.speech_stopped)
        if turn.first_input_delta is not None:
            input_delta.append(turn.first_input_delta - turn.speech_stopped)
        first_text.append((turn.first_transcript or turn.first_audio) - turn.speech_stopped)
    stops, late_bytes = [], []
    for i in range(reps):
        log(f"barge-in {i + 1}/{reps}")
        turn, late = await barge_in(client, pcm)
        if turn.status != "cancelled" or turn.reason != "turn_detected" or turn.speech_started is None:
            failures.append(f"barge-in {i}: {turn.status} {turn.reason} {turn.errors}")
            continue
        assert turn.done is not None
        stops.append(turn.done - turn.speech_started)
        late_bytes.append(late)

    print(f"### 1-2. One conversation at a time (N={reps})\n")
    print(f"The spoken question: {QUESTION!r}, {spoken_s:.2f} s of speech.\n")
    print("| measure | n | median ms | p90 ms | max ms |\n|---|---|---|---|---|")
    if whisper:
        print(row("Whisper alone on the question (/v1/audio/transcriptions, same run; info)", whisper))
    if typed:
        print(row("the question typed: response.create → first output_audio.delta (info)", typed))
    if input_delta:
        print(row("speech_stopped → first input transcript delta (negative: while speaking)", input_delta))
    if transcribed:
        print(row("speech_stopped → input_audio_transcription.completed", transcribed))
    if first_text:
        print(row("speech_stopped → first transcript delta", first_text))
    if first_audio:
        print(row("speech_stopped → first output_audio.delta", first_audio))
    if stops:
        print(row("barge-in: speech_started → response.done (cancelled)", stops))
    if late_bytes:
        print(f"\nAnswer audio arriving after speech_started: max {max(late_bytes) / 48:.0f} ms of audio.\n")

    log(f"{concurrent} concurrent conversations")

    async def one(delay: float) -> Turn:
        await asyncio.sleep(delay)
        return await spoken_turn(client, pcm)

    rng = random.Random(0)
    turns = await asyncio.gather(*(one(rng.random()) for _ in range(concurrent)))
    ok = [t for t in turns if t.status == "completed" and not t.errors and t.speech_stopped and t.first_audio]
    for t in turns:
        if t not in ok:
            failures.append(f"concurrent: {t.status} {t.errors}")
    buffered = [gaps(t, JITTER_BUFFER) for t in ok]
    raw = [gaps(t, 0.0) for t in ok]
    print(f"\n### 3. {concurrent} concurrent spoken conversations (starts spread over 1 s)\n")
    print("| measure | n | median ms | p90 ms | max ms |\n|---|---|---|---|---|")
    if ok:
        print(row("speech_stopped → first output_audio.delta", [t.first_audio - t.speech_stopped for t in ok]))
        print(row(f"player dry time, {ms(JITTER_BUFFER)} ms jitter buffer (target 0)", buffered))
        print(row("player dry time, no buffer (info)", raw))
    floor = None
    if ok and whisper and typed:
        floor = concurrent * (statistics.median(whisper) + statistics.median(typed)) / (os.cpu_count() or 1)
        loaded = sorted(t.first_audio - t.speech_stopped for t in ok)
        p90 = loaded[min(len(loaded) - 1, int(0.9 * len(loaded)))]
        print(
            f"\nFloor: {concurrent} × (Whisper {ms(statistics.median(whisper))} ms + typed turn "
            f"{ms(statistics.median(typed))} ms) / {os.cpu_count()} CPUs = {ms(floor)} ms; "
            f"p90 / floor = {p90 / floor:.2f} (target ≤ {TARGET_FLOOR_RATIO})."
        )
    print(f"\n{len(ok)}/{concurrent} conversations completed.\n")

    answered = refused = silent = 0
    if many:
        log(f"{many} concurrent conversations")

        async def bounded(delay: float) -> Turn | None:
            try:
                return await asyncio.wait_for(one(delay), 180)
            except TimeoutError:
                return None

        crowd = await asyncio.gather(*(bounded(rng.random()) for _ in range(many)), return_exceptions=True)
        other = []
        for t in crowd:
            if t is None:
                silent += 1
            elif isinstance(t, BaseException):
                other.append(repr(t))
            elif t.status == "completed" and not t.errors and t.first_audio is not None:
                answered += 1
            elif t.status == "failed" and any(e.startswith("capacity") for e in t.errors):
                refused += 1
            else:
                other.append(f"{t.status} {t.errors}")
        print(f"### 4. {many} concurrent spoken conversations (starts spread over 1 s)\n")
        print(f"answered {answered}, refused with `capacity` {refused}, left waiting {silent}, other {len(other)}\n")
        failures += [f"{many} concurrent: {o}" for o in other]

    print("### Targets\n")
    verdicts = []
    if first_audio:
        verdicts.append(
            ("speech end → first audio ≤ 350 ms (median)", statistics.median(first_audio) <= TARGET_FIRST_AUDIO)
        )
    if stops:
        verdicts.append(
            ("barge-in: speech onset → answer stopped ≤ 100 ms (median)", statistics.median(stops) <= TARGET_BARGE_IN)
        )
    if input_delta and spoken_s >= MIN_STREAMED_SECONDS:
        verdicts.append(
            ("first input transcript delta before speech_stopped (median)", statistics.median(input_delta) < 0)
        )
    verdicts.append(
        (
            f"{concurrent} concurrent conversations, no audio gap",
            len(ok) == concurrent and max(buffered, default=1) == 0,
        )
    )
    if floor is not None:
        loaded = sorted(t.first_audio - t.speech_stopped for t in ok)
        p90 = loaded[min(len(loaded) - 1, int(0.9 * len(loaded)))]
        verdicts.append(
            (
                f"{concurrent} concurrent: p90 speech end → first audio ≤ {TARGET_FLOOR_RATIO}× floor",
                p90 <= TARGET_FLOOR_RATIO * floor,
            )
        )
    if many:
        verdicts.append((f"{many} concurrent: every one answered or refused (capacity)", answered + refused == many))
    for label, passed in verdicts:
        print(f"- {'PASS' if passed else 'FAIL'}: {label}")
    for f in failures:
        print(f"- problem: {f}")
    await client.close()
    return 0 if all(p for _, p in verdicts) and not failures else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start daphne here)")
    parser.add_argument("--api-key", default=os.environ.get("OMNIWEB_API_TOKEN", "unused"))
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--many", type=int, default=64, help="the crowd phase (0: skip)")
    parser.add_argument("--quick", action="store_true", help="N=3, 8 conversations, no crowd")
    args = parser.parse_args()
    reps, concurrent, many = (3, 8, 0) if args.quick else (args.n, args.concurrent, args.many)
    if args.url:
        return asyncio.run(run(args.url.rstrip("/"), args.api_key, reps, concurrent, many))
    with server() as base:
        return asyncio.run(run(base, args.api_key, reps, concurrent, many))


if __name__ == "__main__":
    sys.exit(main())
