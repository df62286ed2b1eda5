"""The Transformer workload: a teacher GPT and a distilled student trained side by side under one
recipe, on the built-in token stream or the user's text (`--data FILE`, bytes as tokens).

Quality is loss parity with the baseline over the first `parity_steps` steps (the same for every
configuration whatever the time budget), compared on the curves' tails, aligned on the optimizer
steps each run really took (GradScaler skips steps under fp16).
"""

from __future__ import annotations

import math

from overdrive.bench.workloads.base import Task, Workload

__all__ = ["GPTWorkload", "GPTTask", "loss_parity", "LOSS_TOLERANCE", "loss_tolerance"]

# Tail-mean loss relative difference vs the baseline (same data order, same seed) beyond which a
# recipe is flagged unsafe. fp32 variants differ only by summation order; bf16 keeps 8 mantissa
# bits; FP8 (e4m3) 3 bits with per-tensor scales.
# fp4 (NVFP4) is allowed twice FP8's gap: it costs loss by design (+0.05 nats at 16B in torchao's
# DeepSeek-V3 run against +0.01 for MXFP8).
LOSS_TOLERANCE = {"fp32": 0.01, "bf16": 0.03, "fp16": 0.03, "fp8": 0.05, "fp4": 0.10}


def loss_tolerance(precision: str) -> float:
    return LOSS_TOLERANCE.get(precision, 0.03)


class GPTTask(Task):
    def __init__(self, spec: dict) -> None:
        super().__init__(spec)
        import torch

        from overdrive.accelerate import Accelerated
        from overdrive.data import TokenData, builtin_tokens, file_tokens
        from overdrive.models import GPT, gpt_config
        from overdrive.recipes import ResolvedRecipe

        tokens = file_tokens(spec["data"]) if spec.get("data") else builtin_tokens(spec["data_tokens"])
        self.batches = TokenData(tokens, seq_len=spec["seq"], seed=spec["seed"])
        self.batch = spec["batch"]
        resolved = ResolvedRecipe.from_dict(spec["resolved"])
        lr = spec["lr"] * self.inject.get("lr_scale", 1.0)
        self.accs = {}
        for role in ("teacher", "student"):
            torch.manual_seed(spec["seed"] + (0 if role == "teacher" else 1))
            model = GPT(gpt_config(spec[role], block_size=spec["seq"]))
            self.accs[role] = Accelerated(model, resolved, lr=lr, weight_decay=0.1, betas=(0.9, 0.95),
                                          grad_clip=1.0, module_filter_fn=None, build_optimizer=True)
        # What the applier made of the recipe per model (a student below fp8_min_dim converts no layer).
        self.applied = {role: acc.resolved.to_dict() for role, acc in self.accs.items()}
        if self.inject.get("alloc_mb"):  # a transient allocation only this process's peak may show
            blob = torch.ones(self.inject["alloc_mb"] * 2**18, device=self.device)  # 4-byte floats
            del blob

    def step(self) -> dict:
        from overdrive.losses import distill_loss

        x, y = self.batches.get(self.step_i, self.batch, self.device)
        t, s = self.accs["teacher"], self.accs["student"]
        clock = self.clock
        e0 = clock.mark()
        with t.autocast():
            t_logits, t_loss = t.model(x, y)
        t.backward(t_loss)
        t_info = t.step()
        e1 = clock.mark()
        with s.autocast():
            s_logits, _ = s.model(x)
            loss = distill_loss(s_logits, t_logits.detach(), y)
        s.backward(loss)
        s_info = s.step()
        e2 = clock.mark()
        clock.sync()  # read the events: one sync per step, after all its work
        self.step_i += 1
        return {"teacher_ms": clock.elapsed_ms(e0, e1), "student_ms": clock.elapsed_ms(e1, e2),
                "teacher_loss": t_loss.item(), "student_loss": loss.item(),
                "teacher_skipped": bool(t_info["skipped"]), "student_skipped": bool(s_info["skipped"])}


