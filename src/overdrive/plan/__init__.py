"""`overdrive plan`: what fits and how fast, from the model's shape and the GPU catalog."""

from overdrive.plan.estimate import Estimate, estimate
from overdrive.plan.explain import explain
from overdrive.plan.memory import memory_breakdown, peak_allocated
from overdrive.plan.search import calibrate_from_bench, longest_seq, plan, sweep
from overdrive.plan.setup import CHECKPOINTING, PRECISIONS, SHARDINGS, TrainSetup
from overdrive.plan.specs import MODEL_PRESETS, ModelSpec, get_model, model_from_hf_config

__all__ = ["plan", "sweep", "longest_seq", "estimate", "explain", "memory_breakdown", "peak_allocated", "TrainSetup",
           "Estimate", "ModelSpec", "MODEL_PRESETS", "get_model", "model_from_hf_config", "calibrate_from_bench",
           "PRECISIONS", "SHARDINGS", "CHECKPOINTING"]
