"""Per-chunk times of a plan's pipeline, re-priced with the cost model, for drawing its schedule.

A plan file keeps the step's breakdown but not each pipeline rank's forward and backward time per micro-batch.
This module prices them again from the plan's job, cluster and configuration with the same per-layer terms
``cost_models.estimate`` sums (``layer_terms``, ``edge_times``, the p2p hop), chunk by chunk along
``placement.stage_layers``. The slowest rank's per-micro-batch total times the micro-batch count is then the
plan's compute + TP + CP + EP + offload terms; where it is not (a learned or calibrated model scaled the step,
routing statistics the file does not keep), :func:`plan_chunk_times` scales every chunk to the plan's total
and says by how much.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from paraplan.choices import PipelineSchedule
from paraplan.cost_models.collectives import p2p_time_s
from paraplan.cost_models.estimate import LayerTerms, default_rates, layer_terms, offload_exposed_s
from paraplan.cost_models.layer import ACTIVATION_BYTES
from paraplan.cost_models.table import ConfigTable
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec, quick_cluster
from paraplan.planner.job import ParallelConfig, TrainingJob, configs_to_table
from paraplan.planner.plan import model_from_shape

OUTPUT_FORWARD_FRAC = 1.0 / 3.0
"""Share of the output layer + loss time drawn in the forward: edge_times prices the logits GEMM as 3 GEMMs
(one forward, two backward), so a third of it runs in the forward."""
RELATIVE_MATCH = 1e-6  # re-priced and stored totals closer than this need no scaling (float sums)
_STEP_TERMS = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "offload_s")  # what chunks add up to


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkTimes:
    """Seconds per micro-batch of each model chunk (model order) and where each chunk runs."""

    forward_s: np.ndarray
    """Forward compute of the chunk's layers (plus the embedding on the first, a third of the output on the last)."""
    backward_s: np.ndarray
    """Backward compute (plus two thirds of the output layer and loss on the last chunk)."""
    recompute_s: np.ndarray
    """Forward work run again before the backward (activation recomputation)."""
    comm_s: np.ndarray
    """Exposed TP, CP and EP collectives and offload copies of the chunk, forward and backward together."""
    rank_of_chunk: tuple[int, ...]
    """Pipeline rank that runs each chunk."""
    hop_s: float
    """One activation (or gradient) send between neighbouring pipeline ranks."""
    num_microbatches: int
    """Micro-batches per step on each data-parallel rank."""
    schedule: PipelineSchedule
    """The plan's pipeline schedule: 1f1b (interleaved when several chunks per rank), dualpipe or dualpipev."""
    scale_frac: float
    """Factor applied to every re-priced time to match the plan's own total (1.0 = matched as priced)."""

    @property
    def pp(self) -> int:
        """Pipeline ranks."""
        return max(self.rank_of_chunk) + 1


def chunk_ranks(schedule: PipelineSchedule, pp: int, num_chunks: int) -> tuple[int, ...]:
    """Pipeline rank of each chunk in model order: k mod pp (1F1B, interleaved); the V of DualPipeV (rank r holds
    chunks r and 2pp − 1 − r); DualPipe's chunks are one copy's stages, rank k (its mirror copy runs the other way)."""
    if schedule == "dualpipev":
        return tuple(k if k < pp else 2 * pp - 1 - k for k in range(num_chunks))
    return tuple(k % pp for k in range(num_chunks))


def _job_and_cluster(document: dict[str, Any]) -> tuple[TrainingJob, ClusterSpec, ParallelConfig, list[int]]:
    """The job, cluster, configuration and chunk layers of a schema-valid plan document."""
    job, cluster, model = document["job"], document["cluster"], document["model"]
    try:
        config = ParallelConfig(**document["config"])
        training = TrainingJob(
            model=model_from_shape(model["name"], model["shape"]), seq_len=job["seq_len"],
            global_batch=job["global_batch"], precision=job["precision"], engine=job["engine"],
            attention=job["attention"], flops_convention=job.get("flops_convention", "full"),
            fp8_recipe=job.get("fp8_recipe", "tensorwise"), capacity_factor=job.get("capacity_factor"),
            dispatcher=job.get("dispatcher", "auto"), compiled=job.get("compiled", False),
            async_tp=job.get("async_tp", False))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"plan job or config: {exc}") from None
    spec = quick_cluster(cluster["gpu"], cluster["num_gpus"], cluster["gpus_per_node"])
    layers = document["placement"].get("stage_layers") or [training.model.num_layers]
    return training, spec, config, list(layers)


