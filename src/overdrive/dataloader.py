"""The user's DataLoader, prepared as HF Accelerate's `prepare()` does: sharded across ranks, batches on
the device, reshuffled each epoch, and resumable mid-epoch.

    loader = acc.prepare_dataloader(DataLoader(ds, batch_size=4, shuffle=True))   # 4 per rank
    for epoch in range(2):
        for batch in loader:        # this rank's share, already on acc.device; the epoch seeds the order
            ...
    acc.save(dir)                   # records the data position; acc.load(dir) resumes on the next batch

How: the loader is rebuilt on the same dataset with a DistributedSampler (one for every world size,
one process included), so a permutation is drawn from `seed + epoch` and rank r takes every world-th
index. Rank r's first k batches are then exactly the global permutation's first k·batch·world
samples: one process with batch·world per batch sees the same global batches in the same order, and
a position saved on 2 ranks resumes on 1 when the sample count divides. The first batches of a
resumed epoch are skipped in the sampler (their indices are never loaded), not read and dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from overdrive.errors import UserError

__all__ = ["PreparedDataLoader", "prepare_dataloader", "to_device"]


def _tree_map(fn, obj):
    """fn on every tensor of a nested dict/list/tuple/namedtuple (an HF BatchEncoding too), shape kept."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        out = {k: _tree_map(fn, v) for k, v in obj.items()}
        try:
            return out if type(obj) is dict else type(obj)(out)
        except TypeError:  # a Mapping whose constructor wants more than a dict: a plain dict
            return out
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_tree_map(fn, v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_tree_map(fn, v) for v in obj)
    return obj


def to_device(batch, device: torch.device, non_blocking: bool = False):
    """Every tensor of a (nested) batch on `device`; other leaves as they are."""
    return _tree_map(lambda t: t.to(device, non_blocking=non_blocking), batch)


class _ResumableSampler(DistributedSampler):
    """A DistributedSampler that starts `skip` indices into this rank's share (for one epoch only)."""

    skip = 0

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return max(0, self.num_samples - self.skip)


def _shuffle_and_seed(loader: DataLoader, seed: int | None) -> tuple[bool, int]:
    s = loader.sampler
    if isinstance(s, DistributedSampler):
        return s.shuffle, s.seed if seed is None else seed
    if isinstance(s, RandomSampler):
        if s.replacement or s._num_samples is not None:
            raise UserError("prepare_dataloader: a RandomSampler with replacement or num_samples cannot be sharded "
                            "across ranks: use DataLoader(shuffle=True) or a DistributedSampler")
        gen = s.generator or loader.generator
        return True, (gen.initial_seed() if gen is not None else 0) if seed is None else seed
    if isinstance(s, SequentialSampler):
        return False, 0 if seed is None else seed
    raise UserError(f"prepare_dataloader: a {type(s).__name__} cannot be sharded across ranks here: pass a "
                    "DataLoader with shuffle=True/False (or a DistributedSampler), or shard it yourself")


class PreparedDataLoader:
    """Iterates this rank's batches on the device; knows its position (epoch, samples consumed)."""

    def __init__(self, loader: DataLoader, *, device: torch.device | str = "cpu", rank: int = 0, world: int = 1,
                 seed: int | None = None, move_to_device: bool = True) -> None:
        if not isinstance(loader, DataLoader):
            raise UserError(f"prepare_dataloader takes a torch DataLoader, not {type(loader).__name__}")
        if isinstance(loader.dataset, IterableDataset):
            raise UserError("prepare_dataloader: an IterableDataset has no indices to shard: split the stream by "
                            "rank inside the dataset (torch.distributed.get_rank()), then pass it unprepared")
        if loader.batch_size is None:
            raise UserError("prepare_dataloader: a DataLoader built with batch_sampler= cannot be resharded: "
                            "pass batch_size= and shuffle= instead")
        shuffle, self.seed = _shuffle_and_seed(loader, seed)
        self.device = torch.device(device)
        self.rank, self.world = rank, world
        self.batch_size = loader.batch_size
        self.move_to_device = move_to_device
        self.sampler = _ResumableSampler(loader.dataset, num_replicas=world, rank=rank, shuffle=shuffle,
                                         seed=self.seed, drop_last=False)
        kw = dict(batch_size=loader.batch_size, sampler=self.sampler, num_workers=loader.num_workers,
                  collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=loader.drop_last,
                  timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                  persistent_workers=loader.persistent_workers)
        if loader.num_workers > 0:
            kw.update(prefetch_factor=loader.prefetch_factor, multiprocessing_context=loader.multiprocessing_context)
        self.loader = DataLoader(loader.dataset, **kw)
        self.dataset = loader.dataset
        self.epoch = 0
        self.batch = 0
        """Batches this rank has yielded in the current epoch (the next one is the batch-th)."""

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at `epoch` (iteration already advances it by one after each epoch)."""
        self.epoch, self.batch = int(epoch), 0
        self.sampler.skip = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        self.sampler.set_epoch(self.epoch)
        self.sampler.skip = self.batch * self.batch_size  # resume: indices of batches already seen
        pin = self.move_to_device and self.loader.pin_memory and self.device.type == "cuda"
        for b in self.loader:
            self.batch += 1  # counted when handed over, so a save inside the loop resumes on the next one
            yield to_device(b, self.device, non_blocking=pin) if self.move_to_device else b
        self.epoch, self.batch = self.epoch + 1, 0
        self.sampler.skip = 0

    # -- the data position, saved by acc.save and restored by acc.load ---------------------------
    def state_dict(self) -> dict:
        """Epoch, and samples consumed in it over all ranks (global, so another world size can resume)."""
        return {"epoch": self.epoch, "samples": self.batch * self.batch_size * self.world, "seed": self.seed,
                "batch_size": self.batch_size, "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        per_step = self.batch_size * self.world
        samples = int(state["samples"])
        if samples % per_step:
            raise UserError(f"the saved data position ({samples} samples into epoch {state['epoch']}, batch "
                            f"{state['batch_size']} x {state['world']} ranks) is not a whole number of this run's "
                            f"batches ({self.batch_size} x {self.world} ranks): resume with a batch size and rank "
                            "count whose product divides it")
        if int(state["seed"]) != self.seed:
            raise UserError(f"the saved data order was drawn with seed {state['seed']}, this loader's with "
                            f"{self.seed}: pass prepare_dataloader(..., seed={state['seed']}) to resume the same order")
        self.epoch, self.batch = int(state["epoch"]), samples // per_step


def prepare_dataloader(loader: DataLoader, *, device: torch.device | str = "cpu", rank: int = 0, world: int = 1,
                       seed: int | None = None, move_to_device: bool = True) -> PreparedDataLoader:
    """`loader` sharded across `world` ranks (its batch_size is per rank, as in Accelerate), batches moved
    to `device`. seed: the shuffle's (default: the loader's generator's seed, else 0; the same on every
    rank), reseeded with the epoch each time the loader is iterated."""
    return PreparedDataLoader(loader, device=device, rank=rank, world=world, seed=seed,
                              move_to_device=move_to_device)
