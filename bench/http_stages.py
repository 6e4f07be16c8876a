#!/usr/bin/env python
"""Where the OpenAI speech endpoint's first-byte milliseconds go, stage by stage, next to the WebSocket.

Starts ``manage.py runserver`` in a subprocess with clocks patched in (this file, ``--serve``):
each stage appends ``name time`` to a file, with ``time.perf_counter`` (CLOCK_MONOTONIC on Linux,
one clock for both processes). Then, one request at a time and interleaved, it times:

- ``ws``: the WebSocket (``stream_audio`` PCM) on an open connection, from sending the text and
  ``input.done`` to the first binary frame;
- ``raw pcm`` / ``raw mp3``: ``POST /v1/audio/speech`` as prepared bytes on a kept-alive
  connection (``http.client``): the HTTP path without the SDK's client-side work;
- ``sdk pcm`` / ``sdk mp3``: the same through the official SDK, as ``bench/openai_audio.py`` does.

Stages (medians of each stage's time from the previous one): ``recv`` (daphne has the whole
request / message), ``handler`` (the view / ``on_input_done``), ``submit`` (Scheduler.submit),
``chunk`` (a worker emits the first audio chunk), ``feed`` (the body hands it to the encoder),
``encoded`` (StreamEncoder gave bytes), ``send`` (daphne's ``handle_reply`` with the first audio
body / frame), ``write`` (the first socket write after it), ``client`` (the client's first audio
byte). Prints markdown to stdout.

Usage (repository root, venv active)::

    python bench/http_stages.py              # 15 repetitions
    python bench/http_stages.py --reps 30
    python bench/http_stages.py --sentences 40   # a long flush: the engine busy on both workers
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
perf = time.perf_counter
STAGES = ["recv", "handler", "submit", "chunk", "feed", "encoded", "send", "write", "client"]


# -- the server side: clocks patched into one runserver process --------------------------------------
def serve(stamp_path: str, argv: list[str]) -> None:
    """Patch the stage clocks in, then run ``manage.py`` with ``argv``."""
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")
    import django

    django.setup()
    from daphne import http_protocol, ws_protocol
    from django.core.management import execute_from_command_line
    from twisted.internet import tcp

    import omniweb.openai_api.views as views
    from omniweb.engine.scheduler import Scheduler
    from omniweb.media.containers import StreamEncoder
    from speech.session import SpeechSession

    fd = os.open(stamp_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    state = {"armed": False}  # a first audio body/frame was handed to daphne: stamp the next write

    def stamp(name: str) -> None:
        os.write(fd, f"{name} {perf()!r}\n".encode())

    def wrap(owner: object, name: str, before: object) -> None:
        original = getattr(owner, name)

        def patched(*args: object, **kwargs: object) -> object:
            before(*args, **kwargs)  # type: ignore[operator]
            return original(*args, **kwargs)

        setattr(owner, name, patched)

    def wrap_async(owner: object, name: str, label: str) -> None:
        original = getattr(owner, name)

        async def patched(*args: object, **kwargs: object) -> object:
            stamp(label)
            return await original(*args, **kwargs)

        setattr(owner, name, patched)

    wrap(http_protocol.WebRequest, "process", lambda self: stamp("recv"))
    wrap(
        ws_protocol.WebSocketProtocol,
        "onMessage",
        lambda self, payload, binary: b"input.done" in payload and stamp("recv"),
    )
    wrap_async(views, "speech", "handler")
    from omniweb.openai_api import urls  # the URL patterns hold the view function itself: re-point them

    for pattern in urls.urlpatterns:
        if getattr(pattern.callback, "__name__", "") == "speech":
            pattern.callback = views.speech
    wrap_async(SpeechSession, "on_input_done", "handler")

    submit = Scheduler.submit

    def patched_submit(self: Scheduler, request_id: str, request: dict, sink: object) -> None:
        stamp("submit")
        first = {"done": False}

        def timed_sink(chunk: dict) -> None:
            if not first["done"] and chunk.TYPE == "audio":
                first["done"] = True
                stamp("chunk")
            sink(chunk)  # type: ignore[operator]

        submit(self, request_id, request, timed_sink)

    Scheduler.submit = patched_submit  # type: ignore[method-assign]

    feed = StreamEncoder.feed

    def patched_feed(self: StreamEncoder, pcm: bytes) -> bytes:
        stamp("feed")
        out = feed(self, pcm)
        if out:
            stamp("encoded")
        return out

    StreamEncoder.feed = patched_feed  # type: ignore[method-assign]

    def on_http_reply(self: object, message: dict) -> None:
        if message.get("type") == "http.response.body" and message.get("body"):
            stamp("send")
            state["armed"] = True

    def on_ws_reply(self: object, message: dict) -> None:
        if message.get("bytes"):
            stamp("send")
            state["armed"] = True

    wrap(http_protocol.WebRequest, "handle_reply", on_http_reply)
    wrap(ws_protocol.WebSocketProtocol, "handle_reply", on_ws_reply)

    def on_write(self: object, data: bytes) -> None:
        if state["armed"]:
            state["armed"] = False
            stamp("write")

    wrap(tcp.Connection, "writeSomeData", on_write)
    execute_from_command_line(["manage.py", *argv])


# -- the client side ----------------------------------------------------------------------------------
class Stamps:
    """The server's stamps since the last read (one request runs at a time)."""

    def __init__(self, path: str) -> None:
        self._file = open(path)  # noqa: SIM115 (lives as long as the bench)

    def take(self) -> dict[str, float]:
        time.sleep(0.05)  # the server's stamps of this request are written by now
        out: dict[str, float] = {}
        for line in self._file.read().splitlines():
            name, value = line.split()
            if name == "write" and "send" not in out:
                continue  # a write before the first audio (headers, audio.start)
            out.setdefault(name, float(value))  # the first of each stage
        return out


