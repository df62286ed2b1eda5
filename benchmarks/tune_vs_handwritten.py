"""Does `tune` pick a recipe as fast as the best hand-written loop? Measured on two user models.

For a narrow and a wide model of the user's own (a token tagger, not our GPT): run
`overdrive.tune(..., budget_s=B)`, apply the winner with `overdrive.accelerate`, and time it side
by side with two plain-PyTorch loops written by hand: fp32 + fused AdamW, and bf16 autocast +
fused AdamW. Interleaved rounds in rotating order (one process, each contender its own model and
optimizer, the same batches); medians and a bootstrap interval of tuned / fastest hand-written.
"Within 5%" means the tuned loop's median step is at most 1.05x the fastest hand-written one.

    PYTHONPATH=src python benchmarks/tune_vs_handwritten.py --budget-s 150
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

HERE = os.path.abspath(__file__)


class Tagger(nn.Module):
    """The user's model: token embedding, `depth` residual MLP blocks with LayerNorm, a tag head."""

    def __init__(self, width: int, vocab: int = 512, tags: int = 16, depth: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                                  nn.Linear(4 * width, width)) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, tags)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)  # (B, T, width)
        for b in self.blocks:
            h = h + b(h)
        return self.head(self.norm(h))  # (B, T, tags)


def narrow() -> nn.Module:
    return Tagger(64)


def wide() -> nn.Module:
    return Tagger(384)


def deep() -> nn.Module:
    """Three blocks at width 512 (6.3M parameters): the optimizer step is a large share of the step."""
    return Tagger(512, depth=3)


def batch(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"ids": torch.randint(0, 512, (16, 64), generator=g), "tags": torch.randint(0, 16, (16, 64), generator=g)}


def loss(model: nn.Module, b: dict) -> torch.Tensor:
    return nn.functional.cross_entropy(model(b["ids"]).flatten(0, 1), b["tags"].flatten())


def _contenders(factory, recipe, hand_loops: tuple[str, ...]):
    import overdrive

    torch.manual_seed(0)
    acc = overdrive.accelerate(factory(), recipe, grad_clip=None)

    def tuned(b):
        with acc.autocast():
            lo = loss(acc.model, b)
        acc.backward(lo)
        acc.step()
        return lo.item()

    def hand(bf16: bool):
        torch.manual_seed(0)
        m = factory()
        opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, fused=True)

        def step(b):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                lo = loss(m, b)
            lo.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return lo.item()
        return step

    loops = {"fp32": ("hand fp32 + fused AdamW", False), "bf16": ("hand bf16 autocast + fused AdamW", True)}
    return {f"tuned ({recipe.name})": tuned, **{loops[k][0]: hand(loops[k][1]) for k in hand_loops}}


