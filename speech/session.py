"""One ``/v1/audio/speech/stream`` session's wire state over the conversation core, without a socket.

The consumer parses the socket's messages and hands them here in order; ``SpeechSession`` turns each
into calls on the core's ``Conversation`` (its state machine, and the one turn that may run) and
writes what the wire says back through ``send``: the errors a message earns, ``input.cancelled``,
the ``session.done`` of a flush with nothing to say. An utterance is the core's ``SpeechTurn`` (one
engine request per batch of pieces, paced, the noise generator carried across requests) run as the
session's turn, whose events one ``Utterance`` (speech/utterances.py) writes. ``send`` is the only
way to the client, so the tests drive a session without a socket.

The shape of an utterance on the wire follows ``split_granularity``. ``none`` (the default, as the
reference) makes the flush one sentence: one ``audio.start``, the audio, one ``audio.done``, while
the engine still synthesizes it sentence by sentence, so first audio does not wait for the whole
text. ``sentence`` and ``clause`` send each piece as its own sentence and start speaking a piece as
soon as its text is complete, before ``input.done`` (the utterance then runs as one engine request
per batch of completed pieces, with the noise generator carried from one request to the next).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from django.conf import settings

from omniweb.base import budget
from omniweb.base.errors import ErrorKind
from omniweb.base.protocol import excerpt
from omniweb.conversation import Conversation, ConversationState, SpeechTurn
from omniweb.engine.client import EngineClient
from omniweb.engine.requests import CodecOutput, FramesScope, SpeakRequest
from omniweb.media.containers import encoding_cost

from . import protocol
from .codec.loops import CODEC_PIPELINE, shared_codec
from .codec.model import CodecTableError
from .protocol import ProtocolError, SessionConfig
from .tts.loops import PIPELINE
from .tts.model import capabilities
from .tts.text import split_text
from .utterances import Utterance

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any] | bytes], Awaitable[None]]
Fail = Callable[[str, ErrorKind], Awaitable[None]]


class SpeechSession:
    """The session's state as this wire format sees it; one handler per client message type.

    ``send`` writes a JSON message or a binary frame to the client; ``share`` is the session's part
    of the process budget (buffered text, a file's audio); ``stopped`` says the client can no longer
    be written to (the utterance's engine request is then aborted); ``fail`` sends a fatal error and
    ends the session, ``end`` ends it (``session.close``); ``touch`` restarts the idle clock (audio
    is being made); ``resume`` is called once an utterance is over in a session still open (the
    idle clock restarts, the messages held meanwhile are handled)."""

    def __init__(
        self,
        engine: EngineClient,
        send: Send,
        *,
        share: budget.SessionShare,
        stopped: Callable[[], bool],
        fail: Fail,
        end: Callable[[], Awaitable[None]],
        touch: Callable[[], None],
        resume: Callable[[], None],
    ) -> None:
        self.send = send
        self.share = share
        self.stopped = stopped
        self.fail = fail
        self.end = end
        self.touch = touch
        self.resume = resume
        self.conversation = Conversation(engine)
        self.caps = capabilities()
        self.config: SessionConfig | None = None
        self.text_parts: list[str] = []
        self.text_chars = 0
        self.utterance_index = 0
        self.utterance: Utterance | None = None

    @property
    def state(self) -> ConversationState:
        """READY (configured; buffering text or idle), SPEAKING (sentence/clause: completed pieces
        are spoken while the client still writes), ANSWERING (flushed: the rest of the utterance is
        synthesized and streamed), AWAITING_CONFIG and CLOSED: the core's states."""
        return self.conversation.state

    @property
    def streaming(self) -> bool:
        """Audio is being made for the client (no idle timeout: it has nothing to say meanwhile)."""
        if self.state is ConversationState.ANSWERING:
            return True
        utt = self.utterance
        return self.state is ConversationState.SPEAKING and utt is not None and utt.speech.streaming

    def release(self) -> None:
        """Drop the buffered text and the utterance (its callbacks refer to the session), so a
        closed session is freed without the cyclic collector."""
        self.text_parts.clear()
        self.utterance = None

    async def handle(self, msg: dict[str, Any]) -> None:
        """One parsed client message, in arrival order."""
        msg_type = msg.get("type")
        if msg_type == "session.config":
            await self.on_session_config(msg)
        elif self.config is None:
            await self.fail(f"Expected session.config, got: {excerpt(msg_type)}", ErrorKind.CLIENT)
        elif msg_type == "input.text":
            await self.on_input_text(msg)
        elif msg_type == "input.done":
            await self.on_input_done()
        elif msg_type == "input.cancel":
            await self.on_input_cancel()
        elif msg_type == "session.close":
            await self.on_session_close()
        else:
            await self.send(protocol.error(f"Unknown message type: {excerpt(msg_type)}"))

    # -- handlers, one per message type ------------------------------------------------------------
    async def on_session_config(self, msg: dict[str, Any]) -> None:
        if self.text_parts or self.state is ConversationState.SPEAKING:
            await self.send(
                protocol.error("session.config cannot be applied while input is buffered; send input.done first")
            )
            return
        try:
            config = protocol.build_config(msg, self.caps)
        except ProtocolError as exc:
            if self.config is None:  # fatal only for the first config; else the old one stays
                await self.fail(exc.message, ErrorKind.CLIENT)
            else:
                await self.send(protocol.error(exc.message))
            return
        self.config = config
        self.conversation.configure()  # READY: the speech endpoint buffers no frames or audio

    async def on_input_text(self, msg: dict[str, Any]) -> None:
        text = msg.get("text", "")
        if not isinstance(text, str):
            await self.send(protocol.error("input.text requires a string value"))
            return
        if self.text_chars + len(text) > settings.SPEECH_MAX_TEXT_CHARS:
            await self.send(
                protocol.error(
                    f"Buffered text would exceed {settings.SPEECH_MAX_TEXT_CHARS} characters; "
                    "send input.done to flush first"
                )
            )
            return
        if not self.share.hold("text", self.text_chars + len(text)):  # all sessions together
            await self.send(protocol.error(budget.TEXT_FULL_MESSAGE, kind=ErrorKind.CAPACITY))
            return
        self.text_parts.append(text)
        self.text_chars += len(text)
        assert self.config is not None
        if self.config.split_granularity != "none":
            await self._speak_completed(self.config)

    async def _speak_completed(self, config: SessionConfig) -> None:
        """Hand every piece whose text is complete to the utterance, starting it if need be.

        A piece is complete once text follows it that the splitter cuts before (a sentence end is
        only known when the next word has begun: "Dr. Smith" is one sentence). The last piece stays
        buffered until more text comes or ``input.done`` flushes it.
        """
        buffered = "".join(self.text_parts)
        pieces = split_text(buffered, config.split_granularity)
        if len(pieces) < 2:
            return
        cut = buffered.rfind(pieces[-1])
        if cut < 0:  # the last piece was rejoined by the splitter: wait for more text
            return
        complete = pieces[:-1]
        if self.utterance is None:
            codec, problem, _ = await self._flush_plan(config)
            if problem is not None:  # reported at input.done, as for a plain flush
                return
            self.text_parts = [buffered[cut:]]
            self.start_utterance(complete, config, codec, input_done=False)
            return
        self.text_parts = [buffered[cut:]]
        self.utterance.speech.add(complete)
        self.utterance.text = f"{self.utterance.text} {' '.join(complete)}"

    async def on_input_done(self) -> None:
        assert self.config is not None
        text = "".join(self.text_parts).strip()
        self.text_parts.clear()
        self.text_chars = 0
        self.share.hold("text", 0)
        config = self.config
        utt = self.utterance
        if utt is not None:  # speaking before the flush: the rest joins the utterance
            pieces = split_text(text, config.split_granularity)
            utt.speech.finish(pieces)
            if pieces:
                utt.text = f"{utt.text} {' '.join(pieces)}"
            self.conversation.input_closed()
            return
        if text:
            codec, problem, kind = await self._flush_plan(config)
            if problem is None:
                pieces = [text] if config.split_granularity == "none" else split_text(text, config.split_granularity)
                self.start_utterance(pieces, config, codec)
                return
            await self.send(protocol.error(problem, kind=kind))
        await self.send(protocol.session_done(self.utterance_index, 0))
        self.utterance_index += 1

    async def _flush_plan(self, config: SessionConfig) -> tuple[dict[str, Any] | None, str | None, ErrorKind]:
        """The codec spec for codec_tokens output (else None), why the flush cannot run (else None),
        and whose fault that is: a codec mode refused because the codec could not be loaded is the
        server's failure."""
        uses_codec = config.output_mode == "codec_tokens" or config.vocoder == "codec"
        spec = await codec_spec() if uses_codec else None
        problem = protocol.flush_precondition_error(config, codec_ready=spec is not None)
        kind = ErrorKind.ENGINE if uses_codec and spec is None else ErrorKind.CLIENT
        return (spec if config.output_mode == "codec_tokens" else None), problem, kind

    async def on_input_cancel(self) -> None:
        if self.utterance is not None:  # while speaking (urgent) or held and handled while speaking
            await self.cancel_utterance()
            return
        self.text_parts.clear()
        self.text_chars = 0
        await self.send(protocol.input_cancelled(self.utterance_index))

    async def on_session_close(self) -> None:
        self.conversation.stop_input()  # the consumer's disconnect then stops the utterance (conversation.close)
        await self.end()

    # -- utterances: the core's speech turn --------------------------------------------------------
    def start_utterance(
        self, pieces: list[str], config: SessionConfig, codec: dict[str, Any] | None = None, *, input_done: bool = True
    ) -> None:
        """Start speaking ``pieces``; ``codec`` (the codec's spec) selects codec_tokens output.

        ``input_done=False``: the client is still writing; more pieces come through ``speech.add``.
        """
        merge = config.split_granularity == "none" and codec is None
        speech = SpeechTurn(
            lambda batch: speak_request(config, batch, merge=merge, codec=codec),
            pieces,
            input_done=input_done,
            # batch priority writes a file: nobody listens meanwhile, so no request waits for playback
            max_ahead_seconds=0.0 if config.priority == "batch" else settings.ENGINE_MAX_AHEAD_SECONDS,
            on_activity=self.touch,  # the idle clock pauses while audio is made
        )
        utt = Utterance(
            send=self.send,
            hold_file_audio=lambda held: self.share.hold("file audio", held),  # all sessions together
            config=config,
            index=self.utterance_index,
            text=" ".join(pieces),
            merge=merge,
            speech=speech,
            codec=codec,
        )
        self.utterance = utt
        self.conversation.start_turn(
            speech,
            lambda turn, event: utt.emit(event),
            stopped=lambda: utt.over or self.stopped(),  # leaving aborts the request
            ended=lambda turn: self._utterance_over(utt),
            input_open=not input_done,
        )

    async def cancel_utterance(self) -> None:
        """``input.cancel``: the core's interrupt, then the utterance ends on the wire as cancelled."""
        utt = self.utterance
        if utt is None or utt.cancelling:
            return
        self.text_parts.clear()
        self.text_chars = 0
        if utt.speech.finished:  # every piece is spoken: a cancel after the last audio is moot
            return
        utt.cancelling = True
        await self.conversation.interrupt()
        if not utt.over and self.config is not None and self.state is not ConversationState.CLOSED:
            await utt.end(cancelled=True)
        await self._utterance_over(utt)

    async def _utterance_over(self, utt: Utterance) -> None:
        """After the utterance, however it ended: the next one, and the messages held meanwhile."""
        if self.utterance is not utt:
            return
        self.utterance = None
        self.share.hold("file audio", 0)
        self.utterance_index += 1
        if self.state is ConversationState.CLOSED:
            return
        if not utt.speech.input_done:
            # Ended before the flush (cancelled or failed): what the client writes next is a new utterance.
            self.text_parts.clear()
            self.text_chars = 0
            self.share.hold("text", 0)
        self.resume()


async def codec_spec() -> dict[str, Any] | None:
    """The codec's description, or None when its table cannot be used (codec modes refused)."""
    try:
        codec = await asyncio.to_thread(shared_codec)  # first use reads and verifies the table
    except CodecTableError:
        logger.exception("codec table unusable: codec modes are refused")
        return None
    return codec.spec()


def speak_request(
    config: SessionConfig, pieces: Sequence[str], *, merge: bool, codec: dict[str, Any] | None
) -> SpeakRequest:
    """The engine request for the next pieces of the utterance (the core adds the noise state)."""
    if config.split_granularity == "none":
        # One sentence on the wire, but synthesized sentence by sentence so the first one plays
        # while the rest is made (codec_tokens keeps one code stream: the talker takes it whole).
        text, split = pieces[0], ("none" if codec is not None else "sentence")
    else:
        # One piece per line: the splitter cuts them exactly where they were cut here.
        text, split = "\n".join(pieces), config.split_granularity
    # Files are encoded on the engine's cores; streamed PCM and codes leave as they are made.
    encoded = not config.stream_audio and codec is None
    delivery = encoding_cost(config.response_format) if encoded else 0.0
    request = protocol.tts_request(text, config, PIPELINE, split=split, delivery=delivery)
    if split == "sentence" and merge:
        # max_new_tokens caps the flush, as one request; one file at the end plays nothing
        # meanwhile, so it is not paced.
        request = replace(request, max_frames_scope=FramesScope.REQUEST, paced=config.stream_audio)
    if codec is not None:
        # As the reference's codec request: no timestamps, no vocoder chunking (nothing is vocoded).
        request = replace(
            request, pipeline=CODEC_PIPELINE, codec_output=CodecOutput.CODES, timestamps=False, first_chunk_frames=None
        )
    elif config.vocoder == "codec":
        request = replace(request, pipeline=CODEC_PIPELINE, codec_output=CodecOutput.PCM)
    return request
