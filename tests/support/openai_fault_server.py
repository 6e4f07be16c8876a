"""daphne with a test double around the engine client: every speech request fails after its first
audio chunk (the real request is aborted, then a failed ``End`` is delivered).

Run as ``python tests/support/openai_fault_server.py <daphne arguments>`` (tests/test_openai_api.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")

import django

django.setup()

from omniweb.base.errors import ErrorKind  # noqa: E402
from omniweb.engine.messages import Chunk, End, PcmAudio  # noqa: E402
from omniweb.engine.requests import EngineRequest  # noqa: E402
from omniweb.openai_api import views  # noqa: E402

real_client = views.get_engine_client


class FailingAfterFirstAudio:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def stream(self, request: EngineRequest, request_id: str | None = None) -> AsyncIterator[Chunk]:
        stream = self._inner.stream(request, request_id)
        try:
            async for chunk in stream:
                yield chunk
                if isinstance(chunk, PcmAudio):
                    break
        finally:
            await stream.aclose()  # aborts the real request
        yield End.failed(ErrorKind.ENGINE, "injected fault")

    async def abort(self, request_id: str) -> None:
        await self._inner.abort(request_id)


views.get_engine_client = lambda: FailingAfterFirstAudio(real_client())
views.loaded_engine_client = lambda: None  # every request through the double above

from daphne.cli import CommandLineInterface  # noqa: E402

CommandLineInterface().run(sys.argv[1:])
