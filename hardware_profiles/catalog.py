"""The hardware catalog (gpus.yaml, clusters.yaml, efficiency.yaml), user cluster files, and the
:class:`Catalog` that merges a user hardware file (see user_file.py) beside the built-in entries.

YAML keys carry their units (``hbm_gib``, ``nic_gb_per_s``); this module converts to SI once.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from paraplan.errors import MAX_MESSAGE_CHARS, InputError
from paraplan.files import listed, one_line, read_user_yaml, shown
from paraplan.hardware_profiles import units
from paraplan.hardware_profiles.device_names import device_candidates, device_match, looks_like_device_name
from paraplan.hardware_profiles.specs import (
    ASSUMED,
    BUILTIN,
    DEFAULTED,
    DTYPES,
    FITTED,
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
    text,
)
from paraplan.limits import MAX_GPUS, MAX_GPUS_PER_NODE

_GPU_KEYS = ("display_name", "vendor", "architecture", "dense_tflops", "hbm_gib", "hbm_tb_per_s",
             "nvlink_gb_per_s", "nic_gb_per_s", "host_link_gb_per_s", "host_memory_gib", "sources")
_GPU_SOURCES = ("dense_tflops", "hbm", "nvlink", "nic", "host")
_GPU_OPTIONAL = {"price_usd_per_gpu_hour": "price", "board_power_w": "power"}
"""Optional GPU keys and the ``sources`` key each one then needs."""
# Plausibility ceilings, about 10x above the largest part in gpus.yaml (GB300: 15,000 dense fp4 TFLOP/s,
# 279 GiB, 8 TB/s, 900 GB/s NVLink, 100 GB/s NIC; GB200: 1,200 W board power): a value beyond them is a unit
# slip (MB/s for GB/s, sparse for dense, a node's total for a GPU's, kW for W), not a GPU.
_GPU_CEILINGS = {"dense_tflops": 200_000.0, "hbm_gib": 4096.0, "hbm_tb_per_s": 100.0, "nvlink_gb_per_s": 20_000.0,
                 "nic_gb_per_s": 2000.0, "host_link_gb_per_s": 10_000.0, "host_memory_gib": 65_536.0,
                 "price_usd_per_gpu_hour": 1000.0, "board_power_w": 15_000.0}
_CLUSTER_KEYS = ("gpu", "gpus_per_node", "nvlink_domain_gpus", "nic_gb_per_s_per_gpu",
                 "inter_node_latency_us", "intra_domain_latency_us")
_CLUSTER_OPTIONAL = ("display_name", "oversubscription", "host_memory_gib_per_gpu", "sources")
_MAX_GPUS_PER_NODE = 1024
_MAX_DOMAIN_GPUS = 100_000
_MAX_LATENCY_US = 10_000.0  # 10 ms per message is a misconfigured fabric, not a latency
_MAX_OVERSUBSCRIPTION = 1000.0
_EFFICIENCY_KEYS = ("gemm_peak_frac", "stack_gemm_peak_frac", "gemm_half_dim", "attention_peak_frac", "hbm_frac",
                    "nvlink_frac", "nic_frac", "host_link_frac", "kernel_overhead_us", "source")
_ORIGIN_KEYS = ("borrowed_from", "assumed")
"""Keys of a GPU entry in efficiency.yaml that say where its fractions come from rather than set one: the GPU whose
fitted constants it copies, and the paths of fractions it sets without a fit."""
DEFAULT_EFFICIENCY = "defaults"
"""``efficiency_from`` of a GPU that uses efficiency.yaml's defaults."""

