"""One training configuration to estimate: the GPU, the parallel layout, precision and memory savers.

Every field is validated on construction, so a bad value from the CLI or Python fails in one line that
names the problem and the fix (ValueError; the CLI turns it into exit code 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from overdrive.env.catalog import GpuSpec
from overdrive.formats import planned_format
from overdrive.plan.choices import (ATTENTIONS, BANDWIDTH_GBS, CHECKPOINTING, GRAD_DTYPES, LOSSES, LOW_PRECISION,
                                    MASTER_WEIGHTS, MAX_COUNT, MIN_EFFICIENCY, OFFLOADS, OPTIMIZER_ALIASES,
                                    OPTIMIZER_DTYPES, OPTIMIZER_STATES, OPTIMIZERS, PRECISIONS, RECOMPUTE_MODULES,
                                    SHARDED_WEIGHTS, SHARDING_ALIASES, SHARDINGS, STACK_ALIASES, STACKS)
from overdrive.plan.setup_checks import validate
from overdrive.plan.specs import ModelSpec

__all__ = ["TrainSetup", "PRECISIONS", "SHARDINGS", "CHECKPOINTING", "OPTIMIZER_DTYPES", "OFFLOADS", "LOSSES",
           "OPTIMIZERS", "OPTIMIZER_STATES", "OPTIMIZER_ALIASES", "MASTER_WEIGHTS",
           "LOW_PRECISION", "RECOMPUTE_MODULES", "STACKS", "ATTENTIONS", "GRAD_DTYPES", "needs_blackwell",
           "fallback_precision", "check_layout", "MAX_COUNT", "MIN_EFFICIENCY", "BANDWIDTH_GBS", "gbs_text",
           "SHARDING_ALIASES", "STACK_ALIASES"]
"""The choices live in `choices.py` and the checks in `setup_checks.py`; both are re-exported here."""


def needs_blackwell(precision: str) -> bool:
    """MXFP8 and NVFP4 need SM 10.x tensor cores (Transformer Engine's and torchao's gates)."""
    f = planned_format(precision)  # `Format.min_cc`
    return f is not None and f.min_cc >= (10, 0)


def fallback_precision(precision: str, gpu: GpuSpec) -> str | None:
    """What a precision resolves to on `gpu` when that GPU cannot run it (None: it runs as asked)."""
    if needs_blackwell(precision) and gpu.sm[0] != 10:
        return "fp8" if gpu.fp8_tflops else "bf16"
    if planned_format(precision) and not gpu.fp8_tflops:
        return "bf16"
    return None


def gbs_text(v: float) -> str:
    """A link rate for people: three significant digits below 100 GB/s (0.149 stays apart from 0.15), whole GB/s
    above."""
    return f"{v:.3g}" if v < 100 else f"{v:,.0f}"


@dataclass(frozen=True, kw_only=True)
class TrainSetup:
    gpu: GpuSpec
    gpus_per_node: int = 8
    nodes: int = 1
    seq: int = 4096
    micro_batch: int = 1
    """Sequences per GPU per forward/backward (per data-parallel rank)."""
    doc_len: int = 0
    """Packed documents: each sequence holds documents of about this many tokens, each attending only to itself
    (document masking: flash attention's varlen kernels, FlexAttention's block mask, Transformer Engine's THD), so
    attention does s·d work per sequence instead of s². 0: one document fills the sequence."""
    global_batch: int | None = None
    """Sequences per optimizer step; sets gradient accumulation. None: one micro-batch per rank."""
    precision: str = "bf16"
    """fp32 | bf16 | fp16 | fp8 (tensorwise) | fp8-rowwise | mxfp8 | nvfp4 (the last two on Blackwell only)."""
    sharding: str = "fsdp"
    """none | zero1 | zero2 | fsdp | hsdp | zero3 (see SHARDINGS)."""
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
    are saved by its cross-entropy until the backward; one chunk's gradient at a time) |
    megatron-v07 (--stack megatron only: Megatron-Core 0.1-0.7's vocab-parallel cross-entropy, which subtracts the
    max out of place, so a second fp32 copy of the logits exists at the forward's peak; `logits.py`)."""
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
    unfused_ops: tuple[str, ...] = ()
    """--stack megatron: the block's ops that run as eager PyTorch kernels, not fused (see UNFUSED_OPS)."""
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
    sp_regather: bool | None = None
    """With sequence parallelism: the GEMMs save their sequence shard and all-gather it again in the backward
    (Megatron's way, Korthikanti et al. §4.2.2) — True; or save the gathered input whole (PyTorch's DTensor TP,
    torchtitan's plan: `engine_memory.gathered_tp_bytes`) — False. None: the stack's way."""
    z_loss: bool = False
    """PaLM's z-loss, 1e-4·log²Z per token: another pass over the logits unless the loss kernel fuses it."""
    gather_dtype: str = ""
    """FSDP all-gather dtype: '' (the compute dtype; 1 byte with --fp8-all-gather), fp32 (fp32 parameters
    gathered and cast after, as Lightning's bf16-mixed FSDP does) or bf16."""
    fused_kernels: bool = False
    """Eager (--no-compile) with hand-fused kernels for the memory-bound ops (Apex/Liger/TE norms, fused
    SwiGLU/RoPE, as Megatron's eager code): memory traffic as compiled, no torch.compile."""
    deepspeed_pipeline: bool = False
    """DeepSpeed's PipelineEngine runs the pipeline (Megatron-DeepSpeed, GPT-NeoX; comm.py): no interleaving, the
    data-parallel gradients reduced after the pipeline flush with nothing left to hide them under, bf16 through its
    BF16_Optimizer (fp32 gradient accumulation every micro-batch, an fp32 all-reduce), ZeRO-1 at most."""
    partition_activations: bool = True
    """Without sequence parallelism, a checkpointed block's input is split over the TP ranks (Megatron's
    --distribute-checkpointed-activations, DeepSpeed checkpointing's partition_activations); False: every TP rank
    keeps it whole (Megatron-DeepSpeed without --partition-activations, as BLOOM ran)."""
    zero_init: bool = True
    """DeepSpeed ZeRO-3 gets a model built partitioned (deepspeed.zero.Init; what Hugging Face's Trainer and Accelerate
    do when the ZeRO-3 config is set before from_pretrained). False: a model built whole, which deepspeed.initialize
    moves to each GPU in the model dtype before partitioning it (runtime/engine.py `_configure_distributed_model`:
    `module.to(device)` unless zero.Init made it), so every GPU holds the whole model once at start-up (`zero3.py`)."""
    zero_broadcast: bool = False
    """ZeRO-1 with whole tensors assigned to ranks (largest first to the least-loaded), the gradients all-reduced and
    the updated weights broadcast by their owners, waited for before the step ends (comm.py). With --grad-dtype bf16
    InternLM's HybridZeroOptimizer as its 2023 table ran it (internlm/solver/optimizer/hybrid_zero_optim.py @
    20fe5ac2): a bf16 model, 512M-element buckets, one broadcast per owner; with fp32 gradients `torch_zero`."""
    zero_sliced: bool = False
    """ZeRO-1 as nanotron's benchmarks ran it (ZeroDistributedOptimizer with accumulate_grad_in_fp32,
    src/nanotron/optim/zero.py and trainer.py @ c252843): no DDP, so the fp32 gradient buffer is all-reduced in one
    call after the backward; every tensor sliced over the data-parallel ranks; after the step one all-gather of the
    updated weights, its dp·T slices built and flattened on the host before the call and copied back after it, which
    the next forward waits for (comm.py, host.py). Eager, AdamW or plain SGD, whole-block recompute at most."""
    overlap_grad_reduce: bool = True
    """Megatron's --overlap-grad-reduce and --overlap-param-gather (on in NeMo's and Megatron-Bridge's recipes;
    off by default in Megatron-LM's own arguments, megatron/training/arguments.py). False: the gradients are
    reduced in one bucket after the backward (DistributedDataParallel sets bucket_size None, finish_grad_sync
    calls start_grad_sync synchronously) and the distributed optimizer gathers the parameters after its step,
    so all of the data-parallel communication is exposed. With little compute to hide under, that one bucket can
    beat the overlapped many (one call's latency instead of one per bucket), as it does on a GPU."""
    pp_keep_outputs: bool = False
    """--stack pytorch with --pp > 1: torch.distributed.pipelining's `step()` returns the last stage's outputs merged,
    so that stage keeps every micro-batch's fp32 logits until the step ends (torchtitan until 2025-10, its #1922
    passing `return_outputs=False` since; `pipeline.py`). False: the loss alone is kept, as today's torchtitan and
    nanotron's and picotron's own 1F1B engines do."""
    embed_norm: bool = False
    """A norm right after the embedding (BLOOM's --embed-layernorm, Megatron-DeepSpeed `VocabParallelEmbedding.norm`):
    the first stage keeps its 16-bit input and fp32 mean and rstd per token for every micro-batch in flight."""
    dropout: bool = False
    """Dropout on (Megatron's --hidden-dropout / --attention-dropout, default 0.1): a 1-byte mask per element at each
    dropout site (after the embedding, the attention projection and the MLP; and, with --attention unfused, on the
    scores, whose dropped-out copy the product with V keeps as well). Flash attention regenerates its dropout mask."""
    attention: str = "flash"
    """flash (fused attention, the kernel the stack picks: `attention.attention_kernel`) | fa1 (FlashAttention 1.x;
    Ampere and Hopper) | fa2 (FlashAttention-2) |
    fa3 (FlashAttention-3, Hopper only) | cudnn (cuDNN / FlashAttention-4, Hopper- and Blackwell-native) | triton
    (FlashAttention's 2022 Triton kernel: MPT's attn_impl triton; Ampere and Hopper) | unfused (the s × s scores and probabilities
    in HBM, with softmax, mask and dropout kernels: Megatron before 2022, eager attention)."""
    efficiency: float | None = None
    """Override of the GEMM fraction of peak (default: calibrated per GPU generation)."""
    overlap: float = 0.9
    """Share of compute that data-parallel communication can hide under (FSDP prefetch, DDP buckets)."""
    intra_gbs: float | None = None
    """Per-GPU intra-node bandwidth, GB/s (default: the GPU's NVLink)."""
    inter_gbs: float | None = None
    """Per-GPU inter-node bandwidth, GB/s (default: the NIC per GPU of the GPU's reference system, `net_gbs`)."""
    host_us: float | None = None
    """µs the host spends dispatching one eager ATen op (default: host.HOST_US_PER_OP, a published B200 host's;
    scripts/host_us_published.py --device cuda measures a host's own)."""

    def __post_init__(self):
        validate(self)   # setup_checks: aliases resolved, every value checked, contradictions refused

    @property
    def torch_zero(self) -> bool:
        """--zero-broadcast with fp32 gradients: torch's ZeroRedundancyOptimizer beside DDP under autocast
        (torch/distributed/optim/zero_redundancy_optimizer.py): the fp32 model on every rank, no separate master,
        DDP's buckets, then `_sync_params` broadcasts each owner's fp32 tensors one call each (the default
        parameters_as_bucket_view=False)."""
        return self.zero_broadcast and self.grad_dtype == "fp32"

    @property
    def link_gbs(self) -> float:
        """GB/s per GPU inside a node: `--intra-gbs`, else the GPU's NVLink (a PCIe card's PCIe link)."""
        return self.intra_gbs or self.gpu.nvlink_gbs

    @property
    def net_gbs(self) -> float:
        """GB/s per GPU across nodes: `--inter-gbs`, else the GPU's reference system (catalog `nic_gbs`: 25 on
        DGX A100, 50 on DGX H100/H200/B200 and GB200, 100 on DGX B300 and GB300)."""
        return self.inter_gbs or self.gpu.nic_gbs

    @property
    def attn_len(self) -> int:
        """Tokens a query attends over at most: the document's with --doc-len, else the sequence's."""
        return min(self.doc_len, self.seq) if self.doc_len else self.seq

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
    def shards_weights(self) -> bool:
        """Whether only a shard of the weights stays between uses (FSDP, HSDP, DeepSpeed ZeRO-3)."""
        return self.sharding in SHARDED_WEIGHTS

    @property
    def tp_overlap(self) -> bool:
        """Whether TP collectives hide under the GEMMs: as asked, else the stack's default."""
        return self.stack == "megatron" if self.async_tp is None else bool(self.async_tp)

    @property
    def low_precision(self) -> bool:
        return planned_format(self.precision) is not None

    @property
    def gathers_fp8(self) -> bool:
        """Whether --fp8-all-gather takes effect: Megatron's --fp8-param-gather, or torchao's float8 all-gather,
        which FSDP2 runs for per-tensor scaling only (`enable_fsdp_float8_all_gather`; `Format.fsdp_float8_all_gather`,
        convert/apply.py); row-wise and MX formats gather the 16-bit weights."""
        f = planned_format(self.precision)
        return self.fp8_all_gather and f is not None and (self.stack == "megatron" or f.fsdp_float8_all_gather)

    @property
    def grad_bytes(self) -> int:
        """Bytes per trained parameter of its gradient: 2 with --pure-bf16 or --grad-dtype bf16, else fp32's 4."""
        return 2 if (self.pure_bf16 or self.grad_dtype == "bf16") else 4

    @property
    def gather_bytes(self) -> int:
        """Bytes per parameter FSDP all-gathers (and holds gathered): fp8 1, the compute dtype, or as asked."""
        if self.gathers_fp8:
            return 1
        if self.gather_dtype:
            return 4 if self.gather_dtype == "fp32" else 2
        return 4 if self.precision == "fp32" else 2

    @property
    def keeps_gathered(self) -> bool:
        """Whether each TP rank saves the all-gathered GEMM inputs whole (DTensor TP with sequence parallelism)."""
        regather = self.stack == "megatron" if self.sp_regather is None else self.sp_regather
        return self.tp > 1 and self.sequence_parallel and not regather

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
    full = s.checkpointing == "full" and not s.recompute_layers
    if s.offload_activations > m.n_layer or s.offload_activations == m.n_layer and not full:
        # every block's checkpointed input may go (DeepSpeed's cpu_checkpointing, torchtune's offload of the
        # checkpointed inputs): the block being recomputed comes back one at a time; a block's whole activations
        # cannot all go, the last block's are needed at once
        raise ValueError(f"--offload-activations {s.offload_activations}: offload at most the model's {m.n_layer} "
                         f"blocks with --checkpointing full, fewer ({m.n_layer - 1}) without it")
    if "swiglu" in s.unfused_ops and not m.gated_mlp:
        raise ValueError(f"--unfused-ops swiglu: {m.name} has no gated (SwiGLU) MLP; drop swiglu from the list")
    if "rope" in s.unfused_ops and m.learned_pos:
        raise ValueError(f"--unfused-ops rope: {m.name} has learned positions, not RoPE; drop rope from the list")
    if s.lora_rank > m.hidden:
        raise ValueError(f"--lora-rank {s.lora_rank} is above the hidden size {m.hidden} of {m.name}: a LoRA rank "
                         "is small (8-256)")
