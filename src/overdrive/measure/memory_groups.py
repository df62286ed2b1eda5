"""Measuring what needs much memory, a group at a time: the free memory now (GPU or host), and keyed
measurements grouped so that what one group holds fits in it (the inference bench's KV-cache decode).
"""

from __future__ import annotations

__all__ = ["free_memory_bytes", "release_memory", "decode_per_batch"]


def free_memory_bytes(device: str) -> int:
    """What a new allocation can still take: the GPU's free memory, or the host's MemAvailable."""
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return int(psutil.virtual_memory().available)


def release_memory(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.empty_cache()


def decode_per_batch(modes: list[str], batches: tuple[int, ...], *, build, cache_bytes, free_bytes, measure,
                     release, headroom: float = 0.8) -> dict:
    """Decode latency one batch size at a time: the KV caches of that batch only, measured, then freed
    before the next batch is built. The modes of a batch are interleaved when their caches fit together
    in `headroom` of the free memory; otherwise in groups that fit, one group after another; a mode
    whose caches alone do not fit is skipped with the figures, not attempted (gpt-350m at context 1024
    and batch 256: ~52 GB per fp32 mode; all batches at once were ~166 GB).

    build(mode, b) -> (fn, caches); cache_bytes(mode, b); free_bytes(); measure(calls) -> stats;
    release() after the caches are dropped (gc, and the CUDA cache on GPU)."""
    out: dict = {}
    for b in batches:
        groups: list[list[str]] = []
        free = free_bytes()
        budget = headroom * free
        for m in modes:
            need = cache_bytes(m, b)
            if need > budget:
                out[(m, b)] = (f"skipped: KV caches of batch {b} need {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB "
                               "free")
            elif groups and sum(cache_bytes(x, b) for x in groups[-1]) + need <= budget:
                groups[-1].append(m)
            else:
                groups.append([m])
        for group in groups:
            calls, held = {}, []
            for m in group:
                try:
                    fn, caches = build(m, b)
                except Exception as e:  # noqa: BLE001 — out of memory or a failing mode is a result
                    out[(m, b)] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
                    continue
                calls[(m, b)] = fn
                held.append(caches)
            fn = caches = None  # noqa: F841 — no reference may outlive this group
            if calls:
                out.update(measure(calls))
            del calls, held
            release()
    return out
