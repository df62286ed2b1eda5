"""The host's time per eager op on a GPU host (plan/host.py's HOST_US_PER_OP): a published B200 eager step over the
ops that step dispatches (scripts/host_us_published.py), re-counted here with the installed transformers."""

import importlib.util
import json
from pathlib import Path

import pytest

from overdrive.env import gpu_by_key
from overdrive.plan import TrainSetup
from overdrive.plan.estimate import estimate
from overdrive.plan.host import HOST_US_PER_OP, HOST_US_PER_OP_CPU, eager_ops, host_time
from overdrive.plan.specs import get_model

ROOT = Path(__file__).resolve().parents[2]
DERIVED = ROOT / "benchmarks" / "results" / "cpu" / "2026-12-07-host-us-published" / "host-us.json"


def _script():
    spec = importlib.util.spec_from_file_location("host_us_published", ROOT / "scripts" / "host_us_published.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _published_step() -> TrainSetup:
    """torch-compile-bench.py's training step as the planner's flags: one B200, bf16 weights (no autocast, no fp32
    masters), HF's gradient checkpointing, batch 1 x 512, eager Hugging Face code, no optimizer."""
    return TrainSetup(gpu=gpu_by_key("b200"), gpus_per_node=1, nodes=1, seq=512, micro_batch=1, global_batch=1,
                      precision="bf16", master_weights="none", sharding="none", checkpointing="full",
                      compile=False, block_code="hf")


def test_the_constant_is_the_committed_derivation():
    rec = json.loads(DERIVED.read_text())
    assert "744d01e18b79512572f64a6bbd8b5f4a725203a7" in rec["source"]
    script = _script()
    for w, row in rec["workloads"].items():   # the script's transcription of the source, and its arithmetic
        assert row["published_eager_ms"] == script.PUBLISHED_MS[w]
        assert row["published_cuda_graphs_ms"] == script.GRAPHED_MS[w]
        assert row["us_per_op"] == pytest.approx(1e3 * row["published_eager_ms"] / row["ops"], abs=0.01)
    assert script.PUBLISHED_MS == {"forward": 8.1, "forward+backward": 48.8}   # the Llama 3.2 1B table, eager
    train = rec["workloads"]["forward+backward"]
    assert HOST_US_PER_OP == pytest.approx(rec["us_per_op"], abs=0.05) and rec["us_per_op"] == train["us_per_op"]
    # the source names no transformers version: the reentrant checkpointing of older ones dispatches fewer ops
    assert rec["transformers_published"] == "not stated" and rec["if_reentrant"]["ops"] < train["ops"]
    assert rec["if_reentrant"]["us_per_op"] > rec["us_per_op"]
    # a GPU host pays the launch and the caching allocator on top of what a CPU host's op costs
    assert HOST_US_PER_OP > HOST_US_PER_OP_CPU
    # the eager step is the host's: the same step in CUDA graphs is a fraction of it
    for w in rec["workloads"].values():
        assert w["published_cuda_graphs_ms"] < 0.3 * w["published_eager_ms"]
    # no_grad's forward skips autograd's bookkeeping: cheaper per op than the training step
    assert rec["workloads"]["forward"]["us_per_op"] < train["us_per_op"]


@pytest.mark.parametrize("workload", ["forward", "forward+backward"])
def test_the_counts_still_hold_for_the_installed_transformers(workload):
    """A transformers release that changes the dispatch of that step by more than 5% means re-running the script."""
    pytest.importorskip("transformers")
    rec = json.loads(DERIVED.read_text())
    assert _script().count_ops(16, workload) == pytest.approx(rec["workloads"][workload]["ops"], rel=0.05)


def test_the_planner_plans_the_published_step_at_the_published_time():
    """A consistency check, not a validation (the constant came from this step): planned as the planner's flags say
    it, the published step is host-bound, its host time the 48.8 ms the constant came from (the planner's op count
    of that block within 1% of the script's), and its planned GPU work under the compiled step's 8.1 ms."""
    m, s = get_model("llama3-1b"), _published_step()
    rec = json.loads(DERIVED.read_text())["workloads"]["forward+backward"]
    assert eager_ops(m, s) == pytest.approx(rec["ops"], rel=0.01)
    e = estimate(m, s)
    assert e.times["host_exposed"] > 0 and any(n.startswith("host-bound") for n in e.notes)
    assert host_time(m, s) == pytest.approx(rec["published_eager_ms"] * 1e-3, rel=0.02)
    assert e.step_s - e.times["optimizer"] == pytest.approx(rec["published_eager_ms"] * 1e-3, rel=0.02)
    gpu_work = sum(e.times[k] for k in ("gemm", "attention", "memory_bound", "recompute"))
    assert gpu_work < rec["published_cuda_graphs_ms"] * 1e-3 < 0.2 * host_time(m, s)


def test_timing_the_step_needs_a_gpu_host():
    """On a CPU the step's 65M-logit loss is the CPU's own work, not dispatch: --repeats is refused there, one line."""
    for argv in (["--repeats", "3"], ["--repeats", "-1", "--device", "cuda"]):
        with pytest.raises(SystemExit) as e:
            _script().main(argv)
        assert e.value.code == 2
