"""The Realtime API's GA event layer without a server: client events, the session, server events, items."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.realtime import sdk_parses

from omniweb.conversation.chunks import Usage, WordTiming
from omniweb.openai_api.protocol import OPENAI_VOICES
from omniweb.openai_api.realtime import server_events
from omniweb.openai_api.realtime.audio import decode_pcm16, pcm_ms, to_engine_rate
from omniweb.openai_api.realtime.errors import RealtimeError, error_event, new_id
from omniweb.openai_api.realtime.events import EVENT_TYPES, image_from_data_url, parse_event
from omniweb.openai_api.realtime.items import Conversation, Item
from omniweb.openai_api.realtime.session import (
    MAX_INSTRUCTIONS_CHARS,
    AnySession,
    TranscriptionSession,
    new_session,
    update_session,
)

VOICES = {**dict.fromkeys(OPENAI_VOICES, "heart"), "heart": "heart"}


def parse(event: dict[str, Any] | str) -> Any:
    return parse_event(event if isinstance(event, str) else json.dumps(event), voices=VOICES)


def refused(event: dict[str, Any] | str) -> RealtimeError:
    with pytest.raises(RealtimeError) as info:
        parse(event)
    return info.value


def update(session: AnySession, **fields: Any) -> AnySession:
    return update_session(session, fields, VOICES)


def update_refused(session: AnySession, **fields: Any) -> RealtimeError:
    with pytest.raises(RealtimeError) as info:
        update(session, **fields)
    return info.value


# -- the session -------------------------------------------------------------------------------------
def test_new_session_has_openais_defaults_in_the_ga_shape() -> None:
    session = new_session(VOICES)
    wire = sdk_parses(server_events.session_created(session)).session
    assert wire.type == "realtime" and wire.model == "gpt-realtime"
    assert wire.output_modalities == ["audio"]
    assert wire.audio.input.format.type == "audio/pcm" and wire.audio.input.format.rate == 24000
    td = wire.audio.input.turn_detection
    assert (td.type, td.threshold, td.prefix_padding_ms, td.silence_duration_ms) == ("server_vad", 0.5, 300, 500)
    assert td.create_response and td.interrupt_response
    assert wire.audio.input.transcription is None
    assert wire.audio.output.voice == "alloy"
    assert session.id.startswith("sess_")


def test_a_transcription_session_in_the_ga_shape_that_the_sdk_parses() -> None:
    session = new_session(VOICES, intent="transcription")
    assert isinstance(session, TranscriptionSession) and not session.responds
    wire = sdk_parses(server_events.session_created(session)).session
    assert wire.type == "transcription" and wire.audio.input.transcription.model == "whisper-1"
    agents = {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "gpt-transcribe", "languages": ["en"], "prompt": "Cups and tables."},
                "turn_detection": {"type": "semantic_vad"},
            }
        },
    }
    updated = update(session, **agents)
    assert updated.audio.input.transcription.languages == ["en"] and updated.turn_detection.type == "semantic_vad"
    sdk_parses(server_events.session_updated(updated))
    bad = update_refused(session, audio={"input": {"transcription": {"model": "whisper-1", "languages": ["fr"]}}})
    assert bad.param == "session.audio.input.transcription.languages" and "English-only" in str(bad)
    assert update_refused(session, type="realtime").param == "session.type"
    assert update_refused(session, instructions="x").code == "unknown_parameter"  # no conversation here
    assert update_refused(new_session(VOICES), type="transcription").param == "session.type"
    assert update_refused(new_session(VOICES), type="translation").param == "session.type"


def test_updates_merge_into_the_effective_session() -> None:
    session = new_session(VOICES)
    session = update(session, type="realtime", output_modalities=["text"], instructions="Be brief.")
    session = update(session, audio={"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}})
    session = update(session, audio={"output": {"voice": "echo"}})
    assert session.output_modalities == ["text"] and session.instructions == "Be brief."
    td = session.turn_detection
    assert td is not None and td.silence_duration_ms == 800 and td.threshold == 0.5  # replaced whole, defaults filled
    assert session.audio.output.voice == "echo"
    assert session.audio.input.format.rate == 24000  # untouched siblings stay
    session = update(session, audio={"input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}})
    assert session.turn_detection is None
    assert session.audio.input.transcription is not None
    sdk_parses(server_events.session_updated(session))


def test_a_client_may_echo_the_session_it_was_given() -> None:
    session = new_session(VOICES)
    again = update_session(session, session.wire(), VOICES)
    assert again.id == session.id and again.wire() == session.wire()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"audio": {"input": {"format": {"type": "audio/g729"}}}}, "session.audio.input.format.type"),
        ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "session.audio.output.format.rate"),
        ({"audio": {"output": {"voice": "nobody"}}}, "session.audio.output.voice"),
        ({"audio": {"output": {"speed": 1.5}}}, "session.audio.output.speed"),
        ({"output_modalities": ["video"]}, "session.output_modalities[0]"),
        ({"output_modalities": []}, "session.output_modalities"),
        ({"audio": {"input": {"turn_detection": {"type": "push_to_talk"}}}}, "session.audio.input.turn_detection.type"),
        (
            {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}},
            "session.audio.input.turn_detection.threshold",
        ),
        ({"audio": {"input": {"transcription": {"model": "gpt-9"}}}}, "session.audio.input.transcription.model"),
        (
            {"audio": {"input": {"transcription": {"model": "whisper-1", "language": "fr"}}}},
            "session.audio.input.transcription.language",
        ),
        ({"audio": {"input": {"noise_reduction": {"type": "near_field"}}}}, "session.audio.input.noise_reduction"),
        ({"tools": [{"type": "function", "name": "f"}]}, "session.tools"),
        ({"max_output_tokens": 50}, "session.max_output_tokens"),
        ({"type": "transcription"}, "session.type"),
        ({"colour": "blue"}, "session.colour"),
        ({"instructions": "x" * (MAX_INSTRUCTIONS_CHARS + 1)}, "session.instructions"),
    ],
)
def test_unsupported_session_values_are_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    session = new_session(VOICES)
    err = update_refused(session, **fields)
    assert err.param == param
    assert param in err.message
    assert err.type == "invalid_request_error"


def test_a_refused_update_leaves_the_session_as_it_was() -> None:
    session = update(new_session(VOICES), output_modalities=["text"])
    update_refused(session, output_modalities=["text"], audio={"output": {"voice": "nobody"}})
    assert session.output_modalities == ["text"] and session.audio.output.voice == "alloy"


def test_the_default_voice_follows_the_voice_map() -> None:
    voices = {"echo": "heart", "heart": "heart"}  # OPENAI_VOICE_MAP refused alloy
    assert new_session(voices).audio.output.voice == "echo"
    assert new_session(voices, default_voice="heart").audio.output.voice == "heart"


# -- client events -----------------------------------------------------------------------------------
def test_every_supported_client_event_parses_to_its_type() -> None:
    events = [
        {"type": "session.update", "session": {"type": "realtime"}},
        {"type": "input_audio_buffer.append", "audio": "AAAA"},
        {"type": "input_audio_buffer.commit"},
        {"type": "input_audio_buffer.clear"},
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": "data:image/jpeg;base64,AAAA"},
                    {"type": "input_audio", "audio": "AAAA"},
                ],
            },
        },
        {"type": "conversation.item.delete", "item_id": "item_1"},
        {"type": "conversation.item.retrieve", "item_id": "item_1"},
        {"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 1500},
        {"type": "response.create", "response": {"output_modalities": ["text"], "instructions": "Short."}},
        {"type": "response.create"},
        {"type": "response.cancel"},
    ]
    for raw in events:
        parsed = parse({**raw, "event_id": "evt_client_1"})
        assert parsed.type == raw["type"] and parsed.event_id == "evt_client_1"


def test_errors_echo_the_clients_event_id() -> None:
    err = refused({"type": "conversation.item.truncate", "event_id": "mine-7", "item_id": "x", "audio_end_ms": 5})
    assert err.event_id == "mine-7" and err.param == "content_index" and err.code == "missing_required_parameter"
    payload = sdk_parses(error_event(err))
    assert payload.error.event_id == "mine-7" and payload.error.param == "content_index"
    assert payload.error.type == "invalid_request_error"


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        ("{not json", "invalid_json", None),
        ("[1, 2]", "invalid_event", None),
        ('{"event_id": "e"}', "missing_required_parameter", "type"),
        ('{"type": "session.delete"}', "invalid_event_type", "type"),
        ('{"type": "output_audio_buffer.clear"}', "invalid_event_type", "type"),
        ('{"type": "input_audio_buffer.append"}', "missing_required_parameter", "audio"),
        ('{"type": "input_audio_buffer.commit", "extra": 1}', "unknown_parameter", "extra"),
        ('{"type": "session.update", "session": "audio"}', "invalid_value", "session"),
        ('{"type": "response.create", "response": {"input": []}}', "invalid_value", "response.input"),
        (
            '{"type": "response.create", "response": {"conversation": "other"}}',
            "invalid_value",
            "response.conversation",
        ),
        (
            '{"type": "conversation.item.create", "item": {"type": "function_call", "role": "user", "content": []}}',
            "invalid_value",
            "item.type",
        ),
        (
            '{"type": "conversation.item.create", "item": {"role": "user", '
            '"content": [{"type": "input_txt", "text": "a"}]}}',
            "invalid_value",
            "item.content[0]",
        ),
        (
            '{"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text"}]}}',
            "missing_required_parameter",
            "item.content[0].text",
        ),
        (
            '{"type": "conversation.item.create", "item": {"role": "system", "content": [{"type": "input_audio"}]}}',
            "invalid_value",
            "item",
        ),
        (
            '{"type": "conversation.item.create", "item": {"id": "'
            + "x" * 33
            + '", "role": "user", "content": [{"type": "input_text", "text": "a"}]}}',
            "invalid_value",
            "item.id",
        ),
        (
            '{"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": -1}',
            "invalid_value",
            "audio_end_ms",
        ),
    ],
)
def test_malformed_events_are_refused_with_the_field(raw: str, code: str, param: str | None) -> None:
    err = refused(raw)
    assert (err.code, err.param) == (code, param)
    sdk_parses(error_event(err))


def test_oversize_and_binary_events_are_refused() -> None:
    with pytest.raises(RealtimeError) as info:
        parse_event('{"type": "input_audio_buffer.commit"}' + " " * 100, voices=VOICES, max_chars=64)
    assert info.value.code == "event_too_large"
    with pytest.raises(RealtimeError):
        parse_event(b"{}", voices=VOICES)


# -- audio and images --------------------------------------------------------------------------------
def test_pcm16_base64_is_decoded_strictly_with_limits() -> None:
    pcm = np.arange(-100, 100, dtype="<i2").tobytes()
    assert decode_pcm16(base64.b64encode(pcm).decode()) == pcm
    for bad in ("not base64!", "AAA", base64.b64encode(b"\x01\x02\x03").decode()):
        with pytest.raises(RealtimeError) as info:
            decode_pcm16(bad)
        assert info.value.param == "audio"
    with pytest.raises(RealtimeError) as info:
        decode_pcm16(base64.b64encode(bytes(1000)).decode(), max_bytes=100)
    assert info.value.code == "audio_too_large"


def test_resampling_to_the_engine_rate_keeps_a_tone() -> None:
    t = np.arange(24000) / 24000
    tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
    out = np.frombuffer(to_engine_rate(tone), dtype="<i2")
    assert len(out) == 16000
    spectrum = np.abs(np.fft.rfft(out.astype(np.float64)))
    assert abs(int(np.argmax(spectrum)) - 440) <= 1  # 1 Hz bins over one second
    assert pcm_ms(tone) == 1000 and to_engine_rate(b"") == b""


def test_images_come_only_as_data_urls() -> None:
    assert image_from_data_url("data:image/png;base64,iVBOR", param="p") == "iVBOR"
    assert image_from_data_url("DATA:image/jpeg;base64,/9j/", param="p") == "/9j/"
    for url in ("https://example.com/cat.jpg", "data:image/gif;base64,R0lG", "data:text/plain,hi"):
        with pytest.raises(RealtimeError) as info:
            image_from_data_url(url, param="item.content[0].image_url")
        assert info.value.param == "item.content[0].image_url"


# -- the conversation --------------------------------------------------------------------------------
def text_item(role: str, text: str, item_id: str | None = None) -> Item:
    kind = "output_text" if role == "assistant" else "input_text"
    return Item(id=item_id or new_id("item"), role=role, content=[{"type": kind, "text": text}])  # type: ignore[arg-type]


def spoken_answer(words: list[tuple[str, int, int]]) -> Item:
    item = Item(id=new_id("item"), role="assistant", content=[{"type": "output_audio", "transcript": ""}])
    item.words = [WordTiming(w, s, e) for w, s, e in words]
    item.content[0]["transcript"] = " ".join(w for w, _, _ in words)
    item.audio_ms = words[-1][2] + 200
    return item


def test_items_are_placed_by_previous_item_id() -> None:
    conv = Conversation()
    a, b, c = text_item("user", "a", "a"), text_item("assistant", "b", "b"), text_item("user", "c", "c")
    assert conv.add(a) == (None, [])
    assert conv.add(c) == ("a", [])
    assert conv.add(b, previous_item_id="a") == ("a", [])
    assert [i.id for i in conv.items] == ["a", "b", "c"]
    root = text_item("system", "be kind", "s")
    assert conv.add(root, previous_item_id="root") == (None, [])
    assert conv.history() == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert conv.history(before=c) == conv.history()[:2]
    assert conv.system_text() == "be kind"
    with pytest.raises(RealtimeError) as info:
        conv.add(text_item("user", "d", "a"))
    assert info.value.code == "item_create_duplicate_item_id"
    with pytest.raises(RealtimeError) as info:
        conv.add(text_item("user", "d"), previous_item_id="nope")
    assert info.value.param == "previous_item_id"


def test_the_store_drops_the_oldest_items_beyond_its_cap() -> None:
    conv = Conversation(max_items=2)
    conv.add(text_item("user", "1", "1"))
    conv.add(text_item("assistant", "2", "2"))
    _, dropped = conv.add(text_item("user", "3", "3"))
    assert [i.id for i in dropped] == ["1"] and [i.id for i in conv.items] == ["2", "3"]


def test_delete_and_retrieve_unknown_items_are_errors() -> None:
    conv = Conversation()
    conv.add(text_item("user", "hello", "x"))
    sdk_parses(server_events.item_retrieved(conv.get("x")))
    assert conv.delete("x").id == "x"
    with pytest.raises(RealtimeError) as info:
        conv.get("x")
    assert info.value.code == "item_not_found" and info.value.param == "item_id"


def test_truncate_keeps_exactly_the_words_heard() -> None:
    conv = Conversation()
    item = spoken_answer(
        [("I", 0, 120), ("see", 120, 400), ("two", 400, 700), ("people,", 700, 1200), ("smiling.", 1300, 1900)]
    )
    conv.add(item)
    conv.truncate(item.id, 0, 1199)  # "people," is still being said at 1199 ms
    assert item.content[0]["transcript"] == "I see two"
    assert conv.history() == [{"role": "assistant", "content": "I see two"}]
    assert item.audio_ms == 1199
    conv.truncate(item.id, 0, 700)  # a later, shorter cut
    assert item.content[0]["transcript"] == "I see two"
    conv.truncate(item.id, 0, 0)
    assert item.content[0]["transcript"] == ""
    sdk_parses(server_events.item_truncated(item.id, 0, 0))


def test_truncate_refuses_what_cannot_be_cut() -> None:
    conv = Conversation()
    spoken = spoken_answer([("Hello.", 0, 500)])
    conv.add(spoken)
    conv.add(text_item("user", "hi", "u"))
    conv.add(text_item("assistant", "typed", "t"))
    cases = [
        ("u", 0, 10, "item_id"),
        ("t", 0, 10, "content_index"),
        (spoken.id, 1, 10, "content_index"),
        (spoken.id, 0, 5000, "audio_end_ms"),
        ("zz", 0, 1, "item_id"),
    ]
    for item_id, index, end_ms, param in cases:
        with pytest.raises(RealtimeError) as info:
            conv.truncate(item_id, index, end_ms)
        assert info.value.param == param


# -- server events -----------------------------------------------------------------------------------
def test_a_whole_spoken_response_is_what_the_sdk_expects() -> None:
    response = server_events.Response(id=new_id("resp"), conversation_id="conv_1", modalities=("audio",), voice="alloy")
    item = Item(id=new_id("item"), role="assistant", content=[], status="in_progress")
    events = [
        server_events.response_created(response),
        server_events.output_item_added(response, item),
        server_events.item_added(item, "item_prev"),
    ]
    item.content.append({"type": "output_audio", "transcript": ""})
    events += [
        server_events.content_part_added(response, item),
        server_events.transcript_delta(response, item, "Two people."),
        server_events.audio_delta(response, item, b"\x00\x01" * 240),
        server_events.audio_done(response, item),
        server_events.transcript_done(response, item, "Two people."),
        server_events.content_part_done(response, item, "Two people."),
    ]
    item.status = "completed"
    item.content[0]["transcript"] = "Two people."
    response.output = [item]
    response.status = "completed"
    response.usage = server_events.usage(Usage(input_text_tokens=3, output_text_tokens=2, output_audio_tokens=80))
    events += [
        server_events.output_item_done(response, item),
        server_events.item_done(item, "item_prev"),
        server_events.response_done(response),
    ]
    parsed = [sdk_parses(e) for e in events]
    done = parsed[-1].response
    assert done.status == "completed" and done.usage.output_token_details.audio_tokens == 80
    assert done.usage.total_tokens == 3 + 2 + 80
    assert done.output[0].content[0].transcript == "Two people."
    assert base64.b64decode(parsed[5].delta) == b"\x00\x01" * 240
    assert len({e["event_id"] for e in events}) == len(events)


def test_text_responses_cancellations_and_failures_parse() -> None:
    response = server_events.Response(id=new_id("resp"), conversation_id=None, modalities=("text",), voice="alloy")
    item = Item(id=new_id("item"), role="assistant", content=[{"type": "output_text", "text": ""}])
    sdk_parses(server_events.content_part_added(response, item))
    sdk_parses(server_events.text_delta(response, item, "Hi"))
    sdk_parses(server_events.text_done(response, item, "Hi"))
    sdk_parses(server_events.content_part_done(response, item, "Hi"))
    response.status, response.status_details = "cancelled", server_events.cancelled("turn_detected")
    assert sdk_parses(server_events.response_done(response)).response.status_details.reason == "turn_detected"
    response.status, response.status_details = "failed", server_events.failed("The thinker is unavailable")
    assert (
        sdk_parses(server_events.response_done(response)).response.status_details.error.message
        == "The thinker is unavailable"
    )


def test_input_audio_events_parse() -> None:
    for payload in [
        server_events.audio_committed("item_a", None),
        server_events.audio_cleared(),
        server_events.speech_started(1200, "item_a"),
        server_events.speech_stopped(2600, "item_a"),
        server_events.transcription_completed("item_a", "What do you see?", 1400),
        server_events.transcription_delta("item_a", "What do"),
        server_events.transcription_failed("item_a", "Transcription failed"),
        server_events.item_deleted("item_a"),
    ]:
        sdk_parses(payload)


def test_transcription_deltas_are_whispers_segments_and_join_to_the_transcript() -> None:
    assert server_events.transcript_deltas([" How many people", " can you see?  "]) == (
        "How many people can you see?",
        ["How many people", " can you see?"],
    )
    assert server_events.transcript_deltas([" Hello."]) == ("Hello.", ["Hello."])
    assert server_events.transcript_deltas(["  ", " Hi", " "]) == ("Hi", ["Hi"])  # empty pieces send nothing
    assert server_events.transcript_deltas([]) == ("", [])


def test_ids_look_like_openais() -> None:
    ids = {new_id("event") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i.startswith("event_") and len(i) == 28 and i[6:].isalnum() for i in ids)


# -- whatever a client sends ---------------------------------------------------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
_keys = st.sampled_from(
    [
        "type",
        "event_id",
        "session",
        "audio",
        "item",
        "item_id",
        "content_index",
        "audio_end_ms",
        "response",
        "previous_item_id",
        "response_id",
        "input",
        "output",
        "turn_detection",
        "voice",
        "format",
        "content",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from([*EVENT_TYPES, "nonsense", ""]),
    fields=st.dictionaries(_keys, _json, max_size=4),
)
def test_any_event_parses_or_is_refused_with_an_error_event(kind: str, fields: dict[str, Any]) -> None:
    raw = json.dumps({**fields, "type": kind})
    try:
        event = parse(raw)
    except RealtimeError as err:
        sdk_parses(error_event(err))
        return
    assert event.type == kind


@settings(max_examples=300, deadline=None)
@given(update=st.dictionaries(st.sampled_from(["audio", "output_modalities", "instructions", "tools", "x"]), _json))
def test_any_session_update_gives_a_valid_session_or_an_error(update: dict[str, Any]) -> None:
    session = new_session(VOICES)
    try:
        updated = update_session(session, update, VOICES)
    except RealtimeError as err:
        assert err.param is not None and err.param.startswith("session")
        return
    sdk_parses(server_events.session_updated(updated))
