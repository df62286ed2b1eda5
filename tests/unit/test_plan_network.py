"""The network across nodes: each GPU's reference system's NIC unless --inter-gbs says otherwise, and every
output says which rate was planned (catalog.py `nic_gbs`, setup.py `net_gbs`, collectives.py `group_layout`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from plan_cli import run  # noqa: F401 (a fixture)
from overdrive.env import GPU_CATALOG, gpu_by_key
from overdrive.plan import TrainSetup, get_model
from overdrive.plan.collectives import LINK_EFF, group_layout
from overdrive.plan.comm import comm_times

M = get_model("llama3-8b")


def _setup(gpu: str, **kw) -> TrainSetup:
    base = dict(gpu=gpu_by_key(gpu), gpus_per_node=8, nodes=4, seq=4096, micro_batch=1, global_batch=32,
                precision="bf16", sharding="fsdp", checkpointing="full")
    return TrainSetup(**{**base, **kw})


@pytest.mark.parametrize("gpu, gbs", [("a100-80", 25), ("a100-40", 25), ("h100-sxm", 50), ("h200", 50),
                                      ("b200", 50), ("gb200", 50), ("b300", 100), ("gb300", 100)])
def test_each_gpu_plans_its_reference_systems_nic(gpu, gbs):
    """DGX A100: HDR 200 Gb/s per GPU; DGX H100/H200/B200 and GB200 NVL72: ConnectX-7 400 Gb/s; DGX B300 and GB300
    NVL72: ConnectX-8 800 Gb/s."""
    g = gpu_by_key(gpu)
    assert g.nic_gbs == gbs and g.to_dict()["nic_gbs"] == gbs
    s = _setup(gpu)
    assert s.inter_gbs is None and s.net_gbs == gbs
    assert dataclasses.replace(s, inter_gbs=12.5).net_gbs == 12.5


def test_every_catalog_gpu_says_where_its_network_rate_comes_from():
    for g in GPU_CATALOG:
        assert g.nic_gbs > 0 and g.nic_source, g.key
        no_system = g.key in ("l40s", "l4", "rtx4090", "h100-pcie", "h100-nvl", "h200-nvl")
        assert no_system == g.nic_source.startswith("assumed 400 Gb/s"), (g.key, g.nic_source)


@pytest.mark.parametrize("gpu", ["a100-80", "b300"])
def test_the_default_network_is_what_the_collectives_move_over(gpu):
    """Eight ranks a node share eight NICs: the data-parallel group's rate is 8 × the NIC (under NVLink on both),
    so the default plans exactly what --inter-gbs at the NIC's rate plans, and half the rate doubles the bytes' time."""
    s = _setup(gpu)
    g = s.gpu
    nodes, bw = group_layout(s, s.dp, 1)
    assert nodes == 4 and bw == pytest.approx(LINK_EFF * 8 * g.nic_gbs * 1e9)
    assert 8 * g.nic_gbs < g.nvlink_gbs   # NIC-bound, so the rate shows in the time
    same = comm_times(M, dataclasses.replace(s, inter_gbs=g.nic_gbs), 0.0)
    default = comm_times(M, s, 0.0)
    half = comm_times(M, dataclasses.replace(s, inter_gbs=g.nic_gbs / 2), 0.0)
    assert default["dp"] == pytest.approx(same["dp"])
    assert half["dp"] - half["dp_latency"] == pytest.approx(2 * (default["dp"] - default["dp_latency"]))


def test_explain_and_json_say_which_network_was_planned(run):
    args = ("--model", "llama3-8b", "--gpu", "a100-80", "--nodes", "2", "--seq", "4096", "--precision", "bf16",
            "--sharding", "fsdp", "--checkpointing", "full", "--micro-batch", "1")
    out = run(*args, "--explain")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())   # rich wraps long lines
    assert "network across nodes: 25 GB/s per GPU one way, at 80% of the wire (a100-80's reference system: DGX A100" in text
    text = " ".join(run(*args, "--explain", "--inter-gbs", "12.5").stdout.split())
    assert "network across nodes: 12.5 GB/s per GPU one way, at 80% of the wire (--inter-gbs)" in text
    d = json.loads(run(*args, "--json").stdout)
    assert (d["inter_gbs"], d["intra_gbs"]) == (25, 300) and "ConnectX-6" in d["inter_gbs_source"]
    d = json.loads(run(*args, "--json", "--inter-gbs", "12.5").stdout)
    assert (d["inter_gbs"], d["inter_gbs_source"]) == (12.5, "--inter-gbs")
    one = run("--model", "llama3-8b", "--gpu", "a100-80", "--gpus", "8", "--seq", "4096", "--precision", "bf16",
              "--sharding", "fsdp", "--checkpointing", "full", "--micro-batch", "1", "--explain")
    assert "network across nodes" not in one.stdout


@pytest.mark.parametrize("gpu", ["l40s", "l4", "rtx4090"])
def test_a_pcie_cards_assumed_nic_is_no_faster_than_its_pcie_link(gpu):
    g = gpu_by_key(gpu)
    assert g.nic_gbs == g.nvlink_gbs < 50 and "at most the card's PCIe link" in g.nic_source


@pytest.mark.parametrize("gpu, inter", [("l40s", None), ("h100-sxm", 1000.0)])
def test_pipeline_sends_across_nodes_are_never_faster_than_inside_one(gpu, inter):
    """The NIC hangs off the GPU's own link: a stage boundary that crosses nodes moves no faster than NVLink/PCIe."""
    kw = dict(tp=1, pp=2, sharding="none", global_batch=64, inter_gbs=inter)
    across = comm_times(M, _setup(gpu, gpus_per_node=8, nodes=2, **kw), 0.0)["pp"]
    inside = comm_times(M, _setup(gpu, gpus_per_node=16, nodes=1, **kw), 0.0)["pp"]
    assert across >= inside > 0


def test_a_link_rate_that_nothing_crosses_is_said_to_change_nothing(run):
    """--inter-gbs on one node and --intra-gbs on one GPU are accepted (a sweep may pass them) but never silently:
    each candidate says the flag changed nothing; the rate prints to three significant digits (whole GB/s from 100)."""
    args = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--seq", "4096", "--precision", "bf16", "--micro-batch", "1")
    d = json.loads(run(*args, "--gpus", "8", "--inter-gbs", "12.345678", "--json").stdout)
    assert all("--inter-gbs 12.3 changes nothing here: one node, nothing crosses the network" in c["notes"]
               for c in d["candidates"])
    d = json.loads(run(*args, "--gpus", "1", "--intra-gbs", "100", "--json").stdout)
    assert all("--intra-gbs 100 changes nothing here: one GPU, nothing to communicate" in c["notes"]
               for c in d["candidates"])
    for flags in (("--gpus", "8", "--nodes", "2", "--inter-gbs", "12.345678"), ("--gpus", "8", "--intra-gbs", "100")):
        d = json.loads(run(*args, *flags, "--json").stdout)
        assert not any("changes nothing here: one" in n for c in d["candidates"] for n in c["notes"])
    text = " ".join(run(*args, "--gpus", "8", "--nodes", "2", "--inter-gbs", "12.345678", "--explain").stdout.split())
    assert "network across nodes: 12.3 GB/s per GPU one way" in text


@pytest.mark.parametrize("v, text", [(0.149, "0.149"), (0.15, "0.15"), (12.345678, "12.3"), (25.0, "25"), (400.0, "400"),
                                     (99999.99, "100,000")])
def test_link_rates_print_apart_when_they_plan_apart(v, text):
    from overdrive.plan.setup import gbs_text

    assert gbs_text(v) == text
