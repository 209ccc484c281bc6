"""A serving deployment's pools, read from the serving-plan document, and where their processes run.

A pool entry of the document reads into planner/serving/pool_shape.ServingPool, the one description of a
pool's workers (its ``workers`` key is the pool's ``num_workers``). Workers are packed onto nodes pool by pool
(prefill pools first, as the plan lists them); a worker larger than a node takes whole nodes. No node holds two
pools, so pools of different GPU types (a mixed aggregated fleet, or prefill and decode on different GPUs) land
on different machines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from paraplan.errors import InputError
from paraplan.hardware_profiles.catalog import builtin_catalog
from paraplan.planner.serving.pool_shape import POOL_ROLES, ServingPool

DEFAULT_NODE_GPUS = 8  # HGX/DGX H100, H200, B200 boards carry 8 GPUs (clusters.yaml dgx-*)


def pool_node_gpus(entry: dict[str, Any]) -> int:
    """GPUs per node of a plan's pool entry: as the plan states, else its GPU's catalog node size."""
    return int(entry.get("gpus_per_node") or node_gpus(str(entry.get("gpu", ""))))


def node_gpus(gpu: str) -> int:
    """GPUs per node of ``gpu``: the smallest node among the built-in clusters of that GPU, else 8."""
    sizes = [int(c["gpus_per_node"]) for c in builtin_catalog().clusters.values() if c.get("gpu") == gpu]
    return min(sizes) if sizes else DEFAULT_NODE_GPUS


def _int(entry: dict[str, Any], key: str, where: str) -> int:
    """``entry[key]`` as a positive integer; InputError naming the field otherwise."""
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}.{key} must be a positive integer, got {value!r}")
    return value


def read_pool(entry: dict[str, Any], where: str) -> ServingPool:
    """A pool entry of the plan document, with its shape checked (InputError naming the field)."""
    if entry.get("role") not in POOL_ROLES:
        raise InputError(f"{where}.role must be one of {', '.join(POOL_ROLES)}, got {entry.get('role')!r}")
    ints = {key: _int(entry, key, where) for key in ("workers", "gpus_per_worker", "tp", "pp", "dp_attention",
                                                      "moe_ep", "moe_tp", "max_batch", "max_batched_tokens",
                                                      "max_model_len")}
    frac = entry.get("memory_frac")
    if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0 < frac <= 1:
        raise InputError(f"{where}.memory_frac must be a fraction in (0, 1], got {frac!r}")
    traffic = entry.get("traffic_frac")
    if traffic is not None and (isinstance(traffic, bool) or not isinstance(traffic, int | float)
                                or not 0 <= traffic <= 1):
        raise InputError(f"{where}.traffic_frac must be a fraction in [0, 1], got {traffic!r}")
    gpu = str(entry.get("gpu", ""))
    pool = ServingPool(role=entry["role"], gpu=gpu, num_node_gpus=pool_node_gpus(entry), num_workers=ints["workers"],
                       tp=ints["tp"], pp=ints["pp"], dp_attention=ints["dp_attention"], moe_ep=ints["moe_ep"],
                       moe_tp=ints["moe_tp"], max_batch=ints["max_batch"],
                       max_batched_tokens=ints["max_batched_tokens"],
                       memory_frac=float(frac), max_model_len=ints["max_model_len"],
                       traffic_frac=None if traffic is None else float(traffic))
    _check_shape(pool, ints["gpus_per_worker"], where)
    return pool


def _check_shape(pool: ServingPool, stated_gpus_per_worker: int, where: str) -> None:
    """InputError where the entry's gpus_per_worker, its MoE split or its node fit disagree with its sharding."""
    if pool.gpus_per_worker != stated_gpus_per_worker:
        raise InputError(f"{where}: gpus_per_worker {stated_gpus_per_worker} must equal tp*dp_attention*pp = "
                         f"{pool.tp}*{pool.dp_attention}*{pool.pp}")
    if pool.moe_tp * pool.moe_ep != pool.tp_group:
        raise InputError(f"{where}: moe_tp*moe_ep = {pool.moe_tp}*{pool.moe_ep} must equal tp*dp_attention = "
                         f"{pool.tp_group}")
    fits = pool.num_node_gpus % pool.gpus_per_worker == 0 or pool.gpus_per_worker % pool.num_node_gpus == 0
    if not fits:
        raise InputError(f"{where}: a {pool.gpus_per_worker}-GPU worker neither divides nor fills whole "
                         f"{pool.num_node_gpus}-GPU nodes; choose gpus_per_worker dividing or a multiple of "
                         f"{pool.num_node_gpus}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Process:
    """One engine command: a worker, or a worker's share of one node when it spans several."""

    pool_index: int
    """Index of its pool in the deployment."""
    worker: int
    """Worker index within the pool."""
    node: int
    """Node it runs on (0-based, across the deployment)."""
    node_in_worker: int
    """Its node's rank within the worker (0 on the worker's first node)."""
    first_node: int
    """The worker's first node: its head (API server, rendezvous)."""
    gpus: tuple[int, ...]
    """Local GPU indices it uses on its node."""
    slot: int
    """Its index among the processes of its node: offsets its ports."""


def place(pools: list[ServingPool]) -> list[Process]:
    """Every process of the deployment, pools in order, workers packed onto nodes."""
    processes: list[Process] = []
    base = 0
    for index, pool in enumerate(pools):
        for worker in range(pool.num_workers):
            if pool.nodes_per_worker > 1:
                first = base + worker * pool.nodes_per_worker
                for rank in range(pool.nodes_per_worker):
                    processes.append(Process(pool_index=index, worker=worker, node=first + rank,
                                             node_in_worker=rank, first_node=first,
                                             gpus=tuple(range(pool.num_node_gpus)), slot=0))
            else:
                node, slot = base + worker // pool.workers_per_node, worker % pool.workers_per_node
                gpus = tuple(range(slot * pool.gpus_per_worker, (slot + 1) * pool.gpus_per_worker))
                processes.append(Process(pool_index=index, worker=worker, node=node, node_in_worker=0,
                                         first_node=node, gpus=gpus, slot=slot))
        base += pool.num_nodes
    return processes


def pool_labels(pools: list[ServingPool]) -> list[str]:
    """A name per pool, unique in the deployment: its role, or role-i (i counting the pools of that role) when
    several pools share the role. It names the pool's options file, k8s objects and logs."""
    roles = [pool.role for pool in pools]
    return [role if roles.count(role) == 1 else f"{role}-{roles[:index].count(role)}"
            for index, role in enumerate(roles)]


def gpu_nodes(pools: list[ServingPool], processes: Sequence[Process]) -> dict[str, list[int]]:
    """GPU type -> the nodes (0-based, across the deployment) that must be of that type, types in plan order;
    ``processes``: ``place(pools)``."""
    nodes: dict[str, dict[int, None]] = {}
    for proc in processes:
        nodes.setdefault(pools[proc.pool_index].gpu, {})[proc.node] = None
    return {gpu: list(listed) for gpu, listed in nodes.items()}


def node_ranges(nodes: list[int]) -> str:
    """Sorted node indices as ranges: [0, 1, 2, 5] -> "nodes 0-2, 5"."""
    spans: list[list[int]] = []
    for node in sorted(nodes):
        if spans and node == spans[-1][1] + 1:
            spans[-1][1] = node
        else:
            spans.append([node, node])
    text = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)
    return ("nodes " if len(nodes) > 1 else "node ") + text
