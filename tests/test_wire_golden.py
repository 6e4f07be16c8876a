"""Golden transcripts of every endpoint's wire (issue 24): a restructuring changes no behaviour.

Each test drives one short flow over the real ASGI application (both dispatch paths, via
``connect``) and compares what went over the wire, both ways and in order, with
``tests/golden/<flow>.json``; ids, clock readings and audio bytes are normalized
(tests/support/golden.py says how). After a deliberate change of the wire, record again:
``OMNIWEB_RECORD_GOLDEN=1 python -m pytest tests/test_wire_golden.py``, and review the diff.
"""

from __future__ import annotations

import io
import wave
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
from hibari import Hibari
from support.golden import Wire, codec_packets
from support.messages import (
    configure,
    expect_close,
    expect_error,
    receive_json,
    receive_until,
    session,
    speak,
)
from support.photos import jpeg as photo_jpeg
from support.photos import photo
from support.video import QUESTION, b64, collect_turn, frame, is_type, scene_frames, sync, video

Connect = Callable[..., Any]
FOX = "The quick brown fox jumps over the lazy dog."
JUGS = "Pack my box with five dozen liquor jugs."
REALTIME_PATH = "/v1/realtime?model=gpt-realtime"
SEED = 3  # seeded speech is the same audio every run: its byte counts are part of the transcript


# -- /v1/audio/speech/stream ------------------------------------------------------------------------
async def test_speech_pcm_stream_with_incremental_text(connect: Connect) -> None:
    """Streamed PCM, the text sent in pieces: the first sentence is spoken before the flush (the
    test waits for it, so that the engine requests are the same every run), then session.close."""
    wire = Wire("speech_pcm_incremental")
    comm = await session(
        wire.connecting(connect), response_format="pcm", stream_audio=True, split_granularity="sentence", seed=SEED
    )
    for text in ("Hel", "lo there. How a"):
        await comm.send_json_to({"type": "input.text", "text": text})
    await receive_until(comm, is_type("audio.start"))
    await speak(comm, ["re you", "?"])
    await comm.send_json_to({"type": "session.close"})
    await expect_close(comm)
    wire.check()


async def test_speech_wav_file_then_word_timestamps(connect: Connect) -> None:
    """The default (one WAV file per flush), then a new config: streamed PCM with word timestamps
    (the default split: one request per flush, the words of both sentences in one audio.chunk)."""
    wire = Wire("speech_wav_and_timestamps")
    comm = await session(wire.connecting(connect), seed=SEED)
    await speak(comm, FOX)
    await configure(comm, response_format="pcm", stream_audio=True, word_timestamps=True, seed=SEED)
    await speak(comm, f"{FOX} {JUGS}")
    wire.check()


async def test_speech_codec_tokens(connect: Connect) -> None:
    """output_mode codec_tokens, sentence by sentence: codec.start, packets (their headers only),
    codec.done per sentence. The first sentence is spoken before the flush (the test waits for its
    codec.start): which packet carries SEGMENT_END depends on how the sentences were batched."""
    wire = Wire("speech_codec_tokens", binary=codec_packets)
    comm = await session(wire.connecting(connect), output_mode="codec_tokens", split_granularity="sentence", seed=SEED)
    await comm.send_json_to({"type": "input.text", "text": f"{FOX} {JUGS}"})
    await receive_until(comm, is_type("codec.start"))
    await speak(comm, [])
    wire.check()


async def test_speech_invalid_messages(connect: Connect) -> None:
    """Before the config an invalid message is fatal; after it, each is reported and the session goes on."""
    wire = Wire("speech_errors")
    first = wire.tap(await connect(), "a")
    await first.send_json_to({"type": "input.text", "text": FOX})
    await expect_error(first)
    await expect_close(first)
    comm = await session(wire.connecting(connect, "b"), response_format="pcm", seed=SEED)
    for raw in ("{not json", '{"type": "input.nonsense"}', '{"type": "input.text", "text": 5}'):
        await comm.send_to(text_data=raw)
        await expect_error(comm)
    await comm.send_to(bytes_data=b"\x00\x01")
    await expect_error(comm)
    await configure(comm, speed=99)
    await expect_error(comm)
    await speak(comm, "")  # a blank flush: no sentences
    wire.check()


# -- /v1/video/chat/stream --------------------------------------------------------------------------
async def test_video_frames_and_a_typed_question(connect: Connect) -> None:
    """Frames with acks, a typed question answered with text and audio, a malformed frame, video.done."""
    wire = Wire("video_turn")
    comm = await video(wire.connecting(connect))
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    await collect_turn(comm)
    await frame(comm, "not base64!", "bad")
    await expect_error(comm)
    await sync(comm)
    await comm.send_json_to({"type": "video.done"})
    await receive_json(comm)
    await expect_close(comm)
    wire.check()


