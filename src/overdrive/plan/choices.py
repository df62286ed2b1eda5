"""The values each TrainSetup field takes, and what they mean (the CLI's choices are these)."""

from __future__ import annotations

from overdrive.formats import planned_presets

__all__ = ["PRECISIONS", "LOW_PRECISION", "LOW_PRECISION_SEARCHED", "SHARDINGS", "SHARDING_ALIASES", "CHECKPOINTING",
           "SHARDED_WEIGHTS", "RECOMPUTE_MODULES", "GRAD_DTYPES", "ATTENTIONS", "MIN_EFFICIENCY", "BANDWIDTH_GBS",
           "HOST_US_RANGE", "MAX_COUNT", "OPTIMIZER_DTYPES",
           "OPTIMIZER_STATES", "STATELESS", "OPTIMIZER_NAMES", "EIGHT_BIT", "OPTIMIZERS", "OPTIMIZER_ALIASES", "MASTER_WEIGHTS", "OFFLOADS", "LOSSES", "STACKS",
           "STACK_ALIASES", "BLOCK_CODES", "GATHER_DTYPES", "UNFUSED_OPS"]

LOW_PRECISION = planned_presets()  # the formats the planner models (`overdrive.formats`, `Format.plan_bytes`)
LOW_PRECISION_SEARCHED = planned_presets(default_only=True)
"""Those searched without --precision: Transformer Engine's delayed scaling is planned when asked for (Megatron-LM's
default recipe, NeMo 24.x's), not offered beside FP8's current scaling."""
PRECISIONS = ("fp32", "bf16", "fp16", *LOW_PRECISION)
SHARDINGS = ("none", "zero1", "zero2", "fsdp", "hsdp", "zero3")
"""none = DDP (replicated); zero1 = DDP with a distributed optimizer (Megatron's); zero2 = + sharded grads (so
reduce-scattered in every micro-batch's backward, as DeepSpeed's stage 2: `comm.reduces_every_micro_batch`);
fsdp = weights sharded too, gathered block by block (FSDP2 fully_shard); hsdp = FSDP within a node, replicated
across nodes; zero3 = DeepSpeed's ZeRO stage 3: weights sharded, gathered module by module (`zero3.py`)."""
SHARDED_WEIGHTS = ("fsdp", "hsdp", "zero3")
"""The shardings that keep only a shard of the weights between uses."""
SHARDING_ALIASES = {"ddp": "none", "zero-3": "zero3", "deepspeed": "zero3", "zero-1": "zero1", "zero-2": "zero2",
                    "dist-opt": "zero1"}
CHECKPOINTING = ("none", "selective", "selective-op", "full")
"""selective = every 2nd block (torchtitan's 'selective layer'); selective-op = torchtitan's per-op policy
(keep matmul outputs, every other one, and attention; recompute the cheap ops); full = every block."""
RECOMPUTE_MODULES = ("core_attn", "mlp", "layernorm")
"""Megatron-Core's selective recompute (`recompute_modules`) for a dense block: core_attn = the attention kernel,
mlp = the whole MLP from its input, layernorm = the norm outputs. MoE modules (moe_act, moe, shared_experts)
have nothing to act on in the dense models the planner knows."""
GRAD_DTYPES = ("fp32", "bf16")
UNFUSED_OPS = ("rope", "swiglu", "attn-layout")
"""--stack megatron's block ops that Megatron-LM's pre-Transformer-Engine code (megatron/model/, 2023, and its forks)
runs as plain PyTorch kernels: rope = apply_rotary_pos_emb on q and k; swiglu = chunk, silu, multiply;
attn-layout = the [s, b] <-> [b, s] copies around flash attention (`throughput.UNFUSED_ELEMS`)."""
ATTENTIONS = ("flash", "fa1", "fa2", "fa3", "cudnn", "triton", "unfused")
"""flash = the kernel the stack picks (`attention.attention_kernel`); fa1 = FlashAttention (flash-attn 1.x: its
`flash_attn_unpadded_func`, the Megatron forks of 2023); fa2 = FlashAttention-2 (flash-attn 2, PyTorch
SDPA's flash backend); fa3 = FlashAttention-3 (flash-attn 3's Hopper kernels, sm90 only); cudnn = the
Hopper/Blackwell-native fused kernels (cuDNN's, which Transformer Engine and PyTorch >= 2.11 on sm90/sm100 call;
FlashAttention-4 on Blackwell); triton = FlashAttention's Triton implementation (flash_attn_triton.py, 2022: MPT's
`attn_impl: triton` in llm-foundry, on the pre-MLIR Triton compiler, sm80/sm90); unfused = the scores in HBM."""
MIN_EFFICIENCY = 0.01
"""Below 1% of peak is no GPU's GEMM: the step time would overflow to infinity."""
BANDWIDTH_GBS = (0.1, 100_000.0)
"""Per-GPU link speeds accepted, GB/s (NVLink 5 is 1,800; a 1 Gb/s link is 0.125)."""
HOST_US_RANGE = (0.1, 1000.0)
"""µs per eager op accepted (--host-us): a fast host dispatches an ATen op in a few µs, none takes a millisecond."""
MAX_COUNT = 1 << 40
"""Largest sequence, batch or GPU count accepted: every product of them stays an exact, finite float."""
OPTIMIZER_DTYPES = ("fp32", "bf16", "8bit")
OPTIMIZER_STATES = {"adamw": 2, "lion": 1, "sgd": 1, "sgd-nomomentum": 0, "adafactor": 0, "none": 0}
"""State tensors per parameter of each optimizer family: AdamW m and v; Lion and SGD with momentum one momentum
buffer; SGD without momentum (torch.optim.SGD's default, momentum=0) none; Adafactor (Hugging Face's and
torchtune's default, beta1 None) a factored second moment of rows + columns per matrix, a few millionths of the
parameters of an LLM, counted as none. none: no optimizer step at all, a benchmark of forward and backward that
never steps and never syncs its gradients (DDP's/FSDP's no_sync), so each rank's gradients accumulate whole and
nothing reduces them (`NO_STEP`)."""
NO_STEP = "none"
STATELESS = ("sgd-nomomentum", NO_STEP)
"""Optimizers with no state at all, so no state dtype (Adafactor's factored moment exists, though counted as none)."""
OPTIMIZER_NAMES = {"adamw": "AdamW", "lion": "Lion", "sgd": "SGD momentum", "sgd-nomomentum": "SGD without momentum",
                   "adafactor": "Adafactor", NO_STEP: "no optimizer step"}
