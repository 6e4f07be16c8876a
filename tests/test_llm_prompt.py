"""What the language model is sent (``omniweb.llm.prompt``) and how its chunks are read
(``omniweb.llm.chat.ChunkReader``), as pure functions; and the new contract types across the Redis
boundary. The real model's tests are in test_llm_thinker.py."""

from __future__ import annotations

import json

import pytest

from omniweb.engine import messages, requests
from omniweb.engine.messages import End, ToolCall
from omniweb.engine.requests import AnswerRequest, FunctionCall, FunctionTool, HistoryEntry, ToolChoice
from omniweb.llm import prompt
from omniweb.llm.chat import ChatError, ChunkReader, Forced

WEATHER = FunctionTool(
    name="get_weather",
    description="The weather in a city.",
    parameters=json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
CALL = FunctionCall(call_id="call_1", name="get_weather", arguments='{"city": "Oslo"}')
TALK = (
    HistoryEntry(role="user", content="Weather in Oslo?"),
    HistoryEntry(role="assistant", calls=(CALL,)),
    HistoryEntry(role="tool", call_id="call_1", content='{"temp": -3}'),
)


def build(**kw):
    args = {"model": "m", "system_prompt": "Be brief.", "history": (), "question": "Hi?"}
    return prompt.build(**{**args, **kw})


def test_the_fixed_part_comes_first_and_the_turn_last():
    history = (HistoryEntry(role="user", content="I'm Ada."), HistoryEntry(role="assistant", content="Hello Ada."))
    body = build(history=history, facts="I see a cup.", question="What is this?").body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "I'm Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": prompt.FACTS_LEAD + "I see a cup.\n\nWhat is this?"},
    ]
    assert "tools" not in body and "response_format" not in body


def test_no_instructions_means_the_default_prompt_and_no_question_means_say_what_is_seen():
    body = build(system_prompt=None, question="").body
    assert body["messages"][0] == {"role": "system", "content": prompt.DEFAULT_SYSTEM_PROMPT}
    assert body["messages"][-1] == {"role": "user", "content": prompt.DEFAULT_QUESTION}


def test_images_go_as_parts_before_the_facts_and_question():
    body = build(images=["data:image/jpeg;base64,AAAA"], facts="A cup.").body
    assert body["messages"][-1]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
        {"type": "text", "text": prompt.FACTS_LEAD + "A cup."},
        {"type": "text", "text": "Hi?"},
    ]


def test_calls_and_outputs_as_tool_messages_and_no_new_question_after_an_output():
    messages_ = build(history=TALK, question="", tools=[WEATHER]).body["messages"]
    assert messages_[1:] == [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": -3}'},
    ]


def test_calls_and_outputs_as_sentences_for_a_template_without_tools():
    messages_ = build(history=TALK, question="", native_tools=False).body["messages"]
    assert messages_[2] == {"role": "assistant", "content": 'I called get_weather with the arguments {"city": "Oslo"}.'}
    assert messages_[3] == {"role": "user", "content": 'The function get_weather returned: {"temp": -3}'}


def test_the_probe_tells_a_template_that_drops_tool_messages():
    plain, with_tools = prompt.probe_bodies("m")
    assert len(with_tools["messages"]) == len(plain["messages"]) + 2
    assert prompt.renders_tools({"usage": {"prompt_tokens": 20}}, {"usage": {"prompt_tokens": 80}})
    assert not prompt.renders_tools({"usage": {"prompt_tokens": 20}}, {"usage": {"prompt_tokens": 24}})


def test_past_the_context_the_oldest_turns_go_never_the_system_message():
    old = tuple(
        HistoryEntry(role=r, content=f"turn {i} " + "words " * 50) for i, r in enumerate(["user", "assistant"] * 20)
    )
    body = build(history=(*old, *TALK), question="And now?", max_tokens=100, context=600).body
    kept = body["messages"]
    assert kept[0]["role"] == "system" and kept[-1] == {"role": "user", "content": "And now?"}
    assert 2 < len(kept) < len(old) + 5
    assert kept[1]["role"] != "tool"  # an output never survives its call
    assert kept[-2] == {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": -3}'}


def test_auto_forwards_the_tools_none_hides_them():
    auto = build(tools=[WEATHER], parallel=False)
    assert auto.forced is None
    assert auto.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": json.loads(WEATHER.parameters),
            },
        }
    ]
    assert auto.body["tool_choice"] == "auto" and auto.body["parallel_tool_calls"] is False
    none = build(tools=[WEATHER], tool_choice=ToolChoice.NONE)
    assert "tools" not in none.body and none.schemas == {}


def test_required_and_named_calls_are_forced_by_a_schema():
    time_tool = FunctionTool(name="get_time", parameters='{"type": "object", "properties": {}}')
    named = build(tools=[WEATHER, time_tool], tool_choice=ToolChoice.FUNCTION, tool_name="get_weather")
    assert named.forced == Forced("get_weather") and "tools" not in named.body
    assert named.body["response_format"]["json_schema"]["schema"] == json.loads(WEATHER.parameters)
    assert "get_weather" in named.body["messages"][-1]["content"]  # the model is told what it writes
    either = build(tools=[WEATHER, time_tool], tool_choice=ToolChoice.REQUIRED)
    assert either.forced == Forced(None)
    options = either.body["response_format"]["json_schema"]["schema"]["anyOf"]
    assert [o["properties"]["name"] for o in options] == [{"const": "get_weather"}, {"const": "get_time"}]


