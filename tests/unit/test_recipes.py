"""resolve() on simulated machines: every choice and every fallback, with its reason."""

import pytest

from fakes import APEX_OK, LIGER_OK, TE_OK, TORCHAO_EMU, TRITON_OK, machine
from overdrive.env import build_report
from overdrive.recipes import PRESETS, Recipe, RecipeUnavailable, get_recipe, resolve

APEX_PY_ONLY = {"import_ok": True, "is_nvidia_apex": True, "amp_C": False, "fused_layer_norm_cuda": False,
                "amp_C_error": "No module named 'amp_C'", "fused_layer_norm_cuda_error": "No module named x"}
AO_GPU = dict(TORCHAO_EMU, fp8_ok=True)


def env(*a, **k):
    return build_report(machine(*a, **k))


def chosen(res, field):
    return next(d for d in res.decisions if d.field == field)


def test_no_gpu_fp8_falls_back_to_emulation():
    res = resolve("fp8", env(None, torchao=TORCHAO_EMU))
    assert res.fp8_backend == "emulated" and res.emulated and res.device == "cpu"
    d = chosen(res, "fp8")
    assert d.fallback
    assert d.reason == "fp8 requested: no GPU with SM >= 8.9 here → torchao emulation, numerics only, not faster"
    with pytest.raises(RecipeUnavailable, match="no GPU with SM >= 8.9 here → torchao emulation"):
        resolve("fp8", env(None, torchao=TORCHAO_EMU), strict=True)


def test_no_gpu_no_torchao_fp8_drops_to_best_precision():
    res = resolve("fp8", env(None))
    assert res.fp8_backend is None and res.precision == "fp32"
    assert "pip install 'torchao>=0.10'" in chosen(res, "fp8").reason


def test_auto_on_cpu_without_bf16_units_is_fp32():
    res = resolve("auto", env(None))
    assert res.precision == "fp32" and res.autocast_dtype is None and not res.grad_scaler
    assert "70x" in chosen(res, "precision").reason or "72x" in chosen(res, "precision").reason
    assert res.optimizer == "torch-fused" and res.norm == "torch"


def test_a100():
    e = env("a100", te=dict(TE_OK, fp8_available=False, fp8_reason="Device compute capability 8.9 or higher "
                                                                     "required for FP8 execution."),
            torchao=TORCHAO_EMU)
    res = resolve("auto", e)
    assert res.precision == "bf16" and res.autocast_dtype == "bfloat16"
    res = resolve("fp8", e)
    assert res.fp8_backend == "emulated"
    assert "8.9" in chosen(res, "fp8").reason
    res = resolve("amp-fp16", e)
    assert res.precision == "fp16" and res.grad_scaler


def test_h100_without_te_uses_torchao():
    res = resolve("fp8", env("h100", torchao=AO_GPU))
    assert res.fp8_backend == "torchao" and res.fp8_scaling == "tensorwise" and not res.emulated
    assert not chosen(res, "fp8").fallback  # auto backend: torchao is a choice, not a fallback
    assert res.autocast_dtype == "bfloat16"
    res = resolve(Recipe(precision="fp8", fp8_backend="transformer_engine"), env("h100", torchao=AO_GPU))
    d = chosen(res, "fp8")
    assert res.fp8_backend == "torchao" and d.fallback and "Transformer Engine is missing" in d.reason
    with pytest.raises(RecipeUnavailable, match="Transformer Engine is missing"):
        resolve(Recipe(precision="fp8", fp8_backend="transformer_engine"), env("h100", torchao=AO_GPU), strict=True)


def test_h100_with_te():
    e = env("h100", te=TE_OK, torchao=AO_GPU)
    res = resolve("fp8", e)
    assert res.fp8_backend == "transformer_engine" and res.norm == "transformer_engine"
    res = resolve(Recipe(precision="fp8", fp8_scaling="delayed"), e)
    assert res.fp8_backend == "transformer_engine" and res.fp8_scaling == "delayed"
    # DelayedScaling fails under torch.compile: current scaling instead (TE asked for by name).
    res = resolve(Recipe(precision="fp8", fp8_scaling="delayed", fp8_backend="transformer_engine",
                         compile="default"), e)
    assert res.fp8_backend == "transformer_engine" and res.fp8_scaling == "tensorwise"
    assert "compile" in chosen(res, "fp8_scaling").reason and "graph at every TE linear" in chosen(res, "fp8").reason
    # Rowwise is torchao's.
    res = resolve("fp8-rowwise", e)
    assert res.fp8_backend == "torchao" and res.fp8_scaling == "rowwise"
    # MXFP8 needs SM 10.x.
    res = resolve("mxfp8", e)
    assert res.fp8_scaling == "tensorwise" and "MXFP8 needs SM 10.x" in chosen(res, "fp8_scaling").reason


