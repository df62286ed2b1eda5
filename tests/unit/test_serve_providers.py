"""ONNX Runtime's GPU execution providers as we run them: the CUDA EP with TF32 off (its `use_tf32`
defaults on, and fp32 GEMMs in TF32 miss the fp32 tolerance, so the engine would be called "differs
from eager" and never timed), the TensorRT EP (TF32 on by design) judged at a TF32 tolerance it names."""

from __future__ import annotations

import types

import numpy as np
import pytest

from overdrive.serve.engines import ATOL, RTOL, TF32_ATOL, TF32_RTOL, Engine, _ort_providers, check_engines


def _tf32(x: np.ndarray) -> np.ndarray:
    """Round fp32 to TF32's 10-bit mantissa (to nearest, as cuBLAS converts the inputs)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def test_gpu_providers_run_fp32_or_say_tf32(monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    got = {p.name: p for p in _ort_providers(types.SimpleNamespace(has_gpu=True))}
    cuda = got["onnxruntime-cuda"]
    assert cuda.providers[0] == ("CUDAExecutionProvider", {"use_tf32": "0"}) and cuda.tolerance is None
    assert "use_tf32=0" in cuda.label
    trt = got["onnxruntime-tensorrt"]
    assert trt.tolerance and trt.tolerance[:2] == (TF32_ATOL, TF32_RTOL) and "TF32" in trt.label
    assert ("CUDAExecutionProvider", {"use_tf32": "0"}) in trt.providers  # its fallback nodes in fp32 too
    assert [p.name for p in _ort_providers(types.SimpleNamespace(has_gpu=False))] == ["onnxruntime"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_tf32_engine_passes_only_at_the_tolerance_it_names(seed):
    """A click-model-sized MLP (256 -> 512 -> 1) in fp32 and with TF32 inputs: TF32 misses the fp32
    tolerance (the defect: an engine 'differing' from eager), and lies inside the TF32 one."""
    rng = np.random.default_rng(seed)
    w1, w2 = rng.standard_normal((256, 512), np.float32) / 16, rng.standard_normal((512, 1), np.float32) / 22
    xs = {b: rng.standard_normal((b, 256), np.float32) for b in (1, 64)}

    def mlp(x, cast=lambda a: a):
        h = np.maximum(cast(x) @ cast(w1), 0).astype(np.float32)
        return [cast(h) @ cast(w2)]

    def engines(tolerance):
        tf = Engine("onnxruntime-tensorrt", "TRT", lambda b: mlp(xs[b], _tf32))
        if tolerance:
            tf.meta["tolerance"] = {"atol": TF32_ATOL, "rtol": TF32_RTOL, "why": "TF32"}
        return [Engine("eager", "eager", lambda b: mlp(xs[b])), tf]

    plain = engines(tolerance=False)
    check_engines(plain, [1, 64])
    assert plain[1].status == "failed" and f"{ATOL:g} + {RTOL:g}" in plain[1].reason
    named = engines(tolerance=True)
    check_engines(named, [1, 64])
    assert named[1].status == "ok", named[1].reason
    assert ATOL < named[1].meta["max_abs_error_vs_eager"] < 10 * TF32_ATOL
