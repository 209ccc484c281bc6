"""A cluster's physical topology: nodes (possibly of several GPU types), their NICs, leaf switches
with oversubscribed uplinks, and optionally a measured node-to-node bandwidth matrix.

It builds on :class:`ClusterSpec` without changing it: :meth:`Topology.nominal_cluster` is the
ClusterSpec a uniform version of the topology would be, and every link bandwidth here is the
per-GPU, one-direction bus bandwidth NCCL reaches (the ClusterSpec's NIC line rate × nic_frac ÷
oversubscription), so the collectives' α–β model prices it unchanged. Each node is one NVLink domain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from paraplan.hardware_profiles.specs import ClusterSpec, GPUSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """One physical node."""

    host: str
    """Host name as the launcher knows it."""
    gpu: GPUSpec
    """The GPU type of every GPU in this node."""
    gpus_per_node: int
    """GPUs in the node (one NVLink domain)."""
    nic_bytes_per_s_per_gpu: float
    """Scale-out NIC line rate per GPU, one direction, bytes/s."""
    leaf: int
    """Index of the leaf switch the node's NICs attach to."""

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.nic_bytes_per_s_per_gpu <= 0 or self.leaf < 0:
            raise ValueError(f"node {self.host}: GPUs per node and NIC bandwidth must be positive, the leaf >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """Nodes, leaves and (optionally) measured links; node index = position in ``nodes``."""

    name: str
    """File name or the ClusterSpec's name."""
    nodes: tuple[NodeSpec, ...]
    """Every node, in the order the scheduler lists them."""
    leaf_oversubscription: tuple[float, ...]
    """Per leaf switch, its uplink oversubscription (>= 1; 1 = full bisection to the spine)."""
    inter_node_latency_s: float
    """Per-message latency across the scale-out fabric, seconds."""
    intra_domain_latency_s: float
    """Per-message latency inside a node's NVLink domain, seconds."""
    measured_bytes_per_s: np.ndarray | None = None
    """(nodes, nodes) measured per-GPU bus bandwidth between node pairs, bytes/s; NaN = not measured
    (the leaf/NIC model applies); None = no measurement at all."""

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError(f"topology {self.name}: no nodes")
        if any(node.leaf >= len(self.leaf_oversubscription) for node in self.nodes):
            raise ValueError(f"topology {self.name}: a node names a leaf without an oversubscription entry")
        if any(not over >= 1 for over in self.leaf_oversubscription):
            raise ValueError(f"topology {self.name}: leaf oversubscription must be >= 1")
        if len({node.host for node in self.nodes}) != len(self.nodes):
            raise ValueError(f"topology {self.name}: host names must be distinct")
        if self.measured_bytes_per_s is not None and self.measured_bytes_per_s.shape != (len(self.nodes),) * 2:
            raise ValueError(f"topology {self.name}: the bandwidth matrix must be nodes x nodes")

    @property
    def num_nodes(self) -> int:
        """Nodes."""
        return len(self.nodes)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """Distinct GPU types, in node order."""
        return tuple(dict.fromkeys(node.gpu.name for node in self.nodes))

    def link_bytes_per_s(self) -> np.ndarray:
        """(nodes, nodes) per-GPU bus bandwidth of each node pair, bytes/s; the diagonal is NVLink.

        Modelled: the slower NIC × nic_frac, divided by the worse uplink oversubscription when the
        two nodes sit on different leaves. A measured entry replaces the model; the matrix is made
        symmetric with the slower direction (a ring uses both).
        """
        n = self.num_nodes
        nic = np.array([node.nic_bytes_per_s_per_gpu * node.gpu.efficiency.nic_frac for node in self.nodes])
        leaf = np.array([node.leaf for node in self.nodes])
        over = np.array(self.leaf_oversubscription)[leaf]
        cross_leaf = leaf[:, None] != leaf[None, :]
        link = np.minimum(nic[:, None], nic[None, :]) / np.where(cross_leaf, np.maximum(over[:, None], over[None, :]),
                                                                   1.0)
        if self.measured_bytes_per_s is not None:
            measured = self.measured_bytes_per_s
            link = np.where(np.isnan(measured), link, measured)
            link = np.minimum(link, link.T)
        nvlink = [node.gpu.nvlink_bytes_per_s * node.gpu.efficiency.nvlink_frac for node in self.nodes]
        link[np.arange(n), np.arange(n)] = nvlink
        return link

    def slowest_link_bytes_per_s(self) -> float:
        """The slowest inter-node per-GPU bus bandwidth (link_bytes_per_s off the diagonal), without building
        the (nodes, nodes) matrix: the slowest NIC × nic_frac, divided by the worst uplink oversubscription
        when the nodes span more than one leaf; the slowest measured pair where a matrix is given."""
        if self.num_nodes == 1:
            node = self.nodes[0]
            return node.nic_bytes_per_s_per_gpu * node.gpu.efficiency.nic_frac
        if self.measured_bytes_per_s is not None:
            link = self.link_bytes_per_s()
            return float(link[~np.eye(self.num_nodes, dtype=bool)].min())
        nic = min(node.nic_bytes_per_s_per_gpu * node.gpu.efficiency.nic_frac for node in self.nodes)
        leaves = {node.leaf for node in self.nodes}
        over = max(self.leaf_oversubscription[leaf] for leaf in leaves) if len(leaves) > 1 else 1.0
        return nic / over

    def subset(self, indices: Iterable[int]) -> Topology:
        """The topology of the nodes at ``indices`` (in that order), with their measured links."""
        indices = list(indices)
        measured = None if self.measured_bytes_per_s is None else self.measured_bytes_per_s[np.ix_(indices, indices)]
        return dataclasses.replace(self, nodes=tuple(self.nodes[i] for i in indices), measured_bytes_per_s=measured)

    def weakest_node(self) -> NodeSpec:
        """The node type with the least HBM, then the lowest 16-bit peak: what every plan must fit and keep up with."""
        return min(self.nodes, key=lambda node: (node.gpu.hbm_bytes, node.gpu.peak_flops_per_s["bf16"]))

    def nominal_cluster(self, link_bytes_per_s: float | None = None, num_nodes: int | None = None,
                        node: NodeSpec | None = None) -> ClusterSpec:
        """The homogeneous ClusterSpec of ``node``'s type (default: the first node), with every inter-node
        link at ``link_bytes_per_s`` (bus bandwidth; default: that node's NIC on a full-bisection fabric)."""
        first = self.nodes[0] if node is None else node
        eff = first.gpu.efficiency
        line_rate = first.nic_bytes_per_s_per_gpu if link_bytes_per_s is None else link_bytes_per_s / eff.nic_frac
        return ClusterSpec(
            name=self.name, gpu=first.gpu, num_nodes=num_nodes or self.num_nodes, gpus_per_node=first.gpus_per_node,
            nvlink_domain_gpus=first.gpus_per_node, nic_bytes_per_s_per_gpu=line_rate,
            inter_node_latency_s=self.inter_node_latency_s, intra_domain_latency_s=self.intra_domain_latency_s,
            oversubscription=1.0,
        )


def uniform_topology(cluster: ClusterSpec) -> Topology:
    """The topology a ClusterSpec implies: identical nodes on one leaf with the cluster's oversubscription."""
    if cluster.nvlink_domain_gpus != cluster.gpus_per_node:
        raise ValueError(f"cluster {cluster.name}: rank placement models one NVLink domain per node; "
                         f"{cluster.nvlink_domain_gpus}-GPU domains of {cluster.gpus_per_node}-GPU nodes are not "
                         "supported yet")
    nodes = tuple(NodeSpec(host=f"node{i}", gpu=cluster.gpu, gpus_per_node=cluster.gpus_per_node,
                           nic_bytes_per_s_per_gpu=cluster.nic_bytes_per_s_per_gpu / cluster.oversubscription, leaf=0)
                  for i in range(cluster.num_nodes))
    return Topology(name=cluster.name, nodes=nodes, leaf_oversubscription=(1.0,),
                    inter_node_latency_s=cluster.inter_node_latency_s,
                    intra_domain_latency_s=cluster.intra_domain_latency_s)
