"""A Realtime session over WebRTC (``POST /v1/realtime/calls``): the call's peer, with aiortc.

A ``Call`` is one more transport under ``running.RealtimeSession``, beside the WebSocket consumer:

- the client's microphone arrives as an Opus track, decoded by aiortc, resampled to PCM16 24 kHz
  and handed to the session (``RealtimeSession.hear``) in order with its events: the same input
  audio buffer, server VAD and semantic VAD as ``input_audio_buffer.append``;
- the answers' audio leaves as an Opus track (``AnswerTrack``), paced in real time, so the server
  knows what has been played: speech over it silences it at once and the item is cut to what was
  heard (``responding``), and it says ``output_audio_buffer.started`` / ``.stopped`` /
  ``.cleared``; no ``response.output_audio.delta`` is sent;
- the client and server events are JSON text on the data channel the client opens, ``oai-events``
  (aiortc advertises ``a=max-message-size:262144``: an image item fits).

The peer lives on the event loop of the daphne process that answered the offer: aiortc's tasks
(ICE, DTLS, SCTP, RTP) and the session's run there until the call ends, by ``hangup``, the peer's
connection failing or closing (ICE consent lapses some 30 s after a peer vanishes), the session's
idle timeout, or no connection within ``CONNECT_SECONDS``. The engine is wherever the process's
engine client sends work (in-process, or workers over Redis), as for the WebSocket.

ICE: the answer carries this host's addresses as host candidates and no STUN server is asked
(``iceServers=[]``); a browser that posted its offer before gathering candidates is learned from
its connectivity checks (peer-reflexive candidates), so nothing outside the two hosts is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import av
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from django.conf import settings

from omniweb.base.errors import ErrorKind
from omniweb.base.protocol import dumps
from omniweb.base.tasks import spawn
from omniweb.engine.client import EngineClient
from omniweb.media.pcm import frames_pcm16, pcm16_frame

from . import server_events
from .audio import SAMPLE_RATE
from .errors import RealtimeError, error_event, new_id
from .responding import Played
from .running import RealtimeSession
from .session import AnySession

logger = logging.getLogger(__name__)

ENDPOINT = "/v1/realtime/calls"
EVENTS_CHANNEL = "oai-events"
CONNECT_SECONDS = 30.0  # an answered offer whose peer never connects is given up after this
FRAME_MS = 20  # what the answer track hands the Opus encoder at a time
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000
FRAME_BYTES = FRAME_SAMPLES * 2
TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
LISTEN_PACKETS = 1  # microphone packets held before decoding: see listen_closely
# Client events read from the data channel, not yet taken by the session (whose inbox paces them):
# a client that sends faster than that is refused.
MAX_UNREAD_BYTES = 64 * 1024 * 1024

Notify = Callable[[dict[str, Any]], Awaitable[None]]

CALLS: dict[str, Call] = {}  # this process's calls, by id (hangup finds them here)


class OfferError(ValueError):
    """An offer this server cannot answer; the message is safe to send to the client."""


@dataclass(eq=False)
class _Queued:
    """One response's audio item, queued on the answer track."""

    response_id: str
    item_id: str
    pcm: bytearray = field(default_factory=bytearray)
    played: int = 0  # bytes of it handed to the encoder


