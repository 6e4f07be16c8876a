"""The scene thinker's words: what the question asks, answered only from the measured scene.

Pure functions: a question (plus the conversation so far) and a ``Scene`` in, sentences out. Each
intent has one composer that states what was measured in plain sentences; questions about things
the measures cannot see (reading text, who someone is, objects, expressions) get a plain "I can't"
with the reason, and, where it helps, what it can say instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from .scene import ColourShare, Face, FrameStats, Scene

COLOURS = {
    "red": "red",
    "orange": "orange",
    "yellow": "yellow",
    "green": "green",
    "blue": "blue",
    "purple": "purple",
    "violet": "purple",
    "pink": "pink",
    "magenta": "pink",
    "brown": "brown",
    "black": "black",
    "white": "white",
    "grey": "grey",
    "gray": "grey",
    "teal": "teal",
    "cyan": "teal",
    "turquoise": "teal",
    "beige": "beige",
}
NAMEABLE_SHARE = 0.04  # a description names colours covering at least this much of the picture
NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


class Intent(Enum):
    GREETING = "greeting"
    THANKS = "thanks"
    READ = "read"
    IDENTITY = "identity"
    EXPRESSION = "expression"
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


_PEOPLE_WORDS = (
    r"people|persons?|faces?|humans?|men|man|women|woman|kids?|children|child|guys?|"
    r"someone|somebody|anyone|anybody|everyone|nobody|myself"
)
# Checked in this order; a question may match several (each is answered, in this order).
_RULES: tuple[tuple[Intent, re.Pattern[str]], ...] = (
    (
        Intent.READ,
        re.compile(r"\b(read|text|written|writing|write|says?|sign|letters?|words?|label|logo|brand|title)\b"),
    ),
    (
        Intent.IDENTITY,
        re.compile(r"\bwho\b|\b(recogni[sz]e|identify|name|how old|age|gender|famous|celebrity)\b"),
    ),
    (
        Intent.EXPRESSION,
        re.compile(r"\b(smil\w*|happy|sad|angry|mood|emotions?|feel\w*|express\w*|laugh\w*|crying|upset|tired)\b"),
    ),
    (
        Intent.PEOPLE,
        re.compile(
            rf"\b({_PEOPLE_WORDS})\b|\bhow many of\b|\b(close|near|far|distance)\b"
            r"|\b(see|spot|notice|find|detect)( \w+)? (me|us)\b|\bwhere am i\b|\bam i (in|visible|there)\b"
        ),
    ),
    (
        Intent.COLOUR,
        re.compile(r"\b(colou?rs?|colou?red|wearing)\b|\b(" + "|".join(COLOURS) + r")\b"),
    ),
    (Intent.LIGHT, re.compile(r"\b(dark\w*|bright\w*|light\w*|lit|dim|night|day ?light|sunny|shadows?|exposure)\b")),
    (
        Intent.CHANGE,
        re.compile(
            r"\b(chang\w*|mov\w*|motion|happened|different|differ\w*|still|static|moment ago|before|since|"
            r"came|leav\w*|enter\w*|arriv\w*|appear\w*|disappear\w*|walk\w*)\b"
        ),
    ),
    (Intent.SHARPNESS, re.compile(r"\b(blurr?y|blur|focus\w*|sharp\w*|clear|fuzzy|quality)\b")),
)
_GREETING = re.compile(r"^(hi|hello|hey|good (morning|afternoon|evening)|greetings)\b")
_THANKS = re.compile(r"\b(thanks|thank you|cheers)\b")
_HOW_MANY = re.compile(r"\bhow many (\w+)")
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
_YES_NO = re.compile(r"^(is|are|do|does|did|can|could|was|were|has|have|am|any)\b")
_OBJECT_NOUN = re.compile(r"\b(shirt|car|wall|sky|door|cup|phone|book|bottle|hat|jacket|dress|table|chair|light|it)\b")


def parse(question: str) -> list[Intent]:
    """What the question asks, in the order the answers are given ([] for an empty question)."""
    q = " ".join(question.lower().replace("’", "'").split())
    if not q:
        return []
    found: list[Intent] = []
    if _GREETING.match(q):
        found.append(Intent.GREETING)
    if _THANKS.search(q):
        found.append(Intent.THANKS)
    presence = _PRESENCE.search(q)  # "who is there?" asks whether anyone is, not who they are
    for intent, rule in _RULES:
        if rule.search(q) and not (presence and intent is Intent.IDENTITY):
            found.append(intent)
    if presence and Intent.PEOPLE not in found:
        found.append(Intent.PEOPLE)
    many = _HOW_MANY.search(q)
    if many and not re.match(rf"({_PEOPLE_WORDS}|of)\b", many.group(1)):
        found.append(Intent.COUNT_OTHER)
    if _OBJECT.search(q) and not found_any(
        found, Intent.PEOPLE, Intent.COLOUR, Intent.READ, Intent.IDENTITY, Intent.COUNT_OTHER
    ):
        found.append(Intent.OBJECT)
    if not found_any(found, *(i for i, _ in _RULES), Intent.COUNT_OTHER, Intent.OBJECT):
        if _FOLLOW_UP.match(q):
            found.append(Intent.FOLLOW_UP)
        elif _DESCRIBE.search(q):
            found.append(Intent.DESCRIBE)
        elif not found:
            found.append(Intent.UNKNOWN)
    return found


def found_any(found: Sequence[Intent], *intents: Intent) -> bool:
    return any(i in found for i in intents)


def intents_for(question: str, history: Sequence[dict[str, Any]]) -> list[Intent]:
    """The question's intents; a bare follow-up ("and now?") repeats the previous question's."""
    intents = parse(question)
    if not intents:
        return [Intent.DESCRIBE]
    if intents == [Intent.FOLLOW_UP]:
        for turn in reversed(history):
            if turn.get("role") == "user" and isinstance(turn.get("content"), str):
                earlier = [i for i in parse(turn["content"]) if i is not Intent.FOLLOW_UP]
                if earlier:
                    return earlier
        return [Intent.DESCRIBE]
    return intents


# -- composing -------------------------------------------------------------------------------


def answer(question: str, history: Sequence[dict[str, Any]], scene: Scene) -> list[str]:
    """The answer as sentences (each ends with its punctuation)."""
    now = scene.now
    if now is None:
        if not scene.received:
            return ["I have no frames to look at yet."]
        return ["I couldn't read any of the frames, so I can't see anything right now."]
    q = question.lower()
    yes_no = bool(_YES_NO.match(q.strip()))
    out: list[str] = []
    for intent in intents_for(question, history):
        out.extend(_COMPOSERS[intent](scene, now, q, yes_no))
    seen: set[str] = set()
    return [s for s in out if not (s in seen or seen.add(s))]  # one intent may repeat another's line


def number(n: int) -> str:
    return NUMBERS[n] if 0 <= n < len(NUMBERS) else str(n)


def percent(share: float) -> str:
    return f"{round(share * 100)} percent"


def _greeting(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return ["Hello! I'm watching the camera and can tell you about people, colours, light and movement."]


def _thanks(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return ["You're welcome."]


def _read(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return ["I can't read text: I measure faces, colours, light and movement, but I can't make out letters or words."]


def _identity(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return [
        "I can't tell who someone is: I can only detect that a face is there, not whose it is.",
        *_people(scene, now, "", False),
    ]


def _expression(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return ["I can't read expressions or moods; I only detect where faces are.", *_people(scene, now, "", False)]


def _count_other(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    many = _HOW_MANY.search(q)
    what = many.group(1) if many else "those"
    return [f"I can't count {what}: the only things I can count are faces turned towards the camera."]


def _object(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return [
        "I can't recognise objects or what someone is doing; I can only measure faces, colours, light and movement.",
        f"What I can say is that the middle of the picture is {_colour_phrase(now.centre_colours)}.",
    ]


def _describe_faces(faces: Sequence[Face]) -> str:
    if len(faces) == 1:
        f = faces[0]
        return f"one person, {_place(f.side)}, {_distance(f.distance)}"
    every = "both" if len(faces) == 2 else "all"
    sides = {f.side for f in faces}
    distances = {f.distance for f in faces}
    if len(sides) == 1:
        where = f"{every} {_place(sides.pop())}"
        if len(distances) == 1:
            where += f", {_distance(distances.pop())}"
    else:
        where = _join([f"one {_place(f.side)}" for f in faces])
        if len(distances) == 1:
            where += f", {every} {_distance(distances.pop())}"
    return f"{number(len(faces))} people: {where}"


def _place(side: str) -> str:
    return "in the centre" if side == "centre" else f"on the {side}"


def _distance(distance: str) -> str:
    return {"close": "close to the camera", "middle": "a little way from the camera", "far": "far from the camera"}[
        distance
    ]


def _people(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    faces = now.faces
    if not faces:
        lead = "No, I don't see anyone" if yes_no else "I don't see anyone"
        out = [f"{lead}: no face is turned towards the camera."]
    else:
        lead = "Yes, I can see" if yes_no else "I can see"
        out = [f"{lead} {_describe_faces(faces)}."]
    if "how many" in q or not faces:
        out.append("I count faces, so someone facing away or hidden would not be counted.")
    before = scene.before
    if before is not None and len(before.faces) != len(faces):
        out.append(f"In the first frame I saw {number(len(before.faces))}.")
    return out


def _colour_phrase(measured: Sequence[ColourShare]) -> str:
    """E.g. "mostly grey, with some blue on the left and a little red"."""
    colours = [c for c in measured if c.share >= NAMEABLE_SHARE]
    if not colours:
        return "a mix of many colours"
    head, rest = colours[0], colours[1:4]
    if head.share >= 0.5:
        text = f"mostly {head.name}"
        parts = [f"{'some' if c.share >= 0.1 else 'a little'} {c.name}{_where(c)}" for c in rest]
        return text + (f", with {_join(parts)}" if parts else "")
    names = [f"{c.name}{_where(c)}" for c in colours[:4]]
    return f"a mix of {_join(names)}"


def _where(c: ColourShare) -> str:
    return f" {_place(c.where)}" if c.where else ""


def _colour(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    asked = [COLOURS[w] for w in re.findall(r"\w+", q) if w in COLOURS]
    out: list[str] = []
    if asked:
        shares = {c.name: c for c in now.colours}
        for name in dict.fromkeys(asked):
            c = shares.get(name)
            if c is None:
                out.append(f"{'No, I' if yes_no else 'I'} don't see any noticeable {name}.")
            else:
                share = f"{'Yes, about' if yes_no else 'About'} {percent(c.share)}"
                out.append(f"{share} of the picture is {name}{_where(c)}.")
        return out
    if _OBJECT_NOUN.search(q):
        return [
            f"The middle of the picture is {_colour_phrase(now.centre_colours)}.",
            "I can't pick out objects, so that's the colour at the centre of the frame.",
        ]
    return [f"The picture is {_colour_phrase(now.colours)}."]


def _light_word(brightness: float) -> str:
    if brightness < 35:
        return "very dark"
    if brightness < 70:
        return "dark"
    if brightness < 110:
        return "dimly lit"
    if brightness < 190:
        return "well lit"
    return "very bright"


def _light(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    b = now.brightness
    word = _light_word(b)
    level = f"the average brightness is {percent(b / 255)}"
    if yes_no and re.search(r"\b(dark|dim|night)\b", q):
        verdict = "Yes" if b < 70 else "Not really" if b < 110 else "No"  # dimly lit: neither answer fits
        out = [f"{verdict}, it's {word}: {level}."]
    elif yes_no and re.search(r"\b(bright|light|lit|sunny|daylight)\b", q):
        out = [f"Yes, it's {word}: {level}." if b >= 110 else f"No, it's {word}: {level}."]
    else:
        out = [f"It's {word}: {level}."]
    motion = scene.motion
    if motion is not None and abs(motion.brightness_change) >= 25:
        out.append(f"It got {'brighter' if motion.brightness_change > 0 else 'darker'} during the last frames.")
    return out


def _sharpness(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    if now.sharpness < 40:
        return ["The picture looks blurry or has very little detail."]
    return ["The picture looks sharp enough to make out detail."]


def _over(span_ms: float | None) -> str:
    if not span_ms or span_ms <= 0:
        return "between the first and the last frame"
    seconds = span_ms / 1000
    return f"over the last {seconds:.1f} seconds" if seconds < 10 else f"over the last {round(seconds)} seconds"


def _change(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    motion, before = scene.motion, scene.before
    if motion is None or before is None:
        return ["I only have one frame, so I can't tell what changed."]
    out: list[str] = []
    if motion.view_shift:
        turned = {"left": "right", "right": "left", "up": "down", "down": "up"}[motion.view_shift]
        out.append(f"The whole picture shifted {motion.view_shift}, so the camera probably turned {turned}.")
    elif motion.changed >= 0.6:
        out.append(f"Most of the picture changed {_over(motion.span_ms)}: the camera moved or the scene changed.")
    elif motion.direction:
        way = {"left": "to the left", "right": "to the right", "up": "upwards", "down": "downwards"}[motion.direction]
        out.append(f"Something moved {way} {_over(motion.span_ms)}.")
    elif motion.changed >= 0.01:
        where = f"{_place(motion.region)} of the picture" if motion.region else "in several places"
        out.append(f"Something changed {where} {_over(motion.span_ms)}; about {percent(motion.changed)} of it.")
    out.extend(_face_changes(before.faces, now.faces))
    if abs(motion.brightness_change) >= 25:
        out.append(f"It got {'brighter' if motion.brightness_change > 0 else 'darker'}.")
    if before.colours and now.colours and before.colours[0].name != now.colours[0].name and motion.changed >= 0.3:
        out.append(f"The picture went from mostly {before.colours[0].name} to mostly {now.colours[0].name}.")
    if not out:
        lead = "No, nothing" if yes_no else "Nothing"
        out.append(f"{lead} visibly changed or moved {_over(motion.span_ms)}.")
    return out


def _face_changes(before: Sequence[Face], now: Sequence[Face]) -> list[str]:
    if len(now) > len(before):
        came = len(now) - len(before)
        who = "Someone" if came == 1 else f"{number(came).capitalize()} people"
        return [f"{who} came into view: I now see {number(len(now))} faces, {number(len(before))} before."]
    if len(now) < len(before):
        went = len(before) - len(now)
        who = "Someone" if went == 1 else f"{number(went).capitalize()} people"
        return [f"{who} left the picture: I now see {number(len(now))} faces, {number(len(before))} before."]
    if len(now) == 1:
        dx = now[0].cx - before[0].cx
        if abs(dx) >= 0.12:
            return [f"The person moved to the {'right' if dx > 0 else 'left'}."]
        if now[0].width > before[0].width * 1.3:
            return ["The person came closer to the camera."]
        if now[0].width < before[0].width / 1.3:
            return ["The person moved away from the camera."]
    return []


def _describe(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    people = f"I can see {_describe_faces(now.faces)}." if now.faces else "I don't see anyone facing the camera."
    out = [people, f"The picture is {_colour_phrase(now.colours)}.", f"It's {_light_word(now.brightness)}."]
    if now.sharpness < 40:
        out.append("It looks blurry or has very little detail.")
    if scene.motion is not None:
        out.extend(_change(scene, now, "", False))
    return out


def _unknown(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return [
        "I can't answer that from what I can measure: faces, colours, light and movement.",
        *_describe(scene, now, q, False),
    ]


_COMPOSERS: dict[Intent, Callable[[Scene, FrameStats, str, bool], list[str]]] = {
    Intent.GREETING: _greeting,
    Intent.THANKS: _thanks,
    Intent.READ: _read,
    Intent.IDENTITY: _identity,
    Intent.EXPRESSION: _expression,
    Intent.COUNT_OTHER: _count_other,
    Intent.OBJECT: _object,
    Intent.PEOPLE: _people,
    Intent.COLOUR: _colour,
    Intent.LIGHT: _light,
    Intent.CHANGE: _change,
    Intent.SHARPNESS: _sharpness,
    Intent.DESCRIBE: _describe,
    Intent.FOLLOW_UP: _describe,
    Intent.UNKNOWN: _unknown,
}


def _join(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"
