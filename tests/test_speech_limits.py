"""Size limits: per-message-type caps, the buffered-text cap, and the queue of messages held during generation."""

from __future__ import annotations

import json

from support.messages import (
    configure,
    expect_close,
    expect_error,
    expect_silence,
    is_type,
    receive_until,
    session,
    speak,
)

KIB = 1024
MIB = 1024 * KIB
CONFIG_LIMIT = 4 * MIB
OTHER_LIMIT = 128 * KIB
HELLO = "Hello there."
LONG = " ".join(f"This is sentence number {i} of a rather long flush that keeps going." for i in range(30))


def padded(message: dict, size: int, field: str = "pad") -> str:
    """``message`` as JSON of exactly ``size`` characters, grown with an extra string field."""
    base = json.dumps({**message, field: ""})
    raw = json.dumps({**message, field: "x" * (size - len(base))})
    assert len(raw) == size
    return raw


# -- per-message size caps -------------------------------------------------------------------------


async def test_config_over_4_mib_is_rejected_before_config(connect):
    comm = await connect()
    await comm.send_to(text_data=padded({"type": "session.config"}, CONFIG_LIMIT + 1))
    # Like the reference, anything over the largest per-type budget is "WebSocket message too large".
    assert await expect_error(comm) == "WebSocket message too large"
    await expect_close(comm)


async def test_config_over_4_mib_after_config_is_reported(connect):
    comm = await session(connect, response_format="pcm")
    await comm.send_to(text_data=padded({"type": "session.config", "response_format": "wav"}, CONFIG_LIMIT + 1))
    assert await expect_error(comm) == "WebSocket message too large"
    t = await speak(comm, HELLO)
    assert t.of_type("audio.start")[0]["format"] == "pcm"  # the oversized config was not applied


async def test_config_of_exactly_4_mib_passes_the_size_check(connect):
    comm = await connect()
    await comm.send_to(text_data=padded({"type": "session.config", "response_format": "pcm"}, CONFIG_LIMIT))
    await expect_silence(comm, 0.1)
    t = await speak(comm, HELLO)
    assert t.errors == [] and t.of_type("audio.start")[0]["format"] == "pcm"


async def test_large_config_gets_the_capability_error_not_a_size_error(connect):
    comm = await session(connect)
    ref_audio = "data:audio/wav;base64," + "A" * (3 * MIB)
    await configure(comm, ref_audio=ref_audio)
    message = await expect_error(comm)
    assert "ref_audio" in message and "too large" not in message
    assert len(message) < 1000, "the payload must not be echoed back"
    await expect_silence(comm, 0.05)


async def test_large_unknown_config_field_is_ignored(connect):
    comm = await connect()
    await comm.send_to(text_data=padded({"type": "session.config", "response_format": "pcm"}, 3 * MIB, "x_extra"))
    await expect_silence(comm, 0.1)
    t = await speak(comm, HELLO)
    assert t.errors == [] and len(t.of_type("audio.done")) == 1


async def test_other_message_over_128_kib_is_rejected(connect):
    comm = await session(connect)
    await comm.send_to(text_data=padded({"type": "input.text", "text": "Dropped. "}, OTHER_LIMIT + 1))
    assert await expect_error(comm) == "input.text message too large"
    t = await speak(comm, HELLO)  # the session goes on and the oversized text was not buffered
    assert [m["sentence_text"] for m in t.of_type("audio.start")] == [HELLO]


async def test_other_message_of_exactly_128_kib_is_accepted(connect):
    comm = await session(connect, split_granularity="sentence")
    await comm.send_to(text_data=padded({"type": "input.text", "text": "Kept. "}, OTHER_LIMIT))
    await expect_silence(comm, 0.05)
    t = await speak(comm, HELLO)
    assert [m["sentence_text"] for m in t.of_type("audio.start")] == ["Kept.", HELLO]


async def test_non_config_size_cap_applies_to_every_type(connect):
    comm = await session(connect)
    for msg_type in ("input.done", "input.cancel", "session.close", "something.else"):
        await comm.send_to(text_data=padded({"type": msg_type}, OTHER_LIMIT + 1))
        assert await expect_error(comm) == "input.text message too large"
    await expect_silence(comm, 0.05)


async def test_oversized_message_before_config_is_fatal(connect):
    comm = await connect()
    await comm.send_to(text_data=padded({"type": "input.text", "text": "x"}, OTHER_LIMIT + 1))
    assert await expect_error(comm) == "input.text message too large"
    await expect_close(comm)


# -- buffered text cap -----------------------------------------------------------------------------


async def test_buffered_text_cap(connect, settings):
    settings.SPEECH_MAX_TEXT_CHARS = 40
    comm = await session(connect, split_granularity="sentence")
    first = "Twenty characters. "  # 19
    await comm.send_json_to({"type": "input.text", "text": first})
    await comm.send_json_to({"type": "input.text", "text": "x" * 22})  # 41 > 40
    assert await expect_error(comm) == ("Buffered text would exceed 40 characters; send input.done to flush first")
    await comm.send_json_to({"type": "input.text", "text": "Ok." + " " * 18})  # exactly 40
    t = await speak(comm, [])
    assert t.errors == []
    assert [m["sentence_text"] for m in t.of_type("audio.start")] == ["Twenty characters.", "Ok."]


async def test_buffered_text_cap_resets_after_flush_and_cancel(connect, settings):
    settings.SPEECH_MAX_TEXT_CHARS = 20
    comm = await session(connect)
    await comm.send_json_to({"type": "input.text", "text": "a" * 20})
    await comm.send_json_to({"type": "input.cancel"})
    assert (await receive_until(comm, is_type("input.cancelled"))).errors == []
    t = await speak(comm, "Short one.")
    assert t.errors == []
    t = await speak(comm, "Another one.")
    assert t.errors == []


async def test_single_text_over_the_cap_is_rejected(connect, settings):
    settings.SPEECH_MAX_TEXT_CHARS = 10
    comm = await session(connect)
    await comm.send_json_to({"type": "input.text", "text": "This is far too long."})
    assert "exceed 10 characters" in await expect_error(comm)
    t = await speak(comm, [])
    assert t.json[-1]["total_sentences"] == 0


# -- messages held during generation ---------------------------------------------------------------


async def test_flood_of_messages_during_generation_ends_the_session(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True)
    await comm.send_json_to({"type": "input.text", "text": LONG})
    await comm.send_json_to({"type": "input.done"})
    for _ in range(1100):  # more than the 1024 messages held while audio is generated
        await comm.send_json_to({"type": "input.text", "text": "x"})
    t = await receive_until(comm, lambda m: False)
    assert t.closed
    assert t.errors[-1] == "Too many messages queued while audio is being generated"
    assert len(t.of_type("audio.done")) < 30


async def test_too_many_queued_bytes_during_generation_ends_the_session(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True)
    await comm.send_json_to({"type": "input.text", "text": LONG})
    await comm.send_json_to({"type": "input.done"})
    big = padded({"type": "session.config", "response_format": "pcm"}, 3 * MIB)
    for _ in range(3):  # 9 MiB held > 8 MiB
        await comm.send_to(text_data=big)
    t = await receive_until(comm, lambda m: False)
    assert t.closed
    assert t.errors[-1] == "Too many messages queued while audio is being generated"
