"""The OpenAI-compatible wire format without a server: request rules, bodies, streamed containers."""

from __future__ import annotations

import base64
import io
import json
import struct
import wave

import av
import numpy as np
import pytest
from django.core.exceptions import ImproperlyConfigured

from omniweb.base.errors import ErrorKind
from omniweb.engine.messages import End, Status
from omniweb.engine.voice import Capabilities
from omniweb.media.containers import STREAM_FORMATS, StreamEncoder, first_bytes_samples
from omniweb.openai_api import protocol
from omniweb.openai_api.protocol import APIError
from omniweb.openai_api.uploads import decode_upload

CAPS = Capabilities(
    model_names=("hibari-tts", "hibari"),
    voices=("heart",),
    default_voice="heart",
    languages=("en",),
    response_formats=("wav", "pcm"),
)
VOICES = protocol.voice_table("", CAPS.voices, CAPS.default_voice)


def speech(**fields: object) -> protocol.SpeechParams:
    return protocol.parse_speech({"model": "tts-1", "input": "Hello.", "voice": "alloy", **fields}, CAPS, VOICES, 100)


def refusal(**fields: object) -> APIError:
    with pytest.raises(APIError) as info:
        speech(**fields)
    return info.value


# -- speech requests -------------------------------------------------------------------------------
def test_openai_defaults_mp3_audio_stream_and_maps_openai_voices():
    params = speech()
    assert (params.response_format, params.stream_format, params.speed) == ("mp3", "audio", 1.0)
    assert params.voice == "heart"
    assert speech(voice={"id": "nova"}).voice == "heart"  # the SDK's voice object
    assert speech(voice="heart", model="hibari-tts").voice == "heart"


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"input": ""}, 400, "input"),
        ({"input": "   "}, 400, "input"),
        ({"input": "x" * 101}, 400, "input"),
        ({"input": 5}, 400, "input"),
        ({"voice": "nobody"}, 400, "voice"),
        ({"voice": None}, 400, "voice"),
        ({"model": "tts-9"}, 404, "model"),
        ({"response_format": "ogg"}, 400, "response_format"),
        ({"speed": 0.2}, 400, "speed"),
        ({"speed": 4.5}, 400, "speed"),
        ({"speed": "fast"}, 400, "speed"),
        ({"speed": True}, 400, "speed"),
        ({"instructions": 5}, 400, "instructions"),
        ({"model": "gpt-4o-mini-tts-2025"}, 404, "model"),
        ({"model": "gpt-4o-mini-tts-2025-13-01"}, 404, "model"),
        ({"model": "hibari-tts-2025-03-20"}, 404, "model"),  # dated: OpenAI's names only
        ({"stream_format": "chunks"}, 400, "stream_format"),
        ({"seed": 1}, 400, "seed"),
    ],
)
def test_every_bad_field_is_refused_in_openai_shape(fields, status, param):
    error = refusal(**fields)
    assert (error.status, error.param) == (status, param)
    body = error.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]


def test_blank_instructions_are_nothing_to_honour():
    assert speech(instructions="").voice == "heart"
    assert speech(instructions="  ").ignored == ()


def test_style_instructions_are_accepted_and_named_as_ignored():
    """Agent frameworks send TTS instructions on every call by default: not refused, not applied."""
    params = speech(instructions="You will receive partial sentences. Do not complete the sentence.")
    assert params.ignored == ("instructions",) and params.voice == "heart"
    assert speech().ignored == ()


@pytest.mark.parametrize(
    ("name", "alias"),
    [
        ("gpt-4o-mini-tts", True),
        ("gpt-4o-mini-tts-2025-03-20", True),
        ("gpt-4o-mini-tts-2025-12-31", True),
        ("gpt-4o-mini-tts-2025-03-32", False),
        ("gpt-4o-mini-tts-20250320", False),
        ("gpt-4o-mini-tts-2025-03-20-2025-03-20", False),
        ("gpt-4o-mini-tts-latest", False),
        ("-2025-03-20", False),
        ("tts-2", False),
    ],
)
def test_an_alias_is_openais_name_with_an_optional_snapshot_date(name, alias):
    assert protocol.is_alias(name, protocol.SPEECH_MODEL_ALIASES) is alias


def test_openais_current_model_names_and_their_snapshots_are_accepted():
    for model in ("gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-03-20", "tts-1", "hibari"):
        assert speech(model=model).model == model
    for model in (
        "gpt-transcribe",
        "gpt-transcribe-2026-01-15",
        "gpt-4o-transcribe",
        "gpt-4o-mini-transcribe-2025-03-20",
        "whisper-1",
        "whisper-tiny.en",
    ):
        assert protocol.parse_transcription(form(model=model)).model == model


def test_json_body_and_content_type_are_checked():
    assert protocol.parse_json_body("application/json; charset=utf-8", b'{"a": 1}') == {"a": 1}
    for content_type, body in [("text/plain", b"{}"), ("application/json", b"{nope"), ("application/json", b"[1]")]:
        with pytest.raises(APIError) as info:
            protocol.parse_json_body(content_type, body)
        assert info.value.status == 400


