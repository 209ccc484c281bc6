"""Topology files: a YAML list of node groups (GPU type, NIC, leaf, host names), leaf uplink
oversubscription, and an optional measured bandwidth CSV. Keys carry units; values become SI here.

    inter_node_latency_us: 5.0
    intra_domain_latency_us: 2.0
    leaves:                          # optional: leaf i's uplink oversubscription (default one 1:1 leaf)
      - {oversubscription: 1.0}
      - {oversubscription: 4.0}
    node_groups:
      - {gpu: h100-sxm, num_nodes: 2, gpus_per_node: 8, nic_gb_per_s_per_gpu: 50, leaf: 0, hosts: [a, b]}
      - {gpu: h100-sxm, num_nodes: 2, gpus_per_node: 8, nic_gb_per_s_per_gpu: 25, leaf: 1}
    bandwidth_matrix: measured.csv   # optional, relative to this file

The bandwidth CSV has the header ``src,dst,bus_gb_per_s``: measured per-GPU bus bandwidth (what
nccl-tests reports as busbw) between two hosts, one row per measured pair; unmeasured pairs keep
the modelled value.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from paraplan.errors import InputError
from paraplan.files import read_user_csv, read_user_yaml, shown
from paraplan.hardware_profiles import units
from paraplan.hardware_profiles.catalog import Catalog, cluster_from_file, load_cluster, load_gpu
from paraplan.hardware_profiles.topology import NodeSpec, Topology, uniform_topology
from paraplan.hardware_profiles.yaml_schema import check_keys, positive_int, positive_number, text
from paraplan.limits import MAX_GPUS_PER_NODE, MAX_TOPOLOGY_NODES

_TOP_KEYS = ("inter_node_latency_us", "intra_domain_latency_us", "node_groups")
_TOP_OPTIONAL = ("name", "display_name", "leaves", "bandwidth_matrix", "sources")
_GROUP_KEYS = ("gpu", "num_nodes", "gpus_per_node", "nic_gb_per_s_per_gpu")
_GROUP_OPTIONAL = ("leaf", "hosts")
MATRIX_COLUMNS = ("src", "dst", "bus_gb_per_s")
MAX_MATRIX_BYTES = 64 << 20
"""A bandwidth CSV: all pairs of 1,000 nodes at about 40 bytes a row is 40 MB; nobody measures more pairs."""
MAX_HOST_CHARS = 253
"""A host name: DNS names are at most 253 characters."""
MAX_LATENCY_US = 10_000.0
"""As in cluster files: 10 ms per message is a misconfigured fabric, not a latency."""
MAX_OVERSUBSCRIPTION = 1000.0
"""As in cluster files: a leaf uplink shared a thousand ways is not a training fabric."""
NIC_GB_PER_S_RANGE = (0.001, 2000.0)
"""A NIC per GPU: 1 MB/s (below any NIC a cluster trains over) to 2,000 GB/s (the GPU catalog's ceiling, 16 x
800 Gb/s); outside it a link prices at zero or infinite time, which rank placement cannot turn into integers."""
BUS_GB_PER_S_RANGE = (0.001, 20_000.0)
"""A measured bus bandwidth between two hosts: as a NIC below, up to the catalog's NVLink ceiling above (two
hosts of one multi-node NVLink domain)."""


def is_topology_file(path: Path) -> bool:
    """True when ``path`` is a YAML file with ``node_groups`` (a topology, not a plain cluster file)."""
    if Path(path).suffix not in (".yaml", ".yml") or not Path(path).is_file():
        return False
    try:
        return "node_groups" in read_user_yaml(Path(path), "topology file")
    except InputError:
        return False


def load_topology(cluster: str, num_nodes: int | None = None, matrix: Path | None = None,
                  catalog: Catalog | None = None) -> Topology:
    """A topology file, or the uniform topology of a cluster file or a cluster type of ``catalog``
    (default: built-in); ``matrix`` (a bandwidth CSV) replaces the file's own."""
    if is_topology_file(Path(cluster)):
        if num_nodes is not None:
            raise InputError(f"{cluster} lists its own nodes; drop --nodes")
        return topology_from_file(Path(cluster), matrix, catalog)
    looks_like_file = Path(cluster).suffix in (".yaml", ".yml") or "/" in cluster
    spec = cluster_from_file(Path(cluster), num_nodes=num_nodes, catalog=catalog) \
        if Path(cluster).is_file() or looks_like_file else load_cluster(cluster, num_nodes=num_nodes, catalog=catalog)
    if spec.num_nodes > MAX_TOPOLOGY_NODES:
        raise InputError(f"{spec.name}: {spec.num_nodes:,} nodes is more than rank placement handles (at most "
                         f"{MAX_TOPOLOGY_NODES:,}); place a part of the cluster")
    try:
        topology = uniform_topology(spec)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return topology if matrix is None else _with_matrix(topology, matrix)


