"""How a turn's tokens are counted: the one rule behind every ``Usage`` omniweb reports (Realtime
``response.done``), whether the turn completed, failed or was cut short.

- **Text**: the language model's own counts where one answered (its prompt and completion tokens,
  from the engine's ``End``); otherwise, and for whatever a turn cut short sent before its model
  said its counts, one token per word or punctuation mark (``text_tokens``).
- **Audio**, by duration, at OpenAI's published rates (its Realtime cost guide): audio heard from
  the user one token per 100 ms, audio spoken by the assistant one per 50 ms (``audio_tokens``).
- **Images**: one token per 32x32-pixel patch, at most 1536 an image (``image_tokens``).

What is counted is what the thinker was given (``given``: the instructions, the whole history with
its function calls and outputs, the tools, the question's text and audio, the frames; then the
transcript of what was heard, which it reads) and what was sent of the answer (``Tally``: its text,
function calls and audio, as they go out). A completed turn has sent its whole answer; a cancelled
one counts what had been sent before the cut, by the same rule.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from omniweb.engine.requests import AnswerRequest

from .chunks import AudioChunk, TextDelta, ToolCall, Transcript, TurnEnd, Usage
from .frames import BufferedFrame

HEARD_MS_PER_TOKEN = 100.0  # the user's audio
SPOKEN_MS_PER_TOKEN = 50.0  # the assistant's audio
PATCH_PIXELS = 32
MAX_IMAGE_TOKENS = 1536
QUESTION_SAMPLE_RATE = 16000  # an ``AnswerRequest``'s audio: PCM16 mono
_TOKEN = re.compile(r"\w+|[^\w\s]")


def text_tokens(text: str) -> int:
    """Text no language model counted: one token per word or punctuation mark."""
    return len(_TOKEN.findall(text))


def audio_tokens(ms: float, *, spoken: bool) -> int:
    """Audio by its duration: the assistant's (``spoken``) one token per 50 ms, the user's one per 100 ms."""
    return math.ceil(ms / (SPOKEN_MS_PER_TOKEN if spoken else HEARD_MS_PER_TOKEN))


def image_tokens(width: int, height: int) -> int:
    return min(MAX_IMAGE_TOKENS, math.ceil(width / PATCH_PIXELS) * math.ceil(height / PATCH_PIXELS))


def given(request: AnswerRequest, frames: Sequence[BufferedFrame]) -> Usage:
    """The input side of a turn's ``Usage``: everything its engine request gives the thinker."""
    texts = [request.system_prompt or "", request.question]
    for entry in request.history:
        texts.append(entry.content)
        texts += [t for call in entry.calls for t in (call.name, call.arguments)]
    texts += [t for tool in request.tools for t in (tool.name, tool.description, tool.parameters)]
    audio_ms = len(request.audio) / 2 / QUESTION_SAMPLE_RATE * 1000.0
    return Usage(
        input_text_tokens=sum(text_tokens(t) for t in texts),
        input_audio_tokens=audio_tokens(audio_ms, spoken=False),
        input_image_tokens=sum(image_tokens(f.width, f.height) for f in frames),
    )


@dataclass
class Tally:
    """One turn's usage as it goes: what its thinker was ``given``, then each piece of the answer
    as it is sent (``add``); ``usage`` counts them, at any point, by the rule above."""

    given: Usage = field(default_factory=Usage)
    heard: list[str] = field(default_factory=list)  # the question's transcript: the thinker reads it
    text: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # function calls' names and arguments
    audio_ms: float = 0.0

    def add(self, event: Transcript | TextDelta | ToolCall | AudioChunk) -> None:
        if isinstance(event, Transcript):
            self.heard.append(event.text)
        elif isinstance(event, TextDelta):
            self.text.append(event.delta)
        elif isinstance(event, ToolCall):
            self.calls += [event.name, event.arguments]
        else:
            self.audio_ms += event.seconds * 1000.0

    def usage(self, end: TurnEnd | None = None) -> Usage:
        """What was given and sent; ``end`` (the turn ended on its own) brings the whole answer's
        text and, where a language model answered, its own counts."""
        answer = "".join(self.text)
        if end is not None and end.ok and end.text is not None:
            answer = end.text
        input_text = self.given.input_text_tokens + sum(text_tokens(t) for t in self.heard)
        output_text = text_tokens(answer) + sum(text_tokens(t) for t in self.calls)
        if end is not None and end.prompt_tokens is not None:
            input_text = end.prompt_tokens
        if end is not None and end.completion_tokens is not None:
            output_text = end.completion_tokens
        return dataclasses.replace(
            self.given,
            input_text_tokens=input_text,
            output_text_tokens=output_text,
            output_audio_tokens=audio_tokens(self.audio_ms, spoken=True),
        )
