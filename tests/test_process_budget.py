"""The process-wide memory budget (issue #11) beyond frames and microphone audio: replies queued for
clients that read slowly (every endpoint) and what a speech session holds (buffered text, messages
held while audio streams, the audio of a file). Beyond the budget new work is refused, or the
session holding the memory is closed, each with a clear ``error``; everything is given back."""

from __future__ import annotations

from typing import Any

import pytest
from channels.exceptions import StopConsumer
from support.messages import expect_close, expect_error, is_type, receive_until, receive_until_done

from omniweb.base import budget
from omniweb.base.errors import ErrorKind
from omniweb.web.sessions import SessionConsumer
from omniweb.web.transport import SCOPE_KEY

LOCAL = pytest.mark.parametrize("engine", ["local"], indirect=True)
MiB = 1024 * 1024


class _Session(SessionConsumer):
    """A session whose socket holds ``queued`` bytes for its client (daphne's buffer, as probed)."""

    def __init__(self) -> None:
        super().__init__()
        self.queued = 0
        self.sent: list[dict[str, Any]] = []
        self.failed: list[tuple[str, ErrorKind]] = []
        self.scope = {"type": "websocket", SCOPE_KEY: lambda: self.queued}
        self.base_send = self._base_send

    async def _base_send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def fail(self, message: str, kind: ErrorKind = ErrorKind.CLIENT) -> None:
        self.failed.append((message, kind))

    async def leave(self) -> None:
        with pytest.raises(StopConsumer):
            await self.websocket_disconnect({"type": "websocket.disconnect", "code": 1000})


async def test_replies_queued_for_slow_clients_count_against_the_process_budget(settings):
    start = budget.held()
    settings.PROCESS_BUFFER_BUDGET = start + 5 * MiB
    behind, slower, reading = _Session(), _Session(), _Session()
    behind.queued = 3 * MiB  # under the per-session cap (4 MiB): only the process budget can stop it
    await behind.send(bytes_data=b"\0" * 1024)
    assert behind.failed == [] and budget.held() == start + 3 * MiB
    slower.queued = 3 * MiB
    await slower.send(bytes_data=b"\0" * 1024)
    assert slower.failed == [(budget.REPLIES_FULL_MESSAGE, ErrorKind.STALLED)]
    assert budget.held() == start + 3 * MiB  # nothing taken for the session that was let go
    reading.queued = 16 * 1024  # a client that reads keeps a little in flight: never ended for the budget
    settings.PROCESS_BUFFER_BUDGET = start + 3 * MiB
    await reading.send(text_data='{"type": "pong"}')
    assert reading.failed == []
    behind.queued = 1 * MiB  # the client caught up: its share shrinks at its next send
    await behind.send(bytes_data=b"\0")
    assert budget.held() == start + 1 * MiB + 16 * 1024
    await behind.leave()
    await reading.leave()
    await slower.leave()
    assert budget.held() == start


@LOCAL
async def test_speech_text_beyond_the_budget_is_refused_and_given_back_at_the_flush(connect, settings):
    start = budget.held()
    settings.PROCESS_BUFFER_BUDGET = start + 1000
    comm = await connect()
    await comm.send_json_to({"type": "session.config", "response_format": "pcm", "stream_audio": True})
    await comm.send_json_to({"type": "input.text", "text": "Hello there, " + "word " * 150})  # 763 characters
    await comm.send_json_to({"type": "input.text", "text": "more " * 60})
    assert await expect_error(comm) == budget.TEXT_FULL_MESSAGE
    await comm.send_json_to({"type": "input.done"})
    done = await receive_until_done(comm)
    assert done.errors == [] and done.binary  # the text buffered before the refusal is spoken
    assert budget.held() == start
    await comm.send_json_to({"type": "input.text", "text": "Room again."})  # given back: taken again
    await comm.send_json_to({"type": "input.done"})
    assert (await receive_until_done(comm)).errors == []
    await comm.disconnect()
    assert budget.held() == start


@LOCAL
async def test_speech_messages_held_beyond_the_budget_close_the_session(connect, settings):
    start = budget.held()
    comm = await connect()
    await comm.send_json_to({"type": "session.config", "response_format": "pcm", "stream_audio": True})
    await comm.send_json_to({"type": "input.text", "text": "A sentence to keep the engine busy for a while."})
    await comm.send_json_to({"type": "input.done"})
    settings.PROCESS_BUFFER_BUDGET = start + 64 * 1024  # after the flush: only held messages can exceed it
    for _ in range(3):
        await comm.send_json_to({"type": "input.text", "text": "x" * 30_000})
    t = await receive_until(comm, is_type("error"))
    assert t.errors == [budget.HELD_FULL_MESSAGE]
    assert not t.closed
    await expect_close(comm)
    await comm.disconnect()  # daphne's websocket.disconnect after the close
    assert budget.held() == start


@LOCAL
async def test_speech_file_audio_beyond_the_budget_fails_the_utterance_not_the_session(connect, settings):
    start = budget.held()
    settings.PROCESS_BUFFER_BUDGET = start + 32 * 1024  # under a second of 24 kHz PCM16
    comm = await connect()
    await comm.send_json_to({"type": "session.config", "response_format": "wav"})
    await comm.send_json_to({"type": "input.text", "text": "This sentence takes more than a second to say."})
    await comm.send_json_to({"type": "input.done"})
    done = await receive_until_done(comm)
    assert done.errors == [f"Generation failed for utterance 0, sentence 0: {budget.AUDIO_FULL_MESSAGE}"]
    assert budget.held() == start  # the collected audio was given back
    settings.PROCESS_BUFFER_BUDGET = start + 64 * MiB
    await comm.send_json_to({"type": "input.text", "text": "Now it fits."})
    await comm.send_json_to({"type": "input.done"})
    done = await receive_until_done(comm)
    assert done.errors == [] and done.binary
    await comm.disconnect()
    assert budget.held() == start


@LOCAL
async def test_video_messages_queued_beyond_the_budget_close_the_session(connect, settings, monkeypatch):
    import asyncio
    import threading

    from support.video import b64, frame, jpeg, video

    from omniweb.media import frames

    unblock = threading.Event()
    prepare = frames.prepare_frame

    def slow(text, **kwargs):
        unblock.wait(30)  # the session's processor waits on its first frame's checks
        return prepare(text, **kwargs)

    monkeypatch.setattr(frames, "prepare_frame", slow)
    data = jpeg(width=320, height=240)
    start = budget.held()
    settings.PROCESS_BUFFER_BUDGET = start + int(2.5 * len(b64(data)))  # room for two queued frames
    comm = await video(connect, modalities=["text"], enable_frame_filter=False)
    try:
        for i in range(4):  # one being checked, two queued, the fourth is one too many
            await frame(comm, data, f"f{i}")
        assert await expect_error(comm) == budget.INBOX_FULL_MESSAGE
        await expect_close(comm)
    finally:
        unblock.set()
    await comm.disconnect()
    await asyncio.sleep(0)
    assert budget.held() == start
