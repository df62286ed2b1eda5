"""The plan's two assumed figures, the network across nodes and the host's µs per eager op: what value would close
a published run's gap (`implied_network`, `implied_host_us`), the doc's section built on them, `--host-us` for a
host's own figure, and `--explain`'s sensitivity lines where a figure is assumed."""

from __future__ import annotations

import os
import re

import pytest

from plan_cli import run  # noqa: F401 (a fixture)
from overdrive.plan.host import HOST_US_PER_OP
from overdrive.plan.validation import NETWORK_RANGE, _setup, implied_host_us, implied_network, load_runs, predict

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "plan-validation.md")


def _multi_node_run(comm_bound: bool) -> dict:
    """A published multi-node run whose plan moves with the network (or, `comm_bound` False, any multi-node run)."""
    for r in load_runs():
        if r.get("memory_only") or _setup(r).nodes <= 1:
            continue
        if not comm_bound:
            return r
        slow = predict({**r, "inter_gbs": 2.0})["predicted"]
        if slow < 0.8 * predict({**r, "inter_gbs": 50.0})["predicted"]:
            return r
    raise AssertionError("no published multi-node run moves with the network")


@pytest.mark.parametrize("planted", [1.3, 4.0, 17.0])
def test_implied_network_recovers_a_planted_bandwidth(planted):
    """A run published at what the plan says at `planted` GB/s per GPU: the search finds `planted` back (1%)."""
    r = _multi_node_run(comm_bound=True)
    twin = {**r, "tps": predict({**r, "inter_gbs": planted})["predicted"]}
    twin.pop("inter_gbs", None)
    assert implied_network(twin) == pytest.approx(planted, rel=0.02)


def test_no_bandwidth_means_none_and_one_node_means_none():
    r = _multi_node_run(comm_bound=False)
    fastest = predict({**r, "inter_gbs": NETWORK_RANGE[1]})["predicted"]
    assert implied_network({**r, "tps": fastest * 1.5}) is None       # slower than published at any bandwidth
    slowest = predict({**r, "inter_gbs": NETWORK_RANGE[0]})["predicted"]
    assert implied_network({**r, "tps": slowest / 1.5}) is None       # faster than published at any bandwidth
    one = next(r for r in load_runs() if _setup(r).nodes == 1 and not r.get("memory_only"))
    assert implied_network(one) is None


def test_the_doc_renders_the_tail_against_the_network():
    from plan_doc_network import network_rows, network_section

    doc = open(DOC).read()
    assert network_section() in doc, "docs/plan-validation.md is stale: run scripts/plan_validation_doc.py"
    rows = network_rows()
    assert rows and all(abs(x["error"]) > 0.25 for x in rows)
    for x in rows:   # each bandwidth printed is one at which the plan meets the run
        if x["implied"] is not None:
            r = next(r for r in load_runs() if r["id"] == x["id"])
            assert abs(predict({**r, "inter_gbs": x["implied"]})["error"]) < 0.02, x["id"]


def _tps(text: str, gbs: str) -> float:
    m = re.search(rf"at {re.escape(gbs)} GB/s ([\d,]+) tokens/s per GPU", text)
    assert m, text[-1500:]
    return float(m.group(1).replace(",", ""))


def test_explain_replans_an_assumed_network_at_a_half_and_a_quarter(run):
    args = ("--model", "llama3-8b", "--gpu", "a100-80", "--nodes", "8", "--seq", "2048", "--precision", "bf16",
            "--sharding", "fsdp", "--checkpointing", "full", "--micro-batch", "1", "--global-batch", "64")
    out = run(*args, "--explain")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "the network is assumed, not given:" in text
    step = float(re.search(r"-> ([\d,]+) tokens/s per GPU", text).group(1).replace(",", ""))
    half, quarter = _tps(text, "12.5"), _tps(text, "6.25")
    assert quarter <= half <= step and quarter < step   # this plan waits on the network: less of it, slower
    for tps, pct in re.findall(r"at [\d.]+ GB/s ([\d,]+) tokens/s per GPU \(([-+]\d+)%\)", text):
        assert int(pct) == round(100 * (float(tps.replace(",", "")) / step - 1))
    given = run(*args, "--explain", "--inter-gbs", "25")
    assert given.returncode == 0 and "network across nodes" in given.stdout
    assert "the network is assumed" not in " ".join(given.stdout.split())   # the user's own is not second-guessed
    assert args[4:6] == ("--nodes", "8")
    one = run(*args[:5], "1", *args[6:], "--explain")
    assert one.returncode == 0, one.stderr
    text = " ".join(one.stdout.split())
    assert "tokens/s per GPU" in text and "the network is assumed" not in text   # nothing crosses a network


