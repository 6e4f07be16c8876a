"""speech.tts.text: text splitting, and word timings from hibari's durations (no Django)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import onnx
import onnxruntime
import pytest
from hibari import Hibari

from speech.tts.text import DURATION_UNIT_MS, align_words, bound_units, split_text

DURATIONS = "/Cast_32_output_0"
FOX = "The quick brown fox jumps over the lazy dog."
NUMBERS = "On the 3rd of March 2024, 1,250 people paid $9.99 each."


# -- split_text ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Dr. Smith arrived. Is it late? Yes! Go.",
            ["Dr. Smith arrived.", "Is it late?", "Yes!", "Go."],
        ),
        (
            "J. K. Rowling wrote it. Mr. Lee read it.",
            ["J. K. Rowling wrote it.", "Mr. Lee read it."],
        ),
        ("Really?! no way.", ["Really?! no way."]),
        ("  Line one\nLine two  ", ["Line one", "Line two"]),
        ("Para one.\n\n\nPara two.", ["Para one.", "Para two."]),
        ("No end punctuation", ["No end punctuation"]),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_text(text, "sentence") == expected
    assert split_text(text, "sentence") == [s.strip() for s in Hibari.split_sentences(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("First, we eat; then: we sleep.", ["First,", "we eat;", "then:", "we sleep."]),
        ("We wait — maybe… or not – ok.", ["We wait —", "maybe…", "or not –", "ok."]),
        (
            "On 7:30, 1,250 people came. Dr. Who, hi!",
            ["On 7:30,", "1,250 people came.", "Dr. Who,", "hi!"],
        ),
        ("Well , , hello", ["Well , ,", "hello"]),
        ("— wait, what", ["— wait,", "what"]),
        ("Hello. ... World", ["Hello. ...", "World"]),
        ("... Hi there.", ["... Hi there."]),
        ("no-break—here,right", ["no-break—here,right"]),
    ],
)
def test_split_clauses(text: str, expected: list[str]) -> None:
    pieces = split_text(text, "clause")
    assert pieces == expected
    assert all(p == p.strip() and any(c.isalnum() for c in p) for p in pieces)
    assert " ".join(pieces).split() == text.split()


def test_split_none_and_blank() -> None:
    assert split_text("  One. Two?\n", "none") == ["One. Two?"]
    for granularity in ("sentence", "clause", "none"):
        assert split_text("", granularity) == []
        assert split_text(" \n\t ", granularity) == []
    with pytest.raises(ValueError):
        split_text("x", "word")  # type: ignore[arg-type]


# -- align_words: arithmetic on hand-made segments -------------------------------------

VOCAB = {c: i for i, c in enumerate(" .,ˈabcdxyz", start=1)}


def fake_g2p(word: str) -> str:
    return {"ab": "ˈab", "cd": "cd.", "two": "ab cd", "x": "x", "-": ""}.get(word.strip(".,"), word)


def test_align_arithmetic_one_segment() -> None:
    # ids: pad ˈ a b ␣ c d . pad ('?' is not in the vocab); only a b c d are matched.
    out = align_words("ab cd.", [("ˈab c?d.", [4, 1, 1, 2, 1, 2, 3, 5, 1])], VOCAB, fake_g2p)
    # units: ˈ 4..5, a 5..6, b 6..8, space 8..9, c 9..11, d 11..14 (25 ms each)
    assert out == [
        {"word": "ab", "start_ms": 125, "end_ms": 200},
        {"word": "cd.", "start_ms": 225, "end_ms": 350},
    ]


def test_align_segments_offsets_and_unmatched() -> None:
    segments = [("ab", [2, 1, 1, 3]), ("cd x", [4, 2, 2, 1, 2, 1])]
    out = align_words("two - x", segments, VOCAB, fake_g2p)
    # second segment starts at 7 units; c = 7+4, d ends 7+8; x = 7+9 .. 7+11
    assert out == [
        {"word": "two", "start_ms": 50, "end_ms": 375},
        {"word": "-", "start_ms": 375, "end_ms": 375},
        {"word": "x", "start_ms": 400, "end_ms": 450},
    ]
    assert align_words("", segments, VOCAB, fake_g2p) == []
    assert align_words("ab cd", [], VOCAB, fake_g2p) == [
        {"word": "ab", "start_ms": 0, "end_ms": 0},
        {"word": "cd", "start_ms": 0, "end_ms": 0},
    ]


def test_align_substitution_shares_time() -> None:
    # The model said "az", the word alone reads "ab": the substitute takes z's time.
    out = align_words("ab", [("az", [1, 2, 4, 1])], VOCAB, fake_g2p)
    assert out == [{"word": "ab", "start_ms": 25, "end_ms": 175}]


# -- align_words on the real model -----------------------------------------------------


@dataclass
class Model:
    tts: Hibari
    sess: onnxruntime.InferenceSession

    def segments(self, sentence: str) -> list[tuple[str, list[int]]]:
        out = []
        for ps in self.tts.phonemize(sentence):
            feeds = {
                "ids": np.asarray([self.tts.ids(ps)], np.int64),
                "speed": np.asarray([1.0], np.float32),
            }
            (durations,) = self.sess.run([DURATIONS], feeds)
            out.append((ps, np.asarray(durations).reshape(-1).tolist()))
        return out


@pytest.fixture(scope="module")
def model() -> Model:
    tts = Hibari()
    m = onnx.load(tts.model_path)
    m.graph.output.append(onnx.helper.make_tensor_value_info(DURATIONS, onnx.TensorProto.INT64, None))
    sess = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return Model(tts, sess)


def total_ms(segments: list[tuple[str, list[int]]]) -> float:
    return DURATION_UNIT_MS * sum(sum(d) for _, d in segments)


def assert_well_formed(text: str, out: list[dict], total: float) -> None:
    assert [w["word"] for w in out] == text.split()
    starts, ends = [w["start_ms"] for w in out], [w["end_ms"] for w in out]
    assert all(isinstance(x, int) for x in starts + ends)
    assert starts == sorted(starts) and ends == sorted(ends)
    assert all(s <= e for s, e in zip(starts, ends, strict=True))
    assert all(e <= s for e, s in zip(ends, starts[1:], strict=False))  # words don't overlap
    assert starts[0] >= 0 and ends[-1] <= total


def test_durations_match_audio_length(model: Model) -> None:
    """The premise: the segment's audio is 600 samples per duration unit, all ids."""
    ((ps, durations),) = model.segments(FOX)
    ids = model.tts.ids(ps)
    assert len(durations) == len(ids)
    assert len(model.tts.from_ids(ids, rng=np.random.default_rng(0))) == 600 * sum(durations)


