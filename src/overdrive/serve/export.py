"""`overdrive export`: a model for serving — torch.export (.pt2), ONNX when onnx/onnxruntime are
installed, and a Triton Inference Server model repository whose dynamic batching is sized from the
measured SLO batch. Every artefact is reloaded and checked against the eager model before the
export is called done.

This module claims the folder, stages the export and publishes it (`export_for_serving`), and runs the
steps in order (`_export_into`). The parts live beside it: the served models (`served_model`,
`user_model`), what identifies one (`identity`), the batcher settings (`batching`), the exported files
and their checks (`artefacts`), the Triton repository (`triton_config`, `triton_repo`, `triton_local`).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass

import torch
from torch import nn

from overdrive.io import write_atomic
from overdrive.serve.artefacts import (check_against_eager, export_dims, export_onnx, external_data, ort_runner,
                                       ort_session)
from overdrive.serve.batching import MAX_BATCH, batching_from, default_batching, is_int, slo_batch_from
from overdrive.serve.errors import ExportError, first_line
from overdrive.serve.identity import model_identity
from overdrive.serve.served_model import ServedModel, builtin_model, click_inputs
from overdrive.serve.triton_config import triton_config
from overdrive.serve.user_model import user_model, user_served_model

__all__ = ["export_for_serving", "ExportError", "triton_config", "slo_batch_from", "batching_from", "export_onnx",
           "click_inputs", "default_batching", "ort_session", "user_served_model", "model_identity", "ServedModel",
           "MAX_BATCH"]

_OUTPUTS = ("model.pt2", "model.onnx", "model.onnx.data")
"""What an export writes at the top of --out besides triton/ and export.json (an export without ONNX
removes a previous export's model.onnx: a folder never mixes two exports)."""


def export_for_serving(kind: str, out_dir: str, **options) -> dict:
    """Write model.pt2 (+ model.onnx) and a Triton repository under out_dir; returns what was written
    (the options are `_export_into`'s).

    `out_dir` must be new, empty or Overdrive's (`measure.lock.claim_results_dir`: a folder holding the
    user's own files is refused, and its lock keeps a second export, or a running bench/tune, out); no
    entry export writes may be a symbolic link. Everything is written into a hidden staging folder inside
    `out_dir`, checked there, then renamed into place, export.json last: a failed export changes nothing,
    and one cut short has no export.json."""
    from overdrive.io import discard_stage, publish, refuse_links, stage_folder
    from overdrive.measure.lock import claim_results_dir

    lock = claim_results_dir(out_dir, what="overdrive export")
    stage, done = None, False
    try:
        refuse_links(out_dir, [*_OUTPUTS, "triton", "triton_local", "export.json"])
        stage = stage_folder(out_dir)
        report = _export_into(kind, stage, **options)
        report["files"] = [os.path.join(out_dir, os.path.relpath(f, stage)) for f in report["files"]]
        write_atomic(os.path.join(stage, "export.json"), json.dumps(report, indent=1))
        extra = [os.path.relpath(f, out_dir) for f in report["files"] if os.path.dirname(f) == out_dir]
        publish(stage, out_dir, sorted({*_OUTPUTS, *extra, f"triton/{report['name']}", f"triton_local/{report['name']}"}),
                last="export.json")
        done = True
        return report
    except ExportError as e:  # said of the staging folder: name the folder the user gave
        raise ExportError(str(e).replace(stage or "\0", out_dir)) from None
    except OSError as e:
        raise ExportError(f"cannot write the export into {out_dir} ({e.strerror or type(e).__name__}"
                          f"{': ' + e.filename if getattr(e, 'filename', None) else ''}): free space or pass another "
                          "--out (what was there before is kept unless export.json is missing)") from None
    finally:
        if stage is not None:
            discard_stage(stage)
        lock.release() if done else lock.abandon()  # a failed export into a new folder leaves no folder


@dataclass
class _Job:
    """One export in progress: the model, its inputs and I/O, the settings, and where it is written."""

    kind: str
    out_dir: str
    name: str
    module: nn.Module
    spec: dict
    dynamic: dict
    batching: dict
    example: tuple
    """The inputs it is exported with: a batch of min(8, max(2, max_batch_size)), never 1 (torch.export
    would specialise a size-1 dim), so it may exceed a max_batch_size of 1; the exported batch dim then
    goes up to 2."""
    fresh: tuple
    """The inputs every artefact is checked on: another batch (and variant 1 of the other dims: a longer
    bag, a shorter prompt) than the example, to prove the dims are dynamic."""
    limits: dict
    onnx: bool
    report: dict

    @property
    def max_batch(self) -> int:
        return self.batching["max_batch_size"]

    @property
    def instance_kind(self) -> str:
        return "KIND_GPU" if self.batching.get("kind") == "KIND_GPU" else "KIND_CPU"

    def path(self, *parts: str) -> str:
        return os.path.join(self.out_dir, *parts)


def _export_into(kind: str, out_dir: str, *, size: str = "cpu-student", weights: str | None = None,
                 max_batch: int | None = None, onnx: bool | None = None, batching: dict | None = None,
                 inputs: str | None = None, dynamic: list[str] | None = None, bag_len: int = 5,
                 served: ServedModel | None = None, server_check: bool = True) -> dict:
    """Write model.pt2 (+ model.onnx) and a Triton repository into out_dir (a staging folder).

    kind: "recsys", "gpt", or "FILE.py:FACTORY" (then `inputs` is "FILE.py:FN", FN(batch) -> example
    inputs, and `dynamic` names further variable axes as INPUT:AXIS). batching: the dynamic batcher
    settings (from `batching_from`); else Triton's defaults at max_batch (1024 when None).
    onnx=None: export ONNX when onnx, onnxscript and onnxruntime import; True: require it.
    server_check: load the python-backend variant in a real tritonserver where one is set up.
    """
    from overdrive.env import get_env

    batching = _batching(batching, max_batch)
    if bag_len < 1:
        raise ExportError(f"--bag-len must be >= 1, got {bag_len}")
    st = get_env().engine("onnx")
    if onnx and not st.ok:  # before any work
        raise ExportError(f"ONNX export needs onnx, onnxscript and onnxruntime ({st.status}: {st.reason}): {st.fix}")
    job = _job(kind, out_dir, batching, _model(kind, size, weights, inputs, dynamic, bag_len, served),
               onnx=onnx is not False and st.ok)
    _write_pt2(job)
    if onnx is None and not st.ok:
        job.report["onnx"] = f"skipped: {st.reason} ({st.fix})"
    if job.onnx:
        _write_onnx(job)
    _write_triton(job)
    if job.onnx:
        _write_local_variant(job, server_check)
    return job.report


def _batching(batching: dict | None, max_batch: int | None) -> dict:
    """The settings to write: the measured ones (with --max-batch over their max_batch_size, said in their
    source), else Triton's defaults at max_batch; max_batch_size checked in range."""
    if batching is not None:
        batching = dict(batching)
        if max_batch is not None and max_batch != batching["max_batch_size"]:
            batching["max_batch_size"] = max_batch
            batching["preferred_batch_size"] = [p for p in batching.get("preferred_batch_size") or []
                                                if isinstance(max_batch, int) and p <= max_batch]
            batching["source"] = (f"{batching.get('source', 'measured')}; max_batch_size {max_batch} from --max-batch, not "
                                  "measured (the rate above is the measured setting's)")
    else:
        batching = default_batching(1024 if max_batch is None else max_batch)
    mb = batching["max_batch_size"]
    if not is_int(mb) or not 1 <= mb <= MAX_BATCH:
        raise ExportError(f"max_batch_size must be an integer 1..{MAX_BATCH}, got {mb!r} (--max-batch, or the "
                          "--slo-from results)")
    return batching


def _folder_name(s: str) -> str:
    out = "".join(c if c.isalnum() or c in "_-" else "_" for c in s).strip("_")
    return out or "model"


def _model(kind: str, size: str, weights: str | None, inputs: str | None, dynamic: list[str] | None, bag_len: int,
           served: ServedModel | None) -> tuple:
    """(module, inputs_fn, spec, dynamic dims, the model's folder name) of what `kind` names."""
    if served is not None:  # the user's model, already loaded (export --slo-from checked its identity)
        return served.module, served.inputs, served.spec, served.dynamic, _folder_name(kind.rpartition(":")[2])
    if ".py:" in kind:
        return (*user_model(kind, inputs, weights, dynamic), _folder_name(kind.rpartition(":")[2]))
    name = "click_model" if kind == "recsys" else f"gpt_{size.replace('-', '_')}"
    return (*builtin_model(kind, size, weights, bag_len), name)


def _job(kind: str, out_dir: str, batching: dict, model: tuple, *, onnx: bool) -> _Job:
    module, inputs_fn, spec, dyn, name = model
    mb = batching["max_batch_size"]
    report: dict = {"kind": kind, "name": name, "max_batch": mb, "batching": batching, "files": [], "checks": {},
                    "spec": spec, "shapes": [f"output {n!r}: the model returns (B,) and the exported files keep it; "
                                             "Triton returns it as (B, 1) (config.pbtxt: dims [ 1 ], reshape [ ])"
                                             for n, d, _ in spec["outputs"] if not d]}
    example = inputs_fn(min(8, max(2, mb)))
    fresh = inputs_fn(13 if mb >= 13 else 1, 1)
    limits = {"seq": module.model.config.block_size} if kind == "gpt" else {}
    return _Job(kind, out_dir, name, module, spec, dyn, batching, example, fresh, limits, onnx, report)


def _write_pt2(job: _Job) -> None:
    try:
        ep = torch.export.export(job.module, job.example,
                                 dynamic_shapes=export_dims(job.dynamic, job.max_batch, job.limits))
    except Exception as e:  # noqa: BLE001 — a model torch.export cannot trace: say so in one line
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise ExportError(f"torch.export cannot export {job.kind}: {type(e).__name__}: {first}") from None
    pt2 = job.path("model.pt2")
    buf = io.BytesIO()  # in memory first: a full disk is then an OSError from Python, never a C++ terminate
    torch.export.save(ep, buf)
    write_atomic(pt2, buf.getvalue())
    job.report["files"].append(pt2)
    job.report["checks"]["torch.export"] = check_against_eager(torch.export.load(pt2).module(), job.module, job.fresh,
                                                               "model.pt2")


def _write_onnx(job: _Job) -> None:
    path = job.path("model.onnx")
    try:
        files = export_onnx(job.module, job.example, path, job.spec, job.dynamic, job.max_batch, job.limits)
        job.report["checks"]["onnxruntime"] = check_against_eager(ort_runner(path), job.module, job.fresh,
                                                                  "model.onnx under onnxruntime")
    except (ExportError, OSError):  # OSError: a full disk, said as such by export_for_serving
        raise
    except Exception as e:  # noqa: BLE001 — the exporter or onnxruntime refused this model (e.g. a bf16 Gemm)
        raise ExportError(f"ONNX Runtime cannot run {job.kind} as exported ({first_line(e)}); pass --no-onnx to serve "
                          "it as TorchScript on libtorch") from None
    job.report["files"] += files


def _write_triton(job: _Job) -> None:
    """triton/<name>/: the ONNX model on onnxruntime when we have it, else TorchScript on libtorch; its
    config.pbtxt; the repository checked as Triton loads it."""
    from overdrive.serve.triton_repo import check_repository

    repo, report = job.path("triton", job.name), job.report
    os.makedirs(os.path.join(repo, "1"), exist_ok=True)
    if job.onnx:
        platform, model_file = "onnxruntime_onnx", os.path.join(repo, "1", "model.onnx")
        # The model and every external-data file it names (model.onnx.data): Triton loads the folder alone.
        for fname in ["model.onnx", *external_data(job.path("model.onnx"))]:
            with open(job.path(fname), "rb") as f:
                write_atomic(os.path.join(repo, "1", fname), f.read())
            if fname != "model.onnx":
                report["files"].append(os.path.join(repo, "1", fname))
        report["checks"]["triton onnxruntime"] = check_against_eager(
            ort_runner(model_file), job.module, job.fresh, "the Triton copy of model.onnx under onnxruntime")
    else:
        platform, model_file = "pytorch_libtorch", os.path.join(repo, "1", "model.pt")
        traced = torch.jit.trace(job.module, job.example, check_trace=False)
        buf = io.BytesIO()
        torch.jit.save(traced, buf)
        write_atomic(model_file, buf.getvalue())
        report["checks"]["torchscript"] = check_against_eager(torch.jit.load(model_file), job.module, job.fresh,
                                                              "TorchScript model.pt")
    cfg_path = os.path.join(repo, "config.pbtxt")
    write_atomic(cfg_path, triton_config(job.name, platform, job.spec, job.batching, kind=job.instance_kind))
    report["files"] += [model_file, cfg_path]
    report["triton_platform"] = platform
    try:  # the staged repository holds only this model: another model's folder in --out is not ours to judge
        report["triton_check"] = check_repository(job.path("triton"), run=job.onnx)
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001 — e.g. onnxruntime's bad_alloc running a wide output at max_batch_size
        raise ExportError(f"the Triton repository of {job.kind} fails its check ({first_line(e)}); a smaller "
                          "--max-batch may fit (nothing was written)") from None


def _write_local_variant(job: _Job, server_check: bool) -> None:
    """triton_local/<name>/: the variant a tritonserver here can load (the same model.onnx in the python
    backend), loaded in one where it is set up."""
    from overdrive.serve.triton_local import load_in_server, write_local_variant

    vdir = job.path("triton", job.name, "1")
    onnx_files = [os.path.join(vdir, f) for f in ["model.onnx", *external_data(os.path.join(vdir, "model.onnx"))]]
    job.report["files"] += write_local_variant(job.out_dir, job.name, job.spec, job.batching, onnx_files,
                                               kind=job.instance_kind)
    job.report["triton_server_check"] = (load_in_server(job.out_dir) if server_check else
                                         {"ran": False, "why": "the caller serves it"})
    if job.report["triton_server_check"].get("ready") is False:
        raise ExportError(f"tritonserver did not load {job.out_dir}/triton_local: "
                          f"{job.report['triton_server_check'].get('error')} (nothing was written)")