def side_by_side(factory, recipe, *, rounds: int, steps: int, warmup: int = 3,
                 hand_loops: tuple[str, ...] = ("fp32", "bf16")) -> tuple[dict, dict]:
    """(step ms per contender, notes). A contender whose first step is over 10x the fastest one's
    (bf16 on a CPU without bf16 units: ~70x) keeps that one step as its only figure, with a note."""
    from overdrive.measure.rounds import interleaved_rounds, time_fn

    fns = _contenders(factory, recipe, hand_loops)
    ms: dict[str, list[float]] = {k: [] for k in fns}
    notes: dict[str, str] = {}
    first = {k: time_fn(lambda f=f: f(batch(0)), cuda=False) for k, f in fns.items()}  # includes compile
    fastest = min(v for k, v in first.items() if k.startswith("hand"))  # eager: no compile in the first step
    # The tuned loop is always measured (its first step may carry compilation); a hand-written one
    # whose first step is over 10x the faster one's is not.
    live = [k for k in fns if not k.startswith("hand") or first[k] <= 10 * fastest]
    for k in fns:
        if k not in live:
            ms[k] = [first[k]]
            notes[k] = f"first step only: {first[k] / fastest:.0f}x the fastest first step, not measured further"
    warm: dict[str, list[float]] = {k: [] for k in live}
    for k in live:  # the rest of the warm-up, apart
        for i in range(1, warmup):
            warm[k].append(time_fn(lambda: fns[k](batch(i)), cuda=False))
    # A hand-written loop over 3x slower than the faster one after warm-up keeps its warm-up steps as
    # its figures and leaves the rounds: it cannot be the fastest, and a long slow burst before the
    # next contender's turn would bias the rotation of three (measured: +9-21% on the one after it).
    fast = min(statistics.median(v) for k, v in warm.items() if k.startswith("hand"))
    for k in [k for k in live if k.startswith("hand") and statistics.median(warm[k]) > 3 * fast]:
        live.remove(k)
        ms[k] = warm[k]
        notes[k] = f"warm-up steps only: {statistics.median(warm[k]) / fast:.1f}x the faster hand-written loop"
    step_i = [warmup]

    def run_one(k, _round) -> bool:
        for _ in range(steps):
            b = batch(step_i[0] % 1000)
            step_i[0] += 1
            ms[k].append(time_fn(lambda: fns[k](b), cuda=False))
        return True

    interleaved_rounds(live, run_one, rounds=rounds)
    return ms, notes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=150)
    p.add_argument("--models", default="narrow,wide")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--steps", type=int, default=3, help="steps per contender per round")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for tune's workers and the side-by-side loops (default: 1 when the host is "
                        "oversubscribed, else torch's default): on a shared 2-core host at load 20, two OpenMP "
                        "threads made a 1-thread 8 ms step take 100-375 ms")
    p.add_argument("--hand", default="fp32,bf16",
                   help="the hand-written loops to time (fp32, bf16): on a CPU where the doctor measured bf16 matmuls "
                        "30-70x slower than fp32, the bf16 loop's first step alone takes minutes on a large model")
    p.add_argument("--reprobe-fused", action="store_true",
                   help="re-run the doctor's fused AdamW / SDPA probe with a 300 s timeout first (on a host at load "
                        "~20 its 60 s timeout expires, and every recipe then falls back to foreach AdamW)")
    a = p.parse_args()
    if a.threads is None:
        a.threads = 1 if os.getloadavg()[0] > (os.cpu_count() or 1) else torch.get_num_threads()
    torch.set_num_threads(a.threads)
    import overdrive
    from overdrive.measure.stats import speedup_ci

    env = overdrive.get_env()
    if a.reprobe_fused:
        import copy

        from overdrive.env import build_report, set_env
        from overdrive.env.probing import run_probe

        facts = copy.deepcopy(env.facts)
        facts["probes"]["torch_native"] = run_probe("torch_native", timeout=300)
        env = build_report(facts)
        set_env(env)  # accelerate() below and tune's workers see the same report
        print(f"fused AdamW re-probed: {env.engine('fused_adamw').status} ({env.engine('fused_adamw').reason})")
    print(f"host: {env.platform['cpu'].get('model')} ({env.platform['cpu'].get('count')} cores, "
          f"{env.platform['cpu'].get('isa')}); load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}; "
          f"{a.threads} thread(s) per process")
    ok_all = True
    for name in a.models.split(","):
        factory = globals()[name]
        t0 = time.perf_counter()
        res = overdrive.tune(f"{HERE}:{name}", f"{HERE}:batch", loss_fn=f"{HERE}:loss", budget_s=a.budget_s,
                             threads=a.threads, env=env,
                             progress=lambda s: print(f"  [{time.perf_counter() - t0:5.0f} s] {s}", file=sys.stderr))
        print(f"\n== {name} ({sum(p.numel() for p in factory().parameters()) / 1e6:.2f}M params): tune took "
              f"{time.perf_counter() - t0:.0f} s of {a.budget_s:g}\n{res.table()}\n{res.summary}")
        m, aa = res.meta, (res.meta.get("noise") or {}).get("aa") or {}
        clean = bool(aa) and aa["ci"][0] <= 1.0 <= aa["ci"][1]
        print(f"  kept {m.get('kept')} (recommended: {m.get('recommended')}); {m['rounds']} rounds, stopped at "
              f"{m['rounds_stop']}; A/A {aa.get('ratio', float('nan')):.3f} {aa.get('ci')} "
              f"({'clean: contains 1.0' if clean else 'NOT clean'}), too busy: {m['noise']['too_busy']}; "
              f"load after tune: {os.getloadavg()[0]:.1f}")
        ms, notes = side_by_side(factory, res.best, rounds=a.rounds, steps=a.steps,
                                 hand_loops=tuple(h.strip() for h in a.hand.split(",") if h.strip()))
        tuned_k = next(k for k in ms if k.startswith("tuned"))
        hand = {k: v for k, v in ms.items() if k.startswith("hand")}
        best_k = min(hand, key=lambda k: statistics.median(hand[k]))
        for k, v in ms.items():
            print(f"  {k:40s} {statistics.median(v):8.1f} ms/step (n={len(v)})" + (f"  [{notes[k]}]" if k in notes
                                                                                    else ""))
        ratio = speedup_ci(ms[best_k], ms[tuned_k])  # >1: tuned is faster than the best hand-written
        if ratio is None:  # the fastest hand-written loop had a single sample: a plain ratio of medians
            r = statistics.median(ms[best_k]) / statistics.median(ms[tuned_k])
            ratio = (r, r, r)
        slowdown = 1 / ratio[0]
        within = slowdown <= 1.05
        ok_all &= within
        print(f"  tuned / fastest hand-written ({best_k}): {slowdown:.3f}x step time "
              f"(speed ratio {ratio[0]:.3f}, 95% CI {ratio[1]:.3f}-{ratio[2]:.3f}) -> "
              f"{'within 5%' if within else 'NOT within 5%'}")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f} (shared host)")
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
