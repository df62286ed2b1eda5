"""Read a Triton model repository the way Triton Inference Server reads it, without the server.

A real `tritonserver` is not installable here (it ships as a container image), so this holds the
repository to the rules the server applies when it loads a model (server docs: model_repository.md,
model_configuration.md; the message is `inference.ModelConfig` in common/protobuf/model_config.proto):
- each model is a folder `<repo>/<name>/` with `config.pbtxt` in protobuf text format, whose `name`
  equals the folder's name;
- numeric version folders (`1/`), each holding the model file (`model.onnx` for onnxruntime_onnx,
  `model.pt` for pytorch_libtorch, unless default_model_filename says otherwise) and, for ONNX, the
  external-data files the model names, beside it;
- with max_batch_size > 0 every input/output has a leading batch dimension that `dims` leaves out;
  -1 marks a variable dimension;
- preferred batch sizes are at most max_batch_size.
The config is parsed by protobuf's own text_format against the subset of ModelConfig we write (same
field names, numbers and enums as Triton's .proto): an unknown field or a wrong type fails as it
would in the server.
"""

from __future__ import annotations

import os

from overdrive.serve.triton_config import parse_config
from overdrive.serve.triton_schema import DATA_TYPES as _DATA_TYPES
from overdrive.serve.triton_schema import TritonRepoError

__all__ = ["TritonRepoError", "parse_config", "check_repository"]

_ONNX_TO_TRITON = {1: "TYPE_FP32", 10: "TYPE_FP16", 11: "TYPE_FP64", 16: "TYPE_BF16", 7: "TYPE_INT64", 6: "TYPE_INT32",
                   5: "TYPE_INT16", 3: "TYPE_INT8", 2: "TYPE_UINT8", 9: "TYPE_BOOL"}  # onnx.TensorProto.DataType
_DEFAULT_FILE = {"onnxruntime_onnx": "model.onnx", "pytorch_libtorch": "model.pt", "tensorrt_plan": "model.plan"}


def _onnx_io(path: str, version_dir: str) -> tuple[dict, dict, list[str]]:
    """(inputs, outputs) as name -> (triton type, dims with -1 for symbolic), and missing external files."""
    import onnx

    m = onnx.load(path, load_external_data=False)
    missing = sorted({e.value for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
                      for e in t.external_data if e.key == "location"
                      and not os.path.isfile(os.path.join(version_dir, e.value))})
    inits = {t.name for t in m.graph.initializer}

    def io(vs):
        out = {}
        for v in vs:
            if v.name in inits:
                continue
            tt = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            out[v.name] = (_ONNX_TO_TRITON.get(tt.elem_type, f"onnx type {tt.elem_type}"), dims)
        return out

    return io(m.graph.input), io(m.graph.output), missing


def _check_io(cfg_io, model_io: dict, batched: bool, what: str, where: str) -> None:
    names = _DATA_TYPES
    seen = set()
    for t in cfg_io:
        if t.name not in model_io:
            raise TritonRepoError(f"{where}: {what} {t.name!r} is not one of the model's ({', '.join(model_io)})")
        seen.add(t.name)
        typ, dims = model_io[t.name]
        if names[t.data_type] != typ:
            raise TritonRepoError(f"{where}: {what} {t.name!r} is {names[t.data_type]} in the config, {typ} in the model")
        if not len(t.dims):  # Triton's ValidateIOShape: "must specify 'dims'"
            raise TritonRepoError(f"{where}: {what} {t.name!r} has no dims, which Triton refuses (a per-request scalar "
                                  "is dims: [ 1 ] with reshape: { shape: [ ] })")
        want = ([-1] if batched else []) + list(_model_dims(t))
        if len(want) != len(dims) or any(m != -1 and c != m for c, m in zip(want, dims)) or \
                (batched and dims[0] != -1):
            raise TritonRepoError(f"{where}: {what} {t.name!r} has dims {list(t.dims)} (batch "
                                  f"{'prepended' if batched else 'none'}), the model {dims}")
    if seen != set(model_io):
        raise TritonRepoError(f"{where}: the model's {what}s {sorted(set(model_io) - seen)} are not in the config")


def _model_dims(t) -> list[int]:
    """The dims the model sees for a config input/output: its reshape's when it has one (Triton reshapes
    each request's tensor to it), else its dims."""
    return list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)