EIGHT_BIT = {"adamw": "torchao.optim.AdamW8bit or bitsandbytes' AdamW8bit", "lion": "bitsandbytes' Lion8bit",
             "sgd": "bitsandbytes' SGD8bit"}
"""The optimizers whose states an 8-bit version shrinks, and who ships it; the others keep none the plan counts."""
OPTIMIZERS = tuple(OPTIMIZER_STATES)
OPTIMIZER_ALIASES = {"adam": ("adamw", None), "adamw-fp32": ("adamw", "fp32"), "adamw-bf16": ("adamw", "bf16"),
                     "adamw-8bit": ("adamw", "8bit"), "adam8bit": ("adamw", "8bit"), "adamw8bit": ("adamw", "8bit")}
"""--optimizer names that carry their state dtype (bitsandbytes' AdamW8bit, torchao's AdamW8bit, AdamW on bf16)."""
MASTER_WEIGHTS = ("fp32", "remainder", "none")
"""fp32: a 4-byte master copy (or fp32 weights under autocast); remainder: 16-bit weights + the 16 low bits of the
fp32 master (Apex DistributedFusedAdam and Transformer Engine FusedAdam `store_param_remainders`, NeMo 1.x's
default for bf16 O2 with distributed_fused_adam), 2 bytes; none: no master (bf16 weights stepped directly, as
torchtune and --pure-bf16 do)."""
OFFLOADS = ("none", "optimizer", "params")
LOSSES = ("standard", "hf", "compiled", "inplace", "fused", "compiled-fp32", "chunked", "megatron-v07")
STACKS = ("pytorch", "megatron")
"""pytorch: FSDP2/DDP in PyTorch (torchtitan, llm-foundry, Hugging Face), torch.compile or eager as asked;
megatron: Megatron-Core/NeMo with Transformer Engine: fused kernels end to end (norms, activations, RoPE; the
cross-entropy is --loss's: inplace for TE's, standard for Megatron's vocab-parallel fp32 one), TP communication overlapped with the GEMMs (userbuffers), the grad reduce-scatter and param
all-gather overlapped with compute, FP8 GEMM inputs saved for backward in FP8 (as --fp8-activations); its own
GEMM efficiency per GPU generation."""
STACK_ALIASES = {"torch": "pytorch", "mcore": "megatron", "megatron-core": "megatron", "nemo": "megatron"}

BLOCK_CODES = ("torchtune", "hf")
"""Whose Llama block runs on --stack pytorch ('' for the fused count)."""
GATHER_DTYPES = ("fp32", "bf16")
"""FSDP all-gather dtypes that differ from the compute dtype ('' for the compute dtype)."""
