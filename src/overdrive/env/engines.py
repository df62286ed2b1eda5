"""Turn probe facts into a status for each optional engine, with a one-line reason and fix.

Statuses:
  ok           installed and really works here (its kernels ran, not just its import);
  missing      not installed;
  broken       installed but not working (failed import, unbuilt extension, crash, hang);
  unsupported  works, but not on this hardware (e.g. a GPU-only kernel library on a CPU box).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from overdrive.formats import EMULATED, FORMATS, TE, Format

__all__ = ["EngineStatus", "classify_engines", "STATUSES"]

STATUSES = ("ok", "missing", "broken", "unsupported")

_TE_INSTALL = "pip install --no-build-isolation 'transformer_engine[pytorch]' (needs nvcc and cuDNN headers)"
_APEX_BUILD = ("build NVIDIA/apex from source: APEX_CPP_EXT=1 APEX_CUDA_EXT=1 "
               "pip install -v --no-build-isolation . (in a clone of NVIDIA/apex)")


@dataclass(kw_only=True)
class EngineStatus:
    name: str
    status: str
    reason: str
    fix: str = ""
    version: str | None = None
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        return asdict(self)


def _failed_probe(name: str, facts: dict, what: str) -> EngineStatus | None:
    """A probe that hung, crashed or raised is `broken` whatever the engine."""
    if "_timeout" in facts:
        return EngineStatus(name=name, status="broken",
                            reason=f"{what} did not finish within {facts['_timeout']} s (hung import or kernel)",
                            fix="run the probe by hand to see where it stops: python -m overdrive.env._probes "
                                + name)
    if "_crash" in facts or "probe_error" in facts:
        msg = facts.get("_crash") or facts.get("probe_error")
        return EngineStatus(name=name, status="broken", reason=f"{what} crashed: {msg}",
                            fix="reinstall the package against this torch, then re-run `overdrive doctor`")
    return None


def _te(f: dict, has_gpu: bool, gpu_name: str) -> EngineStatus:
    n, v = "transformer_engine", f.get("version")
    if not f.get("import_ok"):
        err = f.get("import_error", "")
        low = err.lower()
        if "cudnn" in low and ("shared object" in low or ".so" in low):
            return EngineStatus(name=n, status="broken", version=v, reason=f"import fails: {err}",
                                fix="pip install nvidia-cudnn-cu12 (or put cuDNN's lib dir on LD_LIBRARY_PATH)")
        if "undefined symbol" in low:
            return EngineStatus(name=n, status="broken", version=v,
                                reason="compiled against another torch (undefined symbol)",
                                fix="rebuild against this torch: pip install --no-build-isolation --no-cache-dir "
                                    "--force-reinstall 'transformer_engine[pytorch]'")
        return EngineStatus(name=n, status="broken", version=v, reason=f"import fails: {err}",
                            fix=_TE_INSTALL)
    if not f.get("ext_ok"):
        err = f.get("ext_error", "")
        low = err.lower()
        if "undefined symbol" in low:
            return EngineStatus(name=n, status="broken", version=v,
                                reason="transformer_engine_torch was built against another torch (undefined symbol)",
                                fix="rebuild against this torch: pip install --no-build-isolation --no-cache-dir "
                                    "--force-reinstall 'transformer_engine[pytorch]'")
        if "cudnn.h" in low:
            return EngineStatus(name=n, status="broken", version=v, reason="built without cuDNN headers (cudnn.h)",
                                fix="install cuDNN headers (pip install nvidia-cudnn-cu12) and set CUDNN_PATH, "
                                    "then rebuild")
        if "no module named" in low:
            return EngineStatus(name=n, status="broken", version=v,
                                reason="only the core package is installed: its PyTorch extension "
                                       "transformer_engine_torch is missing", fix=_TE_INSTALL)
        return EngineStatus(name=n, status="broken", version=v,
                            reason=f"extension transformer_engine_torch fails to load: {err}", fix=_TE_INSTALL)
    per_format = [f"{pre}{k}{post}" for k in _probed_kinds() for pre, post in
                  (("is_", "_available"), ("", "_reason"), ("", "_smoke_ok"), ("", "_smoke_error"))]
    details = {k: f[k] for k in ("fp8_available", "is_fp8_block_scaling_available", "probe_api", *per_format)
               if k in f}
    if not has_gpu:
        return EngineStatus(name=n, status="unsupported", version=v, details=details,
                            reason="imports and loads, but its kernels need a CUDA GPU", fix="run on an NVIDIA GPU")
    if f.get("smoke_ok") is False:
        return EngineStatus(name=n, status="broken", version=v, details=details,
                            reason=f"te.Linear forward/backward failed on {gpu_name}: {f.get('smoke_error')}",
                            fix=_TE_INSTALL)
    if not f.get("fp8_available"):
        return EngineStatus(name=n, status="unsupported", version=v, details=details,
                            reason=f"FP8 unavailable on {gpu_name}: {f.get('fp8_reason') or 'needs SM >= 8.9'}",
                            fix="use bf16 here; FP8 needs an Ada/Hopper/Blackwell GPU (SM >= 8.9)")
    return EngineStatus(name=n, status="ok", version=v, details=details,
                        reason=f"te.Linear forward+backward ran under FP8 autocast on {gpu_name}")


def _apex(f: dict, has_gpu: bool, gpu_name: str) -> EngineStatus:
    n, v = "apex", f.get("version")
    if not f.get("import_ok"):
        return EngineStatus(name=n, status="broken", version=v, reason=f"import fails: {f.get('import_error')}",
                            fix=_APEX_BUILD)
    if not f.get("is_nvidia_apex"):
        return EngineStatus(name=n, status="broken", version=v,
                            reason="the installed 'apex' is the unrelated PyPI package, not NVIDIA Apex",
                            fix="pip uninstall -y apex, then " + _APEX_BUILD)
    missing = [ext for ext in ("amp_C", "fused_layer_norm_cuda") if not f.get(ext)]
    if missing:
        errs = " ".join(str(f.get(m + "_error", "")) for m in missing).lower()
        if "undefined symbol" in errs:
            return EngineStatus(name=n, status="broken", version=v,
                                reason=f"{', '.join(missing)} built against another torch (undefined symbol)",
                                fix="rebuild against this torch: " + _APEX_BUILD)
        return EngineStatus(name=n, status="broken", version=v, details={"missing_extensions": missing},
                            reason=f"fused kernels were not built ({', '.join(missing)} missing): a Python-only build",
                            fix="rebuild with " + _APEX_BUILD.split(": ", 1)[1])
    if not has_gpu:
        return EngineStatus(name=n, status="unsupported", version=v,
                            reason="CUDA extensions are built, but there is no GPU to run them",
                            fix="run on an NVIDIA GPU")
    if f.get("smoke_ok") is False:
        return EngineStatus(name=n, status="broken", version=v,
                            reason=f"FusedAdam step failed on {gpu_name}: {f.get('smoke_error')}", fix=_APEX_BUILD)
    if f.get("norm_smoke_ok") is False:
        return EngineStatus(name=n, status="broken", version=v,
                            reason=f"fused_layer_norm_cuda loads but its kernels fail on {gpu_name} (a build "
                                   f"without this GPU's arch?): {f.get('norm_smoke_error')}",
                            fix="rebuild for this GPU (TORCH_CUDA_ARCH_LIST set to its compute capability): "
                                + _APEX_BUILD)
    ran = "FusedAdam stepped" + (" and the fused norms ran" if f.get("norm_smoke_ok") else "")
    return EngineStatus(name=n, status="ok", version=v, reason=f"amp_C and fused_layer_norm_cuda load; "
                                                              f"{ran} on {gpu_name}")


def _torchao(f: dict, has_gpu: bool, gpu_name: str, fp8_gpu: bool) -> EngineStatus:
    n, v = "torchao", f.get("version")
    if not f.get("import_ok"):
        return EngineStatus(name=n, status="broken", version=v, reason=f"import fails: {f.get('import_error')}",
                            fix="install a torchao built for this torch (torchao >= 0.17 needs torch >= 2.10): "
                                "pip install -U torchao")
    details = {"emulate_ok": bool(f.get("emulate_ok")), "fp8_ok": bool(f.get("fp8_ok"))}
    keys = [k for kind in _probed_kinds() for k in (f"{kind}_emulate_ok", f"{kind}_emulate_error", f"{kind}_ok",
                                                     f"{kind}_error")]
    details.update({k: f[k] for k in keys if k in f})
    if not f.get("emulate_ok"):
        return EngineStatus(name=n, status="broken", version=v, details=details,
                            reason=f"float8 training fails even emulated: {f.get('emulate_error')}",
                            fix="pip install -U torchao")
    if not fp8_gpu:
        where = f"{gpu_name} has SM < 8.9" if has_gpu else "no GPU"
        return EngineStatus(name=n, status="unsupported", version=v, details=details,
                            reason=f"float8 emulation works (numerics only, not faster); real FP8 needs SM >= 8.9 "
                                   f"({where})", fix="run on an Ada/Hopper/Blackwell GPU for FP8 speed")
    if not f.get("fp8_ok"):
        return EngineStatus(name=n, status="broken", version=v, details=details,
                            reason=f"float8 linear failed on {gpu_name}: {f.get('fp8_error')}",
                            fix="pip install -U torchao (match the torch version)")
    return EngineStatus(name=n, status="ok", version=v, details=details,
                        reason=f"Float8Linear forward+backward ran on {gpu_name} (emulation also available)")


def _probed_kinds() -> list[str]:
    """The formats the engines' probes report by name (`Format.probed`: MXFP8, NVFP4)."""
    return list(dict.fromkeys(f.kind for f in FORMATS.values() if f.probed))


