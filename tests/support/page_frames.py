"""The browser tests' shared pieces (tests/test_browser_pages.py, tests/test_video_handsfree.py):
Debian's Chromium with fake camera and microphone, screenshots, and what a page's WebSockets carried."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--disable-background-networking",
    "--disable-component-update",
]


def launch(playwright: Any, *extra: str) -> Any:
    """Headless Chromium with fake media devices (``extra``: e.g. the files they play)."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[*CHROMIUM_ARGS, *extra])


def shot(pg: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


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
