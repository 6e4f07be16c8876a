"""The torch backend of the vocoder's spectral step vs the numpy backend, on real network output.

Same chunks, same noise: the audio must match to float32 rounding (torch's FFT and
transcendentals round differently from scipy's, so not bit for bit), with identical lengths.
"""

from __future__ import annotations

import numpy as np
import pytest
from hibari import dsp
from support.voice import hibari_network_outputs

from speech.tts.vocoder import (
    HOP,
    NUMPY_BACKEND,
    AcousticFrames,
    VocoderStream,
    draw_noise,
    run_chunks_batched,
)

torch = pytest.importorskip("torch")
from speech.tts.vocoder_torch import TorchBackend  # noqa: E402

SENTENCES = [
    "Hello there.",
    "This is a longer second sentence, with a comma, and more words to stretch it.",
    "Is it working?",
    "The birch canoe slid on the smooth planks.",
]
TOL = 1e-4
MAX_DIFF: dict[str, float] = {}  # largest difference seen per test, printed at the end (pytest -s)


def _devices() -> list[object]:
    cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda.is_available() is False")
    return ["cpu", pytest.param("cuda", marks=cuda)]


@pytest.fixture(scope="module")
def outputs() -> list[tuple[np.ndarray, ...]]:
    """Real network outputs (lh, th, ln, lr, phi, f0), one tuple per sentence."""
    return hibari_network_outputs(SENTENCES)


@pytest.fixture(scope="module", params=_devices())
def backend(request: pytest.FixtureRequest) -> TorchBackend:
    return TorchBackend(request.param)


@pytest.fixture(scope="module", autouse=True)
def _report() -> object:
    yield
    if MAX_DIFF:
        print("\nmax abs diff torch vs numpy:", ", ".join(f"{k} {v:.2e}" for k, v in sorted(MAX_DIFF.items())))


def make_frames(arrs: tuple[np.ndarray, ...], seed: int) -> AcousticFrames:
    return AcousticFrames(*arrs, noise=draw_noise(np.random.default_rng(seed), arrs[5].shape[0]))


def vocode_batched(frames: list[AcousticFrames], chunk: int, backend: object | None) -> list[list[np.ndarray]]:
    """Run all streams to the end, one batch per round holding every live stream's next chunk."""
    streams = [VocoderStream(f) for f in frames]
    parts: list[list[np.ndarray]] = [[] for _ in streams]
    while not all(s.done for s in streams):
        live = [i for i, s in enumerate(streams) if not s.done]
        res = run_chunks_batched([(streams[i], *streams[i].plan(chunk)) for i in live], backend)
        for i, r in zip(live, res, strict=True):
            parts[i].append(r)
    return parts


def compare(name: str, got: list[list[np.ndarray]], ref: list[list[np.ndarray]]) -> float:
    """Chunk for chunk: same lengths and dtype, values within TOL; returns the max abs diff."""
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        assert [len(x) for x in g] == [len(x) for x in r]
        assert all(x.dtype == np.float32 for x in g)
        if sum(len(x) for x in r):
            worst = max(worst, float(np.abs(np.concatenate(g) - np.concatenate(r)).max()))
    MAX_DIFF[name] = max(MAX_DIFF.get(name, 0.0), worst)
    assert worst < TOL, f"{name}: max abs diff {worst:.3e}"
    return worst


@pytest.mark.parametrize("chunk", [1, 3, 6, 16, 1000])
def test_batched_streams_match_numpy(outputs: list[tuple[np.ndarray, ...]], backend: TorchBackend, chunk: int) -> None:
    frames = [make_frames(a, seed) for seed, a in enumerate(outputs)]
    ref = vocode_batched(frames, chunk, None)
    got = vocode_batched(frames, chunk, backend)
    compare(f"{backend.device.type} batch of {len(frames)} chunk {chunk}", got, ref)
    for f, g in zip(frames, got, strict=True):
        assert sum(len(x) for x in g) == f.n_frames * HOP


@pytest.mark.parametrize("chunk", [1, 16])
def test_single_stream_matches_synth(outputs: list[tuple[np.ndarray, ...]], backend: TorchBackend, chunk: int) -> None:
    arrs = outputs[1]
    ref = dsp.synth(*arrs, np.random.default_rng(7))
    stream = VocoderStream(make_frames(arrs, seed=7))
    parts = []
    while not stream.done:
        parts.append(stream.run_chunk(*stream.plan(chunk), backend=backend))
    got = np.concatenate(parts)
    assert len(got) == len(ref)
    assert np.abs(got - ref).max() < TOL


def test_mixed_chunk_lengths_in_one_batch(outputs: list[tuple[np.ndarray, ...]], backend: TorchBackend) -> None:
    frames = [make_frames(a, 3) for a in outputs]
    sizes = [1, 5, 8, 16]
    got, ref = [], []
    for be, out in ((backend, got), (NUMPY_BACKEND, ref)):
        streams = [VocoderStream(f) for f in frames]
        out.extend([w] for w in run_chunks_batched([(s, 0, n) for s, n in zip(streams, sizes, strict=True)], be))
    compare(f"{backend.device.type} mixed lengths", got, ref)