def _te_says(fmt: Format, te: EngineStatus | None, gpus: list[dict]) -> str:
    name, kind, since = fmt.label, fmt.kind, ".".join(map(str, fmt.engine(TE).since))
    if te is None or te.status == "missing":
        return "not installed"
    if te.status == "broken":
        return f"broken ({te.reason})"
    if te.details.get(f"is_{kind}_available") is None:
        return (f"TE {te.version or '?'} reports no {name} support (needs TE >= {since} and SM >= "
                f"{fmt.min_cc[0]}.{fmt.min_cc[1]})" if gpus else f"needs a CUDA GPU with SM >= {fmt.min_cc[0]}.0")
    if not te.details.get(f"is_{kind}_available"):
        return f"TE {te.version}: {te.details.get(f'{kind}_reason') or f'needs SM >= {fmt.min_cc[0]}.0'}"
    if te.details.get(f"{kind}_smoke_ok") is False:
        return f"TE {te.version}: te.Linear failed: {te.details.get(f'{kind}_smoke_error')}"
    return f"ok (TE {te.version}, te.Linear ran under {name})"


def _ao_says(fmt: Format, ao: EngineStatus | None, capable: list) -> str:
    if ao is None or ao.status == "missing":
        return "not installed"
    if ao.status == "broken" and not ao.details.get("emulate_ok"):
        return f"broken ({ao.reason})"
    if not capable:
        return f"torchao {ao.version}: its {fmt.label} kernels need SM >= {fmt.min_cc[0]}.0"
    if ao.details.get(f"{fmt.kind}_ok"):
        return f"ok (torchao {ao.version}, training linear ran)"
    return f"torchao {ao.version}: failed: {ao.details.get(f'{fmt.kind}_error') or ao.reason}"


