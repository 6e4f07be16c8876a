"""The conversation so far, as the thinker reads it: user and assistant messages, oldest first."""

from __future__ import annotations

from typing import Literal

Role = Literal["user", "assistant"]


class History:
    """The last ``max_turns`` question/answer pairs (older ones are forgotten)."""

    def __init__(self, max_turns: int) -> None:
        self.max_turns = max(0, max_turns)
        self._messages: list[dict[str, str]] = []

    def __len__(self) -> int:
        return len(self._messages)

    def messages(self) -> list[dict[str, str]]:
        """A copy, ``[{"role", "content"}]``, in the engine request's shape."""
        return [dict(m) for m in self._messages]

    def remember(self, question: str, answer: str) -> None:
        self._messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        del self._messages[: max(0, len(self._messages) - 2 * self.max_turns)]

    def clear(self) -> None:
        self._messages.clear()