# Fabric latencies for the quick form (--gpu NAME --gpus N): typical NCCL small-message
# latencies, the same values the built-in DGX clusters use (see clusters.yaml for sources).
_QUICK_INTER_NODE_LATENCY_US = 5.0
_QUICK_INTRA_DOMAIN_LATENCY_US = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    """The GPUs and cluster types a command may name: the built-in catalog, plus a user hardware file's."""

    gpus: dict[str, GPUSpec]
    """Every GPU by catalog name."""
    clusters: dict[str, dict[str, Any]]
    """Every cluster type's validated entry (the clusters.yaml keys) by name; sized when loaded."""
    cluster_origins: dict[str, str]
    """Where each cluster type comes from: ``built-in`` or the user hardware file's path."""
    user_file: str | None = None
    """The user hardware file merged in, if any."""

    def gpu(self, name: str) -> GPUSpec:
        """The GPU called ``name`` (a catalog name, or the product name a driver prints: "NVIDIA H100 80GB
        HBM3"); InputError with the closest names if unknown, or the candidates if ambiguous."""
        if name not in self.gpus and looks_like_device_name(name):
            matched, resolved = device_match(name)
            if resolved in self.gpus:
                return self.gpus[resolved]
            if matched:
                raise InputError(f"GPU {shown(name, 60)} is a product the catalog does not hold "
                                 f"({listed(sorted(self.gpus), 80)}); describe it in a hardware file "
                                 "(--hardware FILE, see docs/hardware.md)")
            candidates = [c for c in device_candidates(name) if c in self.gpus]
            if candidates:
                raise InputError(f"GPU {shown(name, 60)} could be any of {listed(candidates, 80)}; give the "
                                 "catalog name (the product string with its memory size or form factor also works)")
        if name not in self.gpus:
            raise _unknown_name("GPU", name, sorted(self.gpus), self.user_file)
        return self.gpus[name]

    def cluster(self, name: str, *, num_nodes: int | None = None, num_gpus: int | None = None) -> ClusterSpec:
        """The cluster type called ``name`` sized by node count or GPU count."""
        if name not in self.clusters:
            raise _unknown_name("cluster", name, sorted(self.clusters), self.user_file)
        entry, origin = self.clusters[name], self.cluster_origins[name]
        nodes = _node_count(name, int(entry["gpus_per_node"]), num_nodes, num_gpus)
        where = f"clusters.yaml:{name}" if origin == BUILTIN else f"{origin}: clusters.{one_line(name, 32)}"
        try:
            return cluster_from_entry(name, entry, where, nodes, self)
        except InputError as exc:
            raise fitted(exc) from None


def _package_yaml(file_name: str) -> dict[str, Any]:
    text = resources.files("paraplan.hardware_profiles").joinpath(file_name).read_text()
    return parse_yaml(text, file_name)


def fitted(exc: InputError) -> InputError:
    """``exc``, or its message cut to MAX_MESSAGE_CHARS where a file, an entry's name and a nested key left the
    problem too little room (InputError has already shortened its paths)."""
    text = str(exc)
    return exc if len(text) <= MAX_MESSAGE_CHARS else InputError(one_line(text, MAX_MESSAGE_CHARS))


def _unknown_name(kind: str, name: str, known: list[str], user_file: str | None = None) -> InputError:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    more = "" if user_file else "; add your own with --hardware FILE"
    if close:
        close = [one_line(c, 32) for c in close]  # a user file's names run to 64 characters
        return InputError(f"unknown {kind} {shown(name, 40)}; did you mean {' or '.join(close)}? (see 'paraplan "
                          f"hardware list'){more}")
    # Kept short (about 190 characters): callers prefix the file and the key, and the line stays under 300.
    return InputError(f"unknown {kind} {shown(name, 40)} ({listed(known, 50)}: 'paraplan hardware list'){more}")


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
def _efficiency_file() -> dict[str, Any]:
    return check_keys(_package_yaml("efficiency.yaml"), "efficiency.yaml", ("schema_version", "defaults", "gpus"),
                      ("architecture_bases",))


def _fraction_paths(entry: dict[str, Any]) -> list[str]:
    """The efficiency.yaml paths of every GEMM and attention fraction ``entry`` sets."""
    return ([f"gemm_peak_frac.{d}" for d in entry.get("gemm_peak_frac", {})]
            + [f"stack_gemm_peak_frac.{stack}.{d}" for stack, table in entry.get("stack_gemm_peak_frac", {}).items()
               for d in table]
            + [f"attention_peak_frac.{k}" for k in entry.get("attention_peak_frac", {})])


def _fraction_at(spec: EfficiencySpec, path: str) -> float:
    """The value of the fraction at efficiency.yaml ``path`` (NaN where ``spec`` has none)."""
    field_name, *keys = path.split(".")
    value: Any = getattr(spec, field_name)
    for key in keys:
        value = value.get(key, float("nan"))
    return float(value)


