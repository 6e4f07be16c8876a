"""The ``llm`` thinker on the engine with a real model: SmolLM2 embedded (llama.cpp in this process)
and behind llama.cpp's own HTTP server (the ``OMNIWEB_LLM_URL`` path), one test body for both.

The model is tiny, so these check the plumbing: what reaches the model (its own prompt token counts
move with what it is sent), that what it streams is what the client reads and hears, function
calls forced by schema, cancellation between two tokens, and the model's usage in the ``End``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from support.llm import llama_server, smollm2_path

from omniweb.engine.messages import Chunk, End, SentenceStart, TextDelta, ToolCall
from omniweb.engine.requests import AnswerRequest, FunctionCall, FunctionTool, HistoryEntry, ToolChoice
from omniweb.engine.scheduler import Scheduler
from video.engine.pipeline import PIPELINE, VideoTurnPipeline

pytestmark = pytest.mark.timeout(300)

WEATHER = FunctionTool(
    name="get_weather",
    description="The weather now in a city.",
    parameters=json.dumps(
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        }
    ),
)
TIME = FunctionTool(
    name="get_time",
    description="The time now in a city.",
    parameters=json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)


@pytest.fixture(scope="module")
def llama_url() -> Iterator[str]:
    with llama_server() as url:
        yield url


@pytest.fixture(scope="module", params=["embedded", "http"])
def scheduler(request: pytest.FixtureRequest) -> Iterator[Scheduler]:
    """The video.turn pipeline with the llm thinker on a two-worker scheduler, per source."""
    if request.param == "embedded":
        source = {"LLM_MODEL_PATH": smollm2_path(), "LLM_URL": ""}
    else:
        source = {"LLM_URL": request.getfixturevalue("llama_url"), "LLM_MODEL_PATH": ""}
    with override_settings(THINKER="llm", LLM_CONTEXT=2048, LLM_PARALLEL=2, LLM_MAX_TOKENS=48, **source):
        pipeline = VideoTurnPipeline()
    sched = Scheduler({PIPELINE: pipeline}, workers=2)
    sched.start()
    yield sched
    sched.stop()


def answer(sched: Scheduler, timeout: float = 120, **fields: Any) -> list[Chunk]:
    chunks: list[Chunk] = []
    ended = threading.Event()

    def sink(chunk: Chunk) -> None:
        chunks.append(chunk)
        if isinstance(chunk, End):
            ended.set()

    sched.submit(f"r{time.monotonic_ns()}", AnswerRequest(**fields), sink)
    assert ended.wait(timeout), chunks[-3:]
    return chunks


def text_of(chunks: list[Chunk]) -> str:
    return "".join(c.delta for c in chunks if isinstance(c, TextDelta))


def test_the_model_answers_streams_and_speaks_its_words(scheduler):
    chunks = answer(scheduler, question="What is the capital of France?", max_tokens=24)
    end = chunks[-1]
    assert isinstance(end, End) and end.ok, end
    streamed = text_of(chunks)
    assert streamed and end.text == streamed
    assert sum(isinstance(c, TextDelta) for c in chunks) > 1  # token by token, not one block
    spoken = " ".join(c.text for c in chunks if isinstance(c, SentenceStart))
    assert spoken.split() == streamed.split()  # every word written is spoken, none invented
    assert end.prompt_tokens and end.prompt_tokens > 10
    assert end.completion_tokens and 0 < end.completion_tokens <= 24


def test_instructions_and_history_reach_the_model(scheduler):
    """The model's own prompt count grows by what is added: the instructions, then the history."""
    short = {"question": "Hi.", "modalities": ("text",), "max_tokens": 1, "system_prompt": "Be brief."}
    base = answer(scheduler, **short)[-1]
    rule = "Always answer in one short sentence and never mention the weather. " * 4
    ruled = answer(scheduler, **{**short, "system_prompt": rule})[-1]
    history = (
        HistoryEntry(role="user", content="My name is Ada Lovelace."),
        HistoryEntry(role="assistant", content="Hello Ada."),
    )
    remembered = answer(scheduler, **short, history=history)[-1]
    assert isinstance(base, End) and isinstance(ruled, End) and isinstance(remembered, End)
    assert base.prompt_tokens is not None and ruled.prompt_tokens is not None and remembered.prompt_tokens is not None
    assert ruled.prompt_tokens > base.prompt_tokens + 40
    assert remembered.prompt_tokens > base.prompt_tokens + 8


