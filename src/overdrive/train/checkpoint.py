"""The trainer's checkpoints live in overdrive.checkpoint (the one module that reads or writes one);
these names stay importable from here."""

from overdrive.checkpoint import (CheckpointError, latest_checkpoint, load_checkpoint, load_model_weights,
                                  resume_checkpoint, save_checkpoint, verify_checkpoint)

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "resume_checkpoint", "CheckpointError",
           "load_model_weights", "verify_checkpoint"]