def _emulation_says(fmt: Format, ao: EngineStatus | None) -> str:
    probe = fmt.engine(EMULATED).api
    if not probe:
        return f"ok (overdrive's {fmt.label} emulation: plain torch, numerics only)"
    if ao is not None and ao.details.get(probe):
        return f"ok ({fmt.emulation}, numerics only)"
    return "needs torchao" if ao is None or ao.status == "missing" else \
        f"torchao's emulated recipe failed: {ao.details.get(probe.replace('_ok', '_error')) or ao.reason}"


def _block_scaled(fmt: Format, engines: dict[str, EngineStatus], gpus: list[dict]) -> EngineStatus:
    """Does a probed format (MXFP8, NVFP4) really run here, engine by engine (Transformer Engine, torchao,
    emulation)?

    ok: an engine's kernels ran on this GPU; unsupported: the GPU lacks the format (SM 10.x) and only
    emulation runs (numerics, not speed); broken: a capable GPU whose engines failed; missing: nothing."""
    name, since = fmt.label, ".".join(map(str, fmt.engine(TE).since))
    capable = [g for g in gpus if fmt.runs_on(tuple(g["cc"]))]
    per = {"transformer_engine": _te_says(fmt, engines.get("transformer_engine"), gpus),
           "torchao": _ao_says(fmt, engines.get("torchao"), capable),
           "emulated": _emulation_says(fmt, engines.get("torchao"))}
    reason = "; ".join(f"{k}: {v}" for k, v in per.items())
    real = [k for k in ("transformer_engine", "torchao") if per[k].startswith("ok")]
    if real:
        return EngineStatus(name=fmt.kind, status="ok", reason=reason, details={"engines": per, "runs_on": real})
    emulated = per["emulated"].startswith("ok")
    if capable:
        return EngineStatus(name=fmt.kind, status="broken", reason=reason, details={"engines": per},
                            fix=f"pip install -U transformer_engine[pytorch] (TE >= {since}) or torchao >= 0.18 "
                                f"(its MXFP8 kernels may need a source build on this platform)")
    g = gpus[0] if gpus else None
    where = f"{g['name']} is SM {g['cc'][0]}.{g['cc'][1]}" if g else "no GPU"
    # The hardware lacks the format: "unsupported" whether or not emulation runs (MXFP8 read "missing" and
    # NVFP4 "unsupported" on one CPU for this same reason); the reason and the fix say about emulation.
    return EngineStatus(name=fmt.kind, status="unsupported",
                        reason=f"{name} needs SM >= {fmt.min_cc[0]}.{fmt.min_cc[1]} ({where}); " + reason
                        + ("" if emulated else f"; no {name} emulation either"), details={"engines": per},
                        fix=f"run on a Blackwell GPU (B200/B300) for {name} speed" +
                            ("" if emulated else "; pip install 'torchao>=0.10' for emulation"))


