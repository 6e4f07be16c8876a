"""The video protocol's pure layer (video/protocol.py): config fields, bounds and legacy aliases,
message parsing, strict audio, and the server messages. No engine, no sockets."""

from __future__ import annotations

import base64
import io
import json
import wave

import pytest

from omniweb.engine.voice import Capabilities
from omniweb.media import frames
from video import protocol
from video.protocol import ProtocolError

CAPS = Capabilities(
    model_names=("hibari-tts",),
    voices=("heart",),
    default_voice="heart",
    languages=("en",),
    response_formats=("wav",),
)


def config(**fields: object) -> protocol.VideoSessionConfig:
    return protocol.parse_config(json.dumps({"type": "session.config", **fields}), CAPS)


def refused(raw: str) -> str:
    with pytest.raises(ProtocolError) as info:
        protocol.parse_config(raw, CAPS)
    return info.value.message


# -- session.config -------------------------------------------------------------------------------
def test_config_defaults_follow_the_seed_except_the_filter_threshold() -> None:
    c = config()
    assert c.model is None
    assert c.modalities == ["text", "audio"]
    assert (c.num_frames, c.max_frames) == (4, 50)
    assert c.system_prompt is None
    assert c.use_audio_in_video is True
    assert c.sampling_params_list is None
    assert c.enable_frame_filter is True
    assert c.frame_filter_threshold == frames.DEFAULT_FRAME_FILTER_THRESHOLD == 0.9996
    assert c.voice is None


def test_legacy_aliases_apply_when_the_new_name_is_absent() -> None:
    c = config(num_sample_frames=7, evs_enabled=False, evs_threshold=0.5)
    assert (c.num_frames, c.enable_frame_filter, c.frame_filter_threshold) == (7, False, 0.5)


def test_the_new_name_wins_over_its_legacy_alias() -> None:
    c = config(num_frames=3, num_sample_frames=9, enable_frame_filter=True, evs_enabled=False)
    assert (c.num_frames, c.enable_frame_filter) == (3, True)
    c = config(frame_filter_threshold=0.25, evs_threshold=0.75)
    assert c.frame_filter_threshold == 0.25


def test_bounds_are_inclusive() -> None:
    c = config(num_frames=128, max_frames=256, frame_filter_threshold=1.0)
    assert (c.num_frames, c.max_frames, c.frame_filter_threshold) == (128, 256, 1.0)
    c = config(num_frames=1, max_frames=1, frame_filter_threshold=0.0)
    assert (c.num_frames, c.max_frames, c.frame_filter_threshold) == (1, 1, 0.0)


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"num_frames": 0}, "num_frames"),
        ({"num_frames": 129}, "num_frames"),
        ({"num_sample_frames": 0}, "num_sample_frames"),  # named as the client sent it
        ({"max_frames": 0}, "max_frames"),
        ({"max_frames": 257}, "max_frames"),
        ({"frame_filter_threshold": 1.5}, "frame_filter_threshold"),
        ({"evs_threshold": -0.1}, "evs_threshold"),
        ({"modalities": ["video"]}, "modalities"),
        ({"modalities": []}, "modalities"),
        ({"modalities": "text"}, "modalities"),
        ({"num_frames": "many"}, "num_frames"),
        ({"enable_frame_filter": "maybe"}, "enable_frame_filter"),
        ({"sampling_params_list": [1, 2]}, "sampling_params_list"),
        ({"system_prompt": 5}, "system_prompt"),
    ],
)
def test_out_of_bounds_or_wrong_types_are_refused_by_field(fields: dict[str, object], where: str) -> None:
    message = refused(json.dumps({"type": "session.config", **fields}))
    assert message.startswith("Invalid session config: ")
    assert where in message


def test_refusal_does_not_echo_the_input() -> None:
    message = refused(json.dumps({"type": "session.config", "num_frames": "x" * 5000}))
    assert "xxxx" not in message and len(message) < 300


def test_modalities_keep_order_without_duplicates() -> None:
    assert config(modalities=["audio", "text", "audio"]).modalities == ["audio", "text"]
    assert config(modalities=["text"]).modalities == ["text"]


def test_voice_must_be_on_disk() -> None:
    assert config(voice="heart").voice == "heart"
    assert refused(json.dumps({"type": "session.config", "voice": "nova"})) == (
        "Invalid session config: unknown voice 'nova'; available: heart"
    )


def test_unknown_config_fields_are_ignored() -> None:
    assert config(temperature=0.2, whatever={"a": 1}).num_frames == 4


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "Invalid JSON in session.config"),
        ('{"type": "video.frame", "data": ""}', "Expected session.config, got: video.frame"),
        ('{"data": 1}', "Expected session.config, got: None"),
        ("[1, 2]", "Expected session.config, got: list"),
        ('"session.config"', "Expected session.config, got: str"),
    ],
)
def test_the_first_message_must_be_a_session_config(raw: str, message: str) -> None:
    assert refused(raw) == message


