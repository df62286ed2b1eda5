"""`overdrive plan` — argument parsing and printing only; the work is in overdrive.plan."""

from __future__ import annotations

import argparse
import json

from overdrive.errors import UserError


def _cmd_plan(args: argparse.Namespace) -> int:
    from overdrive.plan import DEFAULT_EFFICIENCY, ModelSpec, calibrate_from_bench, get_model, plan, sweep
    from overdrive.report.console import wide_console
    from overdrive.report.plan_view import render_plan, render_sweep, write_breakdown_png

    console = wide_console()
    if args.sweep:
        rows = sweep()
        print(json.dumps({"sweep": rows}, indent=1)) if args.json else render_sweep(rows, console)
        return 0
    try:
        if args.layers:
            if not (args.hidden and args.heads):
                raise ValueError("custom dims need --layers, --hidden and --heads (and optionally --kv-heads, --ffn, "
                                 "--vocab, --tied)")
            model = ModelSpec(name="custom", n_layer=args.layers, hidden=args.hidden, n_head=args.heads,
                              n_kv_head=args.kv_heads or args.heads, ffn=args.ffn or 4 * args.hidden,
                              vocab=args.vocab, tied=args.tied, gated_mlp=not args.gelu_mlp)
        else:
            model = get_model(args.model)
        eff = calibrate_from_bench(args.calibrate) if args.calibrate else (args.efficiency or DEFAULT_EFFICIENCY)
        gb = args.global_batch
        if args.global_batch_tokens:
            if args.global_batch_tokens % args.seq:
                raise ValueError(f"--global-batch-tokens {args.global_batch_tokens} is not a multiple of --seq "
                                 f"{args.seq}")
            gb = args.global_batch_tokens // args.seq
        r = plan(model, args.gpu, gpus_per_node=args.gpus, nodes=args.nodes, seq=args.seq, global_batch=gb,
                 precisions=args.precision.split(",") if args.precision else None,
                 shardings=args.sharding.split(",") if args.sharding else None,
                 checkpointing=args.checkpointing.split(",") if args.checkpointing else None,
                 optimizer_dtype=args.optimizer_dtype, fp8_all_gather=args.fp8_all_gather, efficiency=eff,
                 intra_gbs=args.intra_gbs, inter_gbs=args.inter_gbs)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        render_plan(r, console)
    if args.png:
        write_breakdown_png(r, args.png)
        if not args.json:
            console.print(f"wrote {args.png}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("plan", help="what fits and how fast: memory per GPU and tokens/s for 1B-405B models",
                       description="Estimate memory per GPU and step time for every precision x sharding x "
                                   "checkpointing x micro-batch, rank what fits, and say what would make the rest "
                                   "fit. Example: overdrive plan --model llama3-8b --gpu h100-sxm --gpus 8 --seq 8192")
    p.add_argument("--model", default="llama3-8b", help="llama3-1b/3b/8b/70b/405b, gpt-64b, a reference GPT size, "
                                                        "or a Hugging Face config.json path")
    p.add_argument("--gpu", default="h100-sxm", help="a100-40, a100-80, h100-sxm, h100-pcie, h200, b200, b300, l40s, "
                                                    "l4, rtx4090")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--nodes", type=int, default=1, help="nodes of --gpus GPUs each (inter-node traffic over "
                                                         "--inter-gbs)")
    p.add_argument("--seq", type=int, default=4096, help="sequence length")
    p.add_argument("--global-batch", type=int, help="global batch in sequences")
    p.add_argument("--global-batch-tokens", type=int, help="global batch in tokens")
    p.add_argument("--precision", help="comma list of fp32,bf16,fp8,fp8-rowwise,mxfp8 (default: all but fp32)")
    p.add_argument("--sharding", help="comma list of none,fsdp,hsdp")
    p.add_argument("--checkpointing", help="comma list of none,selective,full")
    p.add_argument("--optimizer-dtype", default="fp32", choices=["fp32", "bf16", "8bit"],
                   help="dtype of the AdamW moment states")
    p.add_argument("--fp8-all-gather", action="store_true", help="all-gather FP8 weights under FSDP")
    p.add_argument("--efficiency", type=float, help="achievable fraction of peak (default 0.39, calibrated)")
    p.add_argument("--calibrate", metavar="RESULTS.json", help="take the efficiency from an overdrive bench result")
    p.add_argument("--intra-gbs", type=float, help="per-GPU intra-node bandwidth GB/s (default: NVLink of the GPU)")
    p.add_argument("--inter-gbs", type=float, default=50.0, help="per-GPU inter-node bandwidth GB/s (default 50)")
    p.add_argument("--layers", type=int, help="custom model: layers")
    p.add_argument("--hidden", type=int, help="custom model: hidden size")
    p.add_argument("--heads", type=int, help="custom model: attention heads")
    p.add_argument("--kv-heads", type=int, help="custom model: KV heads (default: heads)")
    p.add_argument("--ffn", type=int, help="custom model: FFN size (default 4 x hidden)")
    p.add_argument("--vocab", type=int, default=128256, help="custom model: vocabulary")
    p.add_argument("--tied", action="store_true", help="custom model: tied embeddings")
    p.add_argument("--gelu-mlp", action="store_true", help="custom model: 2-matrix GELU MLP instead of SwiGLU")
    p.add_argument("--json", action="store_true", help="print JSON (candidates with fits, memory_gib, "
                                                       "tokens_per_s_per_gpu, breakdown)")
    p.add_argument("--png", help="write the memory breakdown of the top pick to this PNG")
    p.add_argument("--sweep", action="store_true", help="1B/8B/64B/70B on 8xB200 and 8xB300, bf16 vs fp8: longest "
                                                        "sequence that fits at micro-batch 1")
    p.set_defaults(func=_cmd_plan)