def test_a_required_call_is_forced_and_fits_its_schema(scheduler):
    chunks = answer(
        scheduler,
        question="What is the weather in Paris?",
        modalities=("text", "audio"),
        tools=(WEATHER,),
        tool_choice=ToolChoice.REQUIRED,
    )
    calls = [c for c in chunks if isinstance(c, ToolCall)]
    assert [c.name for c in calls] == ["get_weather"], chunks[-1]
    arguments = json.loads(calls[0].arguments)
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("c", "f")
    assert calls[0].call_id.startswith("call_")
    assert not text_of(chunks) and not any(isinstance(c, SentenceStart) for c in chunks)  # nothing said
    assert isinstance(chunks[-1], End) and chunks[-1].ok


def test_a_named_function_among_several_is_the_one_called(scheduler):
    chunks = answer(
        scheduler,
        question="What time is it in Tokyo?",
        modalities=("text",),
        tools=(WEATHER, TIME),
        tool_choice=ToolChoice.FUNCTION,
        tool_name="get_time",
    )
    calls = [c for c in chunks if isinstance(c, ToolCall)]
    assert [c.name for c in calls] == ["get_time"]
    assert isinstance(json.loads(calls[0].arguments)["city"], str)


def test_required_among_several_lets_the_model_choose_a_valid_call(scheduler):
    chunks = answer(
        scheduler,
        question="What time is it in Tokyo?",
        modalities=("text",),
        tools=(WEATHER, TIME),
        tool_choice=ToolChoice.REQUIRED,
    )
    (call,) = [c for c in chunks if isinstance(c, ToolCall)]
    assert call.name in ("get_weather", "get_time")
    assert isinstance(json.loads(call.arguments), dict)


def test_the_function_output_reaches_the_next_answer(scheduler):
    """After a call and its output, the answer is asked with no new question: the output is in the
    model's prompt (its count grows with it) and the model answers in words."""
    call = FunctionCall(call_id="call_abc", name="get_weather", arguments='{"city": "Paris", "unit": "c"}')
    asked = (HistoryEntry(role="user", content="What is the weather in Paris?"),)
    called = (*asked, HistoryEntry(role="assistant", calls=(call,)))
    short = (*called, HistoryEntry(role="tool", call_id="call_abc", content='{"temp": 21}'))
    long = (
        *called,
        HistoryEntry(role="tool", call_id="call_abc", content=json.dumps({"report": "sunny and warm " * 12})),
    )
    first = answer(scheduler, question="", history=short, tools=(WEATHER,), modalities=("text",), max_tokens=16)
    second = answer(scheduler, question="", history=long, tools=(WEATHER,), modalities=("text",), max_tokens=16)
    ends = [first[-1], second[-1]]
    assert all(isinstance(e, End) and e.ok for e in ends), ends
    assert ends[1].prompt_tokens - ends[0].prompt_tokens > 20  # type: ignore[union-attr, operator]
    assert text_of(first) and not any(isinstance(c, ToolCall) for c in first)


def test_cancel_stops_the_generation_between_two_tokens(scheduler):
    """An aborted answer ends at once, and the model stops: nothing more arrives, the engine is idle."""
    chunks: list[Chunk] = []
    sched = scheduler
    request = AnswerRequest(question="Write a very long story about a dragon.", modalities=("text",), max_tokens=48)
    sched.submit("long", request, chunks.append)
    deadline = time.monotonic() + 60
    while not any(isinstance(c, TextDelta) for c in chunks):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert sched.abort("long")
    assert isinstance(chunks[-1], End) and chunks[-1].status == "cancelled"
    n = len(chunks)
    deadline = time.monotonic() + 30
    while sched.stats().active or sched.stats().running_steps:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)
    assert len(chunks) == n  # nothing after the end
    thinker = sched._pipelines[PIPELINE].thinker  # the embedded model stops its sequence too
    source = thinker.source
    if hasattr(source, "active"):
        while source.active:
            assert time.monotonic() < deadline
            time.sleep(0.01)