# -- later messages -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{oops", "Invalid JSON"),
        ("[]", "Messages must be JSON objects"),
        ("3", "Messages must be JSON objects"),
        ('{"type": "_internal.frame_decode_failed", "b64": "x"}', "Unknown type: _internal.frame_decode_failed"),
        ('{"type": "_internal."}', "Unknown type: _internal."),
        ("[" * 100_000 + "]" * 100_000, "Invalid JSON"),
    ],
)
def test_parse_message_errors(raw: str, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        protocol.parse_message(raw)
    assert info.value.message == message


def test_parse_message_passes_other_types_through() -> None:
    assert protocol.parse_message('{"type": "made.up"}') == {"type": "made.up"}
    assert protocol.parse_message("{}") == {}


def test_audio_is_strict_base64() -> None:
    pcm = b"\x01\x00\xff\x7f" * 10
    assert protocol.decode_audio(base64.b64encode(pcm).decode()) == pcm
    assert protocol.decode_audio("") == b""
    for bad in ("AQD/fw", "AQD/fw= =", "@@@@", 12, None):
        with pytest.raises(ProtocolError, match="Invalid audio data"):
            protocol.decode_audio(bad)


def test_number_or_none() -> None:
    assert [protocol.number_or_none(v) for v in (0, 1.5, True, "3", None, [1])] == [0, 1.5, None, None, None, None]


# -- server messages ------------------------------------------------------------------------------
def test_frame_ack_only_with_a_string_frame_id() -> None:
    for frame_id in (None, "", 5):
        assert protocol.frame_ack({"frame_id": frame_id}, accepted=True, buffered_frames=1, received_ms=1.0) is None


def test_frame_ack_fields() -> None:
    msg = {"type": "video.frame", "frame_id": "f1", "pts_ms": 40, "capture_ts_ms": 1234.5}
    assert protocol.frame_ack(msg, accepted=True, buffered_frames=3, received_ms=99.5) == {
        "type": "video.frame.ack",
        "frame_id": "f1",
        "pts_ms": 40,
        "capture_ts_ms": 1234.5,
        "accepted": True,
        "buffered_frames": 3,
        "server_receive_ts_ms": 99.5,
    }
    ack = protocol.frame_ack(
        msg, accepted=False, buffered_frames=2, received_ms=1.0, reason="filtered", dropped_frame_id="f0"
    )
    assert ack is not None and (ack["reason"], ack["dropped_frame_id"], ack["accepted"]) == ("filtered", "f0", False)


def test_frames_consumed_fields() -> None:
    metas = [
        protocol.frame_metadata({"frame_id": "a", "pts_ms": 0, "quality_profile": "hd"}, 10.0),
        protocol.frame_metadata({"pts_ms": 33}, 11.0),
        protocol.frame_metadata({"frame_id": "c", "pts_ms": 66, "source_pts_ms": 60}, 12.0),
    ]
    msg = protocol.frames_consumed("video-1", metas, model_selected_ms=20.0, decoded_ready_ms=19.0)
    assert msg["type"] == "video.frames.consumed"
    assert msg["request_id"] == "video-1"
    assert msg["model_selected_ts_ms"] == 20.0
    assert msg["frame_ids"] == ["a", "c"]
    assert msg["latest_pts_ms"] == 66
    assert msg["frames"][0] == {
        "frame_id": "a",
        "pts_ms": 0,
        "source_pts_ms": None,
        "quality_profile": "hd",
        "receiver_received_ts_ms": 10.0,
        "decoded_ready_ts_ms": 19.0,
    }
    assert msg["frames"][2]["source_pts_ms"] == 60
    assert protocol.frames_consumed("r", [], model_selected_ms=1, decoded_ready_ms=1)["latest_pts_ms"] is None


def test_audio_delta_is_a_24khz_mono_wav() -> None:
    pcm = bytes(range(256)) * 10
    msg = protocol.audio_delta(pcm)
    assert msg["type"] == "response.audio.delta" and msg["format"] == "wav"
    with wave.open(io.BytesIO(base64.b64decode(msg["data"]))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        assert w.readframes(w.getnframes()) == pcm


def test_small_messages() -> None:
    assert protocol.error("x") == {"type": "error", "message": "x", "kind": "client_error"}
    assert protocol.response_start() == {"type": "response.start"}
    assert protocol.text_delta("Hi") == {"type": "response.text.delta", "delta": "Hi"}
    assert protocol.text_done("Hi.") == {"type": "response.text.done", "text": "Hi."}
    assert protocol.audio_done() == {"type": "response.audio.done"}
    assert protocol.session_done() == {"type": "session.done"}
    assert protocol.pong() == {"type": "pong"}
    assert protocol.input_transcript("what colour") == {"type": "input.transcript", "text": "what colour"}
