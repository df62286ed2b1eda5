"""A measured per-layer FP8 filter: which of the user's Linears are faster in FP8, on this GPU.

torchtitan's `auto_filter` converts by a fixed size threshold; torchao's own table shows FP8 at
0.8x of bf16 on small GEMMs and 1.4x on large ones, with the crossover depending on the token
count M as much as on K and N. So we time each distinct (M, K, N) the model really runs,
forward + backward, in bf16 and in FP8 (the candidate's backend, scaling and compile setting),
and convert only the shapes whose FP8 time wins by `min_gain`. The result travels in the recipe
as `fp8_shapes` ("KxN,..."), so `accelerate` applies exactly the measured choice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

__all__ = ["LinearSite", "linear_sites", "measure_filter", "bench_linear", "FilterResult"]


@dataclass(frozen=True, kw_only=True)
class LinearSite:
    fqn: str
    in_features: int
    out_features: int
    tokens: int
    """M: rows of the input the layer saw in one forward (batch x sequence for a Transformer)."""

    @property
    def shape(self) -> str:
        return f"{self.in_features}x{self.out_features}"


@dataclass(frozen=True, kw_only=True)
class FilterResult:
    shapes: str
    """The winners, as Recipe.fp8_shapes: "KxN,KxN"; empty when none wins."""
    layers: list[dict]
    """Per layer: fqn, shape, tokens, bf16_ms, fp8_ms, speedup, convert, reason."""

    def summary(self) -> str:
        conv = [d for d in self.layers if d["convert"]]
        return f"{len(conv)} of {len(self.layers)} Linears to FP8 (measured per shape)"


def linear_sites(model: nn.Module, run_forward: Callable[[], object]) -> list[LinearSite]:
    """Every plain nn.Linear with the token count it sees, from one forward pass."""
    import torch

    seen: dict[str, LinearSite] = {}
    hooks = []
    for fqn, m in model.named_modules():
        if type(m) is nn.Linear:
            def hook(mod, args, _fqn=fqn):
                x = args[0]
                seen.setdefault(_fqn, LinearSite(fqn=_fqn, in_features=mod.in_features,
                                                 out_features=mod.out_features, tokens=x.numel() // x.shape[-1]))
            hooks.append(m.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            run_forward()
    finally:
        for h in hooks:
            h.remove()
    return list(seen.values())


def measure_filter(sites: list[LinearSite], *, bench: Callable[[int, int, int, bool], float],
                   min_gain: float = 1.05, convert_head: bool = False, fmt: str = "fp8",
                   backend: str = "torchao") -> FilterResult:
    """Time each distinct (M, K, N) once per mode with `bench(M, K, N, fp8) -> ms`; decide per layer.

    A (K, N) shape converts only when it wins at every token count it is used with (the recipe
    filter is by K x N). `fmt` on `backend` names the engine whose shape rules apply
    (`convert.shape_rules`): K and N it cannot take stay in bf16, and the FP8 time is that of the token
    count padded as the converted layer pads it (`fp8_tokens`)."""
    from overdrive.convert.fp8 import HEAD_NAMES
    from overdrive.convert.shape_rules import dims_multiple, tokens_multiple

    dims, pad = dims_multiple(fmt, backend), tokens_multiple(fmt, backend)
    timings: dict[tuple[int, int, int], tuple[float, float]] = {}
    layers: list[dict] = []
    for s in sites:
        row = {"fqn": s.fqn, "shape": s.shape, "tokens": s.tokens, "fp8_tokens": -(-s.tokens // pad) * pad,
               "bf16_ms": None, "fp8_ms": None, "speedup": None, "convert": False}
        if s.in_features % dims or s.out_features % dims:
            row["reason"] = f"dims not divisible by {dims}: the {fmt} GEMM ({backend}) cannot run"
        elif not convert_head and s.fqn.rsplit(".", 1)[-1] in HEAD_NAMES:
            row["reason"] = "output head stays in high precision"
        else:
            key = (s.tokens, s.in_features, s.out_features)
            if key not in timings:
                timings[key] = (bench(*key, False), bench(*key, True))
            b, f = timings[key]
            sp = b / f if f > 0 else 0.0
            row.update(bf16_ms=b, fp8_ms=f, speedup=sp, convert=sp >= min_gain,
                       reason=(f"FP8 {sp:.2f}x bf16 at M={s.tokens}: converted" if sp >= min_gain else
                               f"FP8 {sp:.2f}x bf16 at M={s.tokens} (needs >= {min_gain:g}x): stays bf16"))
        layers.append(row)
    # A shape converts only if every timed use of it won. The head kept by policy is no loss: the recipe's
    # shape filter keeps it out anyway (accelerate._shape_filter), so it must not veto a block's layer of
    # the same KxN (a GPT whose MLP width equals its vocabulary).
    lost = {d["shape"] for d in layers if not d["convert"] and d["speedup"] is not None}
    for d in layers:
        if d["convert"] and d["shape"] in lost:
            d["convert"] = False
            d["reason"] += "; same KxN lost elsewhere: stays bf16"
    shapes = sorted({d["shape"] for d in layers if d["convert"]})
    return FilterResult(shapes=",".join(shapes), layers=layers)


def bench_linear(tokens: int, k: int, n: int, fp8: bool, *, backend: str, scaling: str, compile: bool,
                 device: str, reps: int = 10) -> float:
    """Forward + backward of one Linear (M x K) @ (K x N) under bf16 autocast, in ms (median of 5).

    In FP8 the Linear is converted as `accelerate` converts it, so the time includes what really runs: the
    tokens padded to the engine's multiple (`convert.shape_rules`) and the GEMMs at that M."""
    import contextlib
    import statistics

    import torch

    from overdrive.convert.fp8 import convert_fp8, te_autocast, te_fp8_recipe
    from overdrive.measure.rounds import time_fn

    torch.manual_seed(0)
    mod: nn.Module = nn.Sequential(nn.Linear(k, n, device=device))
    if fp8:
        convert_fp8(mod, backend=backend, scaling=scaling, module_filter_fn=lambda m, fqn: True)
    if compile:
        mod = torch.compile(mod)
    x = torch.randn(tokens, k, device=device, requires_grad=True)
    dev = torch.device(device).type
    # A te.Linear runs FP8 only inside TE's own autocast (torch.autocast alone times it in bf16).
    te_ctx = (lambda: te_autocast(te_fp8_recipe(scaling))) if fp8 and backend == "transformer_engine" \
        else contextlib.nullcontext

    def step() -> None:
        with torch.autocast(dev, dtype=torch.bfloat16), te_ctx():
            y = mod(x)
        y.float().sum().backward()

    cuda = dev == "cuda"
    for _ in range(3):  # warm-up: compilation, kernel selection
        step()
    return statistics.median(time_fn(step, cuda=cuda, reps=reps) for _ in range(5))
