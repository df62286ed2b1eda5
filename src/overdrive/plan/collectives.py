"""The time of one NCCL collective: bandwidth term + latency term, ring or tree, the cheaper one as NCCL picks.

Bandwidth (NVIDIA/nccl-tests doc/PERFORMANCE.md, "bus bandwidth"): a ring all-reduce of B bytes over n ranks
moves 2(n−1)/n·B per rank, an all-gather or reduce-scatter (n−1)/n·B, so

    t_bw = factor(n) · B / busBW,   factor = 2(n−1)/n (all-reduce), (n−1)/n (all-gather, reduce-scatter)

busBW per GPU: NVLink inside a node; across nodes NCCL runs one ring per rail, so the k members of the group on
a node share k NICs: min(NVLink, k × NIC) (`per_gpu_bw`), at LINK_EFF of the wire.

Latency (NCCL's own cost model, src/graph/tuning.cc `ncclTopoTuneModel`, NVIDIA/nccl @ 01afd20a, Simple
protocol, µs): a ring pays a base 8.4 plus one hop per step, (n−N) steps inside a node at 3.4 and N−1 across
(per all-gather/reduce-scatter; twice that per all-reduce) at 9.6, and ×1.9 for a large multi-node ring
all-reduce (its "plateau effect"); a tree all-reduce pays 2·((n/N−1)·28 + log2(N)·50) and moves its bytes
at half of min(0.9·busBW, 80 GB/s) (`maxTreeBw` beyond two nodes). n ranks on N nodes. At 512 ranks a ring
all-reduce costs ~8 ms of latency per call, a tree ~1 ms: with 25 MB buckets the latency, not the bandwidth,
is most of a data-parallel step (NCCL picks the cheaper per call, as `allreduce_s` does).

SMs (`nccl_channels`): every NCCL channel is one CTA on one SM for as long as the call runs, so compute that
overlaps a collective runs on SMs − channels. The ring channel count is NCCL's graph search
(src/graph/search.cc, connect.cc @ 5067397c): inside a node the GPU's NVSwitch bandwidth (links × 20 GB/s on
SM80, × 20.6 on SM90, × 40.1 on SM100: topo.h) over the search's top speed per channel (40, 60, 90 GB/s)
gives 6 (A100: 240/40; H100: 370.8/60) or 8 (B200: 721.8/90) channels, `ncclTopoDupChannels` doubles them
(bwIntra >= 25) and `ncclTopoPostset` doubles again: 24, 24, 32. Across nodes one ring per rail NIC at 48
GB/s (8 channels), not duplicated (bwIntra < 50 with more than 4 channels), doubled once: 16.
"""

from __future__ import annotations

import math

from overdrive.plan.setup import TrainSetup

__all__ = ["LINK_EFF", "RING_BASE_US", "RING_HOP_US", "TREE_HOP_US", "TREE_MAX_GBS", "RING_PLATEAU",
           "ring_latency_s", "tree_latency_s", "allreduce_s", "gather_s", "p2p_s", "broadcast_s", "BCAST_HOP_US", "choose_allreduce",
           "NCCL_CHANNELS", "PCIE_CHANNELS", "nccl_channels", "CONNECTION_BYTES", "communicator_bytes",
           "PCIE_GBS", "group_layout"]

LINK_EFF = 0.8
"""Share of the wire a large collective reaches (nccl-tests busbw on DGX systems: ~80% of NVLink/NIC rate)."""
RING_BASE_US = 8.4
RING_HOP_US = {"nvlink": 3.4, "net": 9.6}
TREE_HOP_US = {"nvlink": 28.0, "net": 50.0}
TREE_MAX_GBS = 80.0
RING_PLATEAU = 1.9
NCCL_CHANNELS = {8: (24, 16), 9: (24, 16), 10: (32, 16)}
"""Ring channels (CTAs) per NCCL communicator by SM major version: (inside a node, across nodes); see above."""


PCIE_GBS = 64
"""A GPU whose catalog link rate is at most this is PCIe-only (PCIe 5.0 x16: 64 GB/s both ways)."""
PCIE_CHANNELS = 4
"""Rings over PCIe (no NVLink): the search finds 2 channels at PCIe speed, under the 25 GB/s the duplication needs,
and the postset doubles them once."""


def nccl_channels(sm_major: int, nodes: int, *, nvlink: bool = True) -> int:
    """CTAs a ring collective holds on each GPU: NCCL's channel count for the GPU generation, inside one node
    or across nodes (older generations than Ampere as Ampere; newer than Blackwell as Blackwell); PCIe-only
    GPUs `PCIE_CHANNELS`."""
    if not nvlink:
        return PCIE_CHANNELS
    intra, inter = NCCL_CHANNELS[min(10, max(8, sm_major))]
    return inter if nodes > 1 else intra


def ring_latency_s(n: int, nodes: int, *, allreduce: bool) -> float:
    """NCCL's ring latency for one call over n ranks on `nodes` nodes (tuning.cc, Simple protocol)."""
    if n <= 1:
        return 0.0
    steps, inter = (2 * (n - 1), 2 * (nodes - 1)) if allreduce else (n - 1, nodes - 1)
    lat = RING_BASE_US + (steps - inter) * RING_HOP_US["nvlink"] + inter * RING_HOP_US["net"]
    if allreduce and nodes > 1:
        lat *= RING_PLATEAU
    return lat * 1e-6


