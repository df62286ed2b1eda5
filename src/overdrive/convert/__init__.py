"""Module swaps that keep the user's weights: FP8 linears, fused norms, activation checkpointing."""

from overdrive.convert.checkpointing import apply_activation_checkpointing, find_blocks
from overdrive.convert.fp8 import HEAD_NAMES, convert_fp8, fp8_layer_policy
from overdrive.convert.norms import convert_norms, norm_kind
from overdrive.convert.swap import LayerDecision, share_params, swap_modules

__all__ = ["LayerDecision", "swap_modules", "share_params", "convert_fp8", "fp8_layer_policy", "HEAD_NAMES",
           "convert_norms", "norm_kind", "apply_activation_checkpointing", "find_blocks"]
