"""The hardware catalog: every GPU and cluster loads, SI conversion, and strict input errors."""

from __future__ import annotations

import re

import pytest

from paraplan.errors import InputError
from paraplan.hardware_profiles import (
    builtin_cluster_names,
    cluster_from_file,
    gpu_names,
    load_cluster,
    load_gpu,
    quick_cluster,
    units,
)
from paraplan.hardware_profiles.yaml_schema import (
    check_keys,
    fraction,
    parse_yaml,
    positive_int,
    positive_number,
)

BUILTIN_CLUSTERS = ("dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72", "gb300-nvl72")


# -- GPUs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", gpu_names())
def test_every_gpu_loads_with_16bit_peaks_and_sources(name):
    gpu = load_gpu(name)
    assert gpu.name == name
    assert gpu.peak("bf16") > 0 and gpu.peak("fp16") > 0
    for key in ("dense_tflops", "hbm", "nvlink", "nic"):
        assert gpu.sources.get(key, "").strip(), f"{name} has no source for {key}"
    for label in ("hbm_bytes", "hbm_bytes_per_s", "nvlink_bytes_per_s", "nic_bytes_per_s"):
        assert getattr(gpu, label) > 0
    eff = gpu.efficiency
    for frac in (
        eff.hbm_frac,
        eff.nvlink_frac,
        eff.nic_frac,
        *eff.attention_peak_frac.values(),
        *eff.gemm_peak_frac.values(),
        *(f for table in eff.stack_gemm_peak_frac.values() for f in table.values()),
    ):
        assert 0 < frac <= 1
    assert eff.kernel_overhead_s > 0


def test_catalog_is_not_empty():
    assert len(gpu_names()) >= 10
    assert {"h100-sxm", "h100-pcie", "a100-sxm-80gb", "b200", "gb200"} <= set(gpu_names())


def test_h100_sxm_datasheet_numbers_in_si():
    gpu = load_gpu("h100-sxm")
    # H100 SXM datasheet: 1,979 TFLOP/s bf16 with sparsity -> 989.4e12 dense.
    assert gpu.peak("bf16") == pytest.approx(989.4e12, rel=1e-12)
    assert gpu.peak("fp16") == pytest.approx(989.4e12, rel=1e-12)
    assert gpu.peak("fp8") == pytest.approx(1978.9e12, rel=1e-12)
    # 80 GiB in bytes: binary prefix, 80 * 2**30.
    assert gpu.hbm_bytes == 80 * 2**30 == 85_899_345_920
    assert gpu.hbm_bytes_per_s == pytest.approx(3.35e12, rel=1e-12)
    assert gpu.nvlink_bytes_per_s == pytest.approx(450e9, rel=1e-12)  # 900 GB/s bidirectional
    assert gpu.nic_bytes_per_s == pytest.approx(50e9, rel=1e-12)  # 400 Gb/s NDR


def test_unit_constants():
    assert units.BYTES_PER_GIB == 2**30
    assert units.BYTES_PER_GB == 1e9
    assert units.BYTES_PER_S_PER_GBIT_S * 400 == pytest.approx(50e9)
    assert units.FLOPS_PER_TFLOP == 1e12


def test_a100_has_no_fp8():
    gpu = load_gpu("a100-sxm-80gb")
    with pytest.raises(ValueError, match="fp8"):
        gpu.peak("fp8")
    assert gpu.peak("bf16") == pytest.approx(312e12, rel=1e-12)


def test_unknown_gpu_suggests_the_closest_name():
    with pytest.raises(InputError) as info:
        load_gpu("h100")
    message = str(info.value)
    hint = re.search(r"did you mean (.*?)\?", message)
    assert hint, message
    assert "h100-sxm" in hint.group(1) or "h100-pcie" in hint.group(1)


def test_unknown_cluster_is_input_error():
    with pytest.raises(InputError, match="dgx-h100"):
        load_cluster("dgx-h10", num_nodes=1)


# -- built-in clusters --------------------------------------------------------------------------
def test_builtin_cluster_names():
    assert set(BUILTIN_CLUSTERS) <= set(builtin_cluster_names())


@pytest.mark.parametrize("name", BUILTIN_CLUSTERS)
@pytest.mark.parametrize("num_nodes", [1, 2, 3, 18, 64])
def test_builtin_clusters_load_at_any_node_count(name, num_nodes):
    cluster = load_cluster(name, num_nodes=num_nodes)
    assert cluster.num_nodes == num_nodes
    assert cluster.num_gpus == num_nodes * cluster.gpus_per_node
    assert cluster.domain_gpus == min(cluster.nvlink_domain_gpus, cluster.num_gpus)
    assert cluster.nic_bytes_per_s_per_gpu > 0
    assert cluster.inter_node_latency_s > 0 and cluster.intra_domain_latency_s > 0
    by_gpus = load_cluster(name, num_gpus=cluster.num_gpus)
    assert by_gpus == cluster


