"""Request bodies sent chunked (``Transfer-Encoding: chunked``, no ``Content-Length``) against a live
daphne: the openai npm SDK uploads a file from ``fs.createReadStream`` that way, and programs that
stream what they upload do too. Each upload path answers a chunked body as it answers the same body
sent with its length: the same transcript, the same refusal naming the missing field, the same size
limit.

The bodies go over a real socket (``http.client`` with an iterable body, or the npm SDK under node);
the npm SDK comes from ``tests/js`` (``npm ci --prefix tests/js``, run by ``.ci/run``, never here).
"""

from __future__ import annotations

import http.client
import io
import json
import re
import shutil
import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from support.servers import live_daphne
from support.voice import spoken
from urllib3 import encode_multipart_formdata

TOKEN = "test-token-for-chunked-uploads"
SENTENCE = "The quick brown fox jumps over the lazy dog."
MAX_BYTES = 400_000  # the server's transcription upload limit here (a small one, to cross cheaply)
JS = Path(__file__).resolve().parent / "js"
NODE_SDK = JS / "node_modules" / "openai"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with live_daphne(OMNIWEB_API_TOKENS=TOKEN, OMNIWEB_TRANSCRIBE_MAX_BYTES=str(MAX_BYTES)) as url:
        yield url


@pytest.fixture(scope="module")
def recording() -> bytes:
    """The sentence said by our voice, as a WAV file (16 kHz)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(spoken(SENTENCE))
    return out.getvalue()


def post(base: str, path: str, body: bytes, content_type: str, *, chunked: bool) -> tuple[int, dict[str, str], bytes]:
    """POST ``body`` over a socket of its own: in 16 KiB chunks without a length, or sized."""
    url = urlparse(base)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=120)
    headers = {"Content-Type": content_type, "Authorization": f"Bearer {TOKEN}"}
    try:
        if chunked:  # an iterable body and no length: http.client sends it chunked
            conn.request("POST", path, body=(body[i : i + 16384] for i in range(0, len(body), 16384)), headers=headers)
        else:
            conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def form(**fields: str | tuple[str, bytes, str]) -> tuple[bytes, str]:
    return encode_multipart_formdata(fields)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def test_a_chunked_transcription_upload_is_answered_as_a_sized_one(base: str, recording: bytes) -> None:
    body, content_type = form(model="whisper-1", response_format="json", file=("fox.wav", recording, "audio/wav"))
    answers = [post(base, "/v1/audio/transcriptions", body, content_type, chunked=c) for c in (True, False)]
    (chunked_status, _, chunked), (sized_status, _, sized) = answers
    assert chunked_status == sized_status == 200, answers
    assert json.loads(chunked) == json.loads(sized)
    assert words(json.loads(chunked)["text"]) == words(SENTENCE)


@pytest.mark.parametrize("missing", ["model", "file"])
def test_a_chunked_upload_without_a_field_names_that_field(base: str, recording: bytes, missing: str) -> None:
    fields: dict[str, str | tuple[str, bytes, str]] = {
        "model": "whisper-1",
        "file": ("fox.wav", recording, "audio/wav"),
    }
    del fields[missing]
    body, content_type = form(**fields)
    for chunked in (True, False):
        status, _, answer = post(base, "/v1/audio/transcriptions", body, content_type, chunked=chunked)
        error = json.loads(answer)["error"]
        assert (status, error["param"], error["code"]) == (400, missing, "missing_required_parameter"), error
        assert f"'{missing}' is required" in error["message"]


def test_a_chunked_upload_over_the_limit_is_refused_as_a_sized_one(base: str) -> None:
    body, content_type = form(model="whisper-1", file=("big.wav", bytes(MAX_BYTES + 100_000), "audio/wav"))
    answers = [post(base, "/v1/audio/transcriptions", body, content_type, chunked=c) for c in (True, False)]
    for status, _, answer in answers:
        error = json.loads(answer)["error"]
        assert (status, error["code"], error["param"]) == (413, "file_too_large", "file"), error
    assert answers[0][2] == answers[1][2]


def test_the_other_upload_paths_take_a_chunked_body(base: str) -> None:
    speech = json.dumps({"model": "tts-1", "voice": "alloy", "input": "Hello there.", "response_format": "wav"})
    status, headers, audio = post(base, "/v1/audio/speech", speech.encode(), "application/json", chunked=True)
    assert status == 200 and headers["content-type"] == "audio/wav" and audio[:4] == b"RIFF" and len(audio) > 24000
    secret = json.dumps({"session": {"type": "realtime", "instructions": "Be brief."}})
    status, _, answer = post(base, "/v1/realtime/client_secrets", secret.encode(), "application/json", chunked=True)
    made = json.loads(answer)
    assert status == 200 and made["value"].startswith("ek_") and made["session"]["instructions"] == "Be brief."
    # Django's own body limit (DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB) holds for a chunked body too.
    huge = json.dumps({"model": "tts-1", "voice": "alloy", "input": "x" * 3_000_000}).encode()
    for chunked in (True, False):
        status, _, answer = post(base, "/v1/audio/speech", huge, "application/json", chunked=chunked)
        assert status == 413 and json.loads(answer)["error"]["code"] == "request_too_large"


def test_the_npm_sdk_uploads_from_a_read_stream(base: str, recording: bytes, tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (.ci/run installs Debian's nodejs)")
    if not NODE_SDK.is_dir():
        pytest.skip("the openai npm SDK is not installed: npm ci --prefix tests/js (.ci/run does)")
    major = int(
        subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout[1:].split(".")[0]
    )
    if major < 20:
        pytest.skip(f"openai 6.x for node needs Node.js 20 or later; this is {major}")
    (tmp_path / "fox.wav").write_bytes(recording)
    script = JS / "upload_transcription.mjs"  # beside node_modules: "openai" resolves there
    run = subprocess.run(
        [node, str(script), base, TOKEN, str(tmp_path / "fox.wav")], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert "text" in answer, answer  # before the fix: {"status": 400, ... "'model' is required"}
    assert words(answer["text"]) == words(SENTENCE)
