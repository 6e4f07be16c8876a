"""Voice-agent frameworks against a live daphne, with their defaults: only the base URL and a key.

openai-agents (pinned in requirements-dev.txt): its voice models (the voice pipeline's STT with
``gpt-transcribe``, batch and streamed through a realtime transcription session with
``semantic_vad``; its TTS with ``gpt-4o-mini-tts`` and the instructions it sends on every call) and
a realtime agent (``gpt-realtime``, ``semantic_vad``, ``tracing: "auto"``) answering a question
about an image. Each run must see no ``error`` event. Its tracing exporter (to OpenAI) is off:
nothing here leaves the machine.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import openai
import pytest
from agents import set_tracing_disabled
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.voice import AudioInput, StreamedAudioInput, STTModelSettings, TTSModelSettings
from agents.voice.models.openai_model_provider import OpenAIVoiceModelProvider
from support.photos import jpeg, photo
from support.servers import DAPHNE_ARGS, free_port, live_server

set_tracing_disabled(True)  # the SDK's trace export goes to api.openai.com (the wire keeps "auto")

TOKEN = "test-token-for-the-agent-frameworks"
FIRST = "The quick brown fox jumps over the lazy dog."
SECOND = "What colour is the cup on the table?"
RATE = 24000

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    port = free_port()
    args = ["-m", "daphne", *DAPHNE_ARGS, "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"]
    with live_server(args, port, OMNIWEB_API_TOKENS=TOKEN) as url:
        yield url


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower().replace("colour", "color"))


@pytest.fixture
async def provider(base: str) -> AsyncIterator[OpenAIVoiceModelProvider]:
    """The provider with its own client per test: the SDK's shared HTTP client outlives the event
    loop of the test that made it (each test runs on a loop of its own)."""
    client = openai.AsyncOpenAI(api_key=TOKEN, base_url=base + "/v1")
    yield OpenAIVoiceModelProvider(openai_client=client)
    await client.close()


async def speak(provider: OpenAIVoiceModelProvider, text: str) -> np.ndarray:
    tts = provider.get_tts_model(None)
    assert tts.model == "gpt-4o-mini-tts"  # the default
    pcm = b"".join([chunk async for chunk in tts.run(text, TTSModelSettings())])
    return np.frombuffer(pcm, dtype=np.int16)


async def test_openai_agents_voice_models_speak_and_transcribe(provider: OpenAIVoiceModelProvider) -> None:
    audio = await speak(provider, f"{FIRST} {SECOND}")
    assert audio.size > 3 * RATE  # TTS instructions sent by default: accepted, the words spoken
    stt = provider.get_stt_model(None)
    assert stt.model == "gpt-transcribe"
    text = await stt.transcribe(AudioInput(buffer=audio), STTModelSettings(), False, False)
    assert words(text) == words(f"{FIRST} {SECOND}")


async def test_openai_agents_streamed_input_is_transcribed_turn_by_turn(provider: OpenAIVoiceModelProvider) -> None:
    """StreamedAudioInput: a realtime transcription session with semantic_vad, its defaults."""
    first, second = await speak(provider, FIRST), await speak(provider, SECOND)
    streamed = StreamedAudioInput()
    stt = provider.get_stt_model(None)
    session = await stt.create_session(streamed, STTModelSettings(), False, False)
    silence = np.zeros(2 * RATE, dtype=np.int16)

    async def feed() -> None:
        for piece in (first, silence, second, silence):
            for i in range(0, piece.size, RATE // 10):  # 100 ms messages
                await streamed.add_audio(piece[i : i + RATE // 10])
                await asyncio.sleep(0.02)
        await streamed.add_audio(None)  # the end of input: the SDK commits and clears

    feeder = asyncio.create_task(feed())
    turns = [turn async for turn in session.transcribe_turns()]
    await feeder
    await session.close()
    assert [words(turn) for turn in turns] == [words(FIRST), words(SECOND)]


async def test_openai_agents_realtime_agent_answers_about_an_image(base: str) -> None:
    agent = RealtimeAgent(name="Assistant", instructions="You describe pictures briefly.")
    session = await RealtimeRunner(agent).run(
        model_config={"url": base.replace("http", "ws", 1) + "/v1/realtime?model=gpt-realtime", "api_key": TOKEN}
    )
    errors: list[Any] = []
    audio = 0
    async with session:
        question = [
            {
                "type": "input_image",
                "image_url": "data:image/jpeg;base64," + base64.b64encode(jpeg(photo("astronaut"))).decode(),
            },
            {"type": "input_text", "text": "How many people can you see?"},
        ]
        await session.send_message({"type": "message", "role": "user", "content": question})
        async for event in session:
            if event.type == "error" or (event.type == "raw_model_event" and event.data.type == "error"):
                errors.append(event)
            elif event.type == "audio":
                audio += len(event.audio.data)
            elif event.type == "audio_end":
                break
        answers = [
            getattr(part, "transcript", None) or getattr(part, "text", None)
            for item in session._history
            if getattr(item, "role", None) == "assistant"
            for part in item.content
        ]
    assert errors == []
    assert audio > RATE  # over half a second of spoken answer
    assert any(answer and "person" in answer.lower() for answer in answers), answers
