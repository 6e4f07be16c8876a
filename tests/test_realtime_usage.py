"""``response.done``'s ``usage`` counted by one rule (``omniweb/conversation/usage.py``), whatever
ended the response: what the thinker was given (the whole conversation, its function calls and
outputs, the tools, the question, the images) and what was sent of the answer. A response cancelled
mid-answer counts the audio and text actually sent, at the per-ms rate of a completed one, so the
two agree up to the cut.

First without a socket (the engine request's count, and ``ResponseStream`` cut short against the
core's count of the whole turn); then through the official ``openai`` SDK against a live daphne with
the default ``scene`` thinker, and with the ``llm`` thinker (SmolLM2 embedded, whose own counts a
completed answer reports).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from support.llm import llm_daphne
from support.photos import jpeg, photo
from support.realtime import recv, sdk_parses, until
from support.servers import live_daphne

from omniweb.conversation import (
    AudioChunk,
    BufferedFrame,
    FramesSelected,
    Question,
    TextDelta,
    ToolCall,
    Transcript,
    TurnEnd,
    TurnSpec,
)
from omniweb.conversation.turns import engine_request
from omniweb.conversation.usage import Tally, audio_tokens, given, image_tokens, text_tokens
from omniweb.engine.messages import Status
from omniweb.engine.requests import FunctionCall, FunctionTool, HistoryEntry, Role
from omniweb.openai_api.protocol import OPENAI_VOICES
from omniweb.openai_api.realtime import server_events
from omniweb.openai_api.realtime.events import ResponseParams
from omniweb.openai_api.realtime.items import Conversation, Item
from omniweb.openai_api.realtime.responses import ResponseStream
from omniweb.openai_api.realtime.session import new_session

TOKEN = "test-token-for-the-realtime-usage"
RATE = 24000  # the answer's PCM16 mono
VOICES = {**dict.fromkeys(OPENAI_VOICES, "heart"), "heart": "heart"}
PCM_100MS = b"\x01\x00" * 2400
SPOKEN_MS_PER_TOKEN = 50  # OpenAI's assistant audio: one token per 50 ms (its Realtime cost guide)


def pcm_ms(pcm: bytes) -> float:
    return len(pcm) / 2 / RATE * 1000


# -- the rule, without a socket ----------------------------------------------------------------------
def test_the_engine_request_is_counted_whole() -> None:
    """Everything the turn's engine request gives the thinker: instructions, every history entry
    with its function calls and outputs, the tools, the question's text and audio, the frames."""
    history = (
        {"role": "user", "content": "What's the weather in Paris?"},
        HistoryEntry(
            role=Role.ASSISTANT,
            content="Let me look.",
            calls=(FunctionCall(call_id="c1", name="weather", arguments='{"city":"Paris"}'),),
        ),
        HistoryEntry(role=Role.TOOL, call_id="c1", content='{"sky": "clear", "celsius": 21}'),
        {"role": "assistant", "content": "Clear, 21 degrees."},
    )
    tools = (FunctionTool(name="weather", description="The weather in a city.", parameters='{"type":"object"}'),)
    frames = (BufferedFrame(b"", 0.0, width=640, height=480), BufferedFrame(b"", 0.0, width=4000, height=3000))
    audio = b"\x00\x00" * 16000 * 2  # two seconds at 16 kHz
    spec = TurnSpec(Question("And tomorrow?", audio), history=history, instructions="Be brief.", tools=tools)
    counted = given(engine_request(spec, frames), frames)
    texts = [
        "Be brief.",
        "And tomorrow?",
        "What's the weather in Paris?",
        "Let me look.",
        "weather",
        '{"city":"Paris"}',
        '{"sky": "clear", "celsius": 21}',
        "Clear, 21 degrees.",
        "weather",
        "The weather in a city.",
        '{"type":"object"}',
    ]
    assert counted.input_text_tokens == sum(text_tokens(t) for t in texts)
    assert text_tokens("Clear, 21 degrees.") == 5  # words and punctuation marks
    assert counted.input_audio_tokens == 20  # 2 s of the user's audio, one token per 100 ms
    assert counted.input_image_tokens == 20 * 15 + 1536  # 32x32 patches, at most 1536 an image
    assert (counted.output_text_tokens, counted.output_audio_tokens) == (0, 0)
    assert audio_tokens(1000, spoken=True) == 1000 // SPOKEN_MS_PER_TOKEN and audio_tokens(1, spoken=True) == 1


