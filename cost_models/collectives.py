"""Time of NCCL-style collectives on a cluster, α–β model, vectorized over group shapes.

Bus-bandwidth factors (nccl-tests doc/PERFORMANCE.md): all-reduce 2(n-1)/n, all-gather and
reduce-scatter (n-1)/n, all-to-all (n-1)/n, point-to-point 1. A group whose ranks all sit in one
NVLink domain runs at NVLink speed; a larger group runs hierarchically: the k members that share
a domain exchange over NVLink, and the n/k domains exchange S/k each over one NIC per member.

Latency follows NCCL's own tuning model (src/graph/tuning.cc): all-gather and reduce-scatter
exist only as rings, n-1 steps of which n/k-1 cross the fabric, so their latency grows linearly
with the group; all-reduce at scale runs as a tree, logarithmic in the number of domains. NCCL
picks, per call, the protocol its model predicts fastest: for rings, Simple (bulk data) or LL
(8-byte stores with inline flags: a fraction of the bus bandwidth, a fraction of the per-step
latency), so small all-gathers and reduce-scatters pay LL's latency.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from paraplan.arrays import Column
from paraplan.hardware_profiles import ClusterSpec

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
"""A collective :func:`collective_time_s` prices (point-to-point sends are :func:`p2p_time_s`)."""
NcclProtocol = Literal["simple", "ll"]
"""NCCL's ring protocol: Simple for bulk data, LL (8-byte stores with inline flags) for small messages."""

_BUS_FACTOR: dict[Collective, float] = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0,
                                        "all_to_all": 1.0}
_RING_ONLY: tuple[Collective, ...] = ("all_gather", "reduce_scatter")
# Per-step latency of a ring moving bulk data (NCCL's Simple protocol, which it picks for multi-MB
# buffers) and its fixed launch cost, from NCCL's tuning model (NVIDIA/nccl src/graph/tuning.cc,
# hwLat Ring/Simple: 3.4 us per NVLink step, 9.6 us per network step; baseLat Ring/Simple 8.4 us).
# A cluster profile's own (small-message) alpha applies when it is larger.
RING_BULK_NVLINK_STEP_S = 3.4e-6
RING_BULK_NETWORK_STEP_S = 9.6e-6
RING_BULK_BASE_S = 8.4e-6
# The LL protocol's ring (same source, current tables: baseLat Ring/LL 6.6 us, hwLat Ring/LL 0.6 us per
# NVLink step and 2.7 us per network step). Its bus bandwidth is 1/4 of Simple's across nodes and
# 1/3 inside one (tuning.cc: "busBw * (nNodes > 1 ... ? 1.0/4.0 : 1.0/3.0)" for Ring/LL). LL128 is
# not modelled: where NCCL would pick it, the smaller of these two overestimates the time.
RING_LL_NVLINK_STEP_S = 0.6e-6
RING_LL_NETWORK_STEP_S = 2.7e-6
RING_LL_BASE_S = 6.6e-6
RING_LL_BANDWIDTH_FRAC_ACROSS = 1.0 / 4.0
RING_LL_BANDWIDTH_FRAC_INSIDE = 1.0 / 3.0


def members_per_domain(group_size: Column, stride: Column, cluster: ClusterSpec) -> np.ndarray:
    """How many members of a group (ranks ``stride`` apart) share one NVLink domain."""
    group_size = np.asarray(group_size, dtype=float)
    stride = np.asarray(stride, dtype=float)
    fit = np.floor(cluster.domain_gpus / np.maximum(stride, 1.0))
    return np.clip(fit, 1.0, group_size)


def _link_bandwidths(cluster: ClusterSpec) -> tuple[float, float]:
    """(NVLink, NIC) bytes per second one GPU achieves: the datasheet rates times their efficiencies, the NIC's
    also divided by the fabric's oversubscription."""
    eff = cluster.gpu.efficiency
    nvlink = cluster.gpu.nvlink_bytes_per_s * eff.nvlink_frac
    nic = cluster.nic_bytes_per_s_per_gpu * eff.nic_frac / cluster.oversubscription
    return nvlink, nic


def collective_time_s(kind: Collective, size_bytes: Column, group_size: Column, stride: Column,
                      cluster: ClusterSpec) -> np.ndarray:
    """Seconds for one collective of ``size_bytes`` (the full buffer) over ``group_size`` ranks.

    ``stride`` is the rank distance between consecutive members under the rank order
    (1 for tp, tp for cp, tp·cp for dp, tp·cp·dp for pp). Size-1 groups cost nothing.
    """
    factor = _BUS_FACTOR[kind]
    n = np.asarray(group_size, dtype=float)
    size = np.asarray(size_bytes, dtype=float)
    k = members_per_domain(n, stride, cluster)
    domains = n / k
    nvlink, nic = _link_bandwidths(cluster)
    intra = factor * (k - 1) / k * size / nvlink
    inter = factor * (domains - 1) / domains * (size / k) / nic
    seconds = intra + inter + _latency_s(kind, n, k, cluster)
    if kind in _RING_ONLY:  # NCCL's tuner: LL where its latency saving outweighs its bandwidth
        ll_frac = np.where(domains > 1, RING_LL_BANDWIDTH_FRAC_ACROSS, RING_LL_BANDWIDTH_FRAC_INSIDE)
        seconds = np.minimum(seconds, (intra + inter) / ll_frac + _latency_s(kind, n, k, cluster, "ll"))
    if cluster.collective_time_fn is not None:  # measured hardware: the learned model where it applies
        learned, learned_s = cluster.collective_time_fn(kind, size, n, k)
        seconds = np.where(learned, learned_s, seconds)
    return np.where(n > 1, seconds, 0.0)


