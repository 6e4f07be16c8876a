"""The server's voice, reached by name: what other apps borrow from the app that speaks.

The speech app owns the voice (a talker and a vocoder, the model's sentence splitter, what it can
honour); the video endpoint, the OpenAI endpoints and the health page speak with it too. They do
not import speech: speech registers its ``Voice`` here when Django starts, as it registers its
engine pipelines, and the others ask ``voice()``. ``TEXT_IN`` / ``TEXT_IN_DONE`` are the slots
through which an upstream loop of the same request (a thinker writing an answer) hands the voice's
talker complete sentences as it writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .requests import SpeakingRequest

TEXT_IN = "talker_text"  # slot: list[str], upstream loop → talker
TEXT_IN_DONE = "talker_text_done"  # slot: bool, the upstream loop has appended its last sentence


@dataclass(frozen=True)
class Capabilities:
    """What the loaded voice model can honour; plain data so it can cross process boundaries."""

    model_names: tuple[str, ...]
    voices: tuple[str, ...]
    default_voice: str
    languages: tuple[str, ...]
    response_formats: tuple[str, ...]


class Voice(Protocol):
    def capabilities(self) -> Capabilities:
        """What it can honour (cheap: read from settings and the installed package, no model load)."""
        ...

    def sentences(self, text: str) -> list[str]:
        """``text`` cut where the voice cuts sentences (so speaking them one by one equals speaking
        it whole)."""
        ...

    def speaking_loops(self) -> Sequence[Any]:
        """The engine loops that speak what an upstream loop writes into ``TEXT_IN``, in cascade
        order after it (the talker in incremental mode, then the vocoder); loads the model."""
        ...

    def validate(self, request: SpeakingRequest) -> None:
        """Raise ``ValueError`` (a client-safe message) for settings the voice cannot honour."""
        ...


_voice: Voice | None = None


def register_voice(provider: Voice) -> None:
    """Called once by the app that owns the voice, when Django starts."""
    global _voice
    _voice = provider


def voice() -> Voice:
    if _voice is None:
        raise RuntimeError("no voice is registered (is the speech app installed?)")
    return _voice
