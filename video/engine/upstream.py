"""The upstream thinker: an OpenAI-compatible chat-completions server with image input.

Any server that speaks ``POST {base}/chat/completions`` with ``stream: true`` and ``image_url`` parts
works (vLLM, vllm-omni, llama.cpp's server, Ollama). The sampled frames go as data-URL image parts
of the user message, after the system prompt and the conversation so far, followed by what the
perception models measured on them (as text, so a VLM behind it is grounded in the same observations
as the default thinker); the answer's deltas come back as server-sent events.

The HTTP exchange uses the standard library (``http.client``): one streaming POST needs no more,
and the project carries no HTTP client library. It runs on a reader thread per turn that parses
the event stream into a queue; each engine step takes what has arrived without waiting, and while
nothing has arrived the thinker loop waits (``WaitFor``) with the run's ``subscribe``: the reader
thread wakes it when the next delta, the end or an error comes, so a slow upstream holds no engine
worker at all and the turn can be dropped between any two steps. The stream is closed when the
turn ends, when the run object is dropped (the scheduler drops an aborted request's state without
calling ``finalize``), and, as a backstop, when what arrived has not been taken for
``ORPHAN_SECONDS``.

Errors reach the client as fixed, client-safe sentences (``ThinkerError``); what the upstream said
is logged, never forwarded.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import queue
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from . import answers, perception, scene
from .thinkers import ThinkerError, Turn

logger = logging.getLogger(__name__)

# Text arrived and no step took it (nor waited for more) this long: the request is gone (aborted), stop
# the upstream. Generous, so a turn that the scheduler merely serves late under load is never cut off.
ORPHAN_SECONDS = 5.0
MAX_LINE = 1 << 20  # longest event-stream line accepted
MAX_ERROR_BODY = 64 * 1024
DEFAULT_QUESTION = "What do you see?"
DEFAULT_SYSTEM_PROMPT = (
    "You are looking at frames from a live camera, oldest first; the last one is the present moment. "
    "Answer the user's question about what the frames show, briefly, in plain sentences that will be "
    "read aloud (no markdown, no lists). If the frames do not show something, say so."
)

_DELTA, _DONE, _ERROR = "delta", "done", "error"


def _status_message(status: int) -> str:
    if status in (401, 403):
        return f"The upstream model server refused our credentials (HTTP {status})."
    if status == 404:
        return "The upstream model or its chat endpoint was not found (HTTP 404)."
    if status == 429:
        return "The upstream model server is busy; try again shortly (HTTP 429)."
    if 400 <= status < 500:
        return f"The upstream model server rejected the request (HTTP {status})."
    return f"The upstream model server failed (HTTP {status})."


def image_url(data: bytes) -> str:
    mime = "image/png" if data.startswith(b"\x89PNG\r\n\x1a\n") else "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


OBSERVATIONS_LEAD = "What on-device vision models measured in these frames (they can be wrong): "


def build_messages(turn: Turn, observations: str | None = None) -> list[dict[str, Any]]:
    """System prompt, the earlier turns as text, then the frames as image parts, the observations and the question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": turn.system_prompt or DEFAULT_SYSTEM_PROMPT}]
    for item in turn.history:
        if item.get("role") in ("user", "assistant") and isinstance(item.get("content"), str):
            messages.append({"role": item["role"], "content": item["content"]})
    content: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": image_url(f.data)}} for f in turn.frames
    ]
    if observations:
        content.append({"type": "text", "text": OBSERVATIONS_LEAD + observations})
    content.append({"type": "text", "text": turn.question or DEFAULT_QUESTION})
    messages.append({"role": "user", "content": content})
    return messages


