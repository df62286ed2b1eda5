"""tune's measured per-layer FP8 filter on a real FP8 GPU (torchao): timings, decisions, application."""

import pytest
import torch

import overdrive
from overdrive.env import get_env
from overdrive.models import GPT, gpt_config
from overdrive.recipes import Recipe
from overdrive.tuning.fp8_filter import bench_linear, linear_sites, measure_filter

pytestmark = pytest.mark.gpu


def _fp8_env():
    env = get_env()
    if not env.gpus or not env.gpus[0].capabilities["fp8"] or not env.engine_ok("torchao"):
        pytest.skip("needs an FP8 GPU (SM >= 8.9) with torchao")
    return env


def test_fp8_filter_times_each_shape_of_a_gpt_and_decides_per_layer():
    _fp8_env()
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", n_embd=1024, n_head=8, n_layer=2, block_size=512, vocab_size=4096)).cuda()
    x = torch.randint(0, 4096, (8, 512), device="cuda")
    sites = linear_sites(model, lambda: model(x))
    # Eager: this checks the filter's plumbing on CUDA; compiling 8 shape x mode pairs costs minutes of
    # the GPU check's lease (its tune step times candidates compiled).
    res = measure_filter(sites, bench=lambda m, k, n, fp8: bench_linear(
        m, k, n, fp8, backend="torchao", scaling="tensorwise", compile=False, device="cuda"))
    timed = [d for d in res.layers if d["bf16_ms"] is not None]
    assert timed and all(d["bf16_ms"] > 0 and d["fp8_ms"] > 0 for d in timed)
    for d in res.layers:
        print(f"{d['fqn']:24s} {d['shape']:>10s} M={d['tokens']:5d} {d['reason']}")
    conv = {d["shape"] for d in res.layers if d["convert"]}
    assert set(filter(None, res.shapes.split(","))) == conv


def test_tuned_fp8_shapes_convert_exactly_those_layers_on_gpu():
    env = _fp8_env()
    model = GPT(gpt_config("tiny", n_embd=1024, n_head=8, n_layer=2, block_size=256, vocab_size=4096))
    rec = Recipe(name="fp8+filter", precision="fp8", fp8_backend="torchao", fp8_shapes="1024x4096")
    acc = overdrive.accelerate(model, rec, env=env)
    conv = {d.fqn for d in acc.conversions["fp8"] if d.converted}
    assert conv and all(f.endswith(".fc") for f in conv), conv  # only the 1024x4096 MLP up-projections
    x = torch.randint(0, 4096, (4, 257), device="cuda")
    with acc.autocast():
        _, loss = acc.model(x[:, :-1], x[:, 1:])
    acc.backward(loss)
    acc.step()
    assert torch.isfinite(loss)
