"""Fact gatherers that run in a child process: `python -m overdrive.env._probes NAME`.

Each one imports native code or launches a kernel, which can crash or hang the interpreter
(a CUDA driver in a bad state, an extension built against another torch), so the parent
runs it in a subprocess with a timeout and reads one JSON object from the last stdout line.
They only gather facts; `overdrive.env.engines` turns facts into a status, reason and fix.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback


from overdrive.env._probes_blackwell import _run_mx, _te_support  # noqa: E402  (format checks per engine)
from overdrive.env._probes_torch import _device, _err, probe_compile, probe_gpus, probe_torch_native


def probe_te() -> dict:
    f: dict = {}
    try:
        import transformer_engine  # noqa: F401

        f["version"] = getattr(transformer_engine, "__version__", None)
        f["import_ok"] = True
    except BaseException as e:
        f["import_ok"], f["import_error"] = False, _err(e)
        return f
    try:
        importlib.import_module("transformer_engine_torch")
        f["ext_ok"] = True
    except BaseException as e:
        f["ext_ok"], f["ext_error"] = False, _err(e)
        return f
    try:
        import transformer_engine.pytorch as te

        for what in ("fp8", "mxfp8", "nvfp4", "fp8_block_scaling"):
            got = _te_support(te, what)
            if got is None:
                continue
            ok, reason, api = got
            key = "fp8_available" if what == "fp8" else f"is_{what}_available"
            f[key], f[f"{what}_reason"] = ok, reason
            f.setdefault("probe_api", api)
        f.setdefault("fp8_available", False)
        f.setdefault("fp8_reason", "this Transformer Engine has no FP8 availability check")
    except BaseException as e:
        f["fp8_available"], f["fp8_reason"] = False, _err(e)
    if _device() == "cuda":
        try:
            import torch
            import transformer_engine.pytorch as te

            lin = te.Linear(64, 64, params_dtype=torch.bfloat16).cuda()
            x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            ctx = te.autocast(enabled=bool(f.get("fp8_available"))) if hasattr(te, "autocast") else \
                te.fp8_autocast(enabled=bool(f.get("fp8_available")))
            with ctx:
                y = lin(x)
            y.float().sum().backward()
            torch.cuda.synchronize()
            f["smoke_ok"], f["smoke_fp8"] = True, bool(f.get("fp8_available"))
        except BaseException as e:
            f["smoke_ok"], f["smoke_error"] = False, _err(e)
        # The block-scaled formats' kernels, where TE says the GPU has them (SM 10.x): one te.Linear
        # forward+backward under each recipe, so "available" means "ran here".
        for fmt, cls in (("mxfp8", "MXFP8BlockScaling"), ("nvfp4", "NVFP4BlockScaling")):
            if not f.get(f"is_{fmt}_available"):
                continue
            try:
                import torch
                import transformer_engine.pytorch as te
                from transformer_engine.common import recipe

                lin = te.Linear(128, 128, params_dtype=torch.bfloat16).cuda()
                x = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                rec = getattr(recipe, cls)()
                ctx = te.autocast(enabled=True, recipe=rec) if hasattr(te, "autocast") else \
                    te.fp8_autocast(enabled=True, fp8_recipe=rec)
                with ctx:
                    y = lin(x)
                y.float().sum().backward()
                torch.cuda.synchronize()
                f[f"{fmt}_smoke_ok"] = True
            except BaseException as e:
                f[f"{fmt}_smoke_ok"], f[f"{fmt}_smoke_error"] = False, _err(e)
    return f


def probe_apex() -> dict:
    f: dict = {}
    try:
        import apex

        f["import_ok"] = True
        f["version"] = getattr(apex, "__version__", None)
        f["is_nvidia_apex"] = importlib.util.find_spec("apex.optimizers") is not None
    except BaseException as e:
        f["import_ok"], f["import_error"] = False, _err(e)
        return f
    for ext in ("amp_C", "fused_layer_norm_cuda"):
        try:
            importlib.import_module(ext)
            f[ext] = True
        except BaseException as e:
            f[ext], f[ext + "_error"] = False, _err(e)
    if _device() == "cuda" and f.get("amp_C"):
        try:
            import torch
            from apex.optimizers import FusedAdam

            p = torch.nn.Parameter(torch.randn(64, device="cuda"))
            opt = FusedAdam([p], lr=1e-3)
            p.grad = torch.randn_like(p)
            opt.step()
            torch.cuda.synchronize()
            f["smoke_ok"] = True
        except BaseException as e:
            f["smoke_ok"], f["smoke_error"] = False, _err(e)
    if _device() == "cuda" and f.get("fused_layer_norm_cuda"):
        # Importing fused_layer_norm_cuda proves the library loads, not that its kernels were built for
        # this GPU: a build without this arch (e.g. no sm_90) fails only at launch. One bf16 RMSNorm and
        # LayerNorm forward+backward, checked against torch's.
        try:
            import torch
            import torch.nn.functional as F
            from apex.normalization import FusedLayerNorm, FusedRMSNorm

            x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            worst = 0.0
            for cls, ref in ((FusedRMSNorm, lambda t: F.rms_norm(t.float(), (256,), eps=1e-5)),
                             (FusedLayerNorm, lambda t: F.layer_norm(t.float(), (256,), eps=1e-5))):
                y = cls(256, eps=1e-5).cuda()(x)
                y.float().sum().backward()
                torch.cuda.synchronize()
                worst = max(worst, (y.float() - ref(x.detach())).abs().max().item())
            f["norm_smoke_ok"], f["norm_max_error"] = worst < 5e-2, worst
            if worst >= 5e-2:
                f["norm_smoke_error"] = f"outputs differ from torch's by {worst:.3g} (bf16 allows ~1e-2)"
        except BaseException as e:
            f["norm_smoke_ok"], f["norm_smoke_error"] = False, _err(e)
    return f


def probe_torchao() -> dict:
    f: dict = {}
    try:
        import torchao

        f["version"] = getattr(torchao, "__version__", None)
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        f["import_ok"] = True
    except BaseException as e:
        f["import_ok"], f["import_error"] = False, _err(e)
        return f
    import torch

    def _run(device: str, emulate: bool, dtype) -> None:
        m = torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False)).to(device, dtype)
        convert_to_float8_training(m, config=Float8LinearConfig(emulate=emulate))
        x = torch.randn(16, 32, device=device, dtype=dtype, requires_grad=True)
        m(x).float().sum().backward()

    try:
        _run("cpu", True, torch.float32)
        f["emulate_ok"] = True
    except BaseException as e:
        f["emulate_ok"], f["emulate_error"] = False, _err(e)
    try:
        _run_mx("mxfp8", "cpu", emulated=True)
        f["mxfp8_emulate_ok"] = True
    except BaseException as e:
        f["mxfp8_emulate_ok"], f["mxfp8_emulate_error"] = False, _err(e)
    if _device() == "cuda":
        cc = torch.cuda.get_device_capability()
        f["gpu_cc"] = list(cc)
        if cc >= (8, 9):
            try:
                _run("cuda", False, torch.bfloat16)
                torch.cuda.synchronize()
                f["fp8_ok"] = True
            except BaseException as e:
                f["fp8_ok"], f["fp8_error"] = False, _err(e)
        if cc >= (10, 0):  # MXFP8 (CUDA cast kernels: a source build on some platforms) and NVFP4 (Triton)
            for fmt in ("mxfp8", "nvfp4"):
                try:
                    _run_mx(fmt, "cuda", emulated=False)
                    torch.cuda.synchronize()
                    f[f"{fmt}_ok"] = True
                except BaseException as e:
                    f[f"{fmt}_ok"], f[f"{fmt}_error"] = False, _err(e)
    return f


def probe_liger() -> dict:
    f: dict = {}
    try:
        import liger_kernel  # noqa: F401
        from liger_kernel.transformers import LigerRMSNorm

        f["import_ok"] = True
        try:
            from importlib.metadata import version

            f["version"] = version("liger-kernel")
        except Exception:
            f["version"] = None
    except BaseException as e:
        f["import_ok"], f["import_error"] = False, _err(e)
        return f
    if _device() == "cuda":
        try:
            import torch

            norm = LigerRMSNorm(64).cuda()
            x = torch.randn(8, 64, device="cuda", requires_grad=True)
            norm(x).sum().backward()
            torch.cuda.synchronize()
            f["smoke_ok"] = True
        except BaseException as e:
            f["smoke_ok"], f["smoke_error"] = False, _err(e)
    return f


def probe_triton() -> dict:
    f: dict = {}
    try:
        import triton
        import triton.language as tl

        f["import_ok"], f["version"] = True, triton.__version__
    except BaseException as e:
        f["import_ok"], f["import_error"] = False, _err(e)
        return f
    if _device() != "cuda":
        return f
    try:
        import torch

        @triton.jit
        def _add(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

        x = torch.randn(1000, device="cuda")
        y = torch.empty_like(x)
        _add[(4,)](x, y, x.numel(), BLOCK=256)
        torch.cuda.synchronize()
        f["kernel_ok"] = bool(torch.allclose(y, x + 1))
    except BaseException as e:
        f["kernel_ok"], f["kernel_error"] = False, _err(e)
    return f


def probe_onnx() -> dict:
    """The ONNX export path: onnx, onnxscript (torch.onnx's dynamo exporter) and onnxruntime."""
    f: dict = {}
    try:
        import onnx
        import onnxruntime
        import onnxscript  # noqa: F401

        f["import_ok"], f["version"] = True, f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}"
        f["providers"] = onnxruntime.get_available_providers()
    except BaseException as e:
        f["import_ok"], f["import_error"] = False, _err(e)
    return f


