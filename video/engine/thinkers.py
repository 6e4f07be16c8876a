"""The thinker interface: a turn in, the answer out as text deltas, a step at a time.

The thinker loop calls ``start`` once per turn and then ``step`` once per engine step until the run
is ``done``, so the scheduler can interleave turns with other work and drop a turn between any two
steps. Two implementations, chosen by ``OMNIWEB_THINKER``: ``scene`` (offline: the perception
models and OpenCV measure the frames, ``answers`` words what they found) and ``llm`` (``llm.py``: a
language model, given the same observations as text, that may also call the client's functions).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from omniweb.engine.requests import FunctionTool, HistoryEntry, ToolChoice
from omniweb.llm.chat import Piece

from . import answers, perception, scene

WORDS_PER_DELTA = 4  # the scene thinker streams each sentence in deltas of a few words


@dataclass(frozen=True)
class Frame:
    frame_id: str | None
    data: bytes  # JPEG/PNG as received (the transport has checked that it decodes)
    pts_ms: float | None


@dataclass(frozen=True)
class Turn:
    """What a thinker answers: the question, the sampled frames (oldest first) and the conversation."""

    question: str  # "" means: say what you see
    frames: list[Frame]
    history: list[dict[str, Any]] = field(default_factory=list)  # the words only: [{"role", "content"}]
    system_prompt: str | None = None
    model: str | None = None
    entries: tuple[HistoryEntry, ...] = ()  # the whole history, function calls and outputs included
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = ToolChoice.AUTO
    tool_name: str | None = None
    parallel_tool_calls: bool = True
    max_tokens: int | None = None


class ThinkerError(Exception):
    """A failure whose message is safe to show the client (no internals, no exception text)."""


class ThinkerRun(Protocol):
    """One turn being answered."""

    @property
    def done(self) -> bool: ...

    @property
    def usage(self) -> tuple[int, int] | None:
        """The model's (prompt, completion) token counts; None where no model answered."""
        ...

    def step(self) -> list[Piece]:
        """The next text deltas and whole function calls ([] is allowed while waiting); raises ``ThinkerError``."""
        ...

    def close(self) -> None:
        """Release what the run holds (an upstream HTTP stream); safe to call twice."""
        ...


@runtime_checkable
class WaitableRun(Protocol):
    """A run whose text comes from outside (an HTTP stream): the loop waits for it, holding no worker."""

    def pending(self) -> bool:
        """True while a step would find nothing new."""
        ...

    def subscribe(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` (from any thread) once a step would find something; at once if it would now."""
        ...


class Thinker(Protocol):
    name: str
    language_model: bool  # it generates: instructions, tools and clause-by-clause speech apply

    def start(self, turn: Turn) -> ThinkerRun:
        """Begin a turn; runs on an engine worker (it may block briefly, e.g. to connect)."""
        ...


class SceneThinker:
    """Answers from what the perception models and measures found in the frames; nothing is guessed.

    ``system_prompt`` has no effect here: the answers are composed from observations, not generated.
    """

    name = "scene"
    language_model = False

    def __init__(self) -> None:
        self.perception = perception.shared()  # models loaded once per engine process
        scene.warm_up(self.perception)  # first-call costs paid before the first request

    def start(self, turn: Turn) -> SceneRun:
        return SceneRun(turn, self.perception)


class SceneRun:
    """Step 1 measures the frames and streams the first sentence; each later step streams one more."""

    def __init__(self, turn: Turn, models: perception.Perception) -> None:
        self._turn = turn
        self._models = models
        self._sentences: deque[str] | None = None
        self._first = True

    @property
    def done(self) -> bool:
        return self._sentences is not None and not self._sentences

    @property
    def usage(self) -> None:
        return None

    def step(self) -> list[Piece]:
        if self._sentences is None:
            turn = self._turn
            measured = scene.analyse(
                [f.data for f in turn.frames],
                [f.pts_ms for f in turn.frames],
                perception=self._models,
                models=answers.models_for(turn.question, turn.history),
                read=answers.needs_reading(turn.question, turn.history),
            )
            self._sentences = deque(answers.answer(turn.question, turn.history, measured))
        if not self._sentences:
            return []
        sentence = self._sentences.popleft()
        if not self._first:
            sentence = " " + sentence  # the answer's text is the sentences joined by spaces
        self._first = False
        words = sentence.split(" ")
        return [
            " ".join(words[i : i + WORDS_PER_DELTA]) + (" " if i + WORDS_PER_DELTA < len(words) else "")
            for i in range(0, len(words), WORDS_PER_DELTA)
        ]

    def close(self) -> None:
        self._sentences = deque()
