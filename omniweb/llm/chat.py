"""A chat completion streamed from a source: OpenAI's chunks in, text deltas and whole calls out.

A source (``HttpChat`` here, ``embedded.EmbeddedChat``) opens a ``ChatStream`` and a producer thread
feeds it the ``chat.completion.chunk`` objects as they come. ``ChunkReader`` turns them into pieces:
text deltas (``str``), ``ToolCall``s (only once complete, their arguments parsed and checked against
the function's JSON Schema: a client never sees half a call), and the model's token counts. The
engine's thinker loop takes what has arrived without waiting and, while nothing has, waits on
``subscribe`` holding no worker, so a turn can be dropped between any two tokens: ``close`` makes the
producer stop the generation (the HTTP socket is shut, the embedded sequence is told to stop).

Errors reach the client as fixed, client-safe sentences (``ChatError``); what a server said is
logged, never forwarded.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import queue
import socket
import ssl
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import jsonschema

from omniweb.base import metrics
from omniweb.engine.messages import ToolCall

logger = logging.getLogger(__name__)

# Text arrived and no step took it (nor waited for more) this long: the request is gone (aborted),
# stop the generation. Generous, so a turn the scheduler merely serves late is never cut off.
ORPHAN_SECONDS = 5.0
MAX_LINE = 1 << 20  # longest event-stream line accepted
MAX_ERROR_BODY = 64 * 1024

Piece = str | ToolCall  # a text delta, or a whole function call


class ChatError(Exception):
    """A failure whose message is safe to show the client (no internals, no exception text)."""


@dataclass(frozen=True)
class Forced:
    """A call the model must make, forced by constraining its output to JSON (``response_format``):
    the arguments of ``name``, or, with ``name`` None, ``{"name", "arguments"}`` choosing among the
    tools. Servers differ in how (and whether) they honour ``tool_choice``; a schema-constrained
    answer works the same on llama.cpp, vLLM and OpenAI."""

    name: str | None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class _Call:
    """A function call whose arguments are still arriving (OpenAI's ``tool_calls`` deltas)."""

    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ChunkReader:
    """One answer's chunks → pieces, in order; ``end`` returns what only the end completes."""

    def __init__(
        self,
        tools: Mapping[str, Mapping[str, Any]],
        forced: Forced | None = None,
        parallel: bool = True,
        new_id: Callable[[], str] = new_call_id,
    ) -> None:
        self.tools = tools  # name -> JSON Schema of its arguments
        self.forced = forced
        self.parallel = parallel
        self.new_id = new_id
        self.usage: tuple[int, int] | None = None  # (prompt_tokens, completion_tokens)
        self.finished = False  # a choice carried its finish_reason
        self.truncated = False  # the model stopped at its token limit
        self._content: list[str] = []  # forced: the constrained JSON so far
        self._calls: dict[int, _Call] = {}

    def feed(self, chunk: Any) -> list[Piece]:
        if not isinstance(chunk, dict):
            raise ChatError("The language model sent a malformed stream.")
        if "error" in chunk:
            logger.warning("language model stream error: %s", str(chunk["error"])[:2000])
            raise ChatError("The language model failed while answering.")
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self.usage = (usage["prompt_tokens"], int(usage.get("completion_tokens") or 0))
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return []  # e.g. the usage-only chunk
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finished = True
            self.truncated = choice["finish_reason"] == "length"
        delta = choice.get("delta")
        if delta is None:  # a whole message (a server that ignored ``stream``)
            delta = choice.get("message")
        if not isinstance(delta, dict):
            return []
        out: list[Piece] = []
        content = delta.get("content")
        if isinstance(content, str) and content:
            if self.forced is not None:
                self._content.append(content)
            else:
                out.append(content)
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                self._tool_call_delta(call)
        return out

    def _tool_call_delta(self, delta: dict[str, Any]) -> None:
        index = delta.get("index", len(self._calls))
        call = self._calls.setdefault(index if isinstance(index, int) else len(self._calls), _Call())
        function = delta.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str):
                call.name += function["name"]
            if isinstance(function.get("arguments"), str):
                call.arguments.append(function["arguments"])

    def end(self) -> list[Piece]:
        """The calls, complete and checked (raises ``ChatError`` for one that does not fit)."""
        if self.forced is not None:
            return [self._forced_call("".join(self._content))]
        calls: list[Piece] = [self._checked(c.name, "".join(c.arguments)) for _, c in sorted(self._calls.items())]
        return calls if self.parallel else calls[:1]

    def _forced_call(self, text: str) -> ToolCall:
        assert self.forced is not None
        if self.forced.name is not None:
            return self._checked(self.forced.name, text)
        try:
            chosen = json.loads(text)
        except ValueError:
            chosen = None
        if not isinstance(chosen, dict) or not isinstance(chosen.get("name"), str):
            raise ChatError(self._unfinished("its function call"))
        return self._checked(chosen["name"], json.dumps(chosen.get("arguments", {})))

    def _unfinished(self, what: str) -> str:
        if self.truncated:
            return f"The language model reached its token limit before {what} was complete."
        return f"The language model's output for {what} was not valid JSON."

    def _checked(self, name: str, arguments: str) -> ToolCall:
        schema = self.tools.get(name)
        if schema is None:
            raise ChatError(f"The language model called a function that was not offered ({name[:64]!r}).")
        try:
            value = json.loads(arguments or "{}")
        except ValueError:
            raise ChatError(self._unfinished(f"the arguments of {name}")) from None
        if not isinstance(value, dict):
            raise ChatError(f"The language model's arguments for {name} were not a JSON object.")
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError as exc:
            raise ChatError(
                f"The language model's arguments for {name} do not fit its schema: {exc.message[:200]}"
            ) from None
        except jsonschema.SchemaError:
            raise ChatError(f"The parameters schema of {name} is not a valid JSON Schema.") from None
        return ToolCall(call_id=self.new_id(), name=name, arguments=json.dumps(value, ensure_ascii=False))