def probe_torchrec() -> dict:
    """TorchRec and FBGEMM: import both (fbgemm's .so files must match this torch) and pool one bag."""
    f: dict = {}
    try:
        import torch
        import torchrec

        f["import_ok"] = True
        try:
            from importlib.metadata import version

            f["version"] = f"torchrec {version('torchrec')}"
        except Exception:
            f["version"] = None
        ebc = torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
            name="t0", embedding_dim=4, num_embeddings=10, feature_names=["f0"])], device=torch.device("cpu"))
        kjt = torchrec.KeyedJaggedTensor.from_lengths_sync(keys=["f0"], values=torch.tensor([1, 2, 3]),
                                                           lengths=torch.tensor([2, 1]))
        f["smoke_ok"] = tuple(ebc(kjt).to_dict()["f0"].shape) == (2, 4)
    except BaseException as e:
        f.setdefault("import_ok", False)
        f["import_error" if not f["import_ok"] else "smoke_error"] = _err(e)
        if f["import_ok"]:
            f["smoke_ok"] = False
    return f


PROBES = {
    "gpus": probe_gpus, "te": probe_te, "apex": probe_apex, "torchao": probe_torchao,
    "liger": probe_liger, "triton": probe_triton, "compile": probe_compile,
    "torch_native": probe_torch_native, "onnx": probe_onnx,
    "torchrec": probe_torchrec,
}


def main(argv: list[str]) -> int:
    name = argv[0]
    parent = os.environ.get("OVERDRIVE_PROBE_PARENT", "")
    if parent.isdigit():  # end with the process that asked (SIGTERM during doctor/export left us ~30 s)
        from overdrive.measure.procs import bind_to_parent

        bind_to_parent(int(parent))
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    try:
        facts = PROBES[name]()
    except BaseException as e:  # report, never a traceback on the user's screen
        facts = {"probe_error": _err(e), "trace": traceback.format_exc()[-800:]}
    sys.stdout.flush()
    print("\n" + json.dumps(facts, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
