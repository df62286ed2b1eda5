"""The doctor's verdicts on simulated machines (facts faked at the probe boundary)."""

import os
import pytest

from fakes import APEX_OK, LIGER_OK, TE_OK, TORCHAO_EMU, TRITON_OK, machine
from overdrive.env import build_report, env_schema, gpu_by_key, lookup_gpu
from overdrive.env import probing

jsonschema = pytest.importorskip("jsonschema")


def _valid(rep):
    jsonschema.validate(rep.to_dict(), env_schema())
    return rep


def test_h100_with_working_te():
    rep = _valid(build_report(machine("h100", te=TE_OK, torchao=dict(TORCHAO_EMU, fp8_ok=True),
                                      liger=LIGER_OK, triton=TRITON_OK, apex=APEX_OK)))
    assert rep.engine("transformer_engine").status == "ok"
    assert "FP8 autocast" in rep.engine("transformer_engine").reason
    assert rep.engine("torchao").status == "ok"
    assert rep.engine("apex").status == "ok"
    assert rep.engine("liger_kernel").status == "ok"
    assert rep.fp8_backend == "transformer_engine"
    assert rep.best_precision == "bf16"
    g = rep.gpus[0]
    assert g.spec.key == "h100-sxm" and g.spec.bf16_tflops == 989 and g.spec.fp8_tflops == 1979
    assert g.capabilities["fp8"] and not g.capabilities["mxfp8"]
    assert rep.verdict[0].startswith("FP8: available")


def test_a100_fp8_unsupported():
    te_no_fp8 = dict(TE_OK, fp8_available=False,
                     fp8_reason="Device compute capability 8.9 or higher required for FP8 execution.")
    rep = _valid(build_report(machine("a100", te=te_no_fp8, torchao=TORCHAO_EMU)))
    te = rep.engine("transformer_engine")
    assert te.status == "unsupported" and "8.9" in te.reason
    ao = rep.engine("torchao")
    assert ao.status == "unsupported" and ao.details["emulate_ok"]
    assert rep.fp8_backend is None
    assert "SM 8.0" in rep.fp8_reason and "FP8 needs SM >= 8.9" in rep.fp8_reason
    assert rep.best_precision == "bf16"
    assert rep.gpus[0].spec.key == "a100-80" and rep.gpus[0].spec.fp8_tflops is None


def test_b200_mxfp8():
    te = dict(TE_OK, is_mxfp8_available=True)
    rep = _valid(build_report(machine("b200", te=te)))
    g = rep.gpus[0]
    assert g.capabilities["mxfp8"] and g.capabilities["nvfp4"] and g.capabilities["fp8"]
    assert g.spec.key == "b200" and g.spec.fp8_tflops == 4500
    assert rep.engine("transformer_engine").details["is_mxfp8_available"] is True


def test_apex_without_cuda_extensions_is_broken():
    apex = {"import_ok": True, "is_nvidia_apex": True, "amp_C": False,
            "amp_C_error": "ModuleNotFoundError: No module named 'amp_C'", "fused_layer_norm_cuda": False,
            "fused_layer_norm_cuda_error": "ModuleNotFoundError: No module named 'fused_layer_norm_cuda'"}
    rep = _valid(build_report(machine("h100", apex=apex)))
    st = rep.engine("apex")
    assert st.status == "broken"
    assert "fused kernels were not built" in st.reason and "amp_C" in st.reason
    assert "APEX_CPP_EXT=1 APEX_CUDA_EXT=1" in st.fix
    assert any("apex is broken" in line for line in rep.verdict)


def test_apex_whose_norm_kernels_fail_on_this_gpu_is_broken():
    """fused_layer_norm_cuda imports on any build; a build without this GPU's arch fails at the first
    launch: the probe runs the fused norms, and a failure makes Apex broken, not ok."""
    apex = dict(APEX_OK, norm_smoke_ok=False, norm_smoke_error="RuntimeError: CUDA error: no kernel image is "
                "available for execution on the device")
    st = _valid(build_report(machine("h100", apex=apex))).engine("apex")
    assert st.status == "broken" and "no kernel image" in st.reason and "TORCH_CUDA_ARCH_LIST" in st.fix
    ok = build_report(machine("h100", apex=APEX_OK)).engine("apex")
    assert ok.status == "ok" and "fused norms ran" in ok.reason


