"""input.cancel, messages that arrive during generation, and disconnects: the engine is left with no work."""

from __future__ import annotations

import asyncio

import pytest
from support.engine import wait_engine_idle
from support.messages import (
    expect_silence,
    is_type,
    receive,
    receive_json,
    receive_until,
    receive_until_done,
    session,
    speak,
)

HELLO = "Hello there."
LONG = " ".join(f"This is sentence number {i} of a rather long flush that keeps going." for i in range(30))


def is_binary(msg) -> bool:
    return isinstance(msg, bytes)


async def start_long_utterance(comm, text: str = LONG) -> None:
    await comm.send_json_to({"type": "input.text", "text": text})
    await comm.send_json_to({"type": "input.done"})


def assert_cancelled_utterance(t, utterance: int = 0, sentences_in_text: int = 30) -> None:
    """The stream stopped early: a final audio.done with cancelled, then session.done counting it."""
    dones = t.of_type("audio.done")
    assert dones, t.types
    *finished, last = dones
    assert last["cancelled"] is True and last["error"] is False
    assert all("cancelled" not in d for d in finished)
    assert len(dones) < sentences_in_text, "the stream did not stop"
    assert t.types[-2:] == ["audio.done", "session.done"]
    assert t.json[-1] == {"type": "session.done", "utterance_index": utterance, "total_sentences": len(dones)}
    assert [d["sentence_index"] for d in dones] == list(range(len(dones)))
    assert all(m["utterance_index"] == utterance for m in t.json if "utterance_index" in m)
    assert t.errors == []


# -- cancel while idle -----------------------------------------------------------------------------


async def test_cancel_while_idle_clears_the_buffer(connect):
    comm = await session(connect)
    await comm.send_json_to({"type": "input.text", "text": HELLO})
    await comm.send_json_to({"type": "input.cancel"})
    assert await receive_json(comm) == {"type": "input.cancelled", "utterance_index": 0}
    await comm.send_json_to({"type": "input.done"})
    assert await receive_json(comm) == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}
    await expect_silence(comm)


async def test_cancel_with_nothing_buffered_is_acknowledged(connect):
    comm = await session(connect)
    for _ in range(2):
        await comm.send_json_to({"type": "input.cancel"})
        assert await receive_json(comm) == {"type": "input.cancelled", "utterance_index": 0}
    t = await speak(comm, HELLO)
    assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}


async def test_text_after_idle_cancel_starts_fresh(connect):
    comm = await session(connect, response_format="pcm")
    await comm.send_json_to({"type": "input.text", "text": "Forget this. "})
    await comm.send_json_to({"type": "input.cancel"})
    await receive_json(comm)
    t = await speak(comm, HELLO)
    assert [m["sentence_text"] for m in t.of_type("audio.start")] == [HELLO]


async def test_cancel_allows_a_new_config(connect):
    comm = await session(connect, response_format="wav")
    await comm.send_json_to({"type": "input.text", "text": HELLO})
    await comm.send_json_to({"type": "input.cancel"})
    await receive_json(comm)
    await comm.send_json_to({"type": "session.config", "response_format": "pcm"})
    await expect_silence(comm, 0.05)  # no "input is buffered" error: the cancel emptied the buffer
    t = await speak(comm, HELLO)
    assert t.of_type("audio.start")[0]["format"] == "pcm"


# -- cancel during generation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        {"response_format": "pcm", "stream_audio": True},
        {"response_format": "pcm", "stream_audio": True, "word_timestamps": True},
        {"response_format": "wav"},
    ],
    ids=["stream", "timestamps", "wav"],
)
async def test_cancel_mid_generation_stops_the_stream(connect, config):
    comm = await session(connect, split_granularity="sentence", **config)
    await start_long_utterance(comm)
    # Wait until audio is flowing, then cancel.
    head = await receive_until(comm, lambda m: is_binary(m) or is_type("audio.chunk")(m) or is_type("audio.done")(m))
    await comm.send_json_to({"type": "input.cancel"})
    tail = await receive_until_done(comm)
    t = type(tail)(events=head.events + tail.events)
    assert_cancelled_utterance(t)
    assert not t.of_type("input.cancelled"), "a cancel during generation is answered by audio.done, not input.cancelled"
    # Nothing more comes, and the engine has dropped the request.
    await expect_silence(comm, 0.2)
    wait_engine_idle()


async def test_cancelled_stream_counts_only_the_bytes_sent(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True)
    await start_long_utterance(comm)
    head = await receive_until(comm, is_binary)
    await comm.send_json_to({"type": "input.cancel"})
    t = await receive_until_done(comm)
    events = head.events + t.events
    # Bytes since the last audio.start belong to the sentence the cancel closed.
    last_start = max(i for i, e in enumerate(events) if isinstance(e, dict) and e["type"] == "audio.start")
    cancelled = events[-2]
    assert cancelled["type"] == "audio.done" and cancelled["cancelled"] is True
    if cancelled["sentence_index"] == events[last_start]["sentence_index"]:
        sent = sum(len(e) for e in events[last_start:] if isinstance(e, bytes))
        assert cancelled["total_bytes"] == sent


async def test_session_continues_after_a_cancel(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True)
    await start_long_utterance(comm)
    await receive_until(comm, is_binary)
    await comm.send_json_to({"type": "input.cancel"})
    await receive_until_done(comm)
    t = await speak(comm, HELLO)
    assert t.errors == []
    [start] = t.of_type("audio.start")
    assert start["utterance_index"] == 1 and start["sentence_text"] == HELLO
    assert t.json[-1] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


