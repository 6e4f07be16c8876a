"""Video frames: strict base64, header checks, decoding, thumbnails, the similarity filter, sampling.

Pure functions over bytes and numpy arrays (no sockets, no event loop); the consumer runs the
costly ones (``prepare_frame``, ``verify_decodes``) on the decode pool (omniweb/media/decoding.py), the
engine ``decode_picture`` for the frames it samples.

Each frame is decoded once on the transport side, at a reduced scale: for the filter's thumbnail
on the acknowledgement path (which also proves it decodes), or, with the filter off, at 1/8 scale
ahead of any turn, only to find a frame that does not decode and report it. The engine decodes the
few frames a turn samples (at most 8 are analysed) at its analysis width. The transport does not
keep decoded pictures for the engine, in either mode: at 640x480 a picture is ~20 times its JPEG
(921 KB against ~40 KB), and a session buffers up to ``max_frames`` frames for the few a turn uses.

The similarity (EVS) filter compares a small colour thumbnail of each frame with the thumbnail of
the last frame it retained: ``similarity = 1 - MSE / 255**2`` over the thumbnail's 8-bit BGR
values, and a frame is dropped when ``similarity >= threshold``. In pixel terms the threshold is a
root-mean-square difference per channel value: ``rms = 255 * sqrt(1 - threshold)``; a frame is kept
when its thumbnail differs from the last kept one by more than that (e.g. 1 % of the picture
changing by ``10 * rms`` levels). The seed's 0.95 is an RMS of 57 levels: on camera-like frames it
drops a person leaving the room or the camera panning, and keeps little more than a cut to another
scene or the lights going down. Our default, 0.9996, is an RMS of 5.1 levels: the geometric middle
between the largest difference a still camera makes on its own (sensor noise in a dark room,
exposure flicker: at most 3.1 levels after the thumbnail's averaging) and the smallest real movement
measured (a person raising a hand: 8.1 levels). Because frames are compared with the last retained
one, slow drift is kept once it adds up. ``bench/video_latency.py --filter`` measures every case;
docs/benchmarks.md has the table.
"""

from __future__ import annotations

import binascii
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np

THUMB_WIDTH, THUMB_HEIGHT = 64, 48  # the filter's thumbnail: 3072 pixels, enough to see a hand move
# The similarity filter's default; see above for what it means in pixels and why it is not the
# seed's 0.95 (which keeps only cuts to another scene).
DEFAULT_FRAME_FILTER_THRESHOLD = 0.9996
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SOI = b"\xff\xd8\xff"
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic); not DHT/JPG/DAC.
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RST0-7 carry no length
_JPEG_SOS, _JPEG_EOI = 0xDA, 0xD9


class FrameError(Exception):
    """A frame the server will not take; ``message`` is safe to send to the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class ImageHeader:
    format: Literal["jpeg", "png"]
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True)
class PreparedFrame:
    """A frame's bytes after the checks on the acknowledgement path, with its filter thumbnail."""

    data: bytes
    header: ImageHeader
    thumbnail: np.ndarray | None

    @property
    def decoded(self) -> bool | None:
        """True when making the thumbnail proved the frame decodes; None when not known yet."""
        return True if self.thumbnail is not None else None


def decode_base64_strict(text: str) -> bytes:
    """RFC 4648 base64 with padding and no stray characters (whitespace included)."""
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise FrameError("Invalid image data") from None


def read_header(data: bytes) -> ImageHeader:
    """Format and dimensions from the JPEG/PNG header alone, without decoding any pixels.

    Hand-written because OpenCV has no header-only read (``imdecode`` allocates the whole image
    first, which is what a decompression bomb exploits); Pillow's lazy ``Image.open`` could do it,
    but would be a dependency for these few lines of two well-specified headers.
    """
    if data.startswith(PNG_SIGNATURE):
        # The IHDR chunk must come first: length 13, type, width, height (big-endian).
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise FrameError("Invalid image data")
        width, height = struct.unpack(">II", data[16:24])
        return _checked(ImageHeader("png", width, height))
    if data.startswith(JPEG_SOI):
        return _checked(_jpeg_header(data))
    raise FrameError("Invalid image data: frames must be JPEG or PNG")


