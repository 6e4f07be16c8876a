"""The session's input audio buffer: PCM16 mono between turns, bounded per session and process-wide."""

from __future__ import annotations

from math import gcd
from typing import Any

import numpy as np
import numpy.typing as npt

from omniweb.base import budget as process_budget

OVERFLOW_MESSAGE = "Audio buffer overflow"


class AudioBuffer:
    """Microphone audio waiting for a turn; every byte held is reserved from the process budget."""

    def __init__(self, max_bytes: int, sample_rate: int = 16000) -> None:
        self.max_bytes = max_bytes
        self.sample_rate = sample_rate
        self._pcm = bytearray()
        self.appended = 0  # bytes ever buffered: the stream position of the buffer's end

    def __len__(self) -> int:
        return len(self._pcm)

    @property
    def start(self) -> int:
        """The stream position (in bytes) of the first byte still buffered."""
        return self.appended - len(self._pcm)

    def position(self, ms: float) -> int:
        """The stream position of ``ms`` milliseconds of audio, on a sample boundary."""
        return 2 * round(ms * self.sample_rate / 1000.0)

    @property
    def duration_ms(self) -> float:
        return len(self._pcm) / 2 / self.sample_rate * 1000.0

    def append(self, pcm: bytes) -> str | None:
        """Append, or clear the buffer on overflow and say why (a client-safe message to report)."""
        if len(self._pcm) + len(pcm) > self.max_bytes:
            self.take()
            return OVERFLOW_MESSAGE
        if not process_budget.reserve(len(pcm)):
            self.take()
            return process_budget.FULL_MESSAGE
        self._pcm.extend(pcm)
        self.appended += len(pcm)
        return None

    def drop_before(self, position: int) -> None:
        """Forget the audio before stream ``position`` (e.g. the silence before speech began)."""
        self.take_before(position)

    def take_before(self, position: int) -> bytes:
        """The buffered audio before stream ``position``, now out of the buffer; the rest stays."""
        n = max(0, min(len(self._pcm), position - self.start))
        pcm = bytes(self._pcm[:n])
        del self._pcm[:n]
        process_budget.release(n)
        return pcm

    def peek(self, start: int, end: int) -> bytes:
        """The buffered audio between two stream positions, left in the buffer."""
        lo = max(0, min(len(self._pcm), start - self.start))
        hi = max(lo, min(len(self._pcm), end - self.start))
        return bytes(self._pcm[lo:hi])

    def keep_last(self, nbytes: int) -> None:
        self.drop_before(self.appended - nbytes)

    def take(self) -> bytes:
        """The buffered audio, now out of the buffer (and of the process budget)."""
        pcm = bytes(self._pcm)
        self.clear()
        return pcm

    def clear(self) -> None:
        process_budget.release(len(self._pcm))
        self._pcm.clear()


def resample_pcm16(pcm: bytes, from_rate: int, to_rate: int) -> bytes:
    """A whole PCM16 mono clip at another rate (e.g. a 24 kHz Realtime question for the 16 kHz turn)."""
    if from_rate == to_rate or not pcm:
        return pcm
    # Imported here: scipy.signal costs a process ~77 MB (it loads scipy.stats and more), which a
    # daphne process that never receives a Realtime question would hold for nothing.
    from scipy.signal import resample_poly

    g = gcd(from_rate, to_rate)
    samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], "<i2").astype(np.float32)
    out: npt.NDArray[np.floating[Any]] = resample_poly(samples, to_rate // g, from_rate // g)  # scipy: untyped
    return np.clip(np.round(out), -32768, 32767).astype("<i2").tobytes()
