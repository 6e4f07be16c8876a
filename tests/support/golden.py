"""Golden transcripts of the wire (issue 24): a restructuring changes no behaviour, so what every
endpoint sends for a fixed flow is recorded before the change (``tests/golden/<flow>.json``) and
compared after it.

``Wire`` records one flow: ``tap`` wraps a ``WebsocketCommunicator`` (from the ``connect`` fixture)
so that every message both ways is logged while the usual helpers (``support.messages``,
``support.video``) drive it; ``http`` sends one request through the real ASGI application and logs
the request and the response. ``Wire.check`` normalizes the log and compares it with the stored
transcript, or writes it when ``OMNIWEB_RECORD_GOLDEN=1`` is set.

What is normalized, and why (everything else, text, field names, error messages and message order,
is kept exactly: that is what a restructuring must not change):

- Ids made at random (the Realtime API's ``event_``/``item_``/``resp_``/``sess_``/``conv_`` ids,
  ``req_<hex>`` request ids, ``video-<hex>`` and ``turn-<hex>`` request ids, bare uuid hex): a
  placeholder per id, numbered by first appearance in the transcript (``<item:2>``), so which
  event names which item is still checked.
- Clock readings (``*_ts_ms``, ``created``, ``created_at``): the server's clock, never the same twice.
- Audio bytes are never stored. Base64 in JSON fields (audio, images) becomes ``<base64 N bytes>``;
  a run of binary frames, or of audio delta events, becomes one entry with the frame count and the
  total bytes (and a WAV's header fields; codec packets keep their headers, ``codec_packets``).
  These counts are stable: a sentence's length comes from the voice's duration model (the same
  unseeded too; the flows seed it where the API has a seed), and the pieces are vocoder-sized chunks (a first chunk,
  then ``OMNIWEB_VOCODER_CHUNK_FRAMES``). An HTTP body's chunking is not kept, only its total.
- Whisper's ``avg_logprob`` and ``no_speech_prob``: model floats whose last digits may move with
  how the engine batched the work; the text, tokens and timings of the same segments are kept.
- Media positions are kept (word timings, ``chunk_*_ms``, a transcription's ``duration`` and
  segments, ``audio_end_ms``): they come from the audio, not from the clock.
- The HTTP response headers' values, except ``content-type`` and ``x-omniweb-*`` (their names stay).

Where the engine could batch work differently from run to run, the flows make it the same (they
wait for the first sentence before the flush), rather than the normalization hiding it.

The in-process and Redis dispatch paths share one transcript per flow: the wire is the same
whichever path serves it (in record mode the second path is compared with what the first wrote).
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from channels.testing import ApplicationCommunicator, WebsocketCommunicator

from support.messages import RECEIVE_TIMEOUT

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
RECORD_ENV = "OMNIWEB_RECORD_GOLDEN"
_recorded: set[str] = set()  # flows written in this run: a second dispatch path compares against them

# Random ids, found anywhere in a string (error messages name items too); the first group is the
# placeholder's kind. Longest patterns first: a bare hex id is the fallback.
ID_PATTERNS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"\b(event|item|resp|sess|conv|asr|call)_[0-9A-Za-z]{22}\b"), None),
    (re.compile(r"\breq_[0-9a-f]{32}\b"), "req"),
    (re.compile(r"\bvideo-[0-9a-f]{12}\b"), "video"),
    (re.compile(r"\bturn-[0-9a-f]{12}\b"), "turn"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "hex"),
)
CLOCK_KEYS = re.compile(r"(.*_ts_ms|.*_ts|created|created_at)")
# Model scores (Whisper's segment probabilities): floats whose last digits may move with how the
# engine batched the work (the recognizer batches across requests), which is no part of the wire.
SCORE_KEYS = frozenset({"avg_logprob", "no_speech_prob", "logprob"})
BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
DATA_URL = re.compile(r"(data:[a-z]+/[a-z0-9.+-]+;base64,)(.*)", re.S)
# Fields that carry base64 audio (or images) even when short; longer base64 strings are found anywhere.
BASE64_KEYS = frozenset({"audio_b64", "audio", "data"})
BASE64_MIN = 64
# JSON events that carry one piece of an audio stream: a run of them is one transcript entry (the
# speech endpoint's timestamp-mode audio.chunk is not: each carries its own chunk id and positions).
AUDIO_EVENTS: dict[str, str] = {
    "response.audio.delta": "data",  # video: a WAV file per piece
    "response.output_audio.delta": "delta",  # realtime (and video with event_names "ga"): PCM16
}
# Response headers whose value is kept; the others' names are kept (a header gained or lost shows).
KEPT_HEADERS = re.compile(r"content-type|x-omniweb-.*")


@dataclass
class Normalizer:
    """One transcript's normalization: the id placeholders are numbered in order of appearance."""

    ids: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def placeholder(self, value: str, kind: str) -> str:
        if value not in self.ids:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.ids[value] = f"<{kind}:{self.counts[kind]}>"
        return self.ids[value]

    def text(self, value: str) -> str:
        for pattern, kind in ID_PATTERNS:
            value = pattern.sub(lambda m, kind=kind: self.placeholder(m.group(0), kind or m.group(1)), value)
        return value

    def b64(self, value: str) -> str:
        return f"<base64 {len(base64.b64decode(value))} bytes>"

    def string(self, key: str | None, value: str) -> str:
        url = DATA_URL.fullmatch(value)
        if url is not None and is_base64(url.group(2)):
            return url.group(1) + self.b64(url.group(2))
        if value and is_base64(value) and (key in BASE64_KEYS or len(value) >= BASE64_MIN):
            return self.b64(value)
        return self.text(value)

    def value(self, value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            return {self.text(k): self.value(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v, key) for v in value]
        if isinstance(value, str):
            return self.string(key, value)
        if key is not None and CLOCK_KEYS.fullmatch(key) and isinstance(value, int | float) and value:
            return "<clock>"  # (0 is no clock reading: a field that became 0 shows)
        if key in SCORE_KEYS and isinstance(value, float):
            return "<score>"
        return value


def is_base64(value: str) -> bool:
    if len(value) % 4 or not BASE64.fullmatch(value):
        return False
    try:
        base64.b64decode(value, validate=True)
    except binascii.Error:
        return False
    return True


def wav_header(data: bytes) -> dict[str, Any] | None:
    """The fields of a canonical 44-byte WAV header (the wire's format, not its audio)."""
    if len(data) < 44 or data[:4] != b"RIFF" or data[8:16] != b"WAVEfmt ":
        return None
    riff_size = struct.unpack_from("<I", data, 4)[0]
    fmt, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, 20)
    data_size = struct.unpack_from("<I", data, 40)[0]
    streamed = 0xFFFFFFFF  # an open length: the header left before the audio was made
    return {
        "riff_size": "open" if riff_size == streamed else riff_size - data_size,
        "format": fmt,
        "channels": channels,
        "sample_rate": rate,
        "bits": bits,
        "data_size": "open" if data_size == streamed else "sized",
    }