def _jpeg_header(data: bytes) -> ImageHeader:
    pos = 2
    end = len(data)
    while pos < end:
        if data[pos] != 0xFF:
            raise FrameError("Invalid image data")
        while pos < end and data[pos] == 0xFF:  # fill bytes before a marker
            pos += 1
        if pos >= end:
            break
        marker = data[pos]
        pos += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker in (_JPEG_SOS, _JPEG_EOI) or pos + 2 > end:
            break  # scan data before any frame header
        (length,) = struct.unpack(">H", data[pos : pos + 2])
        if length < 2:
            break
        if marker in _JPEG_SOF:
            if pos + 7 > end:
                break
            height, width = struct.unpack(">HH", data[pos + 3 : pos + 7])
            return ImageHeader("jpeg", width, height)
        pos += length
    raise FrameError("Invalid image data")


# A baseline JPEG has one scan per component, a progressive one about ten (libjpeg's default
# progression: 10 for colour). Each scan re-walks the whole image, so a small file whose scans repeat
# costs seconds of CPU per decode within any pixel budget: more scans than this are refused.
MAX_JPEG_SCANS = 32


def count_jpeg_scans(data: bytes, limit: int = MAX_JPEG_SCANS) -> int:
    """Start-of-scan markers in a JPEG, counting stops once past ``limit`` (cost: one pass of find).

    Inside scan data a 0xFF byte is followed by 0x00 (stuffing) or a restart marker, so every other
    marker found is a real segment, whose length (SOS's header included) is skipped.
    """
    scans = 0
    pos = data.find(b"\xff", 2)
    while 0 <= pos < len(data) - 1:
        marker = data[pos + 1]
        if marker == _JPEG_EOI:
            break
        if marker in (0x00, 0xFF) or marker in _JPEG_STANDALONE or pos + 4 > len(data):
            pos = data.find(b"\xff", pos + 1)
            continue
        if marker == _JPEG_SOS:
            scans += 1
            if scans > limit:
                break
        pos = data.find(b"\xff", pos + 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0])
    return scans


def check_decode_cost(data: bytes, header: ImageHeader, max_scans: int = MAX_JPEG_SCANS) -> None:
    """Refuse a frame whose decode would cost far more than its pixels say (repeated scans)."""
    if header.format == "jpeg" and (scans := count_jpeg_scans(data, max_scans)) > max_scans:
        raise FrameError(f"Frame refused: over {max_scans} JPEG scans (got at least {scans}); decode cost too high")


def _checked(header: ImageHeader) -> ImageHeader:
    if header.width <= 0 or header.height <= 0:
        raise FrameError("Invalid image data")
    return header


def check_pixels(header: ImageHeader, max_pixels: int) -> None:
    """The decompression-bomb guard: refuse before decoding what would not fit the budget."""
    if header.pixels > max_pixels:
        raise FrameError(
            f"Frame too large: {header.width}x{header.height} pixels exceeds the limit of {max_pixels} pixels"
        )


def _reduced_flag(header: ImageHeader, width: int = 2 * THUMB_WIDTH, height: int = 2 * THUMB_HEIGHT) -> int:
    """The largest JPEG DCT scaling (1/8, 1/4, 1/2) that still leaves at least ``width`` x ``height``.

    libjpeg then runs a scaled inverse DCT: the same entropy decoding (so the same failures on a
    broken frame) for a fraction of the rest of the work.
    """
    if header.format == "jpeg":
        for factor, flag in (
            (8, cv2.IMREAD_REDUCED_COLOR_8),
            (4, cv2.IMREAD_REDUCED_COLOR_4),
            (2, cv2.IMREAD_REDUCED_COLOR_2),
        ):
            if header.width >= factor * width and header.height >= factor * height:
                return flag
    return cv2.IMREAD_COLOR


def _imdecode(data: bytes, flag: int) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flag | cv2.IMREAD_IGNORE_ORIENTATION)
    if image is None or image.ndim != 3 or image.shape[2] != 3:
        raise FrameError("Frame decode failed")
    return image


def thumbnail(data: bytes, header: ImageHeader) -> np.ndarray:
    """THUMB_WIDTH x THUMB_HEIGHT colour thumbnail (area-averaged, which also averages out noise)."""
    image = _imdecode(data, _reduced_flag(header))
    return cv2.resize(image, (THUMB_WIDTH, THUMB_HEIGHT), interpolation=cv2.INTER_AREA)