def test_align_fox(model: Model) -> None:
    segments = model.segments(FOX)
    out = align_words(FOX, segments, model.tts.vocab, model.tts.g2p)
    total = total_ms(segments)
    assert_well_formed(FOX, out, total)
    ((_, durations),) = segments
    # "The" starts right after the leading pad's silence (325 ms, "heart" voice).
    assert out[0]["start_ms"] == DURATION_UNIT_MS * durations[0]
    assert 250 <= out[0]["start_ms"] <= 450
    # "dog." ends where the final "." pause and the trailing pad begin.
    assert out[-1]["end_ms"] == total - DURATION_UNIT_MS * (durations[-1] + durations[-2])
    assert all(40 <= w["end_ms"] - w["start_ms"] <= 700 for w in out)
    assert all(w["end_ms"] < n["start_ms"] for w, n in pairwise(out))  # a space's time between words


def test_align_numbers(model: Model) -> None:
    segments = model.segments(NUMBERS)
    out = align_words(NUMBERS, segments, model.tts.vocab, model.tts.g2p)
    assert_well_formed(NUMBERS, out, total_ms(segments))
    spans = {w["word"]: w["end_ms"] - w["start_ms"] for w in out}
    for word in ("3rd", "2024,", "1,250", "$9.99"):
        assert spans[word] >= 150, (word, spans)
    # several phoneme words each: far longer than a short plain word
    for word in ("2024,", "1,250", "$9.99"):
        assert spans[word] > 2 * spans["people"], (word, spans)


