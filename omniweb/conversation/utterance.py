"""The speech turn: text the client writes, spoken as it comes, one engine request per batch of pieces.

An utterance is the speech endpoint's turn. Its pieces (sentences or clauses, or one flush) arrive
over time: ``add`` while the client still writes, ``finish`` at its flush. The runner sends each
batch of pieces that completed while the previous request played as one TTS request, and resumes
the noise generator where the previous request left it (the end chunk's ``rng_state``), so seeded
audio equals one request's. Across requests it paces as the engine does within one: the next
request waits while the audio sent is more than ``max_ahead_seconds`` ahead of playback (the
adapter says what it sent with ``played``; only it knows when a file leaves).

``run`` yields the requests' typed chunks (``SentenceStart``, ``AudioChunk``, ``SentenceEnd`` with
their sentence-relative words, ``CodecCodes``) in order, then one ``TurnEnd``: ``ok`` once every
piece is spoken (with the last ``rng_state``), or the first request's failure, after which nothing
more is sent. What the chunks look like on the wire (WAV, PCM, timestamps, codec framing, how the
engine's sentences map onto the client's) is the adapter's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import replace

from omniweb.engine.client import EngineClient
from omniweb.engine.messages import Status
from omniweb.engine.requests import SpeakRequest

from .chunks import EngineChunk, TurnEnd, parse_chunk
from .frames import BufferedFrame

Request = Callable[[Sequence[str]], SpeakRequest]  # the next pieces → their engine request


class SpeechTurn:
    """One utterance (a ``Turn`` for ``Conversation.start_turn``)."""

    frames: Sequence[BufferedFrame] = ()  # an utterance looks at no camera

    def __init__(
        self,
        request: Request,
        pieces: Sequence[str],
        *,
        input_done: bool = True,
        max_ahead_seconds: float = 0.0,
        on_activity: Callable[[], None] | None = None,
    ) -> None:
        self._request = request
        self._feed: list[str] = list(pieces)  # completed pieces not yet sent to the engine
        self.input_done = input_done  # False while the client may still add pieces
        self.max_ahead_seconds = max_ahead_seconds  # 0: no pacing across requests
        self._on_activity = on_activity  # a request started or ended (the adapter's idle clock)
        self._wake = asyncio.Event()  # new pieces or the flush
        self.request_id: str | None = None  # the engine request now streaming
        self.rng_state: str | None = None  # the seeded noise where the previous request left it
        self.first_audio_at: float | None = None
        self.media_seconds = 0.0  # audio (or codes) sent, in seconds of playback
        self.finished = False  # every piece is spoken: only the closing ``TurnEnd`` is left

    @property
    def streaming(self) -> bool:
        return self.request_id is not None

    def add(self, pieces: Sequence[str]) -> None:
        """More completed pieces (the client is still writing)."""
        self._feed.extend(pieces)
        self._wake.set()

    def finish(self, pieces: Sequence[str] = ()) -> None:
        """The flush: the last pieces; nothing more comes."""
        self._feed.extend(pieces)
        self.input_done = True
        self._wake.set()

    def played(self, seconds: float) -> None:
        """The adapter sent ``seconds`` of media to the client (pacing across requests)."""
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
        self.media_seconds += seconds

    async def run(self, engine: EngineClient) -> AsyncGenerator[EngineChunk, None]:
        while self._feed or not self.input_done:
            if not self._feed:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._pace()
            pieces, self._feed = self._feed, []
            end: TurnEnd | None = None
            async with contextlib.aclosing(self._stream(engine, pieces)) as chunks:
                async for chunk in chunks:
                    if isinstance(chunk, TurnEnd):
                        end = chunk
                    else:
                        yield chunk
            if end is None:
                raise RuntimeError("engine stream ended without an end chunk")
            if not end.ok:
                yield end
                return
            self.rng_state = end.rng_state
        self.finished = True
        yield TurnEnd(Status.OK, rng_state=self.rng_state)

    async def _stream(self, engine: EngineClient, pieces: Sequence[str]) -> AsyncGenerator[EngineChunk, None]:
        """One request's typed chunks, its ``TurnEnd`` last; closing early aborts the request."""
        request = self._request(pieces)
        if self.rng_state is not None:
            request = replace(request, rng_state=self.rng_state)
        self.request_id = uuid.uuid4().hex
        self._activity()
        try:
            async with contextlib.aclosing(engine.stream(request, self.request_id)) as stream:
                async for raw in stream:
                    chunk = parse_chunk(raw)
                    if chunk is not None:
                        yield chunk
                    if isinstance(chunk, TurnEnd):
                        return
        finally:
            self.request_id = None
            self._activity()

    async def _pace(self) -> None:
        """Before the next request: wait while the audio sent is over ``max_ahead_seconds`` ahead.

        The engine paces each request from its own first audio; across the requests of one
        utterance the listener's position is only known here.
        """
        limit = self.max_ahead_seconds
        while limit > 0 and self.first_audio_at is not None:
            ahead = self.media_seconds - (time.monotonic() - self.first_audio_at)
            if ahead <= limit:
                return
            await asyncio.sleep(ahead - limit)

    def _activity(self) -> None:
        if self._on_activity is not None:
            self._on_activity()
