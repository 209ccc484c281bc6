"""The cost model: step time, throughput, MFU and memory for every row of a candidate table.

Pipeline (Narayanan et al. 2021, section 2.2): with m micro-batches and per-micro-batch stage
times t_i, 1F1B takes m·max t_i + (Σ t_i − max t_i) and the interleaved schedule with v chunks
shrinks the fill/drain term to (Σ t_i − max t_i)/v. Uniform stages give (m + p − 1)·t.

Activation offload (Transformer Engine's double-buffered CPU offload under Megatron-core): the
copy of layer i to the host runs while layer i+1 computes its forward, and the prefetch of layer
i−1 while layer i computes its backward, so each offloaded layer exposes only the part of its
copy that outlasts one layer's forward, and again its backward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from paraplan.arrays import Column, IntColumn
from paraplan.cost_models.collectives import p2p_time_s
from paraplan.cost_models.compute import ComputeRates, analytical_rates, gemm_time_s, memory_bound_time_s
from paraplan.cost_models.device_memory import usable_capacity_bytes
from paraplan.cost_models.dp_sync import DataParallelTraffic, dp_exposed_from, dp_traffic
from paraplan.cost_models.fp8_recipes import with_fp8_recipe
from paraplan.cost_models.layer import ACTIVATION_BYTES, LayerTimes, layer_times, unpaired_microbatches
from paraplan.cost_models.memory import (
    LayerMemory,
    MemoryBreakdown,
    StateShares,
    expert_data_parallel,
    layer_memory,
    memory_breakdown,
    state_shares,
    trimmed_to_capacity,
)
from paraplan.cost_models.recipes import StateRecipe
from paraplan.cost_models.schedules import (
    RankWork,
    dual_bubble_ratio,
    is_bidirectional,
    rank_work,
    schedule_bubble_s,
)
from paraplan.cost_models.stages import stage_layout
from paraplan.cost_models.table import ConfigTable, DistinctIndex, Workload, distinct_rows, take_rows
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.run_factor import gpu_at_scale
from paraplan.model_specs.model_spec import ModelSpec

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Record = TypeVar("_Record", bound="DataclassInstance")
"""An estimate table or one of the dataclasses of per-row arrays it holds."""

# Adam step per parameter it updates: read fp32 weight, gradient, m, v (16 B), write weight,
# m, v (12 B) and the 16-bit compute copy (2 B).
ADAM_BYTES_PER_PARAM = 30.0
# Gradient clipping before it: the norm reads each fp32 gradient (4 B), the scaling reads and writes it (8 B);
# torch.nn.utils.clip_grad_norm_ scales unconditionally (no host sync). Measured on one H100 (torchtitan 0.2.2,
# fused AdamW, data/measured/torchtitan_step_split_h100.csv): clipping 1.50e9 fp32 gradients took 7.0 ms, 12 B at
# 2.6 TB/s; the Adam step 16.6 ms, 30 B at 2.7 TB/s.
CLIP_BYTES_PER_PARAM = 12.0
OPTIMIZER_BYTES_PER_PARAM = ADAM_BYTES_PER_PARAM + CLIP_BYTES_PER_PARAM
OPTIMIZER_KERNELS = 8  # multi-tensor-apply launches for clip-norm, Adam and the bf16 copy
# What a measured fused AdamW step moves (torch.optim.AdamW(fused=True): fp32 weight, gradient and both moments read,
# weight and moments written; measurements/profile_grids.ADAMW_BYTES_PER_PARAMETER). Where its table prices the
# update, clipping (CLIP_BYTES_PER_PARAM) runs at the step's measured bandwidth: torch.nn.utils.clip_grad_norm_ is
# torch._foreach_norm and torch._foreach_mul_, multi-tensor-apply kernels over the same tensors as the fused step
# (on the probe, data/measured/torchtitan_step_split_h100.csv: 1.50e9 parameters clipped in 7.0 ms, AdamW in 16.6 ms,
# 12/28 of it 7.1 ms). So does the 16-bit copy of the weights where the engine's recipe keeps one apart from the
# fp32 masters (Megatron, DeepSpeed: 2 B written); FSDP2 (torchtitan) holds fp32 weights and casts them in its
# all-gather, so its step writes none.
FUSED_ADAMW_BYTES_PER_PARAM = 28.0
FP32_BYTES = 4.0


@dataclass(frozen=True, slots=True)
class EstimateTable:
    """Predictions for every config row; the breakdown terms sum to ``step_time_s``."""

    step_time_s: np.ndarray
    compute_s: np.ndarray
    """Forward, backward and recompute kernels on the slowest stage, all micro-batches."""
    tp_comm_s: np.ndarray
    cp_comm_s: np.ndarray
    ep_comm_s: np.ndarray
    """Expert dispatch and combine all-to-alls (and etp gathers) on the slowest stage."""
    pp_comm_s: np.ndarray
    bubble_s: np.ndarray
    """Pipeline fill and drain."""
    dp_comm_s: np.ndarray
    """Data-parallel traffic not hidden under compute."""
    offload_s: np.ndarray
    """Activation copies to and from host memory not hidden under compute."""
    optimizer_s: np.ndarray
    num_microbatches: np.ndarray
    tokens_per_s: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    model_flops_per_s_per_gpu: np.ndarray
    mfu: np.ndarray
    """Model FLOPs (no recompute) per second over the dense peak of the job's GEMM precision."""
    hfu: np.ndarray
    """Executed FLOPs (with recompute) per second over the same peak."""
    memory: MemoryBreakdown
    fits: np.ndarray
    """Peak memory within the GPU's HBM."""
    cost_model: str
    """Which model produced the numbers."""


