"""The process-wide memory budget for what clients make the server hold (issue #11).

Every session has its own caps (frames, audio, queued messages), but many sessions together could
still hold more than the machine has. Sessions reserve the bytes they buffer from this one ledger
(``OMNIWEB_PROCESS_BUFFER_BUDGET``); once it is spent, new buffering is refused with a clear error,
never an out-of-memory kill. A session releases what it holds as it drops data and when it closes.
"""

from __future__ import annotations

import threading

from django.conf import settings

_lock = threading.Lock()
_held = 0

FULL_MESSAGE = "Server memory budget for buffered data is spent; frame or audio refused, retry shortly"


def reserve(nbytes: int) -> bool:
    """Take ``nbytes`` from the budget; False (nothing taken) when it would be exceeded."""
    global _held
    with _lock:
        if _held + nbytes > settings.PROCESS_BUFFER_BUDGET:
            return False
        _held += nbytes
        return True


def release(nbytes: int) -> None:
    global _held
    with _lock:
        _held = max(0, _held - nbytes)


def held() -> int:
    """Bytes reserved now, by all sessions of this process."""
    return _held