def test_voice_map_setting_overrides_and_refuses():
    table = protocol.voice_table("alloy=heart, echo=", CAPS.voices, CAPS.default_voice)
    assert table["alloy"] == "heart" and "echo" not in table
    with pytest.raises(APIError, match="Unknown voice 'echo'"):
        protocol.resolve_voice("echo", CAPS.voices, table)
    with pytest.raises(ImproperlyConfigured):
        protocol.voice_table("alloy=bella", CAPS.voices, CAPS.default_voice)
    with pytest.raises(ImproperlyConfigured):
        protocol.voice_table("alloy", CAPS.voices, CAPS.default_voice)


def test_sse_events_carry_base64_audio_and_usage():
    delta = protocol.speech_delta(b"\x01\x02")
    assert delta.startswith(b"data: ") and delta.endswith(b"\n\n")
    event = json.loads(delta[6:])
    assert event == {"type": "speech.audio.delta", "audio": base64.b64encode(b"\x01\x02").decode()}
    done = json.loads(protocol.speech_done(10, 1.0)[6:])
    assert done == {
        "type": "speech.audio.done",
        "usage": {"input_tokens": 10, "output_tokens": 80, "total_tokens": 90},
    }


# -- transcription requests and bodies ---------------------------------------------------------------
def form(**fields: str | list[str]) -> dict[str, list[str]]:
    base: dict[str, str | list[str]] = {"model": "whisper-1", **fields}
    return {k: v if isinstance(v, list) else [v] for k, v in base.items()}


def test_transcription_fields():
    params = protocol.parse_transcription(form())
    assert (params.response_format, params.temperature, params.words, params.stream) == ("json", 0.0, False, False)
    verbose = protocol.parse_transcription(
        form(response_format="verbose_json", **{"timestamp_granularities[]": ["word", "segment"]})
    )
    assert verbose.words
    assert protocol.parse_transcription(form(language="en", stream="true")).stream


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": "whisper-2"}, "model"),
        ({"model": "gpt-transcribe-2026-1-15"}, "model"),
        ({"model": "whisper-tiny.en-2025-03-20"}, "model"),
        ({"language": "fr"}, "language"),
        ({"response_format": "xml"}, "response_format"),
        ({"temperature": "2"}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"timestamp_granularities[]": ["word"]}, "timestamp_granularities"),
        ({"stream": "true", "response_format": "srt"}, "stream"),
        ({"chunking_strategy": "auto"}, "chunking_strategy"),
    ],
)
def test_bad_transcription_fields_are_refused(fields, param):
    with pytest.raises(APIError) as info:
        protocol.parse_transcription(form(**fields))
    assert info.value.param == param and info.value.status in (400, 404)


SEGMENTS = [
    {"id": 0, "start": 0.0, "end": 1.5, "text": " Hello there."},
    {"id": 1, "start": 1.5, "end": 3661.25, "text": " Bye."},
]
WORDS = [{"word": "Hello", "start": 0.0, "end": 0.5}]


def body(fmt: str, words: bool = False) -> tuple[str, str]:
    fields = form(response_format=fmt, **({"timestamp_granularities[]": ["word"]} if words else {}))
    return protocol.format_transcript(protocol.parse_transcription(fields), SEGMENTS, WORDS, 3661.25)


def test_transcript_bodies_in_every_format():
    assert json.loads(body("json")[0]) == {"text": "Hello there. Bye.", "usage": {"type": "duration", "seconds": 3662}}
    assert body("text") == ("Hello there. Bye.\n", "text/plain; charset=utf-8")
    srt = body("srt")[0]
    assert srt.startswith("1\n00:00:00,000 --> 00:00:01,500\nHello there.\n")
    assert "2\n00:00:01,500 --> 01:01:01,250\nBye.\n" in srt
    vtt = body("vtt")[0]
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n")
    verbose = json.loads(body("verbose_json", words=True)[0])
    assert verbose["language"] == "english" and verbose["duration"] == 3661.25
    assert [s["text"] for s in verbose["segments"]] == [" Hello there.", " Bye."] and verbose["words"] == WORDS
    assert "words" not in json.loads(body("verbose_json")[0])


# -- streamed containers ------------------------------------------------------------------------------
TONE = (np.sin(2 * np.pi * 220 * np.arange(24000) / 24000) * 8000).astype("<i2").tobytes()


def streamed(fmt: str, piece: int = 3601) -> tuple[list[bytes], bytes]:
    enc = StreamEncoder(fmt)
    parts = [enc.header()] + [enc.feed(TONE[i : i + piece]) for i in range(0, len(TONE), piece)] + [enc.finish()]
    return parts, b"".join(parts)


@pytest.mark.parametrize("fmt", [f for f in STREAM_FORMATS if f != "pcm"])
def test_every_streamed_container_decodes_to_the_audio_fed(fmt):
    parts, data = streamed(fmt)
    assert sum(1 for p in parts[:-1] if p) >= 2, "the file must grow while audio is fed, not only at the end"
    with av.open(io.BytesIO(data)) as container:
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
        rate = container.streams.audio[0].rate
    seconds = decoded.size / rate
    assert 0.99 <= seconds <= 1.1, seconds  # encoder delay/padding adds a few ms