def _host_bound_run() -> dict:
    """A published one-node run whose plan the host bounds from 4 µs per op up (below, the GPU may: flat)."""
    for r in load_runs():
        if r.get("memory_only") or _setup(r).nodes > 1:
            continue
        if predict({**r, "host_us": 4.0})["predicted"] < 0.6 * predict({**r, "host_us": 2.0})["predicted"]:
            return r
    raise AssertionError("no published run moves with the host's µs per op")


@pytest.mark.parametrize("planted", [5.0, 12.0, 30.0])
def test_implied_host_us_recovers_a_planted_speed(planted):
    r = _host_bound_run()
    twin = {**r, "tps": predict({**r, "host_us": planted})["predicted"]}
    assert implied_host_us(twin) == pytest.approx(planted, rel=0.02)
    assert implied_host_us({**r, "tps": predict({**r, "host_us": 0.1})["predicted"] * 1.5}) is None   # too fast


BOUND = ("--model", "llama3-1b", "--gpu", "a100-80", "--gpus", "1", "--seq", "512", "--global-batch", "8",
         "--micro-batch", "1", "--precision", "bf16", "--sharding", "zero3", "--checkpointing", "full", "--no-compile")


@pytest.mark.parametrize("bad", ["0", "-3", "nan", "inf", "5000"])
def test_host_us_out_of_range_is_one_line_and_exit_2(run, bad):
    out = run(*BOUND, "--host-us", bad)
    assert out.returncode == 2 and "--host-us" in out.stderr and "µs" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not out.stdout


def test_host_us_plans_the_users_host_and_says_so(run):
    import json

    base = json.loads(run(*BOUND, "--json").stdout)
    assert (base["host_us"], base["host_us_source"]) == (HOST_US_PER_OP, "a B200 host's eager step")
    slow = json.loads(run(*BOUND, "--json", "--host-us", str(3 * HOST_US_PER_OP)).stdout)
    assert (slow["host_us"], slow["host_us_source"]) == (3 * HOST_US_PER_OP, "--host-us")
    assert slow["top"]["host_us"] == 3 * HOST_US_PER_OP
    assert slow["top"]["tokens_per_s_per_gpu"] < 0.6 * base["top"]["tokens_per_s_per_gpu"]   # host-bound: ~1/3
    text = " ".join(run(*BOUND, "--explain").stdout.split())
    assert re.search(rf"host's dispatch: [\d.]+ ms per micro-batch at {HOST_US_PER_OP:g} µs per op \(a B200 host's "
                     r"eager step\); it bounds the step", text)
    step = float(re.search(r"-> ([\d,]+) tokens/s per GPU", text).group(1).replace(",", ""))
    m = re.search(r"at ([\d.]+) µs ([\d,]+) tokens/s per GPU \(([-+]\d+)%\), at ([\d.]+) µs ([\d,]+) tokens/s", text)
    assert m and float(m.group(1)) == 2 * HOST_US_PER_OP and float(m.group(4)) == HOST_US_PER_OP / 2
    assert float(m.group(2).replace(",", "")) < step < float(m.group(5).replace(",", ""))
    given = " ".join(run(*BOUND, "--explain", "--host-us", "20").stdout.split())
    assert "at 20 µs per op (--host-us); it bounds the step" in given and "--host-us plans your host's" not in given


def test_host_us_on_a_plan_without_a_host_floor_changes_nothing_and_says_why(run):
    compiled = [a for a in BOUND if a != "--no-compile"]
    compiled[compiled.index("zero3")] = "fsdp"
    a, b = (run(*compiled, "--json", *extra) for extra in ((), ("--host-us", "50")))
    import json

    da, db = json.loads(a.stdout), json.loads(b.stdout)
    assert da["top"]["tokens_per_s_per_gpu"] == db["top"]["tokens_per_s_per_gpu"]
    assert any("--host-us 50 changes nothing here: no host floor is planned for compiled code" in n
               for n in db["top"]["notes"])
    assert "host's dispatch:" not in " ".join(run(*compiled, "--explain").stdout.split())   # no floor at all


@pytest.mark.parametrize("us", ["0.15", "999", "1000"])
def test_explain_at_either_end_of_the_host_range_replans_within_it(run, us):
    """The sensitivity replans at twice and half the figure, clamped to what --host-us accepts: never a crash."""
    tiny = ("--layers", "64", "--hidden", "64", "--heads", "1", "--vocab", "256", "--gpu", "a100-80", "--gpus", "1",
            "--seq", "16", "--global-batch", "1", "--micro-batch", "1", "--precision", "bf16", "--sharding", "zero3",
            "--checkpointing", "full", "--no-compile")
    out = run(*(tiny if us == "0.15" else BOUND), "--explain", "--host-us", us)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "host's dispatch: " in text and f"at {float(us):g} µs per op (--host-us); it bounds the step" in text
    shown = [float(v) for v in re.findall(r"at ([\d.]+) µs [\d,]+ tokens/s", text)]
    assert shown and all(0.1 <= v <= 1000 and v != float(us) for v in shown)


