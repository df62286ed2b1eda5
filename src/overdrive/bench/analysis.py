"""From raw runs to the numbers people read: speedups with intervals, MFU, memory, loss parity,
safety, and the recommendation."""

from __future__ import annotations

import math
import zlib

from overdrive.bench.flops import achieved_tflops, flops_per_token, mfu
from overdrive.bench.runner import ConfigRun
from overdrive.bench.stats import speedup_ci, summarize
from overdrive.bench.suites import Suite
from overdrive.env import EnvReport
from overdrive.models import gpt_config

__all__ = ["analyze", "LOSS_TOLERANCE", "loss_tolerance"]

# Final-loss relative difference vs the baseline (same data order, same seed) beyond which a recipe
# is flagged unsafe. fp32 variants differ only by summation order; bf16 keeps 8 mantissa bits;
# FP8 (e4m3) 3 bits with per-tensor scales.
LOSS_TOLERANCE = {"fp32": 0.01, "bf16": 0.03, "fp16": 0.03, "fp8": 0.05}


def loss_tolerance(precision: str) -> float:
    return LOSS_TOLERANCE.get(precision, 0.03)


def _model_flops(name: str, seq: int) -> tuple[int, int]:
    cfg = gpt_config(name, block_size=seq)
    n = cfg.n_params(non_embedding=True)
    return n, flops_per_token(n, cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, seq)


def _tail_mean(xs: list[float], n: int) -> float | None:
    xs = [x for x in xs[-n:]]
    return sum(xs) / len(xs) if xs else None


def analyze(runs: list[ConfigRun], suite: Suite, env: EnvReport) -> dict:
    base = next((r for r in runs if r.cand.baseline), None)
    spec = env.gpus[0].spec if env.gpus else None
    gpt = suite.task == "gpt"
    items = suite.batch * suite.seq if gpt else suite.batch  # tokens per step, or examples per step
    configs = []
    for run in runs:
        res = run.resolved or {}
        precision = res.get("precision", "?")
        emulated = bool(res.get("emulated"))
        raw = {"warmup_ms": run.warmup_ms, "rounds_ms": run.rounds_ms}
        for r in run.roles:
            raw[f"{r}_ms"], raw[f"{r}_loss"] = run.ms[r], run.loss[r]
        c = {"name": run.cand.name, "description": run.cand.description, "baseline": run.cand.baseline,
             "status": run.status, "reason": run.reason, "recipe": run.cand.recipe.to_dict(), "resolved": res,
             "options": dict(run.cand.options), "precision": precision, "emulated": emulated,
             "setup_s": run.setup_s, "first_step_s": run.first_step_s, "memory": run.memory, "final": run.final,
             "models": {}, "raw": raw}
        tot = summarize(run.step_ms())
        c["step_ms"] = tot
        if tot["median"] and run.warmup_ms:
            # Compile time (and other first-step costs) reported apart from the step time.
            c["compile_s"] = max(0.0, run.warmup_ms[0] - tot["median"]) / 1e3
        for role in run.roles:
            ms = run.ms[role]
            s = summarize(ms)
            m = {"model": getattr(suite, role, role), "step_ms": s, "tokens_per_s": None, "examples_per_s": None,
                 "tflops": None, "mfu_bf16_peak": None, "mfu_fp8_peak": None, "speedup": None, "speedup_ci": None}
            if gpt:
                n_params, fpt = _model_flops(getattr(suite, role), suite.seq)
                m.update(params_nonembedding=n_params, flops_per_token=fpt)
            if s["median"]:
                rate = items / (s["median"] / 1e3)
                m["tokens_per_s" if gpt else "examples_per_s"] = rate
                if gpt:
                    m["tflops"] = achieved_tflops(rate, fpt)
                    if spec and not emulated:
                        m["mfu_bf16_peak"] = mfu(rate, fpt, spec.bf16_tflops)
                        if precision == "fp8":
                            m["mfu_fp8_peak"] = mfu(rate, fpt, spec.fp8_tflops)
            bms = base.ms[role] if base else []
            if not emulated and bms and ms and not run.cand.baseline:
                ci = speedup_ci(bms, ms, seed=zlib.crc32(run.cand.name.encode()))
                if ci:
                    m["speedup"], m["speedup_ci"] = ci[0], [ci[1], ci[2]]
            elif run.cand.baseline and ms:
                m["speedup"], m["speedup_ci"] = 1.0, [1.0, 1.0]
            if gpt:
                m.update(_parity(run.loss[role], base.loss[role] if base else [], precision))
            else:
                m.update(_click_parity(run, base))
            c["models"][role] = m
        if not run.cand.baseline and base and base.step_ms() and run.step_ms() and not emulated:
            ci = speedup_ci(base.step_ms(), run.step_ms(), seed=7)
            c["speedup"], c["speedup_ci"] = (ci[0], [ci[1], ci[2]]) if ci else (None, None)
        else:
            c["speedup"], c["speedup_ci"] = (1.0, [1.0, 1.0]) if run.cand.baseline else (None, None)
        bm = (base.memory or {}).get("peak_mb") if base else None
        pm = (run.memory or {}).get("peak_mb")
        c["peak_mb"] = pm
        c["memory_saved_pct"] = (100 * (1 - pm / bm)) if (pm is not None and bm) else None
        deltas = [c["models"][r]["loss_delta_pct"] for r in run.roles]
        unsafe = [c["models"][r]["unsafe_reason"] for r in run.roles if c["models"][r]["unsafe_reason"]]
        c["loss_delta_pct"] = max((abs(d) for d in deltas if d is not None), default=None)
        c["safe"] = run.status in ("ok", "stopped") and not unsafe
        c["unsafe_reason"] = "; ".join(unsafe) or None
        configs.append(c)
    return {"configs": configs, "recommendation": _recommend(configs)}


