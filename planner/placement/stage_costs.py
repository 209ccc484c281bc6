"""The stage-partition instance of a job and configuration, from the cost model's own terms:
layer_times (per-layer compute and TP/CP traffic), the estimate's embedding and output/loss times,
stored_layer_bytes (activations) and the engine recipe's state bytes per parameter.

The edge times are the estimate's own ``edge_times``, so placement and estimate share one cost model."""

from __future__ import annotations

import dataclasses

import numpy as np

from paraplan.cost_models.device_memory import (
    FRAGMENTATION_FRAC,
    non_torch_bytes,
    usable_capacity_bytes,
)
from paraplan.cost_models.estimate import default_rates, edge_times
from paraplan.cost_models.layer import layer_times
from paraplan.cost_models.memory import loss_logits_bytes, stored_layer_bytes
from paraplan.cost_models.stages import mtp_stage_params
from paraplan.hardware_profiles import ClusterSpec
from paraplan.planner.job import ParallelConfig, TrainingJob, configs_to_table
from paraplan.planner.placement.stage_partition import StageInstance


def usable_bytes(cluster: ClusterSpec, headroom_frac: float, config: ParallelConfig, allocator: str) -> float:
    """Live tensors a stage may hold: usable HBM less the headroom and what lives outside PyTorch,
    over the allocator's fragmentation share (the same terms memory_breakdown adds to its peak)."""
    outside = float(non_torch_bytes(config.tp, config.pp, config.dp, config.cp, config.ep))
    capacity = float(usable_capacity_bytes(cluster.gpu.hbm_bytes)) * (1.0 - headroom_frac)
    return (capacity - outside) / (1.0 + FRAGMENTATION_FRAC[allocator])


def stage_instance(job: TrainingJob, config: ParallelConfig, clusters: list[ClusterSpec],
                   reference: ClusterSpec | None = None) -> StageInstance:
    """One stage per entry of ``clusters`` (the GPU type that stage runs on; repeat one for a uniform
    pipeline). Layer times are priced on ``reference`` (default: the first) and each stage's time is
    scaled by its GPU's per-layer time over the reference's."""
    model, work = job.model, job.workload()
    reference = reference or clusters[0]
    per_layer_s, embed_s, output_s = _times(job, config, reference)
    scale = np.array([_times(job, config, c)[0] / per_layer_s for c in clusters])
    m = job.global_batch / (config.dp * config.mbs)
    stages = len(clusters)
    per_param = _state_bytes_per_param(job, config.zero, config.dp * config.cp)
    tokens = config.mbs * job.seq_len / config.cp
    # DeepSeek-V3 section 2.2: an MTP module (where the engine trains them) is one transformer layer plus a
    # projection, and it runs the shared output head again: a decoder layer here, the rest in output_s (edge_times).
    mtp_s = work.mtp_layers * per_layer_s
    tied_copy = model.vocab_size * model.hidden_size if model.tied_embeddings and stages > 1 else 0
    # An MTP module's routed experts shard over ep·etp like every MoE layer's; the rest over tp.
    mtp_routed, mtp_shared = mtp_stage_params(model, work.mtp_layers)
    expert_dp = max(1, config.tp * config.cp * config.dp // (config.ep * config.etp))
    last_bytes = (model.output_params() + tied_copy + mtp_shared) / config.tp * per_param \
        + mtp_routed / (config.ep * config.etp) * _state_bytes_per_param(job, config.zero, expert_dp)
    kinds = _layer_kinds(job, config, reference)
    is_moe = np.array([layer in set(model.moe_layers) for layer in range(model.num_layers)])
    return StageInstance(
        layer_time_s=np.where(is_moe, kinds["moe"][0], kinds["dense"][0]),
        layer_state_bytes=np.where(is_moe, kinds["moe"][1], kinds["dense"][1]),
        layer_activation_bytes=np.where(is_moe, kinds["moe"][2], kinds["dense"][2]),
        first_extra_s=embed_s, last_extra_s=output_s + mtp_s,
        first_extra_bytes=model.embedding_params() / config.tp * per_param,
        last_extra_bytes=last_bytes + float(loss_logits_bytes(model, work, tokens, config.tp)),
        # 1F1B (Narayanan et al. 2021, section 2.2): stage s holds pp − s micro-batches at its peak.
        in_flight=np.minimum(stages - np.arange(stages), m).astype(float),
        capacity_bytes=np.array([usable_bytes(c, job.memory_headroom_frac, config, work.allocator)
                                 for c in clusters]),
        time_scale=scale,
    )


def _state_bytes_per_param(job: TrainingJob, zero: int, group: int) -> float:
    weights, grads, optim = job.workload().recipe.sharded_bytes_per_param(zero, group)
    return float(weights + grads + optim)


def _layer_kinds(job: TrainingJob, config: ParallelConfig,
                 cluster: ClusterSpec) -> dict[str, tuple[float, float, float]]:
    """(time, state bytes, activation bytes) of a dense and of an MoE layer. The cost model prices the
    mean layer of a model; a model whose layers are all one kind prices that kind exactly."""
    model = job.model
    variants = {"dense": dataclasses.replace(model, moe_layers=())}
    variants["moe"] = dataclasses.replace(model, moe_layers=tuple(range(model.num_layers))) if model.is_moe \
        else variants["dense"]
    per_param = _state_bytes_per_param(job, config.zero, config.dp * config.cp)
    # Routed experts are sharded over ep·etp and their states over the expert data-parallel group
    # (the tp·cp·dp ranks of a stage divided by ep·etp).
    expert_dp = max(1, config.tp * config.cp * config.dp // (config.ep * config.etp))
    expert_per_param = _state_bytes_per_param(job, config.zero, expert_dp)
    kinds = {}
    for kind, variant in variants.items():
        variant_job = dataclasses.replace(job, model=variant)
        routed = variant.routed_params_per_layer_mean()
        states = variant.shared_params_per_layer_mean() / config.tp * per_param \
            + routed / (config.ep * config.etp) * expert_per_param
        activations = float(stored_layer_bytes(variant, variant_job.workload(), configs_to_table([config]))[0])
        kinds[kind] = (_times(variant_job, config, cluster)[0], states, activations)
    return kinds


def _times(job: TrainingJob, config: ParallelConfig, cluster: ClusterSpec) -> tuple[float, float, float]:
    """(one layer, embedding, output + loss) per micro-batch on ``cluster``, seconds."""
    work, table = job.workload(), configs_to_table([config])
    rates = default_rates(cluster, work)
    lt = layer_times(job.model, work, table, rates, cluster)
    layer = lt.forward_compute_s + lt.backward_compute_s + lt.recompute_s + lt.tp_comm_s + lt.cp_comm_s + lt.ep_comm_s
    tokens = config.mbs * job.seq_len / config.cp
    embed, output = edge_times(job.model, table, tokens, rates, work.mtp_layers)
    return float(layer[0]), float(np.asarray(embed).ravel()[0]), float(np.asarray(output).ravel()[0])
