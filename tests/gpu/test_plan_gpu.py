"""The planner's memory prediction against the CUDA caching allocator, for a ~0.8B model on one GPU.

`torch.cuda.max_memory_allocated` sees the tensors alive at the peak: weights, optimizer states, the
activations (gradients are None then, the optimizer zeroes with set_to_none) — the planner's `allocated`.
It sees neither the CUDA context nor the allocator's fragmentation: those are the reserved-memory margin,
reported next to the planner's allowance rather than folded into the comparison."""

import pytest
import torch

import overdrive
from overdrive.env import get_env
from overdrive.models import GPT, gpt_config
from overdrive.plan import TrainSetup, get_model, peak_allocated

pytestmark = pytest.mark.gpu
GIB = 2**30


@pytest.mark.parametrize("ac", ["none", "selective", "full"])
def test_peak_allocated_within_10pct(ac):
    size, seq, mb = "gpt-760m", 2048, 2
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = GPT(gpt_config(size, block_size=seq))
    acc = overdrive.accelerate(model, overdrive.Recipe(precision="bf16", activation_checkpointing=ac,
                                                       optimizer="torch-fused"))
    x = torch.randint(0, 32768, (mb, seq + 1), device="cuda")
    for _ in range(2):  # the second step has the optimizer states allocated
        with acc.autocast():
            _, loss = acc.model(x[:, :-1], x[:, 1:])
        acc.backward(loss)
        acc.step()
    torch.cuda.synchronize()
    measured = (torch.cuda.max_memory_allocated() - base) / GIB
    reserved_margin = (torch.cuda.max_memory_reserved() - torch.cuda.max_memory_allocated()) / GIB
    spec = get_env().gpus[0].spec
    pred = peak_allocated(get_model(size), TrainSetup(gpu=spec, gpus_per_node=1, sharding="none", seq=seq,
                                                      micro_batch=mb, precision="bf16", checkpointing=ac))
    print(f"AC {ac}: allocated {measured:.2f} GiB vs planned {pred['allocated']:.2f}; reserved margin "
          f"{reserved_margin:.2f} GiB vs planned {pred['reserved_margin']:.2f}")
    assert abs(pred["allocated"] - measured) / measured < 0.10, (ac, pred, measured)
    assert reserved_margin < 0.5 * measured  # the allocator's slack is a margin, not a second model
    del acc, model