def test_b200_mxfp8():
    res = resolve("mxfp8", env("b200", te=dict(TE_OK, is_mxfp8_available=True)))
    assert res.fp8_backend == "transformer_engine" and res.fp8_scaling == "mxfp8" and not res.fallbacks


def test_torchao_delayed_scaling_falls_back():
    res = resolve(Recipe(precision="fp8", fp8_scaling="delayed"), env("h100", torchao=AO_GPU))
    assert res.fp8_backend == "torchao" and res.fp8_scaling == "tensorwise"
    assert "torchao removed it" in chosen(res, "fp8_scaling").reason


def test_apex_without_cuda_extensions():
    res = resolve(Recipe(optimizer="apex", norm="apex"), env("h100", apex=APEX_PY_ONLY))
    d = chosen(res, "optimizer")
    assert res.optimizer == "torch-fused" and d.fallback
    assert d.reason.startswith("apex FusedAdam requested: fused kernels were not built")
    assert d.reason.endswith("→ torch fused AdamW")
    assert res.norm == "torch" and chosen(res, "norm").fallback
    with pytest.raises(RecipeUnavailable, match="apex FusedAdam requested: fused kernels were not built"):
        resolve(Recipe(optimizer="apex"), env("h100", apex=APEX_PY_ONLY), strict=True)


def test_apex_ok_and_auto_order():
    e = env("h100", apex=APEX_OK, liger=LIGER_OK, triton=TRITON_OK)
    assert resolve(Recipe(optimizer="apex"), e).optimizer == "apex"
    res = resolve("auto", e)
    assert res.optimizer == "torch-fused" and res.norm == "liger"
    assert resolve(Recipe(compile="default"), e).norm == "torch"  # inductor fuses norms itself


def test_liger_without_gpu():
    e = env(None, liger=LIGER_OK)
    res = resolve(Recipe(norm="liger", loss="fused-linear-cross-entropy"), e)
    assert res.norm == "torch" and res.loss == "cross-entropy"
    assert "needs a CUDA GPU" in chosen(res, "norm").reason
    assert "needs a CUDA GPU" in chosen(res, "loss").reason
    with pytest.raises(RecipeUnavailable, match="liger norms requested"):
        resolve(Recipe(norm="liger"), e, strict=True)


def test_liger_on_gpu_fused_loss():
    res = resolve(Recipe(loss="fused-linear-cross-entropy"), env("h100", liger=LIGER_OK, triton=TRITON_OK))
    assert res.loss == "fused-linear-cross-entropy" and not res.fallbacks


def test_compile_broken_falls_back_to_eager():
    f = machine(None)
    f["probes"]["compile"] = {"device": "cpu", "ok": False, "error": "boom"}
    res = resolve(Recipe(compile="max-autotune"), build_report(f))
    assert res.compile == "off" and chosen(res, "compile").fallback


def test_presets_and_validation():
    assert {"auto", "baseline", "fp32", "fp32-fused", "amp-fp16", "amp-bf16", "fp8", "fp8-rowwise", "mxfp8",
            "nvfp4"} <= set(PRESETS)
    with pytest.raises(ValueError, match="presets are auto, baseline, fp32"):
        get_recipe("fp9")
    with pytest.raises(ValueError, match="precision='fp64' is not one of"):
        Recipe(precision="fp64")
    with pytest.raises(ValueError, match="unknown recipe field"):
        get_recipe("fp32", precison="bf16")
    r = get_recipe("amp-bf16", activation_checkpointing="full")
    assert r.precision == "bf16" and r.activation_checkpointing == "full"


def test_resolved_round_trips_through_json():
    import json

    from overdrive.recipes import ResolvedRecipe

    res = resolve("fp8", env(None, torchao=TORCHAO_EMU))
    back = ResolvedRecipe.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res


# -- one registry of names -------------------------------------------------------------------

