"""Screening rows before their times are priced: each row's memory requirement (the fit decision) and a lower bound
on its step time, so that a search keeping only its best rows times just the rows that fit and could still rank.

The bound, seconds per step. :func:`estimate._estimate_rows` sums a step as

    m·slowest + (ep_total − ep_paired) + pp_comm + bubble + dp_comm + optimizer

(m micro-batches; compute_total is m·slowest less the communication terms added back). Every term after the first is
≥ 0 (sends, 1F1B's bubble (Σ rank times − slowest)/vpp, exposed data-parallel traffic, the optimizer step) except
the expert term, critical_layers·unpaired·(U − E), with U and E one layer's unpaired and exposed expert seconds,
critical_layers at most the most layers any rank runs (``any_rank_layers``) and 0 ≤ unpaired ≤ max(m, 1)
(layer.unpaired_microbatches). Each rank's time per micro-batch is its layers times P, one layer's compute and
exposed TP, CP and EP communication, plus non-negative edge and offload terms (estimate._pipeline_times), so
slowest ≥ L·P with L the most layers of the ranks the row has (the last rank where pp > 1, the middle where pp ≥ 3).
Hence

    step ≥ m·L·P + max(m, 1)·any_rank_layers·min(0, U − E).

DualPipe schedules' bubble scales a ratio that may be negative (schedules.dual_bubble_ratio): their rows, and any row
whose P is negative or not a number, get NaN, no bound.

The memory floor, bytes. MemoryBreakdown.required_bytes is min(reserved + outside, allocated + largest + outside)
≥ allocated + outside: the allocator reserves at least what is allocated (memory.reserved_bytes scales it by
1 + fragmentation, late gradients only add) and the largest tensor is ≥ 0. The allocated peak is at least each rank's
live tensors at its activation peak (the first rank's, and the last's, which is the first's where pp = 1), and
those are at least the rank's weights and optimizer states (gradients, activations, transient buffers and logits are
≥ 0). Weights, optimizer states and the CUDA context and NCCL buffers (``outside``) depend on the stage axes alone, so
the floor is one number per distinct stage combination.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.cost_models.estimate import SharedTerms, widened
from paraplan.cost_models.memory import (
    RankHoldings,
    grads_held_frac,
    holdings_by_stage,
    rank_holdings,
    required_and_host_bytes,
)
from paraplan.cost_models.table import ConfigTable, take_rows


@dataclass(frozen=True, slots=True)
class ScreenedRows:
    """Rows of a priced table with what the fit decision reads."""

    table: ConfigTable
    """The rows, int64 columns."""
    layer_index: np.ndarray | slice
    """Each row's entry in SharedTerms.layers."""
    stage_index: np.ndarray | slice
    """Each row's entry in SharedTerms.stages."""
    required_bytes: np.ndarray
    """MemoryBreakdown.required_bytes of each row."""
    host_bytes: np.ndarray
    """MemoryBreakdown.host_bytes of each row."""


def stage_holdings(shared: SharedTerms) -> RankHoldings | None:
    """What each pipeline rank of each distinct stage combination of ``shared`` holds besides activations, logits and
    the working set (memory.rank_holdings), where the stage axes alone decide it (memory.holdings_by_stage); None
    where a row's micro-batch count does too. Gathered per row, these are the numbers the rows' own columns give."""
    if not holdings_by_stage(shared.work):
        return None
    stages, t = shared.stages, shared.stage_table
    num_microbatches = shared.work.global_batch / (t.dp * t.mbs)  # the representative rows': read by nothing here
    return rank_holdings(shared.model, shared.work, t, stages.ranks.layout, num_microbatches, stages.ranks,
                         stages.shares, grads_held_frac(shared.work, t, num_microbatches))


