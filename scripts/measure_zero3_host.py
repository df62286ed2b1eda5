"""Time the host cost DeepSpeed ZeRO-3 adds to an eager training micro-step, per transformer block: the number
behind the planner's ZeRO-3 term of its host-bound floor (`overdrive.plan.host`).

ZeRO-3 registers hooks on every submodule (deepspeed/runtime/zero/parameter_offload.py): before a module's
forward it fetches the module's parameters (`fetch_sub_module`: the trace bookkeeping, an all-gather per fetch,
prefetches), after it releases them, and the backward does the same through autograd functions wrapped around
each module's inputs and outputs; every trained parameter's gradient hook then copies it into the reduce bucket
and the bucket is reduce-scattered every micro-batch. That is Python per module and per parameter, whatever the
tensors' size, on top of the ops eager PyTorch dispatches anyway. It hides while the GPU is busy and sets the
pace when the GPU work is short (short sequences, LoRA, a ZeRO-3 run on few GPUs).

Measured as the difference between the same Hugging Face Llama (LlamaForCausalLM, hidden 64, 8 tokens, fp32)
run plain and under `deepspeed.initialize` with ZeRO stage 3 (its defaults: no offload, contiguous gradients,
overlap_comm), A and B interleaved, the fastest of many micro-steps each, at 2 and 6 blocks: per block =
(extra at 6 − extra at 2) / 4. With PEFT's LoRA on every linear (each adapter is a module of its own, hooked
as well) and with HF's gradient checkpointing (the recomputed forward fetches again). One process, gloo, world
size 1 (DS_ACCELERATOR=cpu): the hooks run, the collectives are one-rank no-ops, CUDA's events and stream waits
are absent, so this is a lower bound of what a GPU host pays. The same run times plain PyTorch's host cost per
ATen op, so the result is also given in ops' worth (extra time / time per op, on this host's clock:
`HOST_US_PER_OP_CPU`): the planner multiplies that by a GPU host's time per op (`HOST_US_PER_OP`).

  DS_ACCELERATOR=cpu python scripts/measure_zero3_host.py [--repeats N] [--out FILE]
  (default FILE: benchmarks/results/cpu/<date>-zero3-host/zero3-host.json)

Needs deepspeed, transformers and peft (the planner reads the committed numbers, not this script).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for _k, _v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29531"), ("RANK", "0"), ("WORLD_SIZE", "1"),
               ("LOCAL_RANK", "0")):
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
from overdrive.io import write_atomic  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure_host_ops import _Count, _cpu_name, _model  # noqa: E402


def _ds_config() -> dict:
    # accumulation never reaches a step: only forward + backward are timed (ZeRO-3 reduces every micro-batch)
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1_000_000,
            "zero_optimization": {"stage": 3},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}


def _pair(layers: int, lora: bool, ckpt: bool):
    import deepspeed
    torch.manual_seed(0)
    plain = _model(layers, lora, ckpt, torch.float32, "cpu")
    torch.manual_seed(0)
    model = _model(layers, lora, ckpt, torch.float32, "cpu")
    engine, *_ = deepspeed.initialize(model=model, config=_ds_config(),   # the trained parameters, as HF's Trainer
                                      model_parameters=[p for p in model.parameters() if p.requires_grad])
    ids = torch.randint(0, 256, (1, 8))

    def plain_step():
        plain(input_ids=ids, labels=ids).loss.backward()
        plain.zero_grad(set_to_none=True)

    def zero3_step():
        engine.backward(engine(input_ids=ids, labels=ids).loss)

    return plain, plain_step, zero3_step


def extra_time(layers: int, lora: bool, ckpt: bool, repeats: int) -> dict:
    """Fastest plain and ZeRO-3 micro-steps, interleaved, and the plain step's ATen op count."""
    plain, plain_step, zero3_step = _pair(layers, lora, ckpt)
    for _ in range(10):
        plain_step()
        zero3_step()
    c = _Count()
    with c:
        plain_step()
    tp, tz = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        plain_step()
        tp.append(time.perf_counter() - t)
        t = time.perf_counter()
        zero3_step()
        tz.append(time.perf_counter() - t)
    return {"plain_s": min(tp), "zero3_s": min(tz), "plain_ops": c.n,
            "modules": sum(1 for _ in plain.modules()), "params": sum(1 for _ in plain.parameters())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=150)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    import deepspeed
    import peft
    import transformers
    deepspeed.init_distributed(dist_backend="gloo")
    cases = {}
    for lora in (False, True):
        for ckpt in (False, True):
            key = f"{'lora' if lora else 'full'}-{'ckpt' if ckpt else 'none'}"
            r2, r6 = (extra_time(n, lora, ckpt, a.repeats) for n in (2, 6))
            e2, e6 = (r["zero3_s"] - r["plain_s"] for r in (r2, r6))
            us_op = 1e6 * r6["plain_s"] / r6["plain_ops"]
            per_block_us = 1e6 * (e6 - e2) / 4
            cases[key] = {"zero3_us_per_block": per_block_us, "zero3_us_outside_blocks": 1e6 * e2 - 2 * per_block_us,
                          "plain_us_per_op": us_op, "zero3_ops_worth_per_block": per_block_us / us_op,
                          "modules_per_block": (r6["modules"] - r2["modules"]) / 4,
                          "params_per_block": (r6["params"] - r2["params"]) / 4, "runs": {"2": r2, "6": r6}}
            print(f"{key:10s} ZeRO-3 adds {per_block_us:6.0f} us per block ({per_block_us / us_op:5.0f} ops' worth at "
                  f"{us_op:.2f} us per op), {cases[key]['modules_per_block']:.0f} modules per block")
    result = {"date": datetime.date.today().isoformat(), "device": "cpu", "cpu": _cpu_name(), "cpus": os.cpu_count(),
              "load_1min": os.getloadavg()[0], "torch": torch.__version__, "deepspeed": deepspeed.__version__,
              "transformers": transformers.__version__, "peft": peft.__version__, "python": sys.version.split()[0],
              "repeats": a.repeats, "cases": cases}
    out = a.out or f"benchmarks/results/cpu/{datetime.date.today().isoformat()}-zero3-host/zero3-host.json"
    write_atomic(out, json.dumps(result, indent=1))   # a crash leaves the old file or the new one
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
