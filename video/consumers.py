"""Transport for ``/v1/video/chat/stream``: one explicit session state machine per WebSocket.

``receive`` is the socket's single reader (Channels dispatches one message at a time). It checks the
first ``session.config`` itself, then parses each later message and puts it on the session's bounded
inbox. One processor task takes the inbox in order, with one handler per message type, so frames,
audio and queries keep their arrival order while the reader stays free.

Frames are checked on the acknowledgement path on the decode pool (video/decoding.py): strict
base64, JPEG/PNG header, pixel budget, JPEG scan count, the similarity thumbnail (a decode, which
proves the frame decodes); without the filter, decoded ahead of time by the session's decoder task,
also on that pool (once per frame either way: video/frames.py). A frame that does not decode is
removed from the buffer and reported; a turn waits for its frames' decodes, so the thinker only ever
gets frames known to decode.

A turn (``video.query``) runs as its own task streaming the engine request's chunks; a newer query
interrupts it (the engine request is aborted and the old turn sends nothing more).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from omniweb import budget as process_budget
from omniweb import metrics
from omniweb.engine.client import EngineClient
from omniweb.engine.runtime import get_engine_client
from omniweb.errors import ErrorKind, end_kind
from omniweb.protocol import excerpt
from omniweb.sessions import SessionClock, SessionConsumer, spawn
from speech.tts.model import capabilities

from . import frames, protocol
from .decoding import run_decode
from .frames import FrameError
from .protocol import ProtocolError, VideoSessionConfig

logger = logging.getLogger(__name__)

PIPELINE = "video.turn"
LARGE_MESSAGE = 1024 * 1024  # parse messages above this size off the event loop


class SessionState(enum.Enum):
    AWAITING_CONFIG = "awaiting_config"
    READY = "ready"  # configured; buffering frames and audio
    ANSWERING = "answering"  # a turn streams its answer (frames and audio still buffer)
    FINISHING = "finishing"  # video.done: the active turn completes, then session.done
    CLOSED = "closed"


def now_ms() -> float:
    """The server clock of every ``*_ts_ms`` field: monotonic milliseconds, as in the seed."""
    return time.monotonic() * 1000.0


@dataclass(eq=False)  # identity: two frames with equal bytes are still two buffer entries
class _Frame:
    data: bytes
    meta: dict[str, Any]
    ok: bool | None = None  # None while its full decode is pending
    settled: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class _DecodeFailed:
    """The decoder's report to the processor; a Python object, so no client can forge it."""

    frame: _Frame


@dataclass
class _Turn:
    request_id: str
    question: str
    modalities: tuple[str, ...]
    snapshot: list[_Frame]
    task: asyncio.Task[None] | None = None
    interrupted: bool = False
    started: bool = False  # response.start sent
    consumed_sent: bool = False
    text: list[str] = field(default_factory=list)
    transcript: str | None = None
    audio_deltas: int = 0
    text_done: bool = False  # response.text.done sent (as soon as the text is complete)
    clock: metrics.TurnClock = field(default_factory=metrics.TurnClock)  # ops: latency histograms


_Item = dict[str, Any] | _DecodeFailed