def _gpu_kernel_lib(n: str, f: dict, has_gpu: bool, gpu_name: str, smoke_key: str, what: str,
                    fix_missing_dep: str) -> EngineStatus:
    v = f.get("version")
    if not f.get("import_ok"):
        err = str(f.get("import_error"))
        fix = fix_missing_dep if "no module named" in err.lower() else f"pip install -U {n.replace('_', '-')}"
        return EngineStatus(name=n, status="broken", version=v, reason=f"import fails: {err}", fix=fix)
    if not has_gpu:
        return EngineStatus(name=n, status="unsupported", version=v,
                            reason=f"imports, but {what} needs a CUDA GPU (TRITON_INTERPRET=1 runs Triton kernels "
                                   "on CPU for correctness only)", fix="run on an NVIDIA GPU")
    if f.get(smoke_key) is False:
        err = f.get(smoke_key.replace("_ok", "_error"))
        return EngineStatus(name=n, status="broken", version=v, reason=f"{what} failed on {gpu_name}: {err}",
                            fix=f"pip install -U {n.replace('_', '-')} (match your torch and Triton)")
    return EngineStatus(name=n, status="ok", version=v, reason=f"{what} ran on {gpu_name}")


def _compile(f: dict, c_compiler: str | None) -> EngineStatus:
    n = "torch.compile"
    if not f.get("ok"):
        err = str(f.get("error", ""))
        if f.get("device") == "cpu" and not c_compiler:
            return EngineStatus(name=n, status="broken", reason="inductor needs a C++ compiler and none was found",
                                fix="apt-get install g++ (or set CXX)")
        return EngineStatus(name=n, status="broken", reason=f"inductor failed on a tiny function: {err}",
                            fix="check the compiler / Triton install; use compile='off' meanwhile")
    return EngineStatus(name=n, status="ok", details={"device": f.get("device"), "c_compiler": c_compiler},
                        reason=f"inductor compiled and ran a tiny function on {f.get('device')}")


def _native(f: dict, has_gpu: bool) -> list[EngineStatus]:
    dev = f.get("device", "cpu")
    out = [EngineStatus(name="fused_adamw", status="ok" if f.get("fused_adamw") else "broken",
                        reason=(f"torch.optim.AdamW(fused=True) stepped on {dev}" if f.get("fused_adamw")
                                else f"AdamW(fused=True) failed: {f.get('fused_adamw_error')}"),
                        fix="" if f.get("fused_adamw") else "upgrade torch (fused AdamW on CPU needs torch >= 2.4)")]
    for backend, r in (f.get("sdpa") or {}).items():
        name = f"sdpa_{backend}"
        if r.get("ok"):
            out.append(EngineStatus(name=name, status="ok", reason=f"causal attention ran on {dev}"))
        elif not has_gpu and backend in ("efficient", "cudnn"):
            out.append(EngineStatus(name=name, status="unsupported", reason="a CUDA-only SDPA backend",
                                    fix="run on an NVIDIA GPU"))
        else:
            err = str(r.get("error", ""))
            out.append(EngineStatus(name=name, status="unsupported" if has_gpu else "broken",
                                    reason=f"declined on {dev}: {err[:160]}",
                                    fix="other SDPA backends take over automatically"))
    return out


