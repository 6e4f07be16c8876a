"""The process-wide memory budget for what clients make the server hold (issue #11).

Every session has its own caps (frames, audio, queued messages), but many sessions together could
still hold more than the machine has. Sessions reserve the bytes they buffer from this one ledger
(``OMNIWEB_PROCESS_BUFFER_BUDGET``, given by the wiring through ``configure``); once it is spent,
new buffering is refused with a clear error, never an out-of-memory kill. A session releases what it
holds as it drops data and when it closes.

What is counted: video frames and microphone audio, and the video messages received but not yet
handled (video sessions), the speech session's buffered
text, the messages it holds while audio streams and the audio it collects for a file
(``stream_audio: false``), and on every endpoint the replies queued in daphne for a client that
reads slower than the server sends (``SessionShare``, refreshed at each send).
"""

from __future__ import annotations

import threading

DEFAULT_BYTES = 2 * 1024 * 1024 * 1024  # until the wiring configures it (the setting's own default)

_lock = threading.Lock()
_held = 0
_limit = DEFAULT_BYTES

FULL_MESSAGE = "Server memory budget for buffered data is spent; frame or audio refused, retry shortly"


TEXT_FULL_MESSAGE = "Server memory budget for buffered data is spent; input.text refused, retry shortly"
HELD_FULL_MESSAGE = "Server memory budget is spent: no more messages can be held during audio; session closed"
AUDIO_FULL_MESSAGE = "the server's memory budget for the audio of a file is spent; retry shortly"
INBOX_FULL_MESSAGE = "Server memory budget is spent: no more messages can be queued; session closed"
REPLIES_FULL_MESSAGE = (
    "Server memory budget is spent and this client is not reading fast enough to keep up; session closed"
)


# A session with no more than this queued for its client is never ended for the budget: a client
# that reads keeps about this much in flight; only those further behind are let go when it is spent.
REPLIES_SLACK = 64 * 1024


def configure(limit: int) -> None:
    """The budget's size in bytes; what is held already stays held (a smaller budget refuses new work)."""
    global _limit
    _limit = limit


def reserve(nbytes: int, *, force: bool = False) -> bool:
    """Take ``nbytes`` from the budget; False (nothing taken) when it would be exceeded, unless ``force``."""
    global _held
    with _lock:
        if not force and _held + nbytes > _limit:
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


class SessionShare:
    """One session's bytes in the budget, by what holds them, set as levels; all given back at close.

    A level set lower always succeeds; set higher, the difference is taken from the budget, and
    when it is spent nothing changes and the caller refuses the new work (or ends the session).
    """

    def __init__(self) -> None:
        self._levels: dict[str, int] = {}

    def hold(self, what: str, nbytes: int, *, force: bool = False) -> bool:
        """``what`` now holds ``nbytes``; False (nothing changed) when the budget cannot cover it."""
        old = self._levels.get(what, 0)
        if nbytes > old and not reserve(nbytes - old, force=force):
            return False
        if nbytes < old:
            release(old - nbytes)
        self._levels[what] = nbytes
        return True

    def held(self) -> int:
        return sum(self._levels.values())

    def close(self) -> None:
        release(self.held())
        self._levels.clear()
