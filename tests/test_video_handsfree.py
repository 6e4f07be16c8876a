"""The camera page hands-free, in a real browser: the server's voice-activity detection finds the turns.

Chromium's fake devices are fed real media: the camera a photo (scikit-image's astronaut, as a
y4m file, ``--use-file-for-fake-video-capture``) and the microphone a spoken question in our own
voice (a WAV file played once, ``--use-file-for-fake-audio-capture=…%noloop``). Nothing is
pressed but Start: the page streams the microphone, the server hears the question start and
stop, and the conversation shows the question as heard and its answer.

Barge-in needs the second question to start while the first answer plays, a moment no file can
know in advance, so that test feeds the page's microphone from a WebAudio graph it starts on cue
(tests/js/cued-microphone.js, an init script that wraps ``getUserMedia``; the camera stays
Chromium's fake one). Every run leaves
screenshots in artifacts/screenshots/.
"""

from __future__ import annotations

import base64
import re
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from hibari import Hibari
from scipy.signal import resample_poly
from support.page_frames import CHROMIUM, Frames, launch, shot
from support.photos import photo
from support.servers import free_port, live_server

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "How many people can you see?"
SECOND_QUESTION = "Is it dark in here?"
LEAD_IN_S = 3.0  # silence before the question: the page has sent frames by then

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (/usr/bin/chromium)")


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def write_wav(path: Path, audio: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes())


def write_y4m(path: Path, bgr: np.ndarray, frames: int = 30) -> None:
    """A still photo as a one-second 4:2:0 y4m clip (Chromium loops it)."""
    h, w = bgr.shape[:2]
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420).tobytes()
    with path.open("wb") as f:
        f.write(f"YUV4MPEG2 W{w} H{h} F{frames}:1 Ip A1:1 C420jpeg\n".encode())
        for _ in range(frames):
            f.write(b"FRAME\n" + i420)


@pytest.fixture(scope="module")
def voice() -> Hibari:
    return Hibari()


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory, voice: Hibari) -> dict[str, Path]:
    """The fake camera's photo and the fake microphone's spoken question, as Chromium reads them."""
    folder = tmp_path_factory.mktemp("fake-media")
    speech = voice(QUESTION, seed=7).astype(np.float32)  # 24 kHz
    audio = np.concatenate([np.zeros(int(LEAD_IN_S * 24_000), np.float32), speech, np.zeros(24_000, np.float32)])
    write_wav(folder / "question.wav", resample_poly(audio, 2, 1), 48_000)
    write_y4m(folder / "astronaut.y4m", photo("astronaut"))
    return {"wav": folder / "question.wav", "y4m": folder / "astronaut.y4m"}


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    """daphne as a deployment runs it, pacing audio 2 s ahead, so an answer is still playing when interrupted."""
    port = free_port()
    args = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"]
    with live_server(args, port, OMNIWEB_ENGINE_MAX_AHEAD_SECONDS="2") as base:
        yield base


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


def new_page(browser: Any, **context: Any) -> Any:
    # bypass_csp: the tests' wait_for_function strings are eval'd in the page (test_pages_run_under_their_csp
    # in test_browser_pages.py checks the page with its policy on).
    ctx = browser.new_context(viewport={"width": 1100, "height": 900}, bypass_csp=True, **context)
    pg = ctx.new_page()
    pg.errors = []
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    return pg


def turn_done(pg: Any, n: int, timeout: float = 60_000) -> None:
    """Wait until the ``n``-th turn in the conversation has ended (answered, failed or interrupted)."""
    pg.wait_for_function(
        """n => { const t = document.querySelectorAll('.turn');
                  return t.length >= n && !['waiting', 'answering'].includes(t[n - 1].dataset.how); }""",
        arg=n,
        timeout=timeout,
    )


def test_a_spoken_question_is_heard_and_answered_without_pressing_anything(playwright, base_url, media):
    browser = launch(
        playwright,
        f"--use-file-for-fake-audio-capture={media['wav']}%noloop",
        f"--use-file-for-fake-video-capture={media['y4m']}",
    )
    try:
        pg = new_page(browser)
        frames = Frames(pg)
        pg.goto(base_url + "/video/")
        assert pg.is_checked("#hands-free")  # the default where a microphone is granted
        pg.click("#start")
        pg.wait_for_selector("#listening[data-state='listening']", timeout=15_000)
        assert pg.is_disabled("#talk")  # hands-free: nothing to hold
        shot(pg, "video-handsfree-listening")
        pg.wait_for_selector("#listening[data-state='hearing']", timeout=20_000)
        shot(pg, "video-handsfree-hearing")
        turn_done(pg, 1)
        pg.wait_for_selector("#state[data-state='done']", timeout=30_000)
        shot(pg, "video-handsfree-answered")

        (config,) = frames.sent_of_type("session.config")
        assert config["turn_detection"]["type"] == "server_vad"
        assert config["turn_detection"]["create_response"] and config["turn_detection"]["interrupt_response"]
        assert frames.sent_of_type("video.query") == []  # the server found the turn
        assert len(frames.sent_of_type("audio.chunk")) > 25  # the microphone streams (40 ms chunks)
        (started,) = frames.of_type("input_audio_buffer.speech_started")
        (stopped,) = frames.of_type("input_audio_buffer.speech_stopped")
        assert 0 < started["audio_start_ms"] < stopped["audio_end_ms"]
        (transcript,) = frames.of_type("input.transcript")
        assert words(transcript["text"]) == words(QUESTION), transcript
        (done,) = frames.of_type("response.text.done")

        turns = pg.locator(".turn")
        assert turns.count() == 1 and turns.first.get_attribute("data-how") == "answered"
        assert words(pg.locator(".turn .question-text").text_content()) == words(QUESTION)
        assert pg.locator(".turn .answer-text").text_content() == done["text"]
        assert "person" in done["text"].lower()  # the astronaut: one person
        assert int(pg.locator("#played").get_attribute("data-value")) > 12_000  # the answer was heard
        assert pg.locator("#first-text").text_content() != "–"
        assert not pg.errors, pg.errors
    finally:
        browser.close()


