#!/usr/bin/env python
"""Does a talker batched across sessions pay on this machine? Single vs batched ONNX runs, side by side.

hibari's exported graph declares ``ids`` as ``[1, L]`` and builds 40 of its reshape/expand shapes
from a constant batch of 1 (``/Reshape_17`` is the first to fail with a larger batch). Here the
graph is patched in memory (``onnx``): those shapes take the batch from ``Shape(ids)[0]`` and the
inputs/outputs get a symbolic batch dimension. The batch is B copies of one sentence's ids (equal
lengths, so no padding or masks are needed: the most favourable case a padded batch could reach),
with one ``speed`` for the whole batch (the graph divides ``[B, L]`` durations by ``speed``).

Checks, then prints: every batched output equals the single run's outputs bit for bit, and the
thread CPU per sequence of a B-sequence run next to one single-sequence run, both on one
onnxruntime thread, alternating, median of ``--repeats``. Batching pays where the per-sequence
figure drops well below the single run's.

Also noted (not measured here): the graph quantizes each MatMul's input dynamically per tensor
(77 ``DynamicQuantizeLinear``), so in a batch of *different* sequences each sequence's
quantization scale would follow the batch's range: outputs would no longer equal the single runs.

Usage (repository root, venv active)::

    python bench/talker_batch.py [--batches 1,2,4,8] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TEXT = "Streaming speech should never stall."  # the burst's first sentence (bench/speech_latency.py)


def batched_model(path: Path) -> bytes:
    """hibari's graph with the batch taken from ``ids`` instead of the constant 1 (in memory)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(path)
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)

    def scalar_one(name: str) -> bool:
        node = producer.get(name)
        if node is None or node.op_type != "Constant":
            return False
        value = numpy_helper.to_array(node.attribute[0].t)
        return value.shape == () and int(value) == 1

    graph.node.insert(0, helper.make_node("Shape", ["ids"], ["batch_shape"]))
    graph.node.insert(1, helper.make_node("Constant", [], ["batch_axis"], value=numpy_helper.from_array(np.int64(0))))
    graph.node.insert(2, helper.make_node("Gather", ["batch_shape", "batch_axis"], ["batch_size"], axis=0))
    patched = 0
    for node in graph.node:
        if node.op_type != "Concat":
            continue
        first = producer.get(node.input[0])
        shape_users = users.get(node.output[0], [])
        if (
            first is not None
            and first.op_type == "Unsqueeze"
            and scalar_one(first.input[0])
            and shape_users
            and all(u.op_type in ("Reshape", "Expand", "ConstantOfShape", "Tile") for u in shape_users)
        ):
            first.input[0] = "batch_size"
            patched += 1
    for value in [*graph.input, *graph.output]:
        if value.name != "speed" and value.type.tensor_type.shape.dim:
            value.type.tensor_type.shape.dim[0].dim_param = "B"
    print(f"- shapes patched to take the batch from `ids`: {patched}")
    return model.SerializeToString()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omniweb.settings")
    import django

    django.setup()
    import onnxruntime as ort
    from hibari import Hibari, voices

    from speech.tts.model import capabilities
    from speech.tts.text import model_text

    voice = capabilities().default_voice
    path = voices.voice_path(voice, download_missing=False)
    hib = Hibari(voice=voice, model=path)
    ids = hib.ids(hib.phonemize(model_text(TEXT))[0])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    print(f"## Talker: single vs batched runs of {TEXT!r} ({len(ids)} ids), 1 onnxruntime thread\n")
    print(f"- machine: {os.cpu_count()} CPUs, load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    single = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    batched = ort.InferenceSession(batched_model(path), opts, providers=["CPUExecutionProvider"])
    speed = np.asarray([1.0], np.float32)
    one = {"ids": np.asarray([ids], np.int64), "speed": speed}
    reference = single.run(None, one)
    print(f"- frames per sequence: {reference[0].shape[-1]}\n")
    print("| batch B | outputs equal the single run | CPU ms per sequence, batched | CPU ms, single run | ratio |")
    print("|---:|---|---:|---:|---:|")
    ok = True
    for b in (int(x) for x in args.batches.split(",")):
        feed = {"ids": np.asarray([ids] * b, np.int64), "speed": speed}
        out = batched.run(None, feed)
        equal = all(np.array_equal(out[k][i], reference[k][0]) for k in range(len(reference)) for i in range(b))
        ok &= equal
        per_seq, alone = [], []
        for _ in range(args.repeats):
            t0 = time.thread_time()
            batched.run(None, feed)
            per_seq.append((time.thread_time() - t0) / b)
            t0 = time.thread_time()
            single.run(None, one)
            alone.append(time.thread_time() - t0)
        p, s = statistics.median(per_seq), statistics.median(alone)
        print(f"| {b} | {'yes' if equal else 'NO'} | {p * 1000:.2f} | {s * 1000:.2f} | {p / s:.2f}× |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
