"""What a page's WebSockets carried, read in the browser tests (tests/test_browser_pages.py,
tests/test_video_handsfree.py)."""

from __future__ import annotations

import json
from typing import Any


class Frames:
    """The JSON messages the page's WebSockets received (and sent), in order."""

    def __init__(self, pg: Any) -> None:
        self.messages: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []
        pg.on("websocket", self._on_socket)

    def _on_socket(self, ws: Any) -> None:
        ws.on("framereceived", lambda payload: self._keep(self.messages, payload))
        ws.on("framesent", lambda payload: self._keep(self.sent, payload))

    @staticmethod
    def _keep(into: list[dict[str, Any]], payload: str | bytes) -> None:
        if isinstance(payload, str):
            into.append(json.loads(payload))

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") == kind]

    def sent_of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m.get("type") == kind]