def topology_from_file(path: Path, matrix: Path | None = None, catalog: Catalog | None = None) -> Topology:
    """Read and validate a topology YAML file; its GPU names are looked up in ``catalog`` (default: built-in)."""
    entry = check_keys(read_user_yaml(path, "topology file"), str(path), _TOP_KEYS, _TOP_OPTIONAL)
    leaves = entry.get("leaves", [{"oversubscription": 1.0}])
    if not isinstance(leaves, list) or not leaves:
        raise InputError(f"{path}: leaves must be a non-empty list of {{oversubscription: X}} entries")
    over = tuple(_oversubscription(leaf, f"{path}: leaves[{i}]") for i, leaf in enumerate(leaves))
    groups = entry["node_groups"]
    if not isinstance(groups, list) or not groups:
        raise InputError(f"{path}: node_groups must be a non-empty list of node groups")
    nodes: list[NodeSpec] = []
    for index, group in enumerate(groups):
        nodes += _group_nodes(group, f"{path}: node_groups[{index}]", len(nodes), len(over), catalog)
    name = text(entry["name"], f"{path}: name")[:64] if "name" in entry else path.stem
    try:
        topology = Topology(
            name=name, nodes=tuple(nodes), leaf_oversubscription=over,
            inter_node_latency_s=positive_number(entry["inter_node_latency_us"], f"{path}: inter_node_latency_us",
                                                 MAX_LATENCY_US) * units.SECONDS_PER_US,
            intra_domain_latency_s=positive_number(entry["intra_domain_latency_us"], f"{path}: intra_domain_latency_us",
                                                   MAX_LATENCY_US) * units.SECONDS_PER_US)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    own = entry.get("bandwidth_matrix")
    if matrix is None and own is not None:
        matrix = path.parent / text(own, f"{path}: bandwidth_matrix")
    return topology if matrix is None else _with_matrix(topology, matrix)


def _oversubscription(leaf: Any, where: str) -> float:
    value = positive_number(check_keys(leaf, where, ("oversubscription",))["oversubscription"],
                            f"{where}.oversubscription", MAX_OVERSUBSCRIPTION)
    if value < 1:
        raise InputError(f"{where}.oversubscription must be >= 1 (1 = full bisection), got {value}")
    return value


def _group_nodes(group: Any, where: str, first: int, num_leaves: int, catalog: Catalog | None) -> list[NodeSpec]:
    check_keys(group, where, _GROUP_KEYS, _GROUP_OPTIONAL)
    # Bounded before any node is built: the groups together list at most MAX_TOPOLOGY_NODES nodes.
    count = positive_int(group["num_nodes"], f"{where}.num_nodes", MAX_TOPOLOGY_NODES)
    if first + count > MAX_TOPOLOGY_NODES:
        raise InputError(f"{where}.num_nodes: the groups list more than {MAX_TOPOLOGY_NODES:,} nodes, more than rank "
                         "placement handles; place a part of the cluster")
    leaf = group.get("leaf", 0)
    if isinstance(leaf, bool) or not isinstance(leaf, int) or not 0 <= leaf < num_leaves:
        raise InputError(f"{where}.leaf must be an index into leaves (0 to {num_leaves - 1}), got {shown(leaf, 40)}")
    hosts = group.get("hosts", [f"node{first + i}" for i in range(count)])
    if not isinstance(hosts, list) or len(hosts) != count or \
            not all(isinstance(h, str) and 0 < len(h) <= MAX_HOST_CHARS for h in hosts):
        raise InputError(f"{where}.hosts must list {count} host names, one per node")
    try:
        gpu = load_gpu(text(group["gpu"], f"{where}.gpu"), catalog)
    except InputError as exc:
        raise InputError(f"{where}.gpu: {exc}") from None
    per_node = positive_int(group["gpus_per_node"], f"{where}.gpus_per_node", MAX_GPUS_PER_NODE)
    where_nic = f"{where}.nic_gb_per_s_per_gpu"
    nic = positive_number(group["nic_gb_per_s_per_gpu"], where_nic, NIC_GB_PER_S_RANGE[1])
    if nic < NIC_GB_PER_S_RANGE[0]:
        raise InputError(f"{where_nic}: {shown(nic, 40)} is implausibly small (at least {NIC_GB_PER_S_RANGE[0]:g}); "
                         "check the unit in the key name")
    nic *= units.BYTES_PER_GB
    return [NodeSpec(host=h, gpu=gpu, gpus_per_node=per_node, nic_bytes_per_s_per_gpu=nic, leaf=leaf) for h in hosts]


def read_bandwidth_csv(path: Path, hosts: list[str]) -> np.ndarray:
    """The measured (nodes, nodes) bus bandwidth matrix in bytes/s, NaN where not measured."""
    rows = read_user_csv(Path(path), MAX_MATRIX_BYTES, "bandwidth matrix", max_rows=len(hosts) ** 2 + 1)
    if not rows or tuple(cell.strip() for cell in rows[0]) != MATRIX_COLUMNS:
        raise InputError(f"{path}: line 1 must be the header {','.join(MATRIX_COLUMNS)}")
    index = {host: i for i, host in enumerate(hosts)}
    matrix = np.full((len(hosts), len(hosts)), np.nan)
    for line_no, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != 3 or row[0].strip() not in index or row[1].strip() not in index:
            raise InputError(f"{path}: line {line_no} must be src,dst,bus_gb_per_s with hosts of the topology "
                             f"({', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''})")
        try:
            value = float(row[2])
        except ValueError:
            value = math.nan
        low, high = BUS_GB_PER_S_RANGE
        if not low <= value <= high:  # NaN and infinities fail too
            raise InputError(f"{path}: line {line_no}: bus_gb_per_s must be a positive number from {low:g} to "
                             f"{high:g} (GB/s), got {shown(row[2])}")
        matrix[index[row[0].strip()], index[row[1].strip()]] = value * units.BYTES_PER_GB
    return matrix


def _with_matrix(topology: Topology, path: Path) -> Topology:
    matrix = read_bandwidth_csv(path, [node.host for node in topology.nodes])
    return Topology(name=topology.name, nodes=topology.nodes, leaf_oversubscription=topology.leaf_oversubscription,
                    inter_node_latency_s=topology.inter_node_latency_s,
                    intra_domain_latency_s=topology.intra_domain_latency_s, measured_bytes_per_s=matrix)
