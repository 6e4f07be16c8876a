"""The speech endpoint's session without a socket (speech/session.py): each client message's handler
driven directly over the real engine, asserted on what the session sent through ``send``, what it
failed with, and when it handed the session back (``resume``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import speech.session
from omniweb.base import budget
from omniweb.base.errors import ErrorKind
from omniweb.conversation import ConversationState
from omniweb.engine.runtime import get_engine_client, get_scheduler
from speech import protocol
from speech.codec.loops import CODEC_PIPELINE
from speech.codec.model import CodecTableError
from speech.protocol import SessionConfig
from speech.session import SpeechSession, speak_request
from speech.tts.loops import PIPELINE

HELLO = "Hello there."
LONG = " ".join(f"This is sentence number {i} of a rather long flush that keeps going." for i in range(30))
PCM_STREAM = {"type": "session.config", "response_format": "pcm", "stream_audio": True}
NOT_BUFFERED = "session.config cannot be applied while input is buffered; send input.done first"


class Wire:
    """A session driven without a socket: what it sent, its fatal errors, its ends and resumes."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any] | bytes] = []
        self.failed: list[tuple[str, ErrorKind]] = []
        self.ended = 0
        self.resumed = asyncio.Event()
        self.share = budget.SessionShare()
        get_scheduler()  # the in-process engine, models loaded
        self.session = SpeechSession(
            get_engine_client(),
            self._send,
            share=self.share,
            stopped=lambda: False,
            fail=self._fail,
            end=self._end,
            touch=lambda: None,
            resume=self.resumed.set,
        )

    async def _send(self, payload: dict[str, Any] | bytes) -> None:
        self.sent.append(payload)

    async def _fail(self, message: str, kind: ErrorKind) -> None:
        self.failed.append((message, kind))

    async def _end(self) -> None:
        self.ended += 1

    async def handle(self, *messages: dict[str, Any]) -> list[dict[str, Any] | bytes]:
        """Handle ``messages`` in order; what they sent."""
        for msg in messages:
            await self.session.handle(msg)
        return self.take()

    async def utterance(self) -> list[dict[str, Any] | bytes]:
        """Everything sent until the utterance is over and the session resumed."""
        await asyncio.wait_for(self.resumed.wait(), 60)
        self.resumed.clear()
        return self.take()

    def take(self) -> list[dict[str, Any] | bytes]:
        sent, self.sent = self.sent, []
        return sent


@pytest.fixture
async def wire() -> AsyncIterator[Wire]:
    wire = Wire()
    yield wire
    await wire.session.conversation.close()  # a running utterance is aborted
    wire.session.release()
    wire.share.close()


def types(sent: list[dict[str, Any] | bytes]) -> list[str]:
    return [m["type"] if isinstance(m, dict) else "<audio>" for m in sent]


def text(value: str) -> dict[str, Any]:
    return {"type": "input.text", "text": value}


DONE = {"type": "input.done"}


async def test_before_the_config_every_message_and_a_bad_first_config_are_fatal(wire: Wire) -> None:
    assert await wire.handle(text(HELLO), {"type": "session.config", "speed": "fast"}) == []
    assert wire.failed[0] == ("Expected session.config, got: input.text", ErrorKind.CLIENT)
    assert wire.failed[1][0].startswith("Invalid session config:")
    assert wire.session.state is ConversationState.AWAITING_CONFIG


async def test_a_later_bad_config_is_reported_and_the_old_one_stays(wire: Wire) -> None:
    await wire.handle(PCM_STREAM)
    config = wire.session.config
    [error] = await wire.handle({"type": "session.config", "speed": "fast"})
    assert error["type"] == "error" and error["message"].startswith("Invalid session config:")
    assert wire.session.config is config and wire.failed == []
    assert await wire.handle(text(HELLO), PCM_STREAM) == [protocol.error(NOT_BUFFERED)]


async def test_text_is_held_within_its_limits_and_flushes_without_text_are_done_at_once(
    wire: Wire, settings: Any
) -> None:
    settings.SPEECH_MAX_TEXT_CHARS = 10
    await wire.handle(PCM_STREAM)
    assert await wire.handle({"type": "input.text", "text": 7}, text("Hello"), text(" world")) == [
        protocol.error("input.text requires a string value"),
        protocol.error("Buffered text would exceed 10 characters; send input.done to flush first"),
    ]
    assert wire.share.held() == 5  # the buffered text, in the process budget
    assert await wire.handle({"type": "input.cancel"}, DONE, DONE, {"type": "bogus"}) == [
        protocol.input_cancelled(0),  # the text is dropped: the flush after it has nothing to say
        protocol.session_done(0, 0),
        protocol.session_done(1, 0),
        protocol.error("Unknown message type: bogus"),
    ]
    assert wire.share.held() == 0


