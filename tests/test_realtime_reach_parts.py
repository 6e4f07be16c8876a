"""The parts behind ``tests/test_realtime_reach.py``, without a socket: the G.711 formats of a session
and their conversion at the edge, ``idle_timeout_ms`` (its clock and the response it makes), the
whole conversation in a response's turn, and client secrets (made, opened, refused).

G.711 test audio is made by FFmpeg's encoder through PyAV's raw muxer, never by a table of ours."""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import AsyncIterator
from typing import Any

import av
import numpy as np
import pytest
from support.realtime_parts import VOICES, ScriptedResponses, session

from omniweb.conversation import TextDelta, TurnEnd
from omniweb.engine.messages import Status
from omniweb.openai_api.protocol import APIError
from omniweb.openai_api.realtime import client_secrets
from omniweb.openai_api.realtime.audio import InputDecoder, OutputEncoder, decode_clip, encode_clip
from omniweb.openai_api.realtime.errors import RealtimeError
from omniweb.openai_api.realtime.events import ResponseParams
from omniweb.openai_api.realtime.input_audio import IdleTimedOut, IdleTimer
from omniweb.openai_api.realtime.items import Conversation, Item
from omniweb.openai_api.realtime.opening import session_from_config
from omniweb.openai_api.realtime.responses import ResponseStream
from omniweb.openai_api.realtime.session import new_session, update_session
from omniweb.web import auth

RATE = 24000
NOISE = base64.b64encode(np.random.default_rng(1).bytes(9000)).decode()  # instructions that do not compress