# -- /v1/realtime -----------------------------------------------------------------------------------
async def test_realtime_image_question_answered_by_audio(connect: Connect) -> None:
    """session.update, an image item, a typed question, response.create (audio), a truncate of the
    answer, retrieving it, and invalid events (each answered with an error, the session kept)."""
    wire = Wire("realtime_audio_turn")
    comm = wire.tap(await connect(REALTIME_PATH))
    await receive_until(comm, is_type("session.created"))
    audio_input = {"turn_detection": None, "transcription": None}
    update = {"type": "realtime", "output_modalities": ["audio"], "instructions": "Answer briefly."}
    await comm.send_json_to({"type": "session.update", "session": {**update, "audio": {"input": audio_input}}})
    await receive_until(comm, is_type("session.updated"))
    image = "data:image/jpeg;base64," + b64(photo_jpeg(photo("astronaut")))
    for content in ({"type": "input_image", "image_url": image}, {"type": "input_text", "text": QUESTION}):
        item = {"type": "message", "role": "user", "content": [content]}
        await comm.send_json_to({"type": "conversation.item.create", "item": item})
        await receive_until(comm, is_type("conversation.item.done"))
    await comm.send_json_to({"type": "response.create"})
    done = (await receive_until(comm, is_type("response.done"), timeout=60)).json[-1]
    answer = done["response"]["output"][0]["id"]
    await comm.send_json_to(
        {"type": "conversation.item.truncate", "item_id": answer, "content_index": 0, "audio_end_ms": 1000}
    )
    await receive_until(comm, is_type("conversation.item.truncated", "error"))
    await comm.send_json_to({"type": "conversation.item.retrieve", "item_id": answer})
    await receive_until(comm, is_type("conversation.item.retrieved", "error"))
    await comm.send_json_to({"type": "session.delete", "event_id": "client-event-1"})
    await receive_until(comm, is_type("error"))
    await comm.send_to(text_data="{not json")
    await receive_until(comm, is_type("error"))
    wire.check()


# -- the OpenAI HTTP API ----------------------------------------------------------------------------
# The HTTP tests take ``connect`` for its engine set-up (the dispatch path, a fresh Redis client for
# this test's loop); they open no socket.
async def test_http_speech_wav(connect: Connect) -> None:
    """POST /v1/audio/speech (WAV, streamed). The API has no seed: the noise differs run to run, but the
    length (the voice's duration model) does not, so the body's byte count is kept."""
    wire = Wire("http_speech_wav")
    body = {"model": "tts-1", "voice": "alloy", "input": FOX, "response_format": "wav"}
    status, _, _ = await wire.http("POST", "/v1/audio/speech", json_body=body)
    assert status == 200
    wire.check()


async def test_http_transcriptions(connect: Connect) -> None:
    """POST /v1/audio/transcriptions of seeded speech, as json and as verbose_json with timestamps."""
    wire = Wire("http_transcriptions")
    upload = {"file": ("fox.wav", spoken_wav(f"{FOX} {JUGS}"), "audio/wav")}
    await wire.http("POST", "/v1/audio/transcriptions", form={"model": "whisper-1"}, files=upload)
    form = {"model": "whisper-1", "response_format": "verbose_json", "timestamp_granularities[]": ["word", "segment"]}
    await wire.http("POST", "/v1/audio/transcriptions", form=form, files=upload)
    wire.check()


async def test_http_models(connect: Connect) -> None:
    """GET /v1/models, and one model by name."""
    wire = Wire("http_models")
    await wire.http("GET", "/v1/models")
    await wire.http("GET", "/v1/models/whisper-1")
    wire.check()


async def test_http_errors(connect: Connect) -> None:
    """Refusals are OpenAI-shaped errors: an unknown voice, an unknown model, malformed JSON."""
    wire = Wire("http_errors")
    await wire.http("POST", "/v1/audio/speech", json_body={"model": "tts-1", "voice": "nobody", "input": FOX})
    await wire.http("GET", "/v1/models/gpt-5")
    await wire.http("POST", "/v1/audio/speech", raw=("application/json", b'{"model": "tts-1", '))
    wire.check()


# -- inputs -----------------------------------------------------------------------------------------
@cache
def spoken_wav(text: str) -> bytes:
    """``text`` in our own voice (seeded: the same file every run), as a 24 kHz PCM16 WAV."""
    pcm = (np.clip(Hibari()(text, seed=7), -1, 1) * 32767).astype("<i2").tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(pcm)
    return out.getvalue()
