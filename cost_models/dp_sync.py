"""Exposed data-parallel communication per step: gradient reduction and weight gathering.

Gradients of a stage are bucketed and reduced while backward still runs (Megatron
``overlap_grad_reduce``, DDP buckets, FSDP per-layer hooks); only what outlasts the overlapping
compute, and at least the last bucket, is exposed. Weight all-gathers (distributed optimizer,
ZeRO-3/FSDP) are prefetched under forward compute the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.arrays import Column, IntColumn
from paraplan.cost_models.collectives import collective_latency_s, collective_time_s
from paraplan.cost_models.compute import ComputeRates, memory_bound_time_s
from paraplan.cost_models.table import ConfigTable, Workload
from paraplan.hardware_profiles import ClusterSpec

# Megatron's default DDP bucket: max(40M, 1M x dp) parameters (distributed.DistributedDataParallelConfig).
BUCKET_PARAMS = 40_000_000
# Share of a stage's per-micro-batch time that is backward (2 of the 3 GEMM passes).
BACKWARD_SHARE = 2.0 / 3.0


def _exposed(comm_s: np.ndarray, window_s: Column, last_bucket_frac: np.ndarray) -> np.ndarray:
    """Seconds of ``comm_s`` the step waits for: what outlasts the overlapping ``window_s``, and at least the
    last bucket's share."""
    return np.maximum(comm_s - window_s, comm_s * last_bucket_frac)


@dataclass(frozen=True, slots=True)
class DataParallelTraffic:
    """One stage's data-parallel collectives per row, before compute hides any of them (arrays over configs)."""

    reduce_s: np.ndarray
    """Gradient reduction of the stage: all-reduce, or reduce-scatter where ZeRO shards gradients or states."""
    gather_s: np.ndarray
    """All-gather of the stage's updated weights (distributed optimizer, ZeRO)."""
    microbatch_s: np.ndarray
    """Sharded weights: the gathers (and reductions) every micro-batch runs."""
    layer_gather_s: np.ndarray
    """Sharded weights: one layer's gather, which nothing hides."""
    bucket_frac: np.ndarray
    """The last gradient bucket's share of the stage, exposed whatever the overlap."""
    per_microbatch: np.ndarray
    """The weights are sharded and gathered every micro-batch."""
    reduce_every_microbatch: np.ndarray
    gathers_after_step: np.ndarray
    """Replicated weights: the distributed optimizer or ZeRO all-gathers the updated weights (ZeRO >= 1)."""
    active: np.ndarray
    """The group has more than one member."""


def dp_traffic(work: Workload, t: ConfigTable, cluster: ClusterSpec, rates: ComputeRates, params_per_gpu: Column,
               layer_params_per_gpu: Column, stage_layers: Column = 1, tensors_per_layer: int = 1,
               vectors_per_layer: int = 0, group: IntColumn | None = None,
               stride: IntColumn | None = None) -> DataParallelTraffic:
    """The collectives of :func:`dp_exposed_s`: everything that does not depend on the stage's compute time."""
    recipe = work.recipe
    # Gradients are reduced over data parallel x context parallel (CP ranks share weights);
    # with rank order tp-cp-dp-pp that group's members sit tp ranks apart.
    group = t.dp * t.cp if group is None else group
    stride = t.tp if stride is None else stride
    grad_bytes = params_per_gpu * recipe.grad_reduce_bytes
    reduce_s = np.where(
        t.zero >= 1,
        collective_time_s("reduce_scatter", grad_bytes, group, stride, cluster),
        collective_time_s("all_reduce", grad_bytes, group, stride, cluster),
    )
    gather_s = collective_time_s("all_gather", params_per_gpu * recipe.param_gather_bytes, group, stride, cluster)
    bucket_frac = np.minimum(1.0, BUCKET_PARAMS / np.maximum(params_per_gpu, 1.0))

    gathers = np.zeros(np.shape(t.zero), dtype=float)
    for stage, count in recipe.weight_gathers_per_microbatch.items():
        gathers = np.where(t.zero == stage, float(count), gathers)
    per_microbatch = gathers > 0
    if recipe.regathers_for_recompute:
        gathers = gathers + np.where(per_microbatch & (t.recompute == 2), 1.0, 0.0)
    per_layer = tensors_per_layer if recipe.gathers_per_tensor else 1
    collectives_per_gather = np.asarray(stage_layers, dtype=float) * per_layer
    # Seconds of one gather pass beyond its bandwidth term: each extra collective's
    # latency, plus (list-output gathers) one copy kernel per rank per collective and the bytes copied.
    latency_s = collective_latency_s("all_gather", group, stride, cluster)
    gather_overhead_s = (collectives_per_gather - 1) * latency_s
    if recipe.gathers_per_tensor and vectors_per_layer:
        # Per-tensor gathers of the layer's vectors (biases, norms: kilobytes) run on NCCL's LL protocol.
        vectors = np.asarray(stage_layers, dtype=float) * vectors_per_layer
        ll_latency_s = collective_latency_s("all_gather", group, stride, cluster, "ll")
        gather_overhead_s = gather_overhead_s - vectors * (latency_s - ll_latency_s)
    if recipe.gather_copies_per_rank:
        copies = collectives_per_gather * group
        gather_overhead_s = gather_overhead_s + memory_bound_time_s(
            2.0 * params_per_gpu * recipe.param_gather_bytes, copies, rates)
    every_mb_reduce = per_microbatch & recipe.reduce_every_microbatch
    # Sharded weights: every micro-batch gathers (and maybe reduces) layer by layer under compute.
    layer_gather_s = collective_time_s("all_gather", layer_params_per_gpu * recipe.param_gather_bytes,
                                       group, stride, cluster)
    mb_comm = gathers * (gather_s + gather_overhead_s) + np.where(every_mb_reduce, reduce_s, 0.0)
    shape = np.broadcast_shapes(np.shape(mb_comm), np.shape(group))
    return DataParallelTraffic(
        reduce_s=np.broadcast_to(reduce_s, shape), gather_s=np.broadcast_to(gather_s, shape),
        microbatch_s=np.broadcast_to(mb_comm, shape), layer_gather_s=np.broadcast_to(layer_gather_s, shape),
        bucket_frac=np.broadcast_to(bucket_frac, shape), per_microbatch=np.broadcast_to(per_microbatch, shape),
        reduce_every_microbatch=np.broadcast_to(every_mb_reduce, shape),
        gathers_after_step=np.broadcast_to(t.zero >= 1, shape), active=np.broadcast_to(np.asarray(group) > 1, shape))