def _run_onnx(path: str, cfg, batch: int) -> None:
    """Run the model in onnxruntime at `batch` with inputs shaped by the config (-1 dims set to 3)."""
    import numpy as np

    from overdrive.serve.artefacts import ort_session

    sess = ort_session(path)
    np_types = {"TYPE_FP32": np.float32, "TYPE_FP16": np.float16, "TYPE_FP64": np.float64, "TYPE_INT64": np.int64,
                "TYPE_INT32": np.int32, "TYPE_INT8": np.int8, "TYPE_UINT8": np.uint8, "TYPE_BOOL": np.bool_}
    feed = {}
    for t in cfg.input:
        shape = ([batch] if cfg.max_batch_size > 0 else []) + [3 if d == -1 else int(d) for d in _model_dims(t)]
        feed[t.name] = np.zeros(shape, dtype=np_types[_DATA_TYPES[t.data_type]])
    outs = sess.run([o.name for o in cfg.output], feed)
    for o, got in zip(cfg.output, outs):
        if cfg.max_batch_size > 0 and got.shape[0] != batch:
            raise TritonRepoError(f"{path}: output {o.name!r} has batch {got.shape[0]} for a request batch of {batch}")


def check_repository(root: str, *, run: bool = True) -> list[dict]:
    """Every model under `root` checked as Triton loads it; returns one summary per model, or raises
    TritonRepoError in one line. run=True also runs each ONNX model in onnxruntime at batch 1 and
    at max_batch_size, with inputs shaped from the config alone (what a client would send)."""
    if not os.path.isdir(root):
        raise TritonRepoError(f"{root} is not a folder: a Triton model repository is a folder of model folders")
    out = []
    for folder in sorted(os.listdir(root)):
        mdir = os.path.join(root, folder)
        if not os.path.isdir(mdir):
            continue
        cfg_path = os.path.join(mdir, "config.pbtxt")
        if not os.path.isfile(cfg_path):
            raise TritonRepoError(f"{mdir}: no config.pbtxt")
        with open(cfg_path) as f:
            cfg = parse_config(f.read(), cfg_path)
        if cfg.name != folder:
            raise TritonRepoError(f"{cfg_path}: name {cfg.name!r} is not the folder's ({folder!r}); Triton refuses it")
        if cfg.max_batch_size < 0:
            raise TritonRepoError(f"{cfg_path}: max_batch_size {cfg.max_batch_size} < 0")
        bad = [p for p in cfg.dynamic_batching.preferred_batch_size if p < 1 or p > cfg.max_batch_size]
        if bad:
            raise TritonRepoError(f"{cfg_path}: preferred_batch_size {bad} outside 1..max_batch_size "
                                  f"({cfg.max_batch_size})")
        versions = sorted((d for d in os.listdir(mdir) if d.isdigit() and os.path.isdir(os.path.join(mdir, d))), key=int)
        if not versions:
            raise TritonRepoError(f"{mdir}: no numeric version folder (e.g. 1/)")
        fname = cfg.default_model_filename or _DEFAULT_FILE.get(cfg.platform)
        if not fname:
            raise TritonRepoError(f"{cfg_path}: platform {cfg.platform!r} is not one this check knows")
        for v in versions:
            vdir = os.path.join(mdir, v)
            path = os.path.join(vdir, fname)
            if not os.path.isfile(path):
                raise TritonRepoError(f"{vdir}: no {fname} (what platform {cfg.platform} loads)")
            if cfg.platform == "onnxruntime_onnx":
                ins, outs, missing = _onnx_io(path, vdir)
                if missing:
                    raise TritonRepoError(f"{path} names external data {missing} that is not beside it in {vdir}")
                _check_io(cfg.input, ins, cfg.max_batch_size > 0, "input", cfg_path)
                _check_io(cfg.output, outs, cfg.max_batch_size > 0, "output", cfg_path)
                if run:
                    for b in sorted({1, max(1, cfg.max_batch_size)}):
                        _run_onnx(path, cfg, b)
        out.append({"name": cfg.name, "platform": cfg.platform, "versions": [int(v) for v in versions],
                    "max_batch_size": cfg.max_batch_size,
                    "preferred_batch_size": list(cfg.dynamic_batching.preferred_batch_size),
                    "max_queue_delay_microseconds": cfg.dynamic_batching.max_queue_delay_microseconds,
                    "instances": sum(g.count or 1 for g in cfg.instance_group) or 1,
                    "parameters": {k: v.string_value for k, v in cfg.parameters.items()}, "ran": run and
                    cfg.platform == "onnxruntime_onnx"})
    if not out:
        raise TritonRepoError(f"{root} holds no model folder")
    return out