def answer_pieces() -> list[Any]:
    """One answer as a turn yields it: the frames and what the thinker was given, what it heard,
    then text, audio and a function call."""
    frame = BufferedFrame(b"", 0.0, width=512, height=512)
    spec = TurnSpec(Question(audio=b"\x00\x00" * 8000), instructions="Answer briefly.")
    request = engine_request(spec, (frame,))
    return [
        FramesSelected((frame,), 0.0, 0.0, given(request, (frame,))),
        Transcript("How many people can you see?"),
        TextDelta("There are two "),
        AudioChunk(PCM_100MS * 7),
        TextDelta("people, "),
        ToolCall("call_1", "count", '{"what": "people"}'),
        AudioChunk(PCM_100MS * 3 + b"\x01\x00" * 120),  # 305 ms
        TextDelta("both smiling."),
        AudioChunk(PCM_100MS * 9),
    ]


def stream() -> ResponseStream:
    """An audio response to a spoken question, kept out of the conversation."""
    conv = Conversation()
    conv.add(Item(id="item_q", role="user", content=[{"type": "input_audio", "transcript": None}], audio=b"\0\0"))
    return ResponseStream.create(ResponseParams(conversation="none"), new_session(VOICES), conv)


def test_a_cut_response_counts_what_it_sent_by_the_rule_of_a_completed_one() -> None:
    pieces = answer_pieces()
    whole = Tally(pieces[0].given)  # the turn runner's own count of the whole turn
    for piece in pieces[1:]:
        whole.add(piece)
    end = TurnEnd(Status.OK, text="There are two people, both smiling.")
    completed = stream()
    completed.start()
    for piece in pieces:
        completed.write(piece)
    completed.end(dataclasses.replace(end, usage=whole.usage(end)))
    done = sdk_parses(completed.finish("completed", None)[-1]).response
    assert done.usage.output_token_details.audio_tokens == math.ceil(1905 / SPOKEN_MS_PER_TOKEN)
    assert done.usage.output_token_details.text_tokens == text_tokens(end.text) + text_tokens(
        'count {"what": "people"}'
    )
    assert done.usage.input_token_details.audio_tokens == 5  # 0.5 s heard, one token per 100 ms
    assert done.usage.input_token_details.text_tokens == text_tokens("Answer briefly. How many people can you see?")
    assert done.usage.input_token_details.image_tokens == image_tokens(512, 512) == 256
    for cut in range(len(pieces) + 1):
        cancelled = stream()
        out = cancelled.start()
        for piece in pieces[:cut]:
            out += cancelled.write(piece)
        out += cancelled.finish("cancelled", server_events.cancelled("client_cancelled"))
        usage = sdk_parses(out[-1]).response.usage
        audio = b"".join(base64.b64decode(e["delta"]) for e in out if e["type"] == "response.output_audio.delta")
        text = "".join(e["delta"] for e in out if e["type"] == "response.output_audio_transcript.delta")
        calls = [(e["name"], e["arguments"]) for e in out if e["type"] == "response.function_call_arguments.done"]
        # what was sent, at a completed response's per-ms rate; the input once the thinker had it
        assert usage.output_token_details.audio_tokens == math.ceil(pcm_ms(audio) / SPOKEN_MS_PER_TOKEN)
        assert usage.output_token_details.text_tokens == text_tokens(text) + sum(
            text_tokens(name) + text_tokens(args) for name, args in calls
        )
        if cut >= 2:  # given, and heard
            assert usage.input_token_details == done.usage.input_token_details
        assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage == done.usage  # cut after the last piece: exactly the completed response's count


def test_a_language_models_own_counts_replace_the_text_estimates() -> None:
    tally = Tally()
    tally.add(TextDelta("Paris is the capital."))
    tally.add(AudioChunk(PCM_100MS))
    counted = tally.usage(TurnEnd(Status.OK, text="Paris is the capital.", prompt_tokens=41, completion_tokens=6))
    assert (counted.input_text_tokens, counted.output_text_tokens, counted.output_audio_tokens) == (41, 6, 2)
    assert tally.usage().output_text_tokens == text_tokens("Paris is the capital.") == 5  # cut short: the rule


# -- through the SDK, against the server -------------------------------------------------------------
@contextlib.asynccontextmanager
async def connected(base: str) -> AsyncIterator[Any]:
    client = openai.AsyncOpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0)
    try:
        async with client.realtime.connect(model="gpt-realtime") as connection:
            created = await recv(connection)
            assert created.type == "session.created", created
            yield connection
    finally:
        await client.close()


async def configure(conn: Any, **session: Any) -> None:
    await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}, **session})
    assert (await recv(conn)).type == "session.updated"


async def add(conn: Any, role: str, content: dict[str, Any]) -> None:
    await conn.conversation.item.create(item={"type": "message", "role": role, "content": [content]})
    await until(conn, "conversation.item.done")


def sent(events: list[Any]) -> tuple[bytes, str]:
    """The answer's audio and transcript as the client received them."""
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    return audio, "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")


