"""Count the FLOPs of the user's step as `tune` receives it (model factory, batch function, loss).

The count runs on the meta device first (no memory, no compute; the caller's RNG state is kept); a
model whose factory or forward cannot run on meta (a `.item()`, a device move) is counted with one
real step on the CPU, and `how` says so. `measure.flop_count` holds the counter and the rates.
"""

from __future__ import annotations

from collections.abc import Callable

from overdrive.measure.flop_count import FlopCount, count_flops

__all__ = ["count_step_flops"]


def _step_on(device: str, model_fn: Callable, batch_fn: Callable, loss_fn: Callable | None) -> tuple[int, dict]:
    import torch

    from overdrive.tuning.workload import compute_loss, to_device

    with torch.device(device):
        model = model_fn()
    model = model.to(device)
    batch = to_device(batch_fn(0), device)

    def step() -> None:
        compute_loss(model, batch, loss_fn).backward()

    return count_flops(step)


def count_step_flops(model_fn: Callable, batch_fn: Callable, loss_fn: Callable | None = None, *,
                     seed: int = 0, cpu_fallback: bool = True) -> FlopCount:
    """FLOPs of one forward+backward of `loss_fn(model_fn(), batch_fn(0))`; never raises for the
    user's model (a count that fails says why in `note`). The caller's RNG state is left as it was."""
    import torch

    errors = []
    for device in ("meta", "cpu") if cpu_fallback else ("meta",):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                flops, ops = _step_on(device, model_fn, batch_fn, loss_fn)
            except Exception as e:  # the user's code on meta; anything at all: the count is optional
                first = (str(e).strip().splitlines() or [""])[0][:160]
                errors.append(f"on {device}: {type(e).__name__}: {first}")
                continue
        if flops <= 0:
            errors.append(f"on {device}: no matmul, convolution or attention counted")
            continue
        note = "" if device == "meta" else f"counted with one real step on the CPU (meta failed: {errors[0]})"
        return FlopCount(flops=flops, how=device, by_op=ops, note=note)
    return FlopCount(flops=None, how="not counted", note="; ".join(errors))


def add_rates(rows: list[dict], fc: FlopCount, env) -> None:
    """Each row's achieved TFLOP/s (counted FLOPs over its median step) and, on a GPU in the catalog,
    its MFU against the peak of the precision it ran. Emulated rows get none (their time is no speed)."""
    from overdrive.env.catalog import lookup_gpu
    from overdrive.measure.flop_count import rates

    spec = lookup_gpu(env.gpus[0].name) if getattr(env, "gpus", None) else None
    for r in rows:
        precision = (r.get("resolved") or {}).get("precision", "fp32")
        r["flops_per_step"] = fc.flops
        r.update(rates(fc.flops, r.get("step_ms"), precision=precision, spec=spec, emulated=bool(r.get("emulated"))))


def flops_line(res: dict) -> str:
    """One line for the console and report.html: the count, and the winner's achieved rate."""
    f = res.get("flops") or {}
    if not f:
        return ""
    if not f.get("per_step"):
        return f"FLOPs: not counted on this model ({f.get('note') or 'no matmul found'}): no TFLOP/s or MFU."
    best = next((r for r in res.get("candidates", []) if r["name"] == res.get("best")), None)
    where = "on the meta device" if f["how"] == "meta" else "with one real step on the CPU"
    s = (f"FLOPs: {f['per_step'] / 1e9:,.2f} GFLOP per step, counted on this model ({f['counter']}, {where})")
    if best and best.get("tflops") is not None:
        s += f"; {best['name']} achieved {best['tflops']:.3g} TFLOP/s"
        if best.get("mfu") is not None:
            s += f", MFU {100 * best['mfu']:.1f}% of {best['mfu_peak']}"
    return s + "."