def ws_case(ws: object, text: str) -> float:
    """Client start; returns the first binary frame's time."""
    ws.send(json.dumps({"type": "input.text", "text": text}))  # type: ignore[attr-defined]
    ws.send(json.dumps({"type": "input.done"}))  # type: ignore[attr-defined]
    first = None
    while True:
        msg = ws.recv(timeout=60)  # type: ignore[attr-defined]
        if isinstance(msg, bytes):
            first = first or perf()
        elif json.loads(msg)["type"] == "session.done":
            assert first is not None
            return first


def raw_case(conn: http.client.HTTPConnection, text: str, fmt: str) -> float:
    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": text, "response_format": fmt})
    conn.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    first = None
    while True:
        part = response.read1(65536)
        if not part:
            break
        first = first or perf()
    assert first is not None and response.status == 200
    return first


def sdk_case(client: object, text: str, fmt: str) -> float:
    first = None
    with client.audio.speech.with_streaming_response.create(  # type: ignore[attr-defined]
        model="tts-1", voice="alloy", input=text, response_format=fmt
    ) as response:
        for _ in response.iter_bytes():
            first = first or perf()
    assert first is not None
    return first


def _previous(run: dict[str, float], earlier: list[str]) -> float:
    """The time of the latest earlier stage this request passed (0: the client's start)."""
    return max((run[s] for s in earlier if s in run), default=0.0)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--sentences", type=int, default=1, help="1 (a short sentence) or a longer flush of N")
    args = parser.parse_args()

    import openai
    from speech_latency import SHORT_SENTENCE, free_port, long_flush_text, serving

    text = SHORT_SENTENCE if args.sentences <= 1 else long_flush_text(args.sentences)
    from websockets.sync.client import connect

    port = free_port()
    with tempfile.NamedTemporaryFile(suffix=".stamps") as tmp:
        cmd = [sys.executable, __file__, "--serve", tmp.name, "runserver", f"127.0.0.1:{port}", "--noreload"]
        with serving(cmd, port, {"OMNIWEB_ENGINE_MAX_AHEAD_SECONDS": "0"}) as base:
            stamps = Stamps(tmp.name)
            client = openai.OpenAI(api_key="unused", base_url=base + "/v1", max_retries=0, timeout=60)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            with connect(base.replace("http", "ws", 1) + "/v1/audio/speech/stream", max_size=None) as ws:
                ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
                cases = {
                    "ws": lambda: ws_case(ws, text),
                    "raw pcm": lambda: raw_case(conn, text, "pcm"),
                    "raw mp3": lambda: raw_case(conn, text, "mp3"),
                    "sdk pcm": lambda: sdk_case(client, text, "pcm"),
                    "sdk mp3": lambda: sdk_case(client, text, "mp3"),
                }
                rows: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
                for rep in range(args.reps + 2):  # two warm-up rounds
                    print(f"round {rep + 1}/{args.reps + 2}", file=sys.stderr, flush=True)
                    for name, case in cases.items():
                        stamps.take()  # drop anything left over
                        start = perf()
                        end = case()
                        got = stamps.take()
                        got["client"] = end
                        if rep >= 2:
                            rows[name].append({k: (v - start) * 1000 for k, v in got.items()})
            conn.close()
    size = "a short sentence" if args.sentences <= 1 else f"{args.sentences} sentences"
    print(f"### First audio byte, stage by stage ({size}, {args.reps} repetitions, interleaved)\n")
    print("Medians in ms of each stage's time from the previous one (of the same request), then of the total.\n")
    print("| path | " + " | ".join(STAGES) + " | total | total / ws |")
    print("|---|" + "---:|" * (len(STAGES) + 2))
    ws_total = statistics.median(r["client"] for r in rows["ws"])
    for name, runs in rows.items():
        cells = []
        for i, stage in enumerate(STAGES):
            steps = [r[stage] - _previous(r, STAGES[:i]) for r in runs if stage in r]
            cells.append(f"{statistics.median(steps):.2f}" if len(steps) == len(runs) else "")
        total = statistics.median(r["client"] for r in runs)
        print(f"| {name} | " + " | ".join(cells) + f" | {total:.1f} | {total / ws_total:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
