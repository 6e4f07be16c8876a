"""How many bytes a WebSocket has queued for a client that is not reading.

daphne applies no backpressure: a send is appended to the Twisted transport's write buffer
whether or not the client reads, so a stalled client would make the server buffer without bound.
This middleware gives the consumer a probe, ``scope["omniweb.send_buffer"]()``, that returns the
transport's buffered bytes so a session can cap what it has queued. daphne hands the ASGI app
``partial(server.handle_reply, protocol)`` as ``send``; the probe reads the protocol's transport
(Twisted's ``FileDescriptor`` buffer). Under another server, or if daphne changes, the probe
returns ``None`` and sessions run uncapped, as they would anyway.

``scope["omniweb.send_progress"]()`` adds what the client has acknowledged so far (autobahn's
count of bytes written to the transport, less those still in Twisted's buffer or unacknowledged in
the kernel's send queue): a client that reads nothing makes that number stand still, which
``SendWatch`` notices within seconds, long before a byte cap fills at playback pace and before
daphne's own keepalive (a ping every 20 s, 30 s to answer) drops the socket without a word.
"""

from __future__ import annotations

import fcntl
import functools
import struct
import termios
from collections.abc import Callable
from typing import Any

SCOPE_KEY = "omniweb.send_buffer"
PROGRESS_KEY = "omniweb.send_progress"


def _buffered(transport: Any) -> int | None:
    try:
        return len(transport.dataBuffer) - transport.offset + transport._tempDataLen
    except (AttributeError, TypeError):
        return None


def _probe(send: Any) -> Callable[[], int | None]:
    protocol = send.args[0] if isinstance(send, functools.partial) and send.args else None
    transport = getattr(protocol, "transport", None)
    if transport is None or _buffered(transport) is None:
        return lambda: None
    return lambda: _buffered(transport)


def _kernel_unacked(transport: Any) -> int:
    """Bytes in the socket's kernel send queue the peer has not acknowledged (Linux ``SIOCOUTQ``).

    The kernel's send buffer grows to megabytes (``tcp_wmem``) before Twisted buffers anything, so
    without it a client that reads nothing would look like one that reads everything for a minute.
    """
    try:
        raw = fcntl.ioctl(transport.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (AttributeError, OSError, ValueError):
        return 0
    return int(struct.unpack("i", raw)[0])


def _progress(send: Any) -> Callable[[], tuple[int, int] | None]:
    """(bytes queued, bytes delivered to the kernel) of the socket, or None when unknown."""
    protocol = send.args[0] if isinstance(send, functools.partial) and send.args else None
    transport = getattr(protocol, "transport", None)

    def probe() -> tuple[int, int] | None:
        queued = _buffered(transport) if transport is not None else None
        written = getattr(getattr(protocol, "trafficStats", None), "outgoingOctetsWireLevel", None)
        if queued is None or not isinstance(written, int):
            return None
        queued += _kernel_unacked(transport)
        return queued, written - queued

    return probe


def send_buffer_probe(application: Any) -> Callable[..., Any]:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket":
            scope = {**scope, SCOPE_KEY: _probe(send), PROGRESS_KEY: _progress(send)}
        return await application(scope, receive, send)

    return app


def client_stalled(scope: dict[str, Any], limit: int) -> bool:
    """True when the socket's transport holds more than ``limit`` unsent bytes (never under other servers)."""
    probe = scope.get(SCOPE_KEY)
    queued = probe() if probe is not None else None
    return queued is not None and queued > limit


class SendWatch:
    """Decides when a session's client is not reading, checked after every send.

    Stalled: more than ``max_bytes`` queued, or more than ``slack`` bytes waiting while nothing at
    all reached the kernel for ``max_seconds`` (a client that reads slowly still makes progress).
    """

    def __init__(self, scope: dict[str, Any], *, max_bytes: int, max_seconds: float, slack: int = 64 * 1024) -> None:
        self._scope = scope
        self._max_bytes = max_bytes
        self._max_seconds = max_seconds
        self._slack = slack
        self._delivered = -1
        self._since = 0.0

    def stalled(self, now: float) -> str | None:
        """Why the client counts as not reading, or None."""
        probe = self._scope.get(PROGRESS_KEY)
        state = probe() if probe is not None else None
        if state is None:  # only the byte count is known (or nothing, under another server)
            return f"over {self._max_bytes} bytes queued" if client_stalled(self._scope, self._max_bytes) else None
        queued, delivered = state
        if queued > self._max_bytes:
            return f"over {self._max_bytes} bytes queued"
        if delivered != self._delivered or queued <= self._slack:
            self._delivered, self._since = delivered, now
            return None
        if now - self._since > self._max_seconds:
            return f"nothing delivered for {self._max_seconds:g} s with {queued} bytes waiting"
        return None
