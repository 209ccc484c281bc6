"""What the hardware is: GPU, node, link and cluster specs, loaded from a YAML catalog."""

from paraplan.hardware_profiles.catalog import (
    Catalog,
    builtin_catalog,
    builtin_cluster_names,
    cluster_from_file,
    cluster_names,
    gpu_names,
    load_cluster,
    load_gpu,
    quick_cluster,
)
from paraplan.hardware_profiles.specs import ClusterSpec, EfficiencySpec, GPUSpec

__all__ = [
    "Catalog",
    "ClusterSpec",
    "EfficiencySpec",
    "GPUSpec",
    "builtin_catalog",
    "builtin_cluster_names",
    "cluster_from_file",
    "cluster_names",
    "gpu_names",
    "load_cluster",
    "load_gpu",
    "quick_cluster",
]
