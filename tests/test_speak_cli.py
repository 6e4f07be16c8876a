"""``manage.py speak`` as a command-line tool: bad input refused in one line, files written fast.

Refusals happen before any connection, so most cases need no server; two run against a live daphne:
the batch priority the command asks for is accepted end to end, and ``--timestamps`` prints times on
the written file's timeline.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.servers import free_port, live_server

ROOT = Path(__file__).resolve().parent.parent
NOTHING_TO_SPEAK = "nothing to speak: the text has no words or numbers (only spaces, punctuation or symbols)"


def speak(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "speak", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no traceback
    return lines[0]


@pytest.mark.parametrize(
    "text", ["", "   \n\t ", "\U0001f600\U0001f389\u2764\ufe0f", "... !?! -- ;", "\u2014 \u2026 \u201c\u201d"]
)
def test_text_with_nothing_to_say_is_refused(tmp_path, text):
    out = tmp_path / "out.wav"
    # No server on this URL: the refusal must come before any connection.
    result = speak(text, "-o", str(out), "--url", f"ws://127.0.0.1:{free_port()}")
    assert one_line_error(result) == f"CommandError: {NOTHING_TO_SPEAK}"
    assert not out.exists()


def test_output_into_a_missing_folder_is_one_line(tmp_path):
    out = tmp_path / "no" / "such" / "folder" / "out.wav"
    result = speak("Hello there.", "-o", str(out), "--url", f"ws://127.0.0.1:{free_port()}")
    line = one_line_error(result)
    assert line == f"CommandError: cannot write {out}: the folder {out.parent} does not exist"


def test_unreachable_server_is_one_line(tmp_path):
    port = free_port()
    result = speak("Hello there.", "-o", str(tmp_path / "out.wav"), "--url", f"ws://127.0.0.1:{port}")
    assert one_line_error(result).startswith(f"CommandError: cannot reach ws://127.0.0.1:{port}:")


def test_writing_a_file_asks_for_batch_priority_unless_realtime():
    from speech.management.commands.speak import Command

    opts = {"voice": None, "seed": None, "speed": 1.0, "realtime": False, "split": "sentence"}
    assert Command._session_config(opts)["priority"] == "batch"
    assert "priority" not in Command._session_config({**opts, "realtime": True})


@pytest.fixture(scope="module")
def paced_server() -> Iterator[str]:
    """daphne with pacing on (as deployed); yields its base URL."""
    port = free_port()
    args = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "omniweb.asgi:application"]
    with live_server(args, port, OMNIWEB_ENGINE_MAX_AHEAD_SECONDS="1") as base:
        yield base


def test_speak_writes_a_file_at_batch_priority_on_a_paced_server(tmp_path, paced_server):
    """A paced server (as deployed) takes the command's batch priority and returns the whole file."""
    out = tmp_path / "two.wav"
    text = "The first sentence is here. And this is the second one, a little longer than the first."
    result = speak(text, "-o", str(out), "--url", paced_server.replace("http://", "ws://"))
    assert result.returncode == 0, result.stderr
    assert "sentence 1:" in result.stdout
    with wave.open(str(out)) as w:
        assert w.getframerate() == 24000 and w.getnframes() > 24000 * 3
    assert asyncio.run(first_reply(paced_server, {"priority": "urgent"}))["message"].startswith(
        "Invalid session config: priority"
    )


def printed_words(stdout: str) -> list[tuple[int, int, str]]:
    """The ``--timestamps`` lines: (start ms, end ms, word)."""
    words = [re.fullmatch(r"\s+(\d+) - +(\d+) ms  (.+)", line) for line in stdout.splitlines()]
    return [(int(m[1]), int(m[2]), m[3]) for m in words if m]


def test_timestamps_are_on_the_written_files_timeline(tmp_path, paced_server):
    """Sentence by sentence (the default split), the words are where they sound in the one file: the
    times the server gives for the same seeded audio spoken as one sentence (``--split none``)."""
    url = paced_server.replace("http://", "ws://")
    text = "The first sentence is here. And then a second one. A third ends it."
    runs = {}
    for split in ("sentence", "none"):
        out = tmp_path / f"{split}.wav"
        result = speak(text, "-o", str(out), "--url", url, "--timestamps", "--seed", "3", "--split", split)
        assert result.returncode == 0, result.stderr
        with wave.open(str(out)) as w:
            runs[split] = result.stdout, w.readframes(w.getnframes())
    (by_sentence, pcm), (as_one, whole_pcm) = runs["sentence"], runs["none"]
    assert "sentence 2:" in by_sentence and "sentence 1:" not in as_one
    assert pcm == whole_pcm  # the same audio either way
    words = printed_words(by_sentence)
    assert [w for _, _, w in words] == text.split()
    assert words == printed_words(as_one)
    assert words[-1][1] <= round(len(pcm) / 2 / 24000 * 1000)


async def first_reply(base: str, fields: dict[str, object]) -> dict[str, object]:
    """The server's answer to a session.config with ``fields`` (a refused config is fatal: an error)."""
    import websockets

    async with websockets.connect(base.replace("http://", "ws://") + "/v1/audio/speech/stream") as ws:
        await ws.send(json.dumps({"type": "session.config", **fields}))
        return json.loads(await asyncio.wait_for(ws.recv(), 10))
