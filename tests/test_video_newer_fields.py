"""Fields newer upstream clients send on ``/v1/video/chat/stream``: ``event_names``,
``max_history_turns``, ``sampling_strategy`` / ``window_seconds``; ``response.text.done`` as soon as
the text is complete; unknown fields still accepted."""

from __future__ import annotations

import pytest
from support.messages import expect_close, expect_error, receive_until
from support.video import QUESTION, ack, collect_turn, frame, is_type, jpeg, scene_frames, sync, video, video_requests

from omniweb.media import frames


# -- event_names -----------------------------------------------------------------------------------
async def test_ga_event_names_rename_the_audio_events(connect):
    comm = await video(connect, event_names="ga")
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await receive_until(comm, is_type("response.output_audio.done"), 30)
    assert t.of_type("response.output_audio.delta") and not t.of_type("response.audio.delta")
    assert all(d["format"] == "wav" for d in t.of_type("response.output_audio.delta"))
    assert len(t.of_type("response.text.done")) == 1
    await sync(comm)


async def test_seed_event_names_are_the_default(connect):
    comm = await video(connect, event_names="seed")
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm)
    assert t.of_type("response.audio.delta") and not t.of_type("response.output_audio.delta")


@pytest.mark.parametrize("value", ["openai", "", None, 1])
async def test_other_event_names_are_refused(connect, value):
    comm = await video(connect, event_names=value)
    message = await expect_error(comm)
    assert message.startswith("Invalid session config: event_names:"), message
    await expect_close(comm)


# -- max_history_turns -----------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1, 1.5, "two"])
async def test_max_history_turns_below_one_is_refused_naming_the_field(connect, value):
    comm = await video(connect, max_history_turns=value)
    message = await expect_error(comm)
    assert message.startswith("Invalid session config: max_history_turns:"), message
    await expect_close(comm)


async def test_max_history_turns_bounds_the_history_and_the_server_caps_it(connect, requests_seen, settings):
    settings.VIDEO_HISTORY_TURNS = 2
    one = await video(connect, modalities=["text"], max_history_turns=1)
    many = await video(connect, modalities=["text"], max_history_turns=50)  # capped at 2
    unset = await video(connect, modalities=["text"], max_history_turns=None)  # the server's 2
    for comm in (one, many, unset):
        await scene_frames(comm)
        for question in ("What do you see?", "Is it dark?", "What colour is it?", "Anything else?"):
            await comm.send_json_to({"type": "video.query", "text": question})
            await collect_turn(comm, audio=False)
    histories = [r["history"] for r in video_requests(requests_seen)]
    asked = [[h["content"] for h in history[::2]] for history in histories]
    assert asked[:4] == [[], ["What do you see?"], ["Is it dark?"], ["What colour is it?"]]
    capped = [[], ["What do you see?"], ["What do you see?", "Is it dark?"], ["Is it dark?", "What colour is it?"]]
    assert asked[4:8] == capped
    assert asked[8:12] == capped


# -- sampling_strategy -----------------------------------------------------------------------------
def test_select_frames_per_strategy():
    times = [100.0 * i for i in range(10)]  # 0 … 900 ms
    assert frames.select_frames(times, 4, "uniform", 2.0) == [0, 2, 4, 9]
    assert frames.select_frames(times, 4, "latest_frames", 2.0) == [6, 7, 8, 9]
    assert frames.select_frames(times, 3, "latest_seconds", 0.25) == [7, 8, 9]  # 650 ms and later
    assert frames.select_frames(times, 2, "latest_seconds", 0.45) == [5, 9]  # stride in the window
    assert frames.select_frames(times, 4, "latest_seconds", 60.0) == [0, 2, 4, 9]  # the whole buffer
    assert frames.select_frames(times[:2], 4, "latest_frames", 2.0) == [0, 1]
    assert frames.select_frames([], 4, "latest_seconds", 2.0) == []


async def ten_frames(comm, **extra) -> None:
    for i in range(10):
        await frame(comm, jpeg(20 * i), f"f{i}", pts_ms=100 * i, **extra)
        await ack(comm)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, ["f0", "f2", "f4", "f9"]),
        ({"sampling_strategy": "uniform"}, ["f0", "f2", "f4", "f9"]),
        ({"sampling_strategy": "latest_frames"}, ["f6", "f7", "f8", "f9"]),
        ({"sampling_strategy": "latest_seconds", "window_seconds": 0.3}, ["f6", "f7", "f8", "f9"]),
        ({"sampling_strategy": "latest_seconds", "window_seconds": 0.15}, ["f8", "f9"]),
        ({"sampling_strategy": "latest_seconds"}, ["f0", "f2", "f4", "f9"]),  # 2 s: all of these 0.9 s
    ],
)
async def test_sampling_strategy_picks_the_frames_the_thinker_sees(connect, fields, expected):
    comm = await video(connect, num_frames=4, enable_frame_filter=False, modalities=["text"], **fields)
    await ten_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm, audio=False)
    [consumed] = t.of_type("video.frames.consumed")
    assert consumed["frame_ids"] == expected


@pytest.mark.parametrize(
    "fields",
    [
        {"sampling_strategy": "newest"},
        {"sampling_strategy": "latest_seconds", "window_seconds": 0},
        {"sampling_strategy": "latest_seconds", "window_seconds": -1},
    ],
)
async def test_bad_sampling_fields_are_refused(connect, fields):
    comm = await video(connect, **fields)
    message = await expect_error(comm)
    assert message.startswith("Invalid session config: "), message
    assert next(iter(f for f in fields if f in message)), message
    await expect_close(comm)


# -- response.text.done timing -----------------------------------------------------------------------
async def test_text_done_comes_when_the_text_is_complete_before_its_audio_ends(connect):
    comm = await video(connect)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm)
    types = t.types
    [done] = t.of_type("response.text.done")
    assert done["text"] == "".join(d["delta"] for d in t.of_type("response.text.delta"))
    at = types.index("response.text.done")
    assert "response.text.delta" not in types[at:], "every text delta comes before text.done"
    assert "response.audio.delta" in types[at:], "audio deltas follow the text's done"
    assert types[-1] == "response.audio.done"


# -- unknown fields ----------------------------------------------------------------------------------
async def test_unknown_config_fields_are_accepted(connect):
    comm = await video(connect, modalities=["text"], some_future_field={"x": 1}, temperature=0.2)
    await scene_frames(comm)
    await comm.send_json_to({"type": "video.query", "text": QUESTION})
    t = await collect_turn(comm, audio=False)
    assert t.errors == [] and t.of_type("response.text.done")
