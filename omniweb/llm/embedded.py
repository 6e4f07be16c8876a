"""A GGUF model run in this process by llama.cpp's server, embedded through the ``xllamacpp`` wheel.

``xllamacpp`` (MIT, one manylinux wheel, no Python dependencies) runs llama.cpp's server loop in
this process: continuous batching over ``parallel`` slots (concurrent answers decode in one batch),
prompt caching per slot (the fixed system prompt is not evaluated again), and JSON-Schema-constrained
output. ``handle_chat_completions`` takes OpenAI's chat request and calls back with OpenAI's chunks,
so this source and ``chat.HttpChat`` share everything above them. Each answer runs its blocking
call on a thread of its own; the callback returning True stops that sequence between two tokens.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .chat import ChatError, ChatStream, ChunkReader

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedConfig:
    model_path: str
    context: int = 4096  # tokens per slot
    parallel: int = 4  # slots: answers decoded together
    threads: int = 2


class EmbeddedChat:
    """One loaded model, shared by every answer of this process."""

    name = "embedded"

    def __init__(self, config: EmbeddedConfig) -> None:
        import xllamacpp  # deferred: only an engine process that runs the model loads llama.cpp

        path = Path(config.model_path)
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF model file at {config.model_path!r}")
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.n_parallel = max(1, config.parallel)
        params.n_ctx = max(512, config.context) * params.n_parallel  # the KV cache is shared by the slots
        params.cpuparams.n_threads = max(1, config.threads)
        params.cpuparams_batch.n_threads = max(1, config.threads)
        params.warmup = True
        params.verbosity = -1  # llama.cpp logs every slot's every request; failures reach us as errors
        self.config = config
        self.model = path.name
        self._server = xllamacpp.Server(params)
        self.context = max(512, config.context)
        self._active = 0
        self._lock = threading.Lock()

    @property
    def active(self) -> int:
        """Answers being generated now (for health and metrics)."""
        return self._active

    def open(self, body: dict[str, Any], reader: ChunkReader) -> ChatStream:
        stream = ChatStream(reader)
        request = {**body, "stream": True, "stream_options": {"include_usage": True}, "cache_prompt": True}
        threading.Thread(target=self._generate, args=(request, stream), name="llm-embedded", daemon=True).start()
        return stream

    def _generate(self, request: dict[str, Any], stream: ChatStream) -> None:
        with self._lock:
            self._active += 1
        try:
            result = self._server.handle_chat_completions(request, lambda chunk: not stream.feed(chunk))
            if isinstance(result, dict) and "error" in result:  # refused before generating
                logger.warning("embedded model refused the request: %s", str(result["error"])[:2000])
                stream.fail("The language model could not answer this request.")
            elif not stream.closed.is_set():
                stream.finish()
        except ChatError as exc:
            stream.fail(str(exc))
        except Exception:  # llama.cpp's errors arrive as RuntimeError or ValueError
            logger.exception("embedded model failed")
            stream.fail("The language model failed while answering.")
        finally:
            with self._lock:
                self._active -= 1
            stream.close()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """A whole (non-streamed) completion: the warm-up and benchmarks use it."""
        result = self._server.handle_chat_completions({**body, "stream": False})
        if not isinstance(result, dict) or "error" in result:
            raise ChatError("The language model could not answer this request.")
        return result
