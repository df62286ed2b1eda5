"""One training configuration to estimate: the GPU, the parallel layout, precision and memory savers.

Every field is validated on construction, so a bad value from the CLI or Python fails in one line that
names the problem and the fix (ValueError; the CLI turns it into exit code 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from overdrive.env.catalog import GpuSpec
from overdrive.formats import planned_format, planned_presets
from overdrive.plan.specs import ModelSpec

__all__ = ["TrainSetup", "PRECISIONS", "SHARDINGS", "CHECKPOINTING", "OPTIMIZER_DTYPES", "OFFLOADS", "LOSSES",
           "OPTIMIZERS", "OPTIMIZER_STATES", "OPTIMIZER_ALIASES", "MASTER_WEIGHTS",
           "LOW_PRECISION", "RECOMPUTE_MODULES", "STACKS", "ATTENTIONS", "GRAD_DTYPES", "needs_blackwell",
           "fallback_precision", "check_layout", "MAX_COUNT", "MIN_EFFICIENCY", "BANDWIDTH_GBS"]

LOW_PRECISION = planned_presets()  # the formats the planner models (`overdrive.formats`, `Format.plan_bytes`)
PRECISIONS = ("fp32", "bf16", "fp16", *LOW_PRECISION)
SHARDINGS = ("none", "zero1", "zero2", "fsdp", "hsdp")
"""none = DDP (replicated); zero1 = DDP with a distributed optimizer (Megatron's); zero2 = + sharded grads;
fsdp = ZeRO-3 (FSDP2 fully_shard); hsdp = FSDP within a node, replicated across nodes."""
SHARDING_ALIASES = {"ddp": "none", "zero3": "fsdp", "zero-3": "fsdp", "zero-1": "zero1", "zero-2": "zero2",
                    "dist-opt": "zero1"}
CHECKPOINTING = ("none", "selective", "selective-op", "full")
"""selective = every 2nd block (torchtitan's 'selective layer'); selective-op = torchtitan's per-op policy
(keep matmul outputs, every other one, and attention; recompute the cheap ops); full = every block."""
RECOMPUTE_MODULES = ("core_attn", "mlp", "layernorm")
"""Megatron-Core's selective recompute (`recompute_modules`) for a dense block: core_attn = the attention kernel,
mlp = the whole MLP from its input, layernorm = the norm outputs. MoE modules (moe_act, moe, shared_experts)
have nothing to act on in the dense models the planner knows."""
GRAD_DTYPES = ("fp32", "bf16")
ATTENTIONS = ("flash", "unfused")
MIN_EFFICIENCY = 0.01
"""Below 1% of peak is no GPU's GEMM: the step time would overflow to infinity."""
BANDWIDTH_GBS = (0.1, 100_000.0)
"""Per-GPU link speeds accepted, GB/s (NVLink 5 is 1,800; a 1 Gb/s link is 0.125)."""
MAX_COUNT = 1 << 40
"""Largest sequence, batch or GPU count accepted: every product of them stays an exact, finite float."""
OPTIMIZER_DTYPES = ("fp32", "bf16", "8bit")
OPTIMIZER_STATES = {"adamw": 2, "lion": 1, "sgd": 1, "adafactor": 0}
"""State tensors per parameter of each optimizer family: AdamW m and v; Lion and SGD with momentum one momentum
buffer; Adafactor (Hugging Face's and torchtune's default, beta1 None) a factored second moment of rows + columns
per matrix, a few millionths of the parameters of an LLM, counted as none."""
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
LOSSES = ("standard", "hf", "compiled", "inplace", "fused", "compiled-fp32", "chunked")
STACKS = ("pytorch", "megatron")
"""pytorch: FSDP2/DDP in PyTorch (torchtitan, llm-foundry, Hugging Face), torch.compile or eager as asked;
megatron: Megatron-Core/NeMo with Transformer Engine: fused kernels end to end (norms, activations, RoPE; the
cross-entropy is --loss's: inplace for TE's, standard for Megatron's vocab-parallel fp32 one), TP communication overlapped with the GEMMs (userbuffers), the grad reduce-scatter and param
all-gather overlapped with compute, FP8 GEMM inputs saved for backward in FP8 (as --fp8-activations); its own
GEMM efficiency per GPU generation."""
STACK_ALIASES = {"torch": "pytorch", "mcore": "megatron", "megatron-core": "megatron", "nemo": "megatron"}


def needs_blackwell(precision: str) -> bool:
    """MXFP8 and NVFP4 need SM 10.x tensor cores (Transformer Engine's and torchao's gates: `Format.min_cc`)."""
    f = planned_format(precision)
    return f is not None and f.min_cc >= (10, 0)


def fallback_precision(precision: str, gpu: GpuSpec) -> str | None:
    """What a precision resolves to on `gpu` when that GPU cannot run it (None: it runs as asked)."""
    if needs_blackwell(precision) and gpu.sm[0] != 10:
        return "fp8" if gpu.fp8_tflops else "bf16"
    if planned_format(precision) and not gpu.fp8_tflops:
        return "bf16"
    return None


def _flag(field: str) -> str:
    """The command-line flag of a TrainSetup field (gpus_per_node is --gpus)."""
    return "--gpus" if field == "gpus_per_node" else f"--{field.replace('_', '-')}"


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"--{name} {value!r} is not one of {', '.join(allowed)}")


@dataclass(frozen=True, kw_only=True)
class TrainSetup:
    gpu: GpuSpec
    gpus_per_node: int = 8
    nodes: int = 1
    seq: int = 4096
    micro_batch: int = 1
    """Sequences per GPU per forward/backward (per data-parallel rank)."""
    global_batch: int | None = None
    """Sequences per optimizer step; sets gradient accumulation. None: one micro-batch per rank."""
    precision: str = "bf16"
    """fp32 | bf16 | fp16 | fp8 (tensorwise) | fp8-rowwise | mxfp8 | nvfp4 (the last two on Blackwell only)."""
    sharding: str = "fsdp"
    tp: int = 1
    """Tensor parallel degree (sequence parallel unless sequence_parallel False); across nodes in whole nodes."""
    pp: int = 1
    """Pipeline stages (1F1B; interleaved with vpp > 1)."""
    vpp: int | None = 1
    """Virtual stages per pipeline rank (interleaved schedule); None: search them (estimate() picks the fastest
    that fits and says so in its notes)."""
    cp: int = 1
    """Context parallel degree (ring attention over the sequence)."""
    checkpointing: str = "none"
    optimizer_dtype: str = "fp32"
    """Optimizer states: fp32, bf16 or 8-bit (bitsandbytes/torchao)."""
    optimizer: str = "adamw"
    """Optimizer family (OPTIMIZER_STATES: how many states per parameter); aliases such as adamw-8bit also set
    optimizer_dtype."""
    master_weights: str = "fp32"
    """How the fp32 master weights are kept (MASTER_WEIGHTS); none is --pure-bf16."""
    optimizer_in_backward: bool = False
    """Each parameter is stepped and its gradient freed as soon as its gradient is ready (torchtune's
    optimizer_in_bwd): no full gradient buffer, one micro-batch per step."""
    pure_bf16: bool = False
    """Weights, grads and optimizer states in bf16, no fp32 master copy (llm-foundry's 'PURE')."""
    offload: str = "none"
    """none | optimizer (states and step on the CPU) | params (FSDP CPU offload of params, grads, states)."""
    loss: str = "standard"
    """standard (eager cross-entropy on fp32 logits) | compiled (torch.compile'd loss, or a fused kernel such
    as flash-attn's: no fp32 copies) | inplace (Transformer Engine's fused cross-entropy, Megatron's
    cross_entropy_fusion_impl='te': the backward writes the gradient over the 16-bit logits) |
    hf (Hugging Face's `logits.float()` then cross-entropy: the fp32 logits stay alive in the model output
    through the backward, beside log_softmax's fp32 output and the fp32 gradients) |
    fused (chunked or fused linear + cross-entropy: one chunk of logits at a time) |
    compiled-fp32 (torch.compile'd cross-entropy on the fp32 logits the model returns, torchtune's
    TransformerDecoder `.float()`: the compiled loss saves that fp32 input, its backward writes an fp32 gradient) |
    chunked (torchtune's CEWithChunkedOutputLoss: the head runs on 8 chunks at once, every chunk's 16-bit logits
    are saved by its cross-entropy until the backward; one chunk's gradient at a time)."""
    embedding_in_pipeline_split: bool = False
    """Megatron's account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split: the embedding
    and the loss each take a block's place when the blocks are split over the pipeline, so the first and the
    last chunk hold one block fewer."""
    fp8_activations: bool = False
    """Keep the GEMM inputs saved for backward in FP8, as Transformer Engine does."""
    recompute_layers: int = 0
    """Megatron full recompute, block method (`recompute_num_layers`): the first N blocks of each (virtual)
    pipeline chunk keep only their input and run their forward again in backward."""
    recompute_modules: tuple[str, ...] = ()
    """Megatron selective recompute of named parts of every block (see RECOMPUTE_MODULES)."""
    offload_activations: int = 0
    """Megatron/Transformer Engine activation offload (`cpu_offloading_num_layers`): the activations of N blocks
    go to host memory after their forward and come back for their backward (weights stay)."""
    grad_dtype: str = "fp32"
    """Gradient buffer dtype: fp32, or bf16 as Megatron keeps them with `grad_reduce_in_fp32=False`."""
    lora_rank: int = 0
    """> 0: LoRA on every linear of the blocks, base weights frozen in bf16."""
    fp8_all_gather: bool = False
    compile: bool = True
    """torch.compile (or fused kernels as in Megatron/TE): fuses the memory-bound ops."""
    async_tp: bool | None = None
    """Overlap tensor-parallel collectives with GEMMs (torchtitan async TP, Megatron tp_comm_overlap); None: the
    stack's default (megatron on, pytorch off)."""
    stack: str = "pytorch"
    """pytorch | megatron (see STACKS): the software that runs the step, each with GEMM efficiencies of its own
    per GPU generation."""
    block_code: str = ""
    """'' (activations as fused kernels keep them) | torchtune | hf: whose Llama block runs, on --stack pytorch.
    With --no-compile, what that eager block saves (fp32 RMSNorm, unfused SwiGLU; k and v copied to every head by
    torchtune, shared by transformers' SDPA), `memory.eager_act_tensors`; compiled, the fused count plus what
    torch.compile's partitioner keeps beyond it (the k/v copies, fp32 rstd and logsumexp), `memory.act_tensors`."""
    sequence_parallel: bool = True
    """With tp > 1: norms, dropout and residuals on tokens/tp (Megatron's sequence parallelism, Korthikanti et al.
    2022); False: those run and are saved on every token by each TP rank (Megatron before 2022, tp without SP)."""
    z_loss: bool = False
    """PaLM's z-loss, 1e-4·log²Z per token: another pass over the logits unless the loss kernel fuses it."""
    gather_dtype: str = ""
    """FSDP all-gather dtype: '' (the compute dtype; 1 byte with --fp8-all-gather), fp32 (fp32 parameters
    gathered and cast after, as Lightning's bf16-mixed FSDP does) or bf16."""
    fused_kernels: bool = False
    """Eager (--no-compile) with hand-fused kernels for the memory-bound ops (Apex/Liger/TE norms, fused
    SwiGLU/RoPE, as Megatron's eager code): memory traffic as compiled, no torch.compile."""
    attention: str = "flash"
    """flash (FlashAttention / cuDNN / TE fused attention: scores never leave the chip) | unfused (the s × s scores
    and probabilities in HBM, with softmax, mask and dropout kernels: Megatron before 2022, eager attention)."""
    efficiency: float | None = None
    """Override of the GEMM fraction of peak (default: calibrated per GPU generation)."""
    overlap: float = 0.9
    """Share of compute that data-parallel communication can hide under (FSDP prefetch, DDP buckets)."""
    intra_gbs: float | None = None
    """Per-GPU intra-node bandwidth, GB/s (default: the GPU's NVLink)."""
    inter_gbs: float = 50.0
    """Per-GPU inter-node bandwidth, GB/s (400 Gb/s InfiniBand or RoCE per GPU)."""

    def __post_init__(self):
        sh = SHARDING_ALIASES.get(self.sharding, self.sharding)
        if sh != self.sharding:
            object.__setattr__(self, "sharding", sh)
        object.__setattr__(self, "precision", getattr(planned_format(self.precision), "preset", self.precision))
        _choice("precision", self.precision, (*PRECISIONS[:3], *planned_presets()))
        _choice("sharding", self.sharding, SHARDINGS)
        _choice("checkpointing", self.checkpointing, CHECKPOINTING)
        _choice("optimizer-dtype", self.optimizer_dtype, OPTIMIZER_DTYPES)
        if self.optimizer in OPTIMIZER_ALIASES:
            fam, dt = OPTIMIZER_ALIASES[self.optimizer]
            if dt and self.optimizer_dtype not in ("fp32", dt):
                raise ValueError(f"--optimizer {self.optimizer} keeps its states in {dt} but --optimizer-dtype is "
                                 f"{self.optimizer_dtype}: keep one")
            object.__setattr__(self, "optimizer", fam)
            if dt:
                object.__setattr__(self, "optimizer_dtype", dt)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer {self.optimizer!r} is not one of {', '.join(OPTIMIZERS + tuple(OPTIMIZER_ALIASES))}")
        _choice("master-weights", self.master_weights, MASTER_WEIGHTS)
        if self.master_weights == "none" and not self.pure_bf16:
            object.__setattr__(self, "pure_bf16", True)
        elif self.pure_bf16 and self.master_weights == "remainder":
            raise ValueError("--pure-bf16 keeps no master weights and --master-weights remainder keeps their low "
                             "bits: keep one")
        elif self.pure_bf16:
            object.__setattr__(self, "master_weights", "none")
        _choice("offload", self.offload, OFFLOADS)
        _choice("loss", self.loss, LOSSES)
        st = STACK_ALIASES.get(self.stack, self.stack)
        if st != self.stack:
            object.__setattr__(self, "stack", st)
        if self.stack not in STACKS:
            raise ValueError(f"--stack {self.stack!r} is not one of {', '.join(STACKS)} (pytorch: FSDP2/torchtitan/"
                             "Hugging Face; megatron: Megatron-Core/NeMo with Transformer Engine)")
        if self.stack == "megatron" and not self.compile:
            raise ValueError("--no-compile with --stack megatron: Megatron's kernels are fused by Transformer Engine, "
                             "there is no eager mode to plan; drop --no-compile or use --stack pytorch")
        _choice("grad-dtype", self.grad_dtype, GRAD_DTYPES)
        if self.block_code not in ("", "torchtune", "hf"):
            raise ValueError(f"--block-code {self.block_code!r} is not one of torchtune, hf")
        if self.block_code and self.stack != "pytorch":
            raise ValueError(f"--block-code {self.block_code} counts a PyTorch Llama block's activations: it needs "
                             "--stack pytorch (Megatron's blocks are Transformer Engine's)")
        _choice("attention", self.attention, ATTENTIONS)
        if isinstance(self.recompute_modules, (list, str)):
            mods = self.recompute_modules.split(",") if isinstance(self.recompute_modules, str) else self.recompute_modules
            object.__setattr__(self, "recompute_modules", tuple(x.strip() for x in mods if x.strip()))
        if len(set(self.recompute_modules)) != len(self.recompute_modules):  # "mlp,mlp": once, as Megatron does
            object.__setattr__(self, "recompute_modules", tuple(dict.fromkeys(self.recompute_modules)))
        for mod in self.recompute_modules:
            _choice("recompute-modules", mod, RECOMPUTE_MODULES)
        for name in ("recompute_layers", "offload_activations"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a number of blocks >= 0, got {v}")
        if self.recompute_modules and self.checkpointing != "none":
            # Megatron recomputes either named parts of every block or whole blocks; both would count twice
            raise ValueError(f"--recompute-modules {','.join(self.recompute_modules)} and --checkpointing "
                             f"{self.checkpointing} both choose what to recompute: keep one")
        if self.recompute_layers and self.checkpointing != "none":
            raise ValueError(f"--recompute-layers {self.recompute_layers} and --checkpointing {self.checkpointing} "
                             "both choose what to recompute: keep one")
        if self.offload_activations and self.pp > 1:
            raise ValueError("--offload-activations needs --pp 1 (Megatron has no activation offload with "
                             "pipeline parallelism)")
        if self.vpp is None and isinstance(self.pp, int) and self.pp == 1:
            object.__setattr__(self, "vpp", 1)   # nothing to interleave
        for name in ("gpus_per_node", "nodes", "seq", "micro_batch", "tp", "pp", "vpp", "cp"):
            v = getattr(self, name)
            if name == "vpp" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{_flag(name)} must be a positive integer, got {v}")
        for name in ("gpus_per_node", "nodes", "seq", "micro_batch", "global_batch", "lora_rank"):
            v = getattr(self, name)
            if v is not None and v > MAX_COUNT:
                raise ValueError(f"{_flag(name)} {v} is too large (at most {MAX_COUNT:,})")
        if self.offload == "params" and self.sharding not in ("fsdp", "hsdp"):
            raise ValueError(f"--offload params needs FSDP (--zero 3 or --sharding fsdp/hsdp), not {self.sharding}: "
                             "parameters are offloaded per shard; with ZeRO-1/2 or DDP use --offload optimizer")
        if self.lora_rank < 0:
            raise ValueError(f"--lora-rank must be >= 0, got {self.lora_rank}")
        if self.global_batch is not None and self.global_batch < 1:
            raise ValueError(f"--global-batch must be a positive number of sequences, got {self.global_batch}")
        if self.efficiency is not None and not MIN_EFFICIENCY <= self.efficiency <= 1:
            raise ValueError(f"--efficiency is a fraction of peak in [{MIN_EFFICIENCY}, 1], got {self.efficiency}")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"overlap is a fraction in [0, 1], got {self.overlap}")
        for name in ("intra_gbs", "inter_gbs"):
            v = getattr(self, name)
            if v is not None and not (0 < v < math.inf):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive bandwidth in GB/s, got {v}")
            if v is not None and not BANDWIDTH_GBS[0] <= v <= BANDWIDTH_GBS[1]:
                raise ValueError(f"--{name.replace('_', '-')} {v} GB/s is outside {BANDWIDTH_GBS[0]}-"
                                 f"{BANDWIDTH_GBS[1]:,} GB/s: give the per-GPU link speed in GB/s")
        if self.world % (self.tp * self.pp * self.cp):
            raise ValueError(f"tp {self.tp} x pp {self.pp} x cp {self.cp} does not divide the {self.world} GPUs "
                             f"({self.nodes} x --gpus {self.gpus_per_node}): pick degrees whose product divides it")
        if self.tp > self.gpus_per_node and self.tp % self.gpus_per_node:
            # across nodes TP takes whole nodes (its cost is the inter-node link, comm.py)
            raise ValueError(f"--tp {self.tp} spans nodes but is not a multiple of the {self.gpus_per_node} GPUs per "
                             f"node: use a tp that divides {self.gpus_per_node} or is a multiple of it")
        if self.gather_dtype not in ("", "fp32", "bf16"):
            raise ValueError(f"--gather-dtype {self.gather_dtype!r} is not one of fp32, bf16")
        if self.gather_dtype and self.fp8_all_gather:
            raise ValueError(f"--gather-dtype {self.gather_dtype} and --fp8-all-gather both set the all-gather "
                             "dtype: keep one")
        if self.cp > 1 and self.seq % (2 * self.cp):
            # Transformer Engine's ring attention splits each rank's share in two halves for causal load balance
            # ("Sequence length per GPU needs to be divisible by 2!"), so the sequence divides by 2·cp
            raise ValueError(f"--seq {self.seq} is not divisible by 2 x --cp {self.cp}: ring attention gives each "
                             f"rank two halves, use a multiple of {2 * self.cp}")
        if self.vpp is not None and self.vpp > 1 and self.pp == 1:
            raise ValueError("--vpp needs --pp > 1 (virtual stages interleave a pipeline)")
        if self.global_batch is not None and self.global_batch % (self.micro_batch * self.dp):
            raise ValueError(f"global batch {self.global_batch} is not divisible by micro-batch {self.micro_batch} "
                             f"x {self.dp} data-parallel ranks: use a multiple of {self.micro_batch * self.dp}")
        if self.pure_bf16 and self.precision == "fp32":
            raise ValueError("--pure-bf16 (--master-weights none) contradicts --precision fp32")
        if self.master_weights == "remainder" and self.precision in ("fp32", "fp16"):
            raise ValueError(f"--master-weights remainder rebuilds fp32 from bf16 weights, not {self.precision} ones: "
                             "use --precision bf16 (or fp8 and the like, whose weights are bf16)")
        if self.optimizer_in_backward:
            if self.global_batch is not None and self.grad_accum > 1:
                raise ValueError(f"--optimizer-in-backward steps each parameter in its backward, so it needs one "
                                 f"micro-batch per step, not {self.grad_accum}: drop --global-batch or the flag")
            if self.pp > 1 or self.lora_rank or self.offload != "none":
                raise ValueError("--optimizer-in-backward is planned for single-stage full fine-tuning without "
                                 "offload (torchtune's optimizer_in_bwd): drop it with --pp, --lora-rank or --offload")

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def dp(self) -> int:
        """Data-parallel ranks (replicas of one model copy)."""
        return self.world // (self.tp * self.pp * self.cp)

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step on each data-parallel rank."""
        return self.global_batch // (self.micro_batch * self.dp) if self.global_batch else 1

    @property
    def shards(self) -> int:
        """GPUs that share one copy of the sharded states (FSDP shards over data and context parallel ranks)."""
        if self.sharding == "none":
            return 1
        group = self.dp * self.cp
        if self.sharding == "hsdp":
            return max(1, min(group, self.gpus_per_node // self.tp))
        return group

    @property
    def tp_overlap(self) -> bool:
        """Whether TP collectives hide under the GEMMs: as asked, else the stack's default."""
        return self.stack == "megatron" if self.async_tp is None else bool(self.async_tp)

    @property
    def low_precision(self) -> bool:
        return planned_format(self.precision) is not None

    @property
    def gather_bytes(self) -> int:
        """Bytes per parameter FSDP all-gathers (and holds gathered): fp8 1, the compute dtype, or as asked."""
        if self.fp8_all_gather and self.low_precision:
            return 1
        if self.gather_dtype:
            return 4 if self.gather_dtype == "fp32" else 2
        return 4 if self.precision == "fp32" else 2

    @property
    def sp(self) -> int:
        """The divisor of the norm/residual tokens per GPU: tp with sequence parallelism, else 1."""
        return self.tp if self.sequence_parallel else 1


def check_layout(m: ModelSpec, s: TrainSetup) -> None:
    """What the parallel layout and the memory savers ask of this model's shape (ValueError, with the fix)."""
    if m.n_head % s.tp or m.ffn % s.tp:
        raise ValueError(f"--tp {s.tp} does not divide the {m.n_head} attention heads and the FFN size {m.ffn} of "
                         f"{m.name}: pick a tp that divides both")
    if m.n_kv_head % s.tp and s.tp % m.n_kv_head:
        # fewer KV heads than ranks is fine (each KV head is replicated), a split head is not
        raise ValueError(f"--tp {s.tp} neither divides nor is a multiple of the {m.n_kv_head} KV heads of {m.name}")
    chunks = s.pp * (s.vpp or 1)
    # with the embedding and the loss in the split they take a block's place each (Megatron's 405B: 128 chunks)
    slots = m.n_layer + (2 if s.embedding_in_pipeline_split else 0)
    if chunks > slots:
        raise ValueError(f"--pp {s.pp} x --vpp {s.vpp} = {chunks} pipeline chunks for the {m.n_layer} blocks of "
                         f"{m.name}: every chunk needs a block, use fewer stages")
    per_chunk = math.ceil(slots / chunks)
    if s.recompute_layers > per_chunk:
        where = f"each of the {chunks} pipeline chunks" if chunks > 1 else m.name
        raise ValueError(f"--recompute-layers {s.recompute_layers} exceeds the {per_chunk} blocks of {where}: "
                         f"use at most {per_chunk} (all of them = --checkpointing full)")
    if s.offload_activations >= m.n_layer:
        raise ValueError(f"--offload-activations {s.offload_activations}: offload fewer blocks than the model's "
                         f"{m.n_layer} (the last block's activations are needed at once)")
    if s.lora_rank > m.hidden:
        raise ValueError(f"--lora-rank {s.lora_rank} is above the hidden size {m.hidden} of {m.name}: a LoRA rank "
                         "is small (8-256)")