class UpstreamThinker:
    name = "upstream"

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str,
        timeout: float,
        max_tokens: int,
        models: perception.Perception | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ImproperlyConfigured(
                f"OMNIWEB_VIDEO_UPSTREAM_URL must be an http(s) base URL such as http://host:8000/v1, not {url!r}"
            )
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        path = parts.path.rstrip("/")
        self.path = path if path.endswith("/chat/completions") else f"{path}/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.models = models  # None: the frames go without observations

    @classmethod
    def from_settings(cls) -> UpstreamThinker:
        if not settings.VIDEO_UPSTREAM_URL:
            raise ImproperlyConfigured("OMNIWEB_VIDEO_THINKER=upstream needs OMNIWEB_VIDEO_UPSTREAM_URL")
        return cls(
            settings.VIDEO_UPSTREAM_URL,
            settings.VIDEO_UPSTREAM_MODEL,
            settings.VIDEO_UPSTREAM_API_KEY,
            settings.VIDEO_UPSTREAM_TIMEOUT,
            settings.VIDEO_UPSTREAM_MAX_TOKENS,
            perception.shared(),
        )

    def start(self, turn: Turn) -> UpstreamRun:
        body: dict[str, Any] = {
            "model": turn.model or self.model or "default",
            "messages": build_messages(turn, self.observe(turn)),
            "stream": True,
        }
        if self.max_tokens > 0:
            body["max_tokens"] = self.max_tokens
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "User-Agent": "omniweb"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if self.https:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        stream = _Stream(conn)
        threading.Thread(
            target=stream.pump,
            args=(self.path, json.dumps(body).encode(), headers, self.timeout),
            name="video-upstream",
            daemon=True,
        ).start()
        return UpstreamRun(stream)

    def observe(self, turn: Turn) -> str | None:
        """The default thinker's description of the frames (with the text read, for reading questions)."""
        if self.models is None or not turn.frames:
            return None
        measured = scene.analyse(
            [f.data for f in turn.frames],
            [f.pts_ms for f in turn.frames],
            perception=self.models,
            read=answers.needs_reading(turn.question, turn.history),
        )
        return " ".join(answers.answer("", [], measured))