def screen_rows(shared: SharedTerms, t: ConfigTable, rows: slice | np.ndarray,
                holdings: RankHoldings | None = None) -> ScreenedRows:
    """The rows ``rows`` of ``t`` (the table ``shared`` was priced from; a slice or row indices) and their memory
    requirement, gathered and computed as estimate.block_memory does, so the numbers are the breakdown's.
    ``holdings``: :func:`stage_holdings` of ``shared``, gathered instead of worked out row by row (None: row by
    row)."""
    block = widened(t.take(rows))
    layer_index = rows if shared.layer_of_row is None else shared.layer_of_row[rows].astype(np.intp)
    stage_index = rows if shared.stage_of_row is None else shared.stage_of_row[rows].astype(np.intp)
    num_microbatches = shared.work.global_batch / (block.dp * block.mbs)
    stages = shared.stages
    if holdings is None:
        ranks, shares = take_rows(stages.ranks, stage_index), take_rows(stages.shares, stage_index)
        held = rank_holdings(shared.model, shared.work, block, ranks.layout, num_microbatches, ranks, shares,
                             grads_held_frac(shared.work, block, num_microbatches))
    else:
        held = take_rows(holdings, stage_index)
    required, host = required_and_host_bytes(shared.work, block, num_microbatches,
                                             take_rows(shared.layers.memory, layer_index), held,
                                             stages.shares.non_torch_bytes[stage_index])
    return ScreenedRows(table=block, layer_index=layer_index, stage_index=stage_index, required_bytes=required,
                        host_bytes=host)


def stage_memory_floor_bytes(shared: SharedTerms) -> np.ndarray:
    """Per distinct stage combination of ``shared``: a floor under the memory any of its rows requires (module
    docstring)."""
    shares, layout = shared.stages.shares, shared.stages.ranks.layout

    def states(params: np.ndarray, expert_params: np.ndarray) -> np.ndarray:
        return params * (shares.weights_frac + shares.optimizer_frac) \
            + expert_params * (shares.expert_weights_frac + shares.expert_optimizer_frac)
    return shares.non_torch_bytes + np.maximum(states(layout.first_params, layout.first_expert_params),
                                               states(layout.last_params, layout.last_expert_params))


@dataclass(frozen=True, slots=True)
class LayerBoundTerms:
    """The per-layer factors of the step-time bound (module docstring), once per distinct layer combination of a
    SharedTerms (NaN where a combination gets no bound)."""

    layer_s: np.ndarray
    """P: one layer's compute and exposed TP, CP and EP communication per micro-batch."""
    expert_s: np.ndarray
    """min(0, U − E): what pairing a layer's expert all-to-alls can give back at most, per unpaired micro-batch."""


def layer_bound_terms(shared: SharedTerms) -> LayerBoundTerms:
    """The :class:`LayerBoundTerms` of ``shared``."""
    times = shared.layers.times
    size = (len(shared.layers.memory.per_layer_bytes),)
    per_layer = times.forward_compute_s + times.backward_compute_s + times.recompute_s + times.tp_comm_s \
        + times.cp_comm_s + times.ep_comm_s
    return LayerBoundTerms(layer_s=np.broadcast_to(np.where(per_layer >= 0, per_layer, np.nan), size),
                           expert_s=np.broadcast_to(np.minimum(times.ep_comm_unpaired_s - times.ep_comm_s, 0.0), size))


def step_lower_bound_s(shared: SharedTerms, terms: LayerBoundTerms, rows: ScreenedRows,
                       positions: np.ndarray) -> np.ndarray:
    """A lower bound on the step seconds (before any step-time factor) of the rows at ``positions`` of ``rows``
    (module docstring); NaN where there is none."""
    layer, stage = _positions(rows.layer_index)[positions], _positions(rows.stage_index)[positions]
    layout = shared.stages.ranks.layout
    first, middle, last = (_at(layers, stage) for layers in (layout.first_layers, layout.middle_layers,
                                                             layout.last_layers))
    t = rows.table
    pp = t.pp[positions]
    slowest_rank = np.maximum(np.maximum(first, np.where(pp > 1, last, 0.0)), np.where(pp >= 3, middle, 0.0))
    any_rank = np.maximum(np.maximum(first, last), middle)
    m = shared.work.global_batch / (t.dp[positions] * t.mbs[positions])
    bound = m * slowest_rank * terms.layer_s[layer] + np.maximum(m, 1.0) * any_rank * terms.expert_s[layer]
    return np.where(t.pp_schedule[positions] > 0, np.nan, bound)


def _positions(index: np.ndarray | slice) -> np.ndarray:
    """A row index as an integer array (a slice as the positions it covers)."""
    return np.arange(index.start, index.stop) if isinstance(index, slice) else index


def _at(value: np.ndarray, index: np.ndarray) -> np.ndarray:
    """One per-combination term at ``index`` (a term left scalar broadcast to the index)."""
    return value[index] if np.ndim(value) == 1 else np.broadcast_to(value, index.shape)
