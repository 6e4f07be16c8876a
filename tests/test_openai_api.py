"""The OpenAI-compatible HTTP APIs driven by the official ``openai`` SDK against a live daphne.

One server for the module, started the documented way (``daphne omniweb.asgi:application``) with
an API token, a small engine (2 active requests, no queue) so admission control can be provoked,
and small transcription limits. The models are the real ones: our own voice is transcribed back.
A second server (``tests/support/openai_fault_server.py``) wraps the engine client in a test double that
fails a request after its first audio, to see how a streamed body that cannot finish ends.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import re
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import av
import numpy as np
import openai
import pytest
from support.servers import daphne_args, free_port, live_daphne, live_server

TOKEN = "test-token-for-the-openai-api"
MAX_CHARS = 20_000
MAX_SECONDS = 30
MAX_BYTES = 2_000_000
FOX = "The quick brown fox jumps over the lazy dog."
LONG = " ".join(f"This is sentence number {i} of a long text." for i in range(300))  # ~13 000 characters

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    env = {
        "OMNIWEB_API_TOKENS": TOKEN,
        "OMNIWEB_ENGINE_MAX_ACTIVE": "2",
        "OMNIWEB_ENGINE_MAX_QUEUED": "0",
        "OMNIWEB_SPEECH_MAX_TEXT_CHARS": str(MAX_CHARS),
        "OMNIWEB_TRANSCRIBE_MAX_SECONDS": str(MAX_SECONDS),
        "OMNIWEB_TRANSCRIBE_MAX_BYTES": str(MAX_BYTES),
        # Loopback clients are not limited unless they send a forwarding header (see the limit test).
        "OMNIWEB_MAX_SESSIONS_PER_CLIENT": "1",
    }
    with live_daphne(**env) as url:
        yield url


@pytest.fixture
def client(base: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0, timeout=60) as c:
        yield c


def engine(base: str) -> dict:
    with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:
        return json.loads(resp.read())["engine"]


def wait_idle(base: str, seconds: float = 5.0) -> dict:
    deadline = time.monotonic() + seconds
    while (state := engine(base))["active"] or state["running_steps"]:
        assert time.monotonic() < deadline, f"engine still busy: {state}"
        time.sleep(0.02)
    return state


@pytest.fixture(autouse=True)
def engine_left_idle(base: str) -> Iterator[None]:
    """Every request, finished or abandoned, leaves the server's engine idle (replaces conftest's)."""
    yield
    wait_idle(base)


def speak(client: openai.OpenAI, text: str = FOX, **fields: object) -> tuple[bytes, dict[str, str]]:
    request = {"model": "tts-1", "voice": "alloy", "input": text, **fields}
    with client.audio.speech.with_streaming_response.create(**request) as response:
        return b"".join(response.iter_bytes()), dict(response.headers)


def decoded_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples / stream.rate


# -- speech ---------------------------------------------------------------------------------------
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


@pytest.mark.parametrize("fmt", sorted(CONTENT_TYPES))
def test_every_format_streams_and_decodes(client, fmt):
    data, headers = speak(client, FOX + " " + FOX, response_format=fmt)
    assert headers["content-type"].startswith(CONTENT_TYPES[fmt])
    assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    assert headers["x-omniweb-voice"] == "heart"  # alloy, mapped by the documented table
    pcm_seconds = len(speak(client, FOX + " " + FOX, response_format="pcm")[0]) / 2 / 24000
    seconds = pcm_seconds if fmt == "pcm" else decoded_seconds(data)
    assert 4.0 < seconds < 8.0
    assert abs(seconds - pcm_seconds) < 0.15  # the same speech in every container (codec padding aside)
    if fmt == "wav":
        assert data[:4] == b"RIFF" and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF  # open length


def test_default_format_is_mp3_and_voice_objects_and_local_voices_work(client):
    response = client.audio.speech.create(model="gpt-4o-mini-tts", voice={"id": "nova"}, input=FOX)
    assert response.response.headers["content-type"] == "audio/mpeg"
    assert decoded_seconds(response.content) > 1.0
    data, headers = speak(client, voice="heart", model="hibari-tts", response_format="wav", speed=2.0)
    assert headers["x-omniweb-voice"] == "heart"
    slow, _ = speak(client, voice="heart", response_format="wav", speed=1.0)
    assert len(data) < 0.7 * len(slow)  # speed is honoured while streaming


def test_agent_framework_defaults_speak_and_the_ignored_instructions_are_named(client):
    """openai-agents' voice pipeline: its TTS model name and the instructions it sends on every call."""
    response = client.audio.speech.with_raw_response.create(
        model="gpt-4o-mini-tts",
        voice="ash",
        input=FOX,
        instructions="You will receive partial sentences. Do not complete the sentence, just read out the text.",
        response_format="pcm",
    )
    assert response.headers["x-omniweb-ignored"] == "instructions"
    assert response.headers["x-omniweb-voice"] == "heart"
    assert len(response.content) / 2 / 24000 > 1.0
    _, headers = speak(client, model="gpt-4o-mini-tts-2025-03-20", response_format="pcm")  # a dated snapshot
    assert "x-omniweb-ignored" not in headers


