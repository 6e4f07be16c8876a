"""The audio of a Realtime session: ``audio/pcm`` both ways, PCM16 LE mono at 24 kHz, base64 in the events.

Input audio is decoded strictly (base64, whole samples, a size limit) and resampled to the 16 kHz the
thinker's Whisper and the VAD read.
"""

from __future__ import annotations

import base64
import binascii

from omniweb.conversation.audio import resample_pcm16

from .errors import RealtimeError

SAMPLE_RATE = 24000  # audio/pcm, both ways: PCM16 LE mono
ENGINE_RATE = 16000  # what the thinker's Whisper and the VAD read
MAX_APPEND_BYTES = 15 * 1024 * 1024  # decoded PCM per input_audio_buffer.append (OpenAI's 15 MiB)
MAX_INPUT_AUDIO_MS = 120_000  # the input audio buffer and one input_audio content part
MIN_COMMIT_MS = 100  # OpenAI's minimum committed audio


def decode_pcm16(b64: str, *, max_bytes: int = MAX_APPEND_BYTES, param: str = "audio") -> bytes:
    """Strict base64 of PCM16 LE mono: whole samples, at most ``max_bytes`` decoded."""
    if len(b64) > (max_bytes + 2) // 3 * 4:
        raise RealtimeError(f"The audio is larger than {max_bytes} bytes", param=param, code="audio_too_large")
    try:
        pcm = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("Invalid base64 audio", param=param, code="invalid_base64") from None
    if len(pcm) % 2:
        raise RealtimeError("Audio must be whole PCM16 samples (an even number of bytes)", param=param)
    return pcm


def pcm_ms(pcm: bytes | bytearray, rate: int = SAMPLE_RATE) -> int:
    return len(pcm) // 2 * 1000 // rate


def to_engine_rate(pcm24: bytes) -> bytes:
    """PCM16 24 kHz → 16 kHz (polyphase, anti-aliased) for the thinker's Whisper."""
    return resample_pcm16(pcm24, SAMPLE_RATE, ENGINE_RATE)
