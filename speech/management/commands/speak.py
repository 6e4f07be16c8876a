"""``manage.py speak``: a protocol client for a running omniweb server.

Streams the text, writes the audio it gets back (WAV or raw PCM) and can print word timestamps
(times in the written file, so a subtitle made from them lines up).
It talks to the server over a real WebSocket, so it is also a quick end-to-end check. With
``--codec`` it asks for codec tokens (``output_mode: "codec_tokens"``) and decodes them here with
the same codec module the server uses. It writes a file and nobody listens while it runs, so it asks
for ``priority: "batch"`` (audio made as fast as the server can, after real-time sessions) unless
``--realtime`` says to be paced like a listener.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
from django.core.management.base import BaseCommand, CommandError

from speech.protocol import SAMPLE_RATE, samples_to_ms
from speech.tts.text import split_text


class Command(BaseCommand):
    help = "Speak text through a running omniweb server and save the audio."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("text", help="text to speak (several sentences are streamed one by one)")
        parser.add_argument("-o", "--output", required=True, help="file to write")
        parser.add_argument("--url", default="ws://127.0.0.1:8000", help="server base URL (ws:// or wss://)")
        parser.add_argument("--format", choices=["wav", "pcm"], default="wav", help="file format to write")
        parser.add_argument("--timestamps", action="store_true", help="print word timestamps (on the file's timeline)")
        parser.add_argument("--voice", default=None)
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument("--speed", type=float, default=1.0, help="0.25-4.0 (not streamed when != 1)")
        parser.add_argument(
            "--split",
            choices=["sentence", "clause", "none"],
            default="sentence",
            help="split_granularity: each sentence (or clause) is its own audio.start; none: the text as one",
        )
        parser.add_argument(
            "--codec", action="store_true", help="receive codec tokens and decode them locally (about 24x fewer bytes)"
        )
        parser.add_argument(
            "--realtime",
            action="store_true",
            help="paced to playback like a listening client (default: batch priority, as fast as the server can)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if not split_text(opts["text"], "sentence"):
            raise CommandError(
                "nothing to speak: the text has no words or numbers (only spaces, punctuation or symbols)"
            )
        folder = Path(opts["output"]).parent
        if not folder.is_dir():
            raise CommandError(f"cannot write {opts['output']}: the folder {folder} does not exist")
        if opts["codec"] and opts["timestamps"]:
            raise CommandError("--timestamps is not available with --codec (timestamps ride the PCM stream)")
        try:
            pcm = asyncio.run(self._speak_codec(opts) if opts["codec"] else self._speak(opts))
        except OSError as exc:
            raise CommandError(f"cannot reach {opts['url']}: {exc}") from exc
        if not pcm:
            raise CommandError("the server returned no audio for this text; nothing was written")
        try:
            self._write(opts["output"], opts["format"], pcm)
        except OSError as exc:
            raise CommandError(f"cannot write {opts['output']}: {exc.strerror or exc}") from exc
        seconds = len(pcm) / 2 / SAMPLE_RATE
        self.stdout.write(f"wrote {opts['output']}: {seconds:.2f} s of audio ({opts['format']}, {SAMPLE_RATE} Hz)")

    @staticmethod
    def _write(path: str, fmt: str, pcm: bytes) -> None:
        if fmt == "wav":
            with wave.open(path, "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(SAMPLE_RATE)
                w.writeframes(pcm)
        else:
            with open(path, "wb") as f:
                f.write(pcm)

    @staticmethod
    def _session_config(opts: dict[str, Any], **fields: Any) -> dict[str, Any]:
        config: dict[str, Any] = {"type": "session.config", "split_granularity": opts["split"], **fields}
        if not opts["realtime"]:
            config["priority"] = "batch"
        for key in ("voice", "seed", "speed"):
            if opts[key] is not None:
                config[key] = opts[key]
        return config

    async def _utterance(self, opts: dict[str, Any], config: dict[str, Any]) -> AsyncIterator[tuple[float, Any]]:
        """One utterance: config, text, flush; yields (seconds since the flush, message) until session.done.

        Binary frames come as bytes, text ones decoded; a protocol ``error`` ends the command.
        """
        import websockets

        url = opts["url"].rstrip("/") + "/v1/audio/speech/stream"
        async with websockets.connect(url, max_size=None) as ws:
            await ws.send(json.dumps(config))
            await ws.send(json.dumps({"type": "input.text", "text": opts["text"]}))
            started = time.perf_counter()
            await ws.send(json.dumps({"type": "input.done"}))
            while True:
                raw = await ws.recv()
                msg = raw if isinstance(raw, bytes) else json.loads(raw)
                if isinstance(msg, dict) and msg["type"] == "error":
                    raise CommandError(f"server error: {msg['message']}")
                if isinstance(msg, dict) and msg["type"] == "session.done":
                    break
                yield time.perf_counter() - started, msg
            await ws.send(json.dumps({"type": "session.close"}))

    async def _speak(self, opts: dict[str, Any]) -> bytes:
        streamed = opts["speed"] == 1.0
        config = self._session_config(opts, response_format="pcm", stream_audio=streamed)
        if opts["timestamps"]:
            if not streamed:
                raise CommandError("--timestamps needs --speed 1.0 (timestamps ride the streamed PCM)")
            config["word_timestamps"] = True
        audio = bytearray()
        first: float | None = None
        offset_ms = 0  # where the sentence now arriving begins in the file
        async for elapsed, msg in self._utterance(opts, config):
            if isinstance(msg, bytes):
                first = first or elapsed
                audio += msg
            elif msg["type"] == "audio.start":
                offset_ms = samples_to_ms(len(audio))
                self.stdout.write(f"sentence {msg['sentence_index']}: {msg['sentence_text']}")
            elif msg["type"] == "audio.chunk":
                first = first or elapsed
                audio += base64.b64decode(msg["audio_b64"])
                # The server's word times start at each sentence; the file runs the sentences on.
                for word in msg["timestamps"] or []:
                    start, end = word["start_ms"] + offset_ms, word["end_ms"] + offset_ms
                    self.stdout.write(f"  {start:>6} - {end:>6} ms  {word['word']}")
        if first is not None:
            self.stdout.write(f"time to first audio: {first * 1000:.0f} ms")
        return bytes(audio)

    async def _speak_codec(self, opts: dict[str, Any]) -> bytes:
        """codec.start → packets → codec.done per sentence; one local decoder per sentence."""
        from speech.codec.model import load_codec
        from speech.codec.wire import CodecStreamReader
        from speech.tts.loops import to_pcm16

        codec = await asyncio.to_thread(load_codec)
        audio = bytearray()
        wire_bytes = 0
        reader: CodecStreamReader | None = None
        decoder = None
        first: float | None = None
        async for elapsed, msg in self._utterance(opts, self._session_config(opts, output_mode="codec_tokens")):
            if isinstance(msg, bytes):
                if reader is None or decoder is None:
                    raise CommandError("server sent a codec packet outside codec.start … codec.done")
                first = first or elapsed
                wire_bytes += len(msg)
                try:
                    packet = reader.feed(msg)
                    samples = decoder.push(packet.codes)
                    if packet.eos:
                        samples = np.concatenate([samples, decoder.flush()])
                except ValueError as exc:
                    raise CommandError(f"bad codec stream: {exc}") from exc
                audio += to_pcm16(samples)
            elif msg["type"] == "codec.start":
                if msg.get("decoder_id") != codec.decoder_id:
                    raise CommandError(
                        f"server streams codec {msg.get('decoder_id')!r}; this client decodes {codec.decoder_id!r}"
                    )
                reader, decoder = CodecStreamReader.for_start(msg), codec.decoder()
                self.stdout.write(f"sentence {msg['sentence_index']}: {msg['sentence_text']}")
            elif msg["type"] == "codec.done":
                if reader is None or msg["total_frames"] != reader.total_frames or not reader.eos:
                    raise CommandError(f"codec stream incomplete: {msg}")
                reader = decoder = None
        seconds = len(audio) / 2 / SAMPLE_RATE
        if first is not None:
            self.stdout.write(f"time to first packet: {first * 1000:.0f} ms")
        if seconds:
            kbps = wire_bytes * 8 / seconds / 1000
            self.stdout.write(f"codec packets: {wire_bytes} bytes for {seconds:.2f} s of audio ({kbps:.1f} kbit/s)")
        return bytes(audio)
