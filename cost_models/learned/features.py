"""Physically meaningful features for the learned models, and the analytical baseline they refine.

The learned models predict log(measured / analytical): the roofline carries the physics (FLOPs,
bytes, launch overhead), the regressor learns how this hardware departs from it by shape. The
analytical baseline is paraplan's own ``gemm_time_s`` on ``analytical_rates`` and
``collective_time_s`` / ``p2p_time_s`` on the built-in cluster of the same GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from paraplan.arrays import Column
from paraplan.cost_models.collectives import Collective, collective_time_s, p2p_time_s
from paraplan.cost_models.compute import (
    BYTES_PER_ELEMENT,
    ComputeRates,
    analytical_rates,
    flash_attention_time_s,
    gemm_time_s,
)
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec, builtin_cluster_names, load_cluster, load_gpu

GEMM_FEATURES = ("log_m", "log_n", "log_k", "log_flops", "log_bytes", "log_intensity", "log_roofline_s")
ATTENTION_FEATURES = ("log_causal_flops", "backward", "log_roofline_s")
COLLECTIVE_FEATURES = ("log_size", "group_size", "inter_domain", "devices_per_node", "pairwise_nvlink",
                       "log_analytical_s")
# 16-bit GEMMs share one tensor-core rate, so fp16 measurements serve bf16 jobs and back.
SIXTEEN_BIT = ("bf16", "fp16")
MeasuredCollective = Collective | Literal["send_recv"]
"""A collective the store holds timings of: the ones the cost model prices, and point-to-point sends."""


def baseline_rates(hardware: str, dtype: str) -> ComputeRates:
    """The analytical rates paraplan has for ``hardware`` (a GPU catalog name) and GEMM ``dtype``."""
    return analytical_rates(load_gpu(hardware), dtype)


def gemm_features(m: Column, n: Column, k: Column, rates: ComputeRates) -> np.ndarray:
    """Rows of GEMM_FEATURES for GEMMs (m, n, k) on the analytical ``rates``."""
    m, n, k = (np.asarray(x, dtype=float) for x in np.broadcast_arrays(m, n, k))
    flops = 2.0 * m * n * k
    num_bytes = rates.gemm_element_bytes * (m * k + k * n) + BYTES_PER_ELEMENT["bf16"] * m * n
    roofline = gemm_time_s(m, n, k, rates)
    return np.column_stack([np.log(m), np.log(n), np.log(k), np.log(flops), np.log(num_bytes),
                            np.log(flops / num_bytes), np.log(roofline)])


def attention_rates(hardware: str) -> ComputeRates:
    """The analytical rates of FlashAttention-2-class kernels (what SDPA and flash_attn run) on ``hardware``."""
    return analytical_rates(load_gpu(hardware), "bf16", "flash")


def attention_features(causal_flops: Column, backward: Column, rates: ComputeRates) -> np.ndarray:
    """Rows of ATTENTION_FEATURES: forward causal FLOPs, 1 for the backward pass, the analytical time."""
    flops, back = (np.asarray(x, dtype=float) for x in np.broadcast_arrays(causal_flops, backward))
    forward_s, backward_s = flash_attention_time_s(flops, dataclasses.replace(rates, attention_time_fn=None))
    return np.column_stack([np.log(flops), back, np.log(np.where(back > 0, backward_s, forward_s))])


def reference_cluster(hardware: str) -> ClusterSpec:
    """The first built-in cluster built from ``hardware`` (two nodes, so groups can cross them)."""
    for name in builtin_cluster_names():
        cluster = load_cluster(name, num_nodes=2)
        if cluster.gpu.name == hardware:
            return cluster
    raise InputError(f"no built-in cluster uses {hardware}; collective models need one for the baseline")


def collective_baseline_s(name: MeasuredCollective, size_bytes: Column, group_size: Column, devices_per_node: Column,
                          cluster: ClusterSpec) -> np.ndarray:
    """Analytical seconds; ``devices_per_node`` members of the group share one NVLink domain."""
    stride = cluster.domain_gpus / np.asarray(devices_per_node, dtype=float)
    if name == "send_recv":
        return p2p_time_s(size_bytes, group_size, stride, cluster)
    return collective_time_s(name, size_bytes, group_size, stride, cluster)


def collective_features(name: MeasuredCollective, size_bytes: Column, group_size: Column, devices_per_node: Column,
                        pairwise: Column, cluster: ClusterSpec) -> np.ndarray:
    """Rows of COLLECTIVE_FEATURES; ``pairwise`` is 1 where GPUs pair up over NVLink bridges
    instead of sharing an NVSwitch (vidur's ``*_pairwise_nvlink`` setups), else 0."""
    size, group, per_node, pairs = (np.asarray(x, dtype=float) for x in np.broadcast_arrays(
        size_bytes, group_size, devices_per_node, pairwise))
    baseline = collective_baseline_s(name, size, group, per_node, cluster)
    return np.column_stack([np.log(size), group, (per_node < group).astype(float), per_node, pairs, np.log(baseline)])