async def test_cancel_before_any_audio_keeps_start_done_pairs(connect):
    comm = await session(connect)
    await start_long_utterance(comm)
    await comm.send_json_to({"type": "input.cancel"})  # handled before the first sentence is ready
    t = await receive_until_done(comm)
    dones = t.of_type("audio.done")
    assert dones and dones[-1].get("cancelled") is True
    starts = {m["sentence_index"] for m in t.of_type("audio.start")}
    assert all(d["sentence_index"] in starts for d in dones), t.events


# -- messages that arrive during generation --------------------------------------------------------


async def test_messages_during_generation_are_processed_in_order_after_it(connect):
    comm = await session(connect, split_granularity="sentence", response_format="wav")
    first = "One sentence here. And a second one. Then a third."
    await comm.send_json_to({"type": "input.text", "text": first})
    await comm.send_json_to({"type": "input.done"})
    # Sent while utterance 0 is generating: config change, then utterance 1 in two parts.
    await comm.send_json_to({"type": "session.config", "response_format": "pcm"})
    await comm.send_json_to({"type": "input.text", "text": "Next "})
    await comm.send_json_to({"type": "input.text", "text": "utterance."})
    await comm.send_json_to({"type": "input.done"})

    u0 = await receive_until_done(comm)
    u1 = await receive_until_done(comm)
    assert u0.errors == [] and u1.errors == []
    assert [m["sentence_text"] for m in u0.of_type("audio.start")] == [
        "One sentence here.",
        "And a second one.",
        "Then a third.",
    ]
    assert all(m["format"] == "wav" for m in u0.of_type("audio.start"))  # the new config waited
    assert u0.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}
    [start] = u1.of_type("audio.start")
    assert start["sentence_text"] == "Next utterance." and start["format"] == "pcm"
    assert start["utterance_index"] == 1
    assert u1.json[-1] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


async def test_errors_for_messages_during_generation_come_after_it(connect):
    comm = await session(connect)
    await start_long_utterance(comm, "First sentence. Second sentence.")
    await comm.send_to(text_data="{broken")
    await comm.send_to(bytes_data=b"\x00\x01")
    await comm.send_json_to({"type": "nope"})
    u0 = await receive_until_done(comm)
    assert u0.errors == []
    errors = [await receive_json(comm) for _ in range(3)]
    assert [e["message"] for e in errors] == [
        "Invalid JSON message",
        "Binary messages are not accepted on this endpoint; send JSON text messages",
        "Unknown message type: nope",
    ]
    await expect_silence(comm)


async def test_queued_messages_survive_a_cancel(connect):
    comm = await session(connect, response_format="pcm", stream_audio=True)
    await start_long_utterance(comm)
    await comm.send_json_to({"type": "input.text", "text": HELLO})
    await comm.send_json_to({"type": "input.done"})
    await receive_until(comm, is_binary)
    await comm.send_json_to({"type": "input.cancel"})
    u0 = await receive_until_done(comm)
    assert u0.of_type("audio.done")[-1].get("cancelled") is True
    u1 = await receive_until_done(comm)
    assert [m["sentence_text"] for m in u1.of_type("audio.start")] == [HELLO]
    assert u1.json[-1] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


async def test_session_close_during_generation_waits_for_the_utterance(connect):
    comm = await session(connect, split_granularity="sentence")
    await start_long_utterance(comm, "First sentence. Second sentence.")
    await comm.send_json_to({"type": "session.close"})
    t = await receive_until(comm, lambda m: False)  # until the close
    assert t.closed
    assert t.types[-2:] == ["session.done", "<close>"]
    assert t.json[-1]["total_sentences"] == 2


# -- disconnects -----------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [{"response_format": "pcm", "stream_audio": True}, {"response_format": "wav"}])
async def test_disconnect_mid_generation_frees_the_engine(connect, config):
    comm = await session(connect, **config)
    await start_long_utterance(comm)
    await receive_until(comm, lambda m: is_binary(m))
    await comm.disconnect(timeout=5)
    wait_engine_idle()  # aborted: unaborted, the paced long flush would keep it busy for minutes


async def test_disconnect_right_after_flush_frees_the_engine(connect):
    comm = await session(connect)
    await start_long_utterance(comm)
    await asyncio.sleep(0)  # the flush is handled, nothing has come back yet
    await comm.disconnect(timeout=5)
    wait_engine_idle()


async def test_many_sessions_cancel_and_disconnect_leave_no_work(connect):
    comms = [await session(connect, response_format="pcm", stream_audio=True) for _ in range(4)]
    for comm in comms:
        await start_long_utterance(comm)
    for comm in comms:
        await receive_until(comm, is_binary)
    await comms[0].send_json_to({"type": "input.cancel"})
    await comms[1].send_json_to({"type": "input.cancel"})
    await comms[2].disconnect(timeout=5)
    await comms[3].disconnect(timeout=5)
    for comm in comms[:2]:
        t = await receive_until_done(comm)
        assert t.of_type("audio.done")[-1].get("cancelled") is True
    wait_engine_idle()
    # Late: a cancel after the utterance ended is an ordinary idle cancel.
    await comms[0].send_json_to({"type": "input.cancel"})
    assert await receive(comms[0]) == {"type": "input.cancelled", "utterance_index": 1}