def test_pypi_apex_impostor():
    rep = build_report(machine(None, apex={"import_ok": True, "is_nvidia_apex": False}))
    st = rep.engine("apex")
    assert st.status == "broken" and "unrelated" in st.reason and "pip uninstall" in st.fix


def test_te_undefined_symbol():
    te = {"import_ok": True, "version": "2.8.0", "ext_ok": False,
          "ext_error": "ImportError: transformer_engine_torch.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"}
    st = build_report(machine("h100", te=te)).engine("transformer_engine")
    assert st.status == "broken" and "undefined symbol" in st.reason
    assert "--force-reinstall" in st.fix and "--no-build-isolation" in st.fix


def test_te_cudnn_shared_object_not_found():
    te = {"import_ok": False, "import_error": "RuntimeError: cudnn shared object not found"}
    st = build_report(machine("h100", te=te)).engine("transformer_engine")
    assert st.status == "broken" and "cudnn shared object not found" in st.reason
    assert "cudnn" in st.fix.lower()


def test_te_core_only_and_missing_header():
    te = {"import_ok": True, "ext_ok": False, "ext_error": "ModuleNotFoundError: No module named "
                                                          "'transformer_engine_torch'"}
    st = build_report(machine("h100", te=te)).engine("transformer_engine")
    assert st.status == "broken" and "transformer_engine_torch is missing" in st.reason
    te = {"import_ok": True, "ext_ok": False, "ext_error": "fatal error: cudnn.h: No such file or directory"}
    st = build_report(machine("h100", te=te)).engine("transformer_engine")
    assert st.status == "broken" and "cudnn.h" in st.reason and "CUDNN_PATH" in st.fix


def test_no_gpu_at_all():
    rep = _valid(build_report(machine(None, torchao=TORCHAO_EMU, liger=LIGER_OK, triton=TRITON_OK)))
    assert rep.gpus == [] and rep.device == "cpu"
    assert rep.engine("transformer_engine").status == "missing"
    assert rep.engine("liger_kernel").status == "unsupported"
    assert rep.engine("triton").status == "unsupported"
    assert rep.engine("torchao").status == "unsupported"
    assert rep.engine("sdpa_efficient").status == "unsupported"
    assert rep.fp8_backend is None
    # The fake CPU measured bf16 at 1.3 vs fp32 at 93 GFLOP/s (the AVX2 machine of the notes).
    assert rep.best_precision == "fp32" and "1.3 vs fp32 93 GFLOP/s measured here (72x slower)" in rep.best_precision_reason
    assert rep.verdict[0].startswith("FP8: unavailable — no GPU with SM >= 8.9")
    assert "Best precision here: fp32" in rep.verdict[1]


def test_cpu_with_bf16_units():
    rep = build_report(machine(None, cpu_rates={"fp32": 150.0, "bf16": 400.0}))
    assert rep.best_precision == "bf16" and "400 vs fp32 150" in rep.best_precision_reason


def test_hung_and_crashed_probes_are_broken_not_fatal():
    rep = build_report(machine("h100", te={"_timeout": 120}, liger={"_crash": "probe exited with code -11: "}))
    assert rep.engine("transformer_engine").status == "broken"
    assert "did not finish within 120 s" in rep.engine("transformer_engine").reason
    assert rep.engine("liger_kernel").status == "broken"


def test_compile_without_compiler():
    f = machine(None)
    f["probes"]["compile"] = {"device": "cpu", "ok": False, "error": "InvalidCxxCompiler"}
    f["toolchain"]["c_compiler"] = None
    st = build_report(f).engine("torch.compile")
    assert st.status == "broken" and "C++ compiler" in st.reason and "g++" in st.fix


def test_liger_missing_dependency():
    st = build_report(machine("h100", liger={"import_ok": False,
                                             "import_error": "ModuleNotFoundError: No module named 'packaging'"})
                      ).engine("liger_kernel")
    assert st.status == "broken" and "packaging" in st.fix


