"""`overdrive train` — argument parsing and printing only; the work is in overdrive.train."""

from __future__ import annotations

import argparse
import os
import sys

from overdrive.errors import UserError


def _cmd_train(args: argparse.Namespace) -> int:
    from overdrive.data import DataError
    from overdrive.io import check_writable
    from overdrive.train import (CheckpointError, ConfigError, RankTimeout, TrainingDiverged, TrainingInterrupted,
                                 export_weights, load_config, train)

    rank0 = int(os.environ.get("RANK", "0")) == 0
    try:
        cfg = load_config(args.config, args.set or [])
        if args.export:
            check_writable(args.export, flag="--export", kind="file")  # before loading anything
            say = lambda m: print(f"overdrive: {m}", file=sys.stderr)  # noqa: E731
            path = export_weights(args.from_dir or cfg.train.out_dir, cfg, args.export, say=say)
            print(f"exported {path}")
            return 0
        from overdrive.track import parse_report_to

        report_to = parse_report_to(args.report_to)  # a missing tracker package: one line, before any work
        res = train(cfg, resume=args.resume, overwrite=args.overwrite, allow_changes=args.allow_changes,
                    report_to=report_to)
    except (ConfigError, DataError, CheckpointError, ValueError) as e:
        raise UserError(str(e)) from None
    except OSError as e:  # a full disk or a folder that went away mid-run: what and where, not a traceback
        where = f" ({e.filename})" if e.filename else ""
        raise UserError(f"training stopped: {e.strerror or type(e).__name__}{where}: free space or fix the path, "
                        "then continue with --resume (the newest checkpoint is intact)") from None
    except TrainingInterrupted as e:
        if rank0:
            print(f"overdrive: {e}", file=sys.stderr)
        return 128 + e.signum
    except TrainingDiverged as e:
        print(f"overdrive: training stopped: {e}", file=sys.stderr)
        return 3
    except RankTimeout as e:
        print(f"overdrive: training stopped: {e}", file=sys.stderr)
        return 4
    if rank0:
        v = f", final val loss {res.final_val_loss:.4f}" if res.final_val_loss is not None else ""
        print(f"done: {len(res.losses)} steps, last loss {res.losses[-1]:.4f}{v}; run in {res.run_dir}"
              if res.losses else f"nothing to do: {res.run_dir} already finished")
    return 0


def register(sub) -> None:
    t = sub.add_parser("train", help="train a reference GPT (distillation, checkpointing, FSDP2 under torchrun)",
                       description="Train per a TOML config (see examples/tiny.toml). Under torchrun "
                                   "(torchrun --nproc_per_node=N -m overdrive train CONFIG) the model is sharded "
                                   "with FSDP2. Checkpoints are sharded (torch.distributed.checkpoint), verified "
                                   "and crash-safe; --resume continues from the newest intact one. A run folder "
                                   "holds one run: reusing one needs --resume or --overwrite, else the run goes to "
                                   "a fresh folder. Exit codes: 2 bad input, 3 training diverged, 4 a rank stopped "
                                   "answering, 130/143 stopped by SIGINT/SIGTERM after saving a checkpoint.")
    t.add_argument("config", help="TOML config file")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. --set train.steps=200")
    t.add_argument("--resume", action="store_true", help="continue the run in train.out_dir from its newest "
                                                         "intact checkpoint")
    t.add_argument("--overwrite", action="store_true", help="delete the run already in train.out_dir (only what "
                                                            "it wrote) and start afresh there")
    t.add_argument("--allow-changes", action="store_true", help="with --resume: continue even though the model, "
                   "recipe, seed, data, batch or optimizer settings differ from the checkpoint's run (they are named)")
    t.add_argument("--export", metavar="PATH", help="write the newest checkpoint as one plain state_dict and exit")
    t.add_argument("--from", dest="from_dir", metavar="DIR", help="with --export: a run folder or checkpoint "
                                                                  "(default train.out_dir)")
    t.add_argument("--report-to", metavar="TRACKERS", help="also log to tensorboard, mlflow and/or wandb "
                   "(comma-separated): params are the config, the recipe and the machine; metrics per logged step")
    t.set_defaults(func=_cmd_train)