@pytest.mark.parametrize("typed,canonical", [
    ("bf16", "amp-bf16"), ("BF16", "amp-bf16"), ("fp16", "amp-fp16"), ("no", "fp32"), ("none", "fp32"),
    ("float8", "fp8"), ("fp32-fused", "fp32-fused"), ("fp32-fused+compile", "fp32-fused+compile"),
    ("amp-bf16+compile", "amp-bf16+compile"), ("bf16+compiled", "amp-bf16+compile"),
    ("fp8+compile=max-autotune", "fp8+max-autotune"), ("fp8-rowwise+torchao", "fp8-rowwise+torchao"),
    ("amp-bf16+fp8_min_dim=512", "amp-bf16+fp8_min_dim=512"), ("fp4", "nvfp4"),
])
def test_names_users_type_parse_to_one_canonical_name(typed, canonical):
    from overdrive.recipes import canonical_name, parse_recipe_name

    assert canonical_name(typed) == canonical
    r = parse_recipe_name(typed)
    assert parse_recipe_name(r.name) == r  # the printed name parses back to the same fields


def test_every_name_the_bench_prints_is_accepted_everywhere(tmp_path):
    """The bench recommended 'fp32-fused' and 'fp32-fused+compile'; accelerate() and train.recipe refused them."""
    from overdrive.bench.suites import SUITES
    from overdrive.recipes import parse_recipe_name
    from overdrive.train.config import load_config

    printed = {c.name for s in SUITES.values() for c in s.candidates} | {"fp32-fused", "fp32-fused+compile"}
    for name in printed:
        r = parse_recipe_name(name)
        assert r.name == name, name
        assert resolve(name, env(None)).recipe == r
        load_config(None, [f"train.recipe={name}"])  # no ConfigError
    assert parse_recipe_name("fp32-fused+compile").compile == "default"
    assert parse_recipe_name("baseline").optimizer == "for-loop"


def test_bad_names_say_what_is_wrong():
    from overdrive.recipes import parse_recipe_name
    from overdrive.train.config import ConfigError, load_config

    with pytest.raises(ValueError, match="unknown recipe knob 'turbo'.*knobs are compile"):
        parse_recipe_name("fp8+turbo")
    with pytest.raises(ValueError, match="no field 'speed'"):
        parse_recipe_name("fp8+speed=11")
    with pytest.raises(ValueError, match="compile='fast' is not one of"):
        parse_recipe_name("fp8+compile=fast")
    with pytest.raises(ConfigError, match="'train.recipe' = 'fp9': unknown recipe 'fp9'"):
        load_config(None, ["train.recipe=fp9"])


def test_overrides_name_the_recipe_in_the_grammar():
    from overdrive.recipes import parse_recipe_name, recipe_name

    r = get_recipe("amp-bf16", activation_checkpointing="full", compile="default")
    assert r.name == "amp-bf16+compile+ckpt" and parse_recipe_name(r.name) == r
    assert recipe_name(Recipe(precision="bf16", compile="default")) == "amp-bf16+compile"


# -- MXFP8 / NVFP4 on faked B200, H100 and CPU machines ------------------------------------------

def test_b200_block_scaled_prefers_transformer_engine_then_torchao():
    from fakes import TE_B200, TORCHAO_B200

    for name, prec in (("mxfp8", "fp8"), ("nvfp4", "fp4")):
        res = resolve(name, env("b200", te=TE_B200, torchao=TORCHAO_B200))
        assert (res.fp8_backend, res.fp8_scaling, res.precision) == ("transformer_engine", name, prec)
        assert not res.fallbacks and not res.emulated and res.autocast_dtype == "bfloat16"
        res = resolve(name, env("b200", torchao=TORCHAO_B200))  # no TE: torchao is a choice, not a fallback
        assert res.fp8_backend == "torchao" and res.fp8_scaling == name and not res.fallbacks
        res = resolve(f"{name}+te", env("b200", torchao=TORCHAO_B200))
        assert res.fp8_backend == "torchao" and chosen(res, name).fallback
        assert "Transformer Engine is not installed" in chosen(res, name).reason


def test_b200_old_te_has_no_nvfp4():
    from fakes import TE_B200, TORCHAO_B200

    e = env("b200", te=dict(TE_B200, version="2.7.1", is_nvfp4_available=None), torchao=TORCHAO_B200)
    res = resolve("nvfp4", e)
    assert res.fp8_backend == "torchao"
    res = resolve("nvfp4+te", e)
    assert "predates NVFP4" in chosen(res, "nvfp4").reason and "2.8" in chosen(res, "nvfp4").reason


