"""`overdrive plan`: what fits and how fast, from the model's shape and the GPU catalog."""

from overdrive.plan.estimate import DEFAULT_EFFICIENCY, Estimate, TrainSetup, estimate, memory_breakdown
from overdrive.plan.planner import calibrate_from_bench, longest_seq, plan, sweep
from overdrive.plan.specs import MODEL_PRESETS, ModelSpec, get_model, model_from_hf_config

__all__ = ["plan", "sweep", "longest_seq", "estimate", "memory_breakdown", "TrainSetup", "Estimate", "ModelSpec",
           "MODEL_PRESETS", "get_model", "model_from_hf_config", "calibrate_from_bench", "DEFAULT_EFFICIENCY"]
