"""Frames (omniweb/media/frames.py): strict base64, headers, the decompression-bomb guard, thumbnails, the
similarity filter on camera-like frames, and frame sampling. Pure functions: no engine, no sockets."""

from __future__ import annotations

import base64
import struct
import zlib

import cv2
import numpy as np
import pytest
from support.camera_scenes import PAIRS, room, shoot, with_person

from omniweb.media import frames
from omniweb.media.frames import DEFAULT_FRAME_FILTER_THRESHOLD, FrameError


def jpeg(width: int = 640, height: int = 480, *, color: tuple[int, int, int] = (40, 120, 200), **params: int) -> bytes:
    img = np.zeros((height, width, 3), np.uint8)
    img[:] = color
    flags = [v for kv in params.items() for v in (getattr(cv2, kv[0]), kv[1])]
    ok, buf = cv2.imencode(".jpg", img, flags)
    assert ok
    return buf.tobytes()


def png(width: int = 64, height: int = 48) -> bytes:
    ok, buf = cv2.imencode(".png", np.full((height, width, 3), 90, np.uint8))
    assert ok
    return buf.tobytes()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares a size in its IHDR and carries a tiny (wrong) body: a decompression bomb's header."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    idat = zlib.compress(b"\0" * 1000)
    body = struct.pack(">I", len(idat)) + b"IDAT" + idat + struct.pack(">I", zlib.crc32(b"IDAT" + idat))
    return frames.PNG_SIGNATURE + chunk + body


# -- base64 ---------------------------------------------------------------------------------------
def test_strict_base64_accepts_padded_rfc4648() -> None:
    assert frames.decode_base64_strict(base64.b64encode(b"\xff\xd8\xff\x00ab").decode()) == b"\xff\xd8\xff\x00ab"


@pytest.mark.parametrize("text", ["QUJD RA==", "QUJDRA=", "QUJDRA", "QUJD\nRA==", "QUJD*A==", "QUJDRA===", "é"])
def test_strict_base64_refuses_whitespace_bad_padding_and_stray_characters(text: str) -> None:
    with pytest.raises(FrameError, match="Invalid image data"):
        frames.decode_base64_strict(text)


# -- headers and the pixel budget -------------------------------------------------------------------
@pytest.mark.parametrize(
    "params",
    [{}, {"IMWRITE_JPEG_PROGRESSIVE": 1}, {"IMWRITE_JPEG_OPTIMIZE": 1}, {"IMWRITE_JPEG_RST_INTERVAL": 4}],
    ids=["baseline", "progressive", "optimized", "restart-markers"],
)
def test_jpeg_header_gives_the_size_without_decoding(params: dict[str, int]) -> None:
    header = frames.read_header(jpeg(333, 211, **params))
    assert (header.format, header.width, header.height) == ("jpeg", 333, 211)


def test_png_header_gives_the_size() -> None:
    header = frames.read_header(png(64, 48))
    assert (header.format, header.width, header.height, header.pixels) == ("png", 64, 48, 3072)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"GIF89a\x01\x00\x01\x00",
        b"BM" + b"\0" * 40,
        b"RIFF\0\0\0\0WEBPVP8 ",
        b"\xff\xd8\xff",
        b"\x89PNG\r\n\x1a\n",
    ],
    ids=["empty", "gif", "bmp", "webp", "jpeg-soi-only", "png-signature-only"],
)
def test_anything_but_a_jpeg_or_png_header_is_invalid(data: bytes) -> None:
    with pytest.raises(FrameError, match="Invalid image data"):
        frames.read_header(data)


def test_a_zero_sized_image_is_invalid() -> None:
    with pytest.raises(FrameError, match="Invalid image data"):
        frames.read_header(png_header_only(0, 10))