@pytest.mark.parametrize("name", ["gb200-nvl72", "gb300-nvl72"])
def test_nvl72_racks(name):
    cluster = load_cluster(name, num_nodes=18)
    assert cluster.nvlink_domain_gpus == 72
    assert cluster.gpus_per_node == 4
    assert cluster.num_gpus == 72
    assert cluster.domain_gpus == 72


def test_dgx_h100_cluster(dgx_h100, dgx_h100_nodes):
    assert dgx_h100_nodes(4).num_gpus == 32 and dgx_h100_nodes(4).domain_gpus == 8
    assert dgx_h100.gpu.name == "h100-sxm"
    assert dgx_h100.num_gpus == 16
    assert dgx_h100.nvlink_domain_gpus == 8
    assert dgx_h100.nic_bytes_per_s_per_gpu == pytest.approx(50e9)
    assert dgx_h100.inter_node_latency_s == pytest.approx(5e-6)


def test_gpus_not_a_multiple_of_node_size():
    with pytest.raises(InputError, match="multiple of 8"):
        load_cluster("dgx-h100", num_gpus=12)
    with pytest.raises(InputError, match="multiple of 4"):
        load_cluster("gb200-nvl72", num_gpus=6)


def test_size_must_be_given_once():
    with pytest.raises(InputError):
        load_cluster("dgx-h100")
    with pytest.raises(InputError):
        load_cluster("dgx-h100", num_nodes=2, num_gpus=16)
    with pytest.raises(InputError):
        load_cluster("dgx-h100", num_nodes=0)
    with pytest.raises(InputError):
        load_cluster("dgx-h100", num_gpus=-8)


# -- quick form ---------------------------------------------------------------------------------
def test_quick_cluster():
    cluster = quick_cluster("h100-sxm", 16)
    gpu = load_gpu("h100-sxm")
    assert cluster.num_nodes == 2 and cluster.gpus_per_node == 8 and cluster.num_gpus == 16
    assert cluster.nvlink_domain_gpus == 8
    assert cluster.nic_bytes_per_s_per_gpu == gpu.nic_bytes_per_s
    assert cluster.gpu == gpu


def test_quick_cluster_smaller_than_a_node():
    cluster = quick_cluster("a100-sxm-80gb", 4)
    assert cluster.num_nodes == 1 and cluster.num_gpus == 4 and cluster.domain_gpus == 4


def test_quick_cluster_custom_node_size():
    cluster = quick_cluster("mi300x", 32, gpus_per_node=4)
    assert cluster.num_nodes == 8 and cluster.gpus_per_node == 4


def test_quick_cluster_errors():
    with pytest.raises(InputError, match="multiple of 8"):
        quick_cluster("h100-sxm", 12)
    with pytest.raises(InputError):
        quick_cluster("h100-sxm", 0)
    with pytest.raises(InputError, match="did you mean"):
        quick_cluster("h100", 8)


# -- user cluster files ---------------------------------------------------------------------------
_GOOD_CLUSTER = """\
gpu: h100-sxm
gpus_per_node: 8
nvlink_domain_gpus: 8
nic_gb_per_s_per_gpu: 25
inter_node_latency_us: 7.5
intra_domain_latency_us: 2.0
num_nodes: 4
"""


