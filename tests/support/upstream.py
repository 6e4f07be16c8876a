"""A small OpenAI-compatible chat-completions server on loopback, scripted per test: it speaks the
streaming format (server-sent events, ``data: {chunk}`` ... ``data: [DONE]``) and records what it
received (``Upstream.requests``), so tests check the request as well as the streamed answer."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Script = Callable[["Handler"], None]


@dataclass
class Upstream:
    """The fake server's state: what to answer and what it saw."""

    server: ThreadingHTTPServer
    script: Script | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)  # ends hanging handlers

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    upstream: Upstream

    def log_message(self, format: str, *args: Any) -> None:  # keep the test output clean
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.upstream.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        assert self.upstream.script is not None
        self.upstream.script(self)

    # -- answers the scripts use ---------------------------------------------------------------
    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

    def event(self, payload: str) -> None:
        self.wfile.write(f"data: {payload}\n\n".encode())
        self.wfile.flush()

    def delta(self, text: str, finish: str | None = None) -> None:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        self.event(json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [choice]}))

    def call_delta(
        self, index: int, *, call_id: str | None = None, name: str | None = None, arguments: str | None = None
    ) -> None:
        """A piece of a function call, as OpenAI streams one: its id and name first, then its
        arguments' JSON text in pieces (each piece names the call by ``index``)."""
        function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
        call: dict[str, Any] = {"index": index, "function": function}
        if call_id is not None:
            call |= {"id": call_id, "type": "function"}
        choice = {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}
        self.event(json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [choice]}))


def calls(made: list[tuple[str, list[str]]], text: str = "", finish: str = "tool_calls", done: bool = True) -> Script:
    """An answer that calls functions: ``text`` first (if any), then each ``(name, argument
    pieces)`` streamed as ``tool_calls`` deltas, then ``finish`` and ``[DONE]``."""

    def script(h: Handler) -> None:
        h.start_stream()
        if text:
            h.delta(text)
        for index, (name, pieces) in enumerate(made):
            h.call_delta(index, call_id=f"call_{index}", name=name, arguments="")
            for piece in pieces:
                h.call_delta(index, arguments=piece)
        h.delta("", finish=finish)
        if done:
            h.event("[DONE]")

    return script


def stream(deltas: list[str], pause: float = 0.0, done: bool = True) -> Script:
    def script(h: Handler) -> None:
        h.start_stream()
        h.event(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}))
        h.wfile.write(b": keep-alive comment\n\n")
        for d in deltas:
            h.delta(d)
            time.sleep(pause)
        h.delta("", finish="stop")
        if done:
            h.event("[DONE]")

    return script


def status(code: int, body: str) -> Script:
    def script(h: Handler) -> None:
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body.encode())

    return script


def endless(h: Handler) -> None:
    """Stream a word every 20 ms until the client goes away (then note that it did)."""
    h.start_stream()
    try:
        while not h.upstream.release.is_set():
            h.delta("word ")
            time.sleep(0.02)
    except OSError:
        h.upstream.disconnected.set()


@contextlib.contextmanager
def serve() -> Iterator[Upstream]:
    """A fake upstream on a free loopback port, with its own handler class (no state shared)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state = Upstream(server)
    server.RequestHandlerClass = type("BoundHandler", (Handler,), {"upstream": state})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