def test_b200_torchao_nvfp4_kernel_failure_is_reported():
    from fakes import TORCHAO_B200

    ao = dict(TORCHAO_B200, nvfp4_ok=False, nvfp4_error="RuntimeError: 0 active drivers")
    res = resolve("nvfp4", env("b200", torchao=ao))
    d = chosen(res, "fp8_scaling")
    assert res.fp8_scaling == "tensorwise" and res.fp8_backend == "torchao" and d.fallback
    assert "0 active drivers" in d.reason


def test_h100_block_scaled_fall_back_to_per_tensor_fp8_not_emulation():
    for name in ("mxfp8", "nvfp4"):
        res = resolve(name, env("h100", te=TE_OK, torchao=AO_GPU))
        d = chosen(res, "fp8_scaling")
        assert res.fp8_scaling == "tensorwise" and res.fp8_backend == "transformer_engine" and res.precision == "fp8"
        assert d.fallback and "SM 10" in d.reason and "H100" in d.reason
        with pytest.raises(RecipeUnavailable, match="SM 10"):
            resolve(name, env("h100", te=TE_OK, torchao=AO_GPU), strict=True)
    res = resolve("nvfp4+emulated", env("h100", te=TE_OK, torchao=AO_GPU))  # numerics study, asked for
    assert res.fp8_backend == "emulated" and res.precision == "fp4" and not res.fallbacks


def test_cpu_block_scaled_are_emulated_and_say_which_gemms():
    for name, prec in (("mxfp8", "fp8"), ("nvfp4", "fp4")):
        res = resolve(name, env(None, torchao=TORCHAO_EMU))
        d = chosen(res, name)
        assert (res.fp8_backend, res.precision, res.autocast_dtype) == ("emulated", prec, None) and res.emulated
        assert d.fallback and "forward, grad-input and grad-weight GEMMs" in d.reason and "not faster" in d.reason
        with pytest.raises(RecipeUnavailable, match="numerics only"):
            resolve(name, env(None, torchao=TORCHAO_EMU), strict=True)
    # NVFP4 emulation is plain torch; MXFP8's is torchao's recipe.
    assert resolve("nvfp4", env(None)).fp8_backend == "emulated"
    res = resolve("mxfp8", env(None))
    assert res.fp8_backend is None and res.precision == "fp32"
    assert "torchao is not installed" in chosen(res, "fp8_scaling").reason


def test_te_before_2_9_is_probed_through_its_fp8_module(monkeypatch):
    """TE 2.0-2.8 have no top-level is_fp8_available: the probe must ask transformer_engine.pytorch.fp8."""
    import sys
    import types

    from overdrive.env import _probes

    te_root, te_pt, fp8 = (types.ModuleType(n) for n in ("transformer_engine", "transformer_engine.pytorch",
                                                         "transformer_engine.pytorch.fp8"))
    te_root.__version__ = "2.5.0"
    fp8.check_fp8_support = lambda: (True, "")
    fp8.check_mxfp8_support = lambda: (False, "Device compute capability 10.0 or higher required for MXFP8 execution.")

    class FP8GlobalStateManager:
        @staticmethod
        def is_fp8_block_scaling_available():
            return False, "FP8 block scaled GEMM requires compute capability 9.0 or higher and CUDA >= 12.9."

    fp8.FP8GlobalStateManager = FP8GlobalStateManager
    te_pt.fp8 = fp8
    for name, mod in {"transformer_engine": te_root, "transformer_engine.pytorch": te_pt,
                      "transformer_engine.pytorch.fp8": fp8, "transformer_engine_torch": types.ModuleType("x")}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(_probes, "_device", lambda: "cpu")
    f = _probes.probe_te()
    assert f["fp8_available"] is True and f["is_mxfp8_available"] is False
    assert f["probe_api"] == "transformer_engine.pytorch.fp8.check_fp8_support"
    assert f["is_fp8_block_scaling_available"] is False and "nvfp4" not in str(f)
    res = resolve("fp8", env("h100", te=dict(f, smoke_ok=True)))
    assert res.fp8_backend == "transformer_engine" and not res.fallbacks


