"""`overdrive train`: a recipe-driven trainer with distillation, activation checkpointing, FSDP2
under torchrun and crash-safe sharded checkpoints."""

from overdrive.train.checkpoint import CheckpointError, latest_checkpoint
from overdrive.train.config import ConfigError, TrainConfig, load_config
from overdrive.train.trainer import TrainingDiverged, TrainResult, export_weights, load_exported, train

__all__ = ["train", "TrainConfig", "load_config", "ConfigError", "TrainingDiverged", "TrainResult",
           "CheckpointError", "latest_checkpoint", "export_weights", "load_exported"]