def _origins(name: str, override: dict[str, Any], spec: EfficiencySpec,
             table: dict[str, EfficiencySpec]) -> dict[str, str]:
    """Where each fraction of efficiency.yaml entry ``name`` comes from; InputError where ``borrowed_from`` names no
    earlier entry or the entry's fractions differ from it, or ``assumed`` lists a fraction the entry does not set."""
    where, own = f"efficiency.yaml:{name}", _fraction_paths(override)
    origins = dict.fromkeys(_fraction_paths(_efficiency_file()["defaults"]), DEFAULTED)
    if "borrowed_from" in override:
        base = text(override["borrowed_from"], f"{where}.borrowed_from")
        if base not in table or base == "*":
            raise InputError(f"{where}.borrowed_from: {shown(base, 40)} is not a GPU entry above it")
        changed = [path for path in own if _fraction_at(spec, path) != _fraction_at(table[base], path)]
        if changed:
            raise InputError(f"{where}: {changed[0]} differs from {base}'s, so it is not borrowed from it")
        lent = table[base].borrowed_as(base)
        return origins | {path: lent.origin(path) for path in own}
    assumed = override.get("assumed", [])
    if not isinstance(assumed, list) or not set(assumed) <= set(own):
        raise InputError(f"{where}.assumed: expected a list of fractions the entry sets ({listed(own, 80)})")
    return origins | {path: ASSUMED if path in assumed else FITTED for path in own}


@cache
def _efficiencies() -> dict[str, EfficiencySpec]:
    data = _efficiency_file()
    defaults = data["defaults"]
    table = {"*": _efficiency(defaults, "efficiency.yaml:defaults")}
    for name, override in data["gpus"].items():
        check_keys(override, f"efficiency.yaml:{name}", ("source",), _EFFICIENCY_KEYS + _ORIGIN_KEYS)
        merged = {**defaults, **{k: v for k, v in override.items() if k not in _ORIGIN_KEYS}}
        for nested in ("gemm_peak_frac", "attention_peak_frac"):
            merged[nested] = {**defaults[nested], **override.get(nested, {})}
        spec = _efficiency(merged, f"efficiency.yaml:{name}")
        table[name] = replace(spec, fraction_origin=_origins(name, override, spec, table))
    return table


def architecture_bases() -> dict[str, str]:
    """Architecture -> the built-in GPU whose efficiency constants a user GPU of it borrows by default."""
    return dict(_efficiency_file().get("architecture_bases", {}))


def efficiency_of(name: str) -> tuple[EfficiencySpec, str]:
    """The efficiency constants the built-in GPU ``name`` uses and whose they are (its name or ``defaults``)."""
    table = _efficiencies()
    return (table[name], name) if name in table else (table["*"], DEFAULT_EFFICIENCY)


def default_efficiency() -> EfficiencySpec:
    """efficiency.yaml's defaults."""
    return _efficiencies()["*"]


