"""Helpers the tests share, by topic; fixtures and hooks stay in ``tests/conftest.py``.

``messages`` (what a WebSocket session sent, and the speech endpoint's moves), ``engine`` (waiting
for the engine to be idle, the dispatch path under test), ``servers`` (ports, live servers, Redis
and workers), ``video`` (the video endpoint's moves), ``voice`` and ``paused_speech`` (our voice
as test input), ``pictures``, ``photos`` and ``camera_scenes`` (frames), ``upstream`` (a fake
OpenAI-compatible chat server), ``realtime`` (the Realtime API's server events as the SDK parses
them, ids by relation), ``webrtc`` (an aiortc caller for ``/v1/realtime/calls``: microphone, data
channel, the answer track recorded, Whisper to hear it), ``page_frames`` (Chromium with fake
media, for the browser tests and benches) and ``openai_fault_server`` (daphne with a failing engine
client, run as a script).
Test modules import from here, never from one another or from ``conftest``
(tests/test_suite_layout.py checks it); ``tests/`` is on ``sys.path`` under pytest (and the benches
put it there), so these are imported as ``support.<module>``.
"""