def test_decompression_bomb_is_refused_before_any_pixel_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = base64.b64encode(png_header_only(100_000, 100_000)).decode()
    decoded: list[int] = []
    monkeypatch.setattr(cv2, "imdecode", lambda *args: decoded.append(1))  # a 30 GB allocation, were it called
    with pytest.raises(FrameError, match=r"Frame too large: 100000x100000 pixels exceeds the limit of 16777216"):
        frames.prepare_frame(bomb, max_pixels=4096 * 4096, with_thumbnail=True)
    assert decoded == []  # refused from the header alone


def test_a_jpeg_bomb_header_is_refused_too() -> None:
    data = bytearray(jpeg(64, 48))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 60000)  # height, width in the SOF0 segment
    with pytest.raises(FrameError, match="Frame too large: 60000x60000"):
        frames.prepare_frame(base64.b64encode(bytes(data)).decode(), max_pixels=4096 * 4096, with_thumbnail=False)


def test_the_budget_admits_exactly_its_size() -> None:
    frames.check_pixels(frames.ImageHeader("png", 4096, 4096), 4096 * 4096)
    with pytest.raises(FrameError):
        frames.check_pixels(frames.ImageHeader("png", 4097, 4096), 4096 * 4096)


# -- decoding -------------------------------------------------------------------------------------
def test_truncated_and_corrupt_frames_fail_the_decode_check() -> None:
    good = jpeg(320, 240, color=(10, 200, 30))
    assert frames.verify_decodes(good)
    assert frames.verify_decodes(png())
    assert not frames.verify_decodes(good[: len(good) // 2])
    assert not frames.verify_decodes(good[:-8])
    body = png(64, 48)
    assert not frames.verify_decodes(body[:-20])


def test_prepare_frame_returns_bytes_header_and_thumbnail() -> None:
    data = jpeg(640, 480)
    prepared = frames.prepare_frame(base64.b64encode(data).decode(), max_pixels=10**7, with_thumbnail=True)
    assert prepared.data == data
    assert (prepared.header.width, prepared.header.height) == (640, 480)
    assert prepared.thumbnail is not None
    assert prepared.thumbnail.shape == (frames.THUMB_HEIGHT, frames.THUMB_WIDTH, 3)
    without = frames.prepare_frame(base64.b64encode(data).decode(), max_pixels=10**7, with_thumbnail=False)
    assert without.thumbnail is None


def test_prepare_frame_with_an_undecodable_body_is_invalid_image_data() -> None:
    broken = jpeg(640, 480)[:300]  # a header, then nothing
    with pytest.raises(FrameError, match="Invalid image data"):
        frames.prepare_frame(base64.b64encode(broken).decode(), max_pixels=10**7, with_thumbnail=True)


@pytest.mark.parametrize("size", [(640, 480), (1280, 720), (200, 150), (64, 48)])
def test_reduced_jpeg_decode_gives_the_same_thumbnail_as_a_full_decode(size: tuple[int, int]) -> None:
    data = shoot(cv2.resize(with_person(room(), 320, 170), size), np.random.default_rng(0))
    fast = frames.thumbnail(data, frames.read_header(data))
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    full = cv2.resize(decoded, (64, 48), interpolation=cv2.INTER_AREA)
    assert frames.similarity(fast, full) > 0.9999


# -- similarity and the filter --------------------------------------------------------------------
def test_similarity_is_one_minus_mse_over_255_squared() -> None:
    black = np.zeros((48, 64, 3), np.uint8)
    white = np.full((48, 64, 3), 255, np.uint8)
    assert frames.similarity(black, black) == 1.0
    assert frames.similarity(black, white) == 0.0
    grey = np.full((48, 64, 3), 51, np.uint8)  # every value differs by 51: MSE 2601
    assert frames.similarity(black, grey) == pytest.approx(1 - 2601 / 65025)


def test_threshold_in_pixel_terms() -> None:
    assert frames.threshold_rms_levels(0.95) == pytest.approx(57.02, abs=0.01)
    assert frames.threshold_rms_levels(DEFAULT_FRAME_FILTER_THRESHOLD) == pytest.approx(5.1, abs=0.01)
    assert frames.threshold_rms_levels(1.0) == 0.0


def test_filter_counts_and_compares_with_the_last_retained_frame() -> None:
    """Slow drift is kept once it adds up: each step is small, the distance to the last kept frame grows."""
    filt = frames.SimilarityFilter(threshold=1 - (5 / 255) ** 2)  # RMS 5 levels
    base = np.full((48, 64, 3), 100, np.uint8)
    decisions = [filt.should_retain(base + np.uint8(2 * i)) for i in range(8)]  # +2 levels per frame
    assert decisions == [True, False, False, True, False, False, True, False]  # kept at 6 levels from the last
    assert (filt.retained, filt.dropped) == (3, 5)


def test_threshold_one_keeps_only_changes_and_zero_keeps_only_the_first() -> None:
    a = np.full((48, 64, 3), 100, np.uint8)
    keep_all = frames.SimilarityFilter(1.0)
    assert [keep_all.should_retain(x) for x in (a, a + 1, a)] == [True, True, True]
    assert not keep_all.should_retain(a.copy())  # identical: similarity 1.0 >= 1.0
    keep_first = frames.SimilarityFilter(0.0)
    assert [keep_first.should_retain(x) for x in (a, 255 - a, a)] == [True, False, False]


def _pair_similarity(name: str, seed: int = 3) -> float:
    a, b = PAIRS[name][1](np.random.default_rng(seed))
    return frames.similarity(frames.thumbnail(a, frames.read_header(a)), frames.thumbnail(b, frames.read_header(b)))


@pytest.mark.parametrize("name", [n for n, (drop, _) in PAIRS.items() if drop is not None])
def test_default_threshold_on_camera_like_frames(name: str) -> None:
    """Our default drops what a still camera makes on its own and keeps every real movement."""
    should_drop = PAIRS[name][0]
    assert (_pair_similarity(name) >= DEFAULT_FRAME_FILTER_THRESHOLD) is should_drop


def test_the_seed_default_drops_real_changes() -> None:
    """Why the default is not the seed's 0.95: there a person leaving the room counts as 'the same'."""
    for name in ("person raises a hand", "person steps aside (60 px)", "person leaves the room", "camera pans 20 px"):
        assert _pair_similarity(name) >= 0.95, name
    assert _pair_similarity("lights dimmed 40 %") < 0.95


# -- sampling -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("count", "num", "expected"),
    [
        (0, 4, []),
        (3, 4, [0, 1, 2]),
        (4, 4, [0, 1, 2, 3]),
        (10, 4, [0, 2, 4, 9]),
        (50, 4, [0, 12, 24, 49]),
        (10, 1, [9]),
        (5, 2, [0, 4]),
    ],
)
def test_sampling_is_a_stride_plus_the_newest(count: int, num: int, expected: list[int]) -> None:
    assert frames.sample_indices(count, num) == expected


@pytest.mark.parametrize("size", [(1920, 1080), (1280, 720), (640, 480), (320, 240)])
def test_the_engine_picture_is_at_most_the_analysis_width_and_matches_a_full_decode(size: tuple[int, int]) -> None:
    """A large JPEG decodes at a reduced DCT scale, with the same picture as a full decode, scaled."""
    data = shoot(cv2.resize(with_person(room(), 320, 170), size), np.random.default_rng(0))
    picture = frames.decode_picture(data)
    width = min(size[0], frames.PICTURE_WIDTH)
    assert picture.shape == (round(size[1] * width / size[0]), width, 3)
    full = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    full = cv2.resize(full, (width, picture.shape[0]), interpolation=cv2.INTER_AREA)
    assert frames.similarity(picture, full) > 0.999
    with pytest.raises(FrameError, match="Frame decode failed"):
        frames.decode_picture(data[:-40])