def test_catalog_lookup():
    assert lookup_gpu("NVIDIA H100 PCIe").key == "h100-pcie"
    assert lookup_gpu("NVIDIA L40S").key == "l40s"
    assert lookup_gpu("NVIDIA L4").key == "l4"
    assert lookup_gpu("NVIDIA A100-SXM4-40GB").key == "a100-40"
    assert lookup_gpu("Tesla T4") is None
    assert gpu_by_key("H200").hbm_tbs == 4.8
    with pytest.raises(ValueError, match="known GPUs are .*b300"):
        gpu_by_key("h300")


def test_run_probe_timeout_and_crash(monkeypatch):
    import subprocess

    def _hang(*a, **k):
        raise subprocess.TimeoutExpired(cmd="x", timeout=1)

    monkeypatch.setattr(probing.subprocess, "run", _hang)
    monkeypatch.setattr(probing.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert probing.run_probe("te", timeout=1) == {"_timeout": 1}

    class _CP:
        returncode, stdout, stderr = -11, "", "Segmentation fault"

    monkeypatch.setattr(probing.subprocess, "run", lambda *a, **k: _CP())
    assert "code -11" in probing.run_probe("te")["_crash"]


def test_probe_limit_stretches_with_the_hosts_load(monkeypatch):
    # A healthy probe on a host at load 20 on 2 cores must not read as a hung engine.
    seen = []

    def _run(cmd, timeout, **k):
        seen.append(timeout)
        raise probing.subprocess.TimeoutExpired(cmd="x", timeout=timeout)

    monkeypatch.setattr(probing.subprocess, "run", _run)
    monkeypatch.setattr(probing.os, "cpu_count", lambda: 2)
    for load, want in ((0.5, 60), (4.0, 120), (20.0, 240)):  # 1x, load/cores, capped at 4x
        monkeypatch.setattr(probing.os, "getloadavg", lambda load=load: (load, load, load))
        assert probing.run_probe("torch_native") == {"_timeout": want}
    assert seen == [60, 120, 240]


def test_env_disk_cache(monkeypatch, tmp_path):
    import overdrive.env as env_mod
    from fakes import machine as fake_machine

    calls = []
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("OVERDRIVE_NO_ENV_CACHE", raising=False)
    monkeypatch.setattr(env_mod, "collect_facts", lambda: calls.append(1) or fake_machine("h100"))
    env_mod.set_env(None)
    try:
        assert env_mod.get_env().gpus[0].spec.key == "h100-sxm" and len(calls) == 1
        env_mod.set_env(None)
        env_mod.get_env()  # a new process would find the facts on disk
        assert len(calls) == 1
        env_mod.get_env(refresh=True)  # the doctor always probes
        assert len(calls) == 2
        monkeypatch.setenv("OVERDRIVE_NO_ENV_CACHE", "1")
        env_mod.set_env(None)
        env_mod.get_env()
        assert len(calls) == 3
    finally:
        env_mod.set_env(None)


def test_doctor_says_what_the_bench_measured_here(tmp_path, monkeypatch):
    """The doctor's verdict is the probes' expectation; it never said what the bench found (fp16 14.7x slower)."""
    import io
    import json

    from rich.console import Console

    from fakes import TORCHAO_EMU, machine
    from overdrive.bench.findings import findings_path, load_findings, save_findings
    from overdrive.env import build_report
    from overdrive.report.doctor import render_doctor

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rep = build_report(machine(None, torchao=TORCHAO_EMU))

    def shown():
        buf = io.StringIO()
        render_doctor(rep, Console(file=buf, width=240))
        return buf.getvalue()

    assert "Measured here: nothing yet" in shown()
    results = json.load(open(os.path.join(os.path.dirname(__file__), "data", "bench_cpu_quick.json")))
    assert save_findings(results, rep) == findings_path(rep) and load_findings(rep)["suite"] == "cpu-quick"
    text = shown()
    assert "Measured here by `overdrive bench` (suite cpu-quick, 2026-11-30" in text
    assert "amp-fp16 (fp16): stopped — 41x slower than the baseline on the first step" in text
    assert "fp32-fused (fp32): 0.62x the baseline [0.16–2.49]" in text
    other = build_report({**machine(None), "torch": {**machine(None)["torch"], "version": "9.9.9"}})
    assert load_findings(other) is None  # another torch build: another machine's findings
