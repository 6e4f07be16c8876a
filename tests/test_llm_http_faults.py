"""The ``llm`` thinker's HTTP source against a scripted OpenAI-compatible server on loopback.

A real server (``tests/test_llm_thinker.py`` runs llama.cpp's) does not fail on demand: this fake
one (``support.upstream``) does. It speaks the streaming format (server-sent events, ``data:
{chunk}`` ... ``data: [DONE]``), records what it received and is scripted per test, so these check
the faults (HTTP errors, malformed and cut-short streams, timeouts, an unreachable server, a server
that ignores ``stream: true``, function calls that do not fit), that an abort closes the
connection, that a slow server never stalls speech streams, and the request's shape (frames as
image parts, the perception facts, history, system prompt, key, model, the token cap, the tools).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import cv2
import numpy as np
import pytest
from django.test import override_settings
from support.engine import CEILING, WireSink, typed_request
from support.upstream import Handler, Upstream, calls, endless, serve, status, stream

from omniweb.engine.messages import Chunk, End, PcmAudio, ToolCall, to_wire
from omniweb.engine.requests import AnswerRequest, HistoryEntry, SpeakRequest
from omniweb.engine.scheduler import Scheduler
from omniweb.llm.chat import HttpChat
from omniweb.llm.prompt import DEFAULT_SYSTEM_PROMPT, FACTS_LEAD
from video.engine.llm import LlmThinker
from video.engine.pipeline import PIPELINE, VideoTurnPipeline
from video.engine.thinkers import Frame, ThinkerError, Turn

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
WEATHER = {"name": "get_weather", "description": "The weather now in a city.", "parameters": json.dumps(WEATHER_SCHEMA)}


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with serve() as state:
        yield state


@pytest.fixture
def fresh(upstream: Upstream) -> Upstream:
    upstream.requests.clear()
    upstream.disconnected.clear()
    upstream.release.clear()
    return upstream


@pytest.fixture(scope="module")
def pipeline(upstream: Upstream) -> VideoTurnPipeline:
    with override_settings(
        THINKER="llm",
        LLM_URL=upstream.url,
        LLM_MODEL_PATH="",
        LLM_MODEL="served-model",
        LLM_API_KEY="",
        LLM_TIMEOUT=1.0,
        LLM_IMAGES="off",
        LLM_MAX_TOKENS=64,
    ):
        return VideoTurnPipeline()


@pytest.fixture
def scheduler(pipeline: VideoTurnPipeline) -> Iterator[Scheduler]:
    sched = Scheduler({PIPELINE: pipeline}, workers=2)
    sched.start()
    yield sched
    sched.stop()


def frame(bgr: tuple[int, int, int], fmt: str = ".jpg") -> bytes:
    ok, data = cv2.imencode(fmt, np.full((48, 64, 3), bgr, np.uint8))
    assert ok
    return data.tobytes()


def run_turn(sched: Scheduler, request: dict[str, Any], timeout: float = 60) -> list[dict[str, Any]]:
    sink = WireSink()
    sched.submit(f"r{time.monotonic_ns()}", typed_request(AnswerRequest, **request), sink)
    assert sink.ended.wait(timeout), [c["type"] for c in sink.chunks]
    return sink.chunks


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in chunks if c["type"] == "text")


def thinker(upstream: Upstream, api_key: str = "", **kw: Any) -> LlmThinker:
    args: dict[str, Any] = {"model": "served-model", "max_tokens": 512, **kw}
    return LlmThinker(HttpChat(upstream.url, api_key, timeout=1.0), **args)


def answer(t: LlmThinker, turn: Turn, timeout: float = 10) -> str:
    """The run's text, waiting (as the engine's loop does) on ``subscribe`` while nothing arrived."""
    run = t.start(turn)
    deltas: list[str] = []
    arrived = threading.Event()
    deadline = time.monotonic() + timeout
    try:
        while not run.done:
            assert time.monotonic() < deadline
            if run.pending():
                arrived.clear()
                run.subscribe(arrived.set)
                arrived.wait(0.5)
                continue
            deltas.extend(p for p in run.step() if isinstance(p, str))
    finally:
        run.close()
    return "".join(deltas)


# -- the request's shape ---------------------------------------------------------------------------


def test_frames_history_and_prompt_reach_the_server(fresh):
    fresh.script = stream(["The wall ", "is blue. ", "Nobody is ", "there."])
    frames = [Frame("a", frame((200, 0, 0)), 0), Frame("b", frame((0, 200, 0), ".png"), 500)]
    entries = (HistoryEntry(role="user", content="Hi"), HistoryEntry(role="assistant", content="Hello!"))
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    turn = Turn("What do you see?", frames, history, system_prompt="Be brief.", model="qwen-vl", entries=entries)
    t = thinker(fresh, api_key="sekret", images=True, max_tokens=64)
    assert answer(t, turn) == "The wall is blue. Nobody is there."
    (req,) = fresh.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == "Bearer sekret"
    body = req["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "qwen-vl" and body["max_tokens"] == 64
    assert "tools" not in body and "tool_choice" not in body
    messages = body["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1:3] == history
    user = messages[3]
    assert user["role"] == "user" and len(messages) == 4
    images = [p["image_url"]["url"] for p in user["content"] if p["type"] == "image_url"]
    assert [u.split(",")[0] for u in images] == ["data:image/jpeg;base64", "data:image/png;base64"]
    assert [base64.b64decode(u.split(",", 1)[1]) for u in images] == [f.data for f in frames]
    assert user["content"][-1] == {"type": "text", "text": "What do you see?"}


def test_without_images_on_the_frames_stay_out_and_the_question_is_plain_text(fresh):
    fresh.script = stream(["Blue."])
    turn = Turn("What colour?", [Frame("a", frame((200, 0, 0)), 0)])
    assert answer(thinker(fresh), turn) == "Blue."
    messages = fresh.requests[0]["body"]["messages"]
    assert messages[-1] == {"role": "user", "content": "What colour?"}
    assert "image_url" not in json.dumps(messages)


def test_defaults_when_the_session_sets_none(fresh):
    fresh.script = stream(["Fine."], done=False)  # no [DONE]: the finish_reason then the close end it
    assert answer(thinker(fresh, max_tokens=96), Turn("", [Frame(None, frame((1, 2, 3)), None)])) == "Fine."
    body = fresh.requests[0]["body"]
    assert body["model"] == "served-model" and body["max_tokens"] == 96  # the thinker's cap, always sent
    assert body["messages"] == [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "What do you see?"},  # nothing asked: say what is seen
    ]
    assert "Authorization" not in fresh.requests[0]["headers"]


@pytest.mark.parametrize(("asked", "sent"), [(20, 20), (1000, 96)], ids=["less", "more-than-the-cap"])
def test_a_turn_may_ask_for_fewer_tokens_never_more(fresh, asked, sent):
    fresh.script = stream(["Ok."])
    assert answer(thinker(fresh, max_tokens=96), Turn("q", [], max_tokens=asked)) == "Ok."
    assert fresh.requests[0]["body"]["max_tokens"] == sent


def test_the_facts_go_with_the_frames(fresh):
    """With the perception models, the user turn carries what they measured, before the question:
    in one plain string without images, as a text part after the images with them."""
    from support.photos import jpeg, photo

    from video.engine.perception import shared

    turn = Turn("What is this?", [Frame("c", jpeg(photo("coffee")), 0)])
    fresh.script = stream(["A cup."])
    assert answer(thinker(fresh, models=shared()), turn) == "A cup."
    assert answer(thinker(fresh, models=shared(), images=True), turn) == "A cup."
    plain, parts = (r["body"]["messages"][-1]["content"] for r in fresh.requests)
    facts, question = plain.split("\n\n")
    assert facts.startswith(FACTS_LEAD) and "It looks like a cup of coffee." in facts
    assert question == "What is this?"
    assert [p["type"] for p in parts] == ["image_url", "text", "text"]
    assert parts[1:] == [{"type": "text", "text": facts}, {"type": "text", "text": "What is this?"}]


# -- faults ----------------------------------------------------------------------------------------


def test_a_server_that_ignores_stream_true(fresh):
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "All at once."}}]}
    fresh.script = status(200, json.dumps(reply))
    assert answer(thinker(fresh), Turn("q", [])) == "All at once."


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (401, "refused our credentials (HTTP 401)"),
        (404, "not found (HTTP 404)"),
        (429, "busy"),
        (400, "rejected the request (HTTP 400)"),
        (500, "failed (HTTP 500)"),
    ],
)
def test_http_errors_are_clear_and_client_safe(fresh, code, expected):
    fresh.script = status(code, '{"error": {"message": "secret internal detail /srv/model.bin"}}')
    with pytest.raises(ThinkerError) as err:
        answer(thinker(fresh), Turn("q", []))
    assert expected in str(err.value) and "language model" in str(err.value)
    assert "secret" not in str(err.value)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (lambda h: (h.start_stream(), h.event("{not json")), "malformed stream"),
        (lambda h: (h.start_stream(), h.event('{"error": {"message": "CUDA OOM at 0x1"}}')), "failed while answering"),
        (lambda h: (h.start_stream(), h.delta("Half a")), "ended before the answer was complete"),
        (lambda h: h.upstream.release.wait(5), "did not answer within 1 seconds"),
    ],
    ids=["bad-json", "error-event", "cut-short", "timeout"],
)
def test_broken_streams_and_timeouts(fresh, script, expected):
    fresh.script = script
    with pytest.raises(ThinkerError) as err:
        answer(thinker(fresh), Turn("q", []))
    assert expected in str(err.value)
    assert "CUDA" not in str(err.value)


def test_unreachable_server():
    from support.servers import free_port

    t = LlmThinker(HttpChat(f"http://127.0.0.1:{free_port()}/v1", "", 1.0), model="m")
    with pytest.raises(ThinkerError, match="Could not reach the language model server"):
        answer(t, Turn("q", []))


# -- on the engine ---------------------------------------------------------------------------------


def test_pipeline_streams_the_text_and_speaks_it(fresh, scheduler):
    fresh.script = stream(["I see ", "a blue ", "wall. ", "It is ", "bright."])
    chunks = run_turn(scheduler, {"question": "What is there?", "frames": [{"data": frame((200, 0, 0))}]})
    end = chunks[-1]
    assert end["status"] == "ok" and end["text"] == "I see a blue wall. It is bright." == text_of(chunks)
    spoken = [c["text"] for c in chunks if c["type"] == "sentence.start"]
    assert spoken == ["I see a blue wall.", "It is bright."]
    body = fresh.requests[0]["body"]
    assert body["model"] == "served-model" and body["max_tokens"] == 64  # the settings' model and cap
    assert isinstance(body["messages"][-1]["content"], str)  # OMNIWEB_LLM_IMAGES=off


def test_pipeline_reports_a_failure_with_a_clear_message(fresh, scheduler):
    fresh.script = status(503, "overloaded")
    chunks = run_turn(scheduler, {"question": "q", "frames": [{"data": frame((0, 0, 0))}]})
    assert chunks[-1] == {
        "type": "end",
        "status": "error",
        "kind": "upstream_failure",
        "message": "The language model server failed (HTTP 503).",
        "text": "",
    }


def test_pipeline_error_mid_answer_keeps_what_was_said(fresh, scheduler):
    fresh.script = lambda h: (h.start_stream(), h.delta("First sentence. "), h.delta("Second"), h.event("{oops"))
    chunks = run_turn(scheduler, {"question": "q", "frames": [{"data": frame((0, 0, 0))}], "modalities": ["text"]})
    end = chunks[-1]
    assert end["status"] == "error" and "malformed stream" in end["message"]
    assert end["text"] == "First sentence. Second"


def test_abort_frees_the_engine_at_once_and_closes_the_connection(fresh, scheduler, monkeypatch):
    # The backstop for a run nobody polls any more cannot act during this test: only the release
    # of the aborted request's loops can close the connection.
    monkeypatch.setattr("omniweb.llm.chat.ORPHAN_SECONDS", 3600.0)
    fresh.script = endless
    chunks: list[dict[str, Any]] = []
    request = AnswerRequest(question="q", modalities=("text",))
    scheduler.submit("long", request, lambda chunk: chunks.append(to_wire(chunk)))
    deadline = time.monotonic() + 10
    while not any(c["type"] == "text" for c in chunks):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert scheduler.abort("long")
    assert chunks[-1] == {"type": "end", "status": "cancelled"}
    n = len(chunks)
    # A step in flight ends (steps never wait on the upstream, which streams on without end): a
    # ceiling only, so a step that waited on it fails here and a slow machine does not.
    deadline = time.monotonic() + CEILING
    while scheduler.stats().running_steps:
        assert time.monotonic() < deadline, "a step in flight waited on the endless upstream"
        time.sleep(0.005)
    assert scheduler.stats().active == 0
    # The scheduler releases the aborted request's loops: the server hears the disconnect.
    assert fresh.disconnected.wait(CEILING), "the aborted request's connection was left open"
    assert len(chunks) == n  # nothing after the end, though the step in flight ran to its end


def slow_answer(h: Handler) -> None:
    """A model that thinks for seconds: a sentence, a long pause (within the 1 s timeout), more."""
    h.start_stream()
    for text in ("Let me look. ", "Still looking. ", "A blue wall."):
        h.delta(text)
        time.sleep(0.8)
    h.delta("", finish="stop")
    h.event("[DONE]")


def playback_lateness(arrivals: list[tuple[float, float]]) -> float:
    """How far (s) a listener who starts at the first chunk ever runs dry: arrival minus play time."""
    start, played, late = arrivals[0][0], 0.0, 0.0
    for at, seconds in arrivals:
        late = max(late, at - (start + played))
        played += seconds
    return late


def test_turns_waiting_on_a_slow_model_never_stall_speech_streams(fresh, pipeline):
    """Two turns on a slow server plus 16 paced speech streams on a two-worker engine: the turns
    wait without a worker (a handful of thinker steps; a step that waited 25 ms for text, as before,
    took 181 here) and no stream stalls."""
    from speech.tts.loops import PIPELINE as TTS
    from speech.tts.loops import TtsPipeline

    fresh.script = slow_answer
    sched = Scheduler({PIPELINE: pipeline, TTS: TtsPipeline()}, workers=2, max_ahead=0.5)
    steps: list[str] = []
    sched._on_batch = lambda kind, n: steps.append(kind)
    sched.start()
    try:
        turns: list[list[dict[str, Any]]] = [[], []]
        for i, chunks in enumerate(turns):
            request = AnswerRequest(question="q", modalities=("text",))
            sched.submit(f"turn{i}", request, lambda chunk, chunks=chunks: chunks.append(to_wire(chunk)))
        time.sleep(0.3)  # both turns are waiting on the server now
        arrivals: list[list[tuple[float, float]]] = [[] for _ in range(16)]
        ends: list[threading.Event] = [threading.Event() for _ in range(16)]

        def sink_for(i: int) -> Callable[[Chunk], None]:
            def sink(chunk: Chunk) -> None:
                if isinstance(chunk, PcmAudio):
                    arrivals[i].append((time.monotonic(), chunk.seconds))
                elif isinstance(chunk, End):
                    ends[i].set()

            return sink

        text = "Streaming speech should never stall. Every listener hears a smooth voice."
        for i in range(16):
            sched.submit(f"speech{i}", SpeakRequest(pipeline=TTS, text=text, seed=i), sink_for(i))
        for done in ends:
            assert done.wait(60)
        for chunks in turns:
            deadline = time.monotonic() + 20
            while not chunks or chunks[-1]["type"] != "end":
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert chunks[-1]["status"] == "ok", chunks[-1]
            assert chunks[-1]["text"] == "Let me look. Still looking. A blue wall."
        # Three deltas and the end per turn: a few steps each, however long the model thinks.
        assert steps.count("thinker") <= 2 * 6
        lateness = [playback_lateness(a) for a in arrivals]
        assert all(a for a in arrivals)
        # A gap is a stall a listener hears, not scheduling jitter on a loaded machine (up to ~0.6 s
        # measured at load 13 on 2 cores): what shows that the turns hold no worker is the step count.
        assert max(lateness) < 1.0, lateness
    finally:
        sched.stop()


# -- function calls streamed as tool_calls deltas ---------------------------------------------------


def tool_turn(sched: Scheduler, **fields: Any) -> list[dict[str, Any]]:
    request = {"question": "Weather in Paris?", "modalities": ["text"], "tools": [WEATHER], **fields}
    return run_turn(sched, request)


def test_a_streamed_call_arrives_whole_once(fresh, scheduler):
    pieces = ['{"ci', 'ty": "Par', 'is", "un', 'it": "c"', "}"]
    fresh.script = calls([("get_weather", pieces)], text="Let me check. ")
    chunks = tool_turn(scheduler)
    (call,) = [c for c in chunks if c["type"] == "call"]
    assert call["name"] == "get_weather" and call["call_id"].startswith("call_")
    assert json.loads(call["arguments"]) == {"city": "Paris", "unit": "c"}
    assert [c["type"] for c in chunks] == ["text", "call", "text.end", "end"]
    assert chunks[-1]["status"] == "ok" and chunks[-1]["text"] == "Let me check. "
    body = fresh.requests[0]["body"]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": WEATHER["description"], "parameters": WEATHER_SCHEMA},
        }
    ]
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True
    assert "response_format" not in body


def test_parallel_calls_arrive_in_order_and_only_the_first_when_not_parallel(fresh, scheduler):
    made = [("get_weather", ['{"city": "Paris", ', '"unit": "c"}']), ("get_weather", ['{"city": "Oslo", "unit": "f"}'])]
    fresh.script = calls(made)
    cities = [json.loads(c["arguments"])["city"] for c in tool_turn(scheduler) if c["type"] == "call"]
    assert cities == ["Paris", "Oslo"]
    first = [c for c in tool_turn(scheduler, parallel_tool_calls=False) if c["type"] == "call"]
    assert [json.loads(c["arguments"])["city"] for c in first] == ["Paris"]
    assert fresh.requests[-1]["body"]["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("made", "finish", "expected"),
    [
        ([("get_weather", ['{"city": "Par', "is"])], "tool_calls", "arguments of get_weather was not valid JSON"),
        ([("get_weather", ['{"city": ', '"Paris"}'])], "tool_calls", "do not fit its schema: 'unit' is a required"),
        ([("get_time", ['{"city": "Paris"}'])], "tool_calls", "called a function that was not offered ('get_time')"),
        ([("get_weather", ["[1, 2]"])], "tool_calls", "arguments for get_weather were not a JSON object"),
        ([("get_weather", ['{"city": "Pa'])], "length", "reached its token limit before the arguments of get_weather"),
    ],
    ids=["not-json", "missing-required", "not-offered", "not-an-object", "cut-at-the-token-limit"],
)
def test_a_call_that_does_not_fit_ends_the_turn_with_an_error_and_no_call(fresh, scheduler, made, finish, expected):
    fresh.script = calls(made, finish=finish)
    chunks = tool_turn(scheduler)
    assert not [c for c in chunks if c["type"] == "call"]
    end = chunks[-1]
    assert end["status"] == "error" and end["kind"] == "upstream_failure", end
    assert expected in end["message"] and end["message"].startswith("The language model")


def test_a_call_cut_off_mid_stream_is_never_sent(fresh, scheduler):
    fresh.script = lambda h: (h.start_stream(), h.call_delta(0, call_id="c", name="get_weather", arguments='{"ci'))
    chunks = tool_turn(scheduler)
    assert not [c for c in chunks if c["type"] == "call"]
    assert chunks[-1]["status"] == "error" and "ended before the answer was complete" in chunks[-1]["message"]


def test_a_call_reaches_a_direct_run_as_a_tool_call(fresh):
    """The thinker itself, without the engine: the run's pieces are text and whole ``ToolCall``s."""
    from omniweb.engine.requests import FunctionTool

    fresh.script = calls([("get_weather", ['{"city": "Rome",', ' "unit": "c"}'])])
    run = thinker(fresh).start(Turn("q", [], tools=(FunctionTool(**WEATHER),)))
    pieces: list[Any] = []
    deadline = time.monotonic() + 10
    try:
        while not run.done:
            assert time.monotonic() < deadline
            pieces.extend(run.step())
            time.sleep(0.005)
    finally:
        run.close()
    assert len(pieces) == 1 and isinstance(pieces[0], ToolCall)
    assert pieces[0].name == "get_weather" and json.loads(pieces[0].arguments) == {"city": "Rome", "unit": "c"}
