"""`overdrive train`: a recipe-driven trainer with distillation, activation checkpointing, FSDP2
under torchrun and crash-safe, verified sharded checkpoints."""

from overdrive.checkpoint import CheckpointError, latest_checkpoint, verify_checkpoint
from overdrive.train.config import ConfigError, TrainConfig, load_config
from overdrive.train.rundir import RunDirError
from overdrive.train.runtime import RankTimeout
from overdrive.train.trainer import RunMismatch, TrainHooks, TrainingDiverged, TrainingInterrupted, TrainResult, train
from overdrive.train.weights import export_weights, load_exported

__all__ = ["train", "TrainConfig", "load_config", "ConfigError", "TrainingDiverged", "TrainResult", "TrainHooks",
           "CheckpointError", "latest_checkpoint", "verify_checkpoint", "export_weights", "load_exported",
           "RunDirError", "RankTimeout", "TrainingInterrupted", "RunMismatch"]
