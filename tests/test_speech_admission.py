"""Admission control: a tiny scheduler over the real voice refuses work beyond its capacity, at once.

The process-wide scheduler is a singleton sized by settings, so these tests build their own
``Scheduler`` (max_active=1, max_queued=1) around the real ``TtsPipeline`` and, for the WebSocket
path, put a ``LocalEngineClient`` over it in place of the runtime's client.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from support.messages import receive_until_done, session, speak

from omniweb.base.errors import ErrorKind
from omniweb.engine import runtime
from omniweb.engine.client import LocalEngineClient
from omniweb.engine.messages import Chunk, End, to_wire
from omniweb.engine.requests import VIDEO_TURN, SpeakRequest
from omniweb.engine.scheduler import AdmissionError, Scheduler
from speech.tts.loops import PIPELINE, TtsPipeline

HELLO = "Hello there."
LONG = " ".join(f"This is sentence number {i} of a long request that keeps the engine busy." for i in range(60))


def request(text: str) -> SpeakRequest:
    return SpeakRequest(
        pipeline=PIPELINE,
        text=text,
        voice=None,
        speed=1.0,
        seed=0,
        split="sentence",
        timestamps=False,
        first_chunk_frames=None,
        max_frames=None,
    )


class Sink:
    """Collects a request's chunks from the worker threads."""

    def __init__(self) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.ended = threading.Event()

    def __call__(self, chunk: Chunk) -> None:
        self.times.append(time.monotonic())
        self.chunks.append(to_wire(chunk))
        if isinstance(chunk, End):
            self.ended.set()

    @property
    def end(self) -> dict[str, Any] | None:
        return next((c for c in self.chunks if c["type"] == "end"), None)


@pytest.fixture(scope="module")
def pipeline() -> TtsPipeline:
    return TtsPipeline()


@pytest.fixture
def tiny(pipeline: TtsPipeline) -> Iterator[Scheduler]:
    sched = Scheduler({PIPELINE: pipeline}, workers=2, max_active=1, max_queued=1)
    sched.start()
    yield sched
    deadline = time.monotonic() + 2
    while (stats := sched.stats()).active or stats.queued or stats.running_steps:
        assert time.monotonic() < deadline, f"tiny scheduler still busy: {stats}"
        time.sleep(0.02)
    sched.stop()


@pytest.fixture
def tiny_client(tiny: Scheduler, monkeypatch: pytest.MonkeyPatch) -> LocalEngineClient:
    """Sessions opened during the test use the tiny scheduler; the runtime's client comes back after."""
    client = LocalEngineClient(tiny)
    monkeypatch.setattr(runtime, "_client", client)
    return client


def fill(sched: Scheduler) -> list[tuple[str, Sink]]:
    """One active and one queued long request: the scheduler is at capacity."""
    held = []
    for rid in ("filler-active", "filler-queued"):
        sink = Sink()
        sched.submit(rid, request(LONG), sink)
        held.append((rid, sink))
    stats = sched.stats()
    assert (stats.active, stats.queued) == (1, 1)
    return held


# -- the scheduler itself --------------------------------------------------------------------------


def test_third_concurrent_request_is_refused(tiny):
    held = fill(tiny)
    with pytest.raises(AdmissionError):
        tiny.submit("third", request(HELLO), Sink())
    stats = tiny.stats()
    assert (stats.active, stats.queued) == (1, 1)  # the refused request left no trace
    for rid, _ in held:
        assert tiny.abort(rid)


def test_abort_frees_capacity_and_promotes_the_queued_request(tiny):
    (active_id, active_sink), (queued_id, _) = fill(tiny)
    assert tiny.abort(active_id)
    assert active_sink.ended.wait(30) and active_sink.end == {"type": "end", "status": "cancelled"}
    stats = tiny.stats()
    assert (stats.active, stats.queued) == (1, 0)  # the queued request moved up
    third = Sink()
    tiny.submit("third", request(HELLO), third)  # room in the queue again
    assert tiny.abort(queued_id)
    assert third.ended.wait(10)
    assert third.end["status"] == "ok" and third.end["sentences"] == 1
    assert any(c["type"] == "audio" for c in third.chunks)
    assert not tiny.abort(queued_id)  # already gone


