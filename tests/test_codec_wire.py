"""The codec-token wire format: round trips and rejection of malformed packets (pure functions)."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from speech.codec.wire import (
    CODEC_STREAM_VERSION,
    FLAG_EOS,
    FLAG_RESET,
    FLAG_SEGMENT_END,
    HEADER_FMT,
    HEADER_SIZE,
    MAX_FRAMES_PER_PACKET,
    CodecStreamReader,
    accumulate_codec_rows,
    align_codec_rows,
    codec_start_message,
    pack_codec_frame,
    unpack_codec_frame,
)

codebooks = st.integers(1, 16)
seqs = st.integers(0, 2**32 - 1)


@st.composite
def code_rows(draw: st.DrawFn, max_frames: int = 40) -> np.ndarray:
    k = draw(codebooks)
    n = draw(st.integers(0, max_frames))
    return draw(hnp.arrays(np.int64, (n, k), elements=st.integers(0, 32767)))


def test_header_is_seven_little_endian_bytes():
    assert HEADER_FMT == "<IHB" and HEADER_SIZE == 7
    buf = pack_codec_frame(0x01020304, np.array([[1, 2], [3, 0x7FFF]]), eos=True, segment_end=True)
    assert buf[:7] == bytes([4, 3, 2, 1, 2, 0, FLAG_EOS | FLAG_SEGMENT_END])
    assert buf[7:] == struct.pack("<4h", 1, 2, 3, 0x7FFF)  # frame-major body


@given(code_rows(), seqs, st.booleans(), st.booleans(), st.booleans())
def test_round_trip(codes, seq, eos, segment_end, reset):
    k = codes.shape[1]
    buf = pack_codec_frame(seq, codes, eos=eos, segment_end=segment_end, reset=reset, codebooks=k)
    assert len(buf) == HEADER_SIZE + codes.size * 2
    packet = unpack_codec_frame(buf, k, codebook_size=32768)
    assert (packet.seq, packet.n_frames) == (seq, codes.shape[0])
    assert (packet.eos, packet.segment_end, packet.reset) == (eos, segment_end, reset)
    assert packet.codes.dtype == np.int16 and packet.codes.shape == codes.shape
    np.testing.assert_array_equal(packet.codes, codes)
    seq2, n2, flags2, codes2 = packet  # the reference's tuple shape
    assert (seq2, n2, flags2) == (seq, codes.shape[0], packet.flags)
    np.testing.assert_array_equal(codes2, codes)


@given(codebooks, seqs)
def test_empty_eos_packet(k, seq):
    for empty in (None, np.zeros((0, k), np.int64), []):
        buf = pack_codec_frame(seq, empty, eos=True, codebooks=k)
        assert len(buf) == HEADER_SIZE
        packet = unpack_codec_frame(buf, k)
        assert packet.n_frames == 0 and packet.eos and packet.codes.shape == (0, k)


def test_one_dimensional_codes_are_one_frame():
    packet = unpack_codec_frame(pack_codec_frame(3, [5, 6, 7]), 3)
    assert packet.n_frames == 1
    np.testing.assert_array_equal(packet.codes, [[5, 6, 7]])


def test_seq_wraps_like_the_uint32_field():
    assert unpack_codec_frame(pack_codec_frame(2**32 + 5, None, codebooks=2), 2).seq == 5


@pytest.mark.parametrize(
    ("codes", "kwargs", "reason"),
    [
        (np.zeros((2, 3, 4), np.int64), {}, "2-D"),
        (np.zeros((1, 1, 1, 1), np.int64), {}, "2-D"),
        (np.array([[1, -1]]), {}, "int16"),
        (np.array([[1, 32768]]), {}, "int16"),
        (np.array([[1, 70000]]), {}, "int16"),
        (np.array([[1.5, 2.0]]), {}, "integers"),
        (np.array([[1, 2048]]), {"codebook_size": 2048}, "outside the codebook"),
        (np.array([[1, 2, 3]]), {"codebooks": 2}, "expected 2"),
        (np.zeros((MAX_FRAMES_PER_PACKET + 1, 1), np.int64), {}, "too many frames"),
    ],
)
def test_pack_rejects(codes, kwargs, reason):
    with pytest.raises(ValueError, match=reason):
        pack_codec_frame(0, codes, **kwargs)


def test_the_largest_packet_is_allowed():
    buf = pack_codec_frame(0, np.ones((MAX_FRAMES_PER_PACKET, 1), np.int64))
    assert unpack_codec_frame(buf, 1).n_frames == MAX_FRAMES_PER_PACKET


@given(st.binary(max_size=HEADER_SIZE - 1), codebooks)
def test_unpack_rejects_short_buffers(buf, k):
    with pytest.raises(ValueError, match="shorter than its 7-byte header"):
        unpack_codec_frame(buf, k)


@given(code_rows(), st.integers(-7, 7).filter(bool))
def test_unpack_rejects_inconsistent_bodies(codes, delta):
    """A body longer or shorter than n_frames x codebooks int16 values (truncated, padded, odd)."""
    k = codes.shape[1]
    buf = pack_codec_frame(0, codes, codebooks=k)
    bad = buf[: len(buf) + delta] if delta < 0 else buf + bytes(delta)
    if len(bad) < HEADER_SIZE:
        return
    with pytest.raises(ValueError, match="body has"):
        unpack_codec_frame(bad, k)


@given(code_rows().filter(lambda c: c.shape[0] > 0), st.integers(1, 16))
def test_unpack_rejects_a_codebook_count_that_does_not_divide(codes, k2):
    k = codes.shape[1]
    buf = pack_codec_frame(0, codes, codebooks=k)
    if k2 == k:
        return
    with pytest.raises(ValueError, match="body has"):
        unpack_codec_frame(buf, k2)


@given(st.integers(1, 8), st.integers(-32768, -1))
def test_unpack_rejects_negative_ids(k, bad):
    body = struct.pack(f"<{k}h", *([0] * (k - 1) + [bad]))
    with pytest.raises(ValueError, match="negative"):
        unpack_codec_frame(struct.pack(HEADER_FMT, 0, 1, 0) + body, k)


def test_unpack_checks_the_codebook_size_when_given():
    buf = pack_codec_frame(0, [[3, 1024]])
    assert unpack_codec_frame(buf, 2).codes.max() == 1024
    with pytest.raises(ValueError, match="outside the codebook"):
        unpack_codec_frame(buf, 2, codebook_size=1024)
    with pytest.raises(ValueError, match="codebooks must be >= 1"):
        unpack_codec_frame(buf, 0)


# -- the stream reader -----------------------------------------------------------------------------


@given(st.lists(code_rows(max_frames=8), min_size=1, max_size=6), st.booleans())
def test_reader_collects_a_stream_in_order(parts, empty_eos):
    k = parts[0].shape[1]
    parts = [p[:, :k] if p.shape[1] >= k else np.zeros((p.shape[0], k), np.int64) for p in parts]
    packets = [
        pack_codec_frame(i, p, codebooks=k, eos=not empty_eos and i == len(parts) - 1) for i, p in enumerate(parts)
    ]
    if empty_eos:
        packets.append(pack_codec_frame(len(parts), None, eos=True, codebooks=k))
    reader = CodecStreamReader(codebooks=k, codebook_size=32768)
    for buf in packets:
        reader.feed(buf)
    assert reader.eos and reader.next_seq == len(packets)
    np.testing.assert_array_equal(reader.rows, np.concatenate(parts))
    assert reader.total_frames == sum(p.shape[0] for p in parts)


def test_reader_rejects_gaps_and_packets_after_eos():
    reader = CodecStreamReader(codebooks=2)
    reader.feed(pack_codec_frame(0, [[1, 2]]))
    with pytest.raises(ValueError, match="seq 2, expected 1"):
        reader.feed(pack_codec_frame(2, [[1, 2]]))
    reader.feed(pack_codec_frame(1, None, eos=True, codebooks=2))
    with pytest.raises(ValueError, match="after the stream's EOS"):
        reader.feed(pack_codec_frame(2, [[1, 2]]))


def test_codec_start_message_and_reader_for_it():
    spec = {"codebooks": 8, "codebook_size": 1024, "frame_rate_hz": 80, "sample_rate": 24000, "decoder_id": "x-v1"}
    msg = codec_start_message(utterance_index=2, sentence_index=1, sentence_text="Hi.", spec=spec, model=None)
    assert msg == {
        "type": "codec.start",
        "version": CODEC_STREAM_VERSION,
        "utterance_index": 2,
        "sentence_index": 1,
        "sentence_text": "Hi.",
        "model": None,
        "codebooks": 8,
        "codebook_size": 1024,
        "frame_rate_hz": 80.0,
        "sample_rate": 24000,
        "decoder_id": "x-v1",
        "header_format": "<IHB",
    }
    assert isinstance(msg["frame_rate_hz"], float)
    reader = CodecStreamReader.for_start(msg)
    assert (reader.codebooks, reader.codebook_size) == (8, 1024)
    with pytest.raises(ValueError, match="header_format"):
        CodecStreamReader.for_start({**msg, "header_format": ">IHB"})
    with pytest.raises(ValueError, match="version"):
        CodecStreamReader.for_start({**msg, "version": 2})


# -- accumulation and alignment (codec engines that report deltas or cumulative snapshots) -----------


@given(code_rows(max_frames=12).filter(lambda c: c.shape[0] > 0), st.data())
def test_accumulating_deltas_or_snapshots_gives_the_same_rows(codes, data):
    codes[:, 0] = np.arange(codes.shape[0])  # distinct rows: a delta equal to the rows so far is a duplicate
    cuts = sorted(data.draw(st.lists(st.integers(1, codes.shape[0]), max_size=4, unique=True)))
    bounds = [0, *[c for c in cuts if c < codes.shape[0]], codes.shape[0]]
    deltas = [codes[a:b] for a, b in itertools.pairwise(bounds)]
    acc = None
    for d in deltas:
        acc = accumulate_codec_rows(acc, d)
    np.testing.assert_array_equal(acc, codes)
    # A final consolidated payload (with a placeholder row in front) replaces, a repeat is a no-op.
    placeholder = np.concatenate([np.full((1, codes.shape[1]), 7), codes])
    np.testing.assert_array_equal(accumulate_codec_rows(acc, placeholder), placeholder)
    assert accumulate_codec_rows(acc, codes.copy()) is acc
    assert accumulate_codec_rows(acc, np.zeros((0, codes.shape[1]))) is acc


def test_accumulate_edge_cases():
    assert accumulate_codec_rows(None, []).shape == (0, 0)
    assert accumulate_codec_rows(None, np.zeros((0, 4))).shape == (0, 4)
    np.testing.assert_array_equal(accumulate_codec_rows(None, [1, 2]), [[1, 2]])
    with pytest.raises(ValueError, match="codebooks per frame"):
        accumulate_codec_rows(np.array([[1, 2]]), np.array([[1, 2, 3]]))


def test_align_keeps_rows_of_real_codebook_tokens():
    rows = np.array([[9, 9], [1, 2], [3, 4], [5, 4096], [6, 7], [8, 8]])
    # Tail-aligned to the ids (-1 padding ignored), so the placeholder row in front goes; so do the
    # rows of the EOS id (2048) and of a non-codebook token (4000), and a row with an id out of range.
    ids = [5, 2048, 17, 3, 4000, -1, -1]
    np.testing.assert_array_equal(align_codec_rows(rows, ids, 2048), [[1, 2], [6, 7]])
    assert align_codec_rows(None, [1], 2048).shape == (0, 0)
    assert align_codec_rows(np.zeros((0, 3)), [1], 2048).shape == (0, 3)
    assert align_codec_rows(rows, [-1, -1], 2048).shape == (0, 2)
    assert align_codec_rows(rows, [], 2048).dtype == np.int64


def test_flag_values_match_the_reference():
    assert (FLAG_EOS, FLAG_SEGMENT_END, FLAG_RESET) == (1, 2, 4)
