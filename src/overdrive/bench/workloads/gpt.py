"""The Transformer workload: a teacher GPT and a distilled student trained side by side under one
recipe, on the built-in token stream or the user's text (`--data FILE`, bytes as tokens).

Quality is loss parity with the baseline over the first `parity_steps` steps (the same for every
configuration whatever the time budget), compared on the curves' tails, aligned on the optimizer
steps each run really took (GradScaler skips steps under fp16).
"""

from __future__ import annotations

from overdrive.bench.workloads.base import Task, Workload
from overdrive.measure.quality import LOSS_TOLERANCE, loss_parity, loss_tolerance

__all__ = ["GPTWorkload", "GPTTask", "loss_parity", "LOSS_TOLERANCE", "loss_tolerance"]

class GPTTask(Task):
    def __init__(self, spec: dict) -> None:
        super().__init__(spec)
        import torch

        from overdrive.accelerated import accelerate
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
            self.accs[role] = accelerate(model, resolved, env=self.env, lr=lr, weight_decay=0.1, betas=(0.9, 0.95),
                                         grad_clip=1.0)
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