def repriced_chunk_times(document: dict[str, Any]) -> ChunkTimes:
    """The chunk times of one plan document as the analytical cost model prices them (no scaling)."""
    job, cluster, config, layers = _job_and_cluster(document)
    work, table = job.workload(), configs_to_table([config])
    rates = default_rates(cluster, work)
    terms = layer_terms(job.model, work, table, rates, cluster)
    lt = terms.times
    counts = np.asarray(layers, dtype=float)
    first, last = np.arange(len(layers)) == 0, np.arange(len(layers)) == len(layers) - 1
    output = float(terms.output_s[0])
    comm = float(lt.tp_comm_s[0] + lt.cp_comm_s[0] + lt.ep_comm_s[0])
    tokens = config.mbs * job.seq_len / config.cp
    hop = p2p_time_s(tokens * job.model.hidden_size * ACTIVATION_BYTES / config.tp, config.pp,
                     config.tp * config.cp * config.dp, cluster)
    return ChunkTimes(
        forward_s=counts * float(lt.forward_compute_s[0]) + first * float(terms.embed_s[0])
        + last * OUTPUT_FORWARD_FRAC * output,
        backward_s=counts * float(lt.backward_compute_s[0]) + last * (1.0 - OUTPUT_FORWARD_FRAC) * output,
        recompute_s=counts * float(lt.recompute_s[0]), comm_s=counts * comm + first * _offload_s(table, terms, cluster),
        rank_of_chunk=chunk_ranks(config.pp_schedule, config.pp, len(layers)), hop_s=float(np.asarray(hop).ravel()[0]),
        num_microbatches=job.global_batch // (config.dp * config.mbs), schedule=config.pp_schedule, scale_frac=1.0)


def _offload_s(table: ConfigTable, terms: LayerTerms, cluster: ClusterSpec) -> float:
    """Exposed activation offload per micro-batch (pp = 1 only, so all on the one chunk): estimate's own term."""
    lt = terms.times
    exposed = offload_exposed_s(terms.memory.per_layer_bytes, table.offload, lt.forward_compute_s,
                                lt.backward_compute_s, cluster)
    return float(np.asarray(exposed).ravel()[0])


def rank_totals_s(times: ChunkTimes) -> np.ndarray:
    """Seconds per micro-batch on each pipeline rank: every chunk it runs, all phases. DualPipe's rank runs one
    copy's stage for half the micro-batches and the mirror stage for the other half, so both halves average."""
    per_chunk = times.forward_s + times.backward_s + times.recompute_s + times.comm_s
    totals = np.zeros(times.pp)
    np.add.at(totals, np.asarray(times.rank_of_chunk), per_chunk)
    if times.schedule == "dualpipe":
        totals = (totals + totals[::-1]) / 2.0
    return totals


def plan_chunk_times(document: dict[str, Any]) -> ChunkTimes:
    """The chunk times of a plan document, scaled so the slowest rank's time per micro-batch times the micro-batch
    count equals the plan's compute + TP + CP + EP + offload seconds."""
    try:
        times = repriced_chunk_times(document)
    except InputError as exc:
        raise InputError(f"cannot re-price the plan's pipeline stages: {exc}") from None
    breakdown = document["estimate"]["step_time_breakdown_s"]
    stored = sum(breakdown.get(name, 0.0) for name in _STEP_TERMS) / times.num_microbatches
    repriced = float(rank_totals_s(times).max())
    scale = stored / repriced if repriced > 0 else 1.0
    if abs(scale - 1.0) <= RELATIVE_MATCH:
        return times
    return replace(times, forward_s=times.forward_s * scale, backward_s=times.backward_s * scale,
                   recompute_s=times.recompute_s * scale, comm_s=times.comm_s * scale, scale_frac=scale)
