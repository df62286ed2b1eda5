"""DDP for a model that fits on one device, and the process helpers an Accelerate user reaches for.

    acc = overdrive.accelerate(model, "auto", distributed="ddp", grad_accum_steps=4)   # under torchrun
    acc.backward(loss)                 # micro-steps 1-3 inside DDP's no_sync(): no all-reduce
    acc.reduce(loss, "mean")           # the mean over ranks (a new tensor; `loss` is unchanged)
    acc.gather(preds)                  # every rank's rows, concatenated on dim 0 (uneven dim 0 too)
    acc.main_print("step", n)          # printed by rank 0 only
    acc.wait()                         # every rank reaches this line before any goes on
    acc.unwrap().save_pretrained(dir)  # the user's own module, without the DDP wrapper

Each helper works unchanged in one process (world 1): gather returns its input, reduce a copy.
"""

from __future__ import annotations

import builtins

import torch
import torch.distributed as dist
from torch import nn

from overdrive.dataloader import _tree_map, prepare_dataloader
from overdrive.errors import UserError

__all__ = ["rank_world", "wrap_ddp", "unwrap", "gather", "reduce", "wait", "main_print", "is_ddp", "ProcessHelpers"]

# torch's default bucket size; said in the report so a user tuning overlap knows the starting point.
BUCKET_MB = 25


def rank_world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_ddp(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel)


def wrap_ddp(model: nn.Module, device: torch.device, *, static_graph: bool = False,
             bucket_cap_mb: int = BUCKET_MB) -> nn.parallel.DistributedDataParallel:
    """DistributedDataParallel over `model` (already on `device`): rank 0's parameters are broadcast at
    construction, gradients are averaged in `bucket_cap_mb` buckets overlapped with the backward."""
    if not dist.is_initialized():
        raise UserError("distributed='ddp' needs a process group: run under torchrun --nproc_per_node=N")
    ids = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else None  # CPU (gloo): no device_ids
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb,
                                               static_graph=static_graph)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module: DDP's `.module` (FSDP2 and the recipe's swaps work in place, so nothing else
    wraps it; compile too runs in place, so there is no `_orig_mod` to strip)."""
    while is_ddp(model):
        model = model.module
    return model


def _gather_one(t: torch.Tensor, world: int) -> torch.Tensor:
    x = t.detach()
    if x.dim() == 0:
        x = x.reshape(1)
    # dim 0 may differ (the last batch of an epoch): all-gather the sizes, pad to the largest, trim.
    shape = torch.tensor(list(x.shape), dtype=torch.int64, device=x.device)
    shapes = [torch.empty_like(shape) for _ in range(world)]
    dist.all_gather(shapes, shape)
    rows = [int(s[0]) for s in shapes]
    if any(s.numel() != shape.numel() or not torch.equal(s[1:], shape[1:]) for s in shapes):
        raise UserError(f"gather: the ranks' tensors differ beyond dim 0 ({[s.tolist() for s in shapes]}): "
                        "gather tensors whose shapes agree except in the first dimension")
    pad = max(rows) - x.shape[0]
    if pad:
        x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
    cast = x.dtype == torch.bool  # gloo has no bool all_gather
    if cast:
        x = x.to(torch.uint8)
    out = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(out, x.contiguous())
    res = torch.cat([o[:r] for o, r in zip(out, rows)])
    return res.bool() if cast else res


def gather(obj, *, world: int | None = None):
    """Every rank's tensors concatenated on dim 0 (a 0-d tensor becomes one row per rank), in rank order;
    nested dicts/lists/tuples of tensors keep their structure. One process: returned as given."""
    world = rank_world()[1] if world is None else world
    if world == 1:
        return obj
    return _tree_map(lambda t: _gather_one(t, world), obj)


_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def reduce(obj, op: str = "mean"):
    """A new tensor (or structure of tensors) holding the reduction over ranks: "mean", "sum", "max",
    "min". The input is left unchanged (all_reduce works in place, so on a clone)."""
    if op not in _OPS:
        raise UserError(f"reduce(op={op!r}): use one of {sorted(_OPS)}")
    world = rank_world()[1]

    def one(t: torch.Tensor) -> torch.Tensor:
        x = t.detach().clone()
        if world == 1:
            return x
        mean_int = op == "mean" and not x.is_floating_point()
        if mean_int:
            x = x.double()  # an integer mean would truncate
        dist.all_reduce(x, op=_OPS[op])
        return x / world if op == "mean" else x

    return _tree_map(one, obj)


def wait() -> None:
    """A barrier over every rank (no-op in one process): e.g. before rank 0 reads what all ranks wrote."""
    if rank_world()[1] > 1:
        dist.barrier()


def main_print(*args, **kwargs) -> None:
    """`print` on rank 0 only (Accelerate's `accelerator.print`)."""
    if rank_world()[0] == 0:
        builtins.print(*args, **kwargs)


class ProcessHelpers:
    """The methods `Accelerated` gets for data and processes (Accelerate's prepare(dataloader), gather,
    reduce, print, is_main_process, wait_for_everyone, unwrap_model). Needs self.model, self.device,
    self.dataloaders."""

    def prepare_dataloader(self, loader, *, seed: int | None = None):
        """`loader` sharded over the ranks (its batch_size is per rank), batches on acc.device, reshuffled
        per epoch; its position is saved by acc.save and restored by acc.load (overdrive.dataloader)."""
        rank, world = self._rank_world()
        prepared = prepare_dataloader(loader, device=self.device, rank=rank, world=world, seed=seed)
        self.dataloaders.append(prepared)
        return prepared

    def _rank_world(self) -> tuple[int, int]:
        return rank_world()  # the process group's, as Accelerate: torchrun without distributed= too

    @property
    def process_index(self) -> int:
        return self._rank_world()[0]

    @property
    def num_processes(self) -> int:
        return self._rank_world()[1]

    @property
    def is_main_process(self) -> bool:
        return self._rank_world()[0] == 0

    def gather(self, obj):
        """Every rank's tensors concatenated on dim 0, in rank order (nested structures kept)."""
        return gather(obj, world=self.num_processes)

    def reduce(self, obj, op: str = "mean"):
        """A new tensor: the "mean" (default), "sum", "max" or "min" over ranks."""
        return reduce(obj, op)

    def main_print(self, *args, **kwargs) -> None:
        """print on the main process only."""
        if self.is_main_process:
            print(*args, **kwargs)

    def wait(self) -> None:
        """Every rank waits here for the others (a barrier; nothing in one process)."""
        wait()

    def unwrap(self, model: nn.Module | None = None) -> nn.Module:
        """The user's module without the DDP wrapper (for save_pretrained, or attribute access)."""
        return unwrap(self.model if model is None else model)

    # HF Accelerate's names for the same calls, so a script keeps its lines.
    wait_for_everyone = wait
    unwrap_model = unwrap
