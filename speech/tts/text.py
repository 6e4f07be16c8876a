"""Text helpers for streaming TTS: the units text is synthesized in, and word timings.

Pure functions (no I/O, no model) so the server, tests and benchmarks share them. They
follow hibari-tts 0.2.1 (its sentence split, phoneme alphabet and duration units).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from difflib import SequenceMatcher
from itertools import accumulate
from typing import Literal, SupportsInt, TypedDict

from hibari.tts import _SENT_END, _ends_sentence

Granularity = Literal["sentence", "clause", "none"]

# A clause ends at , ; : or a dash/ellipsis then whitespace ("1,250" stays whole).
_CLAUSE_BREAK = re.compile(r"(?<=[,;:—–…])\s+")
_ALNUM = re.compile(r"[^\W_]")
# What hibari's sentence split drops after . ! ? …: closing quotes and brackets (never spoken).
_CLOSERS_AT_END = re.compile(r"(?<=[.!?…])[\"”’)\]]+$")

# One predicted duration unit is 2 acoustic frames = 600 samples at 24 kHz.
DURATION_UNIT_MS = 25.0
# Vocab characters that are not sounds of a word: stress, punctuation (pauses), arrows.
_NOT_PHONE = frozenset(';:,.!?—…"()“”ˈˌ↓→↗↘')


class WordTiming(TypedDict):
    word: str
    start_ms: int
    end_ms: int


# -- splitting -------------------------------------------------------------------------


def split_text(text: str, granularity: Granularity) -> list[str]:
    """Cut text into the units the server synthesizes one at a time, as the client wrote them.

    "sentence" cuts where hibari's own splitter does (so synthesizing sentence by sentence
    equals its one-shot call) but keeps closing quotes with their sentence; "clause" cuts each
    sentence further for lower first-audio latency; "none" keeps the text whole. Pieces with
    nothing to say ("...") join a neighbour; text with nothing to say at all gives no pieces.
    """
    if not text or not text.strip():
        return []
    if granularity == "none":
        return [text.strip()] if _ALNUM.search(text) else []
    sentences = _sentences(text)
    if granularity == "sentence":
        return _merge_speechless(sentences)
    if granularity == "clause":
        return _merge_speechless([piece for s in sentences for piece in _split_clauses(s)])
    raise ValueError(f"unknown granularity {granularity!r}")


def bound_units(pieces: list[str], max_chars: int, max_run: int) -> list[str]:
    """The same text with every piece bounded: what the talker synthesizes in one step.

    The voice model runs a piece at once. hibari cuts a long piece at its clause marks into model
    calls of bounded size, but a run of text without one stays a single call whose time and memory
    grow with it (an unpunctuated 4,000-character sentence: one 9 s step, +1 GB). So a piece is cut
    when it is longer than ``max_chars`` in all, or holds a clause longer than ``max_run``: at
    clause marks first (packing clauses up to ``max_chars``), then between words (up to
    ``max_run``); only a single word longer than ``max_run`` is cut inside. Other pieces, the
    ordinary case, are returned unchanged.
    """
    if not 1 <= max_run <= max_chars:
        raise ValueError("need 1 <= max_run <= max_chars")
    out: list[str] = []
    for piece in pieces:
        clauses = _split_clauses(piece) if len(piece) > max_run else [piece]
        if len(piece) <= max_chars and all(len(c) <= max_run for c in clauses):
            out.append(piece)
            continue
        packed: list[str] = []  # whole clauses, joined while they fit in max_chars
        for clause in clauses:
            if len(clause) <= max_run:
                packed.append(clause)
                continue
            # A clause cut between words: each cut is a piece of its own (joined to a neighbour it
            # would again be a run longer than max_run without a clause mark).
            out.extend(_pack(packed, max_chars))
            packed = []
            words = [w[i : i + max_run] for w in clause.split() for i in range(0, len(w), max_run)]
            out.extend(_pack(words, max_run))
        out.extend(_pack(packed, max_chars))
    return out


def _pack(parts: list[str], max_chars: int) -> list[str]:
    """Join consecutive parts with spaces while the result stays within ``max_chars``."""
    out: list[str] = []
    for part in parts:
        if out and len(out[-1]) + 1 + len(part) <= max_chars:
            out[-1] = f"{out[-1]} {part}"
        else:
            out.append(part)
    return out


def model_text(piece: str) -> str:
    """The piece as hibari's splitter hands it to the model (closing quotes after the end dropped)."""
    return _CLOSERS_AT_END.sub("", piece)


