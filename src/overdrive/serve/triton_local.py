"""The repository a Triton server on this machine can load, written beside the production one.

`export` writes two repositories from one I/O spec and one batcher setting:
- <out>/triton/<name>/: production, `platform: "onnxruntime_onnx"` (Triton's container, CPU or GPU);
- <out>/triton_local/<name>/: the same model.onnx run by ONNX Runtime inside Triton's python backend
  (model.py from `triton_python_model`), which the `tritonserver` of the nvidia-pytriton wheel can load
  (it has no onnxruntime backend). `overdrive serve` runs it.
Two folders, not two models in one, so Triton's container loading triton/ never meets a python model
whose imports (onnxruntime, numpy < 2) its python may lack. Each config.pbtxt says which it is, in its
header and in the parameter `overdrive_variant`.
"""

from __future__ import annotations

import os
import shutil

from overdrive.io import write_atomic
from overdrive.serve.triton_config import PRODUCTION, VARIANT_KEY, build_config, config_text, parse_config
from overdrive.serve.triton_schema import TritonRepoError

__all__ = ["LOCAL_DIR", "PRODUCTION", "LOCAL", "write_local_variant", "find_local_repository", "load_in_server"]

LOCAL_DIR = "triton_local"
LOCAL = ("served here: Triton's python backend running this model.onnx in ONNX Runtime (overdrive serve); production "
         "serves triton/ on the onnxruntime_onnx backend")


def _model_py() -> bytes:
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "triton_python_model.py"), "rb") as f:
        return f.read()


def write_local_variant(out_dir: str, name: str, spec: dict, batching: dict, onnx_files: list[str], *,
                        kind: str = "KIND_CPU") -> list[str]:
    """<out_dir>/triton_local/<name>/{config.pbtxt, 1/model.py, 1/model.onnx (+ external data)}; returns
    the files written. `onnx_files`: the production copy of model.onnx and the files it names."""
    vdir = os.path.join(out_dir, LOCAL_DIR, name, "1")
    os.makedirs(vdir, exist_ok=True)
    written = []
    for src in onnx_files:  # the same bytes as production's: one model, two ways to serve it
        with open(src, "rb") as f:
            dst = os.path.join(vdir, os.path.basename(src))
            write_atomic(dst, f.read())
        written.append(dst)
    write_atomic(os.path.join(vdir, "model.py"), _model_py())
    # The python backend has no pool-size parameters of its own: model.py reads intra_op_thread_count.
    cfg = build_config(name, spec, batching, backend="python", kind=kind, parameters={VARIANT_KEY: LOCAL},
                       threads_parameters=True)
    path = os.path.join(out_dir, LOCAL_DIR, name, "config.pbtxt")
    write_atomic(path, config_text(cfg, header=("written by overdrive export: " + LOCAL,)))
    return written + [os.path.join(vdir, "model.py"), path]


def find_local_repository(path: str) -> str:
    """The repository `overdrive serve PATH` runs: PATH itself when it holds python-backend models, the
    triton_local/ inside an export folder, or one line saying what PATH is and what to pass."""
    from overdrive.errors import UserError

    if not os.path.isdir(path):
        raise UserError(f"{path} is not a folder: pass the folder `overdrive export --out` wrote (or its triton_local/)")
    if os.path.isdir(os.path.join(path, LOCAL_DIR)):
        path = os.path.join(path, LOCAL_DIR)
    elif os.path.isfile(os.path.join(path, "export.json")):  # an export folder without the variant
        raise UserError(f"{path} has no {LOCAL_DIR}/: it was exported without ONNX (--no-onnx, or the export extra "
                        "missing), and the server here runs the ONNX model; re-export after pip install "
                        "onnx onnxscript onnxruntime (the overdrive[export] extra)")
    models = [d for d in sorted(os.listdir(path)) if os.path.isfile(os.path.join(path, d, "config.pbtxt"))]
    if not models:
        raise UserError(f"{path} holds no model folder with a config.pbtxt: pass the folder `overdrive export --out` "
                        "wrote")
    for m in models:
        cfg_path = os.path.join(path, m, "config.pbtxt")
        try:
            with open(cfg_path) as f:
                cfg = parse_config(f.read(), cfg_path)
        except (TritonRepoError, OSError) as e:
            raise UserError(str(e).splitlines()[0]) from None
        if cfg.backend != "python":
            sibling = os.path.join(os.path.dirname(os.path.abspath(path)), LOCAL_DIR)
            hint = f"serve {sibling} here" if os.path.isdir(sibling) else "re-export with onnx installed"
            raise UserError(f"{cfg_path}: {cfg.platform or cfg.backend or 'this model'} needs Triton's container (the "
                            f"tritonserver here has the python backend only); {hint}")
        _only_our_code(os.path.join(path, m), cfg, cfg_path)
    return path


_PARAMETERS = {"overdrive_variant", "overdrive_batching_source", "intra_op_thread_count", "inter_op_thread_count"}


def _only_our_code(model_dir: str, cfg, cfg_path: str) -> None:
    """The python backend runs the model folder's Python: serve runs only the model.py export writes (the
    same ONNX model in ONNX Runtime), never one edited or added since, nor another file or environment a
    config names (default_model_filename, EXECUTION_ENV_PATH)."""
    from overdrive.errors import UserError

    fix = "re-export it with `overdrive export` (serve runs only the model.py export writes)"
    extra = sorted(set(cfg.parameters) - _PARAMETERS)
    if cfg.default_model_filename not in ("", "model.py") or extra:
        raise UserError(f"{cfg_path} names {cfg.default_model_filename or ', '.join(extra)}, which export never "
                        f"writes: {fix}")
    ours = _model_py()
    for v in sorted(os.listdir(model_dir)):
        vdir = os.path.join(model_dir, v)
        if not os.path.isdir(vdir):
            continue
        cache = os.path.join(vdir, "__pycache__")
        if os.path.isdir(cache) and not os.path.islink(cache):
            # Bytecode a planted .pyc could replace model.py with (its header only names the source's size and
            # time): a cache, removed, and the stub compiles the checked model.py again.
            shutil.rmtree(cache)
        py = [n for n in os.listdir(vdir) if n.endswith((".py", ".pyc", ".so")) or n == "__pycache__"]
        for n in py:
            p = os.path.join(vdir, n)
            same = n == "model.py" and os.path.isfile(p) and not os.path.islink(p) and open(p, "rb").read() == ours
            if not same:
                raise UserError(f"{p} is not the model.py overdrive export writes (edited, added, or a link): {fix}")


def load_in_server(out_dir: str) -> dict:
    """The repository check by the server itself: tritonserver loads triton_local/ and every model must be
    READY in /v2/repository/index. Runs where the server's environment is already made (export installs
    nothing); else says how to get the check."""
    from overdrive.serve.triton_env import ready_env, unavailable_reason
    from overdrive.serve.triton_server import TritonServer, TritonServerError

    why = unavailable_reason()
    env = None if why else ready_env()
    if env is None:
        return {"ran": False, "why": why or "the server's environment is not made yet: `overdrive serve "
                f"{out_dir}` makes it once and loads this repository"}
    try:
        with TritonServer(os.path.join(out_dir, LOCAL_DIR), env=env) as s:
            models = s.index()
    except TritonServerError as e:
        return {"ran": True, "ready": False, "error": str(e).splitlines()[0]}
    return {"ran": True, "ready": all(m.get("state") == "READY" for m in models),
            "models": [f"{m['name']} v{m['version']} {m['state']}" for m in models]}
