"""The turn runner: one question about the latest frames in, typed events out.

``run_turn`` waits for the chosen frames' decodes, picks the frames the thinker sees, submits one
``video.turn`` engine request (thinker → talker → vocoder) and yields, in order: ``FramesSelected``
(or ``NoUsableFrames``, and nothing more), then the request's typed chunks (``chunks.py``), the last
one a ``TurnEnd`` with the whole answer and its ``Usage`` (counted by ``usage.py``). It holds no
session state: the history, instructions, modalities and voice come with each ``TurnSpec``, so each
wire format can keep its own conversation (the video endpoint's history, a realtime client's items).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field

from omniweb.base.errors import ErrorKind
from omniweb.engine.client import EngineClient
from omniweb.engine.messages import Status
from omniweb.engine.requests import AnswerRequest, FrameIn, FunctionTool, HistoryEntry, Modality, Role, ToolChoice

from . import usage
from .chunks import AudioChunk, ChunkParser, EngineChunk, TextDelta, ToolCall, Transcript, TurnEnd, Usage
from .frames import BufferedFrame, FrameBuffer, FrameSelection

MODALITIES = ("text", "audio")


def now_ms() -> float:
    """The server clock of every timestamp the core hands out: monotonic milliseconds."""
    return time.monotonic() * 1000.0


@dataclass(frozen=True)
class Question:
    """Text, audio (PCM16 16 kHz mono) or both. With no text the engine first transcribes the audio
    (a ``Transcript`` before any text); with text the audio is not listened to unless ``transcribe``,
    and then what was heard follows the text in the question."""

    text: str = ""
    audio: bytes = b""
    transcribe: bool = False


@dataclass(frozen=True)
class TurnSpec:
    question: Question
    frames: Sequence[BufferedFrame] = ()  # the candidates (a snapshot of the buffer), oldest first
    selection: FrameSelection = field(default_factory=FrameSelection)
    # Oldest first: {"role": "user" | "assistant", "content"} mappings, or ``HistoryEntry``s (which
    # also carry an assistant's function calls and the functions' outputs).
    history: Sequence[Mapping[str, str] | HistoryEntry] = ()
    instructions: str | None = None  # the system prompt (None: the thinker's own)
    tools: Sequence[FunctionTool] = ()  # functions the language model may call
    tool_choice: ToolChoice = ToolChoice.AUTO
    tool_name: str | None = None  # tool_choice FUNCTION: the one to call
    parallel_tool_calls: bool = True
    max_tokens: int | None = None  # the answer's length cap in model tokens (None: the thinker's)
    modalities: tuple[str, ...] = MODALITIES
    voice: str | None = None  # None: the server's default voice
    model: str | None = None
    require_frames: bool = True  # False: a turn may run with no image at all
    # Seconds its first audio may take before the engine refuses it as at capacity (None: the
    # engine's budget). A turn's speaker is already in the session, waiting: refusing drops what
    # they said, so conversations allow more than a new request gets.
    admit_budget: float | None = None
    request_id: str = field(default_factory=lambda: f"turn-{uuid.uuid4().hex[:12]}")

    def run(self, engine: EngineClient) -> AsyncGenerator[TurnEvent, None]:
        """The turn's runner (``Conversation.start_turn`` runs any ``Turn``): ``run_turn``."""
        return run_turn(engine, self)


@dataclass(frozen=True)
class FramesSelected:
    """The frames the thinker is given, once their decodes settled (``*_ms``: ``now_ms`` clock), and
    ``given``: the input side of the turn's ``Usage`` (all its engine request gives the thinker)."""

    frames: tuple[BufferedFrame, ...]
    decoded_ready_ms: float
    selected_ms: float
    given: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class NoUsableFrames:
    """Every candidate frame failed to decode (or there were none): no request was made."""


TurnEvent = FramesSelected | NoUsableFrames | EngineChunk


def engine_request(spec: TurnSpec, frames: Sequence[BufferedFrame]) -> AnswerRequest:
    """The turn's engine request: the question, the frames it looks at, the conversation so far."""
    return AnswerRequest(
        question=spec.question.text,
        audio=spec.question.audio,
        frames=tuple(FrameIn(data=f.data, frame_id=f.frame_id, pts_ms=f.pts_ms) for f in frames),
        history=tuple(_entry(h) for h in spec.history),
        system_prompt=spec.instructions,
        modalities=tuple(Modality(m) for m in spec.modalities),
        voice=spec.voice,
        model=spec.model,
        timestamps="audio" in spec.modalities,  # word timings ride the audio (truncation, captions)
        transcribe=spec.question.transcribe,
        admit_budget=spec.admit_budget,
        tools=tuple(spec.tools),
        tool_choice=spec.tool_choice,
        tool_name=spec.tool_name,
        parallel_tool_calls=spec.parallel_tool_calls,
        max_tokens=spec.max_tokens,
    )


def _entry(message: Mapping[str, str] | HistoryEntry) -> HistoryEntry:
    if isinstance(message, HistoryEntry):
        return message
    return HistoryEntry(role=Role(message["role"]), content=message["content"])


async def run_turn(engine: EngineClient, spec: TurnSpec) -> AsyncGenerator[TurnEvent, None]:
    """Answer one turn (see the module docstring). Closing the generator early (an interrupt)
    abandons the engine request: the engine client aborts a stream it did not read to its end."""
    usable = await FrameBuffer.settle(spec.frames)
    decoded_ready_ms = now_ms()
    if not usable and spec.require_frames:
        yield NoUsableFrames()
        return
    selected = spec.selection.pick(usable) if usable else []
    request = engine_request(spec, selected)
    tally = usage.Tally(usage.given(request, selected))
    yield FramesSelected(tuple(selected), decoded_ready_ms, now_ms(), tally.given)
    parser = ChunkParser()
    transcript: str | None = None
    async with contextlib.aclosing(engine.stream(request, spec.request_id)) as stream:
        async for raw in stream:
            for chunk in parser.feed(raw):
                if isinstance(chunk, Transcript | TextDelta | ToolCall | AudioChunk):
                    tally.add(chunk)
                if isinstance(chunk, Transcript):
                    transcript = chunk.text
                elif isinstance(chunk, TurnEnd):
                    answer = chunk.text if chunk.ok and chunk.text is not None else "".join(tally.text)
                    yield dataclasses.replace(
                        chunk,
                        text=answer,
                        transcript=chunk.transcript if chunk.transcript is not None else transcript,
                        usage=tally.usage(chunk),
                    )
                    return
                yield chunk
    yield TurnEnd(Status.ERROR, ErrorKind.ENGINE, text="".join(tally.text))  # the stream ended without its end