def edge_times(model: ModelSpec, t: ConfigTable, tokens: Column, rates: ComputeRates,
               mtp_layers: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per micro-batch: embedding (first stage) and output layer + loss (last stage). Each of ``mtp_layers``
    MTP modules (DeepSeek-V3 section 2.2) runs the shared output layer and a loss again on its own hidden states,
    after its 2h -> h projection (column-parallel over tp); its decoder layer is priced as one (stages.stage_layout)."""
    h, vocab = model.hidden_size, model.vocab_size
    embed = memory_bound_time_s(tokens * h * ACTIVATION_BYTES * 5, 2, rates)
    logits_gemm = 3.0 * gemm_time_s(tokens, vocab / t.tp, h, rates)
    # Loss on fp32 logits: upcast, softmax, gradient: about 4 passes of 4 bytes + 2 of 2 bytes.
    loss = memory_bound_time_s(tokens * vocab / t.tp * (4 * 4 + 2 * 2), 4, rates)
    projection = 3.0 * gemm_time_s(tokens, h / t.tp, 2 * h, rates) if mtp_layers else 0.0
    return embed, (1 + mtp_layers) * (logits_gemm + loss) + mtp_layers * projection


def offload_exposed_s(layer_bytes: Column, offload_layers: IntColumn, forward_s: Column, backward_s: Column,
                      cluster: ClusterSpec) -> np.ndarray:
    """Per micro-batch: the part of each offloaded layer's copy out (forward) and back (backward)
    that one layer's compute does not cover."""
    gpu = cluster.gpu
    copy_s = layer_bytes / (gpu.host_link_bytes_per_s * gpu.efficiency.host_link_frac)
    return offload_layers * (np.maximum(copy_s - forward_s, 0.0) + np.maximum(copy_s - backward_s, 0.0))


def interleaved_p2p_exposed_s(hop_s: np.ndarray, vpp: IntColumn, stage_forward_s: Column,
                              stage_backward_s: Column) -> np.ndarray:
    """Per micro-batch: the pipeline sends of an interleaved schedule that compute does not hide.

    A rank sends an activation after each of its vpp forward chunks and a gradient after each of its vpp
    backward chunks: vpp times the sends of 1F1B. Megatron posts them asynchronously
    (``overlap_p2p_comm``, on by default with virtual stages) and torchtitan's interleaved schedules do
    too, so each hop runs under the rank's next chunk; only what is longer than one chunk's compute
    (the stage's forward or backward over vpp) waits. Deep interleaving of thin chunks over a slow link
    pays here."""
    chunk_forward, chunk_backward = stage_forward_s / vpp, stage_backward_s / vpp
    return vpp * (np.maximum(hop_s - chunk_forward, 0.0) + np.maximum(hop_s - chunk_backward, 0.0))


def _pick(condition: np.ndarray, when_true: Column, when_false: Column) -> np.ndarray:
    """Per row, ``when_true`` where ``condition`` holds, else ``when_false``."""
    return np.where(condition, when_true, when_false)


def default_rates(cluster: ClusterSpec, work: Workload) -> ComputeRates:
    """The analytical rates of the job's GEMM dtype, fp8 recipe, attention kernel and kernel stack on the
    cluster's GPU."""
    gpu = gpu_at_scale(cluster.gpu, cluster.num_gpus)
    return _with_recipe(analytical_rates(gpu, work.precision, work.attention, work.kernel_stack), cluster, work)


def _with_recipe(rates: ComputeRates, cluster: ClusterSpec, work: Workload) -> ComputeRates:
    """``rates`` with the job's fp8 recipe applied (fp8_recipes.with_fp8_recipe)."""
    return with_fp8_recipe(rates, work.precision, work.fp8_recipe, cluster.gpu.architecture)


# Columns the per-layer terms read (layer.layer_times with moe.py and context_parallel.py, memory.stored_layer_bytes,
# edge_times, _recompute_flops_per_token): a search table holds millions of rows but few distinct combinations
# of these, so the terms are computed once per combination (table.distinct_rows).
LAYER_AXES = ("tp", "cp", "cp_comm", "ep", "etp", "mbs", "recompute", "sp", "tp_overlap", "ep_overlap", "pp_schedule")
# Rows priced together: the temporaries of a block (half a MB per column) stay in cache and are reused
# instead of each being a fresh, page-faulted array of the whole table.
ROWS_PER_BLOCK = 1 << 16
# Tables this small (paraplan evaluate, placement's candidates) price every term on every row: finding the
# distinct combinations would cost more than it saves.
FEW_ROWS = 2048


@dataclass(frozen=True, slots=True)
class LayerTerms:
    """What LAYER_AXES decide, per row: one layer's times and stored bytes, the edge stages' extras."""

    times: LayerTimes
    memory: LayerMemory
    """Activations one layer keeps per micro-batch, the loss's logits, transient buffers."""
    embed_s: np.ndarray
    output_s: np.ndarray
    recompute_flops_per_token: np.ndarray


def layer_terms(model: ModelSpec, work: Workload, t: ConfigTable, rates: ComputeRates,
                cluster: ClusterSpec) -> LayerTerms:
    """The LAYER_AXES terms of every row of ``t``."""
    tokens = t.mbs * work.seq_len / t.cp
    embed_s, output_s = edge_times(model, t, tokens, rates, work.mtp_layers)
    return LayerTerms(times=layer_times(model, work, t, rates, cluster), memory=layer_memory(model, work, t),
                      embed_s=embed_s, output_s=output_s,
                      recompute_flops_per_token=np.broadcast_to(_recompute_flops_per_token(model, work, t), (len(t),)))


# Columns the per-stage terms read: the schedule's per-rank work (stages.stage_layout, schedules.rank_work), the
# data-parallel collectives (dp_sync.dp_traffic) and the optimizer step; computed once per combination too.
STAGE_AXES = ("tp", "pp", "vpp", "pp_schedule", "ep", "etp", "dp", "cp", "zero", "recompute")


@dataclass(frozen=True, slots=True)
class StageTerms:
    """What STAGE_AXES decide, per row: the pipeline ranks' work and the data-parallel traffic of the busiest."""

    ranks: RankWork
    dense_traffic: DataParallelTraffic
    """Gradients and weights outside the routed experts, over dp·cp."""
    expert_traffic: DataParallelTraffic | None
    """Routed experts over their own data-parallel group (None for dense models)."""
    optimizer_s: np.ndarray
    shares: StateShares
    """Bytes per parameter of each state and the gathered buffers."""


def stage_terms(model: ModelSpec, cluster: ClusterSpec, work: Workload, t: ConfigTable,
                rates: ComputeRates) -> StageTerms:
    """The STAGE_AXES terms of every row of ``t``."""
    ranks = rank_work(model, stage_layout(model, t.tp, t.pp, t.vpp, t.ep * t.etp, work.pipeline_split,
                                          work.mtp_layers), t.tp, t.pp,
                      t.vpp, t.pp_schedule, t.ep * t.etp, work.pipeline_split)
    layout = ranks.layout
    stage_params = np.maximum(layout.first_params, layout.last_params)
    stage_layers = np.maximum(layout.first_layers, layout.last_layers)
    dense = dp_traffic(work, t, cluster, rates, stage_params, model.shared_params_per_layer_mean() / t.tp, stage_layers,
                       model.layer_param_tensors(), model.layer_vector_tensors())
    updated = stage_params / np.where(t.zero >= 1, t.dp * t.cp, 1)
    experts = None
    if model.is_moe:  # routed experts reduce over their own data-parallel group, ep·etp ranks apart
        edp = expert_data_parallel(t)
        expert_params = np.maximum(layout.first_expert_params, layout.last_expert_params)
        experts = dp_traffic(work, t, cluster, rates, expert_params,
                             model.routed_params_per_layer_mean() / (t.ep * t.etp), stage_layers,
                             model.layer_param_tensors(), model.layer_vector_tensors(), group=edp, stride=t.ep * t.etp)
        updated = updated + expert_params / np.where(t.zero >= 1, edp, 1)
    optimizer = optimizer_step_s(updated, rates, work.recipe)
    return StageTerms(ranks=ranks, dense_traffic=dense, expert_traffic=experts,
                      optimizer_s=np.array(np.broadcast_to(optimizer, (len(t),)), dtype=float),
                      shares=state_shares(model, work, t))


def optimizer_step_s(updated: Column, rates: ComputeRates, recipe: StateRecipe) -> np.ndarray:
    """Seconds of gradient clipping and the Adam step over ``updated`` parameters on one GPU: OPTIMIZER_BYTES_PER_PARAM
    through HBM, or, where a measured fused AdamW table covers the count (``rates.optimizer_table_fn``), its time
    scaled from its 28 bytes a parameter to the clipping's 12 and ``recipe``'s 16-bit weight copy (if it keeps one)."""
    analytical = memory_bound_time_s(updated * OPTIMIZER_BYTES_PER_PARAM, OPTIMIZER_KERNELS, rates)
    if rates.optimizer_table_fn is None:
        return analytical
    adamw, covered = rates.optimizer_table_fn(updated)
    copy_bytes = recipe.weight_bytes if recipe.weight_bytes < FP32_BYTES else 0.0
    measured = adamw * (FUSED_ADAMW_BYTES_PER_PARAM + CLIP_BYTES_PER_PARAM + copy_bytes) / FUSED_ADAMW_BYTES_PER_PARAM
    return np.where(covered, measured, analytical)


@dataclass(frozen=True, slots=True)
class SharedTerms:
    """What the rows of one table share, priced once: the LAYER_AXES and STAGE_AXES terms of each distinct
    combination (``layer_of_row`` and ``stage_of_row`` give each row's), or of every row of a table of at most
    FEW_ROWS rows (the indices then None), with the context they were priced in."""

    model: ModelSpec
    cluster: ClusterSpec
    work: Workload
    rates: ComputeRates
    """The rates priced with (the job's fp8 recipe applied)."""
    layers: LayerTerms
    layer_of_row: np.ndarray | None
    stages: StageTerms
    stage_of_row: np.ndarray | None
    stage_table: ConfigTable
    """The rows ``stages`` was priced on (int64 columns): one per distinct combination, or every row."""


@dataclass(frozen=True, slots=True)
class BlockMemory:
    """Consecutive rows of a priced table with their memory: what the fit decision reads, before any time."""

    table: ConfigTable
    """The rows, int64 columns."""
    layer_index: np.ndarray | slice
    """Each row's entry in SharedTerms.layers."""
    stage_index: np.ndarray | slice
    """Each row's entry in SharedTerms.stages."""
    layer: LayerMemory
    """The rows' SharedTerms.layers.memory."""
    ranks: RankWork
    """The rows' SharedTerms.stages.ranks."""
    shares: StateShares
    """The rows' SharedTerms.stages.shares."""
    memory: MemoryBreakdown


def widened(t: ConfigTable) -> ConfigTable:
    """``t`` with int64 columns, the integers the cost terms compute in (a search keeps its table in narrower
    ones); ``t`` itself where they already are."""
    columns = {field.name: getattr(t, field.name) for field in dataclasses.fields(t)}
    if all(np.asarray(column).dtype == np.int64 for column in columns.values()):
        return t
    return ConfigTable.from_columns(**columns)


def row_blocks(size: int, rows_per_block: int = ROWS_PER_BLOCK) -> list[slice]:
    """``range(size)`` as consecutive slices of at most ``rows_per_block`` rows (one empty slice when size is 0)."""
    return [slice(start, min(start + rows_per_block, size)) for start in range(0, size, rows_per_block)] \
        or [slice(0, 0)]


def shared_terms(model: ModelSpec, cluster: ClusterSpec, work: Workload, t: ConfigTable,
                 rates: ComputeRates | None = None, distinct: DistinctIndex | None = None) -> SharedTerms:
    """The :class:`SharedTerms` of ``t`` (int64 columns or narrower ones); ``distinct`` finds the rows' distinct
    combinations (table.distinct_rows)."""
    rates = _with_recipe(rates, cluster, work) if rates is not None else default_rates(cluster, work)
    if len(t) <= FEW_ROWS:  # nothing worth sharing: every term on every row, as the shared path gives it
        rows = widened(t)
        return SharedTerms(model=model, cluster=cluster, work=work, rates=rates,
                           layers=layer_terms(model, work, rows, rates, cluster), layer_of_row=None,
                           stages=stage_terms(model, cluster, work, rows, rates), stage_of_row=None, stage_table=rows)
    layer_rows, layer_of_row = distinct_rows(t, LAYER_AXES, distinct)
    stage_rows, stage_of_row = distinct_rows(t, STAGE_AXES, distinct)
    stage_rows = widened(stage_rows)
    return SharedTerms(model=model, cluster=cluster, work=work, rates=rates,
                       layers=layer_terms(model, work, widened(layer_rows), rates, cluster), layer_of_row=layer_of_row,
                       stages=stage_terms(model, cluster, work, stage_rows, rates), stage_of_row=stage_of_row,
                       stage_table=stage_rows)


def block_memory(shared: SharedTerms, t: ConfigTable, rows: slice | np.ndarray) -> BlockMemory:
    """The rows ``rows`` of ``t`` (the table ``shared`` was priced from; a slice or row indices) and their memory."""
    block = widened(t.take(rows))
    # Gathers by an intp index run twice as fast as by distinct_index's int32 codes: convert once per block.
    layer_index = rows if shared.layer_of_row is None else shared.layer_of_row[rows].astype(np.intp)
    stage_index = rows if shared.stage_of_row is None else shared.stage_of_row[rows].astype(np.intp)
    layer, ranks = take_rows(shared.layers.memory, layer_index), take_rows(shared.stages.ranks, stage_index)
    shares = take_rows(shared.stages.shares, stage_index)
    return BlockMemory(table=block, layer_index=layer_index, stage_index=stage_index, layer=layer, ranks=ranks,
                       shares=shares,
                       memory=_memory_rows(shared.model, shared.cluster, shared.work, block, layer, ranks, shares))


def block_estimates(shared: SharedTerms, block: BlockMemory, subset: np.ndarray | None = None) -> EstimateTable:
    """The estimates of ``block``'s rows, or of those at positions ``subset`` of it: elementwise arithmetic on the
    same values, so a row's numbers do not depend on which rows are priced beside it."""
    if subset is not None:
        block = BlockMemory(table=block.table.take(subset), layer_index=_positions(block.layer_index)[subset],
                            stage_index=_positions(block.stage_index)[subset], layer=take_rows(block.layer, subset),
                            ranks=take_rows(block.ranks, subset), shares=take_rows(block.shares, subset),
                            memory=take_rows(block.memory, subset))
    layers, stages, li, si = shared.layers, shared.stages, block.layer_index, block.stage_index
    experts = None if stages.expert_traffic is None else take_rows(stages.expert_traffic, si)
    layer_terms_at = LayerTerms(times=take_rows(layers.times, li), memory=block.layer, embed_s=_at(layers.embed_s, li),
                                output_s=_at(layers.output_s, li),
                                recompute_flops_per_token=_at(layers.recompute_flops_per_token, li))
    stage_terms_at = StageTerms(ranks=block.ranks, dense_traffic=take_rows(stages.dense_traffic, si),
                                expert_traffic=experts, optimizer_s=_at(stages.optimizer_s, si), shares=block.shares)
    return _estimate_rows(shared.model, shared.cluster, shared.work, block.table, shared.rates, layer_terms_at,
                          stage_terms_at, block.memory)


def _positions(index: np.ndarray | slice) -> np.ndarray:
    """A row index as an integer array (a block's slice as the positions it covers)."""
    return np.arange(index.start, index.stop) if isinstance(index, slice) else index


def _at(value: np.ndarray, index: np.ndarray | slice) -> np.ndarray:
    """One per-row term at ``index``, as table.take_rows takes it (a term left scalar stays as it is)."""
    return value[index] if value.ndim == 1 else value


def estimate(model: ModelSpec, cluster: ClusterSpec, work: Workload, t: ConfigTable,
             rates: ComputeRates | None = None) -> EstimateTable:
    """Predict every row of ``t``. Infeasible rows are still priced; ``fits`` says which fit."""
    shared = shared_terms(model, cluster, work, t, rates)
    blocks = row_blocks(len(t))
    first = block_estimates(shared, block_memory(shared, t, blocks[0]))
    if len(blocks) == 1:
        return first
    result = allocated_like(first, len(t))
    fill_rows(result, blocks[0], first)
    for rows in blocks[1:]:
        fill_rows(result, rows, block_estimates(shared, block_memory(shared, t, rows)))
    return result


def allocated_like(block: _Record, size: int) -> _Record:
    """``block`` (an estimate table or one of its dataclasses) with every per-row array as an empty one of ``size``
    rows, to fill block by block."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(block):
        value = getattr(block, field.name)
        if isinstance(value, np.ndarray):
            changes[field.name] = np.empty(size, dtype=value.dtype)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes[field.name] = allocated_like(value, size)
    return dataclasses.replace(block, **changes)


def fill_rows(whole: DataclassInstance, rows: np.ndarray | slice, block: DataclassInstance) -> None:
    """Write ``block``'s rows into ``whole`` (arrays of its own, from :func:`allocated_like`) at ``rows``."""
    for field in dataclasses.fields(whole):
        value = getattr(whole, field.name)
        if isinstance(value, np.ndarray):
            value[rows] = getattr(block, field.name)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            fill_rows(value, rows, getattr(block, field.name))


def _memory_rows(model: ModelSpec, cluster: ClusterSpec, work: Workload, t: ConfigTable, layer: LayerMemory,
                 ranks: RankWork, shares: StateShares) -> MemoryBreakdown:
    """Peak memory of the rows of ``t`` (their layers' ``layer``, pipeline ranks' ``ranks`` and state ``shares``),
    the allocator's cache trimmed to the GPU's usable capacity."""
    m = work.global_batch / (t.dp * t.mbs)
    return trimmed_to_capacity(memory_breakdown(model, work, t, ranks.layout, m, layer.per_layer_bytes, ranks, layer,
                                                shares),
                               usable_capacity_bytes(cluster.gpu.hbm_bytes))


def _estimate_rows(model: ModelSpec, cluster: ClusterSpec, work: Workload, t: ConfigTable, rates: ComputeRates,
                   layers: LayerTerms, stages: StageTerms, memory: MemoryBreakdown) -> EstimateTable:
    """Predict the rows of ``t`` whose per-layer and per-stage terms are ``layers`` and ``stages`` and whose memory
    is ``memory`` (:func:`_memory_rows`)."""
    m = work.global_batch / (t.dp * t.mbs)
    lt = layers.times
    pipeline = _pipeline_times(t, layers, stages.ranks, cluster)
    slowest = pipeline.slowest_s
    pp_comm = _pp_comm_s(model, cluster, work, t, lt, pipeline.critical_layers, m)
    ratio = dual_bubble_ratio(lt.forward_compute_s, lt.backward_compute_s + lt.recompute_s, lt.weight_grad_s)
    bubble = schedule_bubble_s(t.pp_schedule, t.pp, slowest, (pipeline.total_s - slowest) / t.vpp, ratio)

    dp_comm = dp_exposed_from(work, stages.dense_traffic, slowest, m)
    if stages.expert_traffic is not None:
        dp_comm = dp_comm + dp_exposed_from(work, stages.expert_traffic, slowest, m)
    optimizer = stages.optimizer_s

    tp_total = m * pipeline.critical_layers * lt.tp_comm_s
    cp_total = m * pipeline.critical_layers * lt.cp_comm_s
    ep_paired = m * pipeline.critical_layers * lt.ep_comm_s
    offload_total = m * pipeline.offload_s  # offload needs pp = 1: the only stage is the slowest
    compute_total = m * slowest - tp_total - cp_total - ep_paired - offload_total
    # The combined 1F1B schedule hides a micro-batch's expert all-to-alls under another's compute; the first rank's
    # warm-up forwards and cool-down backwards have no partner and wait for all of theirs (layer.unpaired_microbatches).
    ep_total = ep_paired + pipeline.critical_layers * unpaired_microbatches(t, m) * (lt.ep_comm_unpaired_s
                                                                                    - lt.ep_comm_s)
    step = compute_total + tp_total + cp_total + ep_total + offload_total + pp_comm + bubble + dp_comm + optimizer

    num_gpus = t.tp * t.pp * t.dp * t.cp
    tokens_per_s = work.global_batch * work.seq_len / step
    flops_per_token = model.model_flops_per_token(work.seq_len, work.flops_convention)
    recompute_per_token = layers.recompute_flops_per_token
    peak = cluster.gpu.peak(work.precision)
    per_gpu_flops = flops_per_token * tokens_per_s / num_gpus
    return EstimateTable(
        step_time_s=step, compute_s=compute_total, tp_comm_s=tp_total, cp_comm_s=cp_total, ep_comm_s=ep_total,
        pp_comm_s=pp_comm,
        bubble_s=bubble, dp_comm_s=dp_comm, offload_s=offload_total, optimizer_s=optimizer, num_microbatches=m,
        tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s / num_gpus,
        model_flops_per_s_per_gpu=per_gpu_flops, mfu=per_gpu_flops / peak,
        hfu=(flops_per_token + recompute_per_token) * tokens_per_s / num_gpus / peak,
        memory=memory, fits=(memory.required_bytes <= usable_capacity_bytes(cluster.gpu.hbm_bytes))
        & (memory.host_bytes <= cluster.host_memory_per_gpu),
        cost_model="; ".join(filter(None, (rates.source, cluster.collective_source))),
    )


@dataclass(frozen=True, slots=True)
class PipelineTimes:
    """Seconds per micro-batch of the pipeline ranks, per row (compute and the layers' exposed TP, CP and EP
    communication)."""

    slowest_s: np.ndarray
    """The slowest of the first, the last and the busiest middle rank."""
    total_s: np.ndarray
    """Summed over every rank: the first, the last and pp − 2 middle ranks (the one rank where pp = 1)."""
    critical_layers: np.ndarray
    """Decoder layers the slowest rank runs per micro-batch."""
    offload_s: np.ndarray
    """Exposed activation offload of the first rank (:func:`offload_exposed_s`; pp = 1 only)."""


def _pipeline_times(t: ConfigTable, layers: LayerTerms, ranks: RankWork, cluster: ClusterSpec) -> PipelineTimes:
    """The :class:`PipelineTimes` of every row: each rank runs its layers, its share of the embedding and of the
    output layer and loss (all of them where pp = 1), and the first rank its exposed offload."""
    lt, layout = layers.times, ranks.layout
    embed_s, output_s = layers.embed_s, layers.output_s
    layer_compute = lt.forward_compute_s + lt.backward_compute_s + lt.recompute_s
    offload = offload_exposed_s(layers.memory.per_layer_bytes, t.offload, lt.forward_compute_s, lt.backward_compute_s,
                                cluster)
    first_compute = layout.first_layers * layer_compute + ranks.embedding_on_first * embed_s \
        + ranks.output_on_first * output_s + offload
    last_compute = layout.last_layers * layer_compute + ranks.embedding_on_last * embed_s \
        + ranks.output_on_last * output_s
    middle_compute = layout.middle_layers * layer_compute
    single = t.pp == 1
    first_compute = _pick(single, first_compute + output_s, first_compute)
    comm_layer = lt.tp_comm_s + lt.cp_comm_s + lt.ep_comm_s
    first_t = first_compute + layout.first_layers * comm_layer
    last_t = _pick(single, first_t, last_compute + layout.last_layers * comm_layer)
    middle_t = _pick(t.pp >= 3, middle_compute + layout.middle_layers * comm_layer, 0.0)
    slowest = np.maximum(np.maximum(first_t, last_t), middle_t)
    total = _pick(single, first_t, first_t + last_t + np.maximum(t.pp - 2, 0) * middle_t)
    critical_layers = np.select([slowest == first_t, slowest == last_t], [layout.first_layers, layout.last_layers],
                                layout.middle_layers)
    return PipelineTimes(slowest_s=slowest, total_s=total, critical_layers=critical_layers, offload_s=offload)


def _pp_comm_s(model: ModelSpec, cluster: ClusterSpec, work: Workload, t: ConfigTable, lt: LayerTimes,
               critical_layers: np.ndarray, num_microbatches: Column) -> np.ndarray:
    """Seconds per step of pipeline sends the step waits for: a send and a receive of one micro-batch's
    activations per micro-batch under 1F1B (what compute does not hide of the interleaved schedule's; none under
    DualPipe's paired chunks, schedules.py), and the fill crossing pp − 1 boundaries twice. 0 where pp = 1."""
    tokens = t.mbs * work.seq_len / t.cp
    hop = p2p_time_s(tokens * model.hidden_size * ACTIVATION_BYTES / t.tp, t.pp, t.tp * t.cp * t.dp, cluster)
    interleaved = interleaved_p2p_exposed_s(hop, t.vpp, critical_layers * lt.forward_compute_s,
                                            critical_layers * (lt.backward_compute_s + lt.recompute_s))
    steady_p2p = _pick(is_bidirectional(t.pp_schedule), 0.0, _pick(t.vpp > 1, interleaved, 2.0 * hop)) \
        * num_microbatches
    return _pick(t.pp == 1, 0.0, steady_p2p + 2.0 * (t.pp - 1) * hop)


def _recompute_flops_per_token(model: ModelSpec, work: Workload, t: ConfigTable) -> np.ndarray:
    """FLOPs per token executed again in backward: a layer forward (full; without the down
    projection when recompute stops early), attention (selective), or MLA's up projections
    (modules; the norms and the expert activation it also reruns are not matrix FLOPs)."""
    attention = model.attention_core_flops_per_token(work.seq_len, work.flops_convention)
    skipped = 2.0 * model.hidden_size * model.ffn_size * model.num_dense_layers / model.num_layers \
        if work.recompute_stops_early else 0.0
    gemm = (model.num_dense_layers * model.layer_gemm_flops_per_token()
            + model.num_moe_layers * model.moe_layer_gemm_flops_per_token()) / model.num_layers
    full = gemm + attention - skipped
    mla_up = 2.0 * model.mla_up_projection_params()
    per_layer = np.select([t.recompute == 2, t.recompute == 1, t.recompute == 3], [full, attention, mla_up], 0.0)
    return model.num_layers * per_layer
