"""A real 1-rank process group for tests: FSDP2 and DDP run for real, with nothing to communicate."""

from __future__ import annotations

import contextlib

import torch.distributed as dist


@contextlib.contextmanager
def one_rank_group(tmp_path, backend: str = "gloo"):
    dist.init_process_group(backend, init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