# Click models: held-out log-loss within 1% (relative) of the baseline's and AUC at most 0.005 lower.
CLICK_LOGLOSS_TOL, CLICK_AUC_DROP = 0.01, 0.005


def _click_parity(run: ConfigRun, base: ConfigRun | None) -> dict:
    f, b = run.final or {}, (base.final if base else None) or {}
    out = {"final_loss": f.get("logloss"), "auc": f.get("auc"), "loss_delta_pct": None, "auc_delta": None,
           "unsafe_reason": None, "loss_tolerance_pct": 100 * CLICK_LOGLOSS_TOL}
    if not f:
        return out
    if not math.isfinite(f.get("logloss", float("nan"))):
        out["unsafe_reason"] = "held-out log-loss is NaN/inf"
        return out
    if b.get("logloss"):
        d = (f["logloss"] - b["logloss"]) / b["logloss"]
        out["loss_delta_pct"], out["auc_delta"] = 100 * d, f["auc"] - b["auc"]
        if d > CLICK_LOGLOSS_TOL or f["auc"] < b["auc"] - CLICK_AUC_DROP:
            out["unsafe_reason"] = (f"held-out log-loss {f['logloss']:.4f} vs {b['logloss']:.4f} ({100 * d:+.1f}%), "
                                    f"AUC {f['auc']:.4f} vs {b['auc']:.4f} (tolerance +{100 * CLICK_LOGLOSS_TOL:.0f}% "
                                    f"log-loss, -{CLICK_AUC_DROP} AUC)")
    return out


def _parity(losses: list[float], base_losses: list[float], precision: str) -> dict:
    """Final-loss relative difference vs the baseline at the same steps (mean of the last 3)."""
    out = {"final_loss": None, "loss_delta_pct": None, "unsafe_reason": None, "loss_tolerance_pct":
           100 * loss_tolerance(precision)}
    if not losses:
        return out
    if any(not math.isfinite(v) for v in losses):
        out["unsafe_reason"] = "loss became NaN/inf"
        return out
    n = min(len(losses), len(base_losses)) if base_losses else len(losses)
    final = _tail_mean(losses[:n], 3)
    out["final_loss"] = final
    if base_losses and n:
        ref = _tail_mean(base_losses[:n], 3)
        delta = (final - ref) / abs(ref)
        out["loss_delta_pct"] = 100 * delta
        if abs(delta) > loss_tolerance(precision):
            out["unsafe_reason"] = (f"final loss {final:.3f} vs baseline {ref:.3f} ({100 * delta:+.1f}%, tolerance "
                                    f"±{100 * loss_tolerance(precision):.0f}% for {precision})")
    return out


def _loss_words(c: dict) -> str:
    deltas = [m["loss_delta_pct"] for m in c["models"].values() if m.get("loss_delta_pct") is not None]
    if not deltas:
        return "loss not compared"
    d = max(deltas, key=abs)
    if d < -0.05:
        return f"loss {-d:.1f}% below the baseline's"
    return f"loss within {abs(d):.1f}% of the baseline"


def _recommend(configs: list[dict]) -> dict:
    measured = [c for c in configs if c["status"] == "ok" and c["safe"] and not c["emulated"] and c["step_ms"]["median"]]
    if not measured:
        return {"name": None, "text": "no configuration completed safely: see the statuses above"}
    best = min(measured, key=lambda c: c["step_ms"]["median"])
    unsafe = [c["name"] for c in configs if not c["safe"] and c["status"] in ("ok", "stopped")]
    tail = f" (not recommended, loss beyond tolerance: {', '.join(unsafe)})" if unsafe else ""
    if best["baseline"]:
        text = f"fastest safe recipe here: the baseline (plain fp32 PyTorch); no candidate beat it{tail}"
    else:
        lo, hi = best["speedup_ci"] or (None, None)
        ci = f" [{lo:.2f}–{hi:.2f}]" if lo is not None else ""
        text = (f"fastest safe recipe here: {best['name']} — {best['speedup']:.2f}x{ci} the baseline's speed "
                f"({'+'.join(best['models'])} step {best['step_ms']['median']:.1f} ms), {_loss_words(best)}{tail}")
    return {"name": best["name"], "text": text, "speedup": best["speedup"], "speedup_ci": best["speedup_ci"]}