def run(kind: str, sizes: list[int]) -> dict[str, Any]:
    """A run of audio pieces: how many, and their total bytes."""
    return {"run": kind, "frames": len(sizes), "bytes": sum(sizes)}


Summary = Callable[[list[bytes]], dict[str, Any]]


@dataclass
class Wire:
    """One flow's wire, in order: what the client sent, what the server sent back.

    Entries are kept raw until ``check`` (the normalizer needs the whole transcript to merge runs
    of audio); ``binary`` summarizes a run of binary frames (default: frames and bytes)."""

    name: str
    binary: Summary | None = None
    entries: list[tuple[str, Any]] = field(default_factory=list)

    # -- WebSockets ------------------------------------------------------------------------------
    def tap(self, comm: WebsocketCommunicator, label: str | None = None) -> WebsocketCommunicator:
        """Log every message the test sends and receives on ``comm`` from now on (``label`` tells
        several sockets of one flow apart). The helpers call these two methods for everything."""
        send_input, receive_output = comm.send_input, comm.receive_output
        prefix = f"{label}:" if label else ""

        async def sending(message: dict[str, Any]) -> None:
            self.entries.append((prefix + "send", message))
            await send_input(message)

        async def receiving(timeout: float = 1) -> dict[str, Any]:
            message = await receive_output(timeout)
            self.entries.append((prefix + "recv", message))
            return message

        comm.send_input = sending  # type: ignore[method-assign]
        comm.receive_output = receiving  # type: ignore[method-assign]
        return comm

    def connecting(self, connect: Callable[..., Any], label: str | None = None) -> Callable[..., Any]:
        """The ``connect`` fixture, tapping every socket it opens (for helpers that connect)."""

        async def factory(*args: Any, **kwargs: Any) -> WebsocketCommunicator:
            return self.tap(await connect(*args, **kwargs), label)

        return factory

    # -- HTTP ------------------------------------------------------------------------------------
    async def http(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        form: dict[str, str | list[str]] | None = None,
        files: dict[str, tuple[str, bytes, str]] | None = None,
        raw: tuple[str, bytes] | None = None,
        timeout: float = RECEIVE_TIMEOUT,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request through the real ASGI application (the request-id wrapper, admission and
        Django); returns status, headers (lower-case names) and the whole body."""
        from omniweb.asgi import application

        described: dict[str, Any] = {"method": method, "path": path}
        headers: list[tuple[bytes, bytes]] = []
        body = b""
        if json_body is not None:
            body, content_type = json.dumps(json_body).encode(), "application/json"
            described["json"] = json_body
        elif form is not None or files is not None:
            body, content_type = multipart(form or {}, files or {})
            described["form"] = form or {}
            described["files"] = {
                k: {"filename": f, "bytes": len(d), "type": t} for k, (f, d, t) in (files or {}).items()
            }
        elif raw is not None:
            content_type, body = raw
            described["raw"] = {"content_type": content_type, "body": body.decode("utf-8", "replace")}
        else:
            content_type = ""
        if content_type:
            headers += [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        path_only, _, query = path.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path_only,
            "raw_path": path_only.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(b"host", b"testserver"), *headers],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        self.entries.append(("request", described))
        comm = ApplicationCommunicator(application, scope)
        await comm.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await comm.receive_output(timeout)
        assert start["type"] == "http.response.start", start
        data = b""
        while True:
            chunk = await comm.receive_output(timeout)
            assert chunk["type"] == "http.response.body", chunk
            data += chunk.get("body", b"")
            if not chunk.get("more_body", False):
                break
        await comm.send_input({"type": "http.disconnect"})
        await comm.wait(timeout)
        response_headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
        self.entries.append(("response", {"status": start["status"], "headers": response_headers, "body": data}))
        return start["status"], response_headers, data

    # -- the transcript --------------------------------------------------------------------------
    def transcript(self) -> list[dict[str, Any]]:
        """The normalized transcript: JSON messages as sent, runs of audio summarized."""
        norm = Normalizer()
        out: list[dict[str, Any]] = []
        run: list[Any] = []  # the pieces of the audio run in progress
        run_key: tuple[str, str] | None = None  # (direction, kind)

        def flush() -> None:
            nonlocal run, run_key
            if run_key is not None:
                out.append({run_key[0]: self._run(run_key[1], run, norm)})
            run, run_key = [], None

        for direction, message in self.entries:
            kind, piece, entry = self._entry(direction, message, norm)
            if piece is not None:
                if run_key != (direction, kind):
                    flush()
                    run_key = (direction, kind)
                run.append(piece)
                continue
            flush()
            if entry is not None:
                out.append(entry)
        flush()
        return out

    def _run(self, kind: str, pieces: list[Any], norm: Normalizer) -> dict[str, Any]:
        """One entry for a run of binary frames or audio delta events."""
        if kind == "<binary>":
            return self.binary(pieces) if self.binary else run(kind, [len(p) for p in pieces])
        audio_field = AUDIO_EVENTS[kind]
        decoded = [base64.b64decode(p[audio_field]) for p in pieces]
        summary = run(kind, [len(d) for d in decoded])
        # What the events say besides their audio (ids, format), once per distinct value.
        others = [{k: v for k, v in p.items() if k not in (audio_field, "event_id", "type")} for p in pieces]
        distinct = {dumps(norm.value(o)): o for o in others}
        summary["fields"] = [norm.value(o) for o in distinct.values()]
        headers = {dumps(h): h for d in decoded if (h := wav_header(d)) is not None}
        if headers:
            summary["wav"] = list(headers.values())
        return summary

    def _entry(self, direction: str, message: Any, norm: Normalizer) -> tuple[str, Any, dict[str, Any] | None]:
        """(run kind, audio piece, None) for a piece of an audio run, else ("", None, entry)."""
        if direction == "request":
            return "", None, {"request": norm.value(message)}
        if direction == "response":
            return "", None, {"response": self._response(message, norm)}
        kind = message["type"]
        if kind in ("websocket.send", "websocket.receive"):
            if message.get("bytes") is not None:
                return "<binary>", message["bytes"], None
            text = message.get("text")
            try:
                parsed = json.loads(text)
            except (TypeError, ValueError):
                return "", None, {direction: {"raw_text": norm.text(text or "")}}
            audio_field = AUDIO_EVENTS.get(parsed.get("type")) if isinstance(parsed, dict) else None
            if audio_field is not None and isinstance(parsed.get(audio_field), str) and parsed[audio_field]:
                return parsed["type"], parsed, None
            return "", None, {direction: norm.value(parsed)}
        if kind == "websocket.close":
            return "", None, {direction: {"close": message.get("code")}}
        return "", None, None  # connect/accept/disconnect: the fixture's, not the flow's

    def _response(self, message: dict[str, Any], norm: Normalizer) -> dict[str, Any]:
        headers = {
            name: value if KEPT_HEADERS.fullmatch(name) else "<value>" for name, value in message["headers"].items()
        }
        body: bytes = message["body"]
        content_type = message["headers"].get("content-type", "")
        out: dict[str, Any] = {"status": message["status"], "headers": headers}
        if content_type.startswith("application/json"):
            out["json"] = norm.value(json.loads(body))
        elif content_type.startswith("text/"):
            out["text"] = norm.text(body.decode())
        else:
            summary: dict[str, Any] = {"bytes": len(body)}  # not how it was chunked: the server's business
            if (header := wav_header(body)) is not None:
                summary["wav"] = header
            out["audio"] = summary
        return out

    def check(self) -> None:
        """Compare with ``tests/golden/<name>.json``, or write it (``OMNIWEB_RECORD_GOLDEN=1``)."""
        path = GOLDEN_DIR / f"{self.name}.json"
        actual = dumps(self.transcript())
        if os.environ.get(RECORD_ENV) == "1" and self.name not in _recorded:
            GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(actual)
            _recorded.add(self.name)
            return
        assert path.exists(), f"no golden transcript {path}; record it with {RECORD_ENV}=1"
        expected = path.read_text()
        if actual == expected:
            return
        what = (
            "differs from the other dispatch path's, recorded in this run"
            if self.name in _recorded
            else f"changed ({RECORD_ENV}=1 records it again, after a deliberate change)"
        )
        diff = difflib.unified_diff(
            expected.splitlines(True), actual.splitlines(True), f"golden/{self.name}.json", "this run", n=4
        )
        raise AssertionError(
            f"the wire of flow {self.name!r} {what}\n{first_difference(expected, actual)}\n{''.join(diff)}"
        )


def dumps(transcript: list[dict[str, Any]]) -> str:
    return json.dumps(transcript, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def first_difference(expected: str, actual: str) -> str:
    """Where the transcripts first differ: entry number and field path (for the failure message)."""
    want, got = json.loads(expected), json.loads(actual)

    def walk(a: Any, b: Any, path: str) -> str | None:
        if type(a) is not type(b):
            return f"{path}: {a!r} != {b!r}"
        if isinstance(a, dict):
            for key in sorted(set(a) | set(b)):
                if key not in a or key not in b:
                    return f"{path}.{key}: {'missing' if key not in b else 'added'}"
                if (found := walk(a[key], b[key], f"{path}.{key}")) is not None:
                    return found
            return None
        if isinstance(a, list):
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                if (found := walk(x, y, f"{path}[{i}]")) is not None:
                    return found
            return None if len(a) == len(b) else f"{path}: {len(a)} entries != {len(b)}"
        return None if a == b else f"{path}: {a!r} != {b!r}"

    return f"first difference: {walk(want, got, 'transcript')}"


def multipart(form: dict[str, str | list[str]], files: dict[str, tuple[str, bytes, str]]) -> tuple[bytes, str]:
    """A multipart/form-data body (fixed boundary: the body is the same each run)."""
    boundary = "omniweb-golden-boundary"
    parts: list[bytes] = []
    for name, values in form.items():
        for value in [values] if isinstance(values, str) else values:
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, (filename, data, content_type) in files.items():
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n"
        )
        parts.append(head.encode() + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def codec_packets(packets: list[bytes]) -> dict[str, Any]:
    """A run of codec-token packets (7-byte ``<IHB`` header, then the codes): their headers, never
    the codes. The packet sizes are fixed by the settings (a small first packet, then full ones)."""
    headers = [struct.unpack_from("<IHB", packet) for packet in packets]
    return {
        "run": "codec packets",
        "seq_from_0_in_order": [seq for seq, _, _ in headers] == list(range(len(headers))),
        "frames_per_packet": [n for _, n, _ in headers],
        "flags_before_last": sorted({flags for _, _, flags in headers[:-1]}),
        "flags_last": headers[-1][2],
    }
