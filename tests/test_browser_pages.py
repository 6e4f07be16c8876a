"""The pages in a real browser: Debian's Chromium driven by Playwright against a live daphne.

The browser gets a synthetic camera and microphone (``--use-fake-device-for-media-stream``) and may
start audio without a click. The server paces audio 2 s ahead of playback, as a deployment does
(30 s there), so cancelling and interrupting happen while the server is still streaming. Every
run leaves a screenshot of each page in artifacts/screenshots/.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.page_frames import CHROMIUM, SCREENSHOTS, Frames, shot
from support.servers import free_port, live_server

ROOT = Path(__file__).resolve().parent.parent
RATE = 24000

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (/usr/bin/chromium)")


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    """daphne as a deployment runs it, pacing audio 2 s ahead so cancels land mid-stream.

    The page's origin must be an allowed host, as in the README: 127.0.0.1.
    """
    port = free_port()
    args = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"]
    with live_server(args, port, OMNIWEB_ENGINE_MAX_AHEAD_SECONDS="2") as base:
        yield base


@pytest.fixture(autouse=True)
def no_refused_moves(request: pytest.FixtureRequest) -> Iterator[None]:
    """A page's named states refuse a move their table does not list and log it as an error
    (static/js/common.js, ``Machine``): in these tests no page may try one."""
    if "page" not in request.fixturenames:
        yield
        return
    pg = request.getfixturevalue("page")
    refused: list[str] = []
    pg.on("console", lambda msg: refused.append(msg.text) if "refused move" in msg.text else None)
    yield
    assert refused == [], f"the page tried moves its states do not allow: {refused}"


def number(pg: Any, selector: str) -> int:
    return int(pg.locator(selector).get_attribute("data-value"))


def wait_state(pg: Any, states: str, timeout: float = 30_000) -> str:
    wanted = states.split("|")
    pg.wait_for_function(
        "states => states.includes(document.querySelector('#state').dataset.state)", arg=wanted, timeout=timeout
    )
    return pg.locator("#state").get_attribute("data-state")


# -- start page ------------------------------------------------------------------------------------


def test_index_links_pages_and_shows_health(page, base_url):
    page.goto(base_url + "/")
    page.wait_for_selector("#health[data-state='ok']", timeout=15_000)
    assert page.locator("#health-text").text_content() == "Ready: the server is up and can take work."
    assert "first request" not in page.locator("#health-details").text_content()  # the models load at start
    assert page.locator("a[href='/speech/']").count() >= 1 and page.locator("a[href='/video/']").count() >= 1
    shot(page, "index")


def health(status: str, loading: list[str], failed: dict[str, str]) -> dict[str, Any]:
    """A ``/healthz`` body of the embedded engine (five pipelines) in ``status``."""
    names = ["audio.vad", "speech.tts", "speech.codec", "video.turn", "audio.transcribe"]
    state = {"ready": "ready", "degraded": "degraded", "starting": "loading", "unavailable": "failed"}[status]
    pipelines = {
        name: {
            "state": "loading" if name in loading else "failed" if name in failed else "ready",
            "error": failed.get(name),
            "load_seconds": None if name in loading or name in failed else 1.5,
        }
        for name in names
    }
    ready = status in ("ready", "degraded")
    engine = {"mode": "embedded", "state": state, "loading": loading, "failed": failed, "pipelines": pipelines}
    engine |= {"workers_up": 1, "workers_ready": int(ready), "active": 0, "queued": 0, "running_steps": 0}
    layer = {"backend": "InMemoryChannelLayer", "reachable": True}
    return {"ok": ready, "ready": ready, "status": status, "channel_layer": layer, "workers": [], "engine": engine}


def test_index_says_the_models_are_loading_then_ready_without_a_reload(page, base_url):
    """While the server starts (503) the page names what loads and asks again until it is ready."""
    answers = [health("starting", ["speech.tts", "video.turn"], {}), health("starting", ["video.turn"], {})]
    served: list[str] = []

    def healthz(route: Any) -> None:
        body = answers.pop(0) if answers else health("ready", [], {})
        served.append(body["status"])
        route.fulfill(status=200 if body["ready"] else 503, content_type="application/json", body=json.dumps(body))

    page.route("**/healthz", healthz)
    page.goto(base_url + "/")
    page.wait_for_selector("#health[data-state='starting']", timeout=15_000)
    assert page.locator("#health-text").text_content().startswith("Starting: loading models (")
    shot(page, "index-starting")
    page.wait_for_selector("#health[data-state='ok']", timeout=15_000)
    assert served == ["starting", "starting", "ready"]  # re-checked until ready, then no more
    assert page.locator("#health-text").text_content() == "Ready: the server is up and can take work."
    assert "5 of 5 loaded" in page.locator("#health-details").text_content()


REDIS_DOWN = {"backend": "channels_redis.core.RedisChannelLayer", "reachable": False}
IDLE = {"mode": "embedded", "state": "idle", "loading": [], "failed": {}}  # OMNIWEB_ENGINE_PRELOAD=0


@pytest.mark.parametrize(
    ("body", "state", "words"),
    [
        (
            health("starting", ["speech.tts", "video.turn"], {}),
            "starting",
            "Starting: loading models (speech.tts, video.turn…)",
        ),
        (
            health("degraded", [], {"video.turn": "No module named 'mediapipe'"}),
            "degraded",
            "Degraded: video.turn is unavailable (No module named 'mediapipe'); the other endpoints serve.",
        ),
        (
            {**health("starting", [], {}), "engine": IDLE},
            "starting",
            "Starting: the models load with the first request (OMNIWEB_ENGINE_PRELOAD is off).",
        ),
        (
            {**health("unavailable", [], {}), "channel_layer": REDIS_DOWN},
            "down",
            "Not ready: the channel layer (Redis) does not answer.",
        ),
    ],
)
def test_index_says_in_words_what_healthz_says(page, base_url, body, state, words):
    page.route(
        "**/healthz",
        lambda route: route.fulfill(
            status=200 if body["ready"] else 503, content_type="application/json", body=json.dumps(body)
        ),
    )
    page.goto(base_url + "/")
    page.wait_for_selector(f"#health[data-state='{state}']", timeout=15_000)
    assert page.locator("#health-text").text_content() == words


def test_pages_run_under_their_csp(browser, base_url):
    """With the Content-Security-Policy enforced, every page loads its modules and connects: no
    inline script or style anywhere, nothing the policy blocks (issue #11)."""
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    try:
        pg = context.new_page()
        violations: list[str] = []
        pg.on("console", lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None)
        pg.on("pageerror", lambda exc: violations.append(str(exc)))
        pg.goto(base_url + "/")
        pg.wait_for_selector("#health[data-state='ok']", timeout=15_000)
        pg.goto(base_url + "/speech/")
        pg.fill("#text", "Under the policy.")
        pg.click("#speak")  # the page's module runs, opens its WebSocket and plays (worklet included)
        pg.wait_for_selector("#conn[data-state='open']", timeout=15_000)
        pg.goto(base_url + "/video/")
        pg.wait_for_load_state("networkidle")
        assert not violations, violations
    finally:
        context.close()


def test_pages_fit_a_phone_screen(browser, base_url):
    context = browser.new_context(viewport={"width": 360, "height": 740}, is_mobile=True, has_touch=True)
    try:
        pg = context.new_page()
        for path, name in (("/speech/", "speech-phone"), ("/video/", "video-phone")):
            pg.goto(base_url + path)
            overflow = pg.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{path} scrolls sideways by {overflow}px at 360px wide"
            shot(pg, name)
    finally:
        context.close()


# -- speech ----------------------------------------------------------------------------------------

SENTENCES = "The quick brown fox jumps over the lazy dog. It was a bright cold day in April."


def test_speech_plays_every_sample_and_lights_words_in_order(page, base_url):
    frames = Frames(page)
    page.goto(base_url + "/speech/")
    page.fill("#text", SENTENCES)
    page.evaluate(
        """() => {
          window.__litAt = [];  // the playback position (samples played) at which each word lit
          const played = document.querySelector('#played');
          new MutationObserver((records) => {
            for (const r of records) {
              if (r.target.classList.contains('spoken') && !r.oldValue?.includes('spoken')) {
                window.__litAt.push(Number(played.dataset.value));
              }
            }
          }).observe(document.querySelector('#transcript'),
                     { subtree: true, attributes: true, attributeFilter: ['class'], attributeOldValue: true });
        }"""
    )
    page.click("#speak")
    # Mid-utterance: some words lit, not all (the screenshot shows the highlight).
    page.wait_for_function("document.querySelectorAll('.word.spoken').length >= 4", timeout=20_000)
    shot(page, "speech")
    assert wait_state(page, "done|error|cancelled") == "done", page.locator("#error").text_content()

    dones = frames.of_type("audio.done")
    assert [d["sentence_index"] for d in dones] == [0, 1] and not any(d["error"] for d in dones)
    sent_samples = sum(d["total_bytes"] for d in dones) // 2
    assert sent_samples > RATE * 2  # two sentences of speech
    # Every sample the server sent reached the AudioWorklet, and it played them all.
    assert number(page, "#received") == sent_samples
    assert number(page, "#played") == sent_samples

    words = page.locator(".word")
    stamped = [w["word"] for c in frames.of_type("audio.chunk") if c["timestamps"] for w in c["timestamps"]]
    assert words.all_text_contents() == stamped == SENTENCES.split()
    orders = [int(o) for o in words.evaluate_all("els => els.map(e => e.dataset.order ?? -1)")]
    assert orders == list(range(len(stamped))), "every word lit, in reading order"
    # ... and in time with the audio, measured on the audio's own clock (samples played when a word
    # lit), which a busy machine does not move. A sentence's times come after its audio (the last
    # audio.chunk), so with 2 s pacing the first sentence's first words light together once they
    # arrive; the second sentence's arrive before it plays: its words must light as far apart in the
    # playback as they are spoken (within 150 ms of audio: the worklet reports every few quanta).
    lit = page.evaluate("window.__litAt")
    assert len(lit) == len(stamped) and lit == sorted(lit)
    second = [c["timestamps"] for c in frames.of_type("audio.chunk") if c["timestamps"]][1]
    lit_second = lit[len(stamped) - len(second) :]
    span = (lit_second[-1] - lit_second[0]) * 1000 / RATE
    expected = second[-1]["start_ms"] - second[0]["start_ms"]
    assert abs(span - expected) < 150, f"sentence 2 lit over {span:.0f} ms of audio; its words span {expected} ms"
    assert page.locator("#ttfa").text_content().endswith("ms") or page.locator("#ttfa").text_content().endswith("s")
    assert float(page.locator("#rtf").text_content()) > 0
    # What was heard is kept in the history, as a WAV of every sample.
    href = page.locator(".history-item .download").get_attribute("href")
    assert href.startswith("blob:")
    wav_bytes = page.evaluate("async url => (await (await fetch(url)).arrayBuffer()).byteLength", href)
    assert wav_bytes == 44 + 2 * sent_samples


def test_speech_cancel_mid_stream_stops_playback(page, base_url):
    frames = Frames(page)
    page.goto(base_url + "/speech/")
    page.fill("#text", " ".join([SENTENCES] * 6))
    page.click("#speak")
    page.wait_for_function(f"Number(document.querySelector('#played').dataset.value) > {RATE}", timeout=20_000)
    page.click("#cancel")
    assert wait_state(page, "cancelled", timeout=5_000) == "cancelled"
    shot(page, "speech-cancelled")
    page.wait_for_timeout(300)  # the stop fades out over 8 ms; the last report follows
    stopped_at = number(page, "#played")
    page.wait_for_timeout(1000)
    assert number(page, "#played") == stopped_at, "playback went on after Cancel"
    # The server was still streaming (paced 2 s ahead) and stopped too.
    deadline = time.monotonic() + 5
    while not frames.of_type("session.done") and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert any(d.get("cancelled") for d in frames.of_type("audio.done"))
    assert page.locator(".word.spoken").count() < page.locator(".word").count()
    assert page.locator("#speak").is_enabled()


def test_speech_file_mode_at_half_speed(page, base_url):
    """One encoded file per sentence (speed is only allowed off 1.0 without streaming), decoded here."""
    frames = Frames(page)
    page.goto(base_url + "/speech/")
    page.fill("#text", "   ")
    page.click("#speak")
    assert "nothing to speak" in page.locator("#error").text_content()
    page.select_option("#mode", "file")
    page.select_option("#format", "wav")
    page.eval_on_selector("#speed", "el => { el.value = '0.5'; el.dispatchEvent(new Event('input')); }")
    page.fill("#text", "Short one. Two of them.")
    page.click("#speak")
    assert wait_state(page, "done|error") == "done", page.locator("#error").text_content()
    assert page.locator("#error").is_hidden()
    starts = frames.of_type("audio.start")
    assert [s["format"] for s in starts] == ["wav", "wav"]
    # Files are whole WAVs (44-byte header each); the player got their samples.
    wav_samples = sum((d["total_bytes"] - 44) // 2 for d in frames.of_type("audio.done"))
    assert number(page, "#received") == wav_samples == number(page, "#played")


def test_speech_sends_text_as_it_is_typed(page, base_url):
    frames = Frames(page)
    page.goto(base_url + "/speech/")
    page.fill("#text", "")  # first: live mode sends what the box holds after a 300 ms pause
    page.check("#live")
    page.locator("#text").press_sequentially("Typed live. ", delay=20)
    page.wait_for_function("document.querySelector('#conn').dataset.state === 'open'", timeout=10_000)
    page.wait_for_timeout(600)  # the page sends after a 300 ms pause in typing
    early = "".join(m["text"] for m in frames.sent_of_type("input.text"))
    assert early == "Typed live. " and not frames.sent_of_type("input.done")
    page.locator("#text").press_sequentially("Then flushed.", delay=20)
    page.click("#speak")
    assert wait_state(page, "done|error") == "done", page.locator("#error").text_content()
    assert "".join(m["text"] for m in frames.sent_of_type("input.text")) == "Typed live. Then flushed."
    # typing live the page keeps the default split (none): the text waits for Speak, one request
    assert [s["sentence_text"] for s in frames.of_type("audio.start")] == ["Typed live. Then flushed."]


def test_speech_codec_tokens_decoded_in_the_page(page, base_url):
    """codec_tokens mode: the page decodes the packets itself (static/codec/decoder.js) and plays them."""
    frames = Frames(page)
    page.goto(base_url + "/speech/")
    page.select_option("#mode", "codec")
    page.fill("#text", SENTENCES)
    page.click("#speak")
    assert wait_state(page, "done|error") == "done", page.locator("#error").text_content()
    dones = frames.of_type("codec.done")
    assert len(dones) == 2 and not any(d["error"] for d in dones)
    decoded = sum(d["total_frames"] for d in dones) * 300  # 12.5 ms rows, 300 samples each
    assert decoded > RATE * 2
    assert number(page, "#received") == decoded == number(page, "#played")


class CuttableProxy:
    """Test double: a TCP relay to the server whose open connections can be cut, as a network drop does."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.live: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            with self.lock:
                self.live |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            doomed, self.live = self.live, set()
        for sock in doomed:  # no WebSocket close frame: the browser sees an abnormal closure (1006)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


@pytest.fixture
def proxied_url(base_url: str) -> Iterator[tuple[str, CuttableProxy]]:
    proxy = CuttableProxy(int(base_url.rsplit(":", 1)[1]))
    yield f"http://127.0.0.1:{proxy.port}", proxy
    proxy.close()


def test_speech_reconnects_after_a_dropped_connection(page, proxied_url):
    url, proxy = proxied_url
    page.goto(url + "/speech/")
    page.fill("#text", "First.")
    page.click("#speak")
    assert wait_state(page, "done|error") == "done"
    proxy.cut()
    page.wait_for_selector("#conn[data-state='retrying']", timeout=5_000)
    page.wait_for_selector("#conn[data-state='open']", timeout=10_000)  # back by itself
    page.fill("#text", "Second.")
    page.click("#speak")
    assert wait_state(page, "done|error") == "done"
    assert page.locator("#error").is_hidden()


# -- video -----------------------------------------------------------------------------------------


LAST_ANSWER = ".turn:last-child .answer-text"
START_CAMERA = "Start the camera first: the answers are about what it sees."


def start_camera(pg: Any, base_url: str, fps: str = "1", hands_free: bool = True) -> None:
    """Start the camera (hands-free on, the page's default; off for the hold-to-talk tests)."""
    pg.goto(base_url + "/video/")
    if not hands_free:
        pg.uncheck("#hands-free")
    if fps != "1":
        pg.click("#details summary")
        pg.select_option("#fps", fps)
    pg.click("#start")
    pg.wait_for_selector("#camera-badge:text('Live')", timeout=10_000)
    pg.wait_for_function("Number(document.querySelector('#accepted').dataset.value) >= 2", timeout=15_000)


def ask(pg: Any, text: str) -> None:
    pg.fill("#question", text)
    pg.click("#ask")


def answered(pg: Any, turns: int, timeout: float = 60_000) -> str:
    """Wait until the conversation's ``turns``-th turn has ended; the page's state then."""
    pg.wait_for_function(
        """n => { const t = document.querySelectorAll('.turn');
                  return t.length >= n && !['waiting', 'answering'].includes(t[n - 1].dataset.how); }""",
        arg=turns,
        timeout=timeout,
    )
    return pg.locator("#state").get_attribute("data-state")


def test_video_counts_acks_and_answers_a_typed_question_aloud(page, base_url):
    frames = Frames(page)
    start_camera(page, base_url)
    acks = frames.of_type("video.frame.ack")
    assert number(page, "#sent") >= len(acks) >= 2
    accepted = sum(1 for a in acks if a["accepted"])
    filtered = sum(1 for a in acks if not a["accepted"] and a.get("reason") == "filtered")
    assert (number(page, "#accepted"), number(page, "#filtered")) == (accepted, filtered)
    assert all(a["frame_id"].startswith("f") and isinstance(a["capture_ts_ms"], int) for a in acks)
    assert page.locator("#ack-latency").text_content() != "–"

    ask(page, "What do you see?")
    page.wait_for_function(f"document.querySelector('{LAST_ANSWER}').textContent.trim().length > 0", timeout=30_000)
    page.wait_for_selector("#audio-state[data-state='playing']", state="attached", timeout=30_000)
    shot(page, "video-speaking")
    assert wait_state(page, "done|error", timeout=60_000) == "done", page.locator("#error").text_content()
    (done,) = frames.of_type("response.text.done")
    assert page.locator(LAST_ANSWER).text_content() == done["text"]
    assert number(page, "#played") > RATE // 2  # the spoken answer reached the speakers
    assert page.locator("#first-text").text_content() != "–" and page.locator("#first-audio").text_content() != "–"


def test_video_before_the_camera_ask_says_to_start_it(page, base_url):
    """No camera yet: the page says what to do instead of sending a question the server must refuse."""
    frames = Frames(page)
    page.goto(base_url + "/video/")
    shot(page, "video-idle")
    ask(page, "What do you see?")
    page.wait_for_selector("#error:not([hidden])", timeout=5_000)
    assert page.locator("#error").text_content() == START_CAMERA
    assert frames.sent_of_type("video.query") == []


def hold_talk(page: Any, ms: int) -> None:
    """Hold the Talk button down with the keyboard (Space) for ``ms``, then let go."""
    page.focus("#talk")
    page.keyboard.down("Space")
    page.wait_for_selector("#talk[aria-pressed='true']")
    page.wait_for_timeout(ms)
    page.keyboard.up("Space")
    page.wait_for_function("document.querySelector('#talk').getAttribute('aria-pressed') === 'false'")


def test_video_push_to_talk_sends_16khz_pcm(page, base_url):
    """Holding Talk streams the microphone as PCM16 at 16 kHz; letting go asks the question."""
    frames = Frames(page)
    start_camera(page, base_url, hands_free=False)
    hold_talk(page, 1500)
    page.wait_for_timeout(500)
    chunks = frames.sent_of_type("audio.chunk")
    pcm_bytes = sum(len(base64.b64decode(c["data"])) for c in chunks)
    seconds = pcm_bytes / 2 / 16000
    assert 1.2 < seconds < 2.2, f"{seconds:.2f} s of 16 kHz audio for a 1.5 s press"
    assert frames.sent_of_type("video.query")[-1]["text"] == ""
    # The fake microphone plays a beep, not words: whatever the server makes of it, the page settles.
    assert wait_state(page, "done|error", timeout=60_000) in ("done", "error")


def test_video_a_tap_on_talk_sends_no_audio(page, base_url):
    """A press too short for a question is dropped in the page: nothing reaches the server's buffer."""
    frames = Frames(page)
    start_camera(page, base_url, hands_free=False)
    hold_talk(page, 100)
    page.wait_for_selector("#error:not([hidden])", timeout=5_000)
    assert "too short" in page.inner_text("#error")
    page.wait_for_timeout(300)
    assert frames.sent_of_type("audio.chunk") == [] and frames.sent_of_type("video.query") == []


def test_video_reconnects_after_a_dropped_connection(page, proxied_url):
    url, proxy = proxied_url
    start_camera(page, url)
    proxy.cut()
    page.wait_for_selector("#conn[data-state='retrying']", timeout=5_000)
    page.wait_for_selector("#conn[data-state='open']", timeout=10_000)
    before = number(page, "#accepted")
    page.wait_for_function(f"Number(document.querySelector('#accepted').dataset.value) >= {before + 2}", timeout=10_000)


# Logs, in order, every JSON message the page's WebSockets send and receive (a message before the
# page handles it: this listener is registered first). With the MutationObservers of the test, the
# order of what the page received and what it did is exact, whatever the machine's speed.
SOCKET_LOG = """(() => {
  const Native = window.WebSocket;
  window.__events = [];
  const log = (dir, data) => {
    if (typeof data !== 'string') return;
    try { window.__events.push([dir, JSON.parse(data).type]); } catch (e) {}
  };
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener('message', (e) => log('in', e.data));
    }
    send(data) { log('out', data); return super.send(data); }
  };
})();"""


def test_video_second_question_stops_the_first_answer_at_once(page, base_url):
    """A second question stops the first answer: nothing of it is played or shown after the second
    question's first event (its ``response.start``), and the server sends nothing of it after that.

    Asserted as an order of events, not a duration (how fast: bench/video_latency.py's interrupt).
    """
    frames = Frames(page)
    page.add_init_script(SOCKET_LOG)
    start_camera(page, base_url)
    ask(page, "Describe what you see.")
    page.wait_for_selector("#audio-state[data-state='playing']", state="attached", timeout=30_000)
    # From here on, the answer's audio state and the first answer's text join the same log.
    page.evaluate(
        """() => {
          const state = document.querySelector('#audio-state');
          new MutationObserver(() => window.__events.push(['audio', state.dataset.state]))
            .observe(state, { attributes: true, attributeFilter: ['data-state'] });
          const first = document.querySelectorAll('.turn')[0].querySelector('.answer-text');
          new MutationObserver(() => window.__events.push(['first answer', first.textContent]))
            .observe(first, { characterData: true, childList: true, subtree: true });
          window.__events.push(['mark', '']);
        }"""
    )
    ask(page, "How many faces are there?")
    assert answered(page, 2) == "done", page.locator("#error").text_content()
    events = page.evaluate("window.__events")
    after = events[events.index(["mark", ""]) :]
    queried = after.index(["out", "video.query"])
    started = after.index(["in", "response.start"], queried)  # the second question's first event
    first_audio = after.index(["in", "response.audio.delta"], started)  # the second answer's
    audio = [state for kind, state in after if kind == "audio"]
    assert audio and audio[0] == "stopped", f"the first answer's audio did not stop first: {audio}"
    assert ["audio", "playing"] not in after[:first_audio], f"the first answer played on: {after[:first_audio]}"
    assert [e for e in after[started:] if e[0] == "first answer"] == [], "the first answer changed after"
    # On the wire: after the second response.start, only the second answer (its deltas make its text).
    wire = frames.messages
    second = max(i for i, m in enumerate(wire) if m["type"] == "response.start")
    done = [m for m in wire[second:] if m["type"] == "response.text.done"]
    deltas = "".join(m["delta"] for m in wire[second:] if m["type"] == "response.text.delta")
    assert len(done) == 1 and done[0]["text"] == deltas
    turns = page.locator(".turn")
    assert turns.count() == 2
    assert turns.nth(0).get_attribute("data-how") == "interrupted"
    assert turns.nth(1).get_attribute("data-how") == "answered"
    assert page.locator(LAST_ANSWER).text_content() == frames.of_type("response.text.done")[-1]["text"]


# -- issue 16: defects, conversation, history, schemes, phone widths -------------------------------


def test_video_speak_the_answer_toggle_keeps_the_session_state(page, base_url):
    """Unticking "Speak the answer" changes the session's modalities without losing its frames.

    The protocol fixes modalities per session, so the page starts a new one at the next question and
    sends it the latest frames first: the question right after the toggle is answered (at one frame
    every 2 s the new session would otherwise have none), and the conversation stays on screen.
    """
    frames = Frames(page)
    start_camera(page, base_url, fps="0.5")
    ask(page, "What do you see?")
    assert answered(page, 1) == "done", page.locator("#error").text_content()
    page.uncheck("#speak-answer")
    ask(page, "How many faces are there?")
    assert answered(page, 2) == "done", page.locator("#error").text_content()
    assert page.locator("#error").is_hidden()
    configs = frames.sent_of_type("session.config")
    assert [c["modalities"] for c in configs] == [["text", "audio"], ["text"]]
    assert not any(m.get("message") == "No frames buffered" for m in frames.of_type("error"))
    turns = page.locator(".turn")
    assert turns.count() == 2 and turns.nth(0).locator(".replay").count() == 1  # the first kept its audio
    assert turns.nth(1).locator(".replay").count() == 0  # text only
    assert page.locator(LAST_ANSWER).text_content() == frames.of_type("response.text.done")[-1]["text"]


def test_video_stop_clears_the_error_and_ask_says_to_start_the_camera(page, base_url):
    frames = Frames(page)
    start_camera(page, base_url, hands_free=False)
    hold_talk(page, 100)  # a tap: the page shows an error
    page.wait_for_selector("#error:not([hidden])", timeout=5_000)
    page.click("#stop")
    assert page.locator("#error").is_hidden(), "the old error stayed after Stop"
    ask(page, "What do you see?")
    page.wait_for_selector("#error:not([hidden])", timeout=5_000)
    assert page.locator("#error").text_content() == START_CAMERA
    page.wait_for_timeout(300)
    assert frames.sent_of_type("video.query") == []
    shot(page, "video-error")


def test_video_nothing_heard_is_said_in_words(page, base_url):
    """An empty transcript shows as "Nothing was heard", never as empty quotes.

    Test double: the page's socket goes through Playwright's WebSocket route, which blanks the
    server's input.transcript (the fake microphone's beep is not reliably heard as nothing).
    """

    def route(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_server(message: str | bytes) -> None:
            if isinstance(message, str) and '"input.transcript"' in message:
                message = json.dumps({**json.loads(message), "text": ""})
            ws.send(message)

        server.on_message(from_server)
        ws.on_message(lambda message: server.send(message))

    page.route_web_socket("**/v1/video/chat/stream", route)
    start_camera(page, base_url, hands_free=False)
    hold_talk(page, 1200)
    page.wait_for_selector(".turn .question.unheard", timeout=60_000)
    text = page.locator(".turn .question-text").text_content()
    assert text.startswith("Nothing was heard") and "“”" not in page.inner_text(".conversation")
    wait_state(page, "done|error", timeout=60_000)


def test_video_frame_counter_wording_is_not_data_loss(page, base_url):
    page.goto(base_url + "/video/")
    page.click("#details summary")
    labels = page.locator(".counter small").all_text_contents()
    assert "dropped (buffer full)" not in labels and "rolled off (oldest)" in labels
    assert "pushes out the oldest" in page.locator("#counters-hint").text_content()


def test_video_conversation_lists_turns_and_plays_answers_again(page, base_url):
    frames = Frames(page)
    start_camera(page, base_url)
    page.wait_for_selector("#conversation-empty:not([hidden])")
    first_answer_samples = 0
    for i, question in enumerate(("What do you see?", "Is it bright?"), 1):
        ask(page, question)
        assert answered(page, i) == "done", page.locator("#error").text_content()
        first_answer_samples = first_answer_samples or number(page, "#played")  # played out in full
    assert page.locator("#conversation-empty").is_hidden()
    turns = page.locator(".turn")
    assert turns.count() == 2
    assert turns.locator(".question-text").all_text_contents() == ["What do you see?", "Is it bright?"]
    answers = [d["text"] for d in frames.of_type("response.text.done")]
    assert turns.locator(".answer-text").all_text_contents() == answers  # newest at the bottom
    shot(page, "video-conversation")
    turns.nth(0).locator(".replay").click()
    page.wait_for_selector("#audio-state[data-state='playing']", state="attached", timeout=10_000)
    assert wait_state(page, "done", timeout=30_000) == "done"
    assert number(page, "#played") == first_answer_samples > RATE // 2  # the first answer, all of it again
    assert len(frames.sent_of_type("video.query")) == 2  # playing again asks the server nothing


def test_video_states_listening_and_thinking(page, base_url):
    start_camera(page, base_url, hands_free=False)
    shot(page, "video-ready")
    page.focus("#talk")
    page.keyboard.down("Space")
    page.wait_for_selector("#state[data-state='listening']")
    page.wait_for_timeout(700)
    shot(page, "video-listening")
    page.keyboard.up("Space")
    page.wait_for_selector("#state[data-state='thinking']", timeout=5_000)
    shot(page, "video-thinking")
    wait_state(page, "done|error", timeout=60_000)


def test_video_answer_is_visible_without_scrolling_on_a_phone(browser, base_url):
    context = browser.new_context(
        viewport={"width": 360, "height": 740}, is_mobile=True, has_touch=True, bypass_csp=True
    )
    try:
        pg = context.new_page()
        start_camera(pg, base_url)
        ask(pg, "What do you see?")
        assert wait_state(pg, "done|error", timeout=60_000) == "done"
        box = pg.evaluate(
            f"""() => {{
              const r = document.querySelector('{LAST_ANSWER}').getBoundingClientRect();
              return {{ top: r.top, bottom: r.bottom, height: innerHeight, scrollY }};
            }}"""
        )
        assert box["scrollY"] == 0 and 0 <= box["top"] < box["height"], box
        assert pg.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
        pg.screenshot(path=str(SCREENSHOTS / "video-phone-answer.png"))  # the first screen, as seen
    finally:
        context.close()


def test_speech_speed_works_in_codec_delivery(page, base_url):
    frames = Frames(page)
    page.goto(base_url + "/speech/")
    page.select_option("#mode", "codec")
    assert page.locator("#speed").is_enabled()
    page.eval_on_selector("#speed", "el => { el.value = '1.5'; el.dispatchEvent(new Event('input')); }")
    page.fill("#text", "Faster, please.")
    page.click("#speak")
    assert wait_state(page, "done|error") == "done", page.locator("#error").text_content()
    config = frames.sent_of_type("session.config")[-1]
    assert config["output_mode"] == "codec_tokens" and config["speed"] == 1.5
    assert "1.50×" in page.locator(".history-item .meta").text_content()


def test_speech_history_plays_downloads_and_clears(page, base_url):
    frames = Frames(page)
    page.goto(base_url + "/speech/")
    assert page.locator("#history-empty").is_visible() and page.locator("#clear-history").is_disabled()
    page.fill("#text", "")
    page.click("#speak")
    shot(page, "speech-error")
    page.fill("#text", "The first thing I said.")
    page.click("#speak")
    page.wait_for_selector("#state[data-state='speaking'], #state[data-state='playing']")
    shot(page, "speech-speaking")
    assert wait_state(page, "done|error") == "done"
    page.select_option("#mode", "file")
    page.select_option("#format", "mp3")
    page.fill("#text", "And then a second one.")
    page.click("#speak")
    assert wait_state(page, "done|error") == "done", page.locator("#error").text_content()
    items = page.locator(".history-item")
    assert items.count() == 2
    assert items.locator(".said").all_text_contents() == ["And then a second one.", "The first thing I said."]
    voice = page.locator("#voice").input_value()
    metas = items.locator(".meta").all_text_contents()
    assert metas[0].startswith(f"{voice} · mp3 files") and metas[1].startswith(f"{voice} · streamed PCM")
    shot(page, "speech-history")
    # The player plays it (every sample the server sent for the first utterance) ...
    first_samples = sum(d["total_bytes"] for d in frames.of_type("audio.done") if d["utterance_index"] == 0) // 2
    duration = (
        items.nth(1)
        .locator("audio")
        .evaluate(
            "a => new Promise(ok => a.readyState >= 1 ? ok(a.duration)"
            " : a.addEventListener('loadedmetadata', () => ok(a.duration)))"
        )
    )
    assert abs(duration - first_samples / RATE) < 0.01
    items.nth(1).locator("audio").evaluate("a => a.play()")
    page.wait_for_function("document.querySelectorAll('.history-item audio')[1].currentTime > 0.2", timeout=10_000)
    # ... and the download is that audio as a WAV file.
    download = items.nth(1).locator(".download")
    assert download.get_attribute("download").endswith(".wav")
    size = page.evaluate(
        "async url => (await (await fetch(url)).arrayBuffer()).byteLength", download.get_attribute("href")
    )
    assert size == 44 + 2 * first_samples
    page.click("#clear-history")
    assert items.count() == 0 and page.locator("#history-empty").is_visible()


def relative_luminance(rgb: str) -> float:
    channels = [int(c) / 255 for c in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3]]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    la, lb = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_colour_scheme_follows_the_system_setting(browser, base_url, scheme):
    context = browser.new_context(viewport={"width": 1100, "height": 900}, color_scheme=scheme)
    try:
        pg = context.new_page()
        for path, name in (("/", "index"), ("/speech/", "speech"), ("/video/", "video")):
            pg.goto(base_url + path)
            colours = pg.evaluate(
                """() => {
                  const css = (sel, prop) => getComputedStyle(document.querySelector(sel))[prop];
                  return { bg: css('body', 'backgroundColor'), fg: css('body', 'color'),
                           panel: css('.panel', 'backgroundColor'), muted: css('.lead', 'color') };
                }"""
            )
            dark = relative_luminance(colours["bg"]) < 0.05
            assert dark == (scheme == "dark"), (path, colours)
            assert contrast(colours["fg"], colours["bg"]) >= 7, (path, colours)
            assert contrast(colours["muted"], colours["panel"]) >= 4.5, (path, colours)
            assert contrast(colours["muted"], colours["bg"]) >= 4.5, (path, colours)
            if path != "/":
                pg.click("#details summary")
            shot(pg, f"{name}-{scheme}")
    finally:
        context.close()


def test_error_pages_are_styled(page, base_url):
    response = page.goto(base_url + "/no/such/page")
    assert response.status == 404
    assert page.locator("h1").text_content() == "There is no page here"
    assert page.evaluate("getComputedStyle(document.querySelector('.oops')).textAlign") == "center"
    assert page.locator("a[href='/speech/']").count() >= 1
    shot(page, "404")
    icon = page.locator("link[rel='icon']").get_attribute("href")
    assert page.request.get(base_url + icon).status == 200
    from django.template.loader import render_to_string

    page.set_content(render_to_string("500.html"))  # same origin: its stylesheet loads from the server
    page.wait_for_load_state("load")
    assert page.locator("h1").text_content() == "Something went wrong on the server"
    shot(page, "500")


# -- issue 36: the pages read what the server means ------------------------------------------------


def test_named_states_refuse_a_move_their_table_does_not_list(page, base_url):
    """The pages' state machines (``Machine`` in static/js/common.js): a listed move happens, any
    other is refused: the state stays, the move returns false and the refusal is logged."""
    page.goto(base_url + "/")
    result = page.evaluate(
        """async () => {
          const { Machine } = await import('/static/js/common.js');
          const logged = [];
          const log = console.error;
          console.error = (text) => logged.push(text);
          try {
            const seen = [];
            const door = new Machine('door', 'shut', { shut: ['open', 'locked'], open: ['shut'], locked: ['shut'] },
                                     (state) => seen.push(state));
            const opened = door.move('open');
            const locked = door.move('locked');  // an open door cannot be locked
            return { opened, locked, state: door.state, seen, logged };
          } finally {
            console.error = log;
          }
        }"""
    )
    assert result == {
        "opened": True,
        "locked": False,
        "state": "open",
        "seen": ["open"],
        "logged": ["door: refused move open → locked"],
    }


@pytest.fixture(scope="module")
def quiet_url() -> Iterator[str]:
    """daphne as ``base_url`` runs it, but ending a session after 1 s without a message (its idle
    timeout: the server's ``error`` of kind ``timeout``)."""
    port = free_port()
    args = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"]
    quiet = {"OMNIWEB_SPEECH_IDLE_TIMEOUT": "1", "OMNIWEB_VIDEO_IDLE_TIMEOUT": "1"}
    with live_server(args, port, OMNIWEB_ENGINE_MAX_AHEAD_SECONDS="2", **quiet) as base:
        yield base


class SocketRoute:
    """Test double between a page and the real server: every message passes, in order, and is
    recorded. ``reword`` gives every server ``error`` other words (its kind stays); ``relay`` may
    change a server message on its way to the page, ``spoil`` replace or hold one of the page's.
    Installed with ``page.route_web_socket``."""

    def __init__(self, reword: str | None = None) -> None:
        self.reword = reword
        self.received: list[dict[str, Any]] = []  # from the server, as it sent them
        self.sent: list[dict[str, Any]] = []  # from the page, as it sent them

    def relay(self, msg: dict[str, Any]) -> dict[str, Any]:
        """What reaches the page for a message of the server."""
        if msg.get("type") == "error" and self.reword is not None:
            return {**msg, "message": self.reword}
        return msg

    def spoil(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
        """What reaches the server for a message of the page: nothing, it, or more."""
        return [msg]

    def errors(self) -> list[dict[str, Any]]:
        return [m for m in self.received if m.get("type") == "error"]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.received if m.get("type") == kind]

    def __call__(self, ws: Any) -> None:
        server = ws.connect_to_server()

        def from_server(message: str | bytes) -> None:
            if isinstance(message, str):
                msg = json.loads(message)
                self.received.append(msg)
                message = json.dumps(self.relay(msg))
            ws.send(message)

        def from_page(message: str | bytes) -> None:
            if isinstance(message, bytes):
                server.send(message)
                return
            msg = json.loads(message)
            self.sent.append(msg)
            for out in self.spoil(msg):
                server.send(json.dumps(out))

        server.on_message(from_server)
        ws.on_message(from_page)


def wait_until(pg: Any, done: Any, what: str, ceiling_s: float = 30.0) -> None:
    """Let the page run until ``done()`` (a route's record), with a ceiling so a hang fails."""
    deadline = time.monotonic() + ceiling_s
    while not done():
        assert time.monotonic() < deadline, f"never happened: {what}"
        pg.wait_for_timeout(50)


def test_speech_reads_the_kind_of_an_error_not_its_words(page, quiet_url):
    """An idle timeout (kind ``timeout``) ends the session without a word to the person, and Speak
    opens a new one; a refused message (``client_error``) is shown. Every error reaches the page
    with an idle timeout's words, which the page must not read; before the second Speak's
    ``input.done`` the route slips in a message the server refuses."""
    route = SocketRoute(reword="Idle timeout: no message received")
    slip = []

    def spoil(msg: dict[str, Any]) -> list[dict[str, Any]]:
        if slip and msg["type"] == "input.done":
            slip.clear()
            return [{"type": "no.such.message"}, msg]
        return [msg]

    route.spoil = spoil
    page.route_web_socket("**/v1/audio/speech/stream", route)
    page.goto(quiet_url + "/speech/")
    page.fill("#text", "First.")
    page.click("#speak")
    assert wait_state(page, "done|error") == "done", page.locator("#error").text_content()
    # 1 s without a message after the utterance: the server ends the session.
    wait_until(page, route.errors, "the server's idle timeout")
    assert [e["kind"] for e in route.errors()] == ["timeout"]
    page.wait_for_selector("#conn[data-state='closed']", timeout=10_000)
    assert page.locator("#conn").text_content().strip() == "Disconnected; reconnects when needed"
    assert page.locator("#error").is_hidden()
    assert page.locator("#state").get_attribute("data-state") == "done"
    slip.append(True)
    page.fill("#text", "Second.")
    page.click("#speak")  # a new session, then the refused message, then the utterance
    # The state still says the first utterance's "done" until the page acts on the click: wait for
    # the second utterance's input.done to be sent before reading it.
    wait_until(page, lambda: [c["type"] for c in route.sent].count("input.done") == 2, "the second input.done")
    assert wait_state(page, "done|error") == "done", page.locator("#error").text_content()
    refused = route.errors()[1]
    assert refused["kind"] == "client_error" and refused["message"].startswith("Unknown message type")
    assert page.locator("#error").text_content() == "The server said: Idle timeout: no message received"
    assert [c["type"] for c in route.sent].count("session.config") == 2


class SpoiledFrames(SocketRoute):
    """Frames whose image the server refuses (valid base64, not a JPEG or PNG): ``hold_next`` keeps
    the page's next frame back, spoilt, until its next ``video.query`` (it reaches the server just
    before it); ``all`` spoils every frame."""

    def __init__(self, reword: str, *, all: bool = False) -> None:
        super().__init__(reword)
        self.all = all
        self.hold_next = False
        self.held: dict[str, Any] | None = None

    def spoil(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
        if msg["type"] == "video.frame" and (self.all or (self.hold_next and self.held is None)):
            spoilt = {**msg, "data": base64.b64encode(b"not an image").decode()}
            if self.all:
                return [spoilt]
            self.held = spoilt
            return []
        if msg["type"] == "video.query" and self.held is not None:
            held, self.held, self.hold_next = self.held, None, False
            return [held, msg]
        return [msg]


def test_video_a_refused_frame_does_not_end_the_question(page, base_url):
    """A frame the server refuses (``client_error``) is shown, and the question asked after it is
    still answered although the refusal comes while the question waits for its answer: the page
    knows it is the frame's because the server answers every frame, in order, and that frame was
    sent before the question. The route holds one frame back (spoilt) until the question and
    rewords every error as a refused question's, which the page must not read."""
    route = SpoiledFrames(reword="No frames buffered")
    page.route_web_socket("**/v1/video/chat/stream", route)
    start_camera(page, base_url)
    route.hold_next = True
    wait_until(page, lambda: route.held is not None, "a frame held back")
    ask(page, "What do you see?")
    assert answered(page, 1) == "done", page.locator("#error").text_content()
    assert page.locator(".turn").get_attribute("data-how") == "answered"
    assert page.locator(LAST_ANSWER).text_content() == route.of_type("response.text.done")[-1]["text"]
    (refused,) = route.errors()
    assert refused["kind"] == "client_error" and refused["message"].startswith("Invalid image data")
    assert page.locator("#error").text_content() == "The server said: No frames buffered"
    # On the wire: the spoilt frame, then the question; the server refused the frame first.
    types = [m["type"] for m in route.received]
    assert types.index("error") < types.index("response.start")


def test_video_a_refused_question_ends_at_once(page, base_url):
    """A question the server refuses (``client_error`` once every frame sent before it has had its
    answer: no frames buffered) ends as failed at once. The route spoils every frame, so the server
    keeps none, and rewords every error as a refused frame's, which the page must not read."""
    route = SpoiledFrames(reword="Invalid image data", all=True)
    page.route_web_socket("**/v1/video/chat/stream", route)
    page.goto(base_url + "/video/")
    page.click("#start")
    page.wait_for_selector("#camera-badge:text('Live')", timeout=10_000)
    wait_until(page, lambda: len(route.errors()) >= 2, "two frames refused")
    ask(page, "What do you see?")
    assert answered(page, 1) == "error"
    assert page.locator(".turn").get_attribute("data-how") == "failed"
    refusal = next(e for e in route.errors() if not e["message"].startswith("Invalid image data"))
    assert refusal == {"type": "error", "message": "No frames buffered", "kind": "client_error"}
    assert page.locator("#error").text_content() == "The server said: Invalid image data"
    assert number(page, "#accepted") == 0


def test_video_an_idle_timeout_is_not_an_error(page, quiet_url):
    """A server that ends a session after 1 s without a message: the page sends it frames twice a
    second, until the route holds them back (to the server the page falls quiet). The session ends
    with an ``error`` of kind ``timeout``, which the page does not show; the camera being on, it opens
    a new session (sending it its latest frames), and a question is answered."""

    class Quiet(SocketRoute):
        def __init__(self) -> None:
            super().__init__()
            self.quiet = False

        def relay(self, msg: dict[str, Any]) -> dict[str, Any]:
            if msg.get("kind") == "timeout":
                self.quiet = False  # the next session hears the page again
            return msg

        def spoil(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
            return [] if self.quiet else [msg]  # frames, microphone chunks (hands-free), pings

    route = Quiet()
    page.route_web_socket("**/v1/video/chat/stream", route)
    start_camera(page, quiet_url, fps="2")
    configs = [m["type"] for m in route.sent].count("session.config")
    route.quiet = True
    wait_until(page, route.errors, "the server's idle timeout")
    assert {e["kind"] for e in route.errors()} == {"timeout"}
    page.wait_for_function(  # a new session, and the frames it was sent (the latest ones) kept
        f"Number(document.querySelector('#accepted').dataset.value) >= {number(page, '#accepted') + 2}",
        timeout=15_000,
    )
    assert [m["type"] for m in route.sent].count("session.config") > configs
    assert page.locator("#error").is_hidden()
    ask(page, "What do you see?")
    assert answered(page, 1) == "done", page.locator("#error").text_content()
    assert page.locator("#error").is_hidden()
    assert {e["kind"] for e in route.errors()} == {"timeout"}


def test_speech_plays_each_sentence_at_the_rate_its_audio_start_states(page, base_url):
    """The page reads the rate of each sentence's audio from ``audio.start`` (and each
    ``audio.chunk``). The route says half the real rate for the same samples: the page resamples
    them to its timeline (the rate the page's data states), so twice as many samples reach the player."""

    class HalfRate(SocketRoute):
        def relay(self, msg: dict[str, Any]) -> dict[str, Any]:
            return {**msg, "sample_rate": msg["sample_rate"] // 2} if "sample_rate" in msg else msg

    route = HalfRate()
    page.route_web_socket("**/v1/audio/speech/stream", route)
    page.goto(base_url + "/speech/")
    page.fill("#text", "Half the rate.")
    page.click("#speak")
    assert wait_state(page, "done|error") == "done", page.locator("#error").text_content()
    starts = route.of_type("audio.start")
    assert starts and all(s["sample_rate"] == RATE for s in starts)  # what the server said
    sent = sum(m["total_bytes"] for m in route.of_type("audio.done")) // 2
    assert number(page, "#received") == 2 * sent == number(page, "#played")


def test_video_plays_the_answer_at_the_rate_its_wav_states(page, base_url):
    """Nothing in the page assumes the answer's rate: each ``response.audio.delta`` WAV says it.
    The route rewrites every WAV's header to 16 kHz (same samples): the page shows that rate and
    its player reads every sample at it."""

    class At16k(SocketRoute):
        def relay(self, msg: dict[str, Any]) -> dict[str, Any]:
            if msg.get("type") != "response.audio.delta":
                return msg
            wav = bytearray(base64.b64decode(msg["data"]))
            wav[24:28] = (16000).to_bytes(4, "little")  # the fmt chunk's rate, then its bytes per second
            wav[28:32] = (32000).to_bytes(4, "little")
            return {**msg, "data": base64.b64encode(bytes(wav)).decode()}

    route = At16k()
    page.route_web_socket("**/v1/video/chat/stream", route)
    start_camera(page, base_url)
    ask(page, "What do you see?")
    assert answered(page, 1) == "done", page.locator("#error").text_content()
    wavs = [base64.b64decode(m["data"]) for m in route.of_type("response.audio.delta")]
    assert wavs and all(int.from_bytes(w[24:28], "little") == RATE for w in wavs)  # what the server said
    assert page.locator("#answer-rate").get_attribute("data-value") == "16000"
    assert number(page, "#played") == sum((len(w) - 44) // 2 for w in wavs)
