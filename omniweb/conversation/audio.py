"""The session's input audio buffer: PCM16 mono between turns, bounded per session and process-wide."""

from __future__ import annotations

from omniweb import budget as process_budget

OVERFLOW_MESSAGE = "Audio buffer overflow"


class AudioBuffer:
    """Microphone audio waiting for a turn; every byte held is reserved from the process budget."""

    def __init__(self, max_bytes: int, sample_rate: int = 16000) -> None:
        self.max_bytes = max_bytes
        self.sample_rate = sample_rate
        self._pcm = bytearray()

    def __len__(self) -> int:
        return len(self._pcm)

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
        return None

    def take(self) -> bytes:
        """The buffered audio, now out of the buffer (and of the process budget)."""
        pcm = bytes(self._pcm)
        self.clear()
        return pcm

    def clear(self) -> None:
        process_budget.release(len(self._pcm))
        self._pcm.clear()