def test_queued_request_runs_when_the_active_one_finishes(tiny):
    first, second = Sink(), Sink()
    tiny.submit("first", request(HELLO), first)
    tiny.submit("second", request("Second request."), second)
    assert first.ended.wait(10) and second.ended.wait(10)
    assert first.end["status"] == second.end["status"] == "ok"
    # With one active slot the queued request produced nothing until the first one had ended.
    assert second.times[0] >= first.times[-1]
    assert first.end["sentences"] == second.end["sentences"] == 1


def test_invalid_request_is_refused_before_admission(tiny):
    with pytest.raises(ValueError, match="Unknown voice"):
        tiny.submit("bad", replace(request(HELLO), voice="nobody"), Sink())
    with pytest.raises(ValueError, match="unknown pipeline"):
        tiny.submit("bad", replace(request(HELLO), pipeline="nope"), Sink())
    stats = tiny.stats()
    assert (stats.active, stats.queued) == (0, 0)


# -- over the WebSocket ----------------------------------------------------------------------------


async def test_over_capacity_session_gets_an_error_at_once(connect, tiny, tiny_client):
    held = fill(tiny)
    comm = await session(connect)
    t = await speak(comm, HELLO, timeout=5)
    # At once, not queued: refused while the engine was still full (nothing held had ended).
    assert not any(sink.ended.is_set() for _, sink in held), "a full engine must answer at once"
    assert t.types == ["error", "session.done"]
    assert "capacity" in t.errors[0]
    assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}
    for rid, _ in held:
        tiny.abort(rid)
    # With room again the same session is served, and its utterance count moved on.
    t = await speak(comm, HELLO)
    assert t.errors == []
    assert t.json[-1] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


async def test_sessions_beyond_capacity_are_refused_while_admitted_ones_finish(connect, tiny, tiny_client):
    text = " ".join(f"Sentence {i} of a flush that keeps the tiny engine busy." for i in range(15))
    a = await session(connect, split_granularity="sentence", response_format="pcm")
    b = await session(connect, split_granularity="sentence", response_format="pcm")
    c = await session(connect, split_granularity="sentence", response_format="pcm")
    for comm in (a, b):
        await comm.send_json_to({"type": "input.text", "text": text})
        await comm.send_json_to({"type": "input.done"})
    refused = await speak(c, HELLO, timeout=5)
    assert refused.types == ["error", "session.done"] and "capacity" in refused.errors[0]
    for comm in (a, b):  # the active one and the queued one both complete in full
        t = await receive_until_done(comm)
        assert t.errors == []
        assert t.json[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 15}
    served = await speak(c, HELLO)
    assert served.errors == [] and served.json[-1]["utterance_index"] == 1


# -- load shedding: admitted by the estimated wait for first audio ----------------------------------


@pytest.fixture
def measured(pipeline: TtsPipeline) -> Iterator[Scheduler]:
    """A scheduler over the real voice: it measured what a first audio costs when the pipeline was
    added (its calibration), before any request."""
    sched = Scheduler({PIPELINE: pipeline}, workers=2)
    assert PIPELINE in sched.costs()
    sched.start()
    yield sched
    deadline = time.monotonic() + 10
    while (stats := sched.stats()).active or stats.queued or stats.running_steps:
        assert time.monotonic() < deadline, f"scheduler still busy: {stats}"
        time.sleep(0.02)
    sched.stop()


def first_audio(sink: Sink) -> float:
    return next(t for t, c in zip(sink.times, sink.chunks, strict=True) if c["type"] == "audio")


def test_a_burst_past_the_budget_is_refused_at_submit_and_the_admitted_are_served(measured):
    alone = measured.costs()[PIPELINE].first / 2  # one request's first-audio work over the two workers
    assert alone > 0 and measured.estimated_waits()[PIPELINE] == 0.0  # nothing ahead: it starts now
    measured.admission.budget = 4 * alone  # room for a few requests ahead of a new one, not for forty
    admitted: list[Sink] = []
    refused: list[AdmissionError] = []
    for i in range(40):
        sink = Sink()
        try:
            measured.submit(f"burst-{i}", request(HELLO), sink)
            admitted.append(sink)
        except AdmissionError as exc:  # raised inside submit: nothing queued, nothing to wait for
            refused.append(exc)
    assert admitted and refused, (len(admitted), len(refused))
    assert all(exc.kind is ErrorKind.CAPACITY and exc.retry_after > 0 for exc in refused)
    for sink in admitted:  # admitted means served: never ended for capacity afterwards
        assert sink.ended.wait(30) and sink.end["status"] == "ok", sink.end