def _sentences(text: str) -> list[str]:
    """hibari's ``Hibari.split_sentences`` boundaries, keeping the closers its split drops."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n|\n", text.strip()):
        para, cut = para.strip(), 0
        for m in _SENT_END.finditer(para):
            if _ends_sentence(para, m.start(), para[m.end()]):
                out.append(para[cut : m.end()])
                cut = m.end()
        out.append(para[cut:])
    return [s.strip() for s in out if s.strip()]


def _split_clauses(sentence: str) -> list[str]:
    """Clauses of a sentence; punctuation-only pieces join a neighbour, never alone."""
    bounds: list[tuple[int, int]] = []
    start = 0
    for m in _CLAUSE_BREAK.finditer(sentence):
        bounds.append((start, m.start()))
        start = m.end()
    bounds.append((start, len(sentence)))
    merged: list[tuple[int, int]] = []
    # start of leading speechless pieces waiting for the next real clause
    pending: int | None = None
    for a, b in bounds:
        if not _ALNUM.search(sentence[a:b]):
            if merged:
                merged[-1] = (merged[-1][0], b)
            elif pending is None:
                pending = a
            continue
        merged.append((a if pending is None else pending, b))
        pending = None
    if not merged:  # nothing speakable: one piece, for _merge_speechless to place
        return [sentence.strip()] if sentence.strip() else []
    # Slicing the original sentence keeps its own whitespace inside merged pieces.
    return [p for a, b in merged if (p := sentence[a:b].strip())]


def _merge_speechless(pieces: list[str]) -> list[str]:
    """Attach speechless sentences ("...") to the previous piece (next when first)."""
    out: list[str] = []
    pending = ""
    for piece in pieces:
        if not _ALNUM.search(piece):
            if out:
                out[-1] = f"{out[-1]} {piece}"
            else:
                pending = f"{pending} {piece}" if pending else piece
            continue
        out.append(f"{pending} {piece}" if pending else piece)
        pending = ""
    return out  # nothing speakable anywhere: nothing to synthesize


# -- word timestamps -------------------------------------------------------------------

# (start, end) in duration units from the start of the sentence's audio
Span = tuple[float, float]


def align_words(
    text: str,
    segments: Sequence[tuple[str, Iterable[SupportsInt]]],
    vocab: dict[str, int],
    g2p: Callable[[str], str],
) -> list[WordTiming]:
    """Time every whitespace-separated word of ``text`` from the model's own durations.

    ``segments`` are (phoneme string, durations) pairs in playback order, one
    duration per id of ``[0, *in-vocab chars, 0]``. Each client word is phonemized
    alone with ``g2p`` and aligned to the segments' phonemes (stress and punctuation
    ignored), so words that read as several phoneme words ("1,250", "$9.99") or
    differently in context ("the": ðə/ði) still get their own span. Times are ms from
    the start of the sentence's audio; a word that matches nothing gets a zero-length
    span where the previous word ended.
    """
    words = text.split()
    if not words:
        return []

    seg_tokens, seg_times, speech_start = _segment_phones(segments, vocab)
    cli_tokens, cli_word = _word_phones(words, vocab, g2p)
    seg_key, cli_key = "".join(seg_tokens), "".join(cli_tokens)

    spans: list[Span | None]
    if seg_key == cli_key:
        # usual case: the per-word phonemes line up one-to-one with the sentence's
        spans = list(seg_times)
    else:
        spans = [None] * len(cli_key)
        seg_off = list(accumulate(map(len, seg_tokens), initial=0))
        cli_off = list(accumulate(map(len, cli_tokens), initial=0))
        # Align phoneme words first (cheap, and stray single-phone matches can't jump
        # across the sentence), then characters inside each region that differs.
        matcher = SequenceMatcher(None, seg_tokens, cli_tokens, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            a0, a1, b0, b1 = seg_off[i1], seg_off[i2], cli_off[j1], cli_off[j2]
            if tag == "equal":
                spans[b0:b1] = seg_times[a0:a1]
            elif tag != "delete":
                spans[b0:b1] = _align_chars(seg_key[a0:a1], seg_times[a0:a1], cli_key[b0:b1])

    first: list[float | None] = [None] * len(words)
    last: list[float | None] = [None] * len(words)
    for w, span in zip(cli_word, spans, strict=True):
        if span is None:
            continue
        if first[w] is None:
            first[w] = span[0]
        last[w] = span[1]

    out: list[WordTiming] = []
    prev_end = speech_start
    for w, word in enumerate(words):
        start, end = first[w], last[w]
        if start is None or end is None:
            start = end = prev_end
        start = max(start, prev_end)
        end = max(end, start)
        out.append({"word": word, "start_ms": _ms(start), "end_ms": _ms(end)})
        prev_end = end
    return out


def _ms(units: float) -> int:
    return round(units * DURATION_UNIT_MS)


def _phones(ps: str, vocab: dict[str, int]) -> str:
    """The sounding characters of a phoneme string: what both sides are compared on."""
    return "".join(c for c in ps if c in vocab and c not in _NOT_PHONE and not c.isspace())


def _segment_phones(
    segments: Sequence[tuple[str, Iterable[SupportsInt]]], vocab: dict[str, int]
) -> tuple[list[str], list[Span], float]:
    """Phoneme words of all segments, a span per kept character, where speech starts.

    A character's id index is 1 + the in-vocab characters before it (the leading pad is
    id 0), as ``Hibari.ids`` builds the model input, so its span is
    [sum(durations[:index]), sum(durations[:index + 1])) plus the earlier segments.
    """
    tokens: list[str] = []
    times: list[Span] = []
    offset = 0.0
    speech_start: float | None = None
    for ps, durations in segments:
        cum = list(accumulate((int(d) for d in durations), initial=0))
        n = len(cum) - 1
        if speech_start is None and n:
            speech_start = offset + cum[1]
        index = 1
        tok: list[str] = []
        for c in ps:
            if c.isspace():
                if tok:
                    tokens.append("".join(tok))
                    tok = []
            elif c in vocab and c not in _NOT_PHONE:
                tok.append(c)
                times.append((offset + cum[min(index, n)], offset + cum[min(index + 1, n)]))
            if c in vocab:
                index += 1
        if tok:
            tokens.append("".join(tok))
        offset += cum[-1]
    return tokens, times, speech_start or 0.0


def _word_phones(words: list[str], vocab: dict[str, int], g2p: Callable[[str], str]) -> tuple[list[str], list[int]]:
    """Phoneme words of each client word on its own, and each kept character's word."""
    cache: dict[str, list[str]] = {}
    tokens: list[str] = []
    owner: list[int] = []
    for w, word in enumerate(words):
        toks = cache.get(word)
        if toks is None:
            toks = cache[word] = [t for p in (g2p(word) or "").split() if (t := _phones(p, vocab))]
        for t in toks:
            tokens.append(t)
            owner.extend([w] * len(t))
    return tokens, owner


def _align_chars(seg: str, seg_times: Sequence[Span], cli: str) -> list[Span | None]:
    """Spans for the client characters of one differing region; unmatched ones get None.

    Substituted runs share the time of the segment run they replace in proportion,
    which keeps the mapping monotonic and non-overlapping.
    """
    out: list[Span | None] = [None] * len(cli)
    if not seg:
        return out
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, seg, cli, autojunk=False).get_opcodes():
        if tag == "equal":
            out[j1:j2] = seg_times[i1:i2]
        elif tag == "replace":
            t0, t1 = seg_times[i1][0], seg_times[i2 - 1][1]
            step = (t1 - t0) / (j2 - j1)
            out[j1:j2] = [(t0 + k * step, t0 + (k + 1) * step) for k in range(j2 - j1)]
    return out
