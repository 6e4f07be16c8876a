"""Streaming vocoder vs hibari.dsp.synth on real network output.

Chunked (and batched) audio must equal the one-shot audio for the same noise draw.
"""

from __future__ import annotations

import numpy as np
import pytest
from hibari import dsp
from support.voice import hibari_network_outputs

from speech.tts.vocoder import (
    HOP,
    N_BINS,
    NUMPY_BACKEND,
    SAMPLE_RATE,
    AcousticFrames,
    VocoderStream,
    draw_noise,
    run_chunks_batched,
)

SENTENCES = [
    "Hello there.",
    "This is a longer second sentence, with a comma, and more words to stretch it.",
    "Is it working?",
]
TOL = 1e-4


@pytest.fixture(scope="module")
def outputs() -> list[tuple[np.ndarray, ...]]:
    """Real network outputs (lh, th, ln, lr, phi, f0), one tuple per sentence."""
    return hibari_network_outputs(SENTENCES)


def make_frames(arrs: tuple[np.ndarray, ...], seed: int) -> AcousticFrames:
    return AcousticFrames(*arrs, noise=draw_noise(np.random.default_rng(seed), arrs[5].shape[0]))


def reference(arrs: tuple[np.ndarray, ...], seed: int) -> np.ndarray:
    return dsp.synth(*arrs, np.random.default_rng(seed))


def vocode(stream: VocoderStream, sizes: list[int]) -> list[np.ndarray]:
    """Run the stream to the end; chunk i has sizes[i] frames (last size repeats)."""
    parts, i = [], 0
    while not stream.done:
        start, stop = stream.plan(sizes[min(i, len(sizes) - 1)])
        parts.append(stream.run_chunk(start, stop))
        i += 1
    return parts


def test_constants() -> None:
    assert (N_BINS, HOP, SAMPLE_RATE) == (601, 300, 24000)


def test_draw_noise_consumes_rng_like_synth(
    outputs: list[tuple[np.ndarray, ...]],
) -> None:
    arrs = outputs[0]
    f = arrs[5].shape[0]
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    z = draw_noise(a, f)
    dsp.synth(*arrs, b)
    assert z.shape == (N_BINS, f) and z.dtype == np.complex64
    assert a.random() == b.random()  # same amount drawn: the next sentence gets the same noise too


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 16, None])
@pytest.mark.parametrize("idx", [0, 1])
def test_chunked_equals_synth(outputs: list[tuple[np.ndarray, ...]], idx: int, chunk: int | None) -> None:
    arrs = outputs[idx]
    f = arrs[5].shape[0]
    ref = reference(arrs, seed=11)
    stream = VocoderStream(make_frames(arrs, seed=11))
    parts = vocode(stream, [chunk or f])
    assert sum(len(p) for p in parts) == f * HOP == len(ref)
    assert all(p.dtype == np.float32 for p in parts)
    got = np.concatenate(parts)
    assert np.abs(got - ref).max() < TOL
    assert stream.done and stream.next_frame == f


@pytest.mark.parametrize("sizes", [[1, 16], [2, 7], [5, 3], [20, 16]])
def test_different_first_chunk(outputs: list[tuple[np.ndarray, ...]], sizes: list[int]) -> None:
    arrs = outputs[1]
    ref = reference(arrs, seed=5)
    got = np.concatenate(vocode(VocoderStream(make_frames(arrs, seed=5)), sizes))
    assert len(got) == len(ref)
    assert np.abs(got - ref).max() < TOL


def test_returned_samples_are_exactly_the_final_ones(
    outputs: list[tuple[np.ndarray, ...]],
) -> None:
    """After frames < stop < F exactly (stop-2)*300 samples are out; the end flushes."""
    arrs = outputs[1]
    f = arrs[5].shape[0]
    stream = VocoderStream(make_frames(arrs, seed=0))
    total = 0
    while not stream.done:
        start, stop = stream.plan(3)
        total += len(stream.run_chunk(start, stop))
        assert total == (f * HOP if stop == f else max(0, stop - 2) * HOP)


def test_audio_not_silent(outputs: list[tuple[np.ndarray, ...]]) -> None:
    for arrs in outputs:
        got = np.concatenate(vocode(VocoderStream(make_frames(arrs, seed=2)), [16]))
        assert float(np.sqrt(np.mean(got.astype(np.float64) ** 2))) > 0.01


def test_frames_not_mutated(outputs: list[tuple[np.ndarray, ...]]) -> None:
    frames = make_frames(outputs[0], seed=4)
    before = {k: getattr(frames, k).copy() for k in ("lh", "th", "ln", "lr", "phi", "f0", "noise")}
    vocode(VocoderStream(frames), [1])
    for k, v in before.items():
        assert np.array_equal(getattr(frames, k), v), k


