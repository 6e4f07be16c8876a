"""The session's frame buffer: the video endpoint's guards and limits, for any wire format.

``add`` runs the acknowledgement-path checks on the decode pool (strict base64, JPEG/PNG header,
pixel budget, JPEG scan count, the similarity thumbnail; ``omniweb.media.frames``), evicts the oldest frames
by count and by bytes, and reserves the bytes from the process budget. A decoder task then fully
decodes each buffered frame ahead of time, also on the pool; a frame that does not decode is
reported through ``on_decode_failed`` (the adapter removes it in order with ``remove_failed``). A
turn waits for its frames' decodes (``settle``), so the thinker only gets frames known to decode.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from omniweb.base import budget as process_budget
from omniweb.base.tasks import spawn
from omniweb.media import frames
from omniweb.media.decoding import run_decode
from omniweb.media.frames import FrameError

logger = logging.getLogger(__name__)

SamplingStrategy = Literal["uniform", "latest_frames", "latest_seconds"]


@dataclass(eq=False)  # identity: two frames with equal bytes are still two buffer entries
class BufferedFrame:
    data: bytes
    received_ms: float  # the server's clock (monotonic ms) when the frame arrived
    frame_id: str | None = None
    pts_ms: float | None = None  # the client's presentation time, when it gave one
    width: int = 0
    height: int = 0
    meta: dict[str, Any] = field(default_factory=dict)  # the adapter's own (echoed in its events)
    ok: bool | None = None  # None while its decode check is pending
    settled: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class FrameAdded:
    """``frame`` is None when the similarity filter dropped it (nothing was buffered)."""

    frame: BufferedFrame | None
    dropped: tuple[BufferedFrame, ...] = ()  # evicted to make room, oldest first

    @property
    def accepted(self) -> bool:
        return self.frame is not None


@dataclass(frozen=True)
class FrameSelection:
    """Which buffered frames a turn shows the thinker (``omniweb.media.frames.select_frames``); times are the
    client's ``pts_ms`` when every frame has one, else when the server received them."""

    num_frames: int = 4
    strategy: SamplingStrategy = "uniform"
    window_seconds: float = 2.0  # for "latest_seconds"

    def pick(self, usable: Sequence[BufferedFrame]) -> list[BufferedFrame]:
        pts = [float(f.pts_ms) for f in usable if f.pts_ms is not None]
        times = pts if len(pts) == len(usable) else [f.received_ms for f in usable]
        return [usable[i] for i in frames.select_frames(times, self.num_frames, self.strategy, self.window_seconds)]


class FrameBuffer:
    """The latest frames of a session, bounded by count and bytes, decoded ahead of any turn."""

    def __init__(
        self,
        *,
        max_frames: int,
        max_bytes: int,
        max_pixels: int,
        filter_threshold: float | None,  # None: no similarity filter
        on_decode_failed: Callable[[BufferedFrame], None],
    ) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.max_pixels = max_pixels
        self.filter = frames.SimilarityFilter(filter_threshold) if filter_threshold is not None else None
        self._on_decode_failed = on_decode_failed
        self._frames: list[BufferedFrame] = []
        self.nbytes = 0  # sum of the buffered frames' sizes (reserved from the process budget)
        self._pinned: set[BufferedFrame] = set()  # frames of the running turn, buffered or not
        self._queue: deque[BufferedFrame] = deque()
        self._wakeup = asyncio.Event()
        self._decoder: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._frames)

    def __iter__(self) -> Iterator[BufferedFrame]:
        return iter(self._frames)

    def __contains__(self, frame: object) -> bool:
        return frame in self._frames

    def snapshot(self) -> list[BufferedFrame]:
        return list(self._frames)

    def start(self) -> None:
        """Start the decoder task (once the session is configured)."""
        if self._decoder is None:
            self._decoder = spawn(self._decode_ahead(), "frame decoder")

    async def add(
        self,
        b64: str,
        *,
        received_ms: float,
        frame_id: str | None = None,
        pts_ms: float | None = None,
        meta: dict[str, Any] | None = None,
    ) -> FrameAdded:
        """Check and buffer one base64 frame; raises ``FrameError`` (client-safe message) when refused."""
        prepared = await run_decode(
            frames.prepare_frame, b64, max_pixels=self.max_pixels, with_thumbnail=self.filter is not None
        )
        thumb = prepared.thumbnail
        if self.filter is not None and thumb is not None and not self.filter.should_retain(thumb):
            return FrameAdded(None)
        dropped: list[BufferedFrame] = []
        # The oldest frames go when the buffer is full: by count, or by bytes (256 frames of 7.5 MB
        # would otherwise be 1.9 GB for one session).
        room = self.max_bytes - len(prepared.data)
        while self._frames and (len(self._frames) >= self.max_frames or self.nbytes > room):
            frame = self._frames.pop(0)
            self._unbuffer(frame)
            dropped.append(frame)
        if not process_budget.reserve(len(prepared.data)):  # all sessions together: omniweb/base/budget.py
            raise FrameError(process_budget.FULL_MESSAGE)
        self.nbytes += len(prepared.data)
        frame = BufferedFrame(
            data=prepared.data,
            received_ms=received_ms,
            frame_id=frame_id,
            pts_ms=pts_ms,
            width=prepared.header.width,
            height=prepared.header.height,
            meta=meta or {},
            ok=prepared.decoded,  # the filter thumbnail's decode proved it (omniweb/media/frames.py)
        )
        self._frames.append(frame)
        self._queue.append(frame)
        self._wakeup.set()
        return FrameAdded(frame, tuple(dropped))

    def remove_failed(self, frame: BufferedFrame) -> bool:
        """Drop a frame whose decode failed; False when it had already left the buffer."""
        if frame not in self._frames:
            return False
        self._frames.remove(frame)
        self._unbuffer(frame)
        return True

    def pin(self, frames_: Sequence[BufferedFrame]) -> None:
        """A turn uses these frames: decode them even if they leave the buffer meanwhile."""
        self._pinned = set(frames_)

    def unpin(self) -> None:
        self._pinned = set()

    @staticmethod
    async def settle(frames_: Sequence[BufferedFrame]) -> list[BufferedFrame]:
        """Wait for the frames' decodes; the ones that decode, in order."""
        for frame in frames_:
            await frame.settled.wait()
        return [f for f in frames_ if f.ok]

    def _unbuffer(self, frame: BufferedFrame) -> None:
        self.nbytes -= len(frame.data)
        process_budget.release(len(frame.data))

    async def _decode_ahead(self) -> None:
        """Check each buffered frame decodes, in order, in a thread, before any turn needs it."""
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            frame = self._queue.popleft()
            if frame not in self._frames and frame not in self._pinned:
                frame.settled.set()  # left the buffer unseen: no turn will ever wait for it
                continue
            if frame.ok is None:  # not checked yet (no filter thumbnail): once, at the cheapest scale
                frame.ok = await run_decode(frames.verify_decodes, frame.data)
            frame.settled.set()
            if not frame.ok:
                logger.info("a buffered frame (%d bytes) did not decode", len(frame.data))
                self._on_decode_failed(frame)

    async def close(self) -> None:
        """Stop the decoder and give the buffered bytes back to the process budget."""
        if self._decoder is not None and self._decoder is not asyncio.current_task():
            self._decoder.cancel()
            await asyncio.gather(self._decoder, return_exceptions=True)
        self._decoder = None
        self.clear()

    def clear(self) -> None:
        process_budget.release(self.nbytes)
        self.nbytes = 0
        self._frames.clear()
        self._queue.clear()
        self._pinned = set()
