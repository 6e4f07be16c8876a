"""Each perception model on real photos, and the landmark rules on landmark sets: what it finds, not invents."""

from __future__ import annotations

import math
import threading

import cv2
import numpy as np
import pytest
from support.photos import PHOTOS, WITHOUT_PEOPLE, photo, sign

from video.engine.perception import Observations, Perception, hands, objects, pose, shared
from video.engine.perception.types import Body, Face


@pytest.fixture(scope="module")
def models() -> Perception:
    return shared()


@pytest.fixture(scope="module")
def seen(models: Perception) -> dict[str, Observations]:
    return {name: models.observe(photo(name), read=True) for name in PHOTOS}


# -- faces and people ------------------------------------------------------------------------


def test_a_frontal_face_and_a_half_profile_are_found(seen):
    (astronaut,) = seen["astronaut"].faces
    assert 0.3 < astronaut.cx < 0.6 and astronaut.cy < 0.4 and astronaut.score > 0.8
    (camera_man,) = seen["camera"].faces  # half profile: the frontal Haar cascade misses him
    assert 0.3 < camera_man.cx < 0.6
    assert astronaut.distance == "close" and camera_man.metres > astronaut.metres


@pytest.mark.parametrize("name", WITHOUT_PEOPLE)
def test_no_faces_bodies_or_hands_where_there_are_none(seen, name):
    assert seen[name].faces == () and seen[name].body is None and seen[name].hands == ()
    assert seen[name].people == 0


def test_people_need_a_body_as_well_as_a_face(seen):
    assert seen["astronaut"].body is not None and seen["astronaut"].people == 1
    assert seen["camera"].body is not None and seen["camera"].people == 1
    assert Observations(faces=(Face(0.5, 0.5, 0.2, 0.2),)).people == 0  # a face alone may be a photo


@pytest.mark.parametrize(("width", "distance"), [(0.3, "close"), (0.15, "middle"), (0.05, "far")])
def test_distance_is_estimated_from_face_size(width, distance):
    face = Face(0.5, 0.5, width, width)
    assert face.distance == distance
    assert face.metres == pytest.approx(0.15 / (width * 2 * math.tan(math.radians(30))))


# -- expression ------------------------------------------------------------------------------


def test_smiling_or_not(seen):
    assert [e.smiling for e in seen["astronaut"].expressions] == [True]
    assert [e.smiling for e in seen["camera"].expressions] == [False]
    assert seen["coffee"].expressions == ()


# -- text ------------------------------------------------------------------------------------


def test_a_sign_is_read_line_by_line_in_reading_order(models):
    lines = models.observe(sign(("EXIT", "Platform 3")), read=True).text
    assert [line.text for line in lines] == ["EXIT", "Platform 3"]
    assert lines[0].where == "in the middle" and all(line.score >= 0.9 for line in lines)


def test_a_tilted_sign_is_read(models):
    texts = [line.text for line in models.observe(sign(("STOP", "Staff only"), tilt=8), read=True).text]
    assert texts == ["STOP", "Staff only"]


def test_a_scanned_page_is_read_top_to_bottom(models):
    lines = models.observe(photo("page"), read=True).text
    assert lines[0].text == "Region-based segmentation"
    assert [line.cy for line in lines] == sorted(line.cy for line in lines)
    assert len(lines) >= 6


@pytest.mark.parametrize("name", PHOTOS)
def test_photos_without_text_read_as_no_text(seen, name):
    assert seen[name].text == ()


def test_text_is_read_only_when_asked(models):
    assert models.observe(sign()).text is None


# -- main object ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"), [("coffee", "a cup of coffee"), ("chelsea", "a cat"), ("camera", "a tripod")]
)
def test_the_main_object_is_named_when_confident(seen, name, expected):
    main = seen[name].main_object
    assert main is not None and main.name == expected and main.confidence >= objects.CONFIDENT