def _updates_before(skipped: list[bool]) -> list[int]:
    """Optimizer updates applied before each step: step i follows i updates minus the skipped ones."""
    out, u = [], 0
    for s in skipped:
        out.append(u)
        u += 0 if s else 1
    return out


def loss_parity(losses: list[float], skipped: list[bool], base_losses: list[float], base_skipped: list[bool],
                *, steps: int, precision: str) -> dict:
    """Compare the first `steps` losses with the baseline's, on the tail of the curves.

    Each loss is paired with the baseline's loss after the same number of optimizer updates (a
    GradScaler-skipped step would otherwise make the run lag one step behind on a falling curve),
    and the tail (last quarter, at least 3 points) is averaged on both sides: one noisy point
    never decides. Fewer than `steps` losses on either side: not assessed.
    """
    tol = loss_tolerance(precision)
    out = {"final_loss": None, "loss_delta_pct": None, "unsafe_reason": None, "loss_tolerance_pct": 100 * tol,
           "parity_steps": steps, "skipped_steps": sum(bool(s) for s in skipped[:steps]), "assessed": False}
    cand, cs = losses[:steps], (list(skipped) + [False] * steps)[:len(losses[:steps])]
    if any(not math.isfinite(v) for v in cand):
        out.update(assessed=True, unsafe_reason="loss became NaN/inf")
        return out
    if len(cand) < steps or len(base_losses) < steps:
        return out
    bs = (list(base_skipped) + [False] * steps)[:steps]
    base_at: dict[int, float] = {}
    for u, v in zip(_updates_before(bs), base_losses[:steps]):
        base_at.setdefault(u, v)
    pairs = [(v, base_at[u]) for u, v in zip(_updates_before(cs), cand) if u in base_at]
    tail = pairs[-max(3, steps // 4):]
    final = sum(p[0] for p in tail) / len(tail)
    ref = sum(p[1] for p in tail) / len(tail)
    delta = (final - ref) / abs(ref)
    out.update(final_loss=final, baseline_loss=ref, loss_delta_pct=100 * delta, assessed=True,
               tail_steps=len(tail))
    if abs(delta) > tol:
        skips = f", {out['skipped_steps']} skipped steps aligned" if out["skipped_steps"] else ""
        out["unsafe_reason"] = (f"loss over the last {len(tail)} of {steps} steps {final:.3f} vs baseline {ref:.3f} "
                                f"({100 * delta:+.1f}%, tolerance ±{100 * tol:.0f}% for {precision}{skips})")
    return out


class GPTWorkload(Workload):
    name = "transformer"
    task = "gpt"
    help = "teacher + distilled student GPT (default)"
    data_help = "a text file (bytes as tokens)"
    roles = ("teacher", "student")

    @property
    def suites(self) -> dict:
        from overdrive.bench.suites import SUITES

        return SUITES

    def default_suite(self, *, has_gpu: bool, quick: bool) -> str:
        return "gpu" if has_gpu else ("cpu-quick" if quick else "cpu")

    def check_data(self, path: str) -> str:
        from overdrive.data import file_tokens

        return f"{path}: {file_tokens(path).size:,} bytes as tokens"

    def build(self, spec: dict) -> Task:
        return GPTTask(spec)

    def quality_rows(self, run, base, suite) -> dict[str, dict]:
        precision = (run.resolved or {}).get("precision", "?")
        rows = {}
        for role in run.roles:
            if run.status not in ("ok",):  # stopped/failed: never judged from a few steps
                rows[role] = loss_parity([], [], [], [], steps=suite.parity_steps, precision=precision)
                continue
            rows[role] = loss_parity(run.loss[role], run.skipped[role], base.loss[role] if base else [],
                                     base.skipped[role] if base else [], steps=suite.parity_steps,
                                     precision=precision)
        return rows