def test_one_clients_burst_does_not_hold_another_clients_first_audio(measured):
    burst = [Sink() for _ in range(24)]
    for i, sink in enumerate(burst):
        measured.submit(f"a-{i}", replace(request(HELLO), tenant="client-a"), sink)
    other = Sink()
    measured.submit("b-0", replace(request(HELLO), tenant="client-b"), other)
    for sink in [*burst, other]:
        assert sink.ended.wait(30) and sink.end["status"] == "ok"
    after = sum(first_audio(sink) > first_audio(other) for sink in burst)
    # Client b's one request started ahead of most of client a's burst, which it arrived after.
    assert after >= len(burst) // 2, f"only {after} of {len(burst)} of client a's first audio came after b's"


def test_a_conversation_turn_is_judged_by_its_own_longer_budget(measured):
    """A turn of an ongoing conversation (admit_budget: its speaker is already waiting) is admitted
    where a new request with the same estimate is refused."""
    alone = measured.costs()[PIPELINE].first / 2
    measured.admission.budget = 10.0
    ahead = measured.reserve(PIPELINE, None)  # one request's first audio queued ahead
    measured.admission.budget = alone / 100  # below any request's own first-audio work
    with pytest.raises(AdmissionError) as refused:
        measured.submit("new", request(HELLO), Sink())
    assert refused.value.kind is ErrorKind.CAPACITY
    turn = Sink()
    measured.submit("turn", replace(request(HELLO), admit_budget=100 * alone), turn)
    assert turn.ended.wait(30) and turn.end["status"] == "ok"
    measured.release(ahead)


@pytest.fixture
def shedding(measured: Scheduler, monkeypatch: pytest.MonkeyPatch) -> Scheduler:
    """Sessions and HTTP requests use a measured scheduler that refuses every new request: one
    request is queued ahead (a front-door reservation) and the budget is below any first audio."""
    measured.admission.budget = 10.0
    measured.reserve(PIPELINE, None)
    measured.admission.budget = 1e-6
    monkeypatch.setattr(runtime, "_client", LocalEngineClient(measured))
    monkeypatch.setattr(runtime, "_scheduler", measured)  # what the front door asks
    return measured


async def test_a_shed_session_hears_capacity_and_can_retry(connect, shedding):
    comm = await session(connect)
    t = await speak(comm, HELLO, timeout=5)
    assert t.types == ["error", "session.done"]
    assert t.json[0]["kind"] == "capacity" and "capacity" in t.errors[0]
    shedding.admission.budget = 0.0  # room again: the same session is served
    t = await speak(comm, HELLO)
    assert t.errors == [] and t.json[-1]["total_sentences"] == 1


async def test_a_shed_http_request_gets_503_with_retry_after(connect, shedding):
    from django.test import AsyncClient

    response = await AsyncClient().post(
        "/v1/audio/speech",
        {"model": "tts-1", "voice": "alloy", "input": HELLO, "response_format": "mp3"},
        content_type="application/json",
    )
    assert response.status_code == 503 and int(response["Retry-After"]) >= 1
    assert json.loads(response.content)["error"]["code"] == "server_overloaded"


async def test_the_front_door_refuses_a_burst_before_django(shedding, settings):
    from channels.testing import HttpCommunicator

    from omniweb.asgi import application

    settings.REDIS_URL = ""  # the front door sheds for this process's own engine (embedded mode)

    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": HELLO, "response_format": "mp3"}).encode()
    comm = HttpCommunicator(
        application, "POST", "/v1/audio/speech", body=body, headers=[(b"content-type", b"application/json")]
    )
    response = await comm.get_response(timeout=10)
    headers = dict(response["headers"])
    assert response["status"] == 503 and int(headers[b"retry-after"]) >= 1
    assert headers[b"x-request-id"].startswith(b"req_")
    assert json.loads(response["body"])["error"]["code"] == "server_overloaded"


