"""The scene thinker: measures on generated frames, answers on real photos, and its wording over every input range."""

from __future__ import annotations

import re
from collections.abc import Sequence

import cv2
import numpy as np
import pytest
from support.photos import photo, sign
from support.pictures import H, W, camera_like, canvas, jpeg, square_frames

from video.engine import answers, phrasing, scene
from video.engine.perception import Observations
from video.engine.perception.types import Body, Expression, Face, Hand, MainObject, TextLine
from video.engine.thinkers import Frame, SceneThinker, Turn


def png(img: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", img)
    assert ok
    return data.tobytes()


def say(question: str, frames: Sequence[bytes], history: list[dict[str, str]] | None = None, **kw) -> str:
    """The whole answer as the thinker streams it (joined deltas)."""
    pts = kw.get("pts", [i * 500.0 for i in range(len(frames))])
    turn = Turn(
        question=question,
        frames=[Frame(str(i), f, p) for i, (f, p) in enumerate(zip(frames, pts, strict=True))],
        history=history or [],
    )
    run = SceneThinker().start(turn)
    deltas: list[str] = []
    while not run.done:
        deltas.extend(run.step())
    return "".join(deltas)


# -- measurements ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bgr", "name"),
    [
        ((0, 0, 220), "red"),
        ((0, 140, 255), "orange"),
        ((0, 230, 230), "yellow"),
        ((40, 180, 40), "green"),
        ((200, 200, 0), "teal"),
        ((220, 60, 20), "blue"),
        ((150, 30, 120), "purple"),
        ((190, 150, 255), "pink"),
        ((30, 70, 130), "brown"),
        ((150, 180, 225), "beige"),
        ((245, 245, 245), "white"),
        ((128, 128, 128), "grey"),
        ((15, 15, 15), "black"),
    ],
)
def test_colours_get_plain_names(bgr, name):
    measured = scene.analyse([jpeg(camera_like(canvas(bgr)))])
    assert measured.now is not None
    assert measured.now.colours[0].name == name
    assert measured.now.colours[0].share > 0.9


