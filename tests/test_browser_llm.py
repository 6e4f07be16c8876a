"""The camera page with the ``llm`` thinker, in a real browser: a language model answers typed questions.

Debian's Chromium (fake camera and microphone) drives ``/video/`` against a live daphne whose
thinker is SmolLM2-135M embedded through xllamacpp (``support.llm.EMBEDDED_ENV``). The model is
tiny and answers poorly: the test checks the plumbing (the model's words reach the page, are spoken
and played, and a second question in the same session is answered too), never the answers' quality.
The page after the answers is saved to /tmp/browser_llm.png and artifacts/screenshots/video-llm.png.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.llm import EMBEDDED_ENV
from support.page_frames import CHROMIUM, Frames, shot
from support.servers import live_daphne

RATE = 24000
SCREENSHOT = "/tmp/browser_llm.png"
# Questions the scene thinker could never answer: it would say one of its template sentences.
QUESTIONS = ("What is the capital of France?", "And what is the capital of Italy?")
SCENE_SENTENCES = ("I have no frames to look at yet.", "I couldn't read any of the frames")
SCENE_CANNOT = "I can't answer that from what the camera shows"

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (/usr/bin/chromium)")


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    """daphne with the llm thinker: SmolLM2 embedded in the server's process (the page's origin is 127.0.0.1)."""
    with live_daphne(**EMBEDDED_ENV) as base:
        yield base


def number(pg: Any, selector: str) -> int:
    return int(pg.locator(selector).get_attribute("data-value"))


def start_camera(pg: Any, base_url: str) -> None:
    pg.goto(base_url + "/video/")
    pg.click("#start")
    pg.wait_for_selector("#camera-badge:text('Live')", timeout=10_000)
    pg.wait_for_function("Number(document.querySelector('#accepted').dataset.value) >= 2", timeout=15_000)


def watch_audio_state(pg: Any) -> None:
    """Log every state the page's audio indicator takes (``window.__audioStates``), so a short
    answer's "playing" is seen however quickly it ends."""
    pg.evaluate(
        """() => {
          const el = document.querySelector('#audio-state');
          window.__audioStates = [el.dataset.state];
          new MutationObserver(() => window.__audioStates.push(el.dataset.state))
            .observe(el, { attributes: true, attributeFilter: ['data-state'] });
        }"""
    )


def ask_and_wait(pg: Any, text: str, turn: int) -> None:
    """Type ``text``, ask it, and wait (60 s ceiling) until the ``turn``-th turn has ended."""
    pg.evaluate("window.__audioStates = [document.querySelector('#audio-state').dataset.state]")
    pg.fill("#question", text)
    pg.click("#ask")
    pg.wait_for_function(
        """n => { const t = document.querySelectorAll('.turn');
                  return t.length >= n && !['waiting', 'answering'].includes(t[n - 1].dataset.how); }""",
        arg=turn,
        timeout=60_000,
    )


def assert_model_answer(text: str) -> None:
    assert text.strip(), "the model's answer is empty"
    assert not text.startswith(SCENE_SENTENCES) and not text.startswith(SCENE_CANNOT), f"the scene thinker: {text!r}"


def test_video_answers_typed_questions_through_the_language_model(page, base_url):
    frames = Frames(page)
    start_camera(page, base_url)
    watch_audio_state(page)
    played = number(page, "#played")
    for turn, question in enumerate(QUESTIONS, 1):
        ask_and_wait(page, question, turn)
        assert page.locator("#state").get_attribute("data-state") == "done", page.locator("#error").text_content()
        last = page.locator(".turn").nth(turn - 1)
        assert last.get_attribute("data-how") == "answered"
        dones = frames.of_type("response.text.done")
        assert len(dones) == turn
        answer = dones[-1]["text"]
        assert last.locator(".answer-text").text_content() == answer  # what the server sent, shown
        assert_model_answer(answer)
        # The answer was spoken: the page's audio played, and the player played half a second or more.
        assert "playing" in page.evaluate("window.__audioStates")
        assert number(page, "#played") - played > RATE // 2
        played = number(page, "#played")
    turns = page.locator(".turn")
    assert turns.count() == 2
    assert turns.locator(".question-text").all_text_contents() == list(QUESTIONS)
    answers = [d["text"] for d in frames.of_type("response.text.done")]
    assert turns.locator(".answer-text").all_text_contents() == answers
    assert "".join(m["delta"] for m in frames.of_type("response.text.delta")) == "".join(answers)  # streamed
    # Both turns in one session, so the second question reached the model with the first as history.
    assert len(frames.sent_of_type("session.config")) == 1 and len(frames.sent_of_type("video.query")) == 2
    assert frames.of_type("error") == []
    page.screenshot(path=SCREENSHOT, full_page=True)
    shot(page, "video-llm")
