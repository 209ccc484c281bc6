"""The rank-placement instance of a plan on a topology: ring edges per axis and their costs."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from paraplan.errors import InputError
from paraplan.files import shown
from paraplan.hardware_profiles.topology import Topology
from paraplan.planner.layout import axis_groups, expert_map, rank_map
from paraplan.planner.placement.plan_costs import AxisTimes, axis_times, job_of_plan
from paraplan.planner.placement.rank_placement import TIME_QUANTUM_S, RankInstance

CYCLIC_AXES = ("tp", "cp", "dp")
"""Axes whose collectives run as rings (NCCL's inter-node ring visits nodes in rank order)."""


def _unordered(a: int, b: int) -> tuple[int, int]:
    """The pair (a, b) with the smaller node first."""
    return (a, b) if a <= b else (b, a)


def slot_edges(*, tp: int, cp: int, dp: int, pp: int, vpp: int, gpus_per_node: int, ep: int = 1,
               etp: int = 1) -> dict[str, tuple[tuple[int, int], ...]]:
    """Per axis, the unordered logical-node pairs that its groups' rings (pp: chains, rings with vpp > 1;
    ep: all pairs, an all-to-all) use."""
    rows = rank_map(tp=tp, cp=cp, dp=dp, pp=pp, gpus_per_node=gpus_per_node)
    edges: dict[str, tuple[tuple[int, int], ...]] = {}
    if ep > 1:  # the expert grid (tp=etp, ep, expert dp, pp) over the same ranks, as Megatron builds it
        groups = expert_map(num_experts=ep, moe_layers=[0], ep=ep, etp=etp, world_size=len(rows), pp=pp)["ep_groups"]
        node_pairs = {_unordered(a // gpus_per_node, b // gpus_per_node) for group in groups
                      for a, b in itertools.combinations(group, 2)}
        ep_edges = tuple(sorted(pair for pair in node_pairs if pair[0] != pair[1]))
        if ep_edges:
            edges["ep"] = ep_edges
    for axis in ("tp", "cp", "dp", "pp"):
        found: set[tuple[int, int]] = set()
        for group in axis_groups(rows, axis):
            slots = [rank // gpus_per_node for rank in group]
            path = [s for i, s in enumerate(slots) if i == 0 or s != slots[i - 1]]
            if len(set(path)) < 2:
                continue
            pairs = list(itertools.pairwise(path))
            if (axis in CYCLIC_AXES or vpp > 1) and len(path) > 2:
                pairs.append((path[-1], path[0]))
            found.update(_unordered(*pair) for pair in pairs if pair[0] != pair[1])
        if found:
            edges[axis] = tuple(sorted(found))
    return edges


MEASURED_POOL_NODES = 64
"""With a measured bandwidth matrix no two nodes are interchangeable: the pool keeps the default order's
nodes and then the best-connected nodes (median measured bus bandwidth to the others) up to this many,
which bounds the CP-SAT model at 64 x 64 node pairs per edge. The output says so."""


def candidate_nodes(topology: Topology, slots: int) -> tuple[tuple[int, ...], bool]:
    """(topology node indices the placement chooses from, whether that pool is exact).

    The default order's nodes (0 .. slots − 1) come first, so the identity order means the same hosts.
    Without measured links a node's every link follows from its (leaf, NIC, GPU) class, and nodes of one
    class are interchangeable: at most ``slots`` of each class can be used, so the pool of the first
    ``slots`` of every class holds an optimal placement (exact). With measured links: see
    MEASURED_POOL_NODES (not exact)."""
    default = list(range(slots))
    if topology.measured_bytes_per_s is None:
        taken: dict[tuple, int] = {}
        pool = []
        for index, node in enumerate(topology.nodes):
            key = (node.leaf, node.nic_bytes_per_s_per_gpu, node.gpu.name)
            if index < slots or taken.get(key, 0) < slots:
                taken[key] = taken.get(key, 0) + 1
                pool.append(index)
        return tuple(pool), True
    if topology.num_nodes <= MEASURED_POOL_NODES:
        return tuple(range(topology.num_nodes)), True
    link = topology.link_bytes_per_s()
    score = np.nanmedian(np.where(np.eye(topology.num_nodes, dtype=bool), np.nan, link), axis=1)
    ranked = [int(i) for i in np.argsort(-np.nan_to_num(score), kind="stable") if i >= slots]
    return tuple(default + ranked[:max(MEASURED_POOL_NODES - slots, slots)]), False


def rank_instance(document: dict[str, Any], topology: Topology) -> RankInstance:
    """Price the plan's axes at every distinct link speed of ``topology`` over its candidate nodes
    (candidate_nodes); InputError if it cannot host the plan."""
    job, config = job_of_plan(document)
    per_node = document["cluster"]["gpus_per_node"]
    slots = config.num_gpus // per_node
    _check_fits(topology, per_node, slots, document["cluster"]["gpu"])
    pool, exact = candidate_nodes(topology, slots)
    topology = topology.subset(pool)
    edges = slot_edges(tp=config.tp, cp=config.cp, dp=config.dp, pp=config.pp, vpp=config.vpp,
                       gpus_per_node=per_node, ep=config.ep, etp=config.etp)
    link = topology.link_bytes_per_s()
    off = ~np.eye(topology.num_nodes, dtype=bool)
    speeds = sorted(set(link[off].tolist())) or [float(link[0, 0])]
    priced: dict[float, AxisTimes] = {b: axis_times(job, config, topology.nominal_cluster(b, slots)) for b in speeds}
    pair_cost = {}
    for axis in edges:
        table = np.zeros(link.shape, dtype=np.int64)
        for p, q in zip(*np.nonzero(off)):
            table[p, q] = _quanta(priced[float(link[p, q])].axis_s[axis], topology.name, axis)
        pair_cost[axis] = table
    reference = priced[speeds[-1]]
    constant = reference.step_time_s - sum(reference.axis_s[axis] for axis in edges)
    return RankInstance(num_slots=slots, edges=edges, pair_cost=pair_cost, constant_s=constant, nodes=pool,
                        exact_pool=exact)


MAX_AXIS_S = 1e9
"""An axis's communication per step priced above this (about 30 years) comes from a link the topology gives
a vanishing bandwidth; it would overflow the solver's integer costs."""


def _quanta(seconds: float, topology: str, axis: str) -> int:
    """``seconds`` in TIME_QUANTUM_S units; InputError for a time no link of a real fabric gives."""
    if not 0 <= seconds <= MAX_AXIS_S:  # NaN fails too
        raise InputError(f"{shown(topology, 60)}: a link prices the plan's {axis} communication at {seconds:g} s "
                         "per step; check the bandwidths and latencies of the topology or cluster")
    return round(seconds / TIME_QUANTUM_S)


def _check_fits(topology: Topology, per_node: int, slots: int, gpu: str) -> None:
    """InputError unless ``topology`` has the plan's node size, its one GPU type and enough nodes."""
    sizes = {node.gpus_per_node for node in topology.nodes}
    if sizes != {per_node}:
        raise InputError(f"the plan runs {per_node} GPUs per node but topology {topology.name} has nodes of "
                         f"{sorted(sizes)} GPUs; plan for the topology's node size")
    types = topology.gpu_types
    if types != (gpu,):
        raise InputError(f"the plan was priced for {gpu} but topology {topology.name} has {', '.join(types)}; "
                         "rank placement needs one GPU type (mixed types: see 'paraplan plan --place')")
    if slots > topology.num_nodes:
        raise InputError(f"the plan needs {slots} nodes but topology {topology.name} has {topology.num_nodes}; "
                         "give a topology with enough nodes")