def test_te_before_2_2_has_no_current_scaling():
    old = dict(TE_OK, version="2.1.0")
    res = resolve("fp8", env("h100", te=old))
    d = chosen(res, "fp8_scaling")
    assert res.fp8_backend == "transformer_engine" and res.fp8_scaling == "delayed" and d.fallback
    assert "Float8CurrentScaling (first in TE 2.2)" in d.reason
    res = resolve("fp8+compile", env("h100", te=old, torchao=AO_GPU))  # delayed fails under compile: torchao
    assert res.fp8_backend == "torchao" and res.fp8_scaling == "tensorwise"
    res = resolve("fp8-delayed+compile", env("h100", te=old))
    assert res.compile == "off" and [d for d in res.decisions if d.field == "compile"][-1].fallback


def test_te_fp8_is_not_combined_with_activation_checkpointing():
    res = resolve("fp8+ckpt", env("h100", te=TE_OK, torchao=AO_GPU))
    assert res.fp8_backend == "torchao" and res.activation_checkpointing == "full"
    assert "CheckpointError" in chosen(res, "fp8").reason
    res = resolve("fp8+te+ckpt", env("h100", te=TE_OK, torchao=AO_GPU))
    assert res.fp8_backend == "torchao" and chosen(res, "fp8").fallback
    with pytest.raises(RecipeUnavailable, match="CheckpointError"):
        resolve("fp8+te+ckpt", env("h100", te=TE_OK, torchao=AO_GPU), strict=True)
    from fakes import TE_B200, TORCHAO_B200

    res = resolve("mxfp8+ckpt", env("b200", te=TE_B200, torchao=TORCHAO_B200))
    assert res.fp8_backend == "torchao" and res.fp8_scaling == "mxfp8"


def test_max_autotune_trains_without_cuda_graphs():
    res = resolve("amp-bf16+max-autotune", env("h100"))
    assert res.compile == "max-autotune-no-cudagraphs"
    assert "CUDA graphs" in chosen(res, "compile").reason


def test_doctor_says_per_engine_whether_mxfp8_and_nvfp4_run_here():
    from fakes import TE_B200, TORCHAO_B200

    cpu = env(None, torchao=TORCHAO_EMU).engines
    assert cpu["mxfp8"].status == "unsupported" and "MXFP8_EMULATED_RCEIL" in cpu["mxfp8"].reason
    assert cpu["nvfp4"].status == "unsupported" and "needs SM >= 10.0 (no GPU)" in cpu["nvfp4"].reason
    bare = env(None).engines
    # no emulation here either, but the cause is the hardware, as for NVFP4: the same status (it read "missing")
    assert bare["mxfp8"].status == bare["nvfp4"].status == "unsupported"
    assert "no MXFP8 emulation either" in bare["mxfp8"].reason and "torchao" in bare["mxfp8"].fix
    h100 = env("h100", te=dict(TE_OK, is_mxfp8_available=False, mxfp8_reason="Device compute capability 10.0 or "
                               "higher required for MXFP8 execution."), torchao=AO_GPU).engines["mxfp8"]
    assert h100.status == "unsupported" and "TE 2.8.0: Device compute capability 10.0" in h100.reason
    assert "SM 9.0" in h100.reason
    b200 = env("b200", te=TE_B200, torchao=TORCHAO_B200).engines
    assert b200["mxfp8"].status == "ok" and b200["mxfp8"].details["runs_on"] == ["transformer_engine", "torchao"]
    bad = env("b200", torchao=dict(TORCHAO_B200, nvfp4_ok=False, nvfp4_error="ModuleNotFoundError: triton"))
    nv = bad.engines["nvfp4"]
    assert nv.status == "broken" and "ModuleNotFoundError: triton" in nv.reason and "torchao" in nv.fix
    import jsonschema

    from overdrive.env import env_schema

    jsonschema.validate(env("b200", te=TE_B200, torchao=TORCHAO_B200).to_dict(), env_schema())


def test_a_recipe_built_from_fields_has_a_name_that_parses_back():
    from overdrive.recipes import parse_recipe_name

    for r in (Recipe(precision="bf16"), Recipe(precision="fp8", optimizer="for-loop", compile="default"),
              PRESETS["fp32"].replace(activation_checkpointing="selective", checkpoint_every=3)):
        assert r.name != "custom" and parse_recipe_name(r.name) == r, r.name
    assert Recipe(precision="bf16").name == "amp-bf16"
    assert PRESETS["amp-bf16"].replace(compile="default").name == "amp-bf16+compile"