def tone(ms: int, hz: float = 440.0) -> bytes:
    t = np.arange(RATE * ms // 1000) / RATE
    return (np.sin(2 * np.pi * hz * t) * 8000).astype("<i2").tobytes()


def ffmpeg_g711(pcm24: bytes, muxer: str) -> bytes:
    """PCM16 24 kHz → G.711 8 kHz by FFmpeg (resampler, encoder, raw ``mulaw``/``alaw`` muxer)."""
    out = io.BytesIO()
    with av.open(out, "w", format=muxer) as container:
        stream = container.add_stream("pcm_mulaw" if muxer == "mulaw" else "pcm_alaw", rate=8000, layout="mono")
        resampler = av.AudioResampler(format="s16", layout="mono", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm24, "<i2").reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        for resampled in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(resampled):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


# -- formats -------------------------------------------------------------------------------------------
def test_g711_formats_are_shown_without_a_rate_and_pcm_keeps_its_own() -> None:
    phone = session(audio={"input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcma"}}})
    wire = phone.wire()["audio"]
    assert (wire["input"]["format"], wire["output"]["format"]) == ({"type": "audio/pcmu"}, {"type": "audio/pcma"})
    back = update_session(phone, {"audio": {"input": {"format": {"type": "audio/pcm"}}}}, VOICES)
    assert back.wire()["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert new_session(VOICES).wire()["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session(audio={"input": {"format": {"type": "audio/pcmu", "rate": 8000}}}).audio.input.format.rate is None
    with pytest.raises(RealtimeError) as refused:
        session(audio={"input": {"format": {"type": "audio/pcmu", "rate": 16000}}})
    assert refused.value.param == "session.audio.input.format.rate"
    transcription = session(intent="transcription", audio={"input": {"format": {"type": "audio/pcma"}}})
    assert transcription.wire()["audio"]["input"]["format"] == {"type": "audio/pcma"}


@pytest.mark.parametrize(("fmt", "muxer"), [("audio/pcmu", "mulaw"), ("audio/pcma", "alaw")])
def test_g711_is_decoded_at_the_edge_without_a_seam_at_each_append(fmt: str, muxer: str) -> None:
    pcm = tone(1000)
    call = ffmpeg_g711(pcm, muxer)
    assert len(call) == 8000
    decoder = InputDecoder(fmt)
    pieces = [decoder.decode(base64.b64encode(call[i : i + 160]).decode()) for i in range(0, len(call), 160)]
    heard = np.frombuffer(b"".join(pieces), "<i2").astype(float)
    whole = np.frombuffer(decode_clip(fmt, base64.b64encode(call).decode(), max_bytes=10**6, param="a"), "<i2")
    sent = np.frombuffer(pcm, "<i2").astype(float)
    n = min(len(heard), len(sent)) - 100
    assert len(heard) >= len(sent) - 100  # at most a few samples wait in the resampler
    assert np.corrcoef(heard[100:n], sent[100:n])[0, 1] > 0.99  # 20 ms appends join as one stream
    assert np.allclose(heard[: len(whole) - 100], whole[: len(heard)][: len(whole) - 100].astype(float), atol=2)
    with pytest.raises(RealtimeError) as too_big:  # the limit is on the PCM it becomes: 6 times the G.711
        decoder.decode(base64.b64encode(bytes(2000)).decode(), max_bytes=6000)
    assert too_big.value.code == "audio_too_large"


@pytest.mark.parametrize(("fmt", "muxer"), [("audio/pcmu", "mulaw"), ("audio/pcma", "alaw")])
def test_the_answer_is_encoded_as_ffmpeg_encodes_g711(fmt: str, muxer: str) -> None:
    pcm = tone(1000, 300.0)
    encoder = OutputEncoder(fmt)
    streamed = b"".join(encoder.encode(pcm[i : i + 4800]) for i in range(0, len(pcm), 4800)) + encoder.flush()
    assert len(streamed) == 8000 == len(encode_clip(fmt, pcm))
    reference = ffmpeg_g711(pcm, muxer)
    assert np.mean(np.frombuffer(streamed, np.uint8) == np.frombuffer(reference, np.uint8)) > 0.95
    assert OutputEncoder().encode(pcm) == pcm  # audio/pcm goes as it is


def test_a_response_writes_its_audio_in_the_output_format() -> None:
    phone = session(audio={"output": {"format": {"type": "audio/pcmu"}}})
    stream = ResponseStream.create(ResponseParams(), phone, Conversation())
    assert stream.encoder.format == "audio/pcmu"
    loud = ResponseStream.create(
        ResponseParams.model_validate({"audio": {"output": {"format": {"type": "audio/pcma"}}}}), phone, Conversation()
    )
    assert loud.encoder.format == "audio/pcma"  # response.create's own format, for that response


# -- idle timeout --------------------------------------------------------------------------------------
def test_idle_timeout_ms_is_taken_in_server_vad_only_within_bounds() -> None:
    vad = {"type": "server_vad", "idle_timeout_ms": 5000}
    assert session(audio={"input": {"turn_detection": vad}}).turn_detection.idle_timeout_ms == 5000  # type: ignore[union-attr]
    transcription = session(intent="transcription", audio={"input": {"turn_detection": vad}})
    assert transcription.turn_detection.idle_timeout_ms == 5000  # type: ignore[union-attr]
    for bad, param in (
        ({**vad, "idle_timeout_ms": 10}, "idle_timeout_ms"),
        ({"type": "semantic_vad", "idle_timeout_ms": 5000}, "idle_timeout_ms"),
    ):
        with pytest.raises(RealtimeError) as refused:
            session(audio={"input": {"turn_detection": bad}})
        assert refused.value.param == f"session.audio.input.turn_detection.{param}"


async def test_the_idle_clock_reports_once_and_a_restart_makes_the_old_report_stale() -> None:
    reports: asyncio.Queue[IdleTimedOut] = asyncio.Queue()
    written = [0]
    timer = IdleTimer(reports.put_nowait, lambda: written[0])
    timer.start(playback_ms=0, timeout_ms=10)
    first = await asyncio.wait_for(reports.get(), 30)
    assert timer.take(first) and not timer.take(first)  # handled once
    written[0] = 480
    timer.start(playback_ms=0, timeout_ms=10)
    stale = await asyncio.wait_for(reports.get(), 30)
    timer.start(playback_ms=0, timeout_ms=10_000)  # speech, then a new silence: the report is stale
    assert not timer.take(stale)
    timer.stop()
    assert (stale.audio_start_ms, stale.audio_end_ms) == (480, 480)


@pytest.fixture
async def scripted(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[ScriptedResponses]]:
    made: list[ScriptedResponses] = []
    yield made
    for parts in made:
        await parts.core.close()
        parts.items.close()


@pytest.mark.parametrize("audio", [bytes(4800), b""], ids=["silence", "nothing"])
async def test_an_idle_response_without_words_continues_the_conversation_and_completes(
    scripted: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch, audio: bytes
) -> None:
    parts = ScriptedResponses(session(output_modalities=["text"]), monkeypatch)
    scripted.append(parts)
    parts.say("user", "Hello")
    parts.say("assistant", "Hi! What can I look at?")
    silence = Item(id="item_silence", role="user", content=[{"type": "input_audio", "transcript": ""}], audio=audio)
    parts.items.add(silence, None, None)
    parts.script = [TextDelta("Still there?"), TurnEnd(Status.OK, text="Still there?")]
    finished: list[ResponseStream] = []
    parts.responses.on_finished = finished.append
    await parts.responses.respond(ResponseParams(), event_id=None, idle=silence)
    sent = await parts.answered()
    assert sent[-1]["response"]["status"] == "completed" and len(finished) == 1
    [spec] = parts.specs
    assert (spec.question.text, spec.question.audio) == ("", b"")  # nothing heard: no question, and not "Hello" again
    assert spec.history == [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! What can I look at?"},
    ]


async def test_the_whole_conversation_reaches_the_thinker(
    scripted: list[ScriptedResponses], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = ScriptedResponses(session(output_modalities=["text"]), monkeypatch)
    scripted.append(parts)
    for i in range(40):
        parts.say("user" if i % 2 else "assistant", f"Remark {i}.")
    parts.script = [TurnEnd(Status.OK, text="Yes.")]
    await parts.create()
    await parts.answered()
    [spec] = parts.specs
    assert spec.question.text == "Remark 39." and len(spec.history) == 39  # not the video endpoint's few turns


# -- client secrets ------------------------------------------------------------------------------------
def test_a_client_secret_carries_its_session_until_it_expires(settings: Any) -> None:
    settings.API_TOKENS = ["token-a"]
    made = client_secrets.create(
        {"session": {"type": "transcription"}, "expires_after": {"anchor": "created_at", "seconds": 10}},
        api_token="token-a",
        voices=VOICES,
        now=1000.0,
    )
    assert made["expires_at"] == 1010 and made["session"]["type"] == "transcription"
    assert client_secrets.verify_client_secret(made["value"]) is None  # 1010 is long past
    fresh = client_secrets.create(
        {"session": {"type": "realtime", "model": "gpt-realtime-mini"}}, api_token="token-a", voices=VOICES
    )
    assert fresh["expires_at"] >= int(time.time()) + client_secrets.DEFAULT_SECONDS - 1
    config = client_secrets.verify_client_secret(fresh["value"])
    assert config == {"type": "realtime", "model": "gpt-realtime-mini"}
    assert session_from_config(config, VOICES, language_model=False).model == "gpt-realtime-mini"
    settings.API_TOKENS = ["token-b"]  # the token that made it is gone: so is the secret
    assert client_secrets.verify_client_secret(fresh["value"]) is None
    settings.API_TOKENS = []  # tokens off: keyed by SECRET_KEY
    own = client_secrets.create({"session": {"type": "realtime"}}, api_token=None, voices=VOICES)
    assert client_secrets.verify_client_secret(own["value"]) == {"type": "realtime"}
    assert "." in own["value"] and ":" not in own["value"] and "," not in own["value"]  # a subprotocol token


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"session": {"type": "realtime"}, "colour": 1}, "colour"),
        ({"session": {"instructions": "no type"}}, "session.type"),
        ({"session": {"type": "realtime", "audio": {"output": {"voice": "nobody"}}}}, "session.audio.output.voice"),
        ({"session": {"type": "realtime", "tools": [{"type": "function", "name": "f"}]}}, "session.tools"),
        ({"expires_after": {"anchor": "created_at", "seconds": 7201}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "now", "seconds": 60}}, "expires_after.anchor"),
        ({"session": {"type": "realtime", "instructions": NOISE}}, "session"),  # over a header's room
    ],
)
def test_a_client_secret_request_that_cannot_be_served_names_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as refused:
        client_secrets.create(body, api_token=None, voices=VOICES)
    assert (refused.value.status, refused.value.param) == (400, param)


def test_anything_but_a_good_client_secret_opens_nothing(settings: Any) -> None:
    settings.API_TOKENS = ["token-a"]
    good = auth.sign_client_secret({"type": "realtime"}, int(time.time()) + 60, "token-a")
    assert client_secrets.verify_client_secret(good) == {"type": "realtime"}
    for bad in (
        good[:-1] + ("A" if good[-1] != "A" else "B"),
        good.removeprefix("ek_"),
        "ek_",
        "token-a",
        "ek_" + "x" * 9000,
    ):
        assert client_secrets.verify_client_secret(bad) is None
