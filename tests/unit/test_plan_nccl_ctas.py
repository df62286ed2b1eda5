"""The SMs NCCL's channels take from the compute they overlap (collectives.nccl_channels, estimate.nccl_sms):
the channel counts re-derived from NCCL's graph search, and the term checked against its formula."""

import dataclasses
import math

import pytest

from overdrive.env import gpu_by_key
from overdrive.plan import TrainSetup, estimate, explain, get_model
from overdrive.plan.collectives import NCCL_CHANNELS, nccl_channels
from overdrive.plan.estimate import nccl_sms
from overdrive.plan.throughput import SMS

H100 = gpu_by_key("h100-sxm")


def _nccl_search(links: int, link_gbs: float, top_speed: float, *, nodes: int) -> int:
    """NCCL's ring search, the steps that set the count on an NVSwitch node with one 400 Gb/s NIC per GPU
    (src/graph/search.cc ncclTopoCompute + ncclTopoDupChannels, src/graph/connect.cc ncclTopoPostset)."""
    if nodes > 1:
        found, bw = 8, 48.0            # one ring per rail NIC at the top inter-node speed
        dup = not (bw < 50.0 and found > 4)
    else:
        found, bw = math.floor(links * link_gbs / top_speed), top_speed
        dup = bw >= 25.0
    return (2 * found if dup else found) * 2     # DupChannels, then Postset's doubling


@pytest.mark.parametrize("sm,links,link_gbs,top", [(8, 12, 20.0, 40.0), (9, 18, 20.6, 60.0), (10, 18, 40.1, 90.0)])
def test_channel_counts_follow_nccls_search(sm, links, link_gbs, top):
    assert nccl_channels(sm, 1) == _nccl_search(links, link_gbs, top, nodes=1) == NCCL_CHANNELS[sm][0]
    assert nccl_channels(sm, 4) == _nccl_search(links, link_gbs, top, nodes=4) == NCCL_CHANNELS[sm][1]
    # generations outside the table take the nearest one
    assert nccl_channels(7, 1) == nccl_channels(8, 1) and nccl_channels(12, 2) == nccl_channels(10, 2)


def _setup(**kw) -> TrainSetup:
    base = dict(gpu=H100, gpus_per_node=8, nodes=1, seq=4096, micro_batch=2, global_batch=64, precision="bf16",
                sharding="fsdp", checkpointing="none", compile=True)
    return TrainSetup(**{**base, **kw})


def test_hidden_communication_costs_its_share_of_the_sms():
    m = get_model("llama3-8b")
    e = estimate(m, _setup())
    hidden = e.times["dp_comm"] - e.times["dp_exposed"]
    assert hidden > 0
    share = 24 / SMS["h100-sxm"]
    slack = max(0.0, e.times["dp_exposed"] - e.comm["dp_edge"])
    assert e.times["nccl_sms"] == pytest.approx(max(0.0, hidden * share - slack))
    assert e.times["nccl_sms"] > 0
    # it is in the step: the step minus it is what the planner gave before the term
    assert e.step_s == pytest.approx(e.compute_s + e.times["dp_exposed"] + e.times["nccl_sms"]
                                     + e.times["embed_allreduce"])
    assert any(x.lstrip().startswith("nccl_sms") for x in explain(e))


def test_no_data_parallel_communication_no_sm_cost():
    m = get_model("llama3-8b")
    e = estimate(m, _setup(nodes=1, gpus_per_node=1, global_batch=8))
    assert e.times["dp_comm"] == 0 and e.times["nccl_sms"] == 0


def test_communication_bound_steps_absorb_the_slowdown_in_their_slack():
    c = {"dp": 1.0, "dp_edge": 0.01, "dp_nodes": 2}
    s = _setup(nodes=2)
    share = nccl_channels(9, 2) / SMS["h100-sxm"]
    # compute-bound: only the first and last call show, all of the hidden time costs its share
    assert nccl_sms(s, c, 0.01) == pytest.approx(0.99 * share)
    # communication-bound: the compute waits for the calls anyway; a slowdown within the wait costs nothing
    assert nccl_sms(s, c, 0.5) == pytest.approx(max(0.0, 0.5 * share - 0.49)) == 0.0
    # all exposed (DeepSpeed's flush): nothing overlapped, nothing taken
    assert nccl_sms(s, c, 1.0) == 0.0
    # over compute windows from far shorter than the communication to far longer (exposed = what the window
    # does not cover, at least the edge), the step never shortens as the compute grows, and the compute-bound
    # end pays the full share
    steps = []
    for compute in (0.05, 0.2, 0.5, 0.9, 0.99, 1.0, 1.2, 2.0, 5.0):
        exposed = max(c["dp_edge"], c["dp"] - compute)
        steps.append(compute + exposed + nccl_sms(s, c, exposed))
    assert steps == sorted(steps)
    assert steps[-1] == pytest.approx(5.0 + 0.01 + 0.99 * share)


def test_across_nodes_fewer_channels_take_fewer_sms():
    s = _setup(nodes=2)
    c = {"dp": 1.0, "dp_edge": 0.0, "dp_exposed": 0.0}
    inside = nccl_sms(dataclasses.replace(s, nodes=1), {**c, "dp_nodes": 1}, 0.0)
    across = nccl_sms(s, {**c, "dp_nodes": 2}, 0.0)
    assert across / inside == pytest.approx(16 / 24)
