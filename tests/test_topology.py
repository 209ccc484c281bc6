"""Topology files: node groups, leaves, measured links; the link model; bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paraplan.errors import InputError
from paraplan.hardware_profiles import load_cluster
from paraplan.hardware_profiles.topology import uniform_topology
from paraplan.hardware_profiles.topology_file import is_topology_file, load_topology, topology_from_file

TOPOLOGY = """\
inter_node_latency_us: 5.0
intra_domain_latency_us: 2.0
leaves:
  - {oversubscription: 1.0}
  - {oversubscription: 4.0}
node_groups:
  - {gpu: h100-sxm, num_nodes: 2, gpus_per_node: 8, nic_gb_per_s_per_gpu: 50, hosts: [a, b]}
  - {gpu: h100-sxm, num_nodes: 2, gpus_per_node: 8, nic_gb_per_s_per_gpu: 25, leaf: 1}
"""


def write(tmp_path: Path, text: str, name: str = "topo.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reads_groups_leaves_and_hosts(tmp_path):
    topo = topology_from_file(write(tmp_path, TOPOLOGY))
    assert [n.host for n in topo.nodes] == ["a", "b", "node2", "node3"]
    assert [n.leaf for n in topo.nodes] == [0, 0, 1, 1]
    assert topo.nodes[2].nic_bytes_per_s_per_gpu == 25e9
    assert topo.leaf_oversubscription == (1.0, 4.0)
    assert topo.inter_node_latency_s == pytest.approx(5e-6)


def test_link_model_hand_numbers(tmp_path):
    # H100 nic_frac 0.8: same leaf 50 GB/s NICs -> 40 GB/s; 25 GB/s NICs on leaf 1 -> 20 GB/s;
    # across leaves the slower NIC (25 -> 20) over the worse uplink (4:1) -> 5 GB/s.
    link = topology_from_file(write(tmp_path, TOPOLOGY)).link_bytes_per_s()
    assert link[0, 1] == pytest.approx(40e9) and link[2, 3] == pytest.approx(20e9)
    assert link[0, 2] == pytest.approx(5e9) and link[3, 1] == pytest.approx(5e9)
    assert link[0, 0] == pytest.approx(450e9 * 0.75)  # NVLink × nvlink_frac inside the node


def test_measured_matrix_replaces_the_model_with_the_slower_direction(tmp_path):
    write(tmp_path, "src,dst,bus_gb_per_s\na,b,12.5\nb,a,30\nnode2,node3,18\n", "bw.csv")
    topo = topology_from_file(write(tmp_path, TOPOLOGY + "bandwidth_matrix: bw.csv\n"))
    link = topo.link_bytes_per_s()
    assert link[0, 1] == link[1, 0] == pytest.approx(12.5e9)
    assert link[2, 3] == link[3, 2] == pytest.approx(18e9)  # the model's 20 in one direction, 18 measured
    assert link[0, 2] == pytest.approx(5e9)  # unmeasured: modelled
    assert np.isnan(topo.measured_bytes_per_s[0, 2])


def test_a_cluster_name_or_file_gives_the_uniform_topology(tmp_path):
    topo = load_topology("dgx-h100", num_nodes=3)
    assert topo.num_nodes == 3 and topo.leaf_oversubscription == (1.0,)
    assert topo.link_bytes_per_s()[0, 2] == pytest.approx(50e9 * 0.8)
    cluster = load_cluster("dgx-h100", num_nodes=3)
    assert topo.nominal_cluster() == uniform_topology(cluster).nominal_cluster()
    assert not is_topology_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(("text", "needle"), [
    (TOPOLOGY.replace("inter_node_latency_us: 5.0\n", ""), "missing key(s) inter_node_latency_us"),
    (TOPOLOGY + "spine: 3\n", "unknown key(s) spine"),
    (TOPOLOGY.replace("oversubscription: 4.0", "oversubscription: 0.5"), "must be >= 1"),
    (TOPOLOGY.replace("leaf: 1", "leaf: 2"), "leaf must be an index into leaves (0 to 1)"),
    (TOPOLOGY.replace("hosts: [a, b]", "hosts: [a]"), "hosts must list 2 host names"),
    (TOPOLOGY.replace("hosts: [a, b]", "hosts: [a, a]"), "host names must be distinct"),
    (TOPOLOGY.replace("nic_gb_per_s_per_gpu: 25", "nic_gb_per_s_per_gpu: -1"), "expected a positive number"),
    (TOPOLOGY.replace("gpu: h100-sxm, num_nodes: 2, gpus_per_node: 8, nic_gb_per_s_per_gpu: 25",
                      "gpu: h101, num_nodes: 2, gpus_per_node: 8, nic_gb_per_s_per_gpu: 25"), "unknown GPU 'h101'"),
    (TOPOLOGY + "bandwidth_matrix: nowhere.csv\n", "cannot read bandwidth matrix"),
    ("node_groups: [\n", "malformed YAML"),
])
def test_bad_topology_files(tmp_path, text, needle):
    with pytest.raises(InputError) as caught:
        topology_from_file(write(tmp_path, text))
    assert needle in str(caught.value)


@pytest.mark.parametrize(("csv_text", "needle"), [
    ("from,to,gbps\n", "line 1 must be the header src,dst,bus_gb_per_s"),
    ("src,dst,bus_gb_per_s\na,zz,10\n", "line 2 must be src,dst,bus_gb_per_s with hosts of the topology"),
    ("src,dst,bus_gb_per_s\na,b,fast\n", "line 2: bus_gb_per_s must be a positive number"),
    ("src,dst,bus_gb_per_s\na,b,0\n", "line 2: bus_gb_per_s must be a positive number"),
])
def test_bad_bandwidth_matrices(tmp_path, csv_text, needle):
    matrix = write(tmp_path, csv_text, "bw.csv")
    with pytest.raises(InputError) as caught:
        topology_from_file(write(tmp_path, TOPOLOGY), matrix)
    assert needle in str(caught.value)


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("inter_node_latency_us: 5.0", "inter_node_latency_us: 1.0e+300",
     "inter_node_latency_us: 1e+300 is implausibly large"),
    ("intra_domain_latency_us: 2.0", "intra_domain_latency_us: 1.0e+300", "intra_domain_latency_us: 1e+300 is"),
    ("oversubscription: 4.0", "oversubscription: 1.0e+300", "leaves[1].oversubscription: 1e+300 is implausibly"),
    ("nic_gb_per_s_per_gpu: 25", "nic_gb_per_s_per_gpu: 1.0e+300", "node_groups[1].nic_gb_per_s_per_gpu: 1e+300"),
    ("nic_gb_per_s_per_gpu: 25", "nic_gb_per_s_per_gpu: 1.0e-300", "node_groups[1].nic_gb_per_s_per_gpu: 1e-300 is "
                                                                   "implausibly small"),
    ("nic_gb_per_s_per_gpu: 25", "nic_gb_per_s_per_gpu: .inf", "nic_gb_per_s_per_gpu: expected a positive number"),
])
def test_numbers_out_of_a_sane_range_are_refused_by_key(tmp_path, old, new, needle):
    # A billion-second latency or a 1e-300 GB/s NIC priced a link at infinite time, which the rank
    # placement could not turn into integers (OverflowError).
    with pytest.raises(InputError) as caught:
        topology_from_file(write(tmp_path, TOPOLOGY.replace(old, new)))
    assert needle in str(caught.value) and len(str(caught.value)) <= 300


@pytest.mark.parametrize("value", ["1e-300", "1e+300", "inf", "nan"])
def test_bandwidth_matrix_numbers_out_of_a_sane_range_are_refused(tmp_path, value):
    matrix = write(tmp_path, f"src,dst,bus_gb_per_s\na,b,{value}\n", "bw.csv")
    with pytest.raises(InputError, match=r"bw.csv: line 2: bus_gb_per_s must be a positive number from 0\.001 to "
                                         r"20000"):
        topology_from_file(write(tmp_path, TOPOLOGY), matrix)