def gpu_from_entry(name: str, entry: dict[str, Any], where: str, *, efficiency: EfficiencySpec,
                   efficiency_from: str, origin: str = BUILTIN, extra_keys: tuple[str, ...] = ()) -> GPUSpec:
    """A GPUSpec from one gpus.yaml-style entry (keys with units), converted to SI; InputError naming
    ``where`` and the key for anything missing, unknown, of the wrong type or out of range."""
    check_keys(entry, where, _GPU_KEYS, (*_GPU_OPTIONAL, *extra_keys))
    peaks = check_keys(entry["dense_tflops"], f"{where}.dense_tflops", ("bf16", "fp16"), ("fp8", "fp4", "tf32"))
    # An optional number needs its source: a price with its date, a board power with its datasheet.
    need_sources = _GPU_SOURCES + tuple(source for key, source in _GPU_OPTIONAL.items() if key in entry)
    sources = check_keys(entry["sources"], f"{where}.sources", need_sources, tuple(_GPU_OPTIONAL.values()))
    price, power = entry.get("price_usd_per_gpu_hour"), entry.get("board_power_w")

    def number(key: str, scale: float) -> float:
        return positive_number(entry[key], f"{where}.{key}", _GPU_CEILINGS[key]) * scale

    return GPUSpec(
        name=name,
        display_name=text(entry["display_name"], f"{where}.display_name"),
        vendor=text(entry["vendor"], f"{where}.vendor"),
        architecture=text(entry["architecture"], f"{where}.architecture"),
        peak_flops_per_s={
            str(d): positive_number(v, f"{where}.dense_tflops.{d}", _GPU_CEILINGS["dense_tflops"])
            * units.FLOPS_PER_TFLOP for d, v in peaks.items()
        },
        hbm_bytes=number("hbm_gib", units.BYTES_PER_GIB),
        hbm_bytes_per_s=number("hbm_tb_per_s", units.BYTES_PER_TB),
        nvlink_bytes_per_s=number("nvlink_gb_per_s", units.BYTES_PER_GB),
        nic_bytes_per_s=number("nic_gb_per_s", units.BYTES_PER_GB),
        host_link_bytes_per_s=number("host_link_gb_per_s", units.BYTES_PER_GB),
        host_memory_bytes=number("host_memory_gib", units.BYTES_PER_GIB),
        price_usd_per_gpu_hour=None if price is None else number("price_usd_per_gpu_hour", 1.0),
        board_power_w=None if power is None else number("board_power_w", 1.0),
        efficiency=efficiency,
        efficiency_from=efficiency_from,
        sources={str(k): text(v, f"{where}.sources.{k}") for k, v in sources.items()},
        origin=origin,
    )


@cache
def _gpu_table() -> dict[str, GPUSpec]:
    data = check_keys(_package_yaml("gpus.yaml"), "gpus.yaml", ("schema_version", "gpus"))
    table = {}
    for name, entry in data["gpus"].items():
        efficiency, efficiency_from = efficiency_of(name)
        table[name] = gpu_from_entry(name, entry, f"gpus.yaml:{name}", efficiency=efficiency,
                                     efficiency_from=efficiency_from)
    return table


@cache
def _cluster_entries() -> dict[str, dict[str, Any]]:
    data = check_keys(_package_yaml("clusters.yaml"), "clusters.yaml", ("schema_version", "clusters"))
    return dict(data["clusters"])


@cache
def builtin_catalog() -> Catalog:
    """The catalog shipped with paraplan (gpus.yaml, clusters.yaml, efficiency.yaml)."""
    clusters = _cluster_entries()
    return Catalog(gpus=_gpu_table(), clusters=clusters, cluster_origins=dict.fromkeys(clusters, BUILTIN))


def gpu_names(catalog: Catalog | None = None) -> list[str]:
    """Catalog names of every GPU (built-in only unless a ``catalog`` with user entries is given)."""
    return sorted((catalog or builtin_catalog()).gpus)


def load_gpu(name: str, catalog: Catalog | None = None) -> GPUSpec:
    """The GPU called ``name``; InputError with the closest names if unknown."""
    return (catalog or builtin_catalog()).gpu(name)


def builtin_cluster_names() -> list[str]:
    """Names of the built-in cluster types (any node count)."""
    return sorted(_cluster_entries())


def cluster_names(catalog: Catalog | None = None) -> list[str]:
    """Names of every cluster type of ``catalog`` (default: the built-in ones)."""
    return sorted((catalog or builtin_catalog()).clusters)


