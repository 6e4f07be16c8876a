"""What a question asks the scene thinker: its intents, in the order they are answered.

The intents a pattern alone finds are declared with their pattern, models and phrasing in one
table, ``answers.INTENTS``; this module tells apart the rest, which depend on how those combine:
greetings and thanks, "who is there?" (presence, not identity), "how many <things>" other than
people, what an object is, follow-ups ("and now?"), a description, and what nothing here answers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum
from typing import Any


class Intent(Enum):
    GREETING = "greeting"
    THANKS = "thanks"
    READ = "read"
    IDENTITY = "identity"
    EXPRESSION = "expression"
    HANDS = "hands"
    POSE = "pose"
    COUNT_OTHER = "count_other"
    OBJECT = "object"
    PEOPLE = "people"
    COLOUR = "colour"
    LIGHT = "light"
    CHANGE = "change"
    SHARPNESS = "sharpness"
    DESCRIBE = "describe"
    FOLLOW_UP = "follow_up"
    UNKNOWN = "unknown"


PEOPLE_WORDS = (
    r"people|persons?|faces?|humans?|men|man|women|woman|kids?|children|child|guys?|"
    r"someone|somebody|anyone|anybody|everyone|nobody|myself"
)
_GREETING = re.compile(r"^(hi|hello|hey|good (morning|afternoon|evening)|greetings)\b")
_THANKS = re.compile(r"\b(thanks|thank you|cheers)\b")
HOW_MANY = re.compile(r"\bhow many (\w+)")
_PRESENCE = re.compile(r"\bwho(?:'s| is| are)? (?:there|here|around|in (?:the )?(?:room|picture|frame|view))\b")
_OBJECT = re.compile(
    r"\bwhat(?:'s| is| are)? (?:this|that|these|those|it|he|she|they)\b(?! (?:colou?r|look))"
    r"|\b(holding|hold|object|thing|item|animal|cat|dog|car|cup|phone|book|bottle|laptop|computer|table|"
    r"chair|plant|tree|food|doing|wearing a)\b"
)
_DESCRIBE = re.compile(
    r"\b(see|look\w*|describe|scene|picture|image|frame|view|camera|in front|around|there|show\w*|going on|"
    r"happening|what's up|anything)\b"
)
_FOLLOW_UP = re.compile(r"^(and|what about|how about|now|again|still|same)\b.*$|^(and )?(now|again)\W*$")
YES_NO = re.compile(r"^(is|are|do|does|did|can|could|was|were|has|have|am|any)\b")


Rules = Sequence[tuple["Intent", re.Pattern[str]]]


def normalized(question: str) -> str:
    """Lower case, one kind of apostrophe, single spaces: what the patterns read."""
    return " ".join(question.lower().replace("’", "'").split())


def parse(question: str, rules: Rules) -> list[Intent]:
    """What the question asks, in the order the answers are given ([] for an empty question).

    ``rules``: the intents found by a pattern alone, in the order they are checked and answered
    (``answers.INTENTS``); the others are told apart here, by how they combine with them."""
    q = normalized(question)
    if not q:
        return []
    found: list[Intent] = []
    if _GREETING.match(q):
        found.append(Intent.GREETING)
    if _THANKS.search(q):
        found.append(Intent.THANKS)
    presence = _PRESENCE.search(q)  # "who is there?" asks whether anyone is, not who they are
    for intent, rule in rules:
        if rule.search(q) and not (presence and intent is Intent.IDENTITY):
            found.append(intent)
    if presence and Intent.PEOPLE not in found:
        found.append(Intent.PEOPLE)
    many = HOW_MANY.search(q)
    if many and not re.match(rf"({PEOPLE_WORDS}|of|hands?|fingers?)\b", many.group(1)):
        found.append(Intent.COUNT_OTHER)
    if _OBJECT.search(q) and not found_any(
        found, Intent.PEOPLE, Intent.COLOUR, Intent.READ, Intent.IDENTITY, Intent.COUNT_OTHER, Intent.HANDS
    ):
        found.append(Intent.OBJECT)
    if not found_any(found, *(i for i, _ in rules), Intent.COUNT_OTHER, Intent.OBJECT):
        if _FOLLOW_UP.match(q):
            found.append(Intent.FOLLOW_UP)
        elif _DESCRIBE.search(q):
            found.append(Intent.DESCRIBE)
        elif not found:
            found.append(Intent.UNKNOWN)
    return found


def found_any(found: Sequence[Intent], *intents: Intent) -> bool:
    return any(i in found for i in intents)


def intents_for(question: str, history: Sequence[dict[str, Any]], rules: Rules) -> list[Intent]:
    """The question's intents; a bare follow-up ("and now?") repeats the previous question's."""
    intents = parse(question, rules)
    if not intents:
        return [Intent.DESCRIBE]
    if intents == [Intent.FOLLOW_UP]:
        for turn in reversed(history):
            if turn.get("role") == "user" and isinstance(turn.get("content"), str):
                earlier: list[Intent] = [i for i in parse(turn["content"], rules) if i is not Intent.FOLLOW_UP]
                if earlier:
                    return earlier
        return [Intent.DESCRIBE]
    return intents