def dp_exposed_from(work: Workload, traffic: DataParallelTraffic, stage_time_s: Column,
                    num_microbatches: Column) -> np.ndarray:
    """Seconds of ``traffic`` the step waits for, given the stage's time per micro-batch and the micro-batches."""
    backward_s = BACKWARD_SHARE * stage_time_s
    forward_s = stage_time_s - backward_s
    mb_comm, reduce_s, bucket_frac = traffic.microbatch_s, traffic.reduce_s, traffic.bucket_frac
    hidden = np.maximum(mb_comm - stage_time_s, 0.0) + traffic.layer_gather_s
    sharded = num_microbatches * (hidden if work.recipe.gathers_overlap_compute else mb_comm)
    sharded = sharded + np.where(traffic.reduce_every_microbatch, 0.0, _exposed(reduce_s, backward_s, bucket_frac))
    # Replicated weights: one reduction per step under the last backward; the distributed
    # optimizer (and ZeRO-2) then all-gather updated weights under the next forward.
    replicated = _exposed(reduce_s, backward_s, bucket_frac)
    replicated = replicated + np.where(traffic.gathers_after_step, _exposed(traffic.gather_s, forward_s, bucket_frac),
                                       0.0)
    return np.where(traffic.active, np.where(traffic.per_microbatch, sharded, replicated), 0.0)


def dp_exposed_s(work: Workload, t: ConfigTable, cluster: ClusterSpec, rates: ComputeRates, params_per_gpu: Column,
                 layer_params_per_gpu: Column, stage_time_s: Column, num_microbatches: Column,
                 stage_layers: Column = 1, tensors_per_layer: int = 1, vectors_per_layer: int = 0,
                 group: IntColumn | None = None, stride: IntColumn | None = None) -> np.ndarray:
    """Seconds of data-parallel traffic the step waits for (arrays over configs).

    ``stage_layers`` and ``tensors_per_layer`` count the separate all-gathers of sharded weights
    (one per layer, or one per parameter tensor when the engine gathers that way); each pays the
    collective's latency on top of the bandwidth term of the whole stage's bytes, the LL protocol's
    for the ``vectors_per_layer`` one-dimensional tensors among them. An engine that
    gathers into per-rank views also pays one copy kernel per rank of each gather, and the copy
    of the gathered bytes (read and write) through HBM. ``group`` and ``stride`` default to the
    dense parameters' data-parallel group; routed experts pass their own (edp, ep·etp apart).
    """
    traffic = dp_traffic(work, t, cluster, rates, params_per_gpu, layer_params_per_gpu, stage_layers,
                         tensors_per_layer, vectors_per_layer, group, stride)
    return dp_exposed_from(work, traffic, stage_time_s, num_microbatches)