def _write(tmp_path, text, name="site.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_user_cluster_file_loads(tmp_path):
    cluster = cluster_from_file(_write(tmp_path, _GOOD_CLUSTER))
    assert cluster.name == "site"
    assert cluster.num_nodes == 4 and cluster.num_gpus == 32
    assert cluster.nic_bytes_per_s_per_gpu == pytest.approx(25e9, rel=1e-12)
    assert cluster.inter_node_latency_s == pytest.approx(7.5e-6, rel=1e-12)
    assert cluster.oversubscription == 1.0
    resized = cluster_from_file(_write(tmp_path, _GOOD_CLUSTER), num_gpus=64)
    assert resized.num_nodes == 8


# (what the file changes, what the one error line must name)
_BAD_CLUSTER_FILES = [
    (lambda t: t + "nic_speed: 400\n", "unknown key.*nic_speed"),
    (lambda t: t.replace("nic_gb_per_s_per_gpu: 25\n", ""), "missing key.*nic_gb_per_s_per_gpu"),
    (lambda t: t.replace("gpus_per_node: 8\n", ""), "gpus_per_node"),
    (lambda t: t + "oversubscription: 0.5\n", "oversubscription"),
    (lambda t: t.replace("nvlink_domain_gpus: 8", "nvlink_domain_gpus: 12"), "whole"),
    (lambda t: t.replace("gpu: h100-sxm", "gpu: h100"), "did you mean"),
    (lambda t: t.replace("nic_gb_per_s_per_gpu: 25", "nic_gb_per_s_per_gpu: .inf"), "nic_gb_per_s_per_gpu"),
]


@pytest.mark.parametrize("change, message", _BAD_CLUSTER_FILES,
                         ids=["unknown-key", "missing-key", "missing-gpus-per-node", "oversubscription-below-one",
                              "domain-not-whole-nodes", "unknown-gpu", "infinite-bandwidth"])
def test_user_cluster_bad_file(tmp_path, change, message):
    with pytest.raises(InputError, match=message):
        cluster_from_file(_write(tmp_path, change(_GOOD_CLUSTER)))


def test_user_cluster_malformed_yaml(tmp_path):
    text = "gpu: h100-sxm\ngpus_per_node: [8\nnvlink_domain_gpus: 8\n"
    with pytest.raises(InputError, match=r"malformed YAML at line \d+"):
        cluster_from_file(_write(tmp_path, text))


def test_user_cluster_not_a_mapping(tmp_path):
    with pytest.raises(InputError, match="mapping"):
        cluster_from_file(_write(tmp_path, "- gpu: h100-sxm\n"))


def test_user_cluster_missing_file(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        cluster_from_file(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "key, value",
    [
        ("nic_gb_per_s_per_gpu", "-25"),
        ("inter_node_latency_us", "-1"),
        ("intra_domain_latency_us", "-2.0"),
        ("gpus_per_node", "-8"),
        ("nvlink_domain_gpus", "-8"),
        ("nic_gb_per_s_per_gpu", "0"),
        ("gpus_per_node", "8.0"),
        ("nic_gb_per_s_per_gpu", "fast"),
        ("nic_gb_per_s_per_gpu", "true"),
    ],
)
def test_user_cluster_bad_numbers(tmp_path, key, value):
    lines = [line for line in _GOOD_CLUSTER.splitlines() if not line.startswith(f"{key}:")]
    text = "\n".join(lines + [f"{key}: {value}"]) + "\n"
    with pytest.raises(InputError, match=key):
        cluster_from_file(_write(tmp_path, text))


def test_user_cluster_negative_node_count_names_the_key(tmp_path):
    path = _write(tmp_path, _GOOD_CLUSTER.replace("num_nodes: 4", "num_nodes: -4"))
    with pytest.raises(InputError, match="num_nodes") as caught:
        cluster_from_file(path)
    assert "positive integer" in str(caught.value)


# -- yaml_schema helpers ------------------------------------------------------------------------
def test_parse_yaml():
    assert parse_yaml("a: 1\nb: [1, 2]\n", "x.yaml") == {"a": 1, "b": [1, 2]}
    with pytest.raises(InputError, match=r"x\.yaml: malformed YAML at line 2"):
        parse_yaml("a: 1\nb: c: d\n", "x.yaml")
    with pytest.raises(InputError, match="mapping"):
        parse_yaml("[1, 2]", "x.yaml")
    with pytest.raises(InputError, match="mapping"):
        parse_yaml("", "x.yaml")


def test_check_keys():
    entry = {"a": 1, "b": 2}
    assert check_keys(entry, "w", ("a",), ("b", "c")) is entry
    with pytest.raises(InputError, match="w: missing key.*c"):
        check_keys(entry, "w", ("a", "c"), ("b",))
    with pytest.raises(InputError, match=r"w: unknown key.*b.*allowed: a"):
        check_keys(entry, "w", ("a",))
    with pytest.raises(InputError, match="expected a mapping"):
        check_keys([1], "w", ())


def test_positive_number():
    assert positive_number(3, "w") == 3.0 and isinstance(positive_number(3, "w"), float)
    assert positive_number(0.5, "w") == 0.5
    for bad in (0, -1, -0.5, True, "3", None, float("nan")):
        with pytest.raises(InputError, match="w: expected a positive number"):
            positive_number(bad, "w")


def test_positive_int():
    assert positive_int(8, "w") == 8
    for bad in (0, -8, 8.0, True, "8", None):
        with pytest.raises(InputError, match="w: expected a positive integer"):
            positive_int(bad, "w")


def test_fraction():
    assert fraction(1, "w") == 1.0
    assert fraction(0.25, "w") == 0.25
    for bad in (0, 1.01, -0.1, False):
        with pytest.raises(InputError, match="w"):
            fraction(bad, "w")
