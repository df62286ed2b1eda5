"""A GPU host's time per eager op, from a published eager step that the host bounds: the planner's HOST_US_PER_OP.

stas00/ml-engineering @ 744d01e1 (training/performance/README.md, "Two measurements on a single NVIDIA B200 with
torch=2.13.0+cu130, taken 2026-08-09") times Hugging Face's Llama 3.2 1B (NousResearch/Llama-3.2-1B), bf16
weights, SDPA, batch 1 x sequence 512, eager, with its own script (training/performance/benchmarks/
torch-compile-bench.py): forward under no_grad 8.1 ms; `zero_grad(set_to_none)` + forward with labels + backward
under `gradient_checkpointing_enable()` 48.8 ms (steady state, mean of 10 steps after 3 warm-ups, synchronized).
The same step compiled by Inductor and replayed as CUDA graphs (`mode="reduce-overhead"`) takes 8.1 ms: fused, so a
lower bound on the eager step's GPU work, which launches about 2,400 small kernels (the planner's estimate of it:
7.2 ms) and is still well under 48.8 ms, so the eager step is the host's: dispatching its ops one by one. One
device-to-host sync a forward (transformers' mask code asks `.all()` of a tensor) makes each step wait for the
last one's GPU tail, which the 48.8 ms include: the figure slightly overstates the host's cost.

This script counts the ATen ops that workload dispatches (the same model structure: 16 blocks, 32 heads over 8
KV heads, tied embeddings, vocab 128,256, llama3 RoPE scaling; tiny widths, which do not change the count; the
tokens and the steps as torch-compile-bench.py writes them) and divides: the host's microseconds per op. The
training step's figure is the planner's (autograd's bookkeeping is in it, as in every step it plans); the forward's
is printed beside it. The source names no transformers version: counted with the installed one, whose
`gradient_checkpointing_enable()` is non-reentrant (transformers' default since 2026-01); the reentrant default
before it dispatches fewer ops, which would put the figure higher, and that count is recorded beside it. Where a
GPU is lent, scripts/gpu_check.sh runs this with --device cuda --repeats N: the same step at tiny widths timed on
that GPU's host, where the GPU's work is negligible, so the step is the host's ("measured_here").

  python scripts/host_us_published.py [--device cpu|cuda --repeats N] [--out FILE]
  (default FILE: benchmarks/results/cpu/<date>-host-us-published/host-us.json)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure_host_ops import _Count  # noqa: E402

from overdrive.io import write_atomic  # noqa: E402

SOURCE = ("stas00/ml-engineering @ 744d01e18b79512572f64a6bbd8b5f4a725203a7 training/performance/README.md "
          "(the Llama 3.2 1B table: eager column) and training/performance/benchmarks/torch-compile-bench.py")
# the published eager steady-state milliseconds (B200, torch 2.13.0+cu130), and the CUDA-graphed step beside them
PUBLISHED_MS = {"forward": 8.1, "forward+backward": 48.8}
GRAPHED_MS = {"forward": 1.9, "forward+backward": 8.1}
SEQ, VOCAB_DRAWN = 512, 30000   # torch.randint(0, 30000, (BATCH, SEQ)): the script's tokens


def _model(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=32, num_key_value_heads=8,
                      num_hidden_layers=layers, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0,
                      rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                    "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                      max_position_embeddings=131072, attn_implementation="sdpa")
    # built as from_pretrained(dtype=bf16) builds it: parameters in bf16, the rotary inv_freq (computed in fp32) kept
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)


def _step(layers: int, workload: str, reentrant: bool | None, device: str):
    """torch-compile-bench.py's `workload` step on `device`, as a function (the model built, warmed up once)."""
    torch.manual_seed(0)
    model = _model(layers).to(device)
    training = workload != "forward"
    model.train(training)
    tokens = torch.randint(0, VOCAB_DRAWN, (1, SEQ), device=device)
    if training:
        model.config.use_cache = False
        kw = {} if reentrant is None else {"gradient_checkpointing_kwargs": {"use_reentrant": reentrant}}
        model.gradient_checkpointing_enable(**kw)

    def step():
        if not training:
            with torch.no_grad():
                model(input_ids=tokens)
            return
        model.zero_grad(set_to_none=True)
        model(input_ids=tokens, labels=tokens).loss.backward()

    step()
    return step


