"""`overdrive train` — argument parsing and printing only; the work is in overdrive.train."""

from __future__ import annotations

import argparse
import os
import sys

from overdrive.errors import UserError


def _cmd_train(args: argparse.Namespace) -> int:
    from overdrive.data import DataError
    from overdrive.train import (CheckpointError, ConfigError, TrainingDiverged, export_weights, load_config,
                                 train)

    try:
        cfg = load_config(args.config, args.set or [])
        if args.export:
            path = export_weights(args.from_dir or cfg.train.out_dir, cfg, args.export)
            print(f"exported {path}")
            return 0
        res = train(cfg, resume=args.resume)
    except (ConfigError, DataError, CheckpointError, ValueError) as e:
        raise UserError(str(e)) from None
    except TrainingDiverged as e:
        print(f"overdrive: training stopped: {e}", file=sys.stderr)
        return 3
    if int(os.environ.get("RANK", "0")) == 0:
        v = f", final val loss {res.final_val_loss:.4f}" if res.final_val_loss is not None else ""
        print(f"done: {len(res.losses)} steps, last loss {res.losses[-1]:.4f}{v}; run in {res.run_dir}"
              if res.losses else f"nothing to do: {res.run_dir} already finished")
    return 0


def register(sub) -> None:
    t = sub.add_parser("train", help="train a reference GPT (distillation, checkpointing, FSDP2 under torchrun)",
                       description="Train per a TOML config (see examples/tiny.toml). Under torchrun "
                                   "(torchrun --nproc_per_node=N -m overdrive train CONFIG) the model is sharded "
                                   "with FSDP2. Checkpoints are sharded (torch.distributed.checkpoint) and "
                                   "crash-safe; --resume continues from the newest. Exit codes: 2 bad input, "
                                   "3 training diverged.")
    t.add_argument("config", help="TOML config file")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. --set train.steps=200")
    t.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in train.out_dir")
    t.add_argument("--export", metavar="PATH", help="write the newest checkpoint as one plain state_dict and exit")
    t.add_argument("--from", dest="from_dir", metavar="DIR", help="with --export: a run folder or checkpoint "
                                                                  "(default train.out_dir)")
    t.set_defaults(func=_cmd_train)