def test_first_bytes_arrive_while_the_rest_is_still_being_synthesized(client, base):
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=LONG[:4000], response_format="mp3"
    ) as response:
        chunks = response.iter_bytes()
        first = next(chunks)
        busy_at_first_bytes = engine(base)["active"]
        rest = b"".join(chunks)
    assert first and busy_at_first_bytes == 1  # the engine was still at work when the body started
    assert decoded_seconds(first + rest) > 60


def test_a_client_that_disconnects_aborts_the_engine_work(base):
    conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=30)
    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": LONG, "response_format": "pcm"})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    conn.request("POST", "/v1/audio/speech", body=body, headers=headers)
    response = conn.getresponse()
    assert response.status == 200 and response.read(4800)
    assert engine(base)["active"] == 1
    conn.sock.shutdown(2)
    conn.close()
    wait_idle(base, seconds=2.0)  # aborted, not synthesized to the end (that takes far longer)


def sse_events(client: openai.OpenAI, **fields: object) -> list[dict]:
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="alloy", input=FOX + " " + FOX, stream_format="sse", **fields
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = b"".join(response.iter_bytes()).decode()
    events = [json.loads(line[len("data: ") :]) for line in text.split("\n\n") if line]
    assert all(re.fullmatch(r"data: \{.*\}", line) for line in text.split("\n\n") if line)
    return events


@pytest.mark.parametrize("fmt", ["pcm", "mp3"])
def test_sse_streams_base64_deltas_then_done_with_usage(client, fmt):
    events = sse_events(client, response_format=fmt)
    deltas, done = events[:-1], events[-1]
    assert len(deltas) > 2 and {e["type"] for e in deltas} == {"speech.audio.delta"}
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    seconds = len(audio) / 2 / 24000 if fmt == "pcm" else decoded_seconds(audio)
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_tokens"] == len(FOX + " " + FOX)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert abs(usage["output_tokens"] * 0.0125 - seconds) < 0.15


@pytest.mark.parametrize(
    ("fields", "exception", "param"),
    [
        ({"input": ""}, openai.BadRequestError, "input"),
        ({"input": "x" * (MAX_CHARS + 1)}, openai.BadRequestError, "input"),
        ({"voice": "nobody"}, openai.BadRequestError, "voice"),
        ({"model": "tts-9"}, openai.NotFoundError, "model"),
        ({"response_format": "ogg"}, openai.BadRequestError, "response_format"),
        ({"speed": 5.0}, openai.BadRequestError, "speed"),
        ({"speed": 0.1}, openai.BadRequestError, "speed"),
        ({"instructions": 5}, openai.BadRequestError, "instructions"),  # not a string
        ({"stream_format": "chunks"}, openai.BadRequestError, "stream_format"),
    ],
)
def test_bad_speech_requests_raise_the_sdks_exceptions(client, fields, exception, param):
    request = {"model": "tts-1", "voice": "alloy", "input": FOX, **fields}
    with pytest.raises(exception) as info:
        client.audio.speech.create(**request)
    error = info.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_malformed_json_and_wrong_content_type_raise_bad_request(client):
    for content, content_type in [(b'{"model": "tts-1", ', "application/json"), (b"model=tts-1", "text/plain")]:
        with pytest.raises(openai.BadRequestError) as info:
            client.post(
                "/audio/speech", content=content, cast_to=bytes, options={"headers": {"Content-Type": content_type}}
            )
        assert info.value.body["code"] in ("invalid_json", "unsupported_content_type")


