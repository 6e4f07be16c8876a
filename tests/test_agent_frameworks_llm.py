"""Voice-agent frameworks calling function tools on ``/v1/realtime`` answered by a language model.

The server runs with ``OMNIWEB_THINKER=llm`` on SmolLM2-135M (``support.llm``). Its chat template
has no tool support, so under ``tool_choice: "auto"`` it never calls; each test makes the framework
force the call through the framework's own public settings (``"required"``), then lets the answer
after the tool's output be free words, as each framework allows. Each run must see no ``error``
event or error frame; the model is tiny, so the tests check the plumbing, not the wording.

- openai-agents (both model sources: embedded in the engine, and llama.cpp's server over HTTP):
  a ``RealtimeAgent`` with a ``@function_tool``.
- pipecat-ai: ``OpenAIRealtimeLLMService`` with a registered function, the schema in its context.
- livekit-plugins-openai: the realtime model's session, its generation's function stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from agents import function_tool, set_tracing_disabled
from agents.realtime import RealtimeAgent, RealtimeModelSendRawMessage, RealtimeRunner, RealtimeSession
from support.llm import llm_daphne

set_tracing_disabled(True)  # the SDK's trace export goes to api.openai.com

TOKEN = "test-token-for-the-agent-frameworks-llm"
QUESTION = "What is the weather like in Paris today?"
RATE = 24000
WAIT = 240  # seconds: a generous ceiling for a 2-core machine shared with other tests

pytestmark = pytest.mark.timeout(600)


def forecast(city: str) -> str:
    """The fixed fact every test's tool returns."""
    return f"It is sunny and 21 degrees in {city}."


CITY = {"city": {"type": "string", "description": "The city's name."}}  # the schema's properties


@pytest.fixture(scope="module", params=["embedded", "http"])
def base(request: pytest.FixtureRequest) -> Iterator[str]:
    """The app's base URL, the model embedded in its engine or behind llama.cpp's server; the tests
    of one source only name it (``indirect``) and share its server."""
    with llm_daphne(request.param, OMNIWEB_API_TOKENS=TOKEN) as url:
        yield url


embedded_only = pytest.mark.parametrize("base", ["embedded"], indirect=True)


def ws(base: str) -> str:
    return base.replace("http", "ws", 1) + "/v1/realtime"