@pytest.mark.parametrize("f", [1, 2, 3, 4, 5])
def test_short_segments(outputs: list[tuple[np.ndarray, ...]], backend: TorchBackend, f: int) -> None:
    lh, th, ln, lr, phi, f0 = outputs[1]
    arrs = (*(x[:, 30 : 30 + f].copy() for x in (lh, th, ln, lr, phi)), f0[30 : 30 + f].copy())
    frames = [make_frames(arrs, seed) for seed in range(3)]
    for chunk in sorted({1, 2, f}):
        got = vocode_batched(frames, chunk, backend)
        compare(f"{backend.device.type} F={f}", got, vocode_batched(frames, chunk, None))
        assert all(sum(len(x) for x in g) == f * HOP for g in got)


def test_frames_not_mutated(outputs: list[tuple[np.ndarray, ...]], backend: TorchBackend) -> None:
    """The backend works in place on its own stacked copies, never on the caller's arrays."""
    frames = make_frames(outputs[2], seed=4)
    names = ("lh", "th", "ln", "lr", "phi", "f0", "noise")
    before = {k: getattr(frames, k).copy() for k in names}
    vocode_batched([frames], 1, backend)
    vocode_batched([frames], 1000, backend)
    for k in names:
        assert np.array_equal(getattr(frames, k), before[k]), k


def test_single_frame_segment_not_mutated(outputs: list[tuple[np.ndarray, ...]], backend: TorchBackend) -> None:
    """F=1: a one-frame slice is already contiguous, so a gather that returned a view would hand
    the backend the caller's memory."""
    arrs = (*(x[:, :1].copy() for x in outputs[0][:5]), outputs[0][5][:1].copy())
    frames = make_frames(arrs, seed=0)
    before = {k: getattr(frames, k).copy() for k in ("lh", "th", "ln", "lr", "phi", "noise")}
    vocode_batched([frames], 1, backend)
    for k, v in before.items():
        assert np.array_equal(getattr(frames, k), v), k


def test_empty_and_done_items(outputs: list[tuple[np.ndarray, ...]], backend: TorchBackend) -> None:
    stream = VocoderStream(make_frames(outputs[0], 0))
    assert run_chunks_batched([], backend) == []
    assert run_chunks_batched([(stream, 0, 0)], backend)[0].shape == (0,)


def test_cuda_unavailable_is_a_clear_value_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="not available"):
        TorchBackend("cuda")
    with pytest.raises(ValueError, match="not available"):
        TorchBackend("cuda:0")


def test_bad_device_strings() -> None:
    with pytest.raises(ValueError, match="not a torch device"):
        TorchBackend("gpu")
    with pytest.raises(ValueError, match="not available"):
        TorchBackend("meta")  # parses, but cannot hold data
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="not available"):
            TorchBackend(f"cuda:{torch.cuda.device_count()}")


def test_repr_and_device() -> None:
    be = TorchBackend("cpu")
    assert be.device == torch.device("cpu")
    assert repr(be) == "TorchBackend('cpu')"


def test_numpy_path_does_not_import_torch() -> None:
    """vocoder.py must not need torch: import it in a fresh interpreter and check."""
    import subprocess
    import sys

    code = "import sys, speech.tts.vocoder; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_streams_keep_their_state_on_the_device_until_done(
    outputs: list[tuple[np.ndarray, ...]], backend: TorchBackend
) -> None:
    """A segment goes to the device once, at its first chunk; its state is freed with its last."""
    streams = [VocoderStream(make_frames(a, seed)) for seed, a in enumerate(outputs)]
    run_chunks_batched([(s, *s.plan(6)) for s in streams], backend)
    states = [s.device_state for s in streams]
    assert all(st is not None and st.lh.device == backend.device for st in states)
    run_chunks_batched([(s, *s.plan(16)) for s in streams], backend)
    assert all(s.device_state is st for s, st in zip(streams, states, strict=True))  # kept, not uploaded again
    while not all(s.done for s in streams):
        run_chunks_batched([(s, *s.plan(16)) for s in streams if not s.done], backend)
    assert all(s.device_state is None for s in streams)


def test_noise_drawn_on_the_device_for_unseeded_streams(outputs: list[tuple[np.ndarray, ...]], backend: TorchBackend):
    """Frames without noise: the device draws it per chunk; the audio has the numpy path's length
    and loudness (a different draw, the same distribution)."""
    arrs = outputs[3]
    got = [VocoderStream(AcousticFrames(*arrs), noise_rng=np.random.default_rng(s)) for s in range(2)]
    ref = VocoderStream(AcousticFrames(*arrs), noise_rng=np.random.default_rng(0))
    waves = [np.concatenate(vocode_stream(s, backend)) for s in got]
    wave_ref = np.concatenate(vocode_stream(ref, None))
    assert all(w.shape == wave_ref.shape for w in waves)
    assert not np.array_equal(waves[0], waves[1])  # each stream its own noise
    rms = [float(np.sqrt(np.mean(w**2))) for w in (*waves, wave_ref)]
    assert max(rms) < 1.1 * min(rms)


def vocode_stream(stream: VocoderStream, backend: object | None) -> list[np.ndarray]:
    parts = []
    while not stream.done:
        parts.append(run_chunks_batched([(stream, *stream.plan(16))], backend)[0])
    return parts
