"""What the language model is given: OpenAI chat messages and the request around them.

Order matters for speed: the fixed part (the system message, then the conversation so far) comes
first and the part that changes every turn (what the camera shows now, the question) last, so a
server's prompt cache (llama.cpp's per slot, vLLM's prefix cache) serves every turn after the first
from the same prefix. Past the model's context the oldest turns go, never the system message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omniweb.engine.requests import FunctionTool, HistoryEntry, ToolChoice

from .chat import Forced

# Nothing about a camera here: a turn without frames would make a model invent one. The facts, when
# there are any, come with the question and say themselves what they are (``FACTS_LEAD``).
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful voice assistant. Your answers are read aloud: answer briefly, in plain "
    "sentences, with no markdown, lists or emoji."
)
DEFAULT_QUESTION = "What do you see?"
FACTS_LEAD = (
    "What the camera shows now, as on-device vision models measured it (they can be wrong; use it "
    "for questions about what is in front of the camera): "
)
CHARS_PER_TOKEN = 3  # a cautious estimate of English text, to keep a prompt inside the context


@dataclass(frozen=True)
class Prompt:
    """One answer's request: the chat body, the tools' schemas by name and the call to force."""

    body: dict[str, Any]
    schemas: dict[str, dict[str, Any]]
    forced: Forced | None


def schema_of(tool: FunctionTool) -> dict[str, Any]:
    try:
        schema = json.loads(tool.parameters or "{}")
    except ValueError:
        schema = {}
    return schema if isinstance(schema, dict) and schema else {"type": "object", "properties": {}}


NO_OUTPUT = "No output was given for this call."


def history_messages(history: Sequence[HistoryEntry], native_tools: bool = True) -> list[dict[str, Any]]:
    """The conversation so far as chat messages: an assistant's calls as ``tool_calls``, each
    followed at once by its output (chat APIs refuse a call without a reply, so a call still
    waiting for one gets ``NO_OUTPUT``; an output whose call is gone is left out), or, for a chat
    template that drops tool messages (``native_tools`` False), as sentences in the assistant's and
    the user's turns, so the model still reads them."""
    outputs = {e.call_id: e.content for e in history if e.role == "tool" and e.call_id}
    out: list[dict[str, Any]] = []
    for entry in history:
        if entry.calls:
            out.extend(_call_messages(entry, outputs, native_tools))
        elif entry.role in ("user", "assistant") and entry.content:
            out.append({"role": entry.role, "content": entry.content})
    return out


def _call_messages(entry: HistoryEntry, outputs: dict[str, str], native_tools: bool) -> list[dict[str, Any]]:
    results = [(c, outputs.get(c.call_id, NO_OUTPUT)) for c in entry.calls]
    if not native_tools:
        calls = "; ".join(f"{c.name} with the arguments {c.arguments}" for c in entry.calls)
        said = {"role": "assistant", "content": f"{entry.content} I called {calls}.".strip()}
        returned = " ".join(f"The function {c.name} returned: {output}" for c, output in results)
        return [said, {"role": "user", "content": returned}]
    calls_message = {
        "role": "assistant",
        "content": entry.content or None,
        "tool_calls": [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in entry.calls
        ],
    }
    return [calls_message, *({"role": "tool", "tool_call_id": c.call_id, "content": o} for c, o in results)]


def _tokens(message: dict[str, Any]) -> int:
    return len(json.dumps(message, ensure_ascii=False)) // CHARS_PER_TOKEN + 4


def fit(
    system: dict[str, Any], past: list[dict[str, Any]], now: list[dict[str, Any]], budget: int
) -> list[dict[str, Any]]:
    """The messages within ``budget`` tokens: the oldest of ``past`` go first (a tool output whose
    call went goes with it); the system message and ``now`` always stay."""
    kept = list(past)
    total = _tokens(system) + sum(_tokens(m) for m in kept) + sum(_tokens(m) for m in now)
    while kept and total > budget:
        total -= _tokens(kept.pop(0))
        while kept and kept[0]["role"] == "tool":
            total -= _tokens(kept.pop(0))
    return [system, *kept, *now]