# -- openai-agents --------------------------------------------------------------------------------------
async def test_openai_agents_realtime_agent_calls_its_function_tool_and_speaks_the_answer(base: str) -> None:
    """openai-agents 0.24. By default the SDK sends no ``tool_choice`` (the session's stays
    ``"auto"``), and after running a tool it sends the ``function_call_output`` item and a bare
    ``response.create`` (no ``tool_choice``): the follow-up answer is governed by the session's
    choice. So the test sets ``"required"`` for the session through the run config
    (``model_settings``), and the tool body, before returning, switches the session to ``"auto"``
    with a ``session.update`` sent through the session's model (``session.model.send_event``, a
    public ``RealtimeModelSendRawMessage``): the follow-up response is then not forced again and the
    agent speaks its answer."""
    calls: list[str] = []
    session: RealtimeSession | None = None

    @function_tool
    async def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city's name.
        """
        calls.append(city)
        assert session is not None
        await session.model.send_event(
            RealtimeModelSendRawMessage(
                message={
                    "type": "session.update",
                    "other_data": {"session": {"type": "realtime", "tool_choice": "auto"}},
                }
            )
        )
        return forecast(city)

    agent = RealtimeAgent(
        name="Assistant", instructions="You answer questions about the weather briefly.", tools=[get_weather]
    )
    runner = RealtimeRunner(agent, config={"model_settings": {"tool_choice": "required"}})
    session = await runner.run(model_config={"url": ws(base) + "?model=gpt-realtime", "api_key": TOKEN})
    errors: list[Any] = []
    seen: list[str] = []
    tool_ends: list[Any] = []
    audio_after_tool = 0
    history: list[Any] = []

    async def converse() -> None:
        nonlocal audio_after_tool, history
        async for event in session:
            seen.append(event.type)
            if event.type == "error" or (event.type == "raw_model_event" and event.data.type == "error"):
                errors.append(event)
                return
            if event.type == "tool_end":
                tool_ends.append(event)
            elif event.type == "audio" and tool_ends:
                audio_after_tool += len(event.audio.data)
            elif event.type == "history_updated":
                history = list(event.history)
            elif event.type == "raw_model_event" and event.data.type == "turn_ended" and audio_after_tool:
                return  # the spoken answer's response.done: its transcript is in the history

    async with session:
        await session.send_message(QUESTION)
        await asyncio.wait_for(converse(), WAIT)

    assert errors == [], errors
    assert len(calls) == 1 and isinstance(calls[0], str) and calls[0].strip(), calls
    assert json.loads(tool_ends[0].arguments) == {"city": calls[0]}
    assert tool_ends[0].output == forecast(calls[0])
    assert audio_after_tool > RATE // 2, seen  # over a quarter second of spoken answer after the tool ran
    calls_in_history = [item for item in history if getattr(item, "type", None) == "function_call"]
    assert [item.output for item in calls_in_history] == [forecast(calls[0])]
    answers = [
        getattr(part, "transcript", None) or getattr(part, "text", None) or ""
        for item in history
        if getattr(item, "role", None) == "assistant"
        for part in item.content
    ]
    assert any(answer.strip() for answer in answers), history


# -- pipecat-ai ---------------------------------------------------------------------------------------
@embedded_only
async def test_pipecat_realtime_service_runs_its_function_and_speaks_the_result(base: str) -> None:
    """pipecat-ai 1.14. ``OpenAIRealtimeLLMService`` sends the session's ``SessionProperties``
    (``tool_choice`` unset by default: the server's ``"auto"``) and the context's tools in its
    ``session.update``; after a function's result it sends the ``function_call_output`` item and,
    when the assistant aggregator asks for inference, a ``response.create`` carrying only
    ``output_modalities`` (no ``tool_choice``): the follow-up answer is governed by the session's
    choice. So the test sets ``SessionProperties(tool_choice="required")`` in the service's
    settings (its first ``session.update``, on ``session.created``, carries the choice before the
    context's tools: omniweb checks a session's choice against the tools when a response is made),
    and the function handler, before reporting its result, queues an
    ``LLMUpdateSettingsFrame`` whose ``session_properties`` switch it to ``"auto"`` (the service
    sends a ``session.update``) and waits until the frame has passed the service."""
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.frames.frames import (
        EndFrame,
        ErrorFrame,
        Frame,
        LLMFullResponseEndFrame,
        LLMRunFrame,
        LLMTextFrame,
        LLMUpdateSettingsFrame,
        TTSAudioRawFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.llm_service import FunctionCallParams
    from pipecat.services.openai.realtime.events import SessionProperties
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
    from pipecat.workers.runner import WorkerRunner

    calls: list[dict[str, Any]] = []

    class Sink(FrameProcessor):
        """After the realtime service: its answer's frames, and the settings frame it applied."""

        def __init__(self) -> None:
            super().__init__()
            self.audio_after_call = 0
            self.text_after_call: list[str] = []
            self.settings_applied = asyncio.Event()
            self.finished = asyncio.Event()  # the spoken answer's end, or an error

        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, LLMUpdateSettingsFrame):
                self.settings_applied.set()
            elif isinstance(frame, TTSAudioRawFrame) and calls:
                self.audio_after_call += len(frame.audio)
            elif isinstance(frame, LLMTextFrame) and calls:
                self.text_after_call.append(frame.text)
            elif isinstance(frame, LLMFullResponseEndFrame) and self.audio_after_call:
                self.finished.set()
            await self.push_frame(frame, direction)

    weather = FunctionSchema(
        name="get_weather",
        description="Get the current weather in a city.",
        properties=CITY,
        required=["city"],
    )
    tools = ToolsSchema(standard_tools=[weather])

    def session(tool_choice: Any) -> OpenAIRealtimeLLMService.Settings:
        return OpenAIRealtimeLLMService.Settings(session_properties=SessionProperties(tool_choice=tool_choice))

    sink = Sink()
    realtime = OpenAIRealtimeLLMService(api_key=TOKEN, base_url=ws(base), settings=session("required"))

    async def get_weather(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        await params.pipeline_worker.queue_frame(LLMUpdateSettingsFrame(delta=session("auto")))
        await asyncio.wait_for(sink.settings_applied.wait(), WAIT)
        await params.result_callback(forecast(str(params.arguments.get("city"))))

    realtime.register_function("get_weather", get_weather)
    context = LLMContext(messages=[{"role": "user", "content": QUESTION}], tools=tools)
    aggregators = LLMContextAggregatorPair(context)
    worker = PipelineWorker(Pipeline([aggregators.user(), realtime, sink, aggregators.assistant()]))
    errors: list[ErrorFrame] = []

    @worker.event_handler("on_pipeline_error")
    async def on_pipeline_error(_worker: Any, frame: ErrorFrame) -> None:
        errors.append(frame)
        sink.finished.set()  # an error event ends the service's session: no answer will come

    async def run() -> None:
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        await runner.run()

    running = asyncio.create_task(run())
    try:
        await asyncio.sleep(1.0)  # the session is set up when the pipeline starts
        await worker.queue_frames([LLMRunFrame()])
        await asyncio.wait_for(sink.finished.wait(), WAIT)
    finally:
        await worker.queue_frames([EndFrame()])
        await asyncio.wait_for(running, 60)
    assert [frame.error for frame in errors] == []
    assert len(calls) == 1 and isinstance(calls[0].get("city"), str) and calls[0]["city"].strip(), calls
    assert sink.audio_after_call > RATE  # over half a second of PCM16 spoken after the call
    assert "".join(sink.text_after_call).strip()
    results = [m for m in context.get_messages() if isinstance(m, dict) and m.get("role") == "tool"]
    assert [json.loads(m["content"]) for m in results] == [forecast(calls[0]["city"])], context.get_messages()


# -- livekit-plugins-openai ---------------------------------------------------------------------------
@embedded_only
async def test_livekit_realtime_session_yields_the_function_call_and_speaks_its_output(base: str) -> None:
    """livekit-plugins-openai 1.8.9. The realtime model's ``tool_choice`` defaults to ``"auto"``;
    ``AgentSession``, after running tools, adds the outputs with ``update_chat_ctx`` and asks for the
    reply with ``generate_reply(tool_choice=...)``: ``"auto"`` (or ``"none"`` at its step limit,
    never ``"required"``), sent on that ``response.create``. The test drives the session as
    ``AgentSession`` does, with calls forced by ``RealtimeModel(tool_choice="required")`` (sent on
    connect, before any tool: omniweb checks it against the tools when a response is made): it
    declares the tool (``update_tools``), takes the call from the
    generation's function stream, runs it (``llm.execute_function_call``), sends the output
    (``update_chat_ctx``) and asks for the spoken answer with ``generate_reply(tool_choice="auto")``."""
    from livekit.agents import llm, utils
    from livekit.plugins import openai as lk_openai

    calls: list[str] = []

    @llm.function_tool
    async def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city's name.
        """
        calls.append(city)
        return forecast(city)

    async def read(generation: llm.GenerationCreatedEvent) -> tuple[list[llm.FunctionCall], str, int]:
        async def functions() -> list[llm.FunctionCall]:
            return [call async for call in generation.function_stream]

        async def audio(stream: Any) -> int:
            return sum([frame.samples_per_channel async for frame in stream])

        reading = asyncio.create_task(functions())
        text: list[str] = []
        samples = 0
        async for message in generation.message_stream:
            counting = asyncio.create_task(audio(message.audio_stream))
            text += [str(piece) async for piece in message.text_stream]
            samples += await counting
        return await reading, "".join(text), samples

    async with utils.http_context.open():
        session = lk_openai.realtime.RealtimeModel(
            base_url=base + "/v1", api_key=TOKEN, tool_choice="required"
        ).session()
        errors: list[Any] = []
        session.on("error", errors.append)
        try:
            await session.update_instructions("You answer questions about the weather briefly.")
            await session.update_tools([get_weather])
            context = llm.ChatContext()
            context.add_message(role="user", content=QUESTION)
            await session.update_chat_ctx(context)
            called, _, _ = await asyncio.wait_for(read(await session.generate_reply()), WAIT)
            assert [call.name for call in called] == ["get_weather"], called
            result = await llm.execute_function_call(called[0], session.tools)
            assert result.raw_exception is None, result
            after = session.chat_ctx.copy()
            after.items.append(result.fnc_call_out)
            await session.update_chat_ctx(after)
            _, text, samples = await asyncio.wait_for(read(await session.generate_reply(tool_choice="auto")), WAIT)
            history = session.chat_ctx.copy()
        finally:
            await session.aclose()
    assert [str(error.error) for error in errors] == []
    assert len(calls) == 1 and calls[0].strip() and json.loads(called[0].arguments) == {"city": calls[0]}
    assert result.fnc_call_out.output == forecast(calls[0])
    assert text.strip() and samples > RATE // 2  # over half a second of spoken answer
    outputs = [item for item in history.items if item.type == "function_call_output"]
    assert [item.output for item in outputs] == [forecast(calls[0])]