def test_an_unsure_classification_stays_unsure(seen):
    rocket = seen["rocket"].main_object  # "missile" at ~0.38: named only as a guess
    assert rocket is None or rocket.confidence < objects.CONFIDENT
    assert seen["astronaut"].main_object is None  # "football helmet" at ~0.19: not named


def test_related_classes_are_summed_into_one_group():
    names = objects.labels()
    assert len(names) == 1000 and names[0] == "tench" and names[999] == "toilet tissue"
    cats = [i for i, n in enumerate(names) if n in ("tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat")]
    probs = np.zeros(1000, np.float32)
    probs[cats[:3]] = [0.2, 0.2, 0.15]  # no single cat class is confident; together they are
    main = objects.best_group(probs)
    assert main is not None and main.name == "a cat" and main.confidence == pytest.approx(0.55)
    assert objects.groups()[names.index("golden retriever")] == "a dog"
    assert objects.groups()[names.index("umbrella")] == "an umbrella"
    assert objects.best_group(np.full(1000, 0.001, np.float32)) is None


# -- pose (landmark rules) -------------------------------------------------------------------


def _pose_points(**moved: tuple[float, float]) -> list[tuple[float, float, float]]:
    """An upright person standing, arms down, as 33 landmarks (x, y, visibility); ``moved`` overrides."""
    at = {
        pose.NOSE: (0.5, 0.15),
        pose.L_SHOULDER: (0.58, 0.3),
        pose.R_SHOULDER: (0.42, 0.3),
        pose.L_WRIST: (0.62, 0.55),
        pose.R_WRIST: (0.38, 0.55),
        pose.L_HIP: (0.55, 0.6),
        pose.R_HIP: (0.45, 0.6),
        pose.L_KNEE: (0.55, 0.78),
        pose.R_KNEE: (0.45, 0.78),
        pose.L_ANKLE: (0.55, 0.95),
        pose.R_ANKLE: (0.45, 0.95),
    }
    names = {"left_wrist": pose.L_WRIST, "right_wrist": pose.R_WRIST, "left_knee": pose.L_KNEE}
    names |= {"right_knee": pose.R_KNEE, "left_ankle": pose.L_ANKLE, "right_ankle": pose.R_ANKLE}
    names |= {"left_shoulder": pose.L_SHOULDER, "right_shoulder": pose.R_SHOULDER}
    for key, xy in moved.items():
        at[names[key]] = xy
    return [(*at[i], 0.99) if i in at else (0.0, 0.0, 0.0) for i in range(33)]


def test_pose_rules():
    standing = pose.read_pose(_pose_points(), aspect=1.0)
    assert standing == Body(cx=0.5, cy=0.3, raised=(), above_head=(), leaning=None, posture="standing")
    waving = pose.read_pose(_pose_points(left_wrist=(0.7, 0.2)), aspect=1.0)
    assert waving.raised == ("left",) and waving.above_head == ()
    both = pose.read_pose(_pose_points(left_wrist=(0.6, 0.0), right_wrist=(0.4, 0.0)), aspect=1.0)
    assert both.raised == ("left", "right") and both.above_head == ("left", "right")
    sitting = pose.read_pose(_pose_points(left_knee=(0.75, 0.62), right_knee=(0.65, 0.62)), aspect=1.0)
    assert sitting.posture == "sitting"
    leaning = pose.read_pose(_pose_points(left_shoulder=(0.45, 0.3), right_shoulder=(0.29, 0.3)), aspect=1.0)
    assert leaning.leaning == "left"
    legs_unseen = [p if i < pose.L_KNEE else (p[0], p[1], 0.1) for i, p in enumerate(_pose_points())]
    assert pose.read_pose(legs_unseen, aspect=1.0).posture is None
    assert pose.read_pose([(0.0, 0.0, 0.0)] * 33, aspect=1.0) is None


# -- hands (landmark rules) ------------------------------------------------------------------