def build(
    *,
    model: str,
    system_prompt: str | None,
    history: Sequence[HistoryEntry],
    question: str,
    facts: str | None = None,
    images: Sequence[str] = (),
    tools: Sequence[FunctionTool] = (),
    tool_choice: ToolChoice = ToolChoice.AUTO,
    tool_name: str | None = None,
    parallel: bool = True,
    max_tokens: int = 512,
    context: int = 8192,
    native_tools: bool = True,
) -> Prompt:
    """The chat request for one answer (``images``: data URLs, sent only to a vision model)."""
    system = {"role": "system", "content": system_prompt or DEFAULT_SYSTEM_PROMPT}
    past = history_messages(history, native_tools)
    offered = list(tools) if tool_choice is not ToolChoice.NONE else []
    forced = _forced(offered, tool_choice, tool_name)
    ask = question.strip()
    if not ask and not (history and (history[-1].role == "tool" or history[-1].calls)):
        ask = DEFAULT_QUESTION  # nothing asked (a hands-free turn): say what is seen
    if forced is not None:
        ask = f"{ask}\n\n{_force_note(offered, forced)}".strip()
    now: list[dict[str, Any]] = []
    if ask or images:
        content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in images]
        if facts:
            content.append({"type": "text", "text": FACTS_LEAD + facts})
        content.append({"type": "text", "text": ask or DEFAULT_QUESTION})
        now.append({"role": "user", "content": content if images else "\n\n".join(p["text"] for p in content)})
    body: dict[str, Any] = {
        "model": model,
        "messages": fit(system, past, now, max(256, context - max_tokens)),
        "max_tokens": max_tokens,
    }
    schemas = {t.name: schema_of(t) for t in offered}
    if forced is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": forced.name or "function_call",
                "schema": _forced_schema(offered, forced),
                "strict": True,
            },
        }
    elif offered:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": schemas[t.name]},
            }
            for t in offered
        ]
        body["tool_choice"] = "auto"
        body["parallel_tool_calls"] = parallel
    return Prompt(body=body, schemas=schemas, forced=forced)


def probe_bodies(model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two one-token requests that differ only by a function call and its output: a chat template
    that renders tool messages makes the second prompt longer (``renders_tools``)."""
    user = {"role": "user", "content": "Hello."}
    call = {"id": "call_probe", "type": "function", "function": {"name": "probe", "arguments": "{}"}}
    output = "The probe found these words: " + " ".join(["omniweb"] * 24)
    exchange = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_probe", "content": output},
    ]
    base = {"model": model, "max_tokens": 1, "temperature": 0}
    return {**base, "messages": [user]}, {**base, "messages": [user, *exchange]}


def renders_tools(plain: dict[str, Any], with_tools: dict[str, Any]) -> bool:
    """From the probe's two replies: whether the function call's output reached the prompt."""
    tokens: list[int] = [r.get("usage", {}).get("prompt_tokens", 0) for r in (plain, with_tools)]  # usage counts
    return tokens[1] - tokens[0] >= 20


def _forced(tools: list[FunctionTool], choice: ToolChoice, name: str | None) -> Forced | None:
    if not tools:
        return None
    if choice is ToolChoice.FUNCTION and name is not None:
        return Forced(name)
    if choice is ToolChoice.REQUIRED:
        return Forced(tools[0].name if len(tools) == 1 else None)
    return None


def _forced_schema(tools: list[FunctionTool], forced: Forced) -> dict[str, Any]:
    """The JSON the model must write: the named function's arguments, or a choice among them."""
    by_name = {t.name: schema_of(t) for t in tools}
    if forced.name is not None:
        return by_name[forced.name]
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": schema},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for name, schema in by_name.items()
        ]
    }


def _force_note(tools: list[FunctionTool], forced: Forced) -> str:
    """Tells the model which call it is writing: a model whose chat template has no tools sees
    the functions only here."""
    chosen = [t for t in tools if forced.name in (None, t.name)]
    described = "; ".join(f"{t.name}: {t.description}" if t.description else t.name for t in chosen)
    if forced.name is not None:
        return f"Call the function {described}. Reply with its arguments as a JSON object."
    return f"Call one of these functions ({described}). Reply with a JSON object with its name and arguments."