_PIECE, _DONE, _ERROR = "piece", "done", "error"


class ChatStream:
    """What the producer found so far, shared by the producer thread and the engine's run."""

    def __init__(self, reader: ChunkReader, on_close: Callable[[], None] | None = None) -> None:
        self.reader = reader
        self.items: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.closed = threading.Event()
        self.opened_at = self.last_poll = time.monotonic()
        self.first_token_at: float | None = None  # monotonic time of the first piece
        metrics.LLM_ACTIVE.inc()
        self._on_close = on_close
        self._lock = threading.Lock()  # guards ``_wake``; never held while calling it
        self._wake: Callable[[], None] | None = None

    # -- the producer's side -------------------------------------------------------------------
    def feed(self, chunk: Any) -> bool:
        """One chunk from the model; False once the stream is closed (the producer stops)."""
        if self.closed.is_set():
            return False
        try:
            pieces = self.reader.feed(chunk)
        except ChatError as exc:
            self.fail(str(exc))
            return False
        for piece in pieces:
            self._put(_PIECE, piece)
        return not self.orphaned()

    def finish(self) -> None:
        """The model's answer is complete: its calls, then the end."""
        try:
            pieces = self.reader.end()
        except ChatError as exc:
            self.fail(str(exc))
            return
        for piece in pieces:
            self._put(_PIECE, piece)
        if self.reader.usage is not None:
            metrics.LLM_TOKENS.labels(kind="prompt").inc(self.reader.usage[0])
            metrics.LLM_TOKENS.labels(kind="completion").inc(self.reader.usage[1])
        self._put(_DONE, None)

    def fail(self, message: str) -> None:
        if not self.closed.is_set():
            self._put(_ERROR, message)

    def orphaned(self) -> bool:
        """Whether nobody takes what arrives any more (the request was dropped): stop the model."""
        if self.closed.is_set():
            return True
        with self._lock:
            waited_on = self._wake is not None
        if not waited_on and time.monotonic() - self.last_poll > ORPHAN_SECONDS:
            logger.info("language model turn no longer stepped (request dropped): stopping it")
            return True
        return False

    def _put(self, kind: str, value: Any) -> None:
        if kind == _PIECE and self.first_token_at is None:
            self.first_token_at = time.monotonic()
            metrics.LLM_FIRST_TOKEN.observe(self.first_token_at - self.opened_at)
        self.items.put((kind, value))
        self._fire()

    def _fire(self) -> None:
        with self._lock:
            wake, self._wake = self._wake, None
            if wake is not None:
                self.last_poll = time.monotonic()  # the orphan clock restarts when the loop is woken
        if wake is not None:
            wake()

    # -- the engine's side ---------------------------------------------------------------------
    def subscribe(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` once something is queued (at once if something already is)."""
        with self._lock:
            self.last_poll = time.monotonic()
            ready = not self.items.empty() or self.closed.is_set()
            self._wake = None if ready else wake
        if ready:
            wake()

    def close(self) -> None:
        """Stop the generation (the producer sees it at its next read or token) and wake a waiter."""
        with self._lock:  # the producer and the engine may both close it
            if self.closed.is_set():
                return
            self.closed.set()
        metrics.LLM_ACTIVE.dec()
        if self._on_close is not None:
            self._on_close()
        self._fire()


class ChatRun:
    """A turn streaming from a ``ChatStream``; each step returns the pieces that have arrived."""

    def __init__(self, stream: ChatStream) -> None:
        self._stream = stream
        self._done = False
        self._error: str | None = None  # arrived behind pieces of the same step: raised by the next
        weakref.finalize(self, stream.close)  # a run that is dropped stops its generation

    @property
    def done(self) -> bool:
        return self._done

    @property
    def usage(self) -> tuple[int, int] | None:
        """The model's (prompt, completion) token counts, once it reported them."""
        return self._stream.reader.usage

    @property
    def first_token_at(self) -> float | None:
        return self._stream.first_token_at

    def pending(self) -> bool:
        """True while a step would find nothing new: the loop should wait (``subscribe``)."""
        stream = self._stream
        return not self._done and self._error is None and stream.items.empty() and not stream.closed.is_set()

    def subscribe(self, wake: Callable[[], None]) -> None:
        self._stream.subscribe(wake)

    def step(self) -> list[Piece]:
        stream = self._stream
        stream.last_poll = time.monotonic()
        if self._error is not None:
            self.close()
            raise ChatError(self._error)
        pieces: list[Piece] = []
        try:
            while True:
                kind, value = stream.items.get_nowait()
                if kind == _ERROR:
                    if pieces:  # what arrived before the error is part of the answer
                        self._error = value
                        return pieces
                    self.close()
                    raise ChatError(value)
                if kind == _DONE:
                    self._done = True
                    return pieces
                pieces.append(value)
        except queue.Empty:
            if not pieces and stream.closed.is_set():
                # Closed with nothing left and no end (e.g. stopped as orphaned while served late).
                self.close()
                raise ChatError("The language model's stream ended before the answer was complete.") from None
        stream.last_poll = time.monotonic()
        return pieces

    def close(self) -> None:
        self._done = True
        self._stream.close()


class ChatSource(Protocol):
    """Where completions come from: ``open`` starts one streaming (its producer on a thread)."""

    name: str

    def open(self, body: dict[str, Any], reader: ChunkReader) -> ChatStream: ...


def _status_message(status: int) -> str:
    if status in (401, 403):
        return f"The language model server refused our credentials (HTTP {status})."
    if status == 404:
        return "The language model or its chat endpoint was not found (HTTP 404)."
    if status == 429:
        return "The language model server is busy; try again shortly (HTTP 429)."
    if 400 <= status < 500:
        return f"The language model server rejected the request (HTTP {status})."
    return f"The language model server failed (HTTP {status})."


class HttpChat:
    """Any OpenAI-compatible ``POST {base}/chat/completions`` with ``stream: true``.

    The standard library's ``http.client`` is enough for one streaming POST, and the project
    carries no HTTP client library. One reader thread per answer parses the event stream.
    """

    name = "http"

    def __init__(self, url: str, api_key: str = "", timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an http(s) base URL such as http://host:8000/v1 is needed, not {url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        path = parts.path.rstrip("/")
        self.path = path if path.endswith("/chat/completions") else f"{path}/chat/completions"
        self.api_key = api_key
        self.timeout = timeout

    def _connect(self) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def _headers(self, accept: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": accept, "User-Agent": "omniweb"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """A whole (non-streamed) completion, on the calling thread."""
        conn = self._connect()
        try:
            conn.request(
                "POST",
                self.path,
                body=json.dumps({**body, "stream": False}).encode(),
                headers=self._headers("application/json"),
            )
            response = conn.getresponse()
            reply = response.read(MAX_LINE)
        finally:
            conn.close()
        if response.status != 200:
            raise ChatError(_status_message(response.status))
        result = json.loads(reply)
        if not isinstance(result, dict):
            raise ChatError("The language model sent a malformed reply.")
        return result

    def open(self, body: dict[str, Any], reader: ChunkReader) -> ChatStream:
        headers = self._headers("text/event-stream")
        conn = self._connect()

        def shut() -> None:  # the reader's blocking read returns at once
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            conn.close()

        stream = ChatStream(reader, on_close=shut)
        payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
        threading.Thread(target=self._pump, args=(conn, stream, payload, headers), name="llm-http", daemon=True).start()
        return stream

    def _pump(
        self, conn: http.client.HTTPConnection, stream: ChatStream, payload: bytes, headers: dict[str, str]
    ) -> None:
        try:
            conn.request("POST", self.path, body=payload, headers=headers)
            response = conn.getresponse()
            if response.status != 200:
                detail = response.read(MAX_ERROR_BODY).decode("utf-8", "replace")
                logger.warning("language model server answered HTTP %d: %s", response.status, detail[:2000])
                stream.fail(_status_message(response.status))
                return
            if response.getheader("Content-Type", "").startswith("application/json"):
                self._whole(response, stream)  # a server that ignored stream: true
            else:
                self._events(response, stream)
        except ChatError as exc:
            logger.warning("language model stream rejected: %s", exc)
            stream.fail(str(exc))
        except TimeoutError:
            stream.fail(f"The language model did not answer within {self.timeout:g} seconds.")
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
            # A socket cut by close() surfaces as any of these inside http.client: expected then.
            if not stream.closed.is_set():
                logger.warning("language model connection failed: %r", exc)
                stream.fail("Could not reach the language model server, or it dropped the connection.")
        finally:
            stream.close()

    @staticmethod
    def _events(response: http.client.HTTPResponse, stream: ChatStream) -> None:
        data: list[str] = []
        while not stream.orphaned():
            raw = response.readline(MAX_LINE + 1)
            if not raw:
                if stream.reader.finished:  # some servers end after the last choice without [DONE]
                    stream.finish()
                    return
                raise ChatError("The language model's stream ended before the answer was complete.")
            if len(raw) > MAX_LINE:
                raise ChatError("The language model sent a malformed stream.")
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
                continue
            if line or not data:  # comments, other fields (event:, id:, retry:) and blank keep-alives
                continue
            payload, data = "\n".join(data), []
            if payload.strip() == "[DONE]":
                stream.finish()
                return
            try:
                chunk = json.loads(payload)
            except json.JSONDecodeError:
                raise ChatError("The language model sent a malformed stream.") from None
            if not stream.feed(chunk):
                return

    @staticmethod
    def _whole(response: http.client.HTTPResponse, stream: ChatStream) -> None:
        try:
            reply = json.loads(response.read(MAX_LINE))
        except ValueError:
            raise ChatError("The language model sent a malformed reply.") from None
        if stream.feed(reply):
            stream.finish()