def test_a_missing_or_wrong_token_raises_authentication_error(base):
    for key in ("wrong-token", ""):
        with openai.OpenAI(api_key=key or "unused", base_url=base + "/v1", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                bad.audio.speech.create(model="tts-1", voice="alloy", input=FOX)
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()


def test_capacity_refusal_is_a_503_with_a_retry_hint(client, base):
    readers = []  # held: a body iterator that is dropped closes its connection (and aborts the request)
    with contextlib.ExitStack() as stack:
        for _ in range(2):  # the engine's two active slots, no queue
            response = stack.enter_context(
                client.audio.speech.with_streaming_response.create(
                    model="tts-1", voice="alloy", input=LONG, response_format="pcm"
                )
            )
            readers.append(response.iter_bytes())
            next(readers[-1])
        assert engine(base)["active"] == 2
        with pytest.raises(openai.InternalServerError) as info:
            client.audio.speech.create(model="tts-1", voice="alloy", input=FOX)
        assert info.value.status_code == 503 and info.value.response.headers["retry-after"] == "1"
        assert info.value.body["code"] == "server_overloaded"
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert re.search(r'omniweb_errors_total\{kind="busy"\} [1-9]', metrics)


def test_streams_count_against_the_per_client_session_limit(base):
    # A forwarding header that daphne (no --proxy-headers here) does not apply: the client is then
    # keyed by its address, 127.0.0.1, and limited to OMNIWEB_MAX_SESSIONS_PER_CLIENT (1) streams.
    headers = {"X-Forwarded-For": "203.0.113.7"}
    with (
        openai.OpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0, default_headers=headers) as proxied,
        proxied.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=LONG, response_format="pcm"
        ) as held,
    ):
        reader = held.iter_bytes()
        next(reader)
        with pytest.raises(openai.RateLimitError) as info:
            proxied.audio.speech.create(model="tts-1", voice="alloy", input=FOX)
        assert info.value.body["code"] == "too_many_streams"
    # The slot is given back with the stream: the next one is served.
    with openai.OpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0, default_headers=headers) as proxied:
        wait_idle(base)
        assert decoded_seconds(proxied.audio.speech.create(model="tts-1", voice="alloy", input=FOX).content) > 1


# -- transcriptions -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fox_wav(base: str) -> bytes:
    with openai.OpenAI(api_key=TOKEN, base_url=base + "/v1", max_retries=0) as c:
        return c.audio.speech.create(model="tts-1", voice="alloy", input=FOX + " " + FOX, response_format="wav").content


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
def test_transcription_of_our_own_voice_returns_the_text(client, fmt):
    audio = speak(client, FOX, response_format=fmt)[0]
    result = client.audio.transcriptions.create(model="whisper-1", file=(f"fox.{fmt}", audio))
    assert words(result.text) == words(FOX)


@pytest.mark.parametrize("model", ["gpt-transcribe", "gpt-4o-mini-transcribe-2025-03-20"])
def test_transcription_answers_to_openais_current_names(client, fox_wav, model):
    """openai-agents' and pipecat's default STT model, and a dated snapshot."""
    assert words(client.audio.transcriptions.create(model=model, file=("fox.wav", fox_wav)).text) == words(FOX) * 2


def test_transcription_formats(client, fox_wav):
    upload = ("fox.wav", fox_wav)
    verbose = client.audio.transcriptions.create(
        model="whisper-1", file=upload, response_format="verbose_json", timestamp_granularities=["word", "segment"]
    )
    assert words(verbose.text) == words(FOX) * 2 and 4.0 < verbose.duration < 8.0
    assert verbose.segments and all(s.start < s.end <= verbose.duration + 0.5 for s in verbose.segments)
    assert [w.word.lower().strip(".,") for w in verbose.words] == words(FOX) * 2
    assert all(a.start <= b.start for a, b in zip(verbose.words, verbose.words[1:], strict=False))
    text = client.audio.transcriptions.create(model="whisper-1", file=upload, response_format="text")
    assert isinstance(text, str) and words(text) == words(FOX) * 2
    srt = client.audio.transcriptions.create(model="whisper-1", file=upload, response_format="srt")
    assert re.match(r"1\n00:00:\d\d,\d{3} --> 00:00:\d\d,\d{3}\n", srt)
    vtt = client.audio.transcriptions.create(model="whisper-1", file=upload, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n") and "-->" in vtt


def test_transcription_streams_text_deltas(client, fox_wav):
    stream = client.audio.transcriptions.create(model="gpt-4o-mini-transcribe", file=("fox.wav", fox_wav), stream=True)
    events = list(stream)
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1) and len(events) > 1
    assert events[-1].type == "transcript.text.done"
    assert words("".join(e.delta for e in events[:-1])) == words(events[-1].text) == words(FOX) * 2


