"""Uploaded recordings for transcription: any container FFmpeg reads (wav, flac, mp3, ogg/opus,
webm, m4a, ...) decoded with PyAV into the 16 kHz mono PCM16 Whisper takes.

Pure in-memory work (the view runs it in a thread). Decoding stops as soon as the recording is
longer than the duration limit, so a long (or lying) file costs at most that much decoding.
"""

from __future__ import annotations

import io
import itertools

import av
import numpy as np

from .protocol import APIError, invalid

SAMPLE_RATE = 16_000


def decode_upload(data: bytes, max_seconds: float) -> bytes:
    """PCM16 LE, 16 kHz mono; ``APIError`` (400) when it is not audio or is too long."""
    if not data:
        raise invalid("The uploaded file is empty", "file", "empty_file")
    max_samples = int(max_seconds * SAMPLE_RATE)
    parts: list[np.ndarray] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), "r") as container:
            if not container.streams.audio:
                raise invalid("The uploaded file has no audio stream", "file", "invalid_file_format")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            # Decoded frames, then what the resampler still holds (None flushes it).
            for frame in itertools.chain(container.decode(stream), [None]):
                for out in resampler.resample(frame):
                    samples = out.to_ndarray().reshape(-1)
                    total += samples.size
                    if total > max_samples:
                        raise _too_long(max_seconds)
                    parts.append(samples)
    except APIError:
        raise
    except (av.FFmpegError, ValueError, IndexError) as exc:
        raise invalid(
            f"The uploaded file could not be decoded as audio ({type(exc).__name__}); "
            "send wav, flac, mp3, ogg/opus, webm or m4a",
            "file",
            "invalid_file_format",
        ) from None
    if not parts:
        raise invalid("The uploaded file holds no audio samples", "file", "invalid_file_format")
    return np.concatenate(parts).astype("<i2").tobytes()


def _too_long(max_seconds: float) -> APIError:
    return invalid(
        f"The recording is longer than {max_seconds:g} seconds, the most this server transcribes",
        "file",
        "audio_too_long",
    )
