"""The Transformer workload: a teacher GPT and a distilled student trained side by side under one
recipe, on the built-in token stream or the user's text (`--data FILE`, bytes as tokens).

Quality is loss parity with the baseline over the first `parity_steps` steps (the same for every
configuration whatever the time budget), compared on the curves' tails, aligned on the optimizer
steps each run really took (GradScaler skips steps under fp16).
"""

from __future__ import annotations

from dataclasses import fields

from overdrive.bench.flops import achieved_tflops, flops_per_token, mfu
from overdrive.bench.workloads.base import Task, Workload
from overdrive.measure.quality import LOSS_TOLERANCE, loss_parity, loss_tolerance

__all__ = ["GPTWorkload", "GPTTask", "loss_parity", "LOSS_TOLERANCE", "loss_tolerance", "mfu_cell", "recipe_of"]


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


def recipe_of(cfg: dict) -> str:
    """The configuration's recipe in the name grammar: its own name when that parses back to its
    recorded fields, else a name written from the fields (so nothing is left out)."""
    from overdrive.recipes import Recipe, parse_recipe_name, recipe_name

    name, rec = str(cfg.get("name")), cfg.get("recipe")
    if not isinstance(rec, dict):
        return name
    known = [f.name for f in fields(Recipe) if f.name != "name"]
    try:
        r = Recipe(**{k: v for k, v in rec.items() if k in known})
    except (TypeError, ValueError):
        return name
    for cand in (name, rec.get("name")):
        try:
            p = parse_recipe_name(str(cand))
        except ValueError:
            continue
        if all(getattr(p, k) == getattr(r, k) for k in known):
            return p.name
    return recipe_name(r)


def _model_flops(name: str, seq: int) -> tuple[int, int]:
    """(non-embedding parameters, training FLOPs per token) of a named reference GPT at `seq`."""
    from overdrive.models import gpt_config

    cfg = gpt_config(name, block_size=seq)
    n = cfg.n_params(non_embedding=True)
    return n, flops_per_token(n, cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, seq)


def mfu_cell(m: dict, precision: str) -> str:
    """MFU where a peak is known (GPU); on CPU the achieved rate, so console and HTML show one figure."""
    if m.get("mfu_bf16_peak") is None:
        return "-" if m.get("tflops") is None else f"{m['tflops'] * 1e3:.0f} GF/s"
    s = f"{100 * m['mfu_bf16_peak']:.1f}%"
    if precision == "fp8" and m.get("mfu_fp8_peak") is not None:
        s += f" ({100 * m['mfu_fp8_peak']:.1f}% of FP8)"
    if precision == "fp4" and m.get("mfu_fp4_peak") is not None:
        s += f" ({100 * m['mfu_fp4_peak']:.1f}% of FP4)"
    return s


class GPTWorkload(Workload):
    name = "transformer"
    task = "gpt"
    help = "teacher + distilled student GPT (default)"
    data_help = "a text file (bytes as tokens)"
    roles = ("teacher", "student")
    rate_key = "tokens_per_s"
    quality_header = "MFU vs BF16 peak (CPU: achieved)"
    baseline_words = "your plain fp32 PyTorch loop"

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

    def title(self, suite: dict) -> str:
        return (f"suite {suite['name']}: teacher {suite['teacher']}, student {suite['student']}, batch "
                f"{suite['batch']} x seq {suite['seq']}")

    def items_per_step(self, suite) -> int:
        return suite.batch * suite.seq  # tokens

    def role_figures(self, role: str, suite, *, rate: float | None, precision: str, gpu, emulated: bool) -> dict:
        n_params, fpt = _model_flops(getattr(suite, role), suite.seq)
        out = {"params_nonembedding": n_params, "flops_per_token": fpt}
        if rate is None:
            return out
        out["tflops"] = achieved_tflops(rate, fpt)
        if gpu is not None and not emulated:
            out["mfu_bf16_peak"] = mfu(rate, fpt, gpu.bf16_tflops)
            if precision == "fp8":
                out["mfu_fp8_peak"] = mfu(rate, fpt, gpu.fp8_tflops)
            elif precision == "fp4" and gpu.fp4_tflops:
                # NVFP4 runs its GEMMs on the FP4 tensor cores: the catalog's dense FP4 peak.
                out["mfu_fp4_peak"] = mfu(rate, fpt, gpu.fp4_tflops)
        return out

    def quality_cell(self, m: dict, cfg: dict) -> str:
        return "-" if cfg.get("emulated") else mfu_cell(m, cfg.get("precision", ""))

    def apply_hint(self, cfg: dict) -> dict:
        """The recipe name is written from the recipe's fields (`recipe_of`), so
        `accelerate(recipe=...)`, `train.recipe` and `--set` all parse it back to the same fields."""
        name = recipe_of(cfg)
        return {"code": f'overdrive.accelerate(model, recipe="{name}")',
                "train": f'train.recipe = "{name}"  (or --set train.recipe={name})'}

    def next_step(self, cfg: dict, label: str, hint: dict) -> tuple[str, str | None, str | None, str]:
        ran = recipe_of(cfg)
        said = f" (recorded as {ran}: what was measured)" if ran != cfg.get("name") else ""
        return f"Next step: apply {label}{said}", hint["code"], hint["train"], ""

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
