"""The scene thinker's answers: each intent declared once, then composed from the measured scene.

``INTENTS`` is the one table of what the thinker can answer: per intent, the pattern that finds it
in a question (for those a pattern alone finds, checked in the table's order), the perception
models its answer reads, and the function that phrases it (``phrasing.py``). A new intent is an
``Intent`` name and one entry here; ``intents.py`` tells apart the ones that depend on how the
others combine (greetings, follow-ups, descriptions...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import phrasing
from .intents import PEOPLE_WORDS, YES_NO, Intent, intents_for, normalized
from .intents import parse as parse_with
from .scene import FrameStats, Scene

Compose = Callable[[Scene, FrameStats, str, bool], list[str]]

PEOPLE = frozenset({"faces", "pose"})
ALL_MODELS = frozenset({"faces", "pose", "hands", "expression", "objects"})


@dataclass(frozen=True)
class IntentSpec:
    """One intent: how it is found, what its answer reads, and how it is phrased."""

    intent: Intent
    compose: Compose  # (scene, its latest frame, the normalized question, asked yes/no) -> sentences
    models: frozenset[str] = frozenset()  # perception models its answer reads (the text reader: READ)
    pattern: re.Pattern[str] | None = None  # None: recognised in intents.py, by how the others combine


# The order of the patterned entries is the order they are checked and answered; a question may
# match several (each is answered, in this order).
INTENTS: tuple[IntentSpec, ...] = (
    IntentSpec(Intent.GREETING, phrasing.say_greeting),
    IntentSpec(Intent.THANKS, phrasing.say_thanks),
    IntentSpec(
        Intent.READ,
        phrasing.say_read,
        pattern=re.compile(
            r"\b(read|reading|text|written|writing|write|says?|sign|letters?|words?|label|logo|brand|title)\b"
        ),
    ),
    IntentSpec(
        Intent.IDENTITY,
        phrasing.say_identity,
        PEOPLE,
        re.compile(r"\bwho\b|\b(recogni[sz]e|identify|name|how old|age|gender|famous|celebrity)\b"),
    ),
    IntentSpec(
        Intent.EXPRESSION,
        phrasing.say_expression,
        frozenset({"faces", "expression"}),
        re.compile(r"\b(smil\w*|happy|sad|angry|mood|emotions?|feel\w*|express\w*|laugh\w*|crying|upset|tired)\b"),
    ),
    IntentSpec(
        Intent.HANDS,
        phrasing.say_hands,
        PEOPLE | {"hands"},
        re.compile(r"\b(hands?|fingers?|thumbs?|wav\w*|gestur\w*|palms?|fists?|pointing|peace sign|victory)\b"),
    ),
    IntentSpec(
        Intent.POSE,
        phrasing.say_pose,
        PEOPLE,
        re.compile(r"\b(arms?|rais\w*|pose|posture|lean\w*|stand\w*|sit|sitting|seated|lying)\b"),
    ),
    IntentSpec(
        Intent.PEOPLE,
        phrasing.say_people,
        PEOPLE,
        re.compile(
            rf"\b({PEOPLE_WORDS})\b|\bhow many of\b|\b(close|near|far|distance)\b"
            r"|\b(see|spot|notice|find|detect)( \w+)? (me|us)\b|\bwhere am i\b|\bam i (in|visible|there)\b"
        ),
    ),
    IntentSpec(
        Intent.COLOUR,
        phrasing.say_colour,
        PEOPLE | {"hands", "objects"},
        re.compile(r"\b(colou?rs?|colou?red|wearing)\b|\b(" + "|".join(phrasing.COLOURS) + r")\b"),
    ),
    IntentSpec(
        Intent.LIGHT,
        phrasing.say_light,
        pattern=re.compile(r"\b(dark\w*|bright\w*|light\w*|lit|dim|night|day ?light|sunny|shadows?|exposure)\b"),
    ),
    IntentSpec(
        Intent.CHANGE,
        phrasing.say_change,
        PEOPLE,
        re.compile(
            r"\b(chang\w*|mov\w*|motion|happened|different|differ\w*|still|static|moment ago|before|since|"
            r"came|leav\w*|enter\w*|arriv\w*|appear\w*|disappear\w*|walk\w*)\b"
        ),
    ),
    IntentSpec(
        Intent.SHARPNESS,
        phrasing.say_sharpness,
        pattern=re.compile(r"\b(blurr?y|blur|focus\w*|sharp\w*|clear|fuzzy|quality)\b"),
    ),
    IntentSpec(Intent.COUNT_OTHER, phrasing.say_count_other, frozenset({"objects"})),
    IntentSpec(Intent.OBJECT, phrasing.say_object, PEOPLE | {"objects"}),
    IntentSpec(Intent.DESCRIBE, phrasing.say_describe, ALL_MODELS),
    IntentSpec(Intent.FOLLOW_UP, phrasing.say_describe, ALL_MODELS),
    IntentSpec(Intent.UNKNOWN, phrasing.say_unknown, ALL_MODELS),
)
_SPECS = {spec.intent: spec for spec in INTENTS}
RULES = tuple((spec.intent, spec.pattern) for spec in INTENTS if spec.pattern is not None)


def parse(question: str) -> list[Intent]:
    """What the question asks, in the order the answers are given ([] for an empty question)."""
    return parse_with(question, RULES)


def answer(question: str, history: Sequence[dict[str, Any]], scene: Scene) -> list[str]:
    """The answer as sentences (each ends with its punctuation)."""
    now = scene.now
    if now is None:
        if not scene.received:
            return ["I have no frames to look at yet."]
        return ["I couldn't read any of the frames, so I can't see anything right now."]
    q = normalized(question)
    yes_no = bool(YES_NO.match(q))
    out: list[str] = []
    for intent in intents_for(question, history, RULES):
        out.extend(_SPECS[intent].compose(scene, now, q, yes_no))
    return list(dict.fromkeys(out))  # one intent may repeat another's line: each once, in order


def needs_reading(question: str, history: Sequence[dict[str, Any]]) -> bool:
    """Whether answering runs the text reader (it costs several times all the other models)."""
    return Intent.READ in intents_for(question, history, RULES)


def models_for(question: str, history: Sequence[dict[str, Any]]) -> frozenset[str]:
    """The perception models the answer to this question reads (light and sharpness need none)."""
    needed: frozenset[str] = frozenset()
    for intent in intents_for(question, history, RULES):
        needed |= _SPECS[intent].models
    return needed
