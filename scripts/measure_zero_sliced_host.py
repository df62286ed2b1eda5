"""Time the host cost of nanotron's ZeRO-1 (ZeroDistributedOptimizer with accumulate_grad_in_fp32, the setting of
its benchmarks), per data-parallel rank and tensor: the numbers behind the planner's `--zero-sliced` term
(`overdrive.plan.host`).

nanotron slices every parameter tensor over the data-parallel ranks (huggingface/nanotron src/nanotron/optim/zero.py
@ c252843, `_partition_parameters`). With fp32 gradient accumulation and ZeRO it builds no DDP (trainer.py: make_ddp
is false when accumulate_grad_in_fp32 and zero_stage > 0): after every backward `_accumulate_grad` adds each 16-bit
gradient into the fp32 buffer tensor by tensor (gradient_accumulator.py), the step all-reduces that buffer in one
call (`sync_gradients_across_dp`, reduce_scatter False), and after the optimizer step `_all_gather_params` moves the
updated weights slice by slice:

  before the call  a slice per rank of every tensor (dp·T views), the lists inverted, one torch.cat per rank
                   (`all_gather_coalesced`, src/nanotron/distributed.py);
  the call         one `dist.all_gather` over a list of dp outputs (ProcessGroupNCCL, same-size outputs: one flat
                   buffer, then a copy_ back into each of the dp outputs);
  after the call   `update_output` unflattens every rank's buffer and copies each of the T pieces back.

Those loops are reproduced here op for op from the source at that commit; only the collective is replaced by what
ProcessGroupNCCL does around it on the host (its flat buffer and copies), since one process cannot be dp ranks.
Tiny tensors (4 elements per rank) so that the time is the host's. The same run times a plain eager micro-step per
ATen op (`measure_host_ops.us_per_op`: the planner's HOST_US_PER_OP_CPU), and each case is given in ops' worth (its
time over that time per op), which the planner multiplies by a GPU host's time per op (HOST_US_PER_OP): one host's
clock for both sides of the ratio. A CPU host pays no kernel launch, so each copy_ and cat costs a GPU host more.

  python scripts/measure_zero_sliced_host.py [--device cpu|cuda] [--repeats N] [--out FILE]
  (default FILE: benchmarks/results/<device>/<date>-zero-sliced-host/zero-sliced-host.json; scripts/gpu_check.sh runs
  it with --device cuda, where the time is the host's and the launches' together, synchronized)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import torch

from overdrive.io import write_atomic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure_host_ops import _cpu_name, us_per_op  # noqa: E402

PER_RANK = 4   # elements of each tensor on each rank: tiny, so the time is the host's


def partition(numel: int, dp: int) -> dict[int, tuple[int, int]]:
    """nanotron's `_partition_parameters` for one tensor: rank -> (start, end), empty slices left out."""
    padded = (numel - 1) // dp + 1
    sizes = np.full(shape=(dp,), fill_value=padded)
    remainder = padded * dp - numel
    if remainder > 0:
        sizes[-remainder:] -= 1
    ends = np.cumsum(sizes)
    starts = np.concatenate([[0], ends[:-1]])
    return {r: (int(starts[r]), int(ends[r])) for r in range(dp) if starts[r] < ends[r]}


def _nccl_all_gather(outputs: list[torch.Tensor], inp: torch.Tensor, rank: int) -> None:
    """What ProcessGroupNCCL::allgather does on the host around ncclAllGather for a list of same-size outputs:
    a flat buffer (newLikeFlat), the collective (here: this rank's piece), a copy_ back into each output."""
    flat = torch.empty((len(outputs), inp.numel()), dtype=inp.dtype, device=inp.device)
    flat[rank].copy_(inp)
    for j, out in enumerate(outputs):
        out.copy_(flat[j])


def all_gather_params(named: list[tuple[str, torch.Tensor]], offsets: dict, dp: int, rank: int,
                      pre_only: bool = False) -> None:
    """ZeroDistributedOptimizer._all_gather_params + nanotron.distributed.all_gather_coalesced (async_op False);
    `pre_only`: stop where the collective would be called."""
    tensors = [(name, p.view(-1)) for name, p in named]
    output_tensor_lists = [[t[slice(*offsets[name][r])] if r in offsets[name]
                            else torch.empty(0, dtype=t.dtype, device=t.device) for r in range(dp)]
                           for name, t in tensors]
    input_tensor_list = [t[slice(*offsets[name][rank])] if rank in offsets[name]
                         else torch.empty(0, dtype=t.dtype, device=t.device) for name, t in tensors]
    # all_gather_coalesced: invert to [group_rank][param_idx], flatten, gather, unflatten and copy back
    output_tensor_lists = [[lst[r] for lst in output_tensor_lists] for r in range(dp)]
    input_buffer = torch._utils._flatten_dense_tensors(input_tensor_list)
    output_buffers = [torch._utils._flatten_dense_tensors(lst) for lst in output_tensor_lists]
    if pre_only:
        return
    _nccl_all_gather(output_buffers, input_buffer, rank)
    for originals, gathered in zip(output_tensor_lists, output_buffers):
        for original, piece in zip(originals, torch._utils._unflatten_dense_tensors(gathered, originals)):
            original.copy_(piece)


