"""The built-in hardware catalog (gpus.yaml, clusters.yaml, efficiency.yaml) and user cluster files.

YAML keys carry their units (``hbm_gib``, ``nic_gb_per_s``); this module converts to SI once.
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from paraplan.errors import InputError
from paraplan.hardware_profiles import units
from paraplan.hardware_profiles.specs import (
    DTYPES,
    FLASH_FAMILY_KERNELS,
    KERNEL_STACKS,
    ClusterSpec,
    EfficiencySpec,
    GPUSpec,
)
from paraplan.hardware_profiles.yaml_schema import (
    check_keys,
    fraction,
    parse_yaml,
    positive_int,
    positive_number,
)

_GPU_KEYS = ("display_name", "vendor", "architecture", "dense_tflops", "hbm_gib", "hbm_tb_per_s",
             "nvlink_gb_per_s", "nic_gb_per_s", "host_link_gb_per_s", "host_memory_gib", "sources")
_GPU_SOURCES = ("dense_tflops", "hbm", "nvlink", "nic", "host")
_CLUSTER_KEYS = ("gpu", "gpus_per_node", "nvlink_domain_gpus", "nic_gb_per_s_per_gpu",
                 "inter_node_latency_us", "intra_domain_latency_us")
_CLUSTER_OPTIONAL = ("display_name", "oversubscription", "host_memory_gib_per_gpu", "sources")
_EFFICIENCY_KEYS = ("gemm_peak_frac", "stack_gemm_peak_frac", "gemm_half_dim", "attention_peak_frac", "hbm_frac",
                    "nvlink_frac", "nic_frac", "host_link_frac", "kernel_overhead_us", "source")

# Fabric latencies for the quick form (--gpu NAME --gpus N): typical NCCL small-message
# latencies, the same values the built-in DGX clusters use (see clusters.yaml for sources).
_QUICK_INTER_NODE_LATENCY_US = 5.0
_QUICK_INTRA_DOMAIN_LATENCY_US = 2.0


def _package_yaml(file_name: str) -> dict[str, Any]:
    text = resources.files("paraplan.hardware_profiles").joinpath(file_name).read_text()
    return parse_yaml(text, file_name)


def _unknown_name(kind: str, name: str, known: list[str]) -> InputError:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return InputError(f"unknown {kind} {name!r}{hint} (known: {', '.join(known)})")


def _efficiency(entry: dict[str, Any], where: str) -> EfficiencySpec:
    check_keys(entry, where, _EFFICIENCY_KEYS)
    gemm = check_keys(entry["gemm_peak_frac"], f"{where}.gemm_peak_frac", (), DTYPES)
    attention = check_keys(entry["attention_peak_frac"], f"{where}.attention_peak_frac", FLASH_FAMILY_KERNELS)
    stacks = check_keys(entry["stack_gemm_peak_frac"], f"{where}.stack_gemm_peak_frac", (), KERNEL_STACKS)
    stack_fracs = {
        stack: {d: fraction(v, f"{where}.stack_gemm_peak_frac.{stack}.{d}")
                for d, v in check_keys(table, f"{where}.stack_gemm_peak_frac.{stack}", (), DTYPES).items()}
        for stack, table in stacks.items()
    }
    return EfficiencySpec(
        gemm_peak_frac={d: fraction(v, f"{where}.gemm_peak_frac.{d}") for d, v in gemm.items()},
        stack_gemm_peak_frac=stack_fracs,
        gemm_half_dim=positive_number(entry["gemm_half_dim"], f"{where}.gemm_half_dim"),
        attention_peak_frac={k: fraction(v, f"{where}.attention_peak_frac.{k}") for k, v in attention.items()},
        hbm_frac=fraction(entry["hbm_frac"], f"{where}.hbm_frac"),
        nvlink_frac=fraction(entry["nvlink_frac"], f"{where}.nvlink_frac"),
        nic_frac=fraction(entry["nic_frac"], f"{where}.nic_frac"),
        host_link_frac=fraction(entry["host_link_frac"], f"{where}.host_link_frac"),
        kernel_overhead_s=positive_number(entry["kernel_overhead_us"], f"{where}.kernel_overhead_us")
        * units.SECONDS_PER_US,
        source=str(entry["source"]),
    )


@cache
def _efficiencies() -> dict[str, EfficiencySpec]:
    data = check_keys(_package_yaml("efficiency.yaml"), "efficiency.yaml", ("schema_version", "defaults", "gpus"))
    defaults = data["defaults"]
    table = {"*": _efficiency(defaults, "efficiency.yaml:defaults")}
    for name, override in data["gpus"].items():
        check_keys(override, f"efficiency.yaml:{name}", ("source",), _EFFICIENCY_KEYS)
        merged = {**defaults, **override}
        for nested in ("gemm_peak_frac", "attention_peak_frac"):
            merged[nested] = {**defaults[nested], **override.get(nested, {})}
        table[name] = _efficiency(merged, f"efficiency.yaml:{name}")
    return table


def _gpu(name: str, entry: dict[str, Any]) -> GPUSpec:
    where = f"gpus.yaml:{name}"
    check_keys(entry, where, _GPU_KEYS, ("price_usd_per_gpu_hour",))
    peaks = check_keys(entry["dense_tflops"], f"{where}.dense_tflops", ("bf16", "fp16"), ("fp8", "fp4", "tf32"))
    need_sources = _GPU_SOURCES + (("price",) if "price_usd_per_gpu_hour" in entry else ())
    sources = check_keys(entry["sources"], f"{where}.sources", need_sources, ("price",))
    price = entry.get("price_usd_per_gpu_hour")
    efficiency = _efficiencies()
    return GPUSpec(
        name=name,
        display_name=str(entry["display_name"]),
        vendor=str(entry["vendor"]),
        architecture=str(entry["architecture"]),
        peak_flops_per_s={
            d: positive_number(v, f"{where}.dense_tflops.{d}") * units.FLOPS_PER_TFLOP for d, v in peaks.items()
        },
        hbm_bytes=positive_number(entry["hbm_gib"], f"{where}.hbm_gib") * units.BYTES_PER_GIB,
        hbm_bytes_per_s=positive_number(entry["hbm_tb_per_s"], f"{where}.hbm_tb_per_s") * units.BYTES_PER_TB,
        nvlink_bytes_per_s=positive_number(entry["nvlink_gb_per_s"], f"{where}.nvlink_gb_per_s")
        * units.BYTES_PER_GB,
        nic_bytes_per_s=positive_number(entry["nic_gb_per_s"], f"{where}.nic_gb_per_s") * units.BYTES_PER_GB,
        host_link_bytes_per_s=positive_number(entry["host_link_gb_per_s"], f"{where}.host_link_gb_per_s")
        * units.BYTES_PER_GB,
        host_memory_bytes=positive_number(entry["host_memory_gib"], f"{where}.host_memory_gib") * units.BYTES_PER_GIB,
        price_usd_per_gpu_hour=None if price is None else positive_number(price, f"{where}.price_usd_per_gpu_hour"),
        efficiency=efficiency.get(name, efficiency["*"]),
        sources={k: str(v) for k, v in sources.items()},
    )


@cache
def _gpu_table() -> dict[str, GPUSpec]:
    data = check_keys(_package_yaml("gpus.yaml"), "gpus.yaml", ("schema_version", "gpus"))
    return {name: _gpu(name, entry) for name, entry in data["gpus"].items()}


@cache
def _cluster_entries() -> dict[str, dict[str, Any]]:
    data = check_keys(_package_yaml("clusters.yaml"), "clusters.yaml", ("schema_version", "clusters"))
    return dict(data["clusters"])


def gpu_names() -> list[str]:
    """Catalog names of every built-in GPU."""
    return sorted(_gpu_table())


def load_gpu(name: str) -> GPUSpec:
    """The built-in GPU called ``name``; InputError with the closest names if unknown."""
    table = _gpu_table()
    if name not in table:
        raise _unknown_name("GPU", name, sorted(table))
    return table[name]


def builtin_cluster_names() -> list[str]:
    """Names of the built-in cluster types (any node count)."""
    return sorted(_cluster_entries())


def _cluster(name: str, entry: dict[str, Any], where: str, num_nodes: int) -> ClusterSpec:
    check_keys(entry, where, _CLUSTER_KEYS, _CLUSTER_OPTIONAL)
    gpu = load_gpu(str(entry["gpu"]))
    try:
        return ClusterSpec(
            name=name,
            gpu=gpu,
            num_nodes=num_nodes,
            gpus_per_node=positive_int(entry["gpus_per_node"], f"{where}.gpus_per_node"),
            nvlink_domain_gpus=positive_int(entry["nvlink_domain_gpus"], f"{where}.nvlink_domain_gpus"),
            nic_bytes_per_s_per_gpu=positive_number(entry["nic_gb_per_s_per_gpu"], f"{where}.nic_gb_per_s_per_gpu")
            * units.BYTES_PER_GB,
            inter_node_latency_s=positive_number(entry["inter_node_latency_us"], f"{where}.inter_node_latency_us")
            * units.SECONDS_PER_US,
            intra_domain_latency_s=positive_number(
                entry["intra_domain_latency_us"], f"{where}.intra_domain_latency_us"
            ) * units.SECONDS_PER_US,
            oversubscription=positive_number(entry.get("oversubscription", 1.0), f"{where}.oversubscription"),
            host_memory_bytes_per_gpu=None if "host_memory_gib_per_gpu" not in entry else positive_number(
                entry["host_memory_gib_per_gpu"], f"{where}.host_memory_gib_per_gpu") * units.BYTES_PER_GIB,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _node_count(where: str, gpus_per_node: int, num_nodes: int | None, num_gpus: int | None) -> int:
    if num_nodes is not None and num_gpus is not None:
        raise InputError(f"{where}: give the node count or the GPU count, not both")
    if num_gpus is not None:
        positive_int(num_gpus, f"{where}: --gpus")
        if num_gpus % gpus_per_node:
            raise InputError(
                f"{where}: {num_gpus} GPUs is not a whole number of {gpus_per_node}-GPU nodes; "
                f"use a multiple of {gpus_per_node}"
            )
        return num_gpus // gpus_per_node
    if num_nodes is None:
        raise InputError(f"{where}: say how big the cluster is with --nodes N or --gpus N")
    return positive_int(num_nodes, f"{where}: --nodes")


def load_cluster(name: str, *, num_nodes: int | None = None, num_gpus: int | None = None) -> ClusterSpec:
    """A built-in cluster type sized by node count or GPU count."""
    entries = _cluster_entries()
    if name not in entries:
        raise _unknown_name("cluster", name, sorted(entries))
    entry = entries[name]
    nodes = _node_count(name, int(entry["gpus_per_node"]), num_nodes, num_gpus)
    return _cluster(name, entry, f"clusters.yaml:{name}", nodes)


def quick_cluster(gpu_name: str, num_gpus: int, gpus_per_node: int = 8) -> ClusterSpec:
    """The ``--gpu NAME --gpus N [--gpus-per-node 8]`` form: one NVLink domain per node."""
    gpu = load_gpu(gpu_name)
    positive_int(gpus_per_node, "--gpus-per-node")
    per_node = min(gpus_per_node, num_gpus)
    nodes = _node_count(f"{gpu_name}x{num_gpus}", per_node, None, num_gpus)
    return ClusterSpec(
        name=f"{gpu_name}x{num_gpus}",
        gpu=gpu,
        num_nodes=nodes,
        gpus_per_node=per_node,
        nvlink_domain_gpus=per_node,
        nic_bytes_per_s_per_gpu=gpu.nic_bytes_per_s,
        inter_node_latency_s=_QUICK_INTER_NODE_LATENCY_US * units.SECONDS_PER_US,
        intra_domain_latency_s=_QUICK_INTRA_DOMAIN_LATENCY_US * units.SECONDS_PER_US,
    )


def cluster_from_file(path: Path, *, num_nodes: int | None = None, num_gpus: int | None = None) -> ClusterSpec:
    """A user cluster file: the keys of a clusters.yaml entry plus an optional ``num_nodes``."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read cluster file {path}: {exc.strerror}") from None
    entry = parse_yaml(text, str(path))
    file_nodes = entry.pop("num_nodes", None)
    entry.pop("name", None)
    if num_nodes is None and num_gpus is None and file_nodes is not None:
        num_nodes = positive_int(file_nodes, f"{path}: num_nodes")
    nodes = _node_count(str(path), positive_int(entry.get("gpus_per_node", 0) or 0, f"{path}: gpus_per_node")
                        if "gpus_per_node" in entry else 1, num_nodes, num_gpus)
    return _cluster(Path(path).stem, entry, str(path), nodes)


def with_nic(cluster: ClusterSpec, nic_bytes_per_s_per_gpu: float) -> ClusterSpec:
    """The same cluster with another scale-out bandwidth per GPU (a site's real fabric)."""
    return replace(cluster, nic_bytes_per_s_per_gpu=nic_bytes_per_s_per_gpu)
