"""Count the ATen ops one eager training micro-step dispatches per transformer block, and time the host's cost
per op: the two numbers behind the planner's host-bound floor (`overdrive.plan.host`).

Eager PyTorch launches every op from Python: dispatcher, autograd bookkeeping and the launch (or, on a CPU, the
tiny kernel itself) cost the host microseconds whatever the tensor sizes. When a micro-batch's GPU work is short
(short sequences, LoRA, small models) the GPU waits for the host. The counts are exact for the code measured:
Hugging Face transformers' Llama block (LlamaForCausalLM, SDPA attention), under HF's own
`gradient_checkpointing_enable()` for full checkpointing and PEFT's LoRA on every linear of the block, with
torch.autocast (what the HF Trainer / Lightning / plain AMP run) or with the model in bf16 (DeepSpeed's and FSDP's
mixed precision: no per-op casts). Per block = (ops with 4 blocks − ops with 2) / 2; what is left is the
embedding, the final norm, the head and the loss.

The time per op is measured here, on tiny tensors (hidden 64, 8 tokens) in fp32, as the fastest of many
micro-steps divided by their op count (4 checkpointed blocks, no LoRA): a lower bound on a GPU host, where each
kernel-launching op also pays cudaLaunchKernel: the planner plans a GPU host's (scripts/host_us_published.py,
which gpu_check.sh runs on the GPU it has). --device cuda times this step on a GPU host too (without peft there it
counts the non-LoRA cases only; the counts do not depend on the device).

  python scripts/measure_host_ops.py [--device cpu|cuda] [--out FILE]
  (default FILE: benchmarks/results/<device>/<date>-host-ops/host-ops.json)

Needs transformers, and peft for the LoRA counts (the planner reads the committed numbers, not this script).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from overdrive.io import write_atomic


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _model(layers: int, lora: bool, ckpt: bool, dtype: torch.dtype, device: str, hidden: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=4,
                      num_hidden_layers=layers, vocab_size=256, tie_word_embeddings=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype)
    if ckpt:
        model.gradient_checkpointing_enable()
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        if ckpt:
            model.enable_input_require_grads()   # what PEFT + checkpointing need, as the HF Trainer sets it up
    model.train()
    return model


def _micro_step(model, ids, autocast: bool, device: str):
    ctx = torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()


def count_ops(layers: int, *, lora: bool, ckpt: bool, autocast: bool, device: str = "cpu") -> int:
    """ATen ops dispatched by one forward + loss + backward (no optimizer step)."""
    torch.manual_seed(0)
    dtype = torch.float32 if autocast else torch.bfloat16
    model = _model(layers, lora, ckpt, dtype, device)
    ids = torch.randint(0, 256, (1, 8), device=device)
    _micro_step(model, ids, autocast, device)   # first call: lazy initialisations
    model.zero_grad(set_to_none=True)
    c = _Count()
    with c:
        _micro_step(model, ids, autocast, device)
    return c.n


def us_per_op(device: str, repeats: int) -> dict:
    """Fastest micro-step over `repeats` (4 checkpointed blocks in fp32, no LoRA: no peft needed) / its ops."""
    torch.manual_seed(0)
    model = _model(4, False, True, torch.float32, device)
    ids = torch.randint(0, 256, (1, 8), device=device)
    _micro_step(model, ids, False, device)
    model.zero_grad(set_to_none=True)
    c = _Count()
    with c:
        _micro_step(model, ids, False, device)
    n = c.n
    model.zero_grad(set_to_none=True)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        _micro_step(model, ids, False, device)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        model.zero_grad(set_to_none=True)
    return {"ops": n, "fastest_s": min(times), "median_s": statistics.median(times),
            "us_per_op_fastest": 1e6 * min(times) / n, "us_per_op_median": 1e6 * statistics.median(times) / n}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    import transformers
    try:
        import peft
    except ImportError:   # the GPU image has no peft: the counts do not depend on the device, the CPU run has them
        peft = None
    per_block, rest = {}, {}
    for lora in (False, True) if peft else (False,):
        for ckpt in (False, True):
            for autocast in (False, True):
                key = f"{'lora' if lora else 'full'}-{'ckpt' if ckpt else 'none'}-{'autocast' if autocast else 'bf16'}"
                c2, c4 = (count_ops(n, lora=lora, ckpt=ckpt, autocast=autocast) for n in (2, 4))
                per_block[key] = (c4 - c2) / 2
                rest[key] = c2 - 2 * per_block[key]
                print(f"{key:24s} ops per block {per_block[key]:6.0f}   outside the blocks {rest[key]:5.0f}")
    timing = us_per_op(a.device, a.repeats)
    print(f"host time per op on {a.device}: fastest {timing['us_per_op_fastest']:.2f} us, "
          f"median {timing['us_per_op_median']:.2f} us ({timing['ops']} ops per micro-step)")
    result = {"date": datetime.date.today().isoformat(), "device": a.device,
              "cpu": _cpu_name(), "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0],
              "torch": torch.__version__, "transformers": transformers.__version__,
              "peft": peft.__version__ if peft else None,
              "python": sys.version.split()[0], "ops_per_block": per_block, "ops_outside_blocks": rest,
              "timing": timing}
    if torch.cuda.is_available() and a.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    out = a.out or f"benchmarks/results/{a.device}/{datetime.date.today().isoformat()}-host-ops/host-ops.json"
    write_atomic(out, json.dumps(result, indent=1))   # a crash leaves the old file or the new one
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
