"""The observations the perception models produce; plain frozen values, no model code."""

from __future__ import annotations

import math
from dataclasses import dataclass

FACE_WIDTH_M = 0.15  # an adult face (the detector's box is about ear to ear)
CAMERA_FOV_DEG = 60.0  # a typical webcam's horizontal field of view


def horizontal(x: float) -> str:
    return "left" if x < 1 / 3 else "right" if x > 2 / 3 else "centre"


def vertical(y: float) -> str:
    return "top" if y < 1 / 3 else "bottom" if y > 2 / 3 else "middle"


@dataclass(frozen=True)
class Face:
    """A detected face; coordinates are fractions of the frame (0..1)."""

    cx: float
    cy: float
    width: float
    height: float = 0.0
    score: float = 1.0

    @property
    def side(self) -> str:
        return horizontal(self.cx)

    @property
    def metres(self) -> float:
        """Distance estimate from the face's share of the frame width, for a ~60 degree webcam."""
        frame_width_at_1m = 2 * math.tan(math.radians(CAMERA_FOV_DEG / 2))
        return FACE_WIDTH_M / (max(self.width, 1e-3) * frame_width_at_1m)

    @property
    def distance(self) -> str:
        """ "close" (under ~0.8 m), "middle" (to ~1.8 m) or "far"."""
        m = self.metres
        return "close" if m < 0.8 else "middle" if m < 1.8 else "far"


@dataclass(frozen=True)
class Body:
    """The pose model's person: what it can tell about their posture (None where it cannot)."""

    cx: float
    cy: float
    raised: tuple[str, ...]  # the person's own arms raised above the shoulder: "left", "right"
    above_head: tuple[str, ...]  # of those, the ones with the wrist above the head
    leaning: str | None  # "left" / "right" as seen in the picture
    posture: str | None  # "standing" / "sitting" when hips, knees and ankles are in view


@dataclass(frozen=True)
class Hand:
    """A hand from its 21 landmarks."""

    cx: float
    cy: float
    which: str  # the person's own "left" or "right" hand (the camera does not mirror)
    fingers: tuple[str, ...]  # the fingers held up: "thumb", "index", "middle", "ring", "little"
    gesture: str | None  # "open palm", "fist", "thumbs up", "thumbs down", "pointing", "victory"
    raised: bool | None  # above the shoulder (or the chin); None when there is nothing to compare with

    @property
    def side(self) -> str:
        return horizontal(self.cx)


@dataclass(frozen=True)
class Expression:
    """Smiling or not: the one expression class that the model tells apart dependably."""

    smiling: bool
    score: float  # the model's probability of "happy"


@dataclass(frozen=True)
class MainObject:
    """Whole-frame classification, grouped ("a cat" for every cat class)."""

    name: str  # with its article: "a cat", "a cup of coffee"
    confidence: float  # the group's summed probability
    label: str  # the top ImageNet class, for logs and context


@dataclass(frozen=True)
class TextLine:
    text: str
    score: float
    cx: float
    cy: float

    @property
    def where(self) -> str:
        v, h = vertical(self.cy), horizontal(self.cx)
        if v == "middle" and h == "centre":
            return "in the middle"
        if v == "middle":
            return f"on the {h}"
        if h == "centre":
            return f"at the {v}"
        return f"at the {v} {h}"