def prepare_frame(text: str, *, max_pixels: int, with_thumbnail: bool) -> PreparedFrame:
    """Everything a ``video.frame`` needs before its acknowledgement (run in a thread).

    With the thumbnail the frame has been decoded (at a reduced scale), which is also the proof
    that it decodes: ``PreparedFrame.decoded``, and it is not decoded again on the transport side.
    """
    data = decode_base64_strict(text)
    header = read_header(data)
    check_pixels(header, max_pixels)
    check_decode_cost(data, header)
    thumb = None
    if with_thumbnail:
        try:
            thumb = thumbnail(data, header)
        except FrameError:
            raise FrameError("Invalid image data") from None
    return PreparedFrame(data=data, header=header, thumbnail=thumb)


def verify_decodes(data: bytes) -> bool:
    """False for a frame no decoder can read, found at the cheapest scale (1/8 for a JPEG), since
    only the answer is kept: the engine decodes the frames it samples itself (``decode_picture``)."""
    try:
        _imdecode(data, _reduced_flag(read_header(data), 1, 1))
    except FrameError:
        return False
    return True


# The engine analyses frames at up to this width (video/engine/scene.py): the perception models
# and the measures all look at the picture scaled to it.
PICTURE_WIDTH = 640


def decode_picture(data: bytes) -> np.ndarray:
    """A frame as the engine analyses it: BGR, at most ``PICTURE_WIDTH`` wide.

    A JPEG at least twice that wide is decoded at a reduced DCT scale first (a 1280x720 frame
    costs about half a full decode); raises ``FrameError`` for a frame that does not decode.
    """
    header = read_header(data)
    image = _imdecode(data, _reduced_flag(header, PICTURE_WIDTH, 1))
    h, w = image.shape[:2]
    if w <= PICTURE_WIDTH:
        return image
    return cv2.resize(image, (PICTURE_WIDTH, max(1, round(h * PICTURE_WIDTH / w))), interpolation=cv2.INTER_AREA)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """``1 - MSE/255²`` of two equal-shape uint8 images (1.0: identical)."""
    diff = a.astype(np.float32) - b.astype(np.float32)
    return 1.0 - float(np.mean(diff * diff)) / (255.0 * 255.0)


def threshold_rms_levels(threshold: float) -> float:
    """The RMS difference (in 8-bit levels) at which a frame starts to count as changed."""
    return 255.0 * math.sqrt(max(0.0, 1.0 - threshold))


class SimilarityFilter:
    """Drops frames whose thumbnail is at least ``threshold`` similar to the last retained one."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.last: np.ndarray | None = None
        self.retained = 0
        self.dropped = 0

    def should_retain(self, thumb: np.ndarray) -> bool:
        if self.last is not None and similarity(thumb, self.last) >= self.threshold:
            self.dropped += 1
            return False
        self.last = thumb
        self.retained += 1
        return True


def sample_indices(count: int, num_frames: int) -> list[int]:
    """Which of ``count`` buffered frames the thinker sees: an even stride, always ending on the newest."""
    if count <= num_frames:
        return list(range(count))
    stride = max(1, count // num_frames)
    return [i * stride for i in range(num_frames - 1)] + [count - 1]


def select_frames(times_ms: Sequence[float], num_frames: int, strategy: str, window_seconds: float) -> list[int]:
    """Which buffered frames (oldest first, their times in ms) the thinker sees, per ``sampling_strategy``.

    ``uniform``: the even stride plus the newest (``sample_indices``); ``latest_frames``: the newest
    ``num_frames``; ``latest_seconds``: the frames of the last ``window_seconds`` before the newest,
    sampled as ``uniform`` when there are more than ``num_frames``.
    """
    count = len(times_ms)
    if strategy == "latest_frames":
        return list(range(max(0, count - num_frames), count))
    if strategy == "latest_seconds" and count:
        start = times_ms[-1] - window_seconds * 1000.0
        recent = [i for i, t in enumerate(times_ms) if t >= start]
        return [recent[i] for i in sample_indices(len(recent), num_frames)]
    return sample_indices(count, num_frames)
