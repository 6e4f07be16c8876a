"""The scene thinker on generated frames whose content is known: it says what is there and no more."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import pytest

from video.engine import answers, scene
from video.engine.thinkers import Frame, SceneThinker, Turn

W, H = 640, 480
GREY = (128, 128, 128)


def jpeg(img: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return data.tobytes()


def png(img: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", img)
    assert ok
    return data.tobytes()


def canvas(bgr: tuple[int, int, int] = GREY) -> np.ndarray:
    return np.full((H, W, 3), bgr, np.uint8)


def camera_like(img: np.ndarray, seed: int = 0) -> np.ndarray:
    """Soft focus and sensor noise, as a webcam gives."""
    rng = np.random.default_rng(seed)
    soft = cv2.GaussianBlur(img, (0, 0), 2)
    return np.clip(soft + rng.normal(0, 3, soft.shape), 0, 255).astype(np.uint8)


def draw_face(img: np.ndarray, cx: int, cy: int, w: int) -> None:
    """A drawn face: skin oval, hair, shadowed eye sockets with pupils, brows, nose and mouth.

    The shading follows what the frontal-face cascade keys on (dark eye band over brighter cheeks,
    a bright nose bridge between the eyes); it is detected at any size from ~40 px wide.
    """
    skin = (150, 180, 225)
    h = int(w * 1.3)
    cv2.ellipse(img, (cx, cy), (w // 2, h // 2), 0, 0, 360, skin, -1)
    cv2.ellipse(img, (cx, cy - h // 2 + h // 10), (w // 2 + 2, h // 5), 0, 180, 360, (30, 30, 50), -1)
    ey, ex = cy - h // 10, w // 5
    for s in (-1, 1):
        cv2.ellipse(img, (cx + s * ex, ey), (w // 7, w // 12), 0, 0, 360, tuple(int(v * 0.7) for v in skin), -1)
        cv2.circle(img, (cx + s * ex, ey), max(1, w // 22), (40, 30, 20), -1)
        brow = ((cx + s * ex - w // 8, ey - w // 8), (cx + s * ex + w // 8, ey - w // 9))
        cv2.line(img, *brow, (40, 40, 60), max(2, w // 30))
    cv2.line(img, (cx, ey + w // 20), (cx - w // 25, cy + h // 10), (110, 140, 190), max(2, w // 40))
    cv2.ellipse(img, (cx, cy + h // 4), (w // 6, w // 18), 0, 0, 180, (70, 70, 160), max(2, w // 30))


def faces_frame(faces: Sequence[tuple[int, int, int]], seed: int = 0) -> bytes:
    img = canvas((200, 200, 200))
    for cx, cy, w in faces:
        draw_face(img, cx, cy, w)
    return jpeg(camera_like(img, seed))


def square_frames(xs: Sequence[int], colour: tuple[int, int, int] = (0, 0, 255)) -> list[bytes]:
    """A square moving across a green background, one frame per x."""
    out = []
    for i, x in enumerate(xs):
        img = canvas((60, 140, 60))
        cv2.rectangle(img, (x, 200), (x + 90, 290), colour, -1)
        out.append(jpeg(camera_like(img, i)))
    return out


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


def test_a_drawn_face_is_found_where_it_is():
    for cx, side in ((120, "left"), (320, "centre"), (520, "right")):
        faces = scene.analyse([faces_frame([(cx, 240, 150)])]).now.faces
        assert [f.side for f in faces] == [side], cx


def test_face_size_says_near_or_far():
    near = scene.analyse([faces_frame([(320, 250, 230)])]).now.faces
    far = scene.analyse([faces_frame([(320, 240, 50)])]).now.faces
    assert [f.distance for f in near] == ["close"]
    assert [f.distance for f in far] == ["far"]


def test_no_faces_in_scenes_without_people():
    rng = np.random.default_rng(3)
    for i in range(4):
        img = canvas((90, 90, 90))
        for _ in range(15):
            x, y = (int(v) for v in rng.integers(0, [W, H]))
            size = (int(x + rng.integers(20, 200)), int(y + rng.integers(20, 200)))
            cv2.rectangle(img, (x, y), size, tuple(int(v) for v in rng.integers(0, 255, 3)), -1)
        assert scene.analyse([jpeg(camera_like(img, i))]).now.faces == (), i


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


# -- answers -----------------------------------------------------------------------------------


def test_describes_people_colours_and_light():
    text = say("What do you see?", [faces_frame([(150, 240, 150), (490, 240, 150)])])
    assert "two people" in text and "one on the left" in text and "one on the right" in text
    assert "grey" in text  # the light grey background
    assert "bright" in text  # the light grey wall (200 of 255)


def test_counts_people_and_says_how_it_counts():
    text = say("How many people are there?", [faces_frame([(110, 240, 110), (320, 240, 110), (530, 240, 110)])])
    assert "three people" in text
    assert "I count faces" in text
    nobody = say("Is anyone there?", [jpeg(camera_like(canvas((200, 200, 200))))])
    assert nobody.startswith("No, I don't see anyone")


def test_someone_coming_into_view_is_noticed():
    text = say("What changed?", [faces_frame([(150, 240, 140)], 1), faces_frame([(150, 240, 140), (490, 240, 140)], 2)])
    assert "Someone came into view" in text and "two faces, one before" in text


def test_colour_questions():
    blue = jpeg(camera_like(canvas((220, 60, 20))))
    assert "mostly blue" in say("What colour is it?", [blue])
    assert say("Is there anything red?", [blue]).startswith("No, I don't see any noticeable red")
    frames = square_frames([300])  # a small red square on green
    answer = say("Do you see something red?", frames)
    assert answer.startswith("Yes, about") and "red" in answer


@pytest.mark.parametrize(("level", "expected"), [(12, "Yes"), (90, "Not really"), (200, "No")])
def test_is_it_dark(level, expected):
    text = say("Is it dark in here?", [jpeg(camera_like(canvas((level, level, level))))])
    assert text.startswith(f"{expected}, it's")
    assert "brightness" in text


def test_getting_darker_is_reported():
    frames = [jpeg(camera_like(canvas((v, v, v)), i)) for i, v in enumerate((200, 150, 90, 40))]
    assert "got darker" in say("What happened?", frames)


def test_what_changed():
    moving = say("What changed?", square_frames([40, 190, 340, 490]), pts=[0, 400, 800, 1200])
    assert "moved to the right over the last 1.2 seconds" in moving
    still = say("Did anything move?", square_frames([300, 300, 300]))
    assert still.startswith("No, nothing visibly changed")
    assert "only have one frame" in say("What changed?", square_frames([300]))


def test_says_plainly_what_it_cannot_see():
    face = [faces_frame([(320, 240, 150)])]
    assert say("Can you read the sign?", face).startswith("I can't read text")
    who = say("Who is this?", face)
    assert who.startswith("I can't tell who someone is") and "one person" in who
    assert say("How many cars are there?", face).startswith("I can't count cars")
    assert say("What am I holding?", face).startswith("I can't recognise objects")
    unknown = say("What is the capital of France?", face)
    assert unknown.startswith("I can't answer that from what I can measure")


def test_follow_up_uses_the_conversation():
    history = [
        {"role": "user", "content": "Is it dark?"},
        {"role": "assistant", "content": "No, it's well lit: the average brightness is 60 percent."},
    ]
    dark = [jpeg(camera_like(canvas((15, 15, 15))))]
    assert say("And now?", dark, history).startswith("It's very dark")
    assert "I don't see anyone" in say("And now?", dark, [])  # no earlier question: a description


def test_empty_question_describes_the_scene():
    assert "The picture is mostly blue" in say("", [png(canvas((220, 60, 20)))])


def test_answer_streams_one_sentence_per_step():
    turn = Turn(question="What do you see?", frames=[Frame(None, faces_frame([(320, 240, 150)]), None)])
    run = SceneThinker().start(turn)
    steps = []
    while not run.done:
        steps.append(run.step())
    assert len(steps) >= 3 and all(steps)
    assert all("".join(step).strip().endswith((".", "!", "?")) for step in steps)
    expected = answers.answer(turn.question, [], scene.analyse([turn.frames[0].data]))
    assert "".join(d for step in steps for d in step) == " ".join(expected)


def test_who_is_there_asks_about_presence():
    text = say("Who is there?", [faces_frame([(320, 240, 150)])])
    assert text == "I can see one person, in the centre, close to the camera."


def test_no_frames_at_all():
    assert say("What do you see?", []) == "I have no frames to look at yet."


def test_parse_intents():
    assert answers.parse("how many people and is it dark?") == [answers.Intent.PEOPLE, answers.Intent.LIGHT]
    assert answers.parse("tell me what colour the wall is") == [answers.Intent.COLOUR]
    assert answers.parse("what's happening?") == [answers.Intent.DESCRIBE]
    assert answers.parse("") == []