async def test_a_flush_speaks_one_utterance_then_resumes_the_session(wire: Wire) -> None:
    assert await wire.handle(PCM_STREAM, text(HELLO), DONE) == []
    assert wire.session.state is ConversationState.ANSWERING and wire.session.streaming
    sent = await wire.utterance()
    assert types(sent)[0] == "audio.start" and types(sent)[-2:] == ["audio.done", "session.done"]
    assert set(types(sent[1:-2])) == {"<audio>"}
    assert sent[-1] == protocol.session_done(0, 1)
    assert wire.session.utterance is None and wire.session.utterance_index == 1
    assert wire.session.state is ConversationState.READY and wire.share.held() == 0


async def test_sentence_mode_speaks_a_complete_sentence_before_the_flush(wire: Wire) -> None:
    await wire.handle({**PCM_STREAM, "split_granularity": "sentence"}, text("Hello there. How are"))
    assert wire.session.state is ConversationState.SPEAKING  # the first sentence is complete
    await wire.handle(text(" you?"), DONE)
    assert wire.session.state is not ConversationState.SPEAKING
    sent = await wire.utterance()
    starts = [m["sentence_text"] for m in sent if isinstance(m, dict) and m["type"] == "audio.start"]
    assert starts == ["Hello there.", "How are you?"]
    assert sent[-1] == protocol.session_done(0, 2)


async def test_input_cancel_ends_the_utterance_on_the_wire_as_cancelled(wire: Wire) -> None:
    await wire.handle({**PCM_STREAM, "split_granularity": "sentence"}, text(LONG), DONE)
    for _ in range(6000):
        if any(isinstance(m, bytes) for m in wire.sent):
            break
        await asyncio.sleep(0.01)
    await wire.session.handle({"type": "input.cancel"})
    sent = await wire.utterance()
    dones = [m for m in sent if isinstance(m, dict) and m["type"] == "audio.done"]
    assert dones[-1]["cancelled"] is True and len(dones) < 30
    assert sent[-1] == protocol.session_done(0, len(dones))
    assert wire.session.utterance is None and wire.session.state is ConversationState.READY


async def test_a_codec_mode_is_refused_at_the_flush_when_the_codec_cannot_load(wire: Wire, monkeypatch: Any) -> None:
    def bad_table() -> None:
        raise CodecTableError("codec table x has sha256 0, expected 1")

    monkeypatch.setattr(speech.session, "shared_codec", bad_table)
    sent = await wire.handle({"type": "session.config", "output_mode": "codec_tokens"}, text(HELLO), DONE)
    assert sent == [
        protocol.error(protocol.CODEC_UNSUPPORTED, kind=ErrorKind.ENGINE),  # the server's table, not the ask
        protocol.session_done(0, 0),
    ]


async def test_session_close_takes_nothing_more_and_ends_the_session(wire: Wire) -> None:
    assert await wire.handle(PCM_STREAM, {"type": "session.close"}) == []
    assert wire.session.state is ConversationState.CLOSED and wire.ended == 1


def test_the_engine_request_follows_the_flush_shape() -> None:
    def config(**fields: Any) -> SessionConfig:
        return SessionConfig.model_validate(fields)

    one = speak_request(config(stream_audio=False), ["One. Two."], merge=True, codec=None)
    assert (one.text, one.split, one.max_frames_scope, one.paced) == ("One. Two.", "sentence", "request", False)
    assert one.pipeline == PIPELINE
    pieces = speak_request(config(split_granularity="clause"), ["One,", "two."], merge=False, codec=None)
    assert (pieces.text, pieces.split) == ("One,\ntwo.", "clause")
    codes = speak_request(config(output_mode="codec_tokens"), ["One."], merge=False, codec={"name": "codec"})
    assert (codes.pipeline, codes.codec_output, codes.split) == (CODEC_PIPELINE, "codes", "none")
    assert codes.timestamps is False and codes.first_chunk_frames is None  # nothing is vocoded
    vocoded = speak_request(config(vocoder="codec"), ["One."], merge=True, codec=None)
    assert (vocoded.pipeline, vocoded.codec_output) == (CODEC_PIPELINE, "pcm")
