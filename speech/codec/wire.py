"""Codec-token wire format (server → on-device decoder), as vllm-omni's codec stream defines it.

One binary WebSocket message per packet, little-endian::

    header  <IHB   seq uint32, n_frames uint16, flags uint8        (7 bytes)
    body    int16[n_frames * codebooks], frame-major (row by row)

``seq`` counts a stream's packets from 0. Flags: ``FLAG_EOS`` marks the stream's last packet (it may
carry no frames), ``FLAG_SEGMENT_END`` a sentence boundary inside a flush, ``FLAG_RESET`` tells the
client to drop its decoder state before this packet. Every codebook id is below 32768, so int16
holds it losslessly; ids are never negative.

Pure functions and small value types, no I/O and no engine imports: the server, the Python client
(``manage.py speak --codec``) and the tests share them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

HEADER_FMT = "<IHB"
HEADER_SIZE = struct.calcsize(HEADER_FMT)  # 7
FLAG_EOS = 0x1
FLAG_SEGMENT_END = 0x2
FLAG_RESET = 0x4
MAX_FRAMES_PER_PACKET = 0xFFFF  # n_frames is a uint16
MAX_CODE_ID = np.iinfo(np.int16).max  # 32767: the largest id int16 carries
MAX_SEQ = 0xFFFFFFFF
CODEC_STREAM_VERSION = 1


class CodecPacket(NamedTuple):
    """One unpacked packet; unpacks like the reference's ``(seq, n_frames, flags, codes)`` tuple."""

    seq: int
    n_frames: int
    flags: int
    codes: np.ndarray  # int16 [n_frames, codebooks]

    @property
    def eos(self) -> bool:
        return bool(self.flags & FLAG_EOS)

    @property
    def segment_end(self) -> bool:
        return bool(self.flags & FLAG_SEGMENT_END)

    @property
    def reset(self) -> bool:
        return bool(self.flags & FLAG_RESET)


def _as_rows(codes: Any, codebooks: int | None) -> np.ndarray:
    """``codes`` as a 2-D integer array ``[n_frames, codebooks]`` (``None`` or empty: no frames)."""
    if codes is None:
        return np.zeros((0, codebooks or 0), dtype=np.int64)
    if hasattr(codes, "detach"):  # a torch tensor from a GPU codec
        codes = codes.detach().cpu().numpy()
    arr = np.asarray(codes)
    if arr.ndim == 1:  # one frame, or nothing
        arr = arr.reshape(1, -1) if arr.size else arr.reshape(0, codebooks or 0)
    if arr.ndim != 2:
        raise ValueError(f"codes must be 2-D [n_frames, codebooks], got shape {arr.shape}")
    if arr.size and not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.bool_)):
        raise ValueError(f"codes must be integers, got dtype {arr.dtype}")
    return arr


