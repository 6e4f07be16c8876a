"""Voice-agent frameworks against a live daphne, with their defaults: only the base URL and a key.

All pinned in requirements-dev.txt. Each run must see no ``error`` event or error frame.

- openai-agents: its voice models (the voice pipeline's STT with ``gpt-transcribe``, batch and
  streamed through a realtime transcription session with ``semantic_vad``; its TTS with
  ``gpt-4o-mini-tts`` and the instructions it sends on every call) and a realtime agent
  (``gpt-realtime``, ``semantic_vad``, ``tracing: "auto"``) answering a question about an image.
  Its tracing exporter (to OpenAI) is off: nothing here leaves the machine.
- pipecat-ai: its OpenAI TTS service in a pipeline, its STT service (``gpt-transcribe``) on that
  audio, and its realtime LLM service (``gpt-realtime-2.1``) answering a context.
- livekit-plugins-openai: its TTS (it reads ``x-request-id``), its STT (``gpt-4o-mini-transcribe``)
  and its realtime model (``semantic_vad``) answering a question about an image.
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
import wave
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
from support.servers import live_daphne

set_tracing_disabled(True)  # the SDK's trace export goes to api.openai.com (the wire keeps "auto")

TOKEN = "test-token-for-the-agent-frameworks"
FIRST = "The quick brown fox jumps over the lazy dog."
SECOND = "What colour is the cup on the table?"
RATE = 24000

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with live_daphne(OMNIWEB_API_TOKENS=TOKEN) as url:
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


@pytest.fixture(scope="module")
def question_audio() -> bytes:
    """A spoken question in our own voice, PCM16 24 kHz, then 1.5 s of silence."""
    from hibari import Hibari

    wave_ = Hibari()("How many people can you see?", seed=7).astype(np.float32)
    pcm = (np.clip(wave_, -1, 1) * 32767).astype("<i2")
    return np.concatenate([np.zeros(RATE // 2, "<i2"), pcm, np.zeros(RATE * 3 // 2, "<i2")]).tobytes()


async def test_openai_agents_realtime_agent_answers_by_voice_and_yields_to_barge_in(
    base: str, question_audio: bytes
) -> None:
    """semantic_vad ends the spoken question; speaking over the answer interrupts it (the agent
    truncates the item at what it played), and the new question is answered."""
    agent = RealtimeAgent(name="Assistant", instructions="You describe pictures briefly.")
    session = await RealtimeRunner(agent).run(
        model_config={"url": base.replace("http", "ws", 1) + "/v1/realtime?model=gpt-realtime", "api_key": TOKEN}
    )
    picture = "data:image/jpeg;base64," + base64.b64encode(jpeg(photo("astronaut"))).decode()
    seen: list[str] = []
    errors: list[Any] = []

    async def until(kind: str) -> None:
        async for event in session:
            seen.append(event.type)
            if event.type == "error" or (event.type == "raw_model_event" and event.data.type == "error"):
                errors.append(event)
            if event.type == kind:
                return

    async def say() -> None:
        for i in range(0, len(question_audio), RATE // 5):  # 100 ms messages
            await session.send_audio(question_audio[i : i + RATE // 5])
            await asyncio.sleep(0.01)

    async with session:
        await session.send_message({"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": picture}, {"type": "input_text", "text": "Look at this."}
        ]})  # fmt: skip
        await until("audio_end")
        await say()
        await until("audio")  # the spoken question's answer has begun
        await say()  # spoken over it
        await until("audio_interrupted")

        def answers() -> list[str]:
            return [
                getattr(part, "transcript", None) or ""
                for item in session._history
                if getattr(item, "role", None) == "assistant"
                for part in item.content
            ]

        async def answered() -> None:
            # The interrupted answer may end (audio_end) after audio_interrupted: wait for the
            # second question's answer, the third assistant item, to end with its words.
            while len(answers()) < 3 or not answers()[-1]:
                await until("audio_end")

        await asyncio.wait_for(answered(), 120)
    assert errors == []
    assert seen.count("audio_interrupted") >= 1
    assert "person" in answers()[-1].lower(), answers()


# -- pipecat-ai ---------------------------------------------------------------------------------------
async def test_pipecat_tts_stt_and_realtime_services(base: str) -> None:
    from pipecat.frames.frames import (
        EndFrame,
        ErrorFrame,
        Frame,
        LLMContextFrame,
        LLMFullResponseEndFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSSpeakFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.task import PipelineParams
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
    from pipecat.services.openai.stt import OpenAISTTService
    from pipecat.services.openai.tts import OpenAITTSService
    from pipecat.workers.runner import WorkerRunner

    async def run(worker: PipelineWorker) -> None:
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        await runner.run()

    class Sink(FrameProcessor):
        def __init__(self) -> None:
            super().__init__()
            self.audio = bytearray()
            self.text: list[str] = []
            self.errors: list[ErrorFrame] = []
            self.answered = asyncio.Event()

        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                self.audio += frame.audio
            elif isinstance(frame, ErrorFrame):
                self.errors.append(frame)
            elif isinstance(frame, LLMTextFrame):
                self.text.append(frame.text)
            elif isinstance(frame, LLMFullResponseEndFrame):
                self.answered.set()
            await self.push_frame(frame, direction)

    spoken = Sink()
    worker = PipelineWorker(
        Pipeline([OpenAITTSService(api_key=TOKEN, base_url=base + "/v1"), spoken]),
        params=PipelineParams(audio_out_sample_rate=RATE),
    )
    await worker.queue_frames([TTSSpeakFrame(FIRST), EndFrame()])
    await run(worker)
    assert spoken.errors == [] and len(spoken.audio) > 2 * RATE  # over a second of PCM16
    wav = io.BytesIO()
    with wave.open(wav, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(bytes(spoken.audio))
    stt = OpenAISTTService(api_key=TOKEN, base_url=base + "/v1")
    heard = [frame async for frame in stt.run_stt(wav.getvalue())]
    assert [words(frame.text) for frame in heard if frame is not None and hasattr(frame, "text")] == [words(FIRST)]

    realtime = OpenAIRealtimeLLMService(api_key=TOKEN, base_url=base.replace("http", "ws", 1) + "/v1/realtime")
    answer = Sink()
    worker = PipelineWorker(Pipeline([realtime, answer]))
    context = LLMContext(messages=[{"role": "user", "content": "Say hello in five words."}])

    async def ask() -> None:
        await asyncio.sleep(1.0)  # the session is set up when the pipeline starts
        await worker.queue_frames([LLMContextFrame(context)])
        try:
            await asyncio.wait_for(answer.answered.wait(), 60)
        finally:
            await worker.queue_frames([EndFrame()])

    await asyncio.gather(run(worker), ask())
    assert answer.errors == [] and "".join(answer.text).strip() and len(answer.audio) > RATE


# -- livekit-plugins-openai ---------------------------------------------------------------------------
async def test_livekit_tts_stt_and_realtime_model(base: str, caplog: pytest.LogCaptureFixture) -> None:
    from livekit.agents import llm, utils
    from livekit.plugins import openai as lk_openai

    async with utils.http_context.open():
        tts = lk_openai.TTS(base_url=base + "/v1", api_key=TOKEN)
        assert tts.model == "gpt-4o-mini-tts"
        async with tts.synthesize(FIRST) as stream:
            frames = [event.frame async for event in stream]
        assert sum(f.samples_per_channel for f in frames) > RATE and frames[0].sample_rate == RATE
        stt = lk_openai.STT(base_url=base + "/v1", api_key=TOKEN)
        assert stt.model == "gpt-4o-mini-transcribe"
        recognized = await stt.recognize(frames)
        assert words(recognized.alternatives[0].text) == words(FIRST)

        session = lk_openai.realtime.RealtimeModel(base_url=base + "/v1", api_key=TOKEN).session()
        errors: list[Any] = []
        session.on("error", errors.append)
        try:
            await session.update_instructions("You describe pictures briefly.")
            picture = "data:image/jpeg;base64," + base64.b64encode(jpeg(photo("astronaut"))).decode()
            context = llm.ChatContext()
            context.add_message(role="user", content=[llm.ImageContent(image=picture), "How many people can you see?"])
            await session.update_chat_ctx(context)
            generation = await session.generate_reply()
            text: list[str] = []
            samples = 0
            async for message in generation.message_stream:

                async def read_audio(audio: Any) -> int:
                    return sum([frame.samples_per_channel async for frame in audio])

                reading = asyncio.create_task(read_audio(message.audio_stream))
                text += [str(piece) async for piece in message.text_stream]
                samples += await reading
        finally:
            await session.aclose()
    assert errors == [] and "person" in "".join(text).lower() and samples > RATE // 2
    assert not [r for r in caplog.records if "request" in r.getMessage().lower() and r.levelname == "WARNING"]