def test_a_colour_on_one_side_is_placed_there():
    img = canvas((128, 128, 128))
    img[:, : W // 4] = (220, 60, 20)  # blue strip on the left quarter
    colours = scene.analyse([jpeg(img)]).now.colours
    blue = next(c for c in colours if c.name == "blue")
    assert blue.where == "left" and 0.2 < blue.share < 0.3


def test_motion_direction_and_camera_pan():
    right = scene.analyse(square_frames([40, 190, 340, 490])).motion
    left = scene.analyse(square_frames([490, 340, 190, 40])).motion
    assert right is not None and right.direction == "right"
    assert left is not None and left.direction == "left"
    rng = np.random.default_rng(0)
    wide = np.zeros((H, W + 200, 3), np.uint8)
    for _ in range(80):
        x, y = int(rng.integers(0, W + 200)), int(rng.integers(0, H))
        cv2.circle(wide, (x, y), int(rng.integers(10, 60)), tuple(int(v) for v in rng.integers(0, 255, 3)), -1)
    # The camera turns right: the picture's content moves left.
    panned = scene.analyse([jpeg(wide[:, 40 : 40 + W]), jpeg(wide[:, 120 : 120 + W])]).motion
    assert panned is not None and panned.view_shift == "left"


def room(width: int = W) -> np.ndarray:
    """A plain lit wall (a gentle gradient) with a window, a desk and a lamp: little texture."""
    img = np.empty((H, width, 3), np.uint8)
    img[:] = np.linspace(150, 200, width, dtype=np.uint8)[None, :, None]
    cv2.rectangle(img, (width - 210, 60), (width - 40, 230), (235, 240, 245), -1)
    cv2.rectangle(img, (0, 330), (width, H), (60, 80, 110), -1)
    cv2.rectangle(img, (40, 200), (180, 330), (40, 40, 45), -1)
    return img


def person(img: np.ndarray, x: int) -> np.ndarray:
    out = img.copy()
    cv2.rectangle(out, (x - 60, 270), (x + 60, 460), (140, 70, 40), -1)
    cv2.ellipse(out, (x, 200), (40, 52), 0, 0, 360, (120, 160, 215), -1)
    return out


def test_a_person_walking_is_not_a_camera_pan():
    walk = scene.analyse([jpeg(camera_like(person(room(), x), i)) for i, x in enumerate((250, 330))]).motion
    assert walk is not None and walk.view_shift is None and walk.changed > 0.05
    wide = room(W + 100)
    pan = scene.analyse([jpeg(camera_like(wide[:, 50 : 50 + W], 0)), jpeg(camera_like(wide[:, 10 : 10 + W], 1))])
    assert pan.motion is not None and pan.motion.view_shift == "right"


def test_lights_going_down_is_a_brightness_change_not_a_new_scene():
    lit = room()
    dim = (lit * 0.45).astype(np.uint8)
    text = say("What changed?", [jpeg(camera_like(lit, 0)), jpeg(camera_like(dim, 1))])
    assert text == "It got darker."


def test_sampling_keeps_first_and_last():
    assert scene.pick(3) == [0, 1, 2]
    picked = scene.pick(100)
    assert picked[0] == 0 and picked[-1] == 99 and len(picked) == scene.MAX_ANALYSED_FRAMES


def test_a_bright_green_frame_is_not_dimly_lit():
    # Pure green at full strength has a mean luma near 60 %; the light is judged by the brightest channel.
    for bgr in ((0, 160, 0), (0, 255, 0), (200, 0, 0), (0, 0, 230)):
        measured = scene.analyse([jpeg(camera_like(canvas(bgr)))]).now
        assert phrasing.light_word(measured.brightness) in ("well lit", "very bright"), bgr


def test_a_small_red_ball_is_located():
    img = canvas((40, 150, 40))
    cv2.circle(img, (520, 380), 22, (30, 30, 210), -1)  # ~0.5 % of the picture, bottom right
    cv2.circle(img, (512, 372), 6, (120, 120, 255), -1)  # a highlight
    text = say("Is there anything red?", [jpeg(camera_like(img))])
    assert text.startswith("Yes, there's a small patch of red at the bottom right of the picture"), text
    assert say("Where is the blue thing?", [jpeg(camera_like(img))]) == "I don't see anything blue."


# -- answers on real photos ------------------------------------------------------------------


def test_the_five_questions_on_real_photos():
    coffee, cat, astronaut, camera_man = (jpeg(photo(n)) for n in ("coffee", "chelsea", "astronaut", "camera"))
    assert say("What is this?", [coffee]) == "It looks like a cup of coffee."
    assert say("What is this?", [cat]) == "It looks like a cat."
    assert (
        say("What does the sign say?", [jpeg(sign())])
        == 'I can read two lines, top to bottom: "EXIT" and "Platform 3".'
    )
    assert say("Am I smiling?", [astronaut]) == "Yes, the face I can see is smiling."
    assert say("Am I smiling?", [camera_man]) == "No, the face I can see isn't smiling."
    assert say("Can you see my hand?", [astronaut]).startswith("No, I don't see a hand.")
    seen = say("What do you see?", [astronaut])
    assert seen.startswith("I can see one person, in the centre, less than a metre from the camera, smiling.")
    assert "It's well lit" in seen
    assert say("What do you see?", [camera_man]).startswith(
        "I can see one person, in the centre, about 1 metre from the camera, not smiling. "
        "The main thing looks like a tripod."
    )


def test_no_invented_text_hands_or_people_on_photos_without_them():
    for name in ("coffee", "chelsea", "rocket"):
        frame = [jpeg(photo(name))]
        assert say("What does it say?", frame).startswith("I don't see any text I can read."), name
        assert say("Can you see my hand?", frame).startswith("No, I don't see a hand."), name
        assert say("Is anyone there?", frame).startswith("No, I don't see anyone."), name


def test_identity_is_refused_and_presence_answered():
    astronaut = [jpeg(photo("astronaut"))]
    who = say("Who is this?", astronaut)
    assert who.startswith("I can't tell who someone is: I can see whether a face is there, not whose it is.")
    assert "one person" in who
    assert say("Who is there?", astronaut) == "I can see one person, in the centre, less than a metre from the camera."
    assert say("How many cups are there?", [jpeg(photo("coffee"))]) == (
        "I can't count cups: I can count people, faces and hands, and name the main thing in the picture. "
        "It looks like a cup of coffee."
    )


def test_someone_coming_into_view_is_told_as_counts():
    text = say("What changed?", [jpeg(photo("coffee")), jpeg(photo("astronaut"))])
    assert "No one was in the first frame; now I see one person." in text
    gone = say("What changed?", [jpeg(photo("astronaut")), jpeg(photo("coffee"))])
    assert "There was one person in the first frame; now I see no one." in gone


def test_counts_three_people_side_by_side():
    three = np.concatenate([cv2.resize(photo("astronaut"), (320, 320))] * 3, axis=1)
    text = say("How many people are there?", [jpeg(three)])
    assert text.startswith("I can see three people: one on the left, one in the centre and one on the right, all"), text


# -- wording over every input range ----------------------------------------------------------

GRAMMAR = (
    r"\bone (people|faces|hands|lines|fingers|persons)\b",
    r"\b(no|two|three|four|five|six|seven|eight|nine|ten|\d+) (person|face|hand|line|finger)\b(?! (is|up))",
    r"\bno one (people|person)\b",
    r"  |\s[,.:;!?]|,,|\.\.|\ba ([aeiou])",
)


def well_formed(sentences: Sequence[str]) -> None:
    assert sentences
    for s in sentences:
        assert s[0].isupper() or s[0] == '"', s
        assert s.endswith((".", "!", "?")), s
        for rule in GRAMMAR:
            assert not re.search(rule, s), (rule, s)


def stats(
    faces: int = 0,
    body: bool = False,
    hands: Sequence[Hand] = (),
    smiling: Sequence[bool] | None = None,
    main: MainObject | None = None,
    text: tuple[TextLine, ...] | None = None,
    brightness: float = 150.0,
) -> scene.FrameStats:
    xs = [(i + 0.5) / max(1, faces) for i in range(faces)]
    found = tuple(Face(x, 0.4, 0.13, 0.13) for x in xs)  # about 1 metre away
    smiles = smiling if smiling is not None else [False] * faces
    return scene.FrameStats(
        brightness=brightness,
        sharpness=100.0,
        colours=(scene.ColourShare("grey", 1.0, None),),
        centre_colours=(scene.ColourShare("grey", 1.0, None),),
        seen=Observations(
            faces=found,
            body=Body(0.5, 0.6, (), (), None, None) if body else None,
            hands=tuple(hands),
            expressions=tuple(Expression(s, 0.9 if s else 0.1) for s in smiles),
            main_object=main,
            text=text,
        ),
    )


def compose(question: str, now: scene.FrameStats, before: scene.FrameStats | None = None) -> list[str]:
    motion = None
    if before is not None:
        motion = scene.Motion(0.0, None, None, None, 0.0, 1000.0)
    return answers.answer(question, [], scene.Scene(now, before, motion, 2 if before else 1, 0))


@pytest.mark.parametrize("n", range(5))
@pytest.mark.parametrize("body", [False, True])
def test_people_wording(n, body):
    for question in ("How many people are there?", "Is anyone there?", "What do you see?", "Who is this?"):
        out = compose(question, stats(n, body))
        well_formed(out)
    first = compose("Is anyone there?", stats(n, body))[0]
    if n == 0 and not body:
        assert first == "No, I don't see anyone."
    elif n == 0:
        assert first.startswith("Yes, I can see one person in the centre, with their face turned away")
    elif body:
        assert first.startswith(f"Yes, I can see {phrasing.count(n, 'person')}")
    else:
        assert first.startswith(f"Yes, I can see {phrasing.count(n, 'face')}")  # a face alone is not a person


@pytest.mark.parametrize("before", range(4))
@pytest.mark.parametrize("now", range(4))
def test_change_in_people_wording(before, now):
    out = compose("What changed?", stats(now, body=now > 0), stats(before, body=before > 0))
    well_formed(out)
    told = [s for s in out if "first frame" in s]
    if before == now:
        assert not told and out == ["Nothing visibly changed or moved over the last second."]
    else:
        start = (
            "No one was"
            if before == 0
            else f"There {'was' if before == 1 else 'were'} {phrasing.count(before, 'person')}"
        )
        assert told == [f"{start} in the first frame; now I see {phrasing.count(now, 'person')}."]


@pytest.mark.parametrize("faces", range(5))
def test_smile_wording(faces):
    for smiling in range(faces + 1):
        flags = [i < smiling for i in range(faces)]
        out = compose("Am I smiling?", stats(faces, faces > 0, smiling=flags))
        well_formed(out)
        if faces == 0:
            assert out == ["I can't see a face, so I can't tell whether anyone is smiling."]
        elif faces == 1:
            assert out == [
                "Yes, the face I can see is smiling." if smiling else "No, the face I can see isn't smiling."
            ]
    feelings = compose("How do I feel?", stats(1, True, smiling=[True]))
    assert feelings[0] == "I can't tell how someone feels; I can only tell whether a face is smiling."


def test_smile_counts():
    assert phrasing.smile_count(0, 2) == "Neither face is smiling"
    assert phrasing.smile_count(1, 2) == "One of the two faces is smiling"
    assert phrasing.smile_count(2, 2) == "Both faces are smiling"
    assert phrasing.smile_count(0, 3) == "None of the faces is smiling"
    assert phrasing.smile_count(2, 3) == "Two of the three faces are smiling"
    assert phrasing.smile_count(3, 3) == "All three faces are smiling"


def _a_hand(fingers: int, gesture: str | None = None, raised: bool | None = None) -> Hand:
    names = ("thumb", "index", "middle", "ring", "little")[:fingers]
    return Hand(0.2, 0.5, "right", names, gesture, raised)


@pytest.mark.parametrize("fingers", range(6))
def test_hand_wording(fingers):
    gesture = {0: "fist", 5: "open palm"}.get(fingers)
    for hands in ((), (_a_hand(fingers, gesture, True),), (_a_hand(fingers, gesture), _a_hand(2, "victory"))):
        out = compose("Can you see my hand? How many fingers?", stats(1, True, hands))
        well_formed(out)
    one = compose("Can you see my hand?", stats(1, True, (_a_hand(fingers, gesture, True),)))[0]
    expected = {
        0: "Yes, I can see a right hand on the left of the picture, raised, closed in a fist.",
        1: "Yes, I can see a right hand on the left of the picture, raised, with one finger up (thumb).",
        2: "Yes, I can see a right hand on the left of the picture, raised, with two fingers up (thumb and index).",
        5: "Yes, I can see a right hand on the left of the picture, raised, open, with all five fingers up.",
    }
    if fingers in expected:
        assert one == expected[fingers]
    assert compose("Can you see my hand?", stats())[0] == "No, I don't see a hand."
    two = compose(
        "How many fingers am I holding up?", stats(1, True, (_a_hand(fingers, gesture), _a_hand(2, "victory")))
    )
    assert two[0] == "I can see two hands."
    assert two[-1] == f"That's {phrasing.count(fingers + 2, 'finger')} up in all."


@pytest.mark.parametrize("lines", [0, 1, 2, 8, 9, 12])
def test_reading_wording(lines):
    text = tuple(TextLine(f"Line {i}", 0.99, 0.5, (i + 0.5) / max(1, lines)) for i in range(lines))
    out = compose("What does it say?", stats(text=text))
    well_formed(out)
    if lines == 0:
        assert out[0] == "I don't see any text I can read."
    elif lines == 1:
        assert out == ['It says "Line 0", in the middle of the picture.']
    else:
        assert out[0].startswith(f"I can read {phrasing.number(lines)} lines")
        assert out[0].count('"') == 2 * min(lines, phrasing.MAX_LINES)


@pytest.mark.parametrize("confidence", [None, 0.3, 0.49, 0.5, 0.9])
@pytest.mark.parametrize("faces", [0, 1, 2])
def test_object_wording(confidence, faces):
    main = None if confidence is None else MainObject("a cat", confidence, "tabby")
    for question in ("What is this?", "Where is the cat?", "How many cats are there?", "What do you see?"):
        well_formed(compose(question, stats(faces, faces > 0, main=main)))
    first = compose("What is this?", stats(faces, faces > 0, main=main))[0]
    if confidence is None:
        assert first.startswith("I can see" if faces else "I can't tell what the main thing in the picture is")
    elif confidence >= phrasing.CONFIDENT:
        assert first == "It looks like a cat."
    else:
        assert first == "It might be a cat, but I'm not sure."
    where = compose("Where is the cat?", stats(main=main))
    assert where[-1].startswith("I can't say where an object is")


@pytest.mark.parametrize(
    ("brightness", "word"),
    [
        *[(0, "very dark"), (34.9, "very dark"), (35, "dark"), (69.9, "dark"), (70, "dimly lit")],
        *[(109.9, "dimly lit"), (110, "well lit"), (189.9, "well lit"), (190, "very bright"), (255, "very bright")],
    ],
)
def test_light_wording(brightness, word):
    assert phrasing.light_word(brightness) == word
    for question in ("Is it dark?", "Is it bright?", "How is the light?", "What do you see?"):
        well_formed(compose(question, stats(brightness=brightness)))


@pytest.mark.parametrize(
    ("m", "words"),
    [
        *[(0.5, "less than a metre"), (0.74, "less than a metre"), (0.75, "about 1 metre"), (1.2, "about 1 metre")],
        *[(1.3, "about 1.5 metres"), (2.0, "about 2 metres"), (5.0, "about 5 metres"), (5.1, "more than five metres")],
    ],
)
def test_distance_wording(m, words):
    assert phrasing.metres(m) == words


def test_counts():
    assert [phrasing.count(n, "person") for n in (0, 1, 2, 11)] == ["no one", "one person", "two people", "11 people"]
    assert [phrasing.count(n, "face") for n in (0, 1, 2)] == ["no faces", "one face", "two faces"]


def test_describe_puts_people_first_and_stays_short():
    now = stats(1, True, (_a_hand(2, "victory", True),), [True], MainObject("a cup of coffee", 0.9, "espresso"))
    out = compose("What do you see?", now)
    well_formed(out)
    assert out[0] == "I can see one person, in the centre, about 1 metre from the camera, smiling."
    assert (
        out[1]
        == "A right hand on the left of the picture, raised, with two fingers up (thumb and index): a victory sign."
    )
    assert out[2] == "The main thing looks like a cup of coffee."
    assert len(out) <= 5


def test_follow_up_uses_the_conversation():
    history = [
        {"role": "user", "content": "Is it dark?"},
        {"role": "assistant", "content": "No, it's well lit: the brightness is 60 percent."},
    ]
    dark = [jpeg(camera_like(canvas((15, 15, 15))))]
    assert say("And now?", dark, history).startswith("It's very dark")
    assert "I don't see anyone" in say("And now?", dark, [])  # no earlier question: a description


def test_empty_question_describes_the_scene():
    assert "the picture is mostly blue" in say("", [png(canvas((220, 60, 20)))])


def test_answer_streams_one_sentence_per_step():
    turn = Turn(question="What do you see?", frames=[Frame(None, jpeg(photo("camera")), None)])
    thinker = SceneThinker()
    run = thinker.start(turn)
    steps = []
    while not run.done:
        steps.append(run.step())
    assert len(steps) >= 3 and all(steps)
    assert all("".join(step).strip().endswith((".", "!", "?")) for step in steps)
    measured = scene.analyse([turn.frames[0].data], perception=thinker.perception)
    assert "".join(d for step in steps for d in step) == " ".join(answers.answer(turn.question, [], measured))


def test_no_frames_at_all():
    assert say("What do you see?", []) == "I have no frames to look at yet."


def test_parse_intents():
    assert answers.parse("how many people and is it dark?") == [answers.Intent.PEOPLE, answers.Intent.LIGHT]
    assert answers.parse("tell me what colour the wall is") == [answers.Intent.COLOUR]
    assert answers.parse("what's happening?") == [answers.Intent.DESCRIBE]
    assert answers.parse("can you see my hand?") == [answers.Intent.HANDS]
    assert answers.parse("am i standing?") == [answers.Intent.POSE]
    assert answers.parse("what does the sign say?") == [answers.Intent.READ]
    assert answers.parse("what is this?") == [answers.Intent.OBJECT]
    assert answers.parse("") == []
    assert answers.needs_reading("Can you read this?", []) and not answers.needs_reading("What is this?", [])


def test_what_is_the_red_thing_combines_the_colour_with_the_other_observations():
    red = scene.ColourRegion("red", 0.2, 0.5, 0.55, 0.4, 0.4)
    cup = MainObject("a cup of coffee", 0.9, "espresso")

    def with_red(**kw: object) -> scene.FrameStats:
        base = stats(**kw)
        return scene.FrameStats(
            base.brightness, base.sharpness, base.colours, base.centre_colours, base.seen, {"red": red}
        )

    assert compose("What is the red thing?", with_red(main=cup)) == [
        "There's a patch of red in the centre of the picture, about 20 percent of it.",
        "It may be a cup of coffee: that's what the picture as a whole looks like.",
    ]
    assert (
        compose("What is the red thing?", with_red())[-1]
        == "I can't tell what it is: I can only say where the colour is."
    )
    held = compose("Where is the red thing?", with_red(hands=(Hand(0.5, 0.6, "right", (), "fist", None),)))
    assert held == [
        "There's a patch of red in the centre of the picture, about 20 percent of it: "
        "near a hand, so probably something held."
    ]
    assert compose("Where is the red thing?", with_red(faces=1, body=True))[0].endswith(
        "below the face, so probably the person's clothes."
    )


def test_every_intent_is_declared_once_with_its_phrasing():
    """answers.INTENTS is the one table of intents: each has one entry (a composer, its models)."""
    declared = [spec.intent for spec in answers.INTENTS]
    assert sorted(declared, key=lambda i: i.value) == sorted(answers.Intent, key=lambda i: i.value)
    assert len(declared) == len(set(declared))
    assert [intent for intent, _ in answers.RULES][:2] == [answers.Intent.READ, answers.Intent.IDENTITY]