def pack_codec_frame(
    seq: int,
    codes: Any,
    *,
    eos: bool = False,
    segment_end: bool = False,
    reset: bool = False,
    codebooks: int | None = None,
    codebook_size: int | None = None,
) -> bytes:
    """Pack ``codes`` (``[n_frames, codebooks]`` integers, or ``None``/empty) into one binary packet.

    ``codebooks`` gives the width of an empty packet and, when set, must match the rows' width;
    ``codebook_size`` (optional) bounds every id. ``seq`` wraps at 2**32 as the uint32 field does.
    """
    arr = _as_rows(codes, codebooks)
    if codebooks is not None and arr.shape[0] and arr.shape[1] != codebooks:
        raise ValueError(f"codes have {arr.shape[1]} codebooks per frame, expected {codebooks}")
    n_frames = int(arr.shape[0])
    if n_frames > MAX_FRAMES_PER_PACKET:
        raise ValueError(f"too many frames for one packet: {n_frames} > {MAX_FRAMES_PER_PACKET}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > MAX_CODE_ID:
            raise ValueError(f"codec ids must fit in int16 and be >= 0; got ids in [{lo}, {hi}]")
        if codebook_size is not None and hi >= codebook_size:
            raise ValueError(f"codec id {hi} is outside the codebook (size {codebook_size})")
    flags = (FLAG_EOS if eos else 0) | (FLAG_SEGMENT_END if segment_end else 0) | (FLAG_RESET if reset else 0)
    header = struct.pack(HEADER_FMT, int(seq) & MAX_SEQ, n_frames, flags)
    return header + arr.astype("<i2").tobytes(order="C")


def unpack_codec_frame(buf: bytes, codebooks: int, *, codebook_size: int | None = None) -> CodecPacket:
    """Inverse of :func:`pack_codec_frame`; raises ``ValueError`` on a malformed packet.

    The body must hold exactly ``n_frames * codebooks`` int16 values. With ``codebook_size`` every
    id must lie in ``[0, codebook_size)`` (a client that knows its codec checks before decoding).
    """
    if codebooks < 1:
        raise ValueError(f"codebooks must be >= 1, got {codebooks}")
    if len(buf) < HEADER_SIZE:
        raise ValueError(f"codec packet of {len(buf)} bytes is shorter than its {HEADER_SIZE}-byte header")
    seq, n_frames, flags = struct.unpack_from(HEADER_FMT, buf)
    body = memoryview(buf)[HEADER_SIZE:]
    expected = n_frames * codebooks * 2
    if len(body) != expected:
        raise ValueError(
            f"codec packet body has {len(body)} bytes, expected {expected} "
            f"for {n_frames} frames x {codebooks} codebooks"
        )
    codes = np.frombuffer(body, dtype="<i2").reshape(n_frames, codebooks).astype(np.int16)
    if codes.size:
        lo, hi = int(codes.min()), int(codes.max())
        if lo < 0:
            raise ValueError(f"codec id {lo} is negative")
        if codebook_size is not None and hi >= codebook_size:
            raise ValueError(f"codec id {hi} is outside the codebook (size {codebook_size})")
    return CodecPacket(seq, n_frames, flags, codes)


def accumulate_codec_rows(acc: np.ndarray | None, step: Any) -> np.ndarray:
    """Fold one step's code payload into the growing ``int64 [rows, codebooks]`` matrix.

    For codec models whose engine reports codes either as deltas (the newest rows only) or as
    cumulative snapshots (every row so far, possibly behind a placeholder row the deltas never
    had): a longer payload that contains the accumulated rows as one contiguous block replaces
    them, a payload equal to them is a duplicate, anything else is appended.
    Not for our own packet stream, whose packets are always new rows (see ``CodecStreamReader``).
    """
    if hasattr(step, "detach"):
        step = step.detach().cpu().numpy()
    arr = np.asarray(step)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.size == 0:
        if acc is not None:
            return acc
        width = arr.shape[-1] if arr.ndim >= 1 else 0
        return np.zeros((0, width), dtype=np.int64)
    arr = arr.astype(np.int64, copy=False)
    if acc is None or acc.size == 0:
        return arr
    n = acc.shape[0]
    if arr.shape[0] > n and arr.shape[1] == acc.shape[1]:
        windows = np.lib.stride_tricks.sliding_window_view(arr, acc.shape)[:, 0]  # [offsets, n, K]
        if (windows == acc).all(axis=(1, 2)).any():
            return arr
    if arr.shape == acc.shape and np.array_equal(arr, acc):
        return acc
    if arr.shape[1] != acc.shape[1]:
        raise ValueError(f"step has {arr.shape[1]} codebooks per frame, accumulated rows have {acc.shape[1]}")
    return np.concatenate([acc, arr], axis=0)


def align_codec_rows(codes_cum: Any, token_ids_cum: list[int], codebook_size: int) -> np.ndarray:
    """The code rows that belong to real codebook tokens, as ``int64 [n, codebooks]``.

    Rows are aligned to the token ids from the end (trailing ``-1`` ids are padding and ignored);
    a row is kept when its token is a codebook id (not a placeholder or EOS) and every id in the
    row is inside the codebook.
    """
    if codes_cum is None:
        return np.zeros((0, 0), dtype=np.int64)
    if hasattr(codes_cum, "detach"):
        codes_cum = codes_cum.detach().cpu().numpy()
    arr = np.asarray(codes_cum)
    if arr.ndim != 2 or arr.size == 0:
        return np.zeros((0, arr.shape[1] if arr.ndim == 2 else 0), dtype=np.int64)
    ids = list(token_ids_cum)
    while ids and ids[-1] == -1:
        ids.pop()
    n = min(arr.shape[0], len(ids))
    if n <= 0:
        return arr[:0].astype(np.int64)
    rows = arr[arr.shape[0] - n :]
    tokens = np.asarray(ids[len(ids) - n :])
    token_ok = (tokens >= 0) & (tokens < codebook_size)
    row_ok = (rows.min(axis=1) >= 0) & (rows.max(axis=1) < codebook_size)
    return rows[token_ok & row_ok].astype(np.int64)


def codec_start_message(
    *,
    utterance_index: int,
    sentence_index: int,
    sentence_text: str,
    spec: dict[str, Any],
    model: str | None,
) -> dict[str, Any]:
    """The JSON ``codec.start`` that precedes a stream: everything a client needs to decode it."""
    return {
        "type": "codec.start",
        "version": CODEC_STREAM_VERSION,
        "utterance_index": utterance_index,
        "sentence_index": sentence_index,
        "sentence_text": sentence_text,
        "model": model,
        "codebooks": int(spec["codebooks"]),
        "codebook_size": int(spec["codebook_size"]),
        "frame_rate_hz": float(spec["frame_rate_hz"]),
        "sample_rate": int(spec["sample_rate"]),
        "decoder_id": spec.get("decoder_id"),
        "header_format": HEADER_FMT,
    }


@dataclass
class CodecStreamReader:
    """Client side of one ``codec.start`` … ``codec.done`` stream: checks and collects its packets.

    Packets must arrive with ``seq`` 0, 1, 2, … and nothing may follow the EOS packet. ``rows``
    is the stream's whole code sequence so far, in order.
    """

    codebooks: int
    codebook_size: int | None = None
    next_seq: int = 0
    eos: bool = False
    segment_end: bool = False
    _rows: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def for_start(cls, start: dict[str, Any]) -> CodecStreamReader:
        """A reader for the stream a ``codec.start`` message announces."""
        if start.get("header_format") != HEADER_FMT:
            raise ValueError(f"unsupported header_format {start.get('header_format')!r}; expected {HEADER_FMT!r}")
        if start.get("version") != CODEC_STREAM_VERSION:
            raise ValueError(f"unsupported codec stream version {start.get('version')!r}")
        return cls(codebooks=int(start["codebooks"]), codebook_size=int(start["codebook_size"]))

    def feed(self, buf: bytes) -> CodecPacket:
        """Check one packet against the stream so far and keep its rows."""
        if self.eos:
            raise ValueError("codec packet after the stream's EOS packet")
        packet = unpack_codec_frame(buf, self.codebooks, codebook_size=self.codebook_size)
        if packet.seq != self.next_seq:
            raise ValueError(f"codec packet seq {packet.seq}, expected {self.next_seq}")
        self.next_seq = (self.next_seq + 1) & MAX_SEQ
        self.eos = packet.eos
        self.segment_end = self.segment_end or packet.segment_end
        if packet.n_frames:
            self._rows.append(packet.codes)
        return packet

    @property
    def rows(self) -> np.ndarray:
        """int16 [total_frames, codebooks]."""
        if not self._rows:
            return np.zeros((0, self.codebooks), dtype=np.int16)
        return np.concatenate(self._rows)

    @property
    def total_frames(self) -> int:
        return sum(r.shape[0] for r in self._rows)
