"""The session state machine on the wire: config, message validation, timeouts, utterance bookkeeping."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from django.conf import settings as django_settings
from support.messages import (
    configure,
    expect_close,
    expect_error,
    expect_silence,
    receive_json,
    receive_until_done,
    session,
    speak,
)

import speech.consumers

HELLO = "Hello there."
NOT_BUFFERED = "session.config cannot be applied while input is buffered; send input.done first"
BINARY_REJECTED = "Binary messages are not accepted on this endpoint; send JSON text messages"


async def assert_still_serving(comm, fmt: str = "wav") -> None:
    """The connection survived: a flush still produces audio in the expected format."""
    t = await speak(comm, HELLO)
    assert t.errors == []
    [start] = t.of_type("audio.start")
    assert start["format"] == fmt
    assert t.binary and all(t.binary)
    assert t.of_type("session.done")[0]["total_sentences"] == 1


# -- session.config: first, sticky, replaceable -----------------------------------------------------


async def test_first_message_must_be_session_config(connect):
    comm = await connect()
    await comm.send_json_to({"type": "input.text", "text": HELLO})
    assert await expect_error(comm) == "Expected session.config, got: input.text"
    await expect_close(comm)


@pytest.mark.parametrize("msg_type", ["input.done", "input.cancel", "session.close", "bogus"])
async def test_any_other_message_before_config_is_fatal(connect, msg_type):
    comm = await connect()
    await comm.send_json_to({"type": msg_type})
    assert await expect_error(comm) == f"Expected session.config, got: {msg_type}"
    await expect_close(comm)


async def test_message_without_type_before_config_is_fatal(connect):
    comm = await connect()
    await comm.send_json_to({"text": HELLO})
    assert await expect_error(comm) == "Expected session.config, got: None"
    await expect_close(comm)


async def test_valid_config_gets_no_reply(connect):
    comm = await session(connect, voice="heart", response_format="wav")
    await expect_silence(comm)


async def test_config_is_sticky_across_utterances(connect):
    comm = await session(connect, response_format="pcm")
    for index in range(3):
        t = await speak(comm, HELLO)
        [start] = t.of_type("audio.start")
        assert start["format"] == "pcm"
        assert start["utterance_index"] == index
        assert t.of_type("session.done") == [{"type": "session.done", "utterance_index": index, "total_sentences": 1}]


async def test_config_replaced_between_utterances(connect):
    comm = await session(connect, response_format="wav")
    first = await speak(comm, HELLO)
    assert first.of_type("audio.start")[0]["format"] == "wav"
    assert first.binary[0][:4] == b"RIFF"

    await configure(comm, response_format="pcm", stream_audio=True)
    second = await speak(comm, HELLO)
    [start] = second.of_type("audio.start")
    assert start["format"] == "pcm" and start["sample_rate"] == 24000
    assert start["utterance_index"] == 1
    assert not any(frame[:4] == b"RIFF" for frame in second.binary)


async def test_config_rejected_while_text_is_buffered_and_old_config_kept(connect):
    comm = await session(connect, response_format="wav")
    await comm.send_json_to({"type": "input.text", "text": "Keep this "})
    await configure(comm, response_format="pcm")
    assert await expect_error(comm) == NOT_BUFFERED
    await comm.send_json_to({"type": "input.text", "text": "text."})
    await comm.send_json_to({"type": "input.done"})
    t = await receive_until_done(comm)
    assert t.errors == []
    [start] = t.of_type("audio.start")
    assert start["format"] == "wav"  # the rejected config did not take effect
    assert start["sentence_text"] == "Keep this text."  # and the buffered text survived


async def test_config_accepted_again_after_flush(connect):
    comm = await session(connect, response_format="wav")
    await comm.send_json_to({"type": "input.text", "text": HELLO})
    await configure(comm, response_format="pcm")
    assert await expect_error(comm) == NOT_BUFFERED
    await comm.send_json_to({"type": "input.done"})
    await receive_until_done(comm)
    await configure(comm, response_format="pcm")
    await expect_silence(comm)
    await assert_still_serving(comm, "pcm")


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"speed": 5.0}, "speed"),
        ({"voice": "nobody"}, "Unknown voice 'nobody'"),
        ({"response_format": "aac"}, "response_format"),
        ({"split_granularity": "word"}, "split_granularity"),
        ({"stream_audio": True}, "requires response_format='pcm'"),
    ],
)
async def test_invalid_first_config_is_fatal(connect, fields, fragment):
    comm = await connect()
    await configure(comm, **fields)
    assert fragment in await expect_error(comm)
    await expect_close(comm)


async def test_invalid_later_config_reports_and_keeps_the_old_one(connect):
    comm = await session(connect, response_format="pcm")
    await configure(comm, response_format="wav", speed=99)
    message = await expect_error(comm)
    assert message.startswith("Invalid session config:") and "speed" in message
    await configure(comm, voice="nobody")
    assert "Unknown voice" in await expect_error(comm)
    await expect_silence(comm)
    await assert_still_serving(comm, "pcm")


# -- malformed messages ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "Invalid JSON message"),
        ("", "Invalid JSON message"),
        ("[1, 2]", "WebSocket messages must be JSON objects"),
        ('"session.config"', "WebSocket messages must be JSON objects"),
        ("42", "WebSocket messages must be JSON objects"),
        ("null", "WebSocket messages must be JSON objects"),
    ],
)
async def test_malformed_message_before_config_is_fatal(connect, raw, message):
    comm = await connect()
    await comm.send_input({"type": "websocket.receive", "text": raw})  # send_to refuses ""
    assert await expect_error(comm) == message
    await expect_close(comm)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "Invalid JSON message"),
        ("[1, 2]", "WebSocket messages must be JSON objects"),
        ('{"type": "input.nonsense"}', "Unknown message type: input.nonsense"),
        ('{"text": "no type"}', "Unknown message type: None"),
        ('{"type": 7}', "Unknown message type: 7"),
        ('{"type": "input.text", "text": 5}', "input.text requires a string value"),
    ],
)
async def test_malformed_message_after_config_is_reported_not_fatal(connect, raw, message):
    comm = await session(connect)
    await comm.send_to(text_data=raw)
    assert await expect_error(comm) == message
    await expect_silence(comm)
    await assert_still_serving(comm)


async def test_deeply_nested_json_is_rejected_cleanly(connect):
    comm = await session(connect)
    await comm.send_to(text_data="[" * 100_000 + "]" * 100_000)
    assert await expect_error(comm) == "Invalid JSON message"
    await assert_still_serving(comm)


async def test_binary_message_before_config_is_fatal(connect):
    comm = await connect()
    await comm.send_to(bytes_data=b"\x00\x01RIFF")
    assert await expect_error(comm) == BINARY_REJECTED
    await expect_close(comm)


async def test_binary_message_after_config_is_reported_not_fatal(connect):
    comm = await session(connect)
    await comm.send_to(bytes_data=json.dumps({"type": "input.text", "text": HELLO}).encode())
    assert await expect_error(comm) == BINARY_REJECTED
    await expect_silence(comm)
    # The binary payload was not taken as text: a blank flush says no sentences.
    await comm.send_json_to({"type": "input.done"})
    t = await receive_until_done(comm)
    assert t.of_type("session.done")[0]["total_sentences"] == 0
    await assert_still_serving(comm)


async def test_non_string_text_is_not_buffered(connect):
    comm = await session(connect)
    await comm.send_json_to({"type": "input.text", "text": ["Hello"]})
    assert await expect_error(comm) == "input.text requires a string value"
    t = await speak(comm, [])
    assert t.of_type("session.done") == [{"type": "session.done", "utterance_index": 0, "total_sentences": 0}]


async def test_missing_text_field_counts_as_empty(connect):
    comm = await session(connect)
    await comm.send_json_to({"type": "input.text"})
    t = await speak(comm, [])
    assert t.errors == []
    assert t.of_type("session.done")[0]["total_sentences"] == 0


# -- config fields ---------------------------------------------------------------------------------


async def test_speaker_is_an_alias_for_voice(connect):
    comm = await session(connect, speaker="heart")
    await expect_silence(comm)
    await assert_still_serving(comm)


async def test_unknown_speaker_is_rejected_like_a_voice(connect):
    comm = await connect()
    await configure(comm, speaker="nobody")
    message = await expect_error(comm)
    assert "Unknown voice 'nobody'" in message and "heart" in message
    await expect_close(comm)


async def test_unknown_voice_error_lists_available_voices(connect):
    comm = await connect()
    await configure(comm, voice="alloy")
    assert await expect_error(comm) == "Unknown voice 'alloy'; available voices: heart"
    await expect_close(comm)


@pytest.mark.parametrize("seed", [0, 1, -1, 2**63 - 1, -(2**63)])
async def test_seed_within_int64_is_accepted(connect, seed):
    comm = await session(connect, seed=seed)
    await expect_silence(comm, 0.05)
    await assert_still_serving(comm)


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**64, 1.5, "seven"])
async def test_seed_outside_int64_is_rejected(connect, seed):
    comm = await connect()
    await configure(comm, seed=seed)
    message = await expect_error(comm)
    assert message.startswith("Invalid session config:") and "seed" in message
    await expect_close(comm)


@pytest.mark.parametrize("speed", [0.25, 1.0, 4.0])
async def test_speed_bounds_inclusive(connect, speed):
    comm = await session(connect, speed=speed)
    await expect_silence(comm, 0.05)
    await assert_still_serving(comm)


@pytest.mark.parametrize("speed", [0.0, 0.2499, 4.0001, -1.0, 100, "fast"])
async def test_speed_out_of_bounds_rejected(connect, speed):
    comm = await connect()
    await configure(comm, speed=speed)
    message = await expect_error(comm)
    assert message.startswith("Invalid session config:") and "speed" in message
    await expect_close(comm)


async def test_stream_audio_requires_speed_one(connect):
    comm = await connect()
    await configure(comm, stream_audio=True, response_format="pcm", speed=1.5)
    message = await expect_error(comm)
    assert "WebSocket stream_audio=true currently requires speed=1.0" in message
    await expect_close(comm)


async def test_stream_audio_with_speed_one_is_fine(connect):
    comm = await session(connect, stream_audio=True, response_format="pcm", speed=1.0)
    await expect_silence(comm, 0.05)
    await assert_still_serving(comm, "pcm")


async def test_stream_audio_requires_pcm(connect):
    comm = await connect()
    await configure(comm, stream_audio=True, response_format="wav")
    message = await expect_error(comm)
    assert "requires response_format='pcm'. Got response_format='wav'." in message
    await expect_close(comm)


async def test_speaker_embedding_longer_than_8192_rejected(connect):
    comm = await connect()
    await configure(comm, speaker_embedding=[0.0] * 8193)
    message = await expect_error(comm)
    assert message.startswith("Invalid session config:")
    assert "speaker_embedding" in message and "8192" in message
    assert "0.0, 0.0" not in message  # the huge input is not echoed back
    await expect_close(comm)


async def test_speaker_embedding_with_ref_audio_rejected(connect):
    comm = await connect()
    await configure(comm, speaker_embedding=[0.1, 0.2], ref_audio="data:audio/wav;base64,AAAA")
    message = await expect_error(comm)
    assert "'speaker_embedding' and 'ref_audio' are mutually exclusive" in message
    await expect_close(comm)


UNSUPPORTED = [
    pytest.param({"ref_audio": "data:audio/wav;base64,AAAA"}, "ref_audio", id="ref_audio"),
    pytest.param({"ref_text": "hello"}, "ref_text", id="ref_text"),
    pytest.param({"speaker_embedding": [0.1] * 8192}, "speaker_embedding", id="speaker_embedding"),
    pytest.param({"instructions": "whisper"}, "instructions", id="instructions"),
    pytest.param({"non_streaming_mode": True}, "non_streaming_mode", id="non_streaming_mode"),
    pytest.param({"x_vector_only_mode": True}, "x_vector_only_mode", id="x_vector_only_mode"),
    pytest.param({"task_type": "VoiceDesign"}, "task_type 'VoiceDesign'", id="task_type_voicedesign"),
    pytest.param({"task_type": "Base"}, "task_type 'Base'", id="task_type_base"),
    pytest.param({"voice": "alloy"}, "Unknown voice 'alloy'", id="voice"),
    pytest.param({"model": "Qwen/Qwen3-TTS"}, "The model 'Qwen/Qwen3-TTS' does not exist", id="model"),
    pytest.param({"language": "fr"}, "Unsupported language 'fr'", id="language"),
]


@pytest.mark.parametrize(("fields", "fragment"), UNSUPPORTED)
async def test_unsupported_field_in_first_config_is_a_clear_fatal_error(connect, fields, fragment):
    comm = await connect()
    await configure(comm, **fields)
    assert fragment in await expect_error(comm)
    await expect_close(comm)


@pytest.mark.parametrize(("fields", "fragment"), UNSUPPORTED)
async def test_unsupported_field_in_later_config_keeps_the_session(connect, fields, fragment):
    comm = await session(connect, response_format="pcm")
    await configure(comm, **fields)
    assert fragment in await expect_error(comm)
    await expect_silence(comm, 0.05)
    await assert_still_serving(comm, "pcm")


async def test_several_unsupported_fields_are_named_together(connect):
    comm = await connect()
    await configure(comm, instructions="calm", ref_text="hi", ref_audio="AAAA")
    message = await expect_error(comm)
    assert all(name in message for name in ("instructions", "ref_audio", "ref_text"))
    await expect_close(comm)


@pytest.mark.parametrize(
    "fields",
    [
        {"task_type": "CustomVoice"},
        {"model": "hibari-tts"},
        {"model": "hibari"},
        {"language": "en"},
        {"language": "English"},
        {"language": "auto"},
        {"x_vector_only_mode": False},
        {"unknown_extension_field": {"anything": [1, 2, 3]}},
        {"initial_codec_chunk_frames": 0},
        {"max_new_tokens": 500},
    ],
)
async def test_supported_values_are_accepted(connect, fields):
    comm = await session(connect, **fields)
    await expect_silence(comm, 0.05)
    await assert_still_serving(comm)


# -- session lifecycle -----------------------------------------------------------------------------


async def test_session_close_closes_the_socket(connect):
    comm = await session(connect)
    await speak(comm, HELLO)
    await comm.send_json_to({"type": "session.close"})
    await expect_close(comm)


async def test_session_close_discards_buffered_text(connect):
    comm = await session(connect)
    await comm.send_json_to({"type": "input.text", "text": HELLO})
    await comm.send_json_to({"type": "session.close"})
    await expect_close(comm)  # nothing is synthesized first


async def test_config_timeout(connect, settings):
    settings.SPEECH_CONFIG_TIMEOUT = 0.3
    comm = await connect()
    started = asyncio.get_running_loop().time()
    assert await expect_error(comm, timeout=5) == "Timeout waiting for session.config"
    assert asyncio.get_running_loop().time() - started >= 0.2
    await expect_close(comm)


async def test_config_timeout_not_hit_when_config_arrives(connect, settings):
    settings.SPEECH_CONFIG_TIMEOUT = 0.3
    settings.SPEECH_IDLE_TIMEOUT = 30
    comm = await session(connect)
    await expect_silence(comm, 0.6)


def short_timeouts(settings, seconds: float) -> None:
    """Both clocks short, so a test of one never waits on the other."""
    settings.SPEECH_CONFIG_TIMEOUT = seconds
    settings.SPEECH_IDLE_TIMEOUT = seconds


async def test_idle_timeout(connect, settings):
    short_timeouts(settings, 0.3)
    comm = await session(connect)
    await speak(comm, HELLO)
    assert await expect_error(comm, timeout=5) == "Idle timeout: no message received"
    await expect_close(comm)


async def test_idle_timeout_applies_with_text_buffered(connect, settings):
    short_timeouts(settings, 0.3)
    comm = await session(connect)
    await comm.send_json_to({"type": "input.text", "text": HELLO})
    assert await expect_error(comm, timeout=5) == "Idle timeout: no message received"
    await expect_close(comm)


async def test_idle_clock_restarts_on_every_message(connect, settings):
    short_timeouts(settings, 0.4)
    comm = await session(connect)
    for _ in range(6):  # 0.9 s of activity, never 0.4 s apart
        await asyncio.sleep(0.15)
        await comm.send_json_to({"type": "input.text", "text": "word "})
    await expect_silence(comm, 0.1)
    assert await expect_error(comm, timeout=5) == "Idle timeout: no message received"
    await expect_close(comm)


async def test_idle_timeout_does_not_fire_during_generation(connect, settings):
    short_timeouts(settings, 0.25)
    comm = await session(connect, split_granularity="sentence")
    text = " ".join(f"Sentence number {i} takes a little while to say." for i in range(40))
    flushed = asyncio.get_running_loop().time()
    t = await speak(comm, text)
    assert asyncio.get_running_loop().time() - flushed > 0.25, "the flush must outlast the idle timeout"
    assert t.errors == [], "the idle clock must not run while audio is being generated"
    assert t.of_type("session.done")[0]["total_sentences"] == 40
    # The clock restarts when the utterance ends (had it run during the ~1 s flush, the error would
    # be waiting already), so the session stays up a while longer. Loose bound: CI machines lag.
    started = asyncio.get_running_loop().time()
    assert await expect_error(comm, timeout=5) == "Idle timeout: no message received"
    assert asyncio.get_running_loop().time() - started >= 0.05
    await expect_close(comm)


async def test_idle_timeout_shorter_than_config_timeout(connect, settings):
    settings.SPEECH_CONFIG_TIMEOUT = 3.0
    settings.SPEECH_IDLE_TIMEOUT = 0.3
    comm = await session(connect)
    # Idle 0.3 s after the config: the error must come well before the 3 s config clock runs out.
    assert await expect_error(comm, timeout=1.5) == "Idle timeout: no message received"
    await expect_close(comm)


async def test_utterance_index_counts_every_flush(connect):
    comm = await session(connect, split_granularity="sentence")
    seen = []
    for text in [HELLO, "", "   ", "One. Two."]:
        t = await speak(comm, text)
        [done] = t.of_type("session.done")
        seen.append((done["utterance_index"], done["total_sentences"]))
        assert all(m["utterance_index"] == done["utterance_index"] for m in t.json if "utterance_index" in m)
    assert seen == [(0, 1), (1, 0), (2, 0), (3, 2)]


async def test_blank_flush_gives_zero_sentences(connect):
    comm = await session(connect)
    await comm.send_json_to({"type": "input.done"})
    done = await receive_json(comm)
    assert done == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}
    await expect_silence(comm)


async def test_text_parts_are_joined_before_splitting(connect):
    comm = await session(connect, split_granularity="sentence", response_format="pcm")
    t = await speak(comm, ["Hel", "lo wor", "ld. Second ", "one."])
    assert [s.start["sentence_text"] for s in t.sentences()] == ["Hello world.", "Second one."]
    assert [s.start["sentence_index"] for s in t.sentences()] == [0, 1]


@pytest.mark.parametrize("text", ["Hello. ... World.", "..."])
async def test_speechless_text_is_not_a_sentence(connect, text):
    comm = await session(connect)
    t = await speak(comm, text)
    assert t.errors == []
    texts = [m["sentence_text"] for m in t.of_type("audio.start")]
    assert all(any(c.isalnum() for c in sentence) for sentence in texts), texts
    assert t.json[-1]["total_sentences"] == len(texts)


async def test_speechless_piece_joins_a_neighbour_in_clause_mode(connect):
    comm = await session(connect, split_granularity="clause")
    t = await speak(comm, "Hello, ... World.")
    assert [m["sentence_text"] for m in t.of_type("audio.start")] == ["Hello, ...", "World."]


async def test_config_sent_at_once_survives_a_slow_engine_start(connect, settings, monkeypatch):
    real = speech.consumers.get_engine_client

    def slow_engine_start():
        time.sleep(0.6)  # first connection while the model is still loading
        return real()

    monkeypatch.setattr(speech.consumers, "get_engine_client", slow_engine_start)
    settings.SPEECH_CONFIG_TIMEOUT = 0.3
    comm = await connect()
    await configure(comm)  # immediately after the handshake
    t = await speak(comm, HELLO)
    assert t.errors == []
    assert t.json[-1]["total_sentences"] == 1


def test_timeouts_default_to_the_reference_values():
    if any(f"OMNIWEB_SPEECH_{name}_TIMEOUT" in os.environ for name in ("IDLE", "CONFIG")):
        pytest.skip("timeouts overridden in the environment")
    assert django_settings.SPEECH_IDLE_TIMEOUT == 30.0
    assert django_settings.SPEECH_CONFIG_TIMEOUT == 10.0


def test_speed_null_is_the_default_and_crosses_the_redis_boundary():
    """A client's ``"speed": null`` means 1.0 in both engine modes (the Redis worker refused a
    request whose speed was None)."""
    from omniweb.engine.requests import from_wire, to_wire
    from speech.protocol import SessionConfig, tts_request
    from speech.tts.loops import PIPELINE

    request = tts_request("Hello.", SessionConfig.model_validate({"speed": None}), PIPELINE)
    assert request.speed == 1.0 and from_wire(to_wire(request)) == request
