"""Does `overdrive tune` pick a recipe as fast as the fastest plain loop a user would write by hand?

Runs `overdrive tune FILE.py:FN --batch FILE.py:FN` (the CLI, as a user would), applies its winner
with `overdrive.accelerate(model, Recipe.load(recipe.json))`, and times it in ONE process beside the
plain PyTorch loops a user writes by hand, all with the same torch thread count (the one tune's
workers used):
  fp32 (torch's default AdamW), fp32 + fused AdamW, bf16 autocast (default AdamW), bf16 autocast +
  fused AdamW, and (unless --no-compile) torch.compile(model) under fp32 and under bf16 autocast,
  both with fused AdamW.
Each contender has its own model and optimizer and gets the same batches. Warm-up (compilation
included) is untimed; then interleaved rounds in a fresh random order each round, `--steps` steps
per turn. The figure is tuned / fastest-hand step time, as the geometric mean of per-round ratios with
the bootstrap-over-rounds interval of `overdrive.measure.stats.paired_ci` (95%). "Within 5%": the
point estimate is at most 1.05 (and "surely" when the whole interval is).

    PYTHONPATH=src python benchmarks/tune_vs_plain.py MODELS.py:llama --batch MODELS.py:llama_batch \\
        --budget-s 150 --json-out out.json

The host's load (the 1-minute average and the runnable count, as `uptime` and /proc/loadavg say) is
printed at the start, after tune, and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)


def _load() -> str:
    try:
        with open("/proc/loadavg") as f:
            parts = f.read().split()
        return f"load {parts[0]} {parts[1]} {parts[2]}, runnable {parts[3]}"
    except OSError:
        return "load unknown"


def _run_tune(args, threads: int, out: str) -> dict:
    cmd = [sys.executable, "-m", "overdrive", "tune", args.factory, "--batch", args.batch, "--budget-s",
           str(args.budget_s), "--threads", str(threads), "--out", out]
    if args.loss:
        cmd += ["--loss", args.loss]
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"overdrive tune failed (exit {p.returncode})")
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    res["_took_s"] = took
    return res


def _contenders(args, recipe_path: str) -> dict:
    import torch

    from overdrive import accelerate
    from overdrive.recipes import Recipe
    from overdrive.tuning.workload import compute_loss, load_file_fn

    factory = load_file_fn(args.factory, "the model factory")
    loss_fn = load_file_fn(args.loss, "the loss function") if args.loss else None
    recipe = Recipe.load(recipe_path)

    torch.manual_seed(0)
    acc = accelerate(factory(), recipe, grad_clip=None)

    def tuned(b):
        loss = compute_loss(acc.model, b, loss_fn)
        acc.backward(loss)
        acc.step()

    def hand(bf16: bool, fused: bool, compiled: bool):
        torch.manual_seed(0)
        m = factory()
        opt = torch.optim.AdamW(m.parameters(), lr=3e-4, **({"fused": True} if fused else {}))
        fwd = torch.compile(m) if compiled else m

        def step(b):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = compute_loss(fwd, b, loss_fn)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    fns = {f"tuned ({recipe.name})": tuned,
           "hand fp32": hand(False, False, False),
           "hand fp32 + fused AdamW": hand(False, True, False),
           "hand bf16 autocast": hand(True, False, False),
           "hand bf16 autocast + fused AdamW": hand(True, True, False)}
    if not args.no_compile:
        fns["hand fp32 + compile + fused AdamW"] = hand(False, True, True)
        fns["hand bf16 autocast + compile + fused AdamW"] = hand(True, True, True)
    return fns


def side_by_side(args, recipe_path: str, threads: int) -> dict:
    import torch

    from overdrive.measure.stats import paired_ci, round_medians
    from overdrive.tuning.workload import load_file_fn

    torch.set_num_threads(threads)
    batch_fn = load_file_fn(args.batch, "the batch function")
    fns = _contenders(args, recipe_path)
    first: dict[str, float] = {}
    warm: dict[str, list[float]] = {k: [] for k in fns}
    for k, f in fns.items():  # warm-up, untimed in the figures: compilation, allocator growth
        for i in range(args.warmup):
            t = time.perf_counter()
            f(batch_fn(i))
            ms = (time.perf_counter() - t) * 1e3
            if i == 0:
                first[k] = ms
            else:
                warm[k].append(ms)
    fast = min(statistics.median(v) for v in warm.values() if v)
    # A loop over 3x the fastest after warm-up (bf16 on a CPU without bf16 units: ~70x) cannot be the
    # fastest: it keeps its warm-up figures and leaves the rounds (its long turns would only add noise).
    live = [k for k in fns if k.startswith("tuned") or statistics.median(warm[k]) <= 3 * fast]
    rounds: dict[str, list[list[float]]] = {k: [] for k in fns}
    step_i = args.warmup
    t0 = time.perf_counter()
    for r in range(args.rounds):
        order = list(live)
        random.Random(r).shuffle(order)
        for k in order:
            turn = []
            for _ in range(args.steps):
                b = batch_fn(step_i % 1000)
                step_i += 1
                t = time.perf_counter()
                fns[k](b)
                turn.append((time.perf_counter() - t) * 1e3)
            rounds[k].append(turn)
        if args.max_s and time.perf_counter() - t0 > args.max_s and r >= 5:
            break
    med = {k: round_medians(v) for k, v in rounds.items()}
    tuned = next(k for k in fns if k.startswith("tuned"))
    hands = [k for k in live if k != tuned]
    fastest = min(hands, key=lambda k: statistics.median(med[k]))
    out = {"threads": threads, "rounds": len(med[tuned]), "steps_per_turn": args.steps, "contenders": {}}
    for k in fns:
        row = {"median_ms": statistics.median(med[k]) if med[k] else statistics.median(warm[k] or [first[k]]),
               "first_step_ms": first[k], "timed": k in live}
        if k in live and k != tuned:
            ci = paired_ci(med[tuned], med[k])  # per round tuned_ms / this_ms: the step-time ratio
            row["tuned_over_this"] = list(ci) if ci else None
        out["contenders"][k] = row
    ci = paired_ci(med[tuned], med[fastest])
    out["fastest_hand"] = fastest
    out["tuned_over_fastest"] = {"ratio": ci[0], "ci": [ci[1], ci[2]]} if ci else None
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("factory", help="FILE.py:FN returning a fresh nn.Module")
    p.add_argument("--batch", required=True, help="FILE.py:FN(step) returning a batch")
    p.add_argument("--loss", help="FILE.py:FN(model, batch) returning the scalar loss")
    p.add_argument("--budget-s", type=float, default=150, help="overdrive tune's budget")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for tune's workers and the hand loops (default: what tune plans for one "
                        "worker stepping at a time on this host now)")
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--steps", type=int, default=3, help="steps per contender per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-s", type=float, default=240, help="stop the side-by-side rounds after this long (>= 6 rounds)")
    p.add_argument("--no-compile", action="store_true", help="no torch.compile hand loops")
    p.add_argument("--tune-out", help="keep tune's folder here (default: a temporary one)")
    p.add_argument("--recipe", help="skip tune: time this recipe.json against the hand loops")
    p.add_argument("--json-out", help="write the figures here")
    a = p.parse_args()
    from overdrive.measure.threads import plan_threads

    threads = a.threads or plan_threads(active=1, own_running=1).threads
    report: dict = {"factory": a.factory, "threads": threads, "load_start": _load()}
    print(f"[{time.strftime('%H:%M:%S')}] {_load()}; {threads} torch thread(s) for tune's workers and the hand loops",
          flush=True)
    if a.recipe:
        recipe_path = a.recipe
    else:
        out = a.tune_out or tempfile.mkdtemp(prefix="tune_vs_plain_")
        res = _run_tune(a, threads, out)
        recipe_path = os.path.join(out, "recipe.json")
        aa = (res.get("noise") or {}).get("aa") or {}
        report["tune"] = {"best": res["best"], "summary": res["summary"], "rounds": res.get("rounds"),
                          "rounds_stop": res.get("rounds_stop"), "aa": aa, "too_busy": (res.get("noise") or {}).get("too_busy"),
                          "took_s": res["_took_s"], "folder": out,
                          "candidates": {c["name"]: {"status": c["status"], "step_ms": c["step_ms"],
                                                     "speedup": c["speedup"], "ci": c["speedup_ci"]}
                                         for c in res["candidates"]}}
        print(f"[{time.strftime('%H:%M:%S')}] tune picked {res['best']} in {res['_took_s']:.0f} s over "
              f"{res.get('rounds')} rounds (A/A ±{aa.get('spread_pct', float('nan')):.1f}%"
              f"{', too busy' if report['tune']['too_busy'] else ''}; stopped: {res.get('rounds_stop')})", flush=True)
        print(f"  {res['summary'].splitlines()[0][:300]}", flush=True)
        report["load_after_tune"] = _load()
    fig = side_by_side(a, recipe_path, threads)
    report.update(side_by_side=fig, load_end=_load())
    print(f"[{time.strftime('%H:%M:%S')}] side by side, {fig['rounds']} rounds x {fig['steps_per_turn']} steps, "
          f"{threads} thread(s):")
    for k, r in fig["contenders"].items():
        extra = "" if r["timed"] else " (warm-up only: over 3x the fastest)"
        ci = r.get("tuned_over_this")
        rel = f"  tuned/this {ci[0]:.3f} [{ci[1]:.3f}-{ci[2]:.3f}]" if ci else ""
        print(f"  {k:44s} {r['median_ms']:8.1f} ms  (first step {r['first_step_ms']:.0f} ms){extra}{rel}")
    t = fig["tuned_over_fastest"]
    if t:
        ratio, lo, hi = t["ratio"], t["ci"][0], t["ci"][1]
        verdict = "surely within 5%" if hi <= 1.05 else ("within 5%" if ratio <= 1.05 else "NOT within 5%")
        report["tuned_ms_over_fastest_hand_ms"] = {"ratio": ratio, "ci": [lo, hi], "verdict": verdict}
        print(f"tuned / fastest hand-written ({fig['fastest_hand']}): {ratio:.3f} [{lo:.3f}-{hi:.3f}] step time — "
              f"{verdict}")
    print(f"[{time.strftime('%H:%M:%S')}] {_load()}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
