"""PCM16 mono as PyAV frames and back: what every resampler and G.711 codec here is fed and gives."""

from __future__ import annotations

from collections.abc import Iterable

import av
import numpy as np


def pcm16_frame(pcm: bytes, rate: int) -> av.AudioFrame:
    """PCM16 LE mono at ``rate`` as a frame for PyAV's resamplers and encoders."""
    frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm, "<i2").reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = rate
    return frame


def frames_pcm16(frames: Iterable[av.AudioFrame]) -> bytes:
    """The samples of s16 mono frames (a resampler's or a decoder's output) as PCM16 LE."""
    return b"".join(f.to_ndarray().astype("<i2").tobytes() for f in frames)
