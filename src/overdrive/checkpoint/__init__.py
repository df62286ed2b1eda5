"""The one place that reads or writes a checkpoint: the allow-list DCP reader and weights_only
loads (safe.py), the manifest with SHA-256 and the ownership marks (manifest.py), the atomic,
verified folder (folder.py), a run's step_N checkpoints with the fallback to the newest intact one
(runs.py), `acc.save`/`acc.load` (accel.py) and every RNG state (rng.py). Nothing else under
src/overdrive calls torch.load, pickle's loaders or DCP's save/load (a test holds it to that).
"""

from overdrive.checkpoint.folder import CheckpointError, load_folder, remove_ours, save_folder, verify_folder
from overdrive.checkpoint.manifest import (MANIFEST, PARTIAL, hash_files, is_ours, read_manifest, verify_manifest,
                                           write_manifest)
from overdrive.checkpoint.rng import rng_state, set_rng_state
from overdrive.checkpoint.runs import (check_checkpoint_root, clean_partial_saves, latest_checkpoint,
                                       load_checkpoint, load_model_weights, resume_checkpoint, save_checkpoint,
                                       verify_checkpoint)
from overdrive.checkpoint.safe import SafeReader, UnsafeCheckpoint, load_tensors, save_tensors

__all__ = ["CheckpointError", "UnsafeCheckpoint", "SafeReader", "load_tensors", "save_tensors", "save_folder",
           "load_folder", "verify_folder", "remove_ours", "MANIFEST", "PARTIAL", "hash_files", "is_ours",
           "read_manifest", "verify_manifest", "write_manifest", "rng_state", "set_rng_state", "save_checkpoint",
           "load_checkpoint", "latest_checkpoint", "resume_checkpoint", "verify_checkpoint", "load_model_weights",
           "check_checkpoint_root", "clean_partial_saves"]