# -- barge-in: a microphone the test starts on cue ---------------------------------------------------

CUED_MIC = (ROOT / "tests" / "js" / "cued-microphone.js").read_text()


def cue(pg: Any, name: str, audio: np.ndarray) -> None:
    """Hand the page a 24 kHz float32 clip it can play into its microphone with ``__say(name)``."""
    data = base64.b64encode(audio.astype("<f4").tobytes()).decode()
    pg.evaluate(
        """([name, data]) => {
             const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
             window.__cues[name] = new Float32Array(bytes.buffer);
           }""",
        [name, data],
    )


def test_speaking_over_the_answer_stops_its_audio_at_once(playwright, base_url, media, voice):
    browser = launch(playwright, f"--use-file-for-fake-video-capture={media['y4m']}")
    try:
        pg = new_page(browser)
        pg.add_init_script(CUED_MIC)
        frames = Frames(pg)
        pg.goto(base_url + "/video/")
        pg.click("#start")
        pg.wait_for_selector("#listening[data-state='listening']", timeout=15_000)
        pg.wait_for_function("Number(document.querySelector('#accepted').dataset.value) >= 1", timeout=15_000)
        cue(pg, "first", voice("Describe everything you can see.", seed=7))
        cue(pg, "second", voice(SECOND_QUESTION, seed=7))
        pg.evaluate("__say('first')")
        pg.wait_for_selector("#audio-state[data-state='playing']", state="attached", timeout=60_000)
        pg.wait_for_timeout(300)  # well into the answer
        pg.evaluate("__say('second')")
        # The server hears the second question start: a new turn, and the first answer's audio
        # stops at once on the page (the player is stopped, not drained, and plays nothing more).
        pg.wait_for_function("document.querySelectorAll('#conversation .turn').length >= 2", timeout=15_000)
        pg.wait_for_function(
            """() => { const started = __events.filter((e) => e.type === 'input_audio_buffer.speech_started');
                       return started.length >= 2
                         && __events.some((e) => e.type === 'audio-state:stopped' && e.t >= started[1].t); }""",
            timeout=5_000,
        )
        played = int(pg.locator("#played").get_attribute("data-value"))
        pg.wait_for_timeout(400)  # the second question is still being said: no answer audio yet
        assert int(pg.locator("#played").get_attribute("data-value")) == played
        assert pg.locator(".turn").first.get_attribute("data-how") == "interrupted"
        # The page's own record (tests/js/cued-microphone.js): the player was stopped right after
        # the second speech_started, while the person was still speaking (before its speech_stopped).
        pg.wait_for_function("__events.filter((e) => e.type === 'input_audio_buffer.speech_stopped').length >= 2")
        events = [e["type"] for e in pg.evaluate("__events") if not e["type"].startswith(("video.", "pong"))]
        second = [i for i, kind in enumerate(events) if kind == "input_audio_buffer.speech_started"][1]
        stop = events.index("input_audio_buffer.speech_stopped", second)
        assert "audio-state:stopped" in events[second:stop], events[second:]
        shot(pg, "video-handsfree-barge-in")
        turn_done(pg, 2)
        pg.wait_for_selector("#state[data-state='done']", timeout=30_000)
        transcripts = [m["text"] for m in frames.of_type("input.transcript")]
        assert words(transcripts[-1]) == words(SECOND_QUESTION), transcripts
        assert len(frames.of_type("input_audio_buffer.speech_started")) == 2
        assert words(pg.locator(".turn:last-child .question-text").text_content()) == words(SECOND_QUESTION)
        assert pg.locator(".turn:last-child").get_attribute("data-how") == "answered"
        assert frames.sent_of_type("video.query") == []
        assert not pg.errors, pg.errors
    finally:
        browser.close()


def test_hands_free_off_brings_back_hold_to_talk(playwright, base_url, media):
    browser = launch(playwright, f"--use-file-for-fake-video-capture={media['y4m']}")
    try:
        pg = new_page(browser)
        frames = Frames(pg)
        pg.goto(base_url + "/video/")
        pg.click("#start")
        pg.wait_for_selector("#listening[data-state='listening']", timeout=15_000)
        pg.uncheck("#hands-free")
        pg.wait_for_selector("#listening[data-state='off']")
        pg.wait_for_selector("#talk:not([disabled])")
        pg.wait_for_function("document.querySelector('#conn').dataset.state === 'open'", timeout=10_000)
        pg.wait_for_timeout(500)
        configs = frames.sent_of_type("session.config")
        assert len(configs) == 2 and "turn_detection" not in configs[-1]  # a new session without VAD
        chunks_before = len(frames.sent_of_type("audio.chunk"))
        pg.wait_for_timeout(1000)
        assert len(frames.sent_of_type("audio.chunk")) == chunks_before  # the microphone no longer streams
        shot(pg, "video-handsfree-off")
        assert not pg.errors, pg.errors
    finally:
        browser.close()
