"""Cut a streamed answer into speakable sentences as soon as each one is complete.

A thinker writes its answer delta by delta; the talker should start speaking a sentence the moment
it is complete rather than when the whole answer is. A sentence is complete once the text after it
proves the boundary (hibari's rule needs the next non-space character: "Dr. Smith" or "3.5" must not
be cut), or when the answer ends. The pieces are cut by the voice's own splitter (``omniweb.engine.voice``) so
it sees exactly the sentences it would see for the whole answer at once.
"""

from __future__ import annotations

import re

from hibari.tts import _SENT_END, _ends_sentence

from omniweb.engine.voice import voice

_LINE_BREAK = re.compile(r"\n\s*(?=\S)")
_CLAUSE_END = re.compile(r"[,;:]\s+(?=\S)")
MIN_CLAUSE_WORDS = 4  # a first clause shorter than this waits for its sentence
# Markdown an upstream model may write that the voice should not read out ("**", "#", "`").
_MARKUP = re.compile(r"[*#`_~]+")


def speakable(sentence: str) -> str:
    """The sentence without markdown emphasis/heading/code marks, whitespace collapsed."""
    return " ".join(_MARKUP.sub(" ", sentence).split())


class SentenceStream:
    """Feed answer deltas; get back the sentences that became complete (speakable text).

    With ``first_clause`` the answer's first piece may be a clause (cut at a comma, semicolon or
    colon after a few words): a language model writes a sentence in a second or more, and its first
    clause can be in the talker well before its full stop. Later pieces are whole sentences, which
    the voice phrases better."""

    def __init__(self, first_clause: bool = False) -> None:
        self._pending = ""
        self._first_clause = first_clause

    def feed(self, delta: str) -> list[str]:
        self._pending += delta
        cut = _last_boundary(self._pending)
        if cut == 0 and self._first_clause:
            cut = _first_clause_end(self._pending)
        if cut == 0:
            return []
        self._first_clause = False
        done, self._pending = self._pending[:cut], self._pending[cut:]
        return _pieces(done)

    def flush(self) -> list[str]:
        """The answer ended: whatever is left is the last sentence(s)."""
        done, self._pending = self._pending, ""
        return _pieces(done)


def _last_boundary(text: str) -> int:
    """Offset just after the last proven sentence or line boundary in ``text`` (0: none yet)."""
    cut = 0
    for m in _SENT_END.finditer(text):
        if _ends_sentence(text, m.start(), text[m.end()]):
            cut = m.end()
    for m in _LINE_BREAK.finditer(text):
        cut = max(cut, m.end())
    return cut


def _first_clause_end(text: str) -> int:
    """Offset just after the first clause of at least ``MIN_CLAUSE_WORDS`` words (0: none yet)."""
    for m in _CLAUSE_END.finditer(text):
        if len(text[: m.start()].split()) >= MIN_CLAUSE_WORDS:
            return m.end()
    return 0


def _pieces(text: str) -> list[str]:
    return [s for piece in voice().sentences(text) if (s := speakable(piece))]