async def completed_then_cancelled(conn: Any) -> tuple[tuple[Any, bytes, str], tuple[Any, bytes, str]]:
    """The same answer twice, kept out of the conversation (both see the same input): completed,
    then cancelled at its first audio delta."""
    await conn.response.create(response={"conversation": "none"})
    events = await until(conn, "response.done")
    done = events[-1].response
    assert done.status == "completed", done
    await conn.response.create(response={"conversation": "none"})
    before = await until(conn, "response.output_audio.delta")
    await conn.response.cancel()
    after = await until(conn, "response.done")
    cut = after[-1].response
    assert cut.status == "cancelled" and cut.status_details.reason == "client_cancelled", cut
    return (done, *sent(events)), (cut, *sent(before + after))


def assert_agree_up_to_the_cut(
    completed: tuple[Any, bytes, str], cancelled: tuple[Any, bytes, str], *, same_answer: bool
) -> None:
    """Each counts the audio and text it sent by one rule. ``same_answer``: the thinker says the same
    again (the scene thinker; a sampling model need not), so the cut one is a prefix of the whole."""
    done, audio, transcript = completed
    cut, cut_audio, cut_text = cancelled
    assert cut_audio and cut_text  # cut mid-answer
    if same_answer:
        assert len(cut_audio) < len(audio) and transcript.startswith(cut_text)
    # one per-ms rate: each counts the audio it sent, one token per 50 ms (not 12.5 ms frames when cut)
    assert done.usage.output_token_details.audio_tokens == math.ceil(pcm_ms(audio) / SPOKEN_MS_PER_TOKEN)
    assert cut.usage.output_token_details.audio_tokens == math.ceil(pcm_ms(cut_audio) / SPOKEN_MS_PER_TOKEN)
    assert cut.usage.output_token_details.text_tokens == text_tokens(cut_text)
    assert cut.output[0].content[0].transcript == cut_text
    for kind in ("audio_tokens", "image_tokens"):
        assert getattr(cut.usage.input_token_details, kind) == getattr(done.usage.input_token_details, kind)
    for usage in (done.usage, cut.usage):
        assert usage.total_tokens == usage.input_tokens + usage.output_tokens


@pytest.fixture(scope="module")
def scene_base() -> Iterator[str]:
    with live_daphne(OMNIWEB_API_TOKENS=TOKEN) as url:
        yield url


@pytest.mark.timeout(300)
async def test_scene_answers_cut_and_whole_agree_up_to_the_cut(scene_base: str) -> None:
    instructions = "Answer briefly."
    said = [("user", "input_text", "Hello there, can you see me?"), ("assistant", "output_text", "Yes, I can.")]
    question = "Describe everything you can see in the picture."
    image = "data:image/jpeg;base64," + base64.b64encode(jpeg(photo("astronaut"))).decode()
    async with connected(scene_base) as conn:
        await configure(conn, output_modalities=["audio"], instructions=instructions)
        for role, kind, text in said:
            await add(conn, role, {"type": kind, "text": text})
        await add(conn, "user", {"type": "input_image", "image_url": image})
        await add(conn, "user", {"type": "input_text", "text": question})
        completed, cancelled = await completed_then_cancelled(conn)
    assert_agree_up_to_the_cut(completed, cancelled, same_answer=True)
    done, _, transcript = completed
    # the scene thinker has no tokenizer: the text by the rule, of everything it was given
    given_text = sum(text_tokens(t) for t in (instructions, question, *(text for _, _, text in said)))
    assert done.usage.input_token_details.text_tokens == given_text
    assert cancelled[0].usage.input_token_details == done.usage.input_token_details
    assert done.usage.input_token_details.image_tokens == image_tokens(512, 512)  # the astronaut, 512x512
    assert done.usage.input_token_details.audio_tokens == 0
    assert done.usage.output_token_details.text_tokens == text_tokens(transcript)


@pytest.fixture(scope="module")
def llm_base() -> Iterator[str]:
    with llm_daphne("embedded", OMNIWEB_API_TOKENS=TOKEN) as url:
        yield url


@pytest.mark.timeout(600)  # a server start with the model on a busy 2-core box, then the test
async def test_llm_answers_cut_and_whole_agree_up_to_the_cut(llm_base: str) -> None:
    """The model's own counts for the completed answer's text; the cut one's text by the rule (the
    model says its counts only at its end); the audio of both at one per-ms rate."""
    question = "Tell me a long story about a dragon who learns to bake bread."
    async with connected(llm_base) as conn:
        await configure(conn, output_modalities=["audio"], max_output_tokens=48)
        await add(conn, "user", {"type": "input_text", "text": question})
        completed, cancelled = await completed_then_cancelled(conn)
    assert_agree_up_to_the_cut(completed, cancelled, same_answer=False)
    done, cut = completed[0], cancelled[0]
    assert 0 < done.usage.output_token_details.text_tokens <= 48  # the model's own count, within its limit
    # the model's prompt (its default system message too) against the rule's count of what it was given
    assert done.usage.input_token_details.text_tokens > text_tokens(question)
    assert cut.usage.input_token_details.text_tokens == text_tokens(question)