def collective_latency_s(kind: Collective, group_size: Column, stride: Column, cluster: ClusterSpec,
                         protocol: NcclProtocol = "simple") -> np.ndarray:
    """Size-independent seconds of one collective: the α of the α–β model. ``protocol="ll"``: a ring
    collective small enough that NCCL runs it with the LL protocol (all-gather, reduce-scatter)."""
    n = np.asarray(group_size, dtype=float)
    return _latency_s(kind, n, members_per_domain(n, stride, cluster), cluster, protocol)


def _latency_s(kind: Collective, n: np.ndarray, k: np.ndarray, cluster: ClusterSpec,
               protocol: NcclProtocol = "simple") -> np.ndarray:
    """Seconds of one collective's latency over ``n`` ranks, ``k`` of them per NVLink domain: ring steps
    (all-gather, reduce-scatter) or a tree's logarithmic depth (all-reduce, all-to-all); 0 where n = 1."""
    domains = n / k
    intra_lat, inter_lat = cluster.intra_domain_latency_s, cluster.inter_node_latency_s
    if kind in _RING_ONLY:
        inter_steps = domains - 1
        if protocol == "ll":
            base, intra_step, inter_step = RING_LL_BASE_S, RING_LL_NVLINK_STEP_S, RING_LL_NETWORK_STEP_S
        else:
            base = RING_BULK_BASE_S
            intra_step = max(intra_lat, RING_BULK_NVLINK_STEP_S)
            inter_step = max(inter_lat, RING_BULK_NETWORK_STEP_S)
        latency = base + (n - 1 - inter_steps) * intra_step + inter_steps * inter_step
    else:
        latency = _BUS_FACTOR[kind] * (intra_lat * np.log2(np.maximum(k, 1))
                                       + inter_lat * np.log2(np.maximum(domains, 1)))
    return np.where(n > 1, latency, 0.0)


def p2p_time_s(size_bytes: Column, group_size: Column, stride: Column, cluster: ClusterSpec) -> np.ndarray:
    """Seconds to send ``size_bytes`` to the next member of a group (pipeline or ring neighbour).

    The slowest hop decides: if the group spans more than one NVLink domain, some hop crosses
    the scale-out fabric.
    """
    n = np.asarray(group_size, dtype=float)
    spans_domains = n * np.asarray(stride, dtype=float) > cluster.domain_gpus
    nvlink, nic = _link_bandwidths(cluster)
    bandwidth = np.where(spans_domains, nic, nvlink)
    latency = np.where(spans_domains, cluster.inter_node_latency_s, cluster.intra_domain_latency_s)
    return np.where(n > 1, np.asarray(size_bytes, dtype=float) / bandwidth + latency, 0.0)


def all_to_all_time_s(size_bytes: Column, group_size: Column, stride: Column, cluster: ClusterSpec) -> np.ndarray:
    """Seconds for one all-to-all in which every member sends ``size_bytes`` in total, split evenly.

    Unlike reductions, an all-to-all cannot aggregate across a domain: of each member's bytes,
    (k−1)/n go to peers in its NVLink domain and (n−k)/n leave it over the member's own NIC.
    The two run concurrently (NVLink and NIC are separate engines), so the slower one decides.
    """
    n = np.asarray(group_size, dtype=float)
    size = np.asarray(size_bytes, dtype=float)
    k = members_per_domain(n, stride, cluster)
    nvlink, nic = _link_bandwidths(cluster)
    intra = (k - 1) / n * size / nvlink
    inter = (n - k) / n * size / nic
    return np.where(n > 1, np.maximum(intra, inter) + _latency_s("all_to_all", n, k, cluster), 0.0)


def deduplicated_dispatch_time_s(tokens: Column, token_bytes: float, copies_per_token: float,
                                 remote_domains_per_token: Column, group_size: Column, stride: Column,
                                 cluster: ClusterSpec) -> np.ndarray:
    """Seconds for one DeepEP-style dispatch (or combine) of ``tokens`` routed tokens per member.

    Each token crosses the network once per distinct remote NVLink domain holding one of its experts (to the
    GPU of its own local index there), then fans out over NVLink to the experts' GPUs in that domain; an
    all-to-all would send every one of the ``copies_per_token`` copies separately. Network and NVLink run
    concurrently, the slower decides, as in ``all_to_all_time_s``.
    """
    n = np.asarray(group_size, dtype=float)
    k = members_per_domain(n, stride, cluster)
    nvlink, nic = _link_bandwidths(cluster)
    per_token = np.asarray(tokens, dtype=float) * token_bytes
    inter = per_token * remote_domains_per_token / nic
    intra = per_token * copies_per_token * (k - 1) / k / nvlink
    return np.where(n > 1, np.maximum(intra, inter) + _latency_s("all_to_all", n, k, cluster), 0.0)
