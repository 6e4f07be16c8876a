"""Our voice for the tests: hibari's raw network outputs, a sentence said as the wire carries a
spoken question (``spoken``: PCM16 16 kHz), and a TTS request run on a scheduler of its own."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from hibari import Hibari
from scipy.signal import resample_poly

from omniweb.engine.messages import Chunk, End, to_wire
from omniweb.engine.requests import SpeakRequest
from omniweb.engine.scheduler import Scheduler
from speech.tts.loops import PIPELINE, TtsPipeline


def hibari_network_outputs(sentences: list[str]) -> list[tuple[Any, ...]]:
    """hibari's real network outputs (lh, th, ln, lr, phi, f0) for each sentence's first segment."""
    import numpy as np
    from hibari import Hibari

    t = Hibari()
    res = []
    for text in sentences:
        ids = np.asarray([t.ids(t.phonemize(text)[0])], np.int64)
        out = t.sess.run(None, {"ids": ids, "speed": np.asarray([1.0], np.float32)})
        res.append(tuple(o[0] for o in out[:6]))
    return res


def spoken(text: str, voice: Hibari | None = None, seed: int = 7) -> bytes:
    """``text`` said by hibari (24 kHz), as the wire carries a question: PCM16 LE 16 kHz mono."""
    wave = (voice or Hibari())(text, seed=seed)
    pcm = np.clip(resample_poly(wave, 2, 3), -1.0, 1.0)
    return (pcm * 32767.0).astype("<i2").tobytes()


def synthesize(pipeline: TtsPipeline, workers: int = 2, **request: Any) -> list[dict[str, Any]]:
    """A ``SpeakRequest`` of ``request``'s fields run to its end; its chunks in their wire form."""
    sched = Scheduler({PIPELINE: pipeline}, workers=workers)
    sched.start()
    chunks: list[dict[str, Any]] = []
    ended = threading.Event()

    def sink(chunk: Chunk) -> None:
        chunks.append(to_wire(chunk))
        if isinstance(chunk, End):
            ended.set()

    try:
        sched.submit("r", SpeakRequest(**request), sink)
        assert ended.wait(30)
    finally:
        sched.stop()
    return chunks
