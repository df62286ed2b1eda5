"""The recsys workload for `overdrive bench --workload recsys`: one click model per configuration
(embedding lookup × optimizer × AMP), run by the bench's worker processes like the Transformer one."""

from __future__ import annotations

import torch

from overdrive.bench.suites import Candidate, Suite
from overdrive.bench.worker import _rss_mb, elapsed_ms, mark, process_memory
from overdrive.recipes import Recipe
from overdrive.recsys.data import CriteoSpec, synthetic_clicks
from overdrive.recsys.model import DLRM
from overdrive.recsys.train import build_optimizers, evaluate, train_step

__all__ = ["RecsysTask", "RECSYS_SUITES", "recsys_candidates"]


def _spec(options: dict) -> CriteoSpec:
    return CriteoSpec(table_sizes=tuple(options["table_sizes"]))


class RecsysTask:
    def __init__(self, spec: dict) -> None:
        from overdrive.env import build_report, set_env

        torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
        env = build_report(spec["env_facts"])
        set_env(env)
        self.cuda = env.device == "cuda"
        self.device = env.device
        self.rss0 = _rss_mb()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        o, c = spec["options"], spec["cand_options"]
        cs = _spec(o)
        data = synthetic_clicks(o["train_examples"] + o["val_examples"], cs, seed=spec["seed"])
        self.train = data.slice(0, o["train_examples"])
        self.val = data.slice(o["train_examples"], len(data)).to(self.device)
        self.batch = spec["batch"]
        torch.manual_seed(spec["seed"])
        sparse = c["optimizer"] != "dense-adamw"
        self.model = DLRM(cs, dim=o["dim"], embedding=c["embedding"], sparse=sparse).to(self.device)
        lr = spec["lr"] * spec.get("lr_scale", 1.0)
        self.opts = build_optimizers(self.model, c["optimizer"], lr=lr)
        ac = spec["resolved"].get("autocast_dtype")
        self.amp = getattr(torch, ac) if ac else None
        self.fail_at = spec.get("fail_at_step")
        self.i = 0

    def step(self) -> dict:
        if self.fail_at is not None and self.i >= self.fail_at:
            raise RuntimeError("injected backend failure (test)")
        n = len(self.train)
        start = (self.i * self.batch) % (n - self.batch)
        b = self.train.slice(start, start + self.batch).to(self.device)
        a = mark(self.cuda)
        loss = train_step(self.model, self.opts, b, amp_dtype=self.amp)
        e = mark(self.cuda)
        if self.cuda:
            torch.cuda.synchronize()
        self.i += 1
        return {"dlrm_ms": elapsed_ms(self.cuda, a, e), "dlrm_loss": loss}

    def final(self) -> dict:
        return evaluate(self.model, self.val)

    def memory(self) -> dict:
        return process_memory(self.cuda, self.rss0)


def recsys_candidates() -> tuple[Candidate, ...]:
    def cand(name, emb, opt, precision="fp32", desc="", baseline=False, **extra):
        return Candidate(name=name, recipe=Recipe(name=name, precision=precision, optimizer="for-loop"),
                         options={"embedding": emb, "optimizer": opt, **extra}, description=desc, baseline=baseline)

    return (
        cand("baseline", "embedding", "dense-adamw", desc="nn.Embedding + per-bag sum, dense AdamW", baseline=True),
        cand("embeddingbag", "embeddingbag", "dense-adamw", desc="nn.EmbeddingBag (fused gather-reduce), dense AdamW"),
        cand("bag+sparse-adam", "embeddingbag", "sparse-adam", desc="EmbeddingBag, sparse grads, SparseAdam + AdamW"),
        cand("bag+sparse-adagrad", "embeddingbag", "sparse-adagrad",
             desc="EmbeddingBag, sparse grads, Adagrad on tables + AdamW"),
        cand("bag+sparse-adam+bf16", "embeddingbag", "sparse-adam", precision="bf16",
             desc="as bag+sparse-adam, MLPs and interaction under bf16 autocast"),
        cand("torchrec-ebc", "torchrec", "dense-adamw", requires_engine="torchrec",
             desc="TorchRec EmbeddingBagCollection over a KeyedJaggedTensor, dense AdamW"),
    )


_CPU_TABLES = [1_000_000, 200_000, 50_000, 10_000] + [5_000] * 6 + [1_000] * 16
_GPU_TABLES = [10_000_000, 2_000_000, 500_000, 100_000] + [50_000] * 6 + [10_000] * 16


def _suite(name, tables, batch, train, val, rounds, steps, budget, lr=1e-3, micro="none"):
    return Suite(name=name, task="recsys", roles=("dlrm",), teacher="dlrm", student="dlrm", batch=batch, seq=1,
                 warmup=2, rounds=rounds, steps_per_round=steps, budget_s=budget, micro=micro, lr=lr,
                 candidates=recsys_candidates(),
                 options={"table_sizes": tables, "dim": 16, "train_examples": train, "val_examples": val,
                          "total_rows": sum(tables)})


RECSYS_SUITES = {
    "recsys-quick": _suite("recsys-quick", _CPU_TABLES, 1024, 40_000, 10_000, 4, 5, 20),
    "recsys": _suite("recsys", _CPU_TABLES, 1024, 120_000, 20_000, 8, 10, 60),
    "recsys-gpu": _suite("recsys-gpu", _GPU_TABLES, 8192, 2_000_000, 200_000, 6, 20, 90),
}