class VideoStreamConsumer(SessionConsumer):
    async def connect(self) -> None:
        self.state = SessionState.AWAITING_CONFIG
        self.config: VideoSessionConfig | None = None
        self.frames: list[_Frame] = []
        self.buffered_bytes = 0  # sum of the buffered frames' sizes
        self.audio = bytearray()
        self.history: list[dict[str, str]] = []
        self.filter: frames.SimilarityFilter | None = None
        self.inbox: asyncio.Queue[_Item] = asyncio.Queue()  # client messages are bounded in receive()
        self.queued = 0
        self.queued_bytes = 0
        self.decode_queue: deque[_Frame] = deque()
        self.decode_wakeup = asyncio.Event()
        self.turn: _Turn | None = None
        self.tasks: list[asyncio.Task[None]] = []
        # First use may load the models: off the event loop, and before the handshake so the config
        # clock only starts once the session can be served.
        self.engine: EngineClient = await asyncio.to_thread(get_engine_client)
        self.caps = capabilities()
        self.clock = SessionClock(
            config_timeout=settings.VIDEO_CONFIG_TIMEOUT,
            idle_timeout=settings.VIDEO_IDLE_TIMEOUT,
            configured=lambda: self.config is not None,
            # no idle timeout while a turn streams or the session finishes
            paused=lambda: self.state in (SessionState.ANSWERING, SessionState.FINISHING),
            closed=lambda: self.state is SessionState.CLOSED,
            on_timeout=self.on_timeout,
        )
        await self.accept()
        self.tasks.append(spawn(self.clock.run(), "video session clock"))
        self.handlers: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {
            "video.frame": self.on_video_frame,
            "audio.chunk": self.on_audio_chunk,
            "video.query": self.on_video_query,
            "video.done": self.on_video_done,
            "ping": self.on_ping,
        }

    async def disconnect(self, code: int) -> None:
        await self._shutdown()
        self._release()
        logger.info("video session closed (code %s)", code)

    def _release(self) -> None:
        """Drop the session's buffers and the references that make it a cycle (clock and handler
        closures, tasks), so a closed session is freed at once, not at the cyclic collector's leisure."""
        process_budget.release(getattr(self, "buffered_bytes", 0) + len(getattr(self, "audio", b"")))
        for name in ("frames", "decode_queue", "history", "tasks", "handlers", "audio"):
            with contextlib.suppress(AttributeError):  # connect may have failed before setting it
                getattr(self, name).clear()
        self.buffered_bytes = 0
        self.turn = None
        self.clock = None
        self.filter = None

    # -- the single reader -------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        received_ms = now_ms()
        self.clock.touch()
        if self.state in (SessionState.CLOSED, SessionState.FINISHING):
            return  # nothing after video.done is read, as in the seed
        if text_data is None:
            await self.reject("Binary messages are not accepted; send JSON text messages")
            return
        if self.state is SessionState.AWAITING_CONFIG:
            await self.on_session_config(text_data)
            return
        try:
            if len(text_data) > LARGE_MESSAGE:
                msg = await asyncio.to_thread(protocol.parse_message, text_data)
            else:
                msg = protocol.parse_message(text_data)
        except ProtocolError as exc:
            await self.send_json(protocol.error(exc.message))
            return
        size = len(text_data)
        if self.queued >= protocol.MAX_QUEUED_MESSAGES or self.queued_bytes + size > protocol.MAX_QUEUED_BYTES:
            await self.fail("Too many messages queued: the session cannot keep up; session closed")
            return
        # All sessions together (omniweb/budget.py); one message at a time always passes, so a client
        # that waits for its acks meets the budget as refused frames, a flooding one as a close.
        if not self.budget_share.hold("inbox", self.queued_bytes + size, force=not self.queued_bytes):
            await self.fail(process_budget.INBOX_FULL_MESSAGE, ErrorKind.CAPACITY)
            return
        msg["_size"] = size
        self.queued += 1
        self.queued_bytes += size
        if msg.get("type") == "video.frame":
            msg["_received_ms"] = received_ms
        elif msg.get("type") == "video.done":
            self.state = SessionState.FINISHING
        self.inbox.put_nowait(msg)

    async def on_session_config(self, text_data: str) -> None:
        try:
            config = protocol.parse_config(text_data, self.caps)
        except ProtocolError as exc:
            await self.fail(exc.message)
            return
        self.config = config
        if config.enable_frame_filter:
            self.filter = frames.SimilarityFilter(config.frame_filter_threshold)
        self.state = SessionState.READY
        self.tasks.append(spawn(self._process(), "video session processor"))
        self.tasks.append(spawn(self._decode_ahead(), "video frame decoder"))

    # -- the processor: one handler per message type -----------------------------------------------
    async def _process(self) -> None:
        while self.state is not SessionState.CLOSED:
            item = await self.inbox.get()
            if isinstance(item, _DecodeFailed):
                await self.on_decode_failed(item.frame)
                continue
            self.queued -= 1
            self.queued_bytes -= item.pop("_size")
            self.budget_share.hold("inbox", self.queued_bytes)
            msg_type = item.get("type")
            handler = self.handlers.get(msg_type) if isinstance(msg_type, str) else None
            if handler is None:
                await self.send_json(protocol.error(f"Unknown type: {excerpt(msg_type)}"))
                continue
            await handler(item)

    async def on_video_frame(self, msg: dict[str, Any]) -> None:
        assert self.config is not None
        received_ms = msg.pop("_received_ms")
        text = msg.get("data", "")
        if not text:
            return  # the seed ignores empty frames silently
        if not isinstance(text, str):
            await self.send_json(protocol.error("Invalid image data"))
            return
        if len(text) > protocol.MAX_FRAME_SIZE:
            await self.send_json(protocol.error("Frame too large"))
            return
        try:
            protocol.check_frame_timestamps(msg)
        except ProtocolError as exc:
            await self.send_json(protocol.error(exc.message))
            return
        try:
            prepared = await run_decode(
                frames.prepare_frame,
                text,
                max_pixels=settings.VIDEO_MAX_FRAME_PIXELS,
                with_thumbnail=self.filter is not None,
            )
        except FrameError as exc:
            await self.send_json(protocol.error(exc.message))
            return
        thumb = prepared.thumbnail
        if self.filter is not None and thumb is not None and not self.filter.should_retain(thumb):
            await self._send_ack(msg, accepted=False, received_ms=received_ms, reason="filtered")
            return
        dropped_id: str | None = None
        # The oldest frames go when the buffer is full: by count (max_frames, as in the seed) or by
        # bytes (ours: 256 frames of 7.5 MB would otherwise be 1.9 GB for one session).
        budget = settings.VIDEO_MAX_BUFFER_BYTES - len(prepared.data)
        while self.frames and (len(self.frames) >= self.config.max_frames or self.buffered_bytes > budget):
            dropped = self.frames.pop(0)
            self._unbuffer(len(dropped.data))
            dropped_id = dropped.meta.get("frame_id")
        if not process_budget.reserve(len(prepared.data)):  # all sessions together: omniweb/budget.py
            await self.send_json(protocol.error(process_budget.FULL_MESSAGE))
            return
        self.buffered_bytes += len(prepared.data)
        frame = _Frame(data=prepared.data, meta=protocol.frame_metadata(msg, received_ms), ok=prepared.decoded)
        self.frames.append(frame)
        await self._send_ack(msg, accepted=True, received_ms=received_ms, dropped_frame_id=dropped_id)
        self.decode_queue.append(frame)
        self.decode_wakeup.set()

    async def _send_ack(self, msg: dict[str, Any], **fields: Any) -> None:
        ack = protocol.frame_ack(msg, buffered_frames=len(self.frames), **fields)
        if ack is not None:
            await self.send_json(ack)

    async def on_decode_failed(self, frame: _Frame) -> None:
        if frame in self.frames:
            self.frames.remove(frame)
            self._unbuffer(len(frame.data))
            await self.send_json(protocol.error("Frame decode failed"))

    async def on_audio_chunk(self, msg: dict[str, Any]) -> None:
        try:
            pcm = protocol.decode_audio(msg.get("data", ""))
        except ProtocolError as exc:
            await self.send_json(protocol.error(exc.message))
            return
        if problem := self._buffer_audio(pcm):
            await self.send_json(protocol.error(problem))

    def _buffer_audio(self, pcm: bytes) -> str | None:
        """Append, or clear the buffer on overflow and say why (the caller reports it)."""
        if len(self.audio) + len(pcm) > protocol.MAX_AUDIO_BUFFER_BYTES:
            self._take_audio()
            return "Audio buffer overflow"
        if not process_budget.reserve(len(pcm)):
            self._take_audio()
            return process_budget.FULL_MESSAGE
        self.audio.extend(pcm)
        return None

    def _take_audio(self) -> bytes:
        """The buffered microphone audio, now out of the buffer (and of the process budget)."""
        audio = bytes(self.audio)
        process_budget.release(len(self.audio))
        self.audio.clear()
        return audio

    def _unbuffer(self, nbytes: int) -> None:
        """A buffered frame of ``nbytes`` left the buffer."""
        self.buffered_bytes -= nbytes
        process_budget.release(nbytes)

    async def on_video_query(self, msg: dict[str, Any]) -> None:
        assert self.config is not None
        text = msg.get("text", "")
        if not isinstance(text, str):
            await self.send_json(protocol.error("video.query text must be a string"))
            return
        audio_data = msg.get("audio_data")
        if audio_data:
            try:
                pcm = protocol.decode_audio(audio_data)
            except ProtocolError as exc:
                await self.send_json(protocol.error(exc.message))
            else:
                if problem := self._buffer_audio(pcm):
                    await self.send_json(protocol.error(problem))
        await self._interrupt()
        if not self.frames:
            await self.send_json(protocol.error("No frames buffered"))
            return
        turn = _Turn(
            request_id=f"video-{uuid.uuid4().hex[:12]}",
            question=text,
            modalities=tuple(self.config.modalities),
            snapshot=list(self.frames),
        )
        audio = self._take_audio()
        self.turn = turn
        if self.state is SessionState.READY:
            self.state = SessionState.ANSWERING
        turn.task = spawn(self._run_turn(turn, self.config, audio), "video turn")

    async def on_video_done(self, msg: dict[str, Any]) -> None:
        turn = self.turn
        if turn is not None and turn.task is not None:
            await asyncio.gather(turn.task, return_exceptions=True)
        await self.send_json(protocol.session_done())
        await self._close_session()

    async def on_ping(self, msg: dict[str, Any]) -> None:
        await self.send_json(protocol.pong())

    # -- decoding ahead of time --------------------------------------------------------------------
    async def _decode_ahead(self) -> None:
        """Full-decode each buffered frame in order, in a thread, before any turn needs it."""
        while self.state is not SessionState.CLOSED:
            if not self.decode_queue:
                self.decode_wakeup.clear()
                await self.decode_wakeup.wait()
                continue
            frame = self.decode_queue.popleft()
            turn = self.turn
            if frame not in self.frames and (turn is None or frame not in turn.snapshot):
                frame.settled.set()  # left the buffer unseen: no turn will ever wait for it
                continue
            if frame.ok is None:  # not decoded yet (no filter thumbnail): once, at the cheapest scale
                frame.ok = await run_decode(frames.verify_decodes, frame.data)
            frame.settled.set()
            if not frame.ok:
                logger.info("a buffered frame (%d bytes) did not decode", len(frame.data))
                self.inbox.put_nowait(_DecodeFailed(frame))

    # -- turns -------------------------------------------------------------------------------------
    async def _interrupt(self) -> None:
        """Stop the active turn at once: abort its engine request; it sends nothing more."""
        turn = self.turn
        if turn is None or turn.task is None or turn.task.done():
            return
        turn.interrupted = True
        await self.engine.abort(turn.request_id)
        turn.task.cancel()
        await asyncio.gather(turn.task, return_exceptions=True)

    async def _run_turn(self, turn: _Turn, config: VideoSessionConfig, audio: bytes) -> None:
        try:
            await self._answer(turn, config, audio)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("video turn %s failed", turn.request_id)
            await self._turn_failed(turn, "Query processing failed", ErrorKind.ENGINE)
        finally:
            if self.turn is turn:
                self.turn = None
                if self.state is SessionState.ANSWERING:
                    self.state = SessionState.READY
                self.clock.touch()  # the idle clock restarts when the turn ends

    async def _answer(self, turn: _Turn, config: VideoSessionConfig, audio: bytes) -> None:
        for frame in turn.snapshot:
            await frame.settled.wait()
        decoded_ready_ms = now_ms()
        usable = [f for f in turn.snapshot if f.ok]
        if not usable:
            await self._send_turn(turn, protocol.error("No frames buffered"))
            return
        selected = [usable[i] for i in self._sample(usable, config)]
        model_selected_ms = now_ms()
        # As in the seed, frames.consumed is sent only when the client gave frames ids to follow.
        with_ids = any(f.meta.get("frame_id") for f in turn.snapshot)
        request = {
            "pipeline": PIPELINE,
            "question": turn.question,
            "audio": audio,
            "frames": [
                {
                    "frame_id": f.meta["frame_id"] if isinstance(f.meta.get("frame_id"), str) else None,
                    "data": f.data,
                    "pts_ms": protocol.number_or_none(f.meta.get("pts_ms")),
                }
                for f in selected
            ],
            "history": list(self.history),
            "system_prompt": config.system_prompt,
            "modalities": list(config.modalities),
            "voice": config.voice,
            "model": config.model,
        }
        if turn.question.strip():  # else the engine may transcribe first: input.transcript precedes response.start
            await self._start_response(turn)
        async with contextlib.aclosing(self.engine.stream(request, turn.request_id)) as stream:
            async for chunk in stream:
                kind = chunk["type"]
                if kind == "end":
                    await self._end_turn(turn, chunk)
                    return
                if kind == "transcript":
                    turn.transcript = chunk["text"]
                    await self._send_turn(turn, protocol.input_transcript(turn.transcript))
                await self._start_response(turn)
                if with_ids and not turn.consumed_sent:
                    turn.consumed_sent = True
                    consumed = protocol.frames_consumed(
                        turn.request_id,
                        [f.meta for f in selected],
                        model_selected_ms=model_selected_ms,
                        decoded_ready_ms=decoded_ready_ms,
                    )
                    await self._send_turn(turn, consumed)
                if kind == "text":
                    turn.text.append(chunk["delta"])
                    if "text" in turn.modalities and chunk["delta"]:
                        await self._send_turn(turn, protocol.text_delta(chunk["delta"]))
                        turn.clock.text_sent()
                elif kind == "text.end":  # the answer's text is complete; its audio may follow
                    await self._complete_text(turn, "".join(turn.text))
                elif kind == "audio" and "audio" in turn.modalities and chunk["pcm"]:
                    turn.audio_deltas += 1
                    await self._send_turn(turn, protocol.audio_delta(chunk["pcm"], config.event_names))
                    turn.clock.audio_sent()
                if self.send_stalled or self.client_gone:  # failed by a send, or gone (sessions.py)
                    return

    @staticmethod
    def _sample(usable: list[_Frame], config: VideoSessionConfig) -> list[int]:
        """The frames for the thinker, per ``sampling_strategy``; times are the client's ``pts_ms``
        when every frame has one, else when the server received them."""
        pts = [protocol.number_or_none(f.meta.get("pts_ms")) for f in usable]
        times = (
            [float(t) for t in pts if t is not None]
            if all(t is not None for t in pts)
            else [float(f.meta["receiver_received_ts_ms"]) for f in usable]
        )
        window = config.window_seconds or protocol.DEFAULT_WINDOW_SECONDS
        return frames.select_frames(times, config.num_frames, config.sampling_strategy, window)

    async def _complete_text(self, turn: _Turn, text: str) -> None:
        """response.text.done, and the turn joins the history: a client may ask its next question
        (interrupting the audio) as soon as it has the text."""
        if turn.text_done:
            return
        turn.text_done = True
        await self._send_turn(turn, protocol.text_done(text))
        question = turn.question if turn.question.strip() else turn.transcript or ""
        self._remember(question, text)

    async def _start_response(self, turn: _Turn) -> None:
        if not turn.started:
            turn.started = True
            await self._send_turn(turn, protocol.response_start())

    async def _end_turn(self, turn: _Turn, end: dict[str, Any]) -> None:
        status = end.get("status")
        if status == "ok":
            answer = end.get("text")
            text = answer if isinstance(answer, str) else "".join(turn.text)
            transcript = end.get("transcript", turn.transcript)
            if isinstance(transcript, str):
                turn.transcript = transcript
            await self._start_response(turn)
            await self._complete_text(turn, text)
            if turn.audio_deltas:
                await self._send_turn(turn, protocol.audio_done(self._event_names()))
            turn.clock.ended(ok=True)
        elif status == "cancelled" and turn.interrupted:
            return
        else:
            # End messages are the engine's own fixed, client-safe texts (capacity, refusals, a lost
            # worker, an upstream model that failed), never exception text.
            message = end.get("message")
            kind = end_kind(end)
            logger.warning("video turn %s ended with %s (%s): %s", turn.request_id, status, kind, message)
            await self._turn_failed(
                turn, message if isinstance(message, str) and message else "Query processing failed", kind
            )

    async def _turn_failed(self, turn: _Turn, message: str, kind: ErrorKind) -> None:
        """Failures still close the response: error, then response.text.done with what was said, and
        response.audio.done when audio had started (a player waiting for the end hears it)."""
        if not turn.interrupted:
            turn.clock.ended(ok=False)
        await self._start_response(turn)
        await self._send_turn(turn, protocol.error(message, kind))
        if not turn.text_done:  # a failed answer is not remembered
            turn.text_done = True
            await self._send_turn(turn, protocol.text_done("".join(turn.text)))
        if turn.audio_deltas:
            await self._send_turn(turn, protocol.audio_done(self._event_names()))

    def _event_names(self) -> str:
        return self.config.event_names if self.config is not None else "seed"

    def _remember(self, question: str, answer: str) -> None:
        self.history += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        turns = max(0, settings.VIDEO_HISTORY_TURNS)  # the server's cap
        if self.config is not None and self.config.max_history_turns is not None:
            turns = min(turns, self.config.max_history_turns)
        del self.history[: max(0, len(self.history) - 2 * turns)]

    async def _send_turn(self, turn: _Turn, payload: dict[str, Any]) -> None:
        """An interrupted turn sends nothing more."""
        if not turn.interrupted and self.state is not SessionState.CLOSED:
            await self.send_json(payload)

    # -- errors, timeouts, shutdown ----------------------------------------------------------------
    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        await self.send_json(protocol.error(message, kind))
        await self._close_session()

    async def _close_session(self) -> None:
        if self.state is SessionState.CLOSED:
            return
        await self._shutdown()
        await self.close()

    async def _shutdown(self) -> None:
        """Stop every task of the session (the active turn's engine request is aborted)."""
        self.state = SessionState.CLOSED
        current = asyncio.current_task()
        turn = self.turn
        if turn is not None and turn.task is not None and turn.task is not current and not turn.task.done():
            turn.interrupted = True
            await self.engine.abort(turn.request_id)
            turn.task.cancel()
        tasks = [t for t in [*self.tasks, turn.task if turn else None] if t is not None]
        for task in tasks:
            if task is not current and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in tasks if t is not current), return_exceptions=True)

    async def on_timeout(self, awaiting_config: bool) -> None:
        await self.fail("Timeout waiting for session.config" if awaiting_config else "Idle timeout", ErrorKind.TIMEOUT)
