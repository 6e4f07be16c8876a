"""The turn runner: one question about the latest frames in, typed events out.

``run_turn`` waits for the chosen frames' decodes, picks the frames the thinker sees, submits one
``video.turn`` engine request (thinker → talker → vocoder) and yields, in order: ``FramesSelected``
(or ``NoUsableFrames``, and nothing more), then the request's typed chunks (``chunks.py``), the last
one a ``TurnEnd`` with the whole answer and its ``Usage``. It holds no session state: the history,
instructions, modalities and voice come with each ``TurnSpec``, so each wire format can keep its own
conversation (the video endpoint's history, a realtime client's items).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field

from omniweb.base.errors import ErrorKind
from omniweb.engine.client import EngineClient
from omniweb.engine.messages import Status
from omniweb.engine.requests import AnswerRequest, FrameIn, FunctionTool, HistoryEntry, ToolChoice

from .chunks import ChunkParser, EngineChunk, TextDelta, Transcript, TurnEnd, Usage
from .frames import BufferedFrame, FrameBuffer, FrameSelection

MODALITIES = ("text", "audio")
INPUT_SAMPLE_RATE = 16000  # the question's PCM16 mono audio
_TOKEN = re.compile(r"\w+|[^\w\s]")


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
    """The frames the thinker is given, once their decodes settled (``*_ms``: ``now_ms`` clock)."""

    frames: tuple[BufferedFrame, ...]
    decoded_ready_ms: float
    selected_ms: float


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
        modalities=tuple(spec.modalities),
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
    return HistoryEntry(role=message["role"], content=message["content"])


def count_text_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def image_tokens(frame: BufferedFrame) -> int:
    return min(1536, math.ceil(frame.width / 32) * math.ceil(frame.height / 32))


def estimate_usage(
    spec: TurnSpec, frames: Sequence[BufferedFrame], answer: str, answer_audio_ms: float, end: TurnEnd | None = None
) -> Usage:
    """A turn's ``Usage``: the language model's own text counts where ``end`` carries them, the
    estimates (``Usage``'s docstring has the rates) for the rest."""
    prompt = [spec.question.text, spec.instructions or "", *(_entry(h).content for h in spec.history)]
    audio_ms = len(spec.question.audio) / 2 / INPUT_SAMPLE_RATE * 1000.0
    input_text = sum(count_text_tokens(t) for t in prompt)
    output_text = count_text_tokens(answer)
    if end is not None and end.prompt_tokens is not None:
        input_text = end.prompt_tokens
    if end is not None and end.completion_tokens is not None:
        output_text = end.completion_tokens
    return Usage(
        input_text_tokens=input_text,
        input_audio_tokens=math.ceil(audio_ms / 100.0),
        input_image_tokens=sum(image_tokens(f) for f in frames),
        output_text_tokens=output_text,
        output_audio_tokens=math.ceil(answer_audio_ms / 50.0),
    )


async def run_turn(engine: EngineClient, spec: TurnSpec) -> AsyncGenerator[TurnEvent, None]:
    """Answer one turn (see the module docstring). Closing the generator early (an interrupt)
    abandons the engine request: the engine client aborts a stream it did not read to its end."""
    usable = await FrameBuffer.settle(spec.frames)
    decoded_ready_ms = now_ms()
    if not usable and spec.require_frames:
        yield NoUsableFrames()
        return
    selected = spec.selection.pick(usable) if usable else []
    yield FramesSelected(tuple(selected), decoded_ready_ms, now_ms())
    parser = ChunkParser()
    text: list[str] = []
    transcript: str | None = None
    async with contextlib.aclosing(engine.stream(engine_request(spec, selected), spec.request_id)) as stream:
        async for raw in stream:
            for chunk in parser.feed(raw):
                if isinstance(chunk, TextDelta):
                    text.append(chunk.delta)
                elif isinstance(chunk, Transcript):
                    transcript = chunk.text
                elif isinstance(chunk, TurnEnd):
                    answer = chunk.text if chunk.ok and chunk.text is not None else "".join(text)
                    yield dataclasses.replace(
                        chunk,
                        text=answer,
                        transcript=chunk.transcript if chunk.transcript is not None else transcript,
                        usage=estimate_usage(spec, selected, answer, parser.audio_ms, chunk),
                    )
                    return
                yield chunk
    yield TurnEnd(Status.ERROR, ErrorKind.ENGINE, text="".join(text))  # the stream ended without its end