def tree_latency_s(n: int, nodes: int) -> float:
    """NCCL's tree all-reduce latency: up and down the chain inside a node and the tree across nodes."""
    if n <= 1:
        return 0.0
    per_node = max(1, n // max(1, nodes))
    return 2 * ((per_node - 1) * TREE_HOP_US["nvlink"] + math.log2(max(1, nodes)) * TREE_HOP_US["net"]) * 1e-6


def choose_allreduce(nbytes: float, n: int, nodes: int, bus_bps: float) -> tuple[str, float, float]:
    """(algorithm, seconds, of which latency) of one all-reduce of `nbytes`: ring or tree, whichever NCCL's
    model finds cheaper (trees only across nodes: inside a node NCCL's tree is a chain, never the pick at size)."""
    if n <= 1 or nbytes <= 0:
        return "none", 0.0, 0.0
    r_lat = ring_latency_s(n, nodes, allreduce=True)
    ring = r_lat + 2 * (n - 1) / n * nbytes / bus_bps
    if nodes <= 1:
        return "ring", ring, r_lat
    t_lat = tree_latency_s(n, nodes)
    tree = t_lat + nbytes / (0.5 * min(0.9 * bus_bps, TREE_MAX_GBS * 1e9 * LINK_EFF))
    return ("tree", tree, t_lat) if tree < ring else ("ring", ring, r_lat)


def allreduce_s(nbytes: float, n: int, nodes: int, bus_bps: float) -> float:
    return choose_allreduce(nbytes, n, nodes, bus_bps)[1]


def gather_s(nbytes: float, n: int, nodes: int, bus_bps: float) -> float:
    """One all-gather or reduce-scatter whose full (unsharded) size is `nbytes`: ring only in NCCL."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return ring_latency_s(n, nodes, allreduce=False) + (n - 1) / n * nbytes / bus_bps


BCAST_HOP_US = {"nvlink": 4.0, "net": 14.0}
"""NCCL's per-rank latency of a ring broadcast (tuning.cc, Simple protocol): the tree's hardware latency."""


def broadcast_s(nbytes: float, n: int, nodes: int, bus_bps: float) -> tuple[float, float]:
    """(seconds, of which latency) of one broadcast of `nbytes` from one rank to n. NCCL runs a broadcast as a
    ring of nRanks steps, so its bus bandwidth is its algorithm bandwidth (tuning.cc: ratio nRanks/nsteps = 1)
    and the bytes cost B/busBW; its latency is the base 8.4 µs plus, for rings whose channels are not the same,
    "some chunk latency": nRanks × the tree's hop latency (4.0 µs over NVLink, 14 µs across nodes). A broadcast
    over a thousand ranks is latency-bound well past 10 MB."""
    if n <= 1 or nbytes <= 0:
        return 0.0, 0.0
    lat = (RING_BASE_US + n * BCAST_HOP_US["net" if nodes > 1 else "nvlink"]) * 1e-6
    return lat + nbytes / bus_bps, lat


def p2p_s(nbytes: float, bus_bps: float, *, across_nodes: bool) -> float:
    """One send/receive between pipeline stages: a ring's base latency and one hop, then the bytes."""
    if nbytes <= 0:
        return 0.0
    hop = RING_HOP_US["net" if across_nodes else "nvlink"]
    return (RING_BASE_US + hop) * 1e-6 + nbytes / bus_bps


CONNECTION_BYTES = 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8 + (1 << 22)
"""GPU bytes of one NCCL connection on one channel: a buffer per protocol (src/init.cc, computeBuffSizes):
LL NCCL_LL_LINES_PER_THREAD·NCCL_LL_MAX_NTHREADS·NCCL_STEPS·16 = 512 KiB, LL128
NCCL_LL128_ELEMS_PER_THREAD·NCCL_LL128_MAX_NTHREADS·NCCL_STEPS·8 = 4.69 MiB, Simple DEFAULT_BUFFSIZE 4 MiB: 9.19 MiB."""


def communicator_bytes(n: int, nodes: int, sm_major: int, *, nvlink: bool = True) -> float:
    """GPU memory one NCCL communicator of n ranks on `nodes` nodes holds for its connections, CONNECTION_BYTES
    each per channel: the ring's one receive connection and, across nodes, the tree's (its parent and its child
    in the chain; a two-rank tree has one). Inside a node NCCL's tuning gives the tree no bandwidth, and since
    2.22 (NCCL_RUNTIME_CONNECT) it connects an algorithm on first use, so a node's groups hold the ring's alone;
    earlier versions connect ring and tree at creation, half as much again or more (4 A100s over NVLink, NVIDIA/nccl
    issue #964: 544 MB per two-rank group, 688 MB per larger one; ring + tree here: 462 and 694)."""
    if n <= 1:
        return 0.0
    connections = 1 + ((1 if n == 2 else 2) if nodes > 1 else 0)
    return nccl_channels(sm_major, nodes, nvlink=nvlink) * connections * CONNECTION_BYTES


def group_layout(s: TrainSetup, size: int, inner: int) -> tuple[int, float]:
    """(nodes the group spans, bytes/s per GPU) for a group of `size` ranks whose neighbours are `inner` ranks
    apart. Across nodes NCCL runs one ring per rail (GPU i of every node through NIC i), so k members per node
    move their traffic over k NICs at once: min(NVLink, k × NIC)."""
    intra = s.link_gbs * 1e9
    if size * inner <= s.gpus_per_node:
        return 1, LINK_EFF * intra
    per_node = max(1, s.gpus_per_node // inner)
    nodes = math.ceil(size / per_node)
    return nodes, LINK_EFF * min(intra, per_node * s.net_gbs * 1e9)
