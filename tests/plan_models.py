"""Published models and launches the planner's tests share."""

from __future__ import annotations

from overdrive.env import gpu_by_key
from overdrive.plan import ModelSpec, TrainSetup

A100 = gpu_by_key("a100-80")
# BLOOM-176B's shape (bigscience tr11-176B-ml): tied 250880-token embedding, GeLU MLP with biases
BLOOM = ModelSpec(name="bloom-176b", n_layer=70, hidden=14336, n_head=112, n_kv_head=112, ffn=57344, vocab=250880,
                  tied=True, gated_mlp=False, bias=True)
BLOOM_LAUNCH = dict(gpu=A100, gpus_per_node=8, nodes=48, seq=2048, precision="bf16", sharding="zero1", tp=4, pp=12,
                    vpp=1, checkpointing="full", stack="megatron", async_tp=False, attention="unfused",
                    sequence_parallel=False, inter_gbs=6.25, deepspeed_pipeline=True)
"""tr11-176B-ml's parallel layout on 384 A100s: Megatron-DeepSpeed, TP4 PP12 DP8, DeepSpeed's PipelineEngine."""


def bloom_setup(**kw) -> TrainSetup:
    return TrainSetup(**{**BLOOM_LAUNCH, **kw})