def _hand(up: set[str], thumb: str = "folded") -> list[tuple[float, float]]:
    """21 landmarks of an upright right hand (palm to camera), with the named fingers straight.

    A folded finger curls back towards the palm; the thumb is "out" (to the side), "up", "down" or folded.
    """
    pts = [(0.0, 0.0)] * 21
    pts[0] = (0.5, 0.8)
    for n, (mcp, pip, dip, tip) in enumerate(hands._JOINTS):
        x = 0.44 + 0.04 * n
        pts[mcp] = (x, 0.6)
        if hands.FINGERS[n + 1] in up:
            pts[pip], pts[dip], pts[tip] = (x, 0.52), (x, 0.47), (x, 0.42)
        else:
            pts[pip], pts[dip], pts[tip] = (x, 0.55), (x, 0.6), (x, 0.63)
    base = {"out": ((0.40, 0.72), (0.35, 0.68), (0.31, 0.65), (0.27, 0.62))}
    base["up"] = ((0.42, 0.7), (0.4, 0.6), (0.4, 0.52), (0.4, 0.45))
    base["down"] = ((0.42, 0.7), (0.4, 0.78), (0.4, 0.86), (0.4, 0.93))
    base["folded"] = ((0.45, 0.72), (0.44, 0.66), (0.47, 0.63), (0.5, 0.64))
    for i, xy in zip((1, 2, 3, 4), base[thumb], strict=True):
        pts[i] = xy
    return pts


@pytest.mark.parametrize(
    ("fingers", "thumb", "gesture"),
    [
        ({"index", "middle", "ring", "little"}, "out", "open palm"),
        (set(), "folded", "fist"),
        (set(), "up", "thumbs up"),
        (set(), "down", "thumbs down"),
        ({"index"}, "folded", "pointing"),
        ({"index", "middle"}, "folded", "victory"),
        ({"index", "middle", "ring"}, "folded", None),
    ],
)
def test_gestures_from_landmarks(fingers, thumb, gesture):
    hand = hands.read_hand(_hand(fingers, thumb), "right", aspect=1.0)
    expected = ({"thumb"} if thumb in ("out", "up", "down") else set()) | fingers
    assert set(hand.fingers) == expected
    assert hand.gesture == gesture


def test_a_hand_is_raised_relative_to_the_shoulders_or_the_face():
    points = _hand({"index"})  # wrist at y 0.8
    shoulders_high = Body(0.5, 0.9, (), (), None, None)
    assert hands.read_hand(points, "left", 1.0, body=shoulders_high).raised is True
    assert hands.read_hand(points, "left", 1.0, faces=(Face(0.5, 0.3, 0.1, 0.1),)).raised is False
    assert hands.read_hand(points, "left", 1.0).raised is None


# -- the process's models ----------------------------------------------------------------------


def test_models_load_once_and_serve_threads_at_once(models):
    assert shared() is models
    results: list[Observations] = []
    threads = [threading.Thread(target=lambda: results.append(models.observe(photo("astronaut")))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and all(len(r.faces) == 1 and r.expressions[0].smiling for r in results)


def test_a_person_small_in_the_frame_still_has_a_body(models):
    """The camera man letterboxed in 640×480: the whole-frame pose pass misses him, his face's region does not."""
    small = cv2.resize(photo("camera"), (360, 360), interpolation=cv2.INTER_AREA)
    frame = np.full((480, 640, 3), 40, np.uint8)
    frame[60:420, 140:500] = small
    seen = models.observe(frame, models=frozenset({"faces", "pose"}))
    assert len(seen.faces) == 1 and seen.body is not None and seen.people == 1
    assert seen.body.posture is None  # his legs are in view, but the pose model is not sure of them


def test_legs_guessed_beyond_the_frame_give_no_posture():
    beyond = [(x, y + 0.5, v) if i >= pose.L_HIP else (x, y, v) for i, (x, y, v) in enumerate(_pose_points())]
    body = pose.read_pose(beyond, aspect=1.0)
    assert body is not None and body.posture is None and body.leaning is None
