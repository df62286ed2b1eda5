"""FLOPs counted on the user's model (FlopCounterMode over one forward+backward): the reference GPT's
6N + 12LHQT formula as the cross-check, the meta -> CPU fallback, MFU against the peak of the
precision that ran, and tune's rows and report line."""

import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from overdrive.bench.flops import flops_per_token
from overdrive.env.catalog import gpu_by_key
from overdrive.measure.flop_count import FlopCount, peak_for, rates
from overdrive.models.gpt import GPT, gpt_config
from overdrive.tuning.flops import add_rates, count_step_flops, flops_line


def _gpt_step(cfg, B):
    T = cfg.block_size

    def model_fn():
        return GPT(cfg)

    def batch_fn(step):
        x = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(step))
        return x[:, :-1], x[:, 1:]

    def loss_fn(m, b):
        return m(b[0], b[1])[1]

    return model_fn, batch_fn, loss_fn


@pytest.mark.parametrize("size,overrides,B", [("tiny", {}, 2), ("cpu-student", {"bias": False}, 3),
                                              ("tiny", {"tie_embeddings": False, "norm": "rmsnorm"}, 1)])
def test_counted_flops_are_the_reference_gpt_formula(size, overrides, B):
    cfg = gpt_config(size, **overrides)
    T, L, H, Q = cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head
    fc = count_step_flops(*_gpt_step(cfg, B))
    assert fc.how == "meta" and fc.note == ""
    # Exactly 6 x the matmul weights (the head too, tied or not) + 12LHQT per token: the counter sees the
    # matmuls, not the biases and norm weights that 6N also counts.
    model = GPT(cfg)
    n_matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert fc.flops == (6 * n_matmul + 12 * L * H * Q * T) * B * T
    # ... and within 2% of the formula as bench reports it (6N with N the non-embedding parameters).
    ref = flops_per_token(cfg.n_params(), L, H, Q, T) * B * T
    assert 0.98 * ref < fc.flops <= ref


