"""requirements-gpu.txt is requirements.txt with the GPU builds swapped in, and stays so."""

from __future__ import annotations

from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
SWAPPED = {"onnxruntime": "onnxruntime-gpu"}  # CPU package → its GPU build (same module, same versions)


def requirements(name: str) -> dict[str, Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in (REPO / name).read_text().splitlines())
    reqs = [Requirement(line) for line in lines if line and not line.startswith("-")]
    return {r.name.lower(): r for r in reqs}


def test_the_gpu_requirements_are_the_default_ones_with_the_gpu_builds():
    cpu, gpu = requirements("requirements.txt"), requirements("requirements-gpu.txt")
    expected = {SWAPPED.get(name, name) for name in cpu}
    assert set(gpu) == expected, f"missing: {expected - set(gpu)}; extra: {set(gpu) - expected}"
    for name, req in cpu.items():
        twin = gpu[SWAPPED.get(name, name)]
        assert twin.specifier == req.specifier, f"{name}: {req.specifier} vs {twin.name} {twin.specifier}"
        assert twin.marker == req.marker
    assert gpu["onnxruntime-gpu"].extras == {"cuda", "cudnn"}
    assert str(cpu["torch"].specifier) == "==2.13.0"  # the build the project's machines carry