def chunk(content=None, calls=None, finish=None, usage=None):
    delta = {}
    if content is not None:
        delta["content"] = content
    if calls is not None:
        delta["tool_calls"] = calls
    out = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        out = {"choices": [], "usage": usage}
    return out


def ids():
    return iter(f"call_{i}" for i in range(9)).__next__


def test_reader_streams_text_and_keeps_the_model_usage():
    reader = ChunkReader({})
    assert reader.feed(chunk("Hel")) + reader.feed(chunk("lo", finish="stop")) == ["Hel", "lo"]
    reader.feed(chunk(usage={"prompt_tokens": 30, "completion_tokens": 2}))
    assert reader.end() == [] and reader.usage == (30, 2)


def test_reader_assembles_a_streamed_call_and_checks_it():
    reader = ChunkReader({"get_weather": json.loads(WEATHER.parameters)}, new_id=ids())
    reader.feed(chunk(calls=[{"index": 0, "id": "x", "function": {"name": "get_weather", "arguments": '{"ci'}}]))
    reader.feed(chunk(calls=[{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}], finish="tool_calls"))
    assert reader.end() == [ToolCall(call_id="call_0", name="get_weather", arguments='{"city": "Oslo"}')]


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("get_weather", '{"city": "Os', "not valid JSON"),
        ("get_weather", '{"town": "Oslo"}', "do not fit its schema"),
        ("get_weather", "[1]", "not a JSON object"),
        ("launch", "{}", "not offered"),
    ],
)
def test_reader_never_hands_out_a_call_that_does_not_fit(name, arguments, message):
    reader = ChunkReader({"get_weather": json.loads(WEATHER.parameters)})
    reader.feed(chunk(calls=[{"index": 0, "function": {"name": name, "arguments": arguments}}], finish="tool_calls"))
    with pytest.raises(ChatError, match=message):
        reader.end()


def test_reader_turns_forced_output_into_the_call():
    schemas = {"get_weather": json.loads(WEATHER.parameters), "get_time": {"type": "object"}}
    named = ChunkReader(schemas, Forced("get_weather"), new_id=ids())
    assert named.feed(chunk('{"city":')) == [] and named.feed(chunk(' "Oslo"}', finish="stop")) == []
    assert named.end() == [ToolCall(call_id="call_0", name="get_weather", arguments='{"city": "Oslo"}')]
    chosen = ChunkReader(schemas, Forced(None), new_id=ids())
    chosen.feed(chunk('{"name": "get_time", "arguments": {}}', finish="stop"))
    assert chosen.end() == [ToolCall(call_id="call_0", name="get_time", arguments="{}")]
    cut = ChunkReader(schemas, Forced("get_weather"))
    cut.feed(chunk('{"city": "Os', finish="length"))
    with pytest.raises(ChatError, match="token limit"):
        cut.end()


def test_only_the_first_call_without_parallel_calls():
    reader = ChunkReader({"a": {"type": "object"}, "b": {"type": "object"}}, parallel=False, new_id=ids())
    reader.feed(chunk(calls=[{"index": 0, "function": {"name": "a", "arguments": "{}"}}]))
    reader.feed(chunk(calls=[{"index": 1, "function": {"name": "b", "arguments": "{}"}}], finish="tool_calls"))
    assert [c.name for c in reader.end()] == ["a"]


def test_tools_history_calls_and_counts_cross_the_redis_boundary():
    request = AnswerRequest(
        question="q",
        history=TALK,
        tools=(WEATHER,),
        tool_choice=ToolChoice.FUNCTION,
        tool_name="get_weather",
        max_tokens=9,
    )
    assert requests.from_wire(requests.to_wire(request)) == request
    for chunk_ in (
        ToolCall(call_id="c", name="n", arguments="{}"),
        End(text="t", prompt_tokens=3, completion_tokens=4),
    ):
        assert messages.from_wire(messages.to_wire(chunk_)) == chunk_


def test_a_language_model_answer_is_spoken_from_its_first_clause():
    from video.engine.sentences import SentenceStream

    eager, plain = SentenceStream(first_clause=True), SentenceStream()
    deltas = ["Well, ", "the capital of France, ", "as you know, ", "is Paris. ", "It is big, ", "and old."]
    assert [eager.feed(d) for d in deltas] + [eager.flush()] == [
        [],
        [],
        ["Well, the capital of France,"],  # a clause of four words or more, once the next word proves it
        [],
        ["as you know, is Paris."],  # later pieces wait for their sentence
        [],
        ["It is big, and old."],
    ]
    assert [s for d in deltas for s in plain.feed(d)] + plain.flush() == [
        "Well, the capital of France, as you know, is Paris.",
        "It is big, and old.",
    ]


def test_each_call_is_followed_by_its_output_and_a_waiting_call_gets_one():
    other = FunctionCall(call_id="call_2", name="get_weather", arguments='{"city": "Rome"}')
    history = (
        HistoryEntry(role="user", content="Weather in Oslo and Rome?"),
        HistoryEntry(role="assistant", calls=(CALL, other)),
        HistoryEntry(role="user", content="Hurry up."),  # placed between the calls and the output
        HistoryEntry(role="tool", call_id="call_1", content='{"temp": -3}'),
        HistoryEntry(role="tool", call_id="call_9", content="an output whose call is gone"),
    )
    roles = [(m["role"], m.get("tool_call_id")) for m in prompt.history_messages(history)]
    assert roles == [("user", None), ("assistant", None), ("tool", "call_1"), ("tool", "call_2"), ("user", None)]
    assert prompt.history_messages(history)[3]["content"] == prompt.NO_OUTPUT
