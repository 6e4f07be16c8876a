"""Questions in our own voice with a pause in the middle of the sentence, for the turn-detection tests
and bench/semantic_turn.py.

The voice reads the question with a comma where the speaker hesitates ("What is the colour of, the
cup on the table?"), so the words before the pause keep the intonation of a sentence that goes on;
the short gap it leaves there (the quiet stretch between the words nearest to where those words end
when spoken alone) is stretched to the pause.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hibari import Hibari
from scipy.signal import resample_poly

RATE = 16_000
GAP_DB = 35.0  # a gap between words: 10 ms RMS this far below the loudest
MIN_GAP_MS = 30


@dataclass(frozen=True)
class PausedQuestion:
    """float32 audio at ``RATE``; times in ms on it."""

    audio: np.ndarray
    pause_start_ms: float  # the speech before the pause ends here
    pause_end_ms: float  # and goes on here
    speech_end_ms: float  # the question's last sound


def spoken(voice: Hibari, text: str, rate: int = RATE) -> np.ndarray:
    """Our voice at ``rate`` (16 or 24 kHz), without its own leading and trailing silence."""
    wave = voice(text, seed=7).astype(np.float32)
    if rate != voice.sample_rate:
        wave = resample_poly(wave, rate, voice.sample_rate).astype(np.float32)
    loud = np.flatnonzero(np.abs(wave) > 0.02 * np.abs(wave).max())
    return wave[loud[0] : loud[-1] + 1]


def _gaps(wave: np.ndarray, rate: int) -> list[tuple[int, int]]:
    """The quiet stretches between words (samples)."""
    hop = rate // 100
    rms = np.sqrt(np.convolve(wave**2, np.ones(hop) / hop, "same"))[::hop]
    quiet = rms < rms.max() * 10 ** (-GAP_DB / 20)
    gaps, start = [], None
    for i, q in enumerate([*quiet, False]):
        if q and start is None:
            start = i
        elif not q and start is not None:
            if 10 * (i - start) >= MIN_GAP_MS:
                gaps.append((start * hop, i * hop))
            start = None
    return gaps


def paused_question(
    voice: Hibari, text: str, pause_s: float, *, lead_s: float = 0.5, tail_s: float = 1.0, rate: int = RATE
) -> PausedQuestion:
    """``text`` (with one comma, where the pause goes) with the gap at the comma stretched to
    ``pause_s``: the gap nearest to where the words before the comma end when spoken alone."""
    before, comma, _ = text.partition(",")
    if not comma:
        raise ValueError("the question needs a comma where the pause goes")
    wave = spoken(voice, text, rate)
    expected = len(spoken(voice, before + ",", rate))
    gaps = _gaps(wave, rate)
    if not gaps:
        raise ValueError("the voice left no gap between the words")
    a, b = min(gaps, key=lambda gap: abs((gap[0] + gap[1]) / 2 - expected))
    cut = (a + b) // 2
    pause = np.zeros(int(rate * pause_s), np.float32)
    lead, tail = np.zeros(int(rate * lead_s), np.float32), np.zeros(int(rate * tail_s), np.float32)
    audio = np.concatenate([lead, wave[:cut], pause, wave[cut:], tail])
    ms = 1000.0 / rate
    return PausedQuestion(
        audio=audio,
        pause_start_ms=(len(lead) + a) * ms,
        pause_end_ms=(len(lead) + b + len(pause)) * ms,
        speech_end_ms=(len(lead) + len(wave) + len(pause)) * ms,
    )


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
