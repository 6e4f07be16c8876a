"""The audio of a Realtime session, base64 in the events: ``audio/pcm`` (PCM16 LE mono at 24 kHz, the
session's own rate) and, for telephony, ``audio/pcmu`` / ``audio/pcma`` (G.711 μ-law / A-law at 8 kHz).

The session runs on PCM16 24 kHz whatever the client speaks: G.711 is converted at the edge, in and
out, by FFmpeg's codecs and resampler (PyAV, which the uploads already use). A stream keeps its
resampler between events, so 20 ms pieces join without a seam at each edge. Input audio is decoded
strictly (base64, whole samples, a size limit) and resampled to the 16 kHz the thinker's Whisper and
the VAD read.
"""

from __future__ import annotations

import base64
import binascii
from typing import cast

import av

from omniweb.conversation.audio import resample_pcm16
from omniweb.media.pcm import frames_pcm16, pcm16_frame

from .errors import RealtimeError

SAMPLE_RATE = 24000  # audio/pcm, both ways: PCM16 LE mono
ENGINE_RATE = 16000  # what the thinker's Whisper and the VAD read
MAX_APPEND_BYTES = 15 * 1024 * 1024  # decoded bytes per input_audio_buffer.append (OpenAI's 15 MiB)
MAX_INPUT_AUDIO_MS = 120_000  # the input audio buffer and one input_audio content part
MIN_COMMIT_MS = 100  # OpenAI's minimum committed audio

PCM = "audio/pcm"
G711_RATE = 8000  # audio/pcmu and audio/pcma: one byte a sample
G711_CODECS = {"audio/pcmu": "pcm_mulaw", "audio/pcma": "pcm_alaw"}  # FFmpeg's names
FORMATS = (PCM, *G711_CODECS)


def decode_base64(b64: str, *, max_bytes: int = MAX_APPEND_BYTES, param: str = "audio") -> bytes:
    """Strict base64, at most ``max_bytes`` decoded."""
    if len(b64) > (max_bytes + 2) // 3 * 4:
        raise RealtimeError(f"The audio is larger than {max_bytes} bytes", param=param, code="audio_too_large")
    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("Invalid base64 audio", param=param, code="invalid_base64") from None


def decode_pcm16(b64: str, *, max_bytes: int = MAX_APPEND_BYTES, param: str = "audio") -> bytes:
    """Strict base64 of PCM16 LE mono: whole samples, at most ``max_bytes`` decoded."""
    pcm = decode_base64(b64, max_bytes=max_bytes, param=param)
    if len(pcm) % 2:
        raise RealtimeError("Audio must be whole PCM16 samples (an even number of bytes)", param=param)
    return pcm


def pcm_ms(pcm: bytes | bytearray, rate: int = SAMPLE_RATE) -> int:
    return len(pcm) // 2 * 1000 // rate


def to_engine_rate(pcm24: bytes) -> bytes:
    """PCM16 24 kHz → 16 kHz (polyphase, anti-aliased) for the thinker's Whisper."""
    return resample_pcm16(pcm24, SAMPLE_RATE, ENGINE_RATE)


class InputDecoder:
    """A stream of input audio in the session's format → PCM16 24 kHz, one piece at a time."""

    def __init__(self, fmt: str = PCM) -> None:
        self.format = fmt
        codec = G711_CODECS.get(fmt)
        self._codec: av.AudioCodecContext | None = None
        self._resampler: av.AudioResampler | None = None
        if codec is not None:
            context = cast(av.AudioCodecContext, av.CodecContext.create(codec, "r"))
            context.sample_rate = G711_RATE
            context.layout = "mono"
            self._codec = context
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)

    def decode(self, b64: str, *, max_bytes: int = MAX_APPEND_BYTES, param: str = "audio") -> bytes:
        """One piece (base64): PCM16 24 kHz (a few samples may wait in the resampler for the next).
        ``max_bytes`` bounds the PCM it becomes: G.711 takes six times fewer bytes."""
        if self._codec is None:
            return decode_pcm16(b64, max_bytes=max_bytes, param=param)
        limit = max_bytes * G711_RATE // (2 * SAMPLE_RATE)
        return self.decode_bytes(decode_base64(b64, max_bytes=limit, param=param))

    def decode_bytes(self, data: bytes) -> bytes:
        if self._codec is None or self._resampler is None:
            return data
        if not data:
            return b""
        resampler = self._resampler
        return frames_pcm16([out for frame in self._codec.decode(av.Packet(data)) for out in resampler.resample(frame)])

    def flush(self) -> bytes:
        """What the resampler still holds (the end of a whole clip); the decoder is then spent."""
        return frames_pcm16(self._resampler.resample(None)) if self._resampler is not None else b""


class OutputEncoder:
    """PCM16 24 kHz → the session's output format, one piece at a time (one encoder per response)."""

    def __init__(self, fmt: str = PCM) -> None:
        self.format = fmt
        codec = G711_CODECS.get(fmt)
        self._codec: av.AudioCodecContext | None = None
        self._resampler: av.AudioResampler | None = None
        if codec is not None:
            context = cast(av.AudioCodecContext, av.CodecContext.create(codec, "w"))
            context.sample_rate = G711_RATE
            context.layout = "mono"
            context.format = "s16"
            context.open()
            self._codec = context
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=G711_RATE)

    @property
    def converts(self) -> bool:
        return self._codec is not None

    def encode(self, pcm24: bytes) -> bytes:
        if self._resampler is None or not pcm24:
            return pcm24
        return self._encode(self._resampler.resample(pcm16_frame(pcm24, SAMPLE_RATE)))

    def flush(self) -> bytes:
        """The last samples the resampler held (the end of the audio); the encoder is then spent."""
        if self._resampler is None:
            return b""
        return self._encode(self._resampler.resample(None))

    def _encode(self, frames: list[av.AudioFrame]) -> bytes:
        assert self._codec is not None
        return b"".join(bytes(packet) for frame in frames for packet in self._codec.encode(frame))


def decode_clip(fmt: str, b64: str, *, max_bytes: int, param: str) -> bytes:
    """A whole clip in ``fmt`` (an ``input_audio`` content part) → PCM16 24 kHz."""
    decoder = InputDecoder(fmt)
    pcm = decoder.decode(b64, max_bytes=max_bytes, param=param)
    return pcm + decoder.flush()


def encode_clip(fmt: str, pcm24: bytes) -> bytes:
    """A whole clip of PCM16 24 kHz in ``fmt`` (an item's audio, retrieved)."""
    encoder = OutputEncoder(fmt)
    return encoder.encode(pcm24) + encoder.flush()
