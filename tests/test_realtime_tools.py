"""Tool calling in the Realtime API without a socket or a model: the session's and response.create's
``tools`` / ``tool_choice`` / ``parallel_tool_calls`` / ``max_output_tokens`` (refused without a
language model behind the thinker), ``function_call`` and ``function_call_output`` items, the
thinker's history of them, and the events of a response that calls functions (``ToolCall`` turn
events in, a function_call output item out; the message item made at the first delta). The turns'
events are scripted on the core; every event sent is one the official SDK parses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.realtime import RealtimeConversationItemFunctionCall, RealtimeConversationItemFunctionCallOutput
from support.realtime import normalized, sdk_parses
from support.realtime_parts import VOICES, ScriptedResponses

from omniweb.conversation import AudioChunk, TextDelta, ToolCall, TurnEnd, Usage
from omniweb.engine.messages import Status
from omniweb.engine.requests import FunctionCall, FunctionTool, HistoryEntry, ToolChoice
from omniweb.openai_api.realtime import server_events
from omniweb.openai_api.realtime.errors import RealtimeError, error_event, new_id
from omniweb.openai_api.realtime.events import ResponseParams, parse_event
from omniweb.openai_api.realtime.items import Conversation, Item
from omniweb.openai_api.realtime.responses import ResponseStream, Tools
from omniweb.openai_api.realtime.session import Session, new_session, update_session

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {"type": "function", "name": "get_time"}  # no description, no parameters
PCM = b"\x01\x00" * 2400  # 100 ms at 24 kHz


def llm_session(**fields: Any) -> Session:
    """A session on a server whose thinker is a language model, after ``session.update`` with ``fields``."""
    session = update_session(new_session(VOICES), fields, VOICES, language_model=True)
    assert isinstance(session, Session)
    return session


def refused_update(fields: dict[str, Any], *, language_model: bool = True) -> RealtimeError:
    with pytest.raises(RealtimeError) as info:
        update_session(new_session(VOICES), fields, VOICES, language_model=language_model)
    sdk_parses(error_event(info.value))
    return info.value


def parse(event: dict[str, Any], *, language_model: bool = True) -> Any:
    return parse_event(json.dumps(event), voices=VOICES, language_model=language_model)


def refused_event(event: dict[str, Any], *, language_model: bool = True) -> RealtimeError:
    with pytest.raises(RealtimeError) as info:
        parse(event, language_model=language_model)
    sdk_parses(error_event(info.value))
    return info.value


def params(**fields: Any) -> ResponseParams:
    event = parse({"type": "response.create", "response": fields})
    return event.response or ResponseParams()


# -- the session ---------------------------------------------------------------------------------
def test_without_a_language_model_tools_are_refused_naming_the_fix_and_defaults_pass() -> None:
    for fields in (
        {"tools": [WEATHER]},
        {"tool_choice": "required"},
        {"tool_choice": {"type": "function", "name": "f"}},
    ):
        err = refused_update(fields, language_model=False)
        assert "tool calling needs a language model: start the server with OMNIWEB_THINKER=llm" in err.message
        assert err.param == f"session.{next(iter(fields))}" and err.code == "invalid_value"
    err = refused_update({"max_output_tokens": 200}, language_model=False)
    assert err.param == "session.max_output_tokens" and "OMNIWEB_THINKER=llm" in err.message
    # What agent frameworks send by default passes, and instructions are kept (not applied by scene).
    defaults = {"tools": [], "tool_choice": "auto", "max_output_tokens": "inf", "instructions": "Be helpful."}
    session = update_session(new_session(VOICES), defaults, VOICES)
    assert session.tools == [] and session.instructions == "Be helpful."
    none = update_session(session, {"tool_choice": "none", "parallel_tool_calls": False}, VOICES)
    assert (none.tool_choice, none.parallel_tool_calls) == ("none", False)
    wire = server_events.session_created(new_session(VOICES))["session"]
    assert (wire["tools"], wire["tool_choice"], wire["max_output_tokens"]) == ([], "auto", "inf")
    assert "parallel_tool_calls" not in wire  # only once a client sets it


def test_function_tools_are_accepted_and_echoed_as_declared() -> None:
    session = llm_session(
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=300,
    )
    event = server_events.session_updated(session)
    parsed = sdk_parses(event).session
    assert [t.name for t in parsed.tools] == ["get_weather", "get_time"]
    assert event["session"]["tools"] == [WEATHER, TIME]  # nothing added (no null description)
    assert event["session"]["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert (event["session"]["parallel_tool_calls"], event["session"]["max_output_tokens"]) == (False, 300)
    assert parsed.tool_choice.name == "get_weather" and parsed.max_output_tokens == 300
    again = update_session(session, session.wire(), VOICES, language_model=True)  # a client echoes it back
    assert again.wire() == session.wire()
    assert session.tools[0].engine() == FunctionTool(
        name="get_weather", description="The weather in a city.", parameters=json.dumps(WEATHER["parameters"])
    )
    assert session.tools[1].engine() == FunctionTool(name="get_time")
    untyped = llm_session(tools=[{"name": "get_time"}], tool_choice="required")  # type may be left out
    assert untyped.wire()["tools"] == [TIME] and untyped.tool_choice == "required"


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "session.tools[0]", "MCP tools are not supported"),
        ({"tools": [{"type": "file_search"}]}, "session.tools[0]", "only function tools"),
        ({"tools": [{"type": "function", "name": "get weather"}]}, "session.tools[0].name", "letters, digits"),
        ({"tools": [{"type": "function", "name": "x" * 65}]}, "session.tools[0].name", "1 to 64"),
        ({"tools": [{"type": "function"}]}, "session.tools[0].name", "Missing required"),
        ({"tools": [TIME, TIME]}, "session.tools", "declared more than once: get_time"),
        ({"tools": [{"name": "f", "parameters": ["x"]}]}, "session.tools[0].parameters", "valid dictionary"),
        ({"tools": [{"name": "f", "parameters": {"type": "string"}}]}, "session.tools[0].parameters", "'object'"),
        ({"tools": [{"name": "f", "strict": True}]}, "session.tools[0].strict", "Unknown parameter"),
        ({"tools": "get_time"}, "session.tools", "valid list"),
        ({"tools": [TIME], "tool_choice": "any"}, "session.tool_choice", "'required'"),
        ({"tools": [TIME], "tool_choice": {"type": "mcp", "server_label": "x"}}, "session.tool_choice", "MCP"),
        ({"max_output_tokens": 0}, "session.max_output_tokens", "1 to 4096"),
        ({"max_output_tokens": 4097}, "session.max_output_tokens", "1 to 4096"),
        ({"max_output_tokens": True}, "session.max_output_tokens", "1 to 4096"),
        ({"max_output_tokens": 1.5}, "session.max_output_tokens", "1 to 4096"),
        ({"parallel_tool_calls": "sometimes"}, "session.parallel_tool_calls", "boolean"),
    ],
)
def test_invalid_tool_settings_are_refused_naming_the_field(fields: dict[str, Any], param: str, says: str) -> None:
    err = refused_update(fields)
    assert err.param == param and says in err.message


def test_a_session_takes_its_tool_choice_before_its_tools_and_a_response_checks_them() -> None:
    """pipecat and LiveKit send the tool choice in their first session.update, the tools later."""
    session = llm_session(tool_choice="required")
    assert session.tool_choice == "required" and not session.tools
    with pytest.raises(RealtimeError) as info:
        Tools.of(params(), session)
    assert info.value.param == "response.tool_choice" and "needs at least one tool" in info.value.message
    named = llm_session(tool_choice={"type": "function", "name": "get_time"}, tools=[WEATHER])
    with pytest.raises(RealtimeError) as info:
        Tools.of(params(), named)
    assert "'get_time' is not among" in info.value.message
    assert Tools.of(params(), llm_session(tool_choice="required", tools=[TIME])).choice == "required"


def test_response_create_takes_tools_and_overrides_the_sessions() -> None:
    session = llm_session(tools=[WEATHER, TIME], tool_choice="required", max_output_tokens=100)
    inherited = Tools.of(params(), session)
    assert ([t.name for t in inherited.tools], inherited.choice, inherited.parallel) == (
        ["get_weather", "get_time"],
        "required",
        None,
    )
    replaced = Tools.of(params(tools=[TIME], tool_choice="auto", parallel_tool_calls=False), session)
    assert ([t.name for t in replaced.tools], replaced.choice, replaced.parallel) == (["get_time"], "auto", False)
    assert not Tools.of(params(tool_choice="none"), session).offered
    assert not Tools.of(params(tools=[]), llm_session()).offered
    # The session's tool choice names a function the response's tools leave out.
    named = llm_session(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    with pytest.raises(RealtimeError) as info:
        Tools.of(params(tools=[TIME]), named)
    assert info.value.param == "response.tool_choice" and "'get_weather' is not among" in info.value.message
    # Refused when parsed: the response's own tools and choice disagree, MCP, no language model.
    err = refused_event(
        {"type": "response.create", "response": {"tools": [TIME], "tool_choice": {"type": "function", "name": "x"}}}
    )
    assert err.param == "response.tool_choice"
    err = refused_event({"type": "response.create", "response": {"tools": [{"type": "mcp", "server_label": "s"}]}})
    assert err.param == "response.tools[0]" and "MCP tools are not supported by this server" in err.message
    err = refused_event({"type": "response.create", "response": {"tools": [TIME]}}, language_model=False)
    assert err.param == "response.tools" and "OMNIWEB_THINKER=llm" in err.message
    err = refused_event({"type": "response.create", "response": {"max_output_tokens": 9999}})
    assert err.param == "response.max_output_tokens"


# -- items ---------------------------------------------------------------------------------------
class Parts(ScriptedResponses):
    """A session's items and responses as its consumer wires them, over a core whose turns are
    scripted (``script``: the turn's events; ``specs``: the turns asked for)."""

    def __init__(self, config: Session, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(config, monkeypatch, voices=VOICES)

    async def send(self, event: dict[str, Any]) -> None:
        """A client event, parsed as the consumer parses it, to its handler."""
        parsed = parse(event)
        if parsed.type == "conversation.item.create":
            await self.items.on_create(parsed)
        elif parsed.type == "conversation.item.retrieve":
            await self.items.on_retrieve(parsed)
        elif parsed.type == "conversation.item.delete":
            await self.items.on_delete(parsed)
        else:
            await self.responses.on_create(parsed)

    async def refused_event(self, event: dict[str, Any]) -> RealtimeError:
        with pytest.raises(RealtimeError) as info:
            await self.send(event)
        return info.value

    async def answered(self) -> list[dict[str, Any]]:
        """Until the response is done: every event sent since the last call."""
        while "response.done" not in self.wire.types():
            await asyncio.sleep(0)
        sent = list(self.wire.sent)
        self.wire.clear()
        return sent


@pytest.fixture
async def made() -> AsyncIterator[list[Parts]]:
    out: list[Parts] = []
    yield out
    for parts in out:
        await parts.core.close()
        parts.items.close()


def opening(made: list[Parts], monkeypatch: pytest.MonkeyPatch, config: Session | None = None) -> Parts:
    made.append(Parts(config or llm_session(tools=[WEATHER, TIME]), monkeypatch))
    return made[-1]


def create(item: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"type": "conversation.item.create", "item": item, **fields}


CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": '{"sky": "clear"}'}


async def test_function_call_items_are_stored_echoed_retrieved_and_deleted_in_the_ga_shapes(
    made: list[Parts], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = opening(made, monkeypatch)
    await parts.send(create({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}))
    await parts.send(create({**CALL, "id": "fc_1"}))
    await parts.send(create({**OUTPUT, "id": "out_1"}))
    await parts.send({"type": "conversation.item.retrieve", "item_id": "fc_1"})
    await parts.send({"type": "conversation.item.retrieve", "item_id": "out_1"})
    call = {**CALL, "id": "fc_1", "object": "realtime.item", "status": "completed"}
    output = {**OUTPUT, "id": "out_1", "object": "realtime.item", "status": "completed"}
    events = parts.wire.events()
    assert events[2:] == [
        {"type": "conversation.item.added", "previous_item_id": "<item:1>", "item": call},
        {"type": "conversation.item.done", "previous_item_id": "<item:1>", "item": call},
        {"type": "conversation.item.added", "previous_item_id": "fc_1", "item": output},
        {"type": "conversation.item.done", "previous_item_id": "fc_1", "item": output},
        {"type": "conversation.item.retrieved", "item": call},
        {"type": "conversation.item.retrieved", "item": output},
    ]
    assert isinstance(sdk_parses(parts.wire.sent[2]).item, RealtimeConversationItemFunctionCall)
    assert isinstance(sdk_parses(parts.wire.sent[4]).item, RealtimeConversationItemFunctionCallOutput)
    await parts.send({"type": "conversation.item.delete", "item_id": "out_1"})
    assert parts.wire.types()[-1] == "conversation.item.deleted"
    await parts.send(create({**OUTPUT, "output": "sunny"}))  # answered again once deleted
    # A call without a call_id gets one; one without arguments is a call with none.
    await parts.send(create({"type": "function_call", "name": "get_time", "arguments": ""}))
    made_id = parts.items.conversation.items[-1].call_id
    assert made_id.startswith("call_") and parts.wire.sent[-1]["item"]["call_id"] == made_id


async def test_function_call_items_that_do_not_fit_the_conversation_are_refused(
    made: list[Parts], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = opening(made, monkeypatch)
    err = await parts.refused_event(create(OUTPUT, event_id="e1"))  # OpenAI checks the call exists
    assert (err.param, err.event_id) == ("item.call_id", "e1") and "No function_call item with call_id" in err.message
    await parts.send(create(CALL))
    assert (await parts.refused_event(create(CALL))).param == "item.call_id"  # its call_id is its own
    await parts.send(create(OUTPUT))
    err = await parts.refused_event(create(OUTPUT))
    assert err.param == "item.call_id" and "already has its output" in err.message
    assert len(parts.items.conversation.items) == 2
    for item, param in [
        ({**CALL, "arguments": "{city"}, "item.arguments"),
        ({**CALL, "arguments": "[1]"}, "item.arguments"),
        ({**CALL, "name": "get weather"}, "item.name"),
        ({"type": "function_call", "arguments": "{}"}, "item.name"),
        ({"type": "function_call_output", "output": "x"}, "item.call_id"),
        ({**OUTPUT, "role": "user"}, "item.type"),
        ({"type": "function_call_output", "call_id": "c", "output": "x", "name": "f"}, "item.name"),
        ({"type": "mcp_call", "role": "user", "content": []}, "item.type"),
        ({"type": ["function_call"], "name": "f"}, "item.type"),
    ]:
        err = refused_event(create(item))
        assert err.param == param, item


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_item_keys = st.sampled_from(["id", "call_id", "name", "arguments", "output", "status", "role", "content", "object"])


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(["function_call", "function_call_output"]),
    fields=st.dictionaries(_item_keys, _json | st.just('{"a": 1}') | st.just("get_time"), max_size=5),
)
def test_any_function_item_parses_or_is_refused_with_an_error_event(kind: str, fields: dict[str, Any]) -> None:
    try:
        event = parse(create({**fields, "type": kind}))
    except RealtimeError as err:
        sdk_parses(error_event(err))
        return
    assert event.item.type == kind


# -- the thinker's history -------------------------------------------------------------------------
def said(conv: Conversation, role: str, text: str, response_id: str | None = None) -> Item:
    kind = "output_text" if role == "assistant" else "input_text"
    item = Item(id=new_id("item"), role=role, content=[{"type": kind, "text": text}], response_id=response_id)  # type: ignore[arg-type]
    conv.add(item)
    return item


def called(conv: Conversation, call_id: str, name: str = "get_weather", response_id: str | None = None) -> Item:
    item = Item.function_call(new_id("item"), call_id, name, '{"city": "Paris"}', response_id=response_id)
    conv.add(item)
    return item


def answered(conv: Conversation, call_id: str, output: str = "clear") -> Item:
    item = Item.function_output(new_id("item"), call_id, output)
    conv.add(item)
    return item


def fc(call_id: str, name: str = "get_weather") -> FunctionCall:
    return FunctionCall(call_id=call_id, name=name, arguments='{"city": "Paris"}')


def test_the_history_gives_calls_of_one_response_in_one_entry_and_their_outputs_after() -> None:
    conv = Conversation()
    question = said(conv, "user", "Weather in Paris and the time?")
    said(conv, "assistant", "Let me check.", "resp_1")
    called(conv, "c1", response_id="resp_1")
    called(conv, "c2", "get_time", response_id="resp_1")
    answered(conv, "c1")
    answered(conv, "c2", "noon")
    called(conv, "c3", response_id="resp_2")  # the next response calls, then speaks
    said(conv, "assistant", "Still clear.", "resp_2")
    answered(conv, "c3")
    said(conv, "assistant", "Clear, and it is noon.", "resp_3")
    assert conv.history() == [
        {"role": "user", "content": "Weather in Paris and the time?"},
        HistoryEntry(role="assistant", content="Let me check.", calls=(fc("c1"), fc("c2", "get_time"))),
        HistoryEntry(role="tool", call_id="c1", content="clear"),
        HistoryEntry(role="tool", call_id="c2", content="noon"),
        HistoryEntry(role="assistant", content="Still clear.", calls=(fc("c3"),)),
        HistoryEntry(role="tool", call_id="c3", content="clear"),
        {"role": "assistant", "content": "Clear, and it is noon."},
    ]
    assert conv.history(before=question) == []
    assert conv.answers_a_call() is False
    answered_last = Conversation()
    said(answered_last, "user", "Weather?")
    called(answered_last, "c1")
    answered(answered_last, "c1")
    assert answered_last.answers_a_call() is True


def test_the_clients_calls_merge_when_consecutive_and_orphan_outputs_are_left_out() -> None:
    conv = Conversation()
    said(conv, "user", "Weather?")
    said(conv, "assistant", "Checking.")  # the client's: no response
    first = called(conv, "c1")
    called(conv, "c2")
    answered(conv, "c1")
    answered(conv, "c2")
    said(conv, "assistant", "Clear.")  # words after the outputs: their own entry
    assert conv.history()[1:] == [
        HistoryEntry(role="assistant", content="Checking.", calls=(fc("c1"), fc("c2"))),
        HistoryEntry(role="tool", call_id="c1", content="clear"),
        HistoryEntry(role="tool", call_id="c2", content="clear"),
        {"role": "assistant", "content": "Clear."},
    ]
    conv.delete(first.id)  # its output is now an orphan
    assert [getattr(m, "call_id", None) for m in conv.history()] == [None, None, "c2", None]


# -- responses that call functions ---------------------------------------------------------------
def stream_for(conv: Conversation, session: Session, **fields: Any) -> ResponseStream:
    stream = ResponseStream.create(params(**fields), session, conv)
    if stream.in_conversation and stream.item is not None:
        conv.add(stream.item)  # the consumer places an eager item before the opening events
    return stream


def run(stream: ResponseStream, *turn: Any) -> list[dict[str, Any]]:
    *pieces, last = turn
    out = stream.start()
    for event in pieces:
        out += stream.write(event)
    end = stream.end(last)
    return out + stream.finish(end.status, end.details)


def wire(payloads: list[dict[str, Any]], *known: str) -> list[dict[str, Any]]:
    for payload in payloads:
        sdk_parses(payload)
    events = normalized(payloads, known)
    for event in events:
        event.pop("event_id")
    return events


def call_item(status: str, arguments: str) -> dict[str, Any]:
    return {
        "id": "<item:2>",
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        "name": "get_weather",
        "call_id": "<call:1>",
        "arguments": arguments,
    }


def test_a_response_that_only_calls_a_function_has_no_message_item() -> None:
    conv = Conversation()
    question = said(conv, "user", "Weather in Paris?")
    stream = stream_for(conv, llm_session(tools=[WEATHER], max_output_tokens=200), output_modalities=["text"])
    assert stream.item is None  # tools in effect: made at the first delta, if any
    arguments = '{"city": "Paris"}'
    usage = Usage(input_text_tokens=52, output_text_tokens=9)
    out = run(stream, ToolCall(new_id("call"), "get_weather", arguments), TurnEnd(Status.OK, text="", usage=usage))
    at = {"response_id": "<resp:1>", "output_index": 0}
    done = call_item("completed", arguments)
    events = wire(out, question.id)
    assert events == [
        {"type": "response.created", "response": events[0]["response"]},
        {"type": "response.output_item.added", **at, "item": call_item("in_progress", "")},
        {"type": "conversation.item.added", "previous_item_id": "<item:1>", "item": call_item("in_progress", "")},
        {"type": "response.function_call_arguments.delta", **at, "item_id": "<item:2>", "call_id": "<call:1>"}
        | {"delta": arguments},
        {"type": "response.function_call_arguments.done", **at, "item_id": "<item:2>", "call_id": "<call:1>"}
        | {"name": "get_weather", "arguments": arguments},
        {"type": "response.output_item.done", **at, "item": done},
        {"type": "conversation.item.done", "previous_item_id": "<item:1>", "item": done},
        {"type": "response.done", "response": events[-1]["response"]},
    ]
    created, finished = events[0]["response"], events[-1]["response"]
    assert (created["output"], created["max_output_tokens"]) == ([], 200)
    assert (finished["status"], finished["output"]) == ("completed", [done])
    assert finished["usage"]["input_tokens"] == 52 and finished["usage"]["output_tokens"] == 9  # the model's counts
    assert [i.type for i in conv.items] == ["message", "function_call"]
    assert conv.history()[-1] == HistoryEntry(
        role="assistant", calls=(FunctionCall(call_id=conv.items[-1].call_id, name="get_weather", arguments=arguments),)
    )


def test_with_tools_the_message_item_opens_at_its_first_delta_and_calls_follow_it() -> None:
    conv = Conversation()
    question = said(conv, "user", "Weather in Paris?")
    stream = stream_for(conv, llm_session(tools=[WEATHER]))  # audio
    out = run(
        stream,
        TextDelta("Let me check."),
        ToolCall("call_x", "get_weather", "{}"),
        AudioChunk(PCM),
        TurnEnd(Status.OK, text="Let me check."),
    )
    types = [e["type"] for e in wire(out, question.id)]
    assert types == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    indexes = [(e["type"], e.get("output_index")) for e in out if "output_index" in e]
    assert {i for t, i in indexes if "function_call" in t} == {1} and indexes[-1] == ("response.output_item.done", 0)
    assert [i["type"] for i in out[-1]["response"]["output"]] == ["message", "function_call"]
    assert conv.history()[-1] == HistoryEntry(
        role="assistant",
        content="Let me check.",
        calls=(FunctionCall(call_id="call_x", name="get_weather", arguments="{}"),),
    )


def test_without_tools_in_effect_the_message_item_opens_with_the_response() -> None:
    for session, fields in [(llm_session(), {}), (llm_session(tools=[WEATHER]), {"tool_choice": "none"})]:
        conv = Conversation()
        said(conv, "user", "Hello?")
        stream = stream_for(conv, session, **fields)
        assert stream.item is not None
        types = [e["type"] for e in stream.start()]
        assert types == [
            "response.created",
            "response.output_item.added",
            "conversation.item.added",
            "response.content_part.added",
        ]


def test_a_cancelled_response_with_tools_closes_only_what_it_opened() -> None:
    conv = Conversation()
    said(conv, "user", "Weather?")
    stream = stream_for(conv, llm_session(tools=[WEATHER]), conversation="none")
    out = stream.start() + stream.finish("cancelled", server_events.cancelled("turn_detected"))
    assert [e["type"] for e in wire(out)] == ["response.created", "response.done"]
    assert out[-1]["response"]["output"] == [] and len(conv.items) == 1


# -- the turns: tools to the thinker, answering a function's output --------------------------------
async def test_the_turn_gets_the_tools_and_a_response_after_an_output_answers_it(
    made: list[Parts], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = llm_session(tools=[WEATHER, TIME], tool_choice="required", max_output_tokens=256)
    parts = opening(made, monkeypatch, config)
    await parts.send(create({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"}]}))
    parts.wire.clear()
    parts.script = [ToolCall("call_7", "get_weather", '{"city": "Paris"}'), TurnEnd(Status.OK, text="")]
    await parts.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    first = await parts.answered()
    assert first[-1]["response"]["status"] == "completed"
    [spec] = parts.specs
    assert (spec.question.text, spec.tool_choice, spec.tool_name, spec.max_tokens) == (
        "Paris?",
        ToolChoice.REQUIRED,
        None,
        256,
    )
    assert [t.name for t in spec.tools] == ["get_weather", "get_time"] and spec.parallel_tool_calls is True

    await parts.send(create({"type": "function_call_output", "call_id": "call_7", "output": '{"sky": "clear"}'}))
    parts.wire.clear()
    parts.script = [TextDelta("Clear skies."), TurnEnd(Status.OK, text="Clear skies.")]
    choice = {"type": "function", "name": "get_time"}
    await parts.send(
        {
            "type": "response.create",
            "response": {"output_modalities": ["text"], "tool_choice": "auto", "parallel_tool_calls": False},
        }
    )
    second = await parts.answered()
    assert second[-1]["response"]["status"] == "completed"  # not failed for want of a question
    spec = parts.specs[1]
    assert (spec.question.text, spec.question.audio, spec.tool_choice) == ("", b"", ToolChoice.AUTO)
    assert spec.parallel_tool_calls is False
    call = FunctionCall(call_id="call_7", name="get_weather", arguments='{"city": "Paris"}')
    assert list(spec.history) == [
        {"role": "user", "content": "Paris?"},
        HistoryEntry(role="assistant", calls=(call,)),
        HistoryEntry(role="tool", call_id="call_7", content='{"sky": "clear"}'),
    ]
    parts.script = [TurnEnd(Status.OK, text="")]
    await parts.send({"type": "response.create", "response": {"tool_choice": choice, "max_output_tokens": "inf"}})
    await parts.answered()
    assert (parts.specs[2].tool_choice, parts.specs[2].tool_name, parts.specs[2].max_tokens) == (
        ToolChoice.FUNCTION,
        "get_time",
        None,
    )


async def test_a_response_whose_tool_choice_the_tools_do_not_allow_is_refused_before_it_starts(
    made: list[Parts], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = llm_session(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    parts = opening(made, monkeypatch, config)
    parts.wire.clear()
    err = await parts.refused_event({"type": "response.create", "event_id": "e9", "response": {"tools": [TIME]}})
    assert (err.param, err.event_id) == ("response.tool_choice", "e9")
    assert parts.wire.sent == [] and parts.responses.running is None and parts.specs == []