async def test_an_admitted_request_goes_on_once_the_burst_has_arrived(measured, monkeypatch, settings):
    """The front door lets a burst's arrivals be decided before the one it admitted reaches Django:
    every refusal of a burst that arrives over several turns of the event loop is sent first."""
    from omniweb.openai_api.asgi import shed_early

    settings.REDIS_URL = ""
    monkeypatch.setattr(runtime, "_scheduler", measured)
    alone = measured.costs()[PIPELINE].first / 2
    measured.admission.budget = 1.5 * alone  # room for one request, not for two
    events: list[str] = []

    async def django(scope: dict[str, Any], receive: Any, send: Any) -> None:
        events.append("admitted reaches Django")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            events.append(f"refused {message['status']}")

    app = shed_early(django, {"/v1/audio/speech": (PIPELINE, "mp3")}, b"{}")
    scope = {"type": "http", "path": "/v1/audio/speech", "method": "POST", "headers": []}
    burst = []
    for _ in range(12):  # one arrival per turn of the loop, as a burst is read off its sockets
        burst.append(asyncio.ensure_future(app(dict(scope), receive, send)))
        await asyncio.sleep(0)
    await asyncio.gather(*burst)
    assert events.count("refused 503") == 11
    assert events[-1] == "admitted reaches Django", events


def test_the_streams_of_the_requests_ahead_count_in_a_new_ones_estimate(measured):
    """Each request admitted ahead of a new one starts streaming once it has its first audio, and
    its stream must be fed in real time until the new one's first audio: the estimate grows faster
    than the requests' first-audio work alone (linear in their number) and the door admits fewer."""
    sink = Sink()  # a request that streams past its first audio: the engine learns what that costs
    measured.submit("streamed", request("First, one sentence. Then another one, a little longer."), sink)
    assert sink.ended.wait(20) and sink.end["status"] == "ok"
    measured.admission.budget = 1000.0
    held, waits = [], []
    while len(held) < 1500:  # up to the streams' ceiling, where the door says "no room"
        try:
            held.append(measured.reserve(PIPELINE, None))
        except AdmissionError:
            break
        waits.append(measured.estimated_waits()[PIPELINE])
    for r in held:
        measured.release(r)
    third = len(waits) // 3
    assert third >= 3, waits
    first_slope = (waits[third] - waits[0]) / third  # the first third: few streams started ahead
    last_slope = (waits[-1] - waits[-1 - third]) / third
    assert last_slope > 1.5 * first_slope, (first_slope, last_slope, len(waits))  # linear: equal


def test_a_streams_delivery_is_priced_with_its_synthesis(measured):
    """An encoder on the engine's cores makes each stream dearer: the door lets in about half as
    many streams whose delivery costs what their synthesis does as streams sent as they are."""
    measured.admission.budget = 1000.0  # no first audio is late: the streams' room decides

    def admitted(delivery: float) -> int:
        held = []
        while len(held) < 5000:
            try:
                held.append(measured.reserve(PIPELINE, None, delivery=delivery))
            except AdmissionError:
                break
        for r in held:
            measured.release(r)
        return len(held)

    plain, encoded = admitted(0.0), admitted(measured.costs()[PIPELINE].stream)
    assert 10 < plain < 5000
    assert 0.4 * plain < encoded < 0.6 * plain, (plain, encoded)


async def test_each_stream_carries_its_encoders_cost(measured, monkeypatch):
    """What a request's encoder costs (measured once per format in this process) goes with it to
    the engine: an mp3 over HTTP or a WebSocket's mp3 files, and nothing for streamed PCM."""
    from django.test import AsyncClient

    from omniweb.media.containers import encoding_cost
    from speech.protocol import SessionConfig
    from speech.session import speak_request

    assert encoding_cost("mp3") > 0 and encoding_cost("pcm") == encoding_cost("wav") == 0.0
    submitted: list[SpeakRequest] = []
    submit = measured.submit

    def spy(request_id: str, request: Any, sink: Any, reservation: int | None = None) -> None:
        submitted.append(request)
        submit(request_id, request, sink, reservation)

    monkeypatch.setattr(measured, "submit", spy)
    monkeypatch.setattr(runtime, "_client", LocalEngineClient(measured))
    for response_format in ("mp3", "pcm"):
        response = await AsyncClient().post(
            "/v1/audio/speech",
            {"model": "tts-1", "voice": "alloy", "input": HELLO, "response_format": response_format},
            content_type="application/json",
        )
        assert response.status_code == 200
        b"".join([chunk async for chunk in response.streaming_content])
    assert [r.delivery for r in submitted] == [encoding_cost("mp3"), 0.0]

    files = SessionConfig(response_format="mp3")
    streamed = SessionConfig(response_format="pcm", stream_audio=True)
    assert speak_request(files, [HELLO], merge=False, codec=None).delivery == encoding_cost("mp3")
    assert speak_request(streamed, [HELLO], merge=False, codec=None).delivery == 0.0