def test_streamed_wav_has_an_open_length_header_and_the_exact_samples():
    parts, data = streamed("wav")
    assert parts[0][:4] == b"RIFF" and len(parts[0]) == 44
    assert struct.unpack("<I", data[4:8])[0] == 0xFFFFFFFF and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
    assert data[44:] == TONE  # odd-length pieces are stitched back into whole samples
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (24000, 2, 1)
        assert w.readframes(10**6) == TONE


def test_pcm_passes_through():
    assert streamed("pcm")[1] == TONE


# -- uploads ------------------------------------------------------------------------------------------
def test_uploads_decode_to_16k_mono_and_refusals_are_clear():
    _, mp3 = streamed("mp3")
    pcm = decode_upload(mp3, max_seconds=10)
    assert 0.99 <= len(pcm) / 2 / 16000 <= 1.1
    with pytest.raises(APIError, match=r"longer than 0\.5 seconds"):
        decode_upload(mp3, max_seconds=0.5)
    for junk in (b"", b"this is not audio at all" * 10):
        with pytest.raises(APIError) as info:
            decode_upload(junk, max_seconds=10)
        assert (info.value.status, info.value.param) == (400, "file")


# hibari's sentences start with digital silence (LAME with its bit reservoir held that back 2 frames longer)
SILENT_START = b"\0\0" * 3000 + TONE


@pytest.mark.parametrize("fmt", STREAM_FORMATS)
def test_each_encoder_knows_exactly_how_much_audio_its_first_bytes_need(fmt):
    need = first_bytes_samples(fmt)
    assert StreamEncoder(fmt).first_bytes_samples == need
    if not need:  # pcm, wav: the audio leaves as it comes
        assert StreamEncoder(fmt).feed(TONE[:2]).endswith(TONE[:2])
        return
    for audio in (TONE, SILENT_START):
        assert StreamEncoder(fmt).feed(audio[: need * 2]), f"no bytes after {need} samples"
    # and one sample less is not enough for at least one of them: the value is exact, not padded
    assert any(not StreamEncoder(fmt).feed(audio[: (need - 1) * 2]) for audio in (TONE, SILENT_START))


@pytest.mark.parametrize("fmt", STREAM_FORMATS)
def test_the_speech_views_first_vocoder_step_covers_the_encoders_need(fmt, settings):
    from hibari import dsp

    from omniweb.openai_api.views import first_chunk_frames

    frames = first_chunk_frames(fmt) or settings.VOCODER_FIRST_CHUNK_FRAMES
    # a sentence's first step of F frames releases F - 2 blocks of 300 samples (the OLA holds 2 back)
    released = (frames - (dsp.N_FFT // 2) // dsp.HOP) * dsp.HOP
    assert released >= first_bytes_samples(fmt)
    assert first_chunk_frames(fmt) is None or released - first_bytes_samples(fmt) < dsp.HOP  # no bigger


@pytest.mark.parametrize("fmt", STREAM_FORMATS)
def test_the_first_bytes_are_encoded_from_only_the_audio_they_need(fmt):
    from omniweb.openai_api.views import first_pieces

    need = first_bytes_samples(fmt)
    pieces = first_pieces(SILENT_START, need)
    assert b"".join(pieces) == SILENT_START
    if not need:
        assert pieces == (SILENT_START,)
        return
    assert len(pieces[0]) == need * 2  # the rest is encoded after the first bytes have left
    encoder = StreamEncoder(fmt)
    assert encoder.feed(pieces[0])
    assert first_pieces(SILENT_START[: need * 2], need) == (SILENT_START[: need * 2],)  # nothing to cut


@pytest.mark.parametrize(
    "end",
    [
        End.failed(ErrorKind.CAPACITY, "at capacity", retry_after=2.3),
        End(status=Status.BUSY),  # an older worker's: no kind, no estimate
        End.failed(ErrorKind.STARTING, "starting"),
        End.failed(ErrorKind.UNAVAILABLE, "the voice is not loaded"),
        End.failed(ErrorKind.CLIENT, "speed out of range"),
        End(status=Status.INVALID),
        End(status=Status.UNAVAILABLE),
        End.failed(ErrorKind.ENGINE, "boom"),
    ],
)
def test_a_speech_turns_end_is_the_same_api_error_as_the_engines_end(end):
    """The speech view reads the core turn's ``TurnEnd``, the transcription view the engine's ``End``."""
    from omniweb.conversation.chunks import parse_end
    from omniweb.openai_api.views import _end_error

    def shape(error):
        return error.status, error.body(), error.retry_after

    assert shape(_end_error(parse_end(end))) == shape(_end_error(end))
    if end.retry_after is not None:
        assert _end_error(parse_end(end)).retry_after == 3  # load shedding's estimate, rounded up