class _NeedsRealValues(nn.Module):
    """A forward that reads a value (.item()): cannot run on the meta device."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(12, 20), nn.Linear(20, 3)

    def forward(self, x):
        h = self.a(x)
        if h.abs().max().item() > 1e9:
            h = h / 2
        return self.b(torch.relu(h)).square().mean()


def _item_model():
    return _NeedsRealValues()


def _item_batch(step):
    return torch.randn(7, 12)


def test_a_model_that_cannot_run_on_meta_is_counted_on_the_cpu_and_says_so():
    state = torch.random.get_rng_state()
    fc = count_step_flops(_item_model, _item_batch)
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's RNG is untouched
    assert fc.how == "cpu" and "meta failed" in fc.note
    # forward 2*7*12*20 + 2*7*20*3, backward: dX and dW for b, only dW for a (its input needs no grad)
    fwd_a, fwd_b = 2 * 7 * 12 * 20, 2 * 7 * 20 * 3
    assert fc.flops == fwd_a + fwd_b + fwd_a + 2 * fwd_b
    assert count_step_flops(_item_model, _item_batch, cpu_fallback=False).flops is None


def test_nothing_countable_is_said_not_zero():
    fc = count_step_flops(lambda: nn.Sequential(nn.ReLU()), lambda s: torch.randn(4, requires_grad=True),
                          lambda m, b: m(b).sum())
    assert fc.flops is None and fc.how == "not counted" and "no matmul" in fc.note


def test_mfu_is_against_the_peak_of_the_precision_that_ran():
    h100 = gpu_by_key("h100-sxm")
    f = 2e12  # 2 TFLOP per step, 10 ms: 200 TFLOP/s
    bf = rates(int(f), 10.0, precision="bf16", spec=h100)
    assert bf["tflops"] == pytest.approx(200) and bf["mfu"] == pytest.approx(200 / h100.bf16_tflops)
    assert "BF16" in bf["mfu_peak"] and h100.name in bf["mfu_peak"]
    f8 = rates(int(f), 10.0, precision="fp8", spec=h100)
    assert f8["mfu"] == pytest.approx(200 / h100.fp8_tflops) and f8["mfu_bf16_peak"] == pytest.approx(bf["mfu"])
    assert rates(int(f), 10.0, precision="fp32", spec=h100)["mfu"] == pytest.approx(200 / h100.fp32_tflops)
    a100 = gpu_by_key("a100-80")
    assert peak_for("fp8", a100)[0] == a100.bf16_tflops  # no FP8 units: FP8 recipes fall back to bf16 GEMMs
    emu = rates(int(f), 10.0, precision="fp8", spec=h100, emulated=True)
    assert emu["tflops"] == pytest.approx(200) and emu["mfu"] is None
    cpu = rates(int(f), 10.0, precision="fp32", spec=None)
    assert cpu["tflops"] == pytest.approx(200) and cpu["mfu"] is None
    assert rates(None, 10.0, precision="bf16", spec=h100)["tflops"] is None


def test_tune_rows_carry_counted_rates_and_the_report_line():
    fc = FlopCount(flops=3_000_000_000, how="meta", by_op={"mm": 3_000_000_000})
    rows = [{"name": "baseline", "step_ms": 30.0, "emulated": False, "resolved": {"precision": "fp32"}},
            {"name": "amp-bf16", "step_ms": 10.0, "emulated": False, "resolved": {"precision": "bf16"}},
            {"name": "fp8", "step_ms": 50.0, "emulated": True, "resolved": {"precision": "fp8"}},
            {"name": "x", "step_ms": None, "emulated": False, "resolved": {"precision": "bf16"}}]
    gpu = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3")
    add_rates(rows, fc, types.SimpleNamespace(gpus=[gpu]))
    assert rows[1]["tflops"] == pytest.approx(0.3) and rows[1]["mfu"] == pytest.approx(0.3 / 989)
    assert rows[0]["tflops"] == pytest.approx(0.1) and rows[2]["mfu"] is None and rows[3]["tflops"] is None
    assert all(r["flops_per_step"] == fc.flops for r in rows)
    line = flops_line({"flops": fc.to_dict(), "best": "amp-bf16", "candidates": rows})
    assert "3.00 GFLOP per step" in line and "amp-bf16 achieved 0.3 TFLOP/s" in line and "MFU" in line
    add_rates(rows, fc, types.SimpleNamespace(gpus=[]))  # CPU: the rate, no MFU
    assert rows[1]["tflops"] == pytest.approx(0.3) and rows[1]["mfu"] is None
    none = flops_line({"flops": FlopCount(flops=None, how="not counted", note="on meta: X").to_dict()})
    assert "not counted" in none and "on meta: X" in none


@pytest.mark.parametrize("kernel", ["flash", "efficient"])
def test_a_fused_attention_kernel_counts_what_the_math_path_counts(kernel):
    """On a GPU, SDPA runs a fused kernel whose backward torch's formula counts with the scores recomputed
    (5 bmms: flop_counter.py `sdpa_backward_flop_count`): 14 L·H·Q·T per token where the math path (CPU,
    meta: tune's count) and the 12 L·H·Q·T convention have 12, so tests/gpu/test_flops_gpu.py failed on every
    GPU. The kernels' ops run here on the meta device, as the GPU dispatches them."""
    from overdrive.measure.flop_count import count_flops

    B, H, T, D = 2, 4, 64, 32
    q = torch.empty(B, H, T, D, device="meta", dtype=torch.bfloat16, requires_grad=True)
    aten = torch.ops.aten

    def fused():
        if kernel == "flash":
            o, lse, cq, ck, mq, mk, seed, off, _ = aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True)
            aten._scaled_dot_product_flash_attention_backward(o, q, q, q, o, lse, cq, ck, mq, mk, 0.0, True, seed, off)
        else:
            o, lse, seed, off = aten._scaled_dot_product_efficient_attention(q, q, q, None, True, 0.0, True)
            aten._scaled_dot_product_efficient_attention_backward(o, q, q, q, None, o, lse, seed, off, 0.0,
                                                                  [True, True, True, False], True)

    def math():
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()

    fused_flops, math_flops = count_flops(fused)[0], count_flops(math)[0]
    assert fused_flops == math_flops == 12 * B * H * D * T * T  # forward 4, backward 8
