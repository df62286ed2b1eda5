"""Known third-party noise, kept out of Overdrive's output at the CLI boundary (`-v` shows it).

Each entry below is a message we have seen land in our output, with where it comes from and
why it is harmless. Only these are filtered: an unknown warning still reaches the user.

`import overdrive` installs the same filters in the user's own program (the Python API printed
torchao's "Failed to load ..._C_mxfp8.so" and torch's Enum warnings on every import while the CLI
hid them); OVERDRIVE_QUIET=0 keeps them out of it. The CLI runs the command inside
`at_boundary(verbose=...)`: `-v` removes the filters and sets OVERDRIVE_QUIET=0, so the processes it
starts (bench workers under multiprocessing spawn, torchrun ranks) show the noise too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator

__all__ = ["NOISY_WARNINGS", "NOISY_LOGS", "NOISY_PRINTS", "QUIET_ENV", "at_boundary", "install", "install_from_env",
           "uninstall"]

QUIET_ENV = "OVERDRIVE_QUIET"

# (category, message regex) for `warnings.filterwarnings`.
NOISY_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # torch's sparse COO constructor inside Adagrad/SparseAdam on sparse embedding grads (C++ TORCH_WARN);
    # the tensors come from autograd and are valid by construction.
    (UserWarning, r"Sparse invariant checks are implicitly disabled"),
    # torch.utils._pytree deprecations raised by other libraries' registrations (transformers, torchao).
    (Warning, r"`torch\.utils\._pytree\.\w+` is deprecated"),
    (Warning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
    # torch.onnx's dynamic-shape renaming when two inputs share the batch axis (it is the same axis).
    (UserWarning, r"# The axis name: .* will not be used"),
)

# logger name -> message regex, for records that bypass `warnings` (logger.warning in the library).
NOISY_LOGS: tuple[tuple[str, str], ...] = (
    # torchao ships .so kernels for other CUDA/Python builds (_C_mxfp8...cpython-310, _C_cutlass_90a)
    # and logs each failed load at import; the Python paths we use do not need them.
    ("torchao", r"Failed to load .*_C"),
    # torch's Enum-registration deprecation, triggered by torchao's register_constant calls.
    ("torch.utils._pytree", r"is deprecated"),
    # torch.onnx lists the torchvision ops it cannot register; we export no torchvision op.
    ("torch.onnx._internal.exporter._registration", r"torchvision is not installed"),
    # onnxscript's optimizer on a graph with a multi-output op (EmbeddingBag exports a SequenceEmpty): it
    # leaves that op unfolded, which is correct; the exported model is checked against eager after.
    ("onnxscript.optimizer._constant_folding", r"Skipping constant folding for op \w+ with multiple outputs"),
    # onnx_ir's initializer deduplication leaves a graph input/output alone, as it must.
    ("onnx_ir.passes.common.initializer_deduplication", r"Skipped deduplication of initializer .* graph input or "
                                                        r"output"),
)

# Line prefixes printed (print(), not logging) by third-party code to our stdout.
NOISY_PRINTS: tuple[str, ...] = (
    "[torch.onnx]",  # the ONNX exporter's step-by-step progress (verbose=None prints it)
)


class _DropMatching(logging.Filter):
    def __init__(self, pattern: str):
        super().__init__()
        self._re = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not self._re.search(record.getMessage())
        except Exception:  # a malformed record is not ours to break
            return True


class _LineFilter:
    """A text stream that drops whole lines starting with a noisy prefix; everything else passes
    through unbuffered (progress bars keep working)."""

    def __init__(self, stream, prefixes: tuple[str, ...]):
        self._stream, self._prefixes = stream, prefixes
        self._at_line_start, self._dropping = True, False

    def write(self, s: str) -> int:
        kept = []
        for piece in s.splitlines(keepends=True):
            if self._at_line_start and piece.startswith(self._prefixes):
                self._dropping = True
            if not self._dropping:
                kept.append(piece)
            ends = piece.endswith(("\n", "\r"))
            if ends:
                self._dropping = False
            self._at_line_start = ends
        if kept:
            self._stream.write("".join(kept))
        return len(s)

    def __getattr__(self, name):  # isatty, fileno, flush, encoding... as the real stream
        return getattr(self._stream, name)


_installed: list[tuple[logging.Logger, logging.Filter]] = []
_warning_entries: list[tuple] = []


def install() -> None:
    """Filter the known warnings and log records for the rest of this process (idempotent)."""
    if _installed:
        return
    for category, pattern in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
        _warning_entries.append(warnings.filters[0])
    for name, pattern in NOISY_LOGS:
        lg, flt = logging.getLogger(name), _DropMatching(pattern)
        lg.addFilter(flt)
        _installed.append((lg, flt))


def uninstall() -> None:
    """Remove what `install` added (the user's own warning filters stay as they were)."""
    for lg, flt in _installed:
        lg.removeFilter(flt)
    _installed.clear()
    for entry in _warning_entries:
        with contextlib.suppress(ValueError):
            warnings.filters.remove(entry)
    _warning_entries.clear()
    getattr(warnings, "_filters_mutated", lambda: None)()  # the warnings cache re-reads the list


def install_from_env() -> None:
    """On `import overdrive`: the CLI's filters, in the user's program and in the processes the CLI starts,
    unless OVERDRIVE_QUIET=0 (or `overdrive -v`) asks for the noise."""
    if os.environ.get(QUIET_ENV, "1") != "0":
        install()


@contextlib.contextmanager
def at_boundary(*, verbose: bool) -> Iterator[None]:
    """Run a command with known third-party noise filtered (unless `verbose`), in this process and
    in the ones it starts; restores warnings, loggers, streams and the environment on exit."""
    old_env = os.environ.get(QUIET_ENV)
    if verbose:
        was = bool(_installed)
        uninstall()
        os.environ[QUIET_ENV] = "0"  # the processes it starts show the noise too
        try:
            yield
        finally:
            if was:
                install()
            if old_env is None:
                os.environ.pop(QUIET_ENV, None)
            else:
                os.environ[QUIET_ENV] = old_env
        return
    old_out = sys.stdout
    os.environ[QUIET_ENV] = "1"
    sys.stdout = _LineFilter(old_out, NOISY_PRINTS)
    was_installed = bool(_installed)
    with warnings.catch_warnings():
        install()
        try:
            yield
        finally:
            if not was_installed:
                for lg, flt in _installed:
                    lg.removeFilter(flt)
                _installed.clear()
            if isinstance(sys.stdout, _LineFilter):
                sys.stdout = old_out
            if old_env is None:
                os.environ.pop(QUIET_ENV, None)
            else:
                os.environ[QUIET_ENV] = old_env
