"""What ``models`` and ``hardware`` print, as JSON documents (``--json PATH|-``): plain data, SI units."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from paraplan.hardware_profiles import ClusterSpec, GPUSpec
from paraplan.model_specs.model_spec import ModelSpec
from paraplan.planner.plan import model_shape

SCHEMA_VERSION = 1


def model_document(spec: ModelSpec, seq_len: int | None = None) -> dict[str, Any]:
    """One model: its exact counts and every architecture field (the plan JSON's ``model.shape``)."""
    document: dict[str, Any] = {
        "name": spec.name, "model_type": spec.model_type, "params": spec.total_params(),
        "active_params": spec.active_params(), "moe": spec.is_moe, "shape": model_shape(spec),
    }
    if seq_len is not None:
        document["seq_len"] = seq_len
        flops = spec.model_flops_per_token(seq_len, "full")  # NaN: a feature paraplan does not price (shape lists it)
        document["model_flops_per_token"] = None if math.isnan(flops) else flops
    return document


def gpu_document(gpu: GPUSpec) -> dict[str, Any]:
    """One GPU: datasheet numbers (SI units), efficiency constants and the source of each."""
    return dataclasses.asdict(gpu)


def cluster_document(cluster: ClusterSpec, origin: str) -> dict[str, Any]:
    """One cluster type per node (its GPU by name; learned collective models are not part of a catalog entry)."""
    fields = {f.name: getattr(cluster, f.name) for f in dataclasses.fields(cluster)
              if f.name not in ("gpu", "collective_time_fn", "serving_kernels", "num_nodes")}
    return {**fields, "gpu": cluster.gpu.name, "origin": origin}
