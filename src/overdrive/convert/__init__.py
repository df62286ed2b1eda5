"""Module swaps that keep the user's weights: FP8 linears, fused norms, Liger's model patches, activation
checkpointing, and the one applier (`apply_recipe`) that puts a resolved recipe on a model in order."""

from overdrive.convert.checkpointing import apply_activation_checkpointing, find_block_groups, find_blocks
from overdrive.convert.fp8 import HEAD_NAMES, convert_fp8, fp8_layer_policy
from overdrive.convert.liger import LigerPatch, apply_liger_model_patches
from overdrive.convert.norms import convert_norms, norm_kind
from overdrive.convert.swap import LayerDecision, share_params, swap_modules
from overdrive.convert.apply import Applied, apply_recipe, optimizer_under_fsdp, wrap_forward_in  # noqa: E402

__all__ = ["LayerDecision", "swap_modules", "share_params", "convert_fp8", "fp8_layer_policy", "HEAD_NAMES",
           "convert_norms", "norm_kind", "apply_activation_checkpointing", "find_blocks", "find_block_groups",
           "LigerPatch", "apply_liger_model_patches", "apply_recipe", "Applied", "optimizer_under_fsdp",
           "wrap_forward_in"]