def accumulate_grads(entries: list[dict], offsets: dict, rank: int) -> None:
    """FP32GradientAccumulator.backward's loop after loss.backward(): `_accumulate_grad` for every parameter."""
    for e in entries:
        fp32_grad = e["fp32_grad"]
        fp32_grad.add_(e["half"].grad)
        e["half"].grad = None
        start, end = offsets[e["name"]][rank]
        e["fp32"].grad = fp32_grad.view(-1)[start:end]


def _fastest(fn, repeats: int, device: str, setup=lambda: None) -> float:
    """Fastest of `repeats` calls, host clock; on a GPU synchronized before and after (what the step waits for)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        setup()
        fn()
    best = float("inf")
    for _ in range(repeats):
        setup()
        sync()
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def time_after_step(dp: int, tensors: int, repeats: int, device: str) -> tuple[float, float]:
    """(seconds before the collective, seconds of the whole after-step all-gather)."""
    named = [(f"p{i}", torch.randn(dp * PER_RANK, device=device).bfloat16()) for i in range(tensors)]
    offsets = {n: partition(p.numel(), dp) for n, p in named}
    pre = _fastest(lambda: all_gather_params(named, offsets, dp, rank=0, pre_only=True), repeats, device)
    return pre, _fastest(lambda: all_gather_params(named, offsets, dp, rank=0), repeats, device)


def time_accumulate(tensors: int, repeats: int, device: str, dp: int = 8) -> float:
    entries = []
    for i in range(tensors):
        half = torch.randn(dp * PER_RANK, device=device).bfloat16().requires_grad_()
        entries.append({"name": f"p{i}", "half": half, "grad": torch.randn_like(half),
                        "fp32_grad": torch.zeros(half.numel(), device=device),
                        "fp32": torch.zeros(PER_RANK, device=device, requires_grad=True)})
    offsets = {e["name"]: partition(e["half"].numel(), dp) for e in entries}

    def give_grads():
        for e in entries:
            e["half"].grad = e["grad"]
    return _fastest(lambda: accumulate_grads(entries, offsets, rank=0), repeats, device, setup=give_grads)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least squares through the origin: ops' worth per unit, weighted as the big cases (where it matters) weigh."""
    return float(sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    clock = us_per_op(a.device, 200)
    us_op = clock["us_per_op_fastest"]
    after, accumulate = [], []
    for dp in (8, 32, 128):
        for tensors in (16, 64, 200):
            pre, whole = (1e6 * t for t in time_after_step(dp, tensors, a.repeats, a.device))
            after.append({"dp": dp, "tensors": tensors, "pre_us": pre, "us": whole, "pre_ops_worth": pre / us_op,
                          "post_ops_worth": (whole - pre) / us_op, "ops_worth": whole / us_op})
            print(f"dp {dp:4d} tensors {tensors:4d}, after the step: {whole:9.0f} us, {pre:9.0f} of it before the "
                  f"call ({whole / us_op / (dp * tensors):.2f} ops' worth per rank and tensor)")
    for tensors in (16, 64, 200):
        t = 1e6 * time_accumulate(tensors, a.repeats, a.device)
        accumulate.append({"tensors": tensors, "us": t, "ops_worth": t / us_op})
        print(f"{tensors:4d} tensors, fp32 accumulation after the backward: {t:7.0f} us ({t / us_op / tensors:.2f} "
              "ops' worth per tensor)")
    n = [r["dp"] * r["tensors"] for r in after]
    fits = {"pre_per_rank_tensor": slope(n, [r["pre_ops_worth"] for r in after]),
            "post_per_rank_tensor": slope(n, [r["post_ops_worth"] for r in after]),
            "accumulate_per_tensor": slope([r["tensors"] for r in accumulate], [r["ops_worth"] for r in accumulate])}
    for r in after:
        r["fit_residual"] = (fits["pre_per_rank_tensor"] + fits["post_per_rank_tensor"]) * r["dp"] * r["tensors"] / (
            r["ops_worth"]) - 1
    print(f"fit (through the origin): {fits['pre_per_rank_tensor']:.2f} + {fits['post_per_rank_tensor']:.2f} ops' "
          f"worth per rank and tensor before and after the call (residuals "
          f"{100 * min(r['fit_residual'] for r in after):+.0f}% to "
          f"{100 * max(r['fit_residual'] for r in after):+.0f}%), "
          f"{fits['accumulate_per_tensor']:.2f} per tensor accumulating, at {us_op:.2f} us per op")
    result = {"date": datetime.date.today().isoformat(), "device": a.device, "cpu": _cpu_name(),
              "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0], "torch": torch.__version__,
              "python": sys.version.split()[0],
              "source": "huggingface/nanotron @ c252843039cc167ff8d6894b87172af4637eb14b: src/nanotron/optim/zero.py, "
                        "src/nanotron/distributed.py, src/nanotron/optim/gradient_accumulator.py, "
                        "src/nanotron/trainer.py",
              "repeats": a.repeats, "per_rank_elements": PER_RANK, "plain_clock": clock,
              "after_step": after, "accumulate": accumulate, "fit": fits}
    if a.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    out = a.out or (f"benchmarks/results/{a.device}/{datetime.date.today().isoformat()}-zero-sliced-host/"
                    "zero-sliced-host.json")
    write_atomic(out, json.dumps(result, indent=1))   # a crash leaves the old file or the new one
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