def test_a_front_door_reservation_counts_until_submitted_or_released(measured):
    measured.admission.budget = 10.0
    idle = measured.estimated_waits()[PIPELINE]
    held = measured.reserve(PIPELINE, "client-a")
    assert held is not None and measured.estimated_waits()[PIPELINE] > idle  # its place is taken
    measured.release(held)
    assert measured.estimated_waits()[PIPELINE] == idle
    sink = Sink()
    measured.submit("reserved", request(HELLO), sink, reservation=measured.reserve(PIPELINE, "client-a"))
    assert sink.ended.wait(10) and sink.end["status"] == "ok"
    assert measured.estimated_waits()[PIPELINE] == pytest.approx(idle, rel=0.5)  # submitted: no longer held


async def test_a_shed_realtime_response_is_an_error_event_and_a_failed_response(
    connect, request, monkeypatch, settings
):
    if request.node.callspec.params["engine"] != "local":
        pytest.skip("sheds on this process's engine; the workers' own shedding is the same code")
    comm = await connect("/v1/realtime?model=gpt-realtime")
    assert (await comm.receive_json_from(timeout=20))["type"] == "session.created"
    question = {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it?"}]},
    }
    text_only = {"type": "response.create", "response": {"output_modalities": ["text"]}}
    await comm.send_json_to(question)
    await comm.send_json_to(text_only)  # one answer measures what a video turn's first output costs
    while (event := await comm.receive_json_from(timeout=60))["type"] != "response.done":
        pass
    assert event["response"]["status"] == "completed", event
    engine = runtime.get_scheduler()
    monkeypatch.setattr(engine.admission, "budget", 10.0)
    ahead = engine.reserve(VIDEO_TURN, None)  # another answer's first output queued ahead
    assert ahead is not None
    engine.admission.budget = 1e-6  # below any turn's own work
    settings.ENGINE_TURN_ADMIT_BUDGET_MS = 1e-3  # a conversation's turn has its own budget
    await comm.send_json_to(question)
    await comm.send_json_to(text_only)
    events = [await comm.receive_json_from(timeout=20)]
    while events[-1]["type"] != "response.done":
        events.append(await comm.receive_json_from(timeout=20))
    [error] = [e for e in events if e["type"] == "error"]
    assert error["error"]["code"] == "capacity" and "capacity" in error["error"]["message"]
    done = events[-1]["response"]
    assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "capacity"
    engine.release(ahead)


async def test_http_requests_start_no_thread_of_their_own(monkeypatch):
    """Django's synchronous parts of every request (its signals, response.close) run on one shared
    thread: a thread started per request held the event loop while a burst was being refused."""
    import contextvars

    from omniweb.asgi import application

    async def get() -> int:
        """One request as daphne makes it: in a context of its own, with no thread-sensitive one set."""
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/no-such-page",
            "raw_path": b"/no-such-page",
            "query_string": b"",
            "headers": [(b"host", b"localhost")],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }

        bodies = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if bodies:
                return bodies.pop()
            await asyncio.Event().wait()  # no disconnect: Django stops listening when it has answered
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asyncio.get_running_loop().create_task(application(scope, receive, send), context=contextvars.Context())
        return sent[0]["status"]

    assert await get() == 404  # the shared thread starts here
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        if not self.name.startswith("asyncio_"):  # the loop's own default executor: shared, bounded
            started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    for _ in range(5):
        assert await get() == 404
    assert started == []
