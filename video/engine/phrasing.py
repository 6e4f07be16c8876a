"""The scene thinker's sentences: each intent's answer, stated only from the measured scene.

Pure functions: a ``Scene`` (and the question, lower-cased) in, sentences out, with the uncertainty
worded ("probably", "it looks like"); questions nothing here can measure (who someone is, counting
or locating arbitrary objects, feelings) get a plain "I can't", then what it can say. Which
question gets which of them is ``answers.INTENTS``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .intents import HOW_MANY
from .perception.objects import CONFIDENT
from .perception.types import Body, Face, Hand, horizontal
from .scene import ColourRegion, ColourShare, FrameStats, Scene

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
_OBJECT_NOUN = re.compile(r"\b(shirt|car|wall|sky|door|cup|phone|book|bottle|hat|jacket|dress|table|chair|light|it)\b")


# -- words -----------------------------------------------------------------------------------


def number(n: int) -> str:
    return NUMBERS[n] if 0 <= n < len(NUMBERS) else str(n)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """ "no faces", "one face", "two faces"; "no one" / "one person" / "two people" for people."""
    if noun == "person":
        return "no one" if n == 0 else "one person" if n == 1 else f"{number(n)} people"
    many = plural or f"{noun}s"
    return f"no {many}" if n == 0 else f"one {noun}" if n == 1 else f"{number(n)} {many}"


def percent(share: float) -> str:
    return f"{round(share * 100)} percent"


def metres(m: float) -> str:
    """A distance estimate in words, rounded to half metres."""
    if m < 0.75:
        return "less than a metre"
    if m > 5:
        return "more than five metres"
    half = round(m * 2) / 2
    return "about 1 metre" if half == 1 else f"about {half:g} metres"


def _join(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


def _place(side: str) -> str:
    return "in the centre" if side == "centre" else f"on the {side}"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# -- people, hands, pose, expression ---------------------------------------------------------


def _where_faces(faces: Sequence[Face]) -> str:
    """Where the faces are and how far, e.g. "on the left, about 1 metre from the camera"."""
    if len(faces) == 1:
        f = faces[0]
        return f"{_place(f.side)}, {metres(f.metres)} from the camera"
    every = "both" if len(faces) == 2 else "all"
    sides = [f.side for f in faces]
    same = len(set(sides)) == 1
    where = f"{every} {_place(sides[0])}" if same else _join([f"one {_place(s)}" for s in sides])
    near, far = min(f.metres for f in faces), max(f.metres for f in faces)
    if metres(near) == metres(far):
        return f"{where}, {every} {metres(near)} from the camera"
    return f"{where}, {metres(near).removeprefix('about ')} to {metres(far).removeprefix('about ')} from the camera"


def people_phrase(faces: Sequence[Face], body: Body | None) -> str | None:
    """ "one person, on the left, about 1 metre from the camera"; None when no one is seen.

    A face counts as a person only with a body in view (the pose model); a face alone is "a face"
    (it may be a photo or a screen), and a body without a face is a person turned away.
    """
    sep = ", " if len(faces) == 1 else ": "
    if faces and body is not None:
        return f"{count(len(faces), 'person')}{sep}{_where_faces(faces)}"
    if faces:
        return f"{count(len(faces), 'face')}{sep}{_where_faces(faces)}"
    if body is not None:
        return f"one person {_place(horizontal(body.cx))}, with their face turned away or out of view"
    return None


def say_people(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    seen = now.seen
    phrase = people_phrase(seen.faces, seen.body)
    if phrase is None:
        out = ["No, I don't see anyone." if yes_no else "I don't see anyone."]
    else:
        out = [f"{'Yes, I can see' if yes_no else 'I can see'} {phrase}."]
    if "how many" in q or phrase is None:
        out.append("I find people by their face or their body, so someone hidden or out of view is not counted.")
    before = scene.before
    if before is not None:
        out.extend(_people_change(before, now))
    return out


def _people_count(stats: FrameStats) -> tuple[int, str]:
    """How many, and the noun that the evidence supports ("person" or "face")."""
    seen = stats.seen
    if seen.body is not None:
        return max(1, len(seen.faces)), "person"
    return len(seen.faces), "face"


def _people_change(before: FrameStats, now: FrameStats) -> list[str]:
    """ "No one was in the first frame; now I see one person." (counts only, no invented events)."""
    (n0, noun0), (n1, noun1) = _people_count(before), _people_count(now)
    if n0 == n1 and (noun0 == noun1 or n0 == 0):
        return []
    was = "No one was in the first frame" if n0 == 0 else f"There {_be(n0)} {count(n0, noun0)} in the first frame"
    if n1 == 0:
        return [f"{was}; now I see no one."]
    return [f"{was}; now I see {count(n1, noun1)}."]


def _be(n: int) -> str:
    return "was" if n == 1 else "were"


def _fingers_phrase(hand: Hand) -> str:
    n = len(hand.fingers)
    if n == 0:
        return "with no fingers up"
    if n == 5:
        return "with all five fingers up"
    return f"with {count(n, 'finger')} up ({_join(list(hand.fingers))})"


_GESTURES = {
    "thumbs up": "a thumbs-up",
    "thumbs down": "a thumbs-down",
    "pointing": "pointing",
    "victory": "a victory sign",
}


def hand_phrase(hand: Hand) -> str:
    """ "a right hand on the left of the picture, raised, with two fingers up (index and middle): a victory sign"."""
    text = f"a {hand.which} hand {_place(hand.side)} of the picture"
    if hand.raised:
        text += ", raised"
    if hand.gesture == "fist":
        return text + ", closed in a fist"
    if hand.gesture == "open palm":
        return text + ", open, with all five fingers up"
    text += f", {_fingers_phrase(hand)}"
    if hand.gesture is not None:
        text += f": {_GESTURES[hand.gesture]}"
    return text


def say_hands(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    hands = now.seen.hands
    if not hands:
        lead = "No, I don't see a hand." if yes_no else "I don't see any hands."
        return [lead, "Hold it up in front of the camera, with the palm or the back of the hand towards it."]
    lead = "Yes, I can see" if yes_no else "I can see"
    if len(hands) == 1:
        return [f"{lead} {hand_phrase(hands[0])}."]
    out = [f"{lead} {count(len(hands), 'hand')}."]
    out.extend(f"{_cap(ordinal)}, {hand_phrase(h)}." for ordinal, h in zip(_ORDINALS, hands, strict=False))
    if "finger" in q:
        out.append(f"That's {count(sum(len(h.fingers) for h in hands), 'finger')} up in all.")
    return out


_ORDINALS = ("first", "second", "third", "fourth")


def say_pose(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    body = now.seen.body
    if body is None:
        if now.seen.faces:
            return ["I can see a face, but not enough of a body to tell how someone is holding their arms or sitting."]
        return ["I don't see anyone, so there is no posture to describe."]
    return body_sentences(body)


def body_sentences(body: Body) -> list[str]:
    out = []
    if len(body.raised) == 2:
        out.append("Both arms are raised" + (" above the head." if len(body.above_head) == 2 else "."))
    elif body.raised:
        side = body.raised[0]
        out.append(f"Their {side} arm is raised" + (" above the head." if body.above_head else "."))
    else:
        out.append("No arm is raised above the shoulder.")
    if body.leaning:
        out.append(f"They're leaning towards the {body.leaning} of the picture.")
    if body.posture:
        out.append(f"They look like they're {body.posture}.")
    else:
        out.append("I can't tell whether they're standing or sitting: I can't see enough of their legs.")
    return out


def say_expression(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    faces, found = now.seen.faces, now.seen.expressions
    out = []
    if re.search(r"\b(happy|sad|angry|mood|emotions?|feel\w*|upset|tired|crying)\b", q):
        out.append("I can't tell how someone feels; I can only tell whether a face is smiling.")
    if not faces:
        out.append("I can't see a face, so I can't tell whether anyone is smiling.")
        return out
    smiling = sum(e.smiling for e in found)
    if len(found) == 1:
        if smiling:
            out.append(f"{'Yes, the' if yes_no else 'The'} face I can see is smiling.")
        else:
            out.append(f"{'No, the' if yes_no else 'The'} face I can see isn't smiling.")
        return out
    out.append(smile_count(smiling, len(found)) + ".")
    return out


def smile_count(smiling: int, faces: int) -> str:
    """ "Both faces are smiling", "One of the three faces is smiling", "None of the faces is smiling"."""
    if smiling == 0:
        return "Neither face is smiling" if faces == 2 else "None of the faces is smiling"
    if smiling == faces:
        return "Both faces are smiling" if faces == 2 else f"All {number(faces)} faces are smiling"
    return f"{_cap(number(smiling))} of the {number(faces)} faces {'is' if smiling == 1 else 'are'} smiling"


def say_identity(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return [
        "I can't tell who someone is: I can see whether a face is there, not whose it is.",
        *say_people(scene, now, "", False),
    ]


# -- text, objects --------------------------------------------------------------------------

MAX_LINES = 8


def say_read(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    lines = now.seen.text or ()
    if not lines:
        return [
            "No, I don't see any text I can read." if yes_no else "I don't see any text I can read.",
            "If there is some, hold it closer to the camera and keep it still.",
        ]
    quoted = [f'"{line.text}"' for line in lines[:MAX_LINES]]
    if len(lines) == 1:
        return [f"It says {quoted[0]}, {lines[0].where} of the picture."]
    more = len(lines) - MAX_LINES
    text = f"I can read {count(len(lines), 'line')}, top to bottom: {_join(quoted)}"
    if more > 0:
        text = (
            f"I can read {count(len(lines), 'line')}; the first {number(MAX_LINES)}, top to bottom: {', '.join(quoted)}"
        )
    return [text + "."]


def object_sentence(now: FrameStats) -> str | None:
    main = now.seen.main_object
    if main is None:
        return None
    if main.confidence >= CONFIDENT:
        return f"It looks like {main.name}."
    return f"It might be {main.name}, but I'm not sure."


def say_object(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    out = []
    said = object_sentence(now)
    phrase = people_phrase(now.seen.faces, now.seen.body)
    if said is not None:
        out.append(said)
    if phrase is not None:
        out.append(f"I can also see {phrase}." if said else f"I can see {phrase}.")
    if said is None:
        out.append(
            "I can't tell what the main thing in the picture is: nothing in it is clear enough for me to name."
            if phrase is None
            else "I can't tell what else is in the picture."
        )
    if re.search(r"\bwhere\b", q):
        out.append("I can't say where an object is: I name the main thing in the whole picture, not where it sits.")
    return out


def say_count_other(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    many = HOW_MANY.search(q)
    what = many.group(1) if many else "those"
    out = [f"I can't count {what}: I can count people, faces and hands, and name the main thing in the picture."]
    said = object_sentence(now)
    if said is not None:
        out.append(said)
    return out


# -- colour and light -------------------------------------------------------------------------


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


def region_owner(region: ColourRegion, now: FrameStats) -> str | None:
    """What else was seen where the colour is: "in a hand", "on the person (probably their clothes)"."""
    seen = now.seen
    for hand in seen.hands:
        if region.contains(hand.cx, hand.cy, margin=0.05):
            return "near a hand, so probably something held"
    for face in seen.faces:
        below = face.cy + face.height / 2 <= region.cy <= face.cy + 5 * face.height
        if below and abs(region.cx - face.cx) <= 1.5 * face.width and seen.body is not None:
            return "below the face, so probably the person's clothes"
        if region.contains(face.cx, face.cy) and region.width <= 2 * face.width:
            return "on the face"
    return None


def say_colour(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    asked = [COLOURS[w] for w in re.findall(r"\w+", q) if w in COLOURS]
    out: list[str] = []
    if asked:
        for name in dict.fromkeys(asked):
            region = now.regions.get(name)
            if region is None:
                out.append(f"{'No, I' if yes_no else 'I'} don't see anything {name}.")
                continue
            size = "a small patch" if region.share < 0.05 else "a patch" if region.share < 0.3 else "a large area"
            lead = "Yes, there's" if yes_no else "There's"
            text = f"{lead} {size} of {name} {region.where} of the picture, about {percent(region.share)} of it"
            owner = region_owner(region, now)
            out.append(f"{text}: {owner}." if owner else f"{text}.")
            if re.search(r"\bwhat\b", q) and owner is None:
                main = now.seen.main_object
                central = abs(region.cx - 0.5) < 0.25 and abs(region.cy - 0.5) < 0.25 and region.share >= 0.05
                if main is not None and main.confidence >= CONFIDENT and central:
                    out.append(f"It may be {main.name}: that's what the picture as a whole looks like.")
                else:
                    out.append("I can't tell what it is: I can only say where the colour is.")
        return out
    if _OBJECT_NOUN.search(q):
        return [
            f"The middle of the picture is {_colour_phrase(now.centre_colours)}.",
            "That's the colour at the centre of the frame; I can't pick out a single object's colour.",
        ]
    return [f"The picture is {_colour_phrase(now.colours)}."]


def light_word(brightness: float) -> str:
    """Words for the mean brightest-channel value (so a saturated green wall reads as bright, not dim)."""
    if brightness < 35:
        return "very dark"
    if brightness < 70:
        return "dark"
    if brightness < 110:
        return "dimly lit"
    if brightness < 190:
        return "well lit"
    return "very bright"


def say_light(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    b = now.brightness
    word = light_word(b)
    level = f"the brightness is {percent(b / 255)}"
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


def say_sharpness(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    if now.sharpness < 40:
        return ["The picture looks blurry or has very little detail."]
    return ["The picture looks sharp enough to make out detail."]


# -- change, description -----------------------------------------------------------------------


def _over(span_ms: float | None) -> str:
    if not span_ms or span_ms <= 0:
        return "between the first and the last frame"
    seconds = span_ms / 1000
    if round(seconds, 1) == 1:
        return "over the last second"
    return f"over the last {seconds:.1f} seconds" if seconds < 10 else f"over the last {round(seconds)} seconds"


def say_change(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
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
        out.append(f"Something changed {where} {_over(motion.span_ms)}: about {percent(motion.changed)} of it.")
    out.extend(_people_change(before, now))
    out.extend(_face_moves(before.faces, now.faces))
    if abs(motion.brightness_change) >= 25:
        out.append(f"It got {'brighter' if motion.brightness_change > 0 else 'darker'}.")
    if before.colours and now.colours and before.colours[0].name != now.colours[0].name and motion.changed >= 0.3:
        out.append(f"The picture went from mostly {before.colours[0].name} to mostly {now.colours[0].name}.")
    if not out:
        lead = "No, nothing" if yes_no else "Nothing"
        out.append(f"{lead} visibly changed or moved {_over(motion.span_ms)}.")
    return out


def _face_moves(before: Sequence[Face], now: Sequence[Face]) -> list[str]:
    """One face in both frames: how it moved, measured from its box."""
    if len(now) != 1 or len(before) != 1:
        return []
    dx = now[0].cx - before[0].cx
    if abs(dx) >= 0.12:
        return [f"The face moved to the {'right' if dx > 0 else 'left'}, by about {percent(abs(dx))} of the width."]
    if now[0].width > before[0].width * 1.3:
        return ["The face came closer to the camera."]
    if now[0].width < before[0].width / 1.3:
        return ["The face moved away from the camera."]
    return []


def say_describe(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    """Most salient first: people (with expression, hands and arms), the main object, text, light and colour."""
    seen = now.seen
    out = []
    phrase = people_phrase(seen.faces, seen.body)
    if phrase is not None:
        extra = []
        if len(seen.expressions) == 1:
            extra.append("smiling" if seen.expressions[0].smiling else "not smiling")
        if seen.body is not None and seen.body.raised:
            extra.append(
                "with both arms raised" if len(seen.body.raised) == 2 else f"with the {seen.body.raised[0]} arm raised"
            )
        out.append(f"I can see {phrase}" + (f", {_join(extra)}." if extra else "."))
    if seen.hands:
        out.append(_cap(_join([hand_phrase(h) for h in seen.hands])) + ".")
    said = object_sentence(now)
    if said is not None:
        out.append(
            said
            if phrase is None
            else said.replace("It looks like", "The main thing looks like").replace(
                "It might be", "The main thing might be"
            )
        )
    if seen.text:
        out.extend(say_read(scene, now, "", False))
    out.append(f"It's {light_word(now.brightness)}, and the picture is {_colour_phrase(now.colours)}.")
    if phrase is None and said is None and not seen.hands:
        out.insert(0, "I don't see anyone, and nothing I can name.")
    if now.sharpness < 40:
        out.append("It looks blurry or has very little detail.")
    if scene.motion is not None:
        change = say_change(scene, now, "", False)
        if not change[0].startswith("Nothing"):
            out.append(change[0])
    return out


def say_greeting(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return ["Hello! I'm watching the camera: ask me what I see, to read a sign, or about people, hands and colours."]


def say_thanks(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return ["You're welcome."]


def say_unknown(scene: Scene, now: FrameStats, q: str, yes_no: bool) -> list[str]:
    return [
        "I can't answer that from what the camera shows. Here's what I can see.",
        *say_describe(scene, now, q, False),
    ]