def test_the_sensitivity_percentages_are_the_replanned_over_the_planned(run):
    text = " ".join(run(*BOUND, "--explain").stdout.split())
    step = float(re.search(r"-> ([\d,]+) tokens/s per GPU", text).group(1).replace(",", ""))
    for tps, pct in re.findall(r"at [\d.]+ µs ([\d,]+) tokens/s per GPU \(([-+]\d+)%\)", text):
        assert int(pct) == round(100 * (float(tps.replace(",", "")) / step - 1))


def test_every_output_says_which_host_figure_was_planned(run):
    import json

    table = " ".join(run(*BOUND, "--host-us", "20").stdout.split())
    assert "20 µs per op, --host-us" in table                       # the host-bound note in the table
    top = json.loads(run(*BOUND, "--json").stdout)["top"]
    assert top["host_us"] == HOST_US_PER_OP                         # what was planned, not null when not given


def test_host_us_under_a_floor_that_does_not_bind_changes_nothing_and_says_so(run):
    import json

    busy = ("--model", "llama3-8b", "--gpu", "a100-80", "--gpus", "8", "--seq", "4096", "--global-batch", "64",
            "--micro-batch", "2", "--precision", "bf16", "--sharding", "zero3", "--checkpointing", "full",
            "--no-compile")
    a, b = (json.loads(run(*busy, "--json", *x).stdout)["top"] for x in ((), ("--host-us", "20")))
    assert a["tokens_per_s_per_gpu"] == b["tokens_per_s_per_gpu"] and a["times_s"]["host_exposed"] == 0
    assert any(n.startswith("--host-us 20 changes nothing here: the host's") and "ms of GPU work" in n
               for n in b["notes"])
    text = " ".join(run(*busy, "--explain").stdout.split())
    assert "host's dispatch: " in text and "under the GPU's work, not exposed" in text


def test_the_zero_sliced_after_step_loops_run_at_the_planned_host_figure():
    from overdrive.env import gpu_by_key
    from overdrive.plan import TrainSetup, estimate, get_model

    base = dict(gpu=gpu_by_key("h100-sxm"), gpus_per_node=8, nodes=64, seq=4096, micro_batch=2, global_batch=256,
                precision="bf16", sharding="zero1", tp=2, pp=2, checkpointing="none", zero_sliced=True, compile=False)
    m = get_model("llama3-1b")
    slow, fast = (estimate(m, TrainSetup(**base, host_us=us)) for us in (50.0, 2.0))
    assert slow.times["zero_sliced_exposed"] > fast.times["zero_sliced_exposed"]
    assert any("50 µs per op" in n for n in slow.notes if n.startswith("nanotron's sliced ZeRO-1"))


def test_the_doc_host_values_meet_the_published_runs():
    from plan_doc_network import HOST, tail_rows

    rows = tail_rows(HOST)
    assert rows
    for x in rows:
        if x["implied"] is not None:
            r = next(r for r in load_runs() if r["id"] == x["id"])
            assert abs(predict({**r, "host_us": x["implied"]})["error"]) < 0.02, x["id"]


def test_the_table_and_report_say_what_was_assumed_where_it_moves_the_pick(run, tmp_path):
    multi = ("--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "8", "--nodes", "8", "--seq", "8192",
             "--global-batch", "512", "--precision", "bf16", "--sharding", "fsdp", "--checkpointing", "full")
    text = " ".join(run(*multi).stdout.split())
    assert "Assumed, not given: the network across nodes, 50 GB/s per GPU (DGX H100" in text
    assert "Assumed" not in " ".join(run(*multi, "--inter-gbs", "25").stdout.split())
    text = " ".join(run(*BOUND).stdout.split())
    assert f"Assumed, not given: the host's {HOST_US_PER_OP:g} µs per eager op, which bounds the pick" in text
    assert "Assumed" not in run(*BOUND, "--host-us", "9").stdout
    compiled = [a for a in BOUND if a != "--no-compile"]
    compiled[compiled.index("zero3")] = "fsdp"
    assert "Assumed" not in run(*compiled).stdout        # one node, no host floor: nothing assumed moves it
    out = run(*BOUND, "--out", str(tmp_path / "p"))
    assert out.returncode == 0, out.stderr
    assert "Assumed, not given: the host&#x27;s" in (tmp_path / "p" / "report.html").read_text()