def count_ops(layers: int, workload: str, reentrant: bool | None = None, device: str = "cpu") -> int:
    """ATen ops one step of torch-compile-bench.py's `workload` dispatches (eager, after a warm-up step);
    `reentrant`: force torch.utils.checkpoint's mode (None: the installed transformers' default)."""
    step = _step(layers, workload, reentrant, device)
    c = _Count()
    with c:
        step()
    return c.n


def time_step(layers: int, workload: str, device: str, repeats: int) -> dict:
    """This host's time per op on that step: tiny widths, so the GPU's work is negligible and the step is the
    host's (3 more warm-ups, then `repeats` synchronized steps, as torch-compile-bench.py times them)."""
    step, n = _step(layers, workload, None, device), count_ops(layers, workload, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        step()
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    return {"ops": n, "step_ms_median": round(1e3 * statistics.median(times), 3),
            "us_per_op_median": round(1e6 * statistics.median(times) / n, 2),
            "us_per_op_fastest": round(1e6 * min(times) / n, 2)}


def derive(layers: int = 16) -> dict:
    out = {}
    for workload, ms in PUBLISHED_MS.items():
        n = count_ops(layers, workload)
        out[workload] = {"published_eager_ms": ms, "published_cuda_graphs_ms": GRAPHED_MS[workload], "ops": n,
                         "us_per_op": round(1e3 * ms / n, 2),
                         "cuda_graphs_over_eager": round(GRAPHED_MS[workload] / ms, 3)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where to count the ops and, with --repeats (cuda only), time the step on its host")
    ap.add_argument("--repeats", type=int, default=0, help="timed steps on --device (0: count only)")
    a = ap.parse_args(argv)
    if a.repeats < 0:
        ap.error(f"--repeats {a.repeats}: give 0 (count only) or more timed steps")
    if a.repeats and a.device == "cpu":
        ap.error("--repeats needs --device cuda: on a CPU the step's 65M-logit loss is the CPU's own work, "
                 "not dispatch")
    torch.set_num_threads(1)
    import transformers
    rows = derive()
    reentrant = count_ops(16, "forward+backward", reentrant=True)
    here = {}
    if a.repeats:
        here = {w: time_step(16, w, a.device, a.repeats) for w in PUBLISHED_MS}
        here["device"] = torch.cuda.get_device_name() if a.device == "cuda" else a.device
        print(f"this host ({here['device']}): " + ", ".join(
            f"{w} {here[w]['us_per_op_median']:.2f} us per op" for w in PUBLISHED_MS)
            + f"; plan this host with overdrive plan ... --host-us "
              f"{here['forward+backward']['us_per_op_median']:.2f}")
    for workload, r in rows.items():
        print(f"{workload:18s} {r['ops']:5d} ops, {r['published_eager_ms']} ms eager on the B200's host -> "
              f"{r['us_per_op']:.2f} us per op (CUDA graphs: {r['published_cuda_graphs_ms']} ms)")
    today = datetime.date.today().isoformat()
    result = {"date": today, "source": SOURCE, "gpu": "B200 (the source's)", "torch_published": "2.13.0+cu130",
              "torch_counted": torch.__version__, "transformers_counted": transformers.__version__,
              "model": "Llama 3.2 1B structure (16 blocks, 32/8 heads, tied, vocab 128256), batch 1 x 512",
              "transformers_published": "not stated", "checkpointing": "non-reentrant (the counted default)",
              "workloads": rows, "us_per_op": rows["forward+backward"]["us_per_op"],
              "if_reentrant": {"ops": reentrant,
                               "us_per_op": round(1e3 * PUBLISHED_MS["forward+backward"] / reentrant, 2)},
              **({"measured_here": here} if here else {})}
    out = a.out or f"benchmarks/results/cpu/{today}-host-us-published/host-us.json"
    write_atomic(out, json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