class _Stream:
    """The connection and what the reader thread found in it; shared by the thread and the run."""

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn = conn
        self.items: queue.Queue[tuple[str, str]] = queue.Queue()
        self.closed = threading.Event()
        self.last_poll = time.monotonic()
        self._lock = threading.Lock()  # guards ``_wake``; never held while calling it
        self._wake: Callable[[], None] | None = None

    def put(self, kind: str, text: str) -> None:
        """Queue an item and wake the loop waiting for it (the reader thread calls this)."""
        self.items.put((kind, text))
        self._fire()

    def _fire(self) -> None:
        with self._lock:
            wake, self._wake = self._wake, None
            if wake is not None:
                self.last_poll = time.monotonic()  # the orphan clock restarts when the loop is woken
        if wake is not None:
            wake()

    def subscribe(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` once something is queued (at once if something already is)."""
        with self._lock:
            self.last_poll = time.monotonic()
            ready = not self.items.empty() or self.closed.is_set()
            self._wake = None if ready else wake
        if ready:
            wake()

    def waited_on(self) -> bool:
        with self._lock:
            return self._wake is not None

    def close(self) -> None:
        """Stop the upstream: shut the socket down so the reader's blocking read returns at once."""
        if self.closed.is_set():
            return
        self.closed.set()
        sock = self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()
        self._fire()  # a loop still waiting sees the stream's end

    def pump(self, path: str, body: bytes, headers: dict[str, str], timeout: float) -> None:
        """Reader thread: send the request, then turn the event stream into queue items."""
        try:
            self.conn.request("POST", path, body=body, headers=headers)
            response = self.conn.getresponse()
            if response.status != 200:
                detail = response.read(MAX_ERROR_BODY).decode("utf-8", "replace")
                logger.warning("upstream answered HTTP %d: %s", response.status, detail[:2000])
                self.put(_ERROR, _status_message(response.status))
                return
            if response.getheader("Content-Type", "").startswith("application/json"):
                self._whole(response)  # a server that ignored stream: true
            else:
                self._events(response)
        except TimeoutError:
            if not self.closed.is_set():
                self.put(_ERROR, f"The upstream model did not answer within {timeout:g} seconds.")
        except (OSError, http.client.HTTPException) as exc:
            if not self.closed.is_set():
                logger.warning("upstream connection failed: %r", exc)
                self.put(_ERROR, "Could not reach the upstream model server, or it dropped the connection.")
        except ThinkerError as exc:
            if not self.closed.is_set():
                logger.warning("upstream stream rejected: %s", exc)
                self.put(_ERROR, str(exc))
        finally:
            self.close()

    def _orphaned(self) -> bool:
        if not self.waited_on() and time.monotonic() - self.last_poll > ORPHAN_SECONDS:
            logger.info("upstream turn no longer stepped (request dropped): closing its stream")
            return True
        return self.closed.is_set()

    def _events(self, response: http.client.HTTPResponse) -> None:
        data: list[str] = []
        finished = False
        while not self._orphaned():
            raw = response.readline(MAX_LINE + 1)
            if not raw:
                if finished:  # some servers end after the last choice without [DONE]
                    self.put(_DONE, "")
                    return
                raise ThinkerError("The upstream model's stream ended before the answer was complete.")
            if len(raw) > MAX_LINE:
                raise ThinkerError("The upstream model sent a malformed stream.")
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
                continue
            if line or not data:  # comments, other fields (event:, id:, retry:) and blank keep-alives
                continue
            payload, data = "\n".join(data), []
            if payload.strip() == "[DONE]":
                self.put(_DONE, "")
                return
            finished = self._chunk(payload) or finished

    def _chunk(self, payload: str) -> bool:
        """Queue one chunk's delta; True when it carried a finish_reason."""
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError:
            raise ThinkerError("The upstream model sent a malformed stream.") from None
        if not isinstance(chunk, dict):
            raise ThinkerError("The upstream model sent a malformed stream.")
        if "error" in chunk:
            logger.warning("upstream stream error: %s", str(chunk["error"])[:2000])
            raise ThinkerError("The upstream model failed while answering.")
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return False  # e.g. a usage-only chunk
        delta = choices[0].get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str) and content:
            self.put(_DELTA, content)
        return choices[0].get("finish_reason") is not None

    def _whole(self, response: http.client.HTTPResponse) -> None:
        try:
            reply = json.loads(response.read(MAX_LINE))
            content = reply["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ThinkerError("The upstream model sent a malformed reply.") from None
        if isinstance(content, str) and content:
            self.put(_DELTA, content)
        self.put(_DONE, "")


class UpstreamRun:
    """A turn streaming from the upstream; each step returns the deltas that have arrived."""

    def __init__(self, stream: _Stream) -> None:
        self._stream = stream
        self._done = False
        self._error: str | None = None  # arrived behind deltas of the same step: raised by the next
        # Backstop to the scheduler's release: a run that is dropped closes its stream.
        weakref.finalize(self, stream.close)

    @property
    def done(self) -> bool:
        return self._done

    def pending(self) -> bool:
        """True while a step would find nothing new: the loop should wait (``subscribe``)."""
        stream = self._stream
        return not self._done and self._error is None and stream.items.empty() and not stream.closed.is_set()

    def subscribe(self, wake: Callable[[], None]) -> None:
        self._stream.subscribe(wake)

    def step(self) -> list[str]:
        stream = self._stream
        stream.last_poll = time.monotonic()
        if self._error is not None:
            self.close()
            raise ThinkerError(self._error)
        deltas: list[str] = []
        try:
            kind, text = stream.items.get_nowait()
            while True:
                if kind == _ERROR:
                    if deltas:  # what arrived before the error is part of the answer
                        self._error = text
                        return deltas
                    self.close()
                    raise ThinkerError(text)
                if kind == _DONE:
                    self._done = True
                    return deltas
                deltas.append(text)
                kind, text = stream.items.get_nowait()
        except queue.Empty:
            if not deltas and stream.closed.is_set() and stream.items.empty():
                # Closed with nothing left and no end (e.g. cut off as orphaned while served late).
                self.close()
                raise ThinkerError("The upstream model's stream ended before the answer was complete.") from None
        stream.last_poll = time.monotonic()
        return deltas

    def close(self) -> None:
        self._done = True
        self._stream.close()