def test_align_context_differences(model: Model) -> None:
    """Words read differently alone ("the" before a vowel, "Dr.", "pm") still get
    real spans; "—" gets none."""
    text = "Dr. Smith met J. K. Rowling at 7:30 pm — really, the end!"
    segments = model.segments(text)
    out = align_words(text, segments, model.tts.vocab, model.tts.g2p)
    assert_well_formed(text, out, total_ms(segments))
    for w in out:
        assert (w["end_ms"] == w["start_ms"]) == (w["word"] == "—"), w


def test_align_across_segments(model: Model) -> None:
    text = (
        "Although the committee met on the 14th of February, 2025, it was not until "
        "3:45 pm that Dr. Alvarez, who had flown in from Lisbon at a cost of "
        "$1,249.50, finally presented the 27-page report; nobody, least of all the 12 "
        "junior analysts, had expected its conclusions to be quite so blunt, or so "
        "widely quoted afterwards."
    )
    segments = model.segments(text)
    assert len(segments) > 1
    out = align_words(text, segments, model.tts.vocab, model.tts.g2p)
    total = total_ms(segments)
    assert_well_formed(text, out, total)
    first = DURATION_UNIT_MS * sum(segments[0][1])
    assert out[-1]["start_ms"] > first and out[-1]["end_ms"] > total - 1000
    assert all(w["end_ms"] > w["start_ms"] for w in out)


def test_align_a_long_sentence_of_mixed_words(model: Model) -> None:
    """Thirty-odd words with numbers, money, dates and abbreviations in one sentence: every word
    gets its span, in order, within the sentence's audio (how fast: a bench's business)."""
    text = (
        "The quick brown fox jumps over the lazy dog while 1,250 people paid "
        "$9.99 each on the 3rd of March 2024, and Dr. Smith, who was late, said the "
        "end is near."
    )
    assert len(text.split()) >= 30
    segments = model.segments(text)
    cache = {w: model.tts.g2p(w) for w in text.split()}
    out = align_words(text, segments, model.tts.vocab, cache.__getitem__)
    assert_well_formed(text, out, total_ms(segments))
    assert out == align_words(text, segments, model.tts.vocab, model.tts.g2p)  # the cache changes nothing


# -- the talker's step bound (issue #11) ---------------------------------------------------------


def test_bound_units_cuts_overlong_text_at_clauses_then_words():
    clauses = "first part here, second part here, third part"
    assert bound_units([clauses], 34, 20) == ["first part here, second part here,", "third part"]
    words = " ".join(["blue"] * 800)  # 3,999 characters, no clause mark at all
    pieces = bound_units([words], 1500, 300)
    assert all(len(p) <= 300 for p in pieces) and len(pieces) == 14
    assert " ".join(pieces) == words  # nothing lost, every cut between words
    assert bound_units(["x" * 25], 10, 10) == ["x" * 10, "x" * 10, "x" * 5]  # one word longer than the bound
    # Punctuated sentences within the bound stay whole (hibari cuts them into model calls itself).
    long_but_punctuated = ", ".join(["the dog and the cat walked along the bank"] * 12) + "."
    assert bound_units([long_but_punctuated], 1500, 300) == [long_but_punctuated]
    assert bound_units(["Short. ", "Also short."], 1500, 300) == ["Short. ", "Also short."]
    # A long run between two clauses: its word cuts are never joined to a neighbour.
    mixed = "a short clause, " + " ".join(["red"] * 100) + ", and another"
    out = bound_units([mixed], 1500, 120)
    assert out[0] == "a short clause," and out[-1] == "and another" and all(len(p) <= 120 for p in out[1:-1])