class AnswerTrack(MediaStreamTrack):
    """The answers' audio as an outgoing track: 20 ms frames of PCM16 24 kHz at the pace they are
    heard (silence between answers), so the queue is what the client has not heard yet."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.notify: Notify | None = None  # the session's send_event, for output_audio_buffer.*
        self._queue: deque[_Queued] = deque()
        self._started: set[str] = set()  # responses whose audio has begun playing
        self._done: set[str] = set()  # responses whose audio is all queued
        self._start: float | None = None
        self._pts = 0

    # -- the session's side (responding.AnswerAudio) -----------------------------------------------
    def play(self, response_id: str, item_id: str, pcm: bytes) -> None:
        last = self._queue[-1] if self._queue else None
        if last is None or (last.response_id, last.item_id) != (response_id, item_id):
            last = _Queued(response_id, item_id)
            self._queue.append(last)
        last.pcm += pcm

    async def finished(self, response_id: str) -> None:
        self._done.add(response_id)
        if any(q.response_id == response_id for q in self._queue):
            head = self._queue[0]
            if len(self._queue) == 1 and head.played >= len(head.pcm):  # all heard, waiting for more
                self._queue.popleft()
                await self._stopped(response_id)
            return  # stopped once the rest has played
        if response_id in self._started:
            await self._stopped(response_id)
        self._done.discard(response_id)

    def silence(self) -> Played | None:
        head = self._queue[0] if self._queue else None
        for queued in self._queue:
            self._started.discard(queued.response_id)
            self._done.discard(queued.response_id)
        self._queue.clear()
        if head is None:
            return None
        return Played(head.response_id, head.item_id, head.played // 2 * 1000 // SAMPLE_RATE)

    # -- the encoder's side ------------------------------------------------------------------------
    async def recv(self) -> av.AudioFrame:
        """The next 20 ms, when they are due (the sender sends each frame as soon as it has it)."""
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        else:
            self._pts += FRAME_SAMPLES
            wait = self._start + self._pts / SAMPLE_RATE - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        pcm = await self._take()
        frame = pcm16_frame(pcm, SAMPLE_RATE)
        frame.pts = self._pts
        frame.time_base = TIME_BASE
        return frame

    async def _take(self) -> bytes:
        """The next frame's PCM from the head of the queue; silence after it (between answers, or
        while the rest of an answer has not come yet)."""
        out = bytearray()
        while self._queue and len(out) < FRAME_BYTES:
            head = self._queue[0]
            if head.response_id not in self._started:
                self._started.add(head.response_id)
                await self._say("output_audio_buffer.started", head.response_id)
            piece = head.pcm[head.played : head.played + FRAME_BYTES - len(out)]
            head.played += len(piece)
            out += piece
            if head.played < len(head.pcm):
                break
            if len(self._queue) == 1 and head.response_id not in self._done:
                break  # more of this answer is coming
            self._queue.popleft()
            if head.response_id in self._done and all(q.response_id != head.response_id for q in self._queue):
                await self._stopped(head.response_id)
        return bytes(out) + bytes(FRAME_BYTES - len(out))

    async def _stopped(self, response_id: str) -> None:
        self._started.discard(response_id)
        self._done.discard(response_id)
        await self._say("output_audio_buffer.stopped", response_id)

    async def _say(self, kind: str, response_id: str) -> None:
        if self.notify is not None:
            await self.notify(server_events.event(kind, response_id=response_id))


def listen_closely(receiver: Any) -> None:
    """The microphone's packets go to the decoder one packet after they arrive, not four.

    aiortc's receiver holds 4 packets (80 ms) of incoming audio before it decodes any: a playout
    buffer's margin against jitter and reordering. The session does not play this audio, it
    listens to it (the VAD, Whisper), which arrival jitter does not disturb; holding 80 ms only
    made every turn end 60 ms later (measured: the last loud packet reached the session 100 ms
    after it left the caller, 40 ms with one). The price: a packet overtaken by more than one other
    (rare, short of a lossy network) is dropped, 20 ms of the input. aiortc has no setting for it,
    so the receiver's buffer (a private attribute of the pinned release) is replaced before it gets
    a packet; should a release rename it, calls keep aiortc's buffer, and say so.
    """
    name = "_RTCRtpReceiver__jitter_buffer"
    if isinstance(getattr(receiver, name, None), JitterBuffer):
        setattr(receiver, name, JitterBuffer(capacity=16, prefetch=LISTEN_PACKETS))
    else:
        logger.warning("aiortc's receiver has no %s: the microphone keeps aiortc's 80 ms jitter buffer", name)


class Call:
    """One call: the peer connection, its answer track and data channel, and the session over them
    (this is the session's ``Transport``). ``release`` is called once when the call ends."""

    def __init__(
        self, engine: EngineClient, config: AnySession, voices: dict[str, str], release: Callable[[], None]
    ) -> None:
        self.id = new_id("rtc")
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN: host and peer-reflexive candidates
        self.track = AnswerTrack()
        self.session = RealtimeSession(self, engine, config, voices=voices, output=self.track)
        self.track.notify = self.session.send_event
        self.channel: Any = None  # the client's oai-events data channel, once it opens
        self.pending: list[str] = []  # events written before it opened
        self.unread: asyncio.Queue[str | bytes] = asyncio.Queue()
        self.unread_bytes = 0
        self.tasks: list[asyncio.Task[Any]] = []
        self.closed = False
        self.stalled = False  # the client stopped reading its channel
        self.flooded = False  # the client wrote more than MAX_UNREAD_BYTES ahead of the session
        self._release = release

    async def answer(self, offer_sdp: str) -> str:
        """The SDP answer to ``offer_sdp``; the session starts. Raises ``OfferError``."""
        pc = self.pc
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_connection_state)
        if "opus/48000" not in offer_sdp.lower():
            raise OfferError("The offer has no audio with the Opus codec (m=audio, opus/48000/2)")
        # The answer track's transceiver, Opus only, made before the offer is read: the offer's
        # first audio section takes it (codecs are chosen as the offer is read).
        opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
        audio = pc.addTransceiver(self.track, direction="sendrecv")
        audio.setCodecPreferences(opus)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
        except Exception as exc:  # aiortc's parser refuses a malformed offer with several kinds (asserts too)
            raise OfferError(f"The SDP offer could not be used: {exc or type(exc).__name__}") from None
        if audio.mid is None:
            raise OfferError("The offer has no audio section (m=audio): a call carries the answer's audio")
        for transceiver in pc.getTransceivers():
            if transceiver is not audio:
                transceiver.direction = "inactive"  # one audio track each way; video is not taken
        await pc.setLocalDescription(await pc.createAnswer())
        CALLS[self.id] = self
        self._spawn(self._read_events(), "webrtc call events")
        self._spawn(self._give_up_unconnected(), "webrtc call connect timeout")
        await self.session.start()
        return str(pc.localDescription.sdp)

    def _spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> None:
        self.tasks = [t for t in self.tasks if not t.done()]
        self.tasks.append(spawn(coro, what))

    # -- the peer's events -------------------------------------------------------------------------
    def _on_datachannel(self, channel: Any) -> None:
        if channel.label != EVENTS_CHANNEL or self.channel is not None:
            logger.info("call %s: data channel %r ignored (events go on %r)", self.id, channel.label, EVENTS_CHANNEL)
            return
        self.channel = channel
        channel.on("message", self._on_message)
        if channel.readyState == "open":
            self._flush()
        else:
            channel.on("open", self._flush)

    def _flush(self) -> None:
        """The channel opened: what was written before (``session.created`` first) goes now."""
        pending, self.pending = self.pending, []
        for text in pending:
            self._send(text)

    def _on_message(self, message: str | bytes) -> None:
        if self.closed or self.flooded:
            return
        self.unread_bytes += len(message)
        if self.unread_bytes > MAX_UNREAD_BYTES:
            self.flooded = True
            self._spawn(
                self.session.fail("The client sends events faster than they are handled", ErrorKind.CAPACITY),
                "webrtc call refusal",
            )
            return
        self.unread.put_nowait(message)

    async def _read_events(self) -> None:
        """The data channel's one reader: each client event to the session, in order."""
        while not self.closed:
            message = await self.unread.get()
            self.unread_bytes -= len(message)
            await self.session.receive(message)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        for transceiver in self.pc.getTransceivers():
            if transceiver.receiver.track is track:
                listen_closely(transceiver.receiver)
        self._spawn(self._read_audio(track), "webrtc call microphone")

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        """The microphone's decoded Opus (48 kHz) as the session's input audio, PCM16 24 kHz mono."""
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        while not self.closed:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, av.AudioFrame)
            for out in resampler.resample(frame):
                await self.session.hear(frames_pcm16([out]))

    async def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        logger.info("call %s: connection %s", self.id, state)
        if state in ("failed", "closed"):
            await self.close()

    async def _give_up_unconnected(self) -> None:
        await asyncio.sleep(CONNECT_SECONDS)
        if self.pc.connectionState != "connected":
            logger.info("call %s: no connection within %.0f s; ended", self.id, CONNECT_SECONDS)
            await self.close()

    # -- the session's transport -------------------------------------------------------------------
    async def send_text(self, text: str) -> None:
        if self.closed or self.stalled:
            return
        if self.channel is None or self.channel.readyState == "connecting":
            if len(self.pending) < 256:  # a call without a channel hears the answers, reads nothing
                self.pending.append(text)
            return
        self._send(text)
        if self.channel.bufferedAmount > settings.SESSION_SEND_BUFFER_MAX:
            self.stalled = True
            logger.warning("call %s: closing, the client stopped reading its data channel", self.id)
            await self.session.fail("Client is not reading its data channel; call ended", ErrorKind.STALLED)

    def _send(self, text: str) -> None:
        channel = self.channel
        if channel is None or channel.readyState != "open":
            return
        try:
            channel.send(text)
        except ValueError as exc:  # larger than the peer's a=max-message-size
            kind = json.loads(text).get("type")
            logger.warning("call %s: %s event not sent: %s", self.id, kind, exc)
            err = RealtimeError(
                f"The server event '{kind}' is larger than this data channel carries ({exc})", code="event_too_large"
            )
            channel.send(dumps(error_event(err)))

    @property
    def gone(self) -> bool:
        return self.closed or self.stalled

    async def close(self) -> None:
        """End the call (idempotent): the session, the tasks, the peer connection."""
        if self.closed:
            return
        self.closed = True
        CALLS.pop(self.id, None)
        await self.session.shutdown()
        self.track.stop()
        current = asyncio.current_task()
        others = [t for t in self.tasks if t is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        with contextlib.suppress(Exception):  # a peer half set up (a refused offer) closes as far as it got
            await self.pc.close()
        self._release()
        logger.info("call %s ended", self.id)
