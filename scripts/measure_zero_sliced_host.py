"""Time the host cost of nanotron's ZeRO-1 (ZeroDistributedOptimizer), per data-parallel rank and tensor: the
numbers behind the planner's `--zero-sliced` term (`overdrive.plan.zero_sliced`).

nanotron slices every parameter tensor over the data-parallel ranks (huggingface/nanotron
src/nanotron/optim/zero.py @ c252843, `_partition_parameters`), and moves the pieces tensor by tensor in Python:

  after the step  `_all_gather_params` builds, for every tensor, a slice per rank (dp·T views), flattens the
                  dp lists (`all_gather_coalesced`, src/nanotron/distributed.py: one torch.cat per rank), runs one
                  `dist.all_gather` over a list of dp outputs (ProcessGroupNCCL: one flat buffer, then a copy_ back
                  into each of the dp outputs), then `update_output` unflattens every rank's buffer and copies each
                  of the T pieces back: about three ops per rank and tensor, called synchronously after the step.
  in the backward DDP's comm hook (src/nanotron/optim/gradient_accumulator.py `get_fp32_accum_hook`, reduce_scatter
                  True) adds each bucket's bf16 gradients into the fp32 accumulator, splits every fp32 gradient in
                  dp pieces, flattens the dp lists (`reduce_scatter_coalesced`: a cat per rank), runs one
                  reduce_scatter over a list of dp inputs (ProcessGroupNCCL: a copy_ of each into one flat buffer),
                  and copies the T reduced slices back when it completes.

Those loops are reproduced here op for op from the source at that commit; only the collective itself is replaced by
what ProcessGroupNCCL does around it on the host (its flat buffer and copies), since one process cannot be dp ranks.
Tiny tensors (4 elements per rank) so that the time is the host's. The same run times a plain eager micro-step per
ATen op (`measure_host_ops.us_per_op`: the planner's HOST_US_PER_OP), and each case is given in ops' worth (its time
over that time per op), which the planner multiplies by its own time per op: one host's clock for both. A CPU host
pays no kernel launch, so on a GPU host this is a lower bound (each copy_ and cat launches one there).

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


def _nccl_reduce_scatter(out: torch.Tensor, inputs: list[torch.Tensor], rank: int) -> None:
    """ProcessGroupNCCL::reduce_scatter for a list of inputs: each copied into one flat buffer, then the collective
    (here: this rank's piece)."""
    flat = torch.empty((len(inputs), out.numel()), dtype=out.dtype, device=out.device)
    for j, t in enumerate(inputs):
        flat[j].copy_(t)
    out.copy_(flat[rank])


def all_gather_params(named: list[tuple[str, torch.Tensor]], offsets: dict, dp: int, rank: int) -> None:
    """ZeroDistributedOptimizer._all_gather_params + nanotron.distributed.all_gather_coalesced (async_op False)."""
    tensors = [(name, p.view(-1)) for name, p in named]
    output_tensor_lists = [[t[slice(*offsets[name][r])] if r in offsets[name] else torch.empty(0, dtype=t.dtype, device=t.device)
                            for r in range(dp)] for name, t in tensors]
    input_tensor_list = [t[slice(*offsets[name][rank])] if rank in offsets[name] else torch.empty(0, dtype=t.dtype, device=t.device)
                         for name, t in tensors]
    # all_gather_coalesced: invert to [group_rank][param_idx], flatten, gather, unflatten and copy back
    output_tensor_lists = [[lst[r] for lst in output_tensor_lists] for r in range(dp)]
    input_buffer = torch._utils._flatten_dense_tensors(input_tensor_list)
    output_buffers = [torch._utils._flatten_dense_tensors(lst) for lst in output_tensor_lists]
    _nccl_all_gather(output_buffers, input_buffer, rank)
    for originals, gathered in zip(output_tensor_lists, output_buffers):
        for original, piece in zip(originals, torch._utils._unflatten_dense_tensors(gathered, originals)):
            original.copy_(piece)


def fp32_accum_hook(bucket: list[tuple[str, torch.Tensor, torch.Tensor]], fp32: dict, offsets: dict, dp: int,
                    rank: int) -> None:
    """get_fp32_accum_hook's body with reduce_scatter True, and reduce_scatter_coalesced with its update_output."""
    for name, _, grad in bucket:
        fp32[name].add_(grad.view_as(fp32[name]))
    buffers = [fp32[name].view(-1) for name, _, _ in bucket]
    outputs = [b[slice(*offsets[name][rank])] if rank in offsets[name] else torch.empty(0, dtype=b.dtype, device=b.device)
               for b, (name, _, _) in zip(buffers, bucket)]
    inputs = [torch.split(b, split_size_or_sections=len(b) // dp) for b in buffers]
    out_buffer = torch._utils._flatten_dense_tensors(outputs)
    in_buffers = [torch._utils._flatten_dense_tensors([lst[r] for lst in inputs]) for r in range(dp)]
    _nccl_reduce_scatter(out_buffer, in_buffers, rank)
    for original, reduced in zip(outputs, torch._utils._unflatten_dense_tensors(out_buffer, outputs)):
        original.copy_(reduced)


def _fastest(fn, repeats: int, device: str) -> float:
    """Fastest of `repeats` calls, host clock; on a GPU synchronized before and after (what the step waits for)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def time_after_step(dp: int, tensors: int, repeats: int, device: str) -> float:
    named = [(f"p{i}", torch.randn(dp * PER_RANK, device=device).bfloat16()) for i in range(tensors)]
    offsets = {n: partition(p.numel(), dp) for n, p in named}
    return _fastest(lambda: all_gather_params(named, offsets, dp, rank=0), repeats, device)


def time_hook(dp: int, tensors: int, repeats: int, device: str) -> float:
    bucket = [(f"p{i}", torch.randn(dp * PER_RANK, device=device).bfloat16(),
               torch.randn(dp * PER_RANK, device=device).bfloat16()) for i in range(tensors)]
    fp32 = {n: torch.zeros(p.numel(), device=device) for n, p, _ in bucket}
    offsets = {n: partition(p.numel(), dp) for n, p, _ in bucket}
    return _fastest(lambda: fp32_accum_hook(bucket, fp32, offsets, dp, rank=0), repeats, device)


def fit(rows: list[dict], per: str) -> dict:
    """Least squares of ops' worth on [dp·n, dp, n, 1], n the tensors (`per`): the costs the planner uses."""
    a = np.array([[r["dp"] * r[per], r["dp"], r[per], 1.0] for r in rows])
    y = np.array([r["ops_worth"] for r in rows])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    worst = float(np.max(np.abs(a @ coef - y) / y))
    ratios = [r["ops_worth"] / (r["dp"] * r[per]) for r in rows]
    return {"per_rank_tensor": float(coef[0]), "per_rank": float(coef[1]), "per_tensor": float(coef[2]),
            "constant": float(coef[3]), "worst_relative_residual": worst,
            # one term: ops' worth per rank and tensor alone (what the after-step cost is, 0.85-0.96 in every case)
            "median_per_rank_tensor": float(np.median(ratios)), "range_per_rank_tensor": [min(ratios), max(ratios)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    clock = us_per_op(a.device, 200)
    us_op = clock["us_per_op_fastest"]
    after, hook = [], []
    for dp in (8, 32, 128):
        for tensors in (16, 64, 200):
            t = 1e6 * time_after_step(dp, tensors, a.repeats, a.device)
            after.append({"dp": dp, "tensors": tensors, "us": t, "ops_worth": t / us_op})
            print(f"dp {dp:4d} tensors {tensors:4d}, after the step: {t:9.0f} us ({t / us_op:7.0f} ops' worth, "
                  f"{t / us_op / (dp * tensors):.2f} per rank and tensor)")
        for tensors in (1, 3, 8):   # a DDP bucket (25 MB of 16-bit gradients) holds one to a few tensors
            t = 1e6 * time_hook(dp, tensors, a.repeats, a.device)
            hook.append({"dp": dp, "bucket_tensors": tensors, "us": t, "ops_worth": t / us_op})
            print(f"dp {dp:4d} bucket of {tensors} tensors, the backward's hook: {t:7.0f} us ({t / us_op:5.0f} "
                  "ops' worth)")
    after_fit, hook_fit = fit(after, "tensors"), fit(hook, "bucket_tensors")
    print(f"after the step, one term: {after_fit['median_per_rank_tensor']:.2f} ops' worth per rank and tensor "
          f"(median; {after_fit['range_per_rank_tensor'][0]:.2f}-{after_fit['range_per_rank_tensor'][1]:.2f})")
    for what, f in (("after the step", after_fit), ("per bucket in the backward", hook_fit)):
        print(f"{what}: {f['per_rank_tensor']:.2f} ops' worth per rank and tensor, {f['per_rank']:.2f} per rank, "
              f"{f['per_tensor']:.1f} per tensor, {f['constant']:.0f} per call (worst residual "
              f"{100 * f['worst_relative_residual']:.0f}%) at {us_op:.2f} us per op")
    result = {"date": datetime.date.today().isoformat(), "device": a.device, "cpu": _cpu_name(),
              "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0], "torch": torch.__version__,
              "python": sys.version.split()[0],
              "source": "huggingface/nanotron @ c252843039cc167ff8d6894b87172af4637eb14b: src/nanotron/optim/zero.py, "
                        "src/nanotron/distributed.py, src/nanotron/optim/gradient_accumulator.py",
              "repeats": a.repeats, "per_rank_elements": PER_RANK, "plain_clock": clock,
              "after_step": after, "after_step_fit": after_fit, "hook": hook, "hook_fit": hook_fit}
    if a.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    out = a.out or (f"benchmarks/results/{a.device}/{datetime.date.today().isoformat()}-zero-sliced-host/"
                    "zero-sliced-host.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".part", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(out + ".part", out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