def _onnx(f: dict, fix: str) -> EngineStatus:
    ok = bool(f.get("import_ok"))
    return EngineStatus(name="onnx", status="ok" if ok else "broken", version=f.get("version"),
                        reason=("onnx, onnxscript and onnxruntime import: ONNX export available" if ok
                                else f"import fails: {f.get('import_error')}"),
                        fix="" if ok else fix, details={"providers": f.get("providers", [])})


def _torchrec(f: dict, fix: str) -> EngineStatus:
    n, v = "torchrec", f.get("version")
    if not f.get("import_ok"):
        err = str(f.get("import_error"))
        why = ("FBGEMM's compiled ops do not match this torch" if "could not load" in err.lower()
               or "undefined symbol" in err.lower() else "import fails")
        return EngineStatus(name=n, status="broken", version=v, reason=f"{why}: {err}",
                            fix="install the torchrec/fbgemm-gpu release built for this torch version")
    if not f.get("smoke_ok"):
        return EngineStatus(name=n, status="broken", version=v, reason=f"EmbeddingBagCollection failed: "
                            f"{f.get('smoke_error')}", fix=fix)
    return EngineStatus(name=n, status="ok", version=v, reason="EmbeddingBagCollection pooled a KeyedJaggedTensor")


def classify_engines(facts: dict, gpus: list[dict]) -> dict[str, EngineStatus]:
    """One EngineStatus per engine, from the facts gathered by `probing.collect_facts`."""
    probes, installed = facts.get("probes", {}), facts.get("installed", {})
    has_gpu = bool(gpus)
    gpu_name = gpus[0]["name"] if gpus else "CPU"
    fp8_gpu = any(tuple(g["cc"]) >= (8, 9) for g in gpus)
    out: dict[str, EngineStatus] = {}

    missing_fix = {
        "te": ("transformer_engine", _TE_INSTALL),
        "apex": ("apex", "no PyPI package (the PyPI 'apex' is unrelated): " + _APEX_BUILD),
        "torchao": ("torchao", "pip install 'torchao>=0.10' (the overdrive[torchao] extra)"),
        "liger": ("liger_kernel", "pip install liger-kernel packaging numpy (the overdrive[liger] extra)"),
        "triton": ("triton", "pip install triton (CUDA builds of torch bring it)"),
        "onnx": ("onnx", "pip install onnx onnxscript onnxruntime (the overdrive[export] extra)"),
        "torchrec": ("torchrec", "pip install torchrec fbgemm-gpu (fbgemm-gpu-cpu without CUDA), built for this torch"),
    }
    for key, (name, fix) in missing_fix.items():
        f = probes.get(key, {})
        if not installed.get(key):
            out[name] = EngineStatus(name=name, status="missing", reason="not installed", fix=fix)
        elif bad := _failed_probe(name, f, f"the {name} probe"):
            out[name] = bad
        elif key == "te":
            out[name] = _te(f, has_gpu, gpu_name)
        elif key == "apex":
            out[name] = _apex(f, has_gpu, gpu_name)
        elif key == "torchao":
            out[name] = _torchao(f, has_gpu, gpu_name, fp8_gpu)
        elif key == "onnx":
            out[name] = _onnx(f, fix)
        elif key == "torchrec":
            out[name] = _torchrec(f, fix)
        elif key == "liger":
            out[name] = _gpu_kernel_lib(name, f, has_gpu, gpu_name, "smoke_ok", "LigerRMSNorm forward+backward",
                                        "pip install packaging numpy (liger-kernel does not declare them)")
        else:
            out[name] = _gpu_kernel_lib(name, f, has_gpu, gpu_name, "kernel_ok", "a tiny Triton kernel",
                                        "pip install -U triton")
    for fmt in {f.kind: f for f in FORMATS.values() if f.probed}.values():
        out[fmt.kind] = _block_scaled(fmt, out, gpus)
    cc = facts.get("toolchain", {}).get("c_compiler")
    f = probes.get("compile", {})
    out["torch.compile"] = _failed_probe("torch.compile", f, "the compile probe") or _compile(f, cc)
    f = probes.get("torch_native", {})
    bad = _failed_probe("fused_adamw", f, "the fused AdamW / SDPA probe")
    for st in [bad] if bad else _native(f, has_gpu):
        out[st.name] = st
    return out
