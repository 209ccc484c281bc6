"""What the hardware is: GPU, node, link and cluster specs, loaded from a YAML catalog."""

from paraplan.hardware_profiles.catalog import (
    builtin_cluster_names,
    cluster_from_file,
    gpu_names,
    load_cluster,
    load_gpu,
    quick_cluster,
)
from paraplan.hardware_profiles.specs import ClusterSpec, EfficiencySpec, GPUSpec

__all__ = [
    "ClusterSpec",
    "EfficiencySpec",
    "GPUSpec",
    "builtin_cluster_names",
    "cluster_from_file",
    "gpu_names",
    "load_cluster",
    "load_gpu",
    "quick_cluster",
]