def test_bad_transcription_requests_raise_the_sdks_exceptions(client, fox_wav):
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(model="whisper-1", file=("notes.txt", b"not audio at all " * 50))
    assert info.value.body["param"] == "file"
    with pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(model="whisper-7", file=("fox.wav", fox_wav))
    with pytest.raises(openai.BadRequestError):
        client.audio.transcriptions.create(model="whisper-1", file=("fox.wav", fox_wav), language="de")
    long_pcm = np.zeros(16000 * (MAX_SECONDS + 5), dtype="<i2").tobytes()  # over the duration limit
    flac = io.BytesIO()
    import soundfile

    soundfile.write(flac, np.frombuffer(long_pcm, "<i2"), 16000, format="FLAC")
    assert len(flac.getvalue()) < MAX_BYTES
    with pytest.raises(openai.BadRequestError, match="longer than"):
        client.audio.transcriptions.create(model="whisper-1", file=("long.flac", flac.getvalue()))
    with pytest.raises(openai.APIStatusError) as too_big:
        client.audio.transcriptions.create(model="whisper-1", file=("big.wav", b"\0" * (MAX_BYTES + 100_000)))
    assert too_big.value.status_code == 413 and too_big.value.body["param"] == "file"


# -- models ---------------------------------------------------------------------------------------
def test_models_lists_what_the_server_serves(client):
    ids = [m.id for m in client.models.list()]
    assert {"hibari-tts", "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "whisper-1", "whisper-tiny.en"} <= set(ids)
    assert {"gpt-transcribe", "gpt-4o-transcribe", "gpt-realtime", "gpt-realtime-mini"} <= set(ids)
    assert not [i for i in ids if re.search(r"-\d{4}-\d\d-\d\d$", i)]  # snapshots are not listed...
    assert any(i.startswith("omniweb-video-") for i in ids)
    assert client.models.retrieve("whisper-1").owned_by == "omniweb"
    assert client.models.retrieve("gpt-4o-mini-tts-2025-03-20").id == "gpt-4o-mini-tts-2025-03-20"  # ...but found
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-5")


# -- request ids ------------------------------------------------------------------------------------
REQUEST_ID = re.compile(r"req_[0-9a-f]{32}")


def test_every_response_carries_a_request_id_and_a_clients_own_is_echoed(client, base):
    listed = client.models.with_raw_response.list()
    assert REQUEST_ID.fullmatch(listed.request_id or "")
    again = client.models.with_raw_response.list()
    assert REQUEST_ID.fullmatch(again.request_id or "") and again.request_id != listed.request_id
    ours = client.models.with_raw_response.list(extra_headers={"X-Request-Id": "trace-42/a:b"})
    assert ours.request_id == "trace-42/a:b"
    for insane in ("x" * 129, "two words"):  # too long, or not visible ASCII only: replaced
        replaced = client.models.with_raw_response.list(extra_headers={"X-Request-Id": insane})
        assert REQUEST_ID.fullmatch(replaced.request_id or "")
    speech = client.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input=FOX)
    assert REQUEST_ID.fullmatch(speech.request_id or "")  # a streamed body too
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-5")
    assert REQUEST_ID.fullmatch(missing.value.request_id or "")
    with (
        openai.OpenAI(api_key="wrong-token", base_url=base + "/v1", max_retries=0) as bad,
        pytest.raises(openai.AuthenticationError) as refused,
    ):
        bad.models.list()
    assert REQUEST_ID.fullmatch(refused.value.request_id or "")
    # Not only the API: health, pages, static files, unknown paths.
    for path in ("/healthz", "/", "/speech/", "/static/css/omniweb.css", "/no-such-page"):
        try:
            with urllib.request.urlopen(base + path, timeout=10) as resp:
                headers = resp.headers
        except urllib.error.HTTPError as exc:
            assert exc.code == 404, path
            headers = exc.headers
        assert REQUEST_ID.fullmatch(headers["X-Request-Id"] or ""), path


# -- a synthesis that fails after its first audio ---------------------------------------------------
def test_a_stream_that_fails_midway_is_broken_off_not_ended(tmp_path):
    port = free_port()
    args = ["tests/support/openai_fault_server.py", *daphne_args(port)[2:]]
    with live_server(args, port) as url, openai.OpenAI(api_key="unused", base_url=url + "/v1", max_retries=0) as c:
        with pytest.raises(openai.APIConnectionError):  # the body was broken off, not ended as if whole
            speak(c, LONG[:2000], response_format="pcm")
        events = sse_events(c, response_format="pcm")
        assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "generation_failed"
        wait_idle(url)
