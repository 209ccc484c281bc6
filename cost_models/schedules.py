"""Bidirectional pipeline schedules: DualPipe and its V-shaped cut, DualPipeV.

DualPipe (DeepSeek-V3 report, arXiv 2412.19437, section 3.2.1 and Table 2; github deepseek-ai/DualPipe):
pp ranks run two copies of a pp-stage pipeline in opposite directions, rank r holding stage r of one copy and
stage pp − 1 − r of the other, and half the micro-batches enter from each end. In the steady state each rank
runs a forward chunk of one micro-batch and a backward chunk of another together ("F&B"), so the expert
all-to-alls and the pipeline sends of one run under the compute of the other. Per rank, against 1F1B:

  bubble       (pp/2 − 1)(F&B + B − 3W)   instead of (pp − 1)(F + B)
  parameters   2x (two stages)              activations pp + 1 micro-batches' worth (1F1B: pp)

with F, B and W the forward, full backward and weight-gradient time of one stage and one micro-batch.
DualPipeV (the DualPipe repository's V-shaped variant; torch.distributed.pipelining.ScheduleDualPipeV, which
torchtitan runs) cuts the model into 2·pp chunks and gives rank r chunks r and 2·pp − 1 − r: one copy of the
model (1x parameters), both edges of the model on rank 0, and the same bubble counted in chunks, i.e.
(pp − 1)(F + 2B − 3W)/2 in the rank's own F, B and W.

F&B is priced as F + B: DeepSeek-V3's Figure 4 runs the two chunks' compute one after the other on the SMs
and hides only their communication. The bubble is then (pp/2 − 1)(F + 2B − 3W) per stage, which is at most
1F1B's (pp − 1)(F + B) whenever W ≤ B (a part of the backward), so neither schedule is slower than 1F1B in
its bubble; with the usual B = 2F and W = F the bubble is (pp − 2)F, against 1F1B's 3(pp − 1)F.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from paraplan.arrays import Column, IntColumn
from paraplan.choices import PIPELINE_SCHEDULE_CODES
from paraplan.cost_models.pipeline_splits import PipelineSplit, edge_chunks
from paraplan.cost_models.stages import StageLayout
from paraplan.model_specs.model_spec import ModelSpec

DUALPIPEV = PIPELINE_SCHEDULE_CODES["dualpipev"]
DUALPIPE = PIPELINE_SCHEDULE_CODES["dualpipe"]


def is_bidirectional(pp_schedule: IntColumn) -> np.ndarray:
    """Rows whose schedule pairs forward and backward chunks of two micro-batches (DualPipe or DualPipeV)."""
    return np.asarray(pp_schedule) > 0


def dual_bubble_ratio(forward_s: Column, backward_s: Column, weight_grad_s: Column) -> np.ndarray:
    """(F + 2B − 3W) / (2(F + B)): a DualPipeV bubble over the 1F1B bubble of the same ranks, F, B and W
    being forward, full backward (recompute included) and weight-gradient seconds. 1/3 at B = 2F, W = F."""
    forward_s, backward_s = np.asarray(forward_s, dtype=float), np.asarray(backward_s, dtype=float)
    total = forward_s + backward_s
    return np.where(total > 0, (forward_s + 2.0 * backward_s - 3.0 * np.asarray(weight_grad_s)) / np.where(
        total > 0, 2.0 * total, 1.0), 1.0)


def schedule_bubble_s(pp_schedule: IntColumn, pp: IntColumn, slowest_s: Column, one_f_one_b_bubble_s: np.ndarray,
                      ratio: Column) -> np.ndarray:
    """Pipeline fill and drain of each row's schedule. ``slowest_s``: the slowest rank's time per micro-batch;
    ``one_f_one_b_bubble_s``: the bubble 1F1B (or the interleaved schedule) would have; ``ratio``:
    :func:`dual_bubble_ratio`. DualPipeV: (pp − 1)·t·ratio; DualPipe: (pp/2 − 1)·2·t·ratio = (pp − 2)·t·ratio."""
    if not np.any(is_bidirectional(pp_schedule)):
        return one_f_one_b_bubble_s
    pp = np.asarray(pp, dtype=float)
    dualpipev = (pp - 1.0) * slowest_s * ratio
    dualpipe = np.maximum(pp - 2.0, 0.0) * slowest_s * ratio
    return np.select([np.asarray(pp_schedule) == DUALPIPEV, np.asarray(pp_schedule) == DUALPIPE],
                     [dualpipev, dualpipe], one_f_one_b_bubble_s)


def in_flight_microbatches(pp_schedule: IntColumn, pp: IntColumn, num_microbatches: Column,
                           one_f_one_b: np.ndarray) -> np.ndarray:
    """Micro-batches' worth of one rank's activations at its peak: pp + 1 stage activations under DualPipe
    (Table 2), 2·pp + 1 chunk activations (half a rank's layers each) under DualPipeV, at most the step's
    micro-batches; ``one_f_one_b`` (memory.in_flight_chunks over vpp) elsewhere."""
    if not np.any(is_bidirectional(pp_schedule)):
        return one_f_one_b
    pp, m = np.asarray(pp, dtype=float), np.asarray(num_microbatches, dtype=float)
    return np.select([np.asarray(pp_schedule) == DUALPIPEV, np.asarray(pp_schedule) == DUALPIPE],
                     [np.minimum(2.0 * pp + 1.0, 2.0 * m) / 2.0, np.minimum(pp + 1.0, m)], one_f_one_b)


@dataclasses.dataclass(frozen=True, slots=True)
class RankWork:
    """What the first, the busiest middle and the last pipeline rank compute per micro-batch and hold."""

    layout: StageLayout
    """Layers computed per micro-batch (first/middle/last_layers) and parameters held (first/last_params)."""
    middle_param_layers: np.ndarray
    """Decoder layers whose parameters the busiest middle rank holds (two stages under DualPipe)."""
    embedding_on_first: np.ndarray
    """Share of the micro-batches whose embedding the first rank runs (DualPipe: half enter at each end)."""
    output_on_first: np.ndarray
    """Share of the micro-batches whose output layer and loss the first rank runs (DualPipeV: all)."""
    embedding_on_last: np.ndarray
    output_on_last: np.ndarray


def rank_work(model: ModelSpec, layout: StageLayout, tp: IntColumn, pp: IntColumn, vpp: IntColumn,
              pp_schedule: IntColumn, expert_shards: IntColumn, split: PipelineSplit) -> RankWork:
    """The per-rank work of each row's schedule from the engine's own split (``layout``, as 1F1B places it).

    DualPipeV (vpp = 2): rank 0 holds the first and the last chunk, the embedding and the output; a middle
    rank two middle chunks. DualPipe (vpp = 1): the edge ranks each hold the first and the last stage but run
    each for half the micro-batches; every rank holds two stages' parameters."""
    schedule = np.asarray(pp_schedule)
    v, dual = schedule == DUALPIPEV, schedule == DUALPIPE
    one = np.ones(np.shape(schedule), dtype=float)
    zero = np.zeros(np.shape(schedule), dtype=float)
    if not np.any(v | dual):
        return RankWork(layout, np.asarray(layout.middle_layers, dtype=float), one, zero, zero, one)
    layers = model.num_layers
    pp = np.asarray(pp)
    first_chunk, last_chunk = edge_chunks(split, layers, pp, np.where(v, 2, vpp))
    edges = first_chunk + last_chunk
    rest = layers - edges
    middle_chunk = np.ceil(rest / np.maximum(2 * pp - 2, 1))
    v_middle = np.where(pp > 2, np.minimum(2 * middle_chunk, rest), rest)  # pp = 2: rank 1 holds the rest
    layer_params, expert_params = model.shared_params_per_layer_mean(), model.routed_params_per_layer_mean()
    tp, shards = np.asarray(tp, dtype=float), np.asarray(expert_shards, dtype=float)
    v_first_params = (edges * layer_params + model.embedding_params() + model.output_params()) / tp
    v_last_params = v_middle * layer_params / tp
    edge_params = layout.first_params + layout.last_params  # DualPipe: both edge stages on each edge rank
    edge_expert_params = layout.first_expert_params + layout.last_expert_params
    dual_edge_layers = (layout.first_layers + layout.last_layers) / 2.0
    work = StageLayout(
        first_layers=np.select([v, dual], [edges, dual_edge_layers], layout.first_layers),
        middle_layers=np.select([v], [v_middle], layout.middle_layers),
        last_layers=np.select([v, dual], [v_middle, dual_edge_layers], layout.last_layers),
        first_params=np.select([v, dual], [v_first_params, edge_params], layout.first_params),
        last_params=np.select([v, dual], [v_last_params, edge_params], layout.last_params),
        first_expert_params=np.select([v, dual], [edges * expert_params / shards, edge_expert_params],
                                      layout.first_expert_params),
        last_expert_params=np.select([v, dual], [v_middle * expert_params / shards, edge_expert_params],
                                     layout.last_expert_params),
    )
    middle_param_layers = np.select([v, dual], [v_middle, 2.0 * layout.middle_layers], layout.middle_layers)
    return RankWork(work, middle_param_layers.astype(float),
                    embedding_on_first=np.select([dual], [0.5], 1.0),
                    output_on_first=np.select([v, dual], [1.0, 0.5], 0.0),
                    embedding_on_last=np.select([dual], [0.5], 0.0),
                    output_on_last=np.select([v, dual], [0.0, 0.5], 1.0))
