"""Audio containers written while the audio is still being synthesized (streamed HTTP bodies).

``speech.protocol.encode_audio`` writes one finished sentence as one file (the WebSocket's file
mode). A streamed body is one file for the whole request that grows as PCM arrives, so the encoder
is incremental: ``feed(pcm)`` returns the container bytes ready so far, ``finish()`` the rest.

- ``pcm``: the samples as they are (16-bit little-endian mono, 24 kHz).
- ``wav``: a 44-byte header with an open length (RIFF and data sizes 0xFFFFFFFF, as streaming
  servers write it: the length is not known when the header leaves), then the samples.
- ``mp3``, ``opus`` (Ogg), ``aac`` (ADTS) and ``flac`` through FFmpeg's encoders (PyAV), into a
  non-seekable sink, so nothing is patched at the end: a streamed FLAC's header says "length
  unknown", Ogg pages are flushed every 20 ms of audio.

Pure in-memory work (no sockets, no engine): the transport calls it in a thread.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import struct
import time
from dataclasses import dataclass
from typing import cast

import av
import numpy as np

logger = logging.getLogger(__name__)

SAMPLE_RATE = 24000
STREAM_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
OPEN_LENGTH = 0xFFFFFFFF


@dataclass(frozen=True)
class _Codec:
    container: str
    codec: str
    options: dict[str, str]  # the muxer's
    bit_rate: int | None
    # The encoder's input format, one the 24 kHz PCM is handed over in as it is (mono planar =
    # packed): no resampler, whose set-up would delay the first bytes by a few milliseconds.
    sample_format: str
    # 24 kHz input samples the encoder takes in before it writes its first audio bytes, whatever
    # the audio (measured; tests/test_openai_protocol.py pins each value as exact).
    first_bytes: int
    codec_options: dict[str, str] | None = None  # the encoder's


# What each encoder holds back before its first bytes, all at the voice's 24 kHz (no resampler):
# - mp3 (LAME, MPEG-2 layer III at 24 kHz: 576-sample frames): 2 frames, 1,152 samples. LAME's bit
#   reservoir is off: with it, a frame waits for the frames that may borrow its spare bits, 4 of
#   them (2,304 samples) behind the digital silence every hibari sentence starts with. Without it,
#   on hibari speech at 64 kbit/s: the same size, SNR 20.9 vs 20.7 dB after decoding.
# - aac: its 1,024-sample frame plus 1,024 samples of priming: 2,048.
# - flac: one block, set to 1,152 samples (FFmpeg picks 2,304 at 24 kHz; the smaller block also
#   came out 1% smaller on hibari speech).
# - opus: its 20 ms frame, 480 samples. libopus takes 24 kHz input itself (Ogg Opus always counts
#   in 48 kHz; the header records the input rate), so no resampler runs.
# FFmpeg's AAC encoder runs its "fast" coder, not its default "twoloop": on 16 Harvard sentences at
# 64 kbit/s a third of the CPU (0.005 vs 0.014-0.019 of real time), SNR 26.3 vs 23.2 dB, log-spectral
# distance 2.16 vs 2.20 dB, Whisper's word errors the same (9 vs 8 of 195 words; PCM itself: 9).
# LAME runs at quality 5 instead of its default 3: on hibari speech at 64 kbit/s, 12-25% less CPU
# per frame (the first bytes and every stream's total) with no measurable loss (SNR 21.2 vs 21.4 dB,
# log-spectral distance 11.83 vs 11.87 dB after decoding; 7 is twice as fast but 1.4 dB worse).
_CODECS = {
    "mp3": _Codec("mp3", "libmp3lame", {}, 64_000, "s16p", 1152, {"compression_level": "5", "reservoir": "0"}),
    "opus": _Codec("ogg", "libopus", {"page_duration": "20000"}, 32_000, "s16", 480),
    "aac": _Codec("adts", "aac", {}, 64_000, "fltp", 2048, {"aac_coder": "fast"}),
    "flac": _Codec("flac", "flac", {}, None, "s16", 1152, {"frame_size": "1152"}),
}


def first_bytes_samples(response_format: str) -> int:
    """Samples of audio ``response_format``'s encoder needs before its first bytes (0: none)."""
    spec = _CODECS.get(response_format)
    return 0 if spec is None else spec.first_bytes


CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


def open_wav_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """A canonical PCM16 mono WAV header whose RIFF and data lengths are 'unknown' (0xFFFFFFFF)."""
    byte_rate = sample_rate * 2
    return (
        b"RIFF"
        + struct.pack("<I", OPEN_LENGTH)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, byte_rate, 2, 16)
        + b"data"
        + struct.pack("<I", OPEN_LENGTH)
    )