@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_batched_equals_unbatched(outputs: list[tuple[np.ndarray, ...]], chunk: int) -> None:
    seeds = range(len(outputs))
    single = [
        np.concatenate(vocode(VocoderStream(make_frames(a, s)), [chunk])) for a, s in zip(outputs, seeds, strict=True)
    ]
    streams = [VocoderStream(make_frames(a, s)) for a, s in zip(outputs, seeds, strict=True)]
    parts: list[list[np.ndarray]] = [[] for _ in streams]
    while not all(s.done for s in streams):
        live = [i for i, s in enumerate(streams) if not s.done]
        res = run_chunks_batched([(streams[i], *streams[i].plan(chunk)) for i in live])
        for i, r in zip(live, res, strict=True):
            parts[i].append(r)
    for one, p, arrs, s in zip(single, parts, outputs, seeds, strict=True):
        got = np.concatenate(p)
        assert np.array_equal(got, one)
        assert np.abs(got - reference(arrs, s)).max() < TOL


def test_batched_mixed_chunk_lengths(outputs: list[tuple[np.ndarray, ...]]) -> None:
    streams = [VocoderStream(make_frames(a, 9)) for a in outputs[:2]]
    first = run_chunks_batched([(streams[0], 0, 3), (streams[1], 0, 8)])
    assert [len(x) for x in first] == [1 * HOP, 6 * HOP]
    rest = [vocode(s, [5]) for s in streams]
    for arrs, a, b in zip(outputs[:2], first, rest, strict=True):
        got = np.concatenate([a, *b])
        assert np.abs(got - reference(arrs, 9)).max() < TOL


@pytest.mark.parametrize("f", [1, 2, 3, 4, 5])
def test_short_segments(outputs: list[tuple[np.ndarray, ...]], f: int) -> None:
    lh, th, ln, lr, phi, f0 = outputs[1]
    arrs = (
        *(x[:, 30 : 30 + f].copy() for x in (lh, th, ln, lr, phi)),
        f0[30 : 30 + f].copy(),
    )
    ref = reference(arrs, seed=1)
    for chunk in (1, 2, f):
        got = np.concatenate(vocode(VocoderStream(make_frames(arrs, seed=1)), [chunk]))
        assert len(got) == f * HOP
        assert np.abs(got - ref).max() < TOL


def test_empty_segment() -> None:
    e = np.zeros((N_BINS, 0), np.float32)
    frames = AcousticFrames(e, e, e, e, e, np.zeros(0, np.float32), draw_noise(np.random.default_rng(0), 0))
    stream = VocoderStream(frames)
    assert frames.n_frames == 0 and stream.done
    assert stream.plan(4) == (0, 0)
    assert stream.run_chunk(0, 0).shape == (0,)
    assert run_chunks_batched([]) == []


def test_misuse_raises(outputs: list[tuple[np.ndarray, ...]]) -> None:
    frames = make_frames(outputs[0], seed=0)
    stream = VocoderStream(frames)
    with pytest.raises(ValueError):
        stream.run_chunk(1, 3)  # skips frame 0
    with pytest.raises(ValueError):
        stream.run_chunk(0, frames.n_frames + 1)
    with pytest.raises(ValueError):
        run_chunks_batched([(stream, 0, 2), (stream, 0, 2)])
    with pytest.raises(ValueError):
        AcousticFrames(*outputs[0][:5], outputs[0][5][:-1], frames.noise)
    assert stream.next_frame == 0


@pytest.mark.parametrize("chunk", [1, 6, 16, None])
def test_numpy_backend_bit_identical_to_synth(outputs: list[tuple[np.ndarray, ...]], chunk: int | None) -> None:
    """The default (numpy) backend, passed explicitly or not, reproduces synth exactly."""
    arrs = outputs[1]
    ref = reference(arrs, seed=13)
    for backend in (None, NUMPY_BACKEND):
        stream = VocoderStream(make_frames(arrs, seed=13))
        parts = []
        while not stream.done:
            parts.append(stream.run_chunk(*stream.plan(chunk or arrs[5].shape[0]), backend=backend))
        assert np.array_equal(np.concatenate(parts), ref)


@pytest.mark.parametrize("chunks", [(1,), (6, 16), (1000,)])
def test_noise_drawn_per_chunk_does_not_depend_on_the_chunking(outputs, chunks):
    """Unseeded requests: the noise comes frame-major from the request's generator as each chunk
    runs; the audio is exactly what noise drawn up front in that order gives, however it is cut."""
    arrs = outputs[1]
    n = arrs[5].shape[0]
    upfront = np.random.default_rng(9).standard_normal((n, 2 * N_BINS), dtype=np.float32).view(np.complex64)
    expected = VocoderStream(AcousticFrames(*arrs, noise=np.ascontiguousarray(upfront.T))).run_chunk(0, n)
    stream = VocoderStream(AcousticFrames(*arrs), noise_rng=np.random.default_rng(9))
    assert stream.frames.noise is None
    parts, sizes = [], iter(chunks)
    size = next(sizes)
    while not stream.done:
        parts.append(stream.run_chunk(*stream.plan(size)))
        size = next(sizes, size)
    assert np.array_equal(np.concatenate(parts), expected)


def test_frames_without_noise_need_a_generator(outputs):
    with pytest.raises(ValueError, match="without noise"):
        VocoderStream(AcousticFrames(*outputs[0]))