def cluster_from_entry(name: str, entry: dict[str, Any], where: str, num_nodes: int,
                       catalog: Catalog | None = None) -> ClusterSpec:
    """A ClusterSpec from one clusters.yaml-style entry; its ``gpu`` is looked up in ``catalog``."""
    check_keys(entry, where, _CLUSTER_KEYS, _CLUSTER_OPTIONAL)
    gpu_name = text(entry["gpu"], f"{where}.gpu")
    try:
        gpu = load_gpu(gpu_name, catalog)
    except InputError as exc:
        raise InputError(f"{where}.gpu: {exc}") from None
    if "display_name" in entry:
        text(entry["display_name"], f"{where}.display_name")
    try:
        return ClusterSpec(
            name=name,
            gpu=gpu,
            num_nodes=num_nodes,
            gpus_per_node=positive_int(entry["gpus_per_node"], f"{where}.gpus_per_node", _MAX_GPUS_PER_NODE),
            nvlink_domain_gpus=positive_int(entry["nvlink_domain_gpus"], f"{where}.nvlink_domain_gpus",
                                            _MAX_DOMAIN_GPUS),
            nic_bytes_per_s_per_gpu=positive_number(entry["nic_gb_per_s_per_gpu"], f"{where}.nic_gb_per_s_per_gpu",
                                                    _GPU_CEILINGS["nic_gb_per_s"]) * units.BYTES_PER_GB,
            inter_node_latency_s=positive_number(entry["inter_node_latency_us"], f"{where}.inter_node_latency_us",
                                                 _MAX_LATENCY_US) * units.SECONDS_PER_US,
            intra_domain_latency_s=positive_number(
                entry["intra_domain_latency_us"], f"{where}.intra_domain_latency_us", _MAX_LATENCY_US
            ) * units.SECONDS_PER_US,
            oversubscription=positive_number(entry.get("oversubscription", 1.0), f"{where}.oversubscription",
                                             _MAX_OVERSUBSCRIPTION),
            host_memory_bytes_per_gpu=None if "host_memory_gib_per_gpu" not in entry else positive_number(
                entry["host_memory_gib_per_gpu"], f"{where}.host_memory_gib_per_gpu", _GPU_CEILINGS["host_memory_gib"]
            ) * units.BYTES_PER_GIB,
        )
    except ValueError as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{where}: {exc}") from None


def _node_count(where: str, gpus_per_node: int, num_nodes: int | None, num_gpus: int | None) -> int:
    if num_nodes is not None and num_gpus is not None:
        raise InputError(f"{where}: give the node count or the GPU count, not both")
    if num_gpus is not None:
        positive_int(num_gpus, f"{where}: --gpus", MAX_GPUS)
        if num_gpus % gpus_per_node:
            raise InputError(
                f"{where}: {num_gpus} GPUs is not a whole number of {gpus_per_node}-GPU nodes; "
                f"use a multiple of {gpus_per_node}"
            )
        return num_gpus // gpus_per_node
    if num_nodes is None:
        raise InputError(f"{where}: say how big the cluster is with --nodes N or --gpus N")
    return positive_int(num_nodes, f"{where}: --nodes", MAX_GPUS // gpus_per_node)


def load_cluster(name: str, *, num_nodes: int | None = None, num_gpus: int | None = None,
                 catalog: Catalog | None = None) -> ClusterSpec:
    """A cluster type of ``catalog`` (default: built-in) sized by node count or GPU count."""
    return (catalog or builtin_catalog()).cluster(name, num_nodes=num_nodes, num_gpus=num_gpus)


def quick_cluster(gpu_name: str, num_gpus: int, gpus_per_node: int = 8, *,
                  catalog: Catalog | None = None) -> ClusterSpec:
    """The ``--gpu NAME --gpus N [--gpus-per-node 8]`` form: one NVLink domain per node."""
    gpu = load_gpu(gpu_name, catalog)
    positive_int(gpus_per_node, "--gpus-per-node", MAX_GPUS_PER_NODE)
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


def cluster_from_file(path: Path, *, num_nodes: int | None = None, num_gpus: int | None = None,
                      catalog: Catalog | None = None) -> ClusterSpec:
    """A user cluster file: the keys of a clusters.yaml entry plus an optional ``num_nodes``."""
    entry = read_user_yaml(Path(path), "cluster file")
    file_nodes = entry.pop("num_nodes", None)
    entry.pop("name", None)
    if num_nodes is None and num_gpus is None and file_nodes is not None:
        num_nodes = positive_int(file_nodes, f"{path}: num_nodes", MAX_GPUS)
    per_node = positive_int(entry["gpus_per_node"], f"{path}: gpus_per_node", MAX_GPUS_PER_NODE) \
        if "gpus_per_node" in entry else 1
    nodes = _node_count(str(path), per_node, num_nodes, num_gpus)
    return cluster_from_entry(Path(path).stem, entry, str(path), nodes, catalog)


def with_nic(cluster: ClusterSpec, nic_bytes_per_s_per_gpu: float) -> ClusterSpec:
    """The same cluster with another scale-out bandwidth per GPU (a site's real fabric)."""
    return replace(cluster, nic_bytes_per_s_per_gpu=nic_bytes_per_s_per_gpu)