class _Sink(io.RawIOBase):
    """A write-only, non-seekable file for FFmpeg's muxers: bytes are taken out as they come."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class StreamEncoder:
    """One streamed file of ``response_format`` from 16-bit mono 24 kHz PCM fed in pieces."""

    def __init__(self, response_format: str) -> None:
        if response_format not in STREAM_FORMATS:
            raise ValueError(f"unknown stream format {response_format!r}")
        self.response_format = response_format
        self.content_type = CONTENT_TYPES[response_format]
        self._odd = b""  # a PCM byte left over from a piece of odd length
        self._header = open_wav_header() if response_format == "wav" else b""
        self._container = None
        self.first_bytes_samples = first_bytes_samples(response_format)
        if response_format in _CODECS:
            spec = _CODECS[response_format]
            self._sink = _Sink()
            self._container = av.open(self._sink, "w", format=spec.container, options=spec.options)
            # an audio codec's stream: PyAV types add_stream by the codec's literal name, not a str
            self._stream = cast(
                av.AudioStream,
                self._container.add_stream(
                    spec.codec, rate=SAMPLE_RATE, layout="mono", options=spec.codec_options or {}
                ),
            )
            if spec.bit_rate is not None:
                self._stream.bit_rate = spec.bit_rate
            self._format = spec.sample_format
            self._stream.codec_context.format = self._format
            self._pts = 0
            # Open the encoder and write the container's header now, so the first ``feed`` pays for
            # encoding only, not for FFmpeg's set-up; the header is held back and leaves with the
            # first audio packet (bytes without audio would only look like an early start).
            self._container.start_encoding()
            self._muxed = False

    def header(self) -> bytes:
        """Bytes that can leave before any audio (the WAV header; nothing for the other formats)."""
        out, self._header = self._header, b""
        return out

    def feed(self, pcm: bytes) -> bytes:
        data = self._odd + pcm
        usable = len(data) - len(data) % 2
        self._odd = data[usable:]
        data = data[:usable]
        if self._container is None:
            return self.header() + data
        if data:
            self._encode(np.frombuffer(data, dtype="<i2"))
        return self._sink.take() if self._muxed else b""

    def finish(self) -> bytes:
        """The end of the file: the encoders' delayed frames and the container's trailer."""
        if self._container is None:
            return self.header()
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._sink.take()

    def close(self) -> None:
        """Drop an unfinished stream (the client went away): frees FFmpeg's state at once."""
        if self._container is not None:
            with contextlib.suppress(Exception):  # a half-written container may refuse its trailer
                self._container.close()
            self._container = None

    def _encode(self, samples: np.ndarray) -> None:
        data = samples.astype(np.float32) / 32768.0 if self._format == "fltp" else samples
        frame = av.AudioFrame.from_ndarray(data.reshape(1, -1), format=self._format, layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = self._pts
        self._pts += samples.size
        assert self._container is not None  # fed only while the container is open (feed checks)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
            self._muxed = True


@functools.cache
def encoding_cost(response_format: str) -> float:
    """CPU seconds this process spends encoding one second of audio as ``response_format``.

    Measured once per process, on two seconds of noise fed in vocoder-sized pieces (mp3 here:
    ~6 ms per second of audio; pcm and wav: nothing to encode). Load shedding prices a stream's
    delivery with it: an encoder runs on the same cores as the engine, and costs about what the
    synthesis does. A format that cannot be opened is priced at 0 (its requests fail anyway).
    """
    if response_format not in _CODECS:
        return 0.0
    seconds = 2
    pcm = (np.random.default_rng(0).standard_normal(seconds * SAMPLE_RATE) * 3000).astype("<i2").tobytes()
    piece = SAMPLE_RATE // 5 * 2  # 0.2 s of 16-bit samples
    try:
        encoder = StreamEncoder(response_format)
    except Exception:
        logger.warning("cannot open a %s encoder to measure its cost", response_format, exc_info=True)
        return 0.0
    try:
        started = time.thread_time()
        for i in range(0, len(pcm), piece):
            encoder.feed(pcm[i : i + piece])
        encoder.finish()
        return (time.thread_time() - started) / seconds
    finally:
        encoder.close()


def measure_encoding_costs() -> None:
    """Measure every stream format's cost now (at start-up), so no request waits for it."""
    for response_format in STREAM_FORMATS:
        encoding_cost(response_format)


# libsndfile containers the speech endpoint's one-shot files use (the rest are encoded by PyAV).
SOUNDFILE_FORMATS = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}


def available_formats() -> tuple[str, ...]:
    """wav and pcm always; flac/mp3/opus when libsndfile (soundfile) can write them."""
    formats = ["wav", "pcm"]
    try:
        import soundfile
    except ImportError:
        return tuple(formats)
    available = soundfile.available_formats()
    for name, (container, subtype) in SOUNDFILE_FORMATS.items():
        if container in available and subtype in soundfile.available_subtypes(container):
            formats.append(name)
    return tuple(formats)
