"""Each engine's own rule for cutting the decoder layers into pipeline chunks (vectorized).

``megatron``: an even split when pp·vpp divides the layers; otherwise Megatron's layout that counts the
embedding and the loss as one layer each (``account_for_embedding/loss_in_pipeline_split``): (L + 2) / pp
per stage, one fewer on the first and on the last stage. When neither divides, Megatron still takes
explicit edge stages (``--decoder-first/last-pipeline-num-layers`` without virtual stages,
``--pipeline-model-parallel-layout`` with them): each middle chunk of the pp·vpp chunks gets
c = ⌈(L + 2) / (pp·vpp)⌉ layers and the first and last chunk the remainder L − (pp·vpp − 2)·c, the first
taking the larger half (the last also runs the output layer and the loss). When (L + 2) divides this is
exactly the edge-accounted split.

``torchtitan``: ``_generate_llm_fqn_per_model_part`` (torchtitan 0.2.2 and 0.3.0 alike) counts the
embedding as ``input_weight`` and the norm + output as ``output_weight`` layers
(``pipeline_parallel_first/last_stage_less_layers``), splits E = L + input + output over the S = pp·vpp
stages as E // S each, gives the first E % S stages one more, then takes the weights off the first and
the last stage; it refuses E // S < 1 or a weight above E // S (a weight equal to it leaves that edge
stage with the embedding or the output alone). paraplan asks for weights 0 where S divides the layers
(the even split) and 1 otherwise (torchtitan's defaults, the edge-accounted balance).

``deepspeed_uniform``: ``PipelineModule(partition_method="uniform")`` runs ``partition_uniform`` over
its layer specs; the export builds them as [embedding, L decoder layers, norm + head], so N = L + 2
specs go N // pp to a stage, the first N % pp stages one more, and the first and last stage give one
spec to the embedding and the head: the torchtitan arithmetic with weights 1 and 1 and S = pp.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from paraplan.arrays import IntColumn


def even_split(num_layers: int, pp: IntColumn, vpp: IntColumn) -> np.ndarray:
    """True where pp·vpp divides the layers."""
    return num_layers % (np.asarray(pp) * np.asarray(vpp)) == 0


def edge_accounted_split(num_layers: int, pp: IntColumn, vpp: IntColumn) -> np.ndarray:
    """True where (layers + 2) splits evenly over pp·vpp chunks (embedding and loss count as layers)."""
    return (num_layers + 2) % (np.asarray(pp) * np.asarray(vpp)) == 0


def uneven_edge_chunks(num_layers: int, pp: IntColumn,
                       vpp: IntColumn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first chunk, middle chunk, last chunk) layers of the explicit-edge split over pp·vpp chunks."""
    chunks = np.asarray(pp) * np.asarray(vpp)
    middle = -(-(num_layers + 2) // chunks)
    remainder = num_layers - np.maximum(chunks - 2, 0) * middle
    return -(-remainder // 2), middle, remainder // 2


def uneven_edge_split(num_layers: int, pp: IntColumn, vpp: IntColumn) -> np.ndarray:
    """True where the explicit-edge split exists: pp ≥ 2; without virtual stages both edge stages
    hold a layer (Megatron's first/last-stage flags), with them an edge chunk may hold only the
    embedding or the loss (--pipeline-model-parallel-layout)."""
    first, _, last = uneven_edge_chunks(num_layers, pp, vpp)
    vpp = np.asarray(vpp)
    smallest = np.where(vpp == 1, 1, 0)
    return (np.asarray(pp) >= 2) & (last >= smallest) & (first >= smallest)


def uneven_edge_layers(num_layers: int, pp: IntColumn,
                       vpp: IntColumn = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, middle, last) decoder layers per pipeline rank of the explicit-edge split: rank 0
    holds the first chunk and vpp − 1 middle chunks, the last rank the last chunk and vpp − 1."""
    first, middle, last = uneven_edge_chunks(num_layers, pp, vpp)
    others = (np.asarray(vpp) - 1) * middle
    return first + others, np.asarray(vpp) * middle, last + others


PipelineSplit = Literal["megatron", "torchtitan", "deepspeed_uniform"]
PIPELINE_SPLITS: tuple[PipelineSplit, ...] = ("megatron", "torchtitan", "deepspeed_uniform")


def edge_weights(split: PipelineSplit, num_layers: int, pp: IntColumn, vpp: IntColumn) -> tuple[np.ndarray, np.ndarray]:
    """(embedding, output) weights in layers of a weighted split: torchtitan 0 where pp·vpp divides the
    layers, else 1; DeepSpeed's embedding and head specs always 1."""
    ones = np.ones_like(np.asarray(pp) * np.asarray(vpp))
    weight = np.where(even_split(num_layers, pp, vpp), 0, 1) * ones if split == "torchtitan" else ones
    return weight, weight


def weighted_chunk(num_layers: int, stages: IntColumn, first_weight: IntColumn, last_weight: IntColumn,
                   index: IntColumn) -> np.ndarray:
    """Decoder layers of chunk ``index`` (0-based, model order) of the weighted split."""
    effective = num_layers + first_weight + last_weight
    per, extra = effective // stages, effective % stages
    index = np.asarray(index)
    return per + (index < extra) - np.where(index == 0, first_weight, 0) - np.where(index == stages - 1,
                                                                                   last_weight, 0)


def weighted_split_exists(num_layers: int, stages: IntColumn, first_weight: IntColumn,
                          last_weight: IntColumn) -> np.ndarray:
    """Where the engine accepts the weighted split: at least one layer per stage on average and
    neither weight above it (torchtitan's checks; DeepSpeed's N ≥ pp, so no stage is empty)."""
    per = (num_layers + first_weight + last_weight) // np.asarray(stages)
    return (per >= 1) & (per >= first_weight) & (per >= last_weight)


def stages_expressible(num_layers: int, pp: IntColumn, vpp: IntColumn, first_weight: IntColumn,
                       last_weight: IntColumn) -> np.ndarray:
    """Where torchtitan can run pp·vpp stages: it derives its stage count from
    pipeline_parallel_layers_per_stage as ⌈E / per⌉, or without it takes pp (1F1B) or 2·pp (Interleaved1F1B)
    stages: vpp ≤ 2, or a per-stage size that gives S."""
    stages = np.asarray(pp) * np.asarray(vpp)
    effective = num_layers + first_weight + last_weight
    size = -(-effective // stages)
    return (np.asarray(vpp) <= 2) | (-(-effective // size) == stages)


def _weighted_ranks(num_layers: int, pp: IntColumn, vpp: IntColumn, first_weight: IntColumn,
                    last_weight: IntColumn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, middle, last) layers per pipeline rank: rank r holds chunks r, r + pp, ... The middle
    rank with the most is rank 1 (extra layers go to the first chunks)."""
    pp, vpp = np.asarray(pp), np.asarray(vpp)
    stages = pp * vpp
    effective = num_layers + first_weight + last_weight
    per, extra = effective // stages, effective % stages

    def rank(r: IntColumn) -> np.ndarray:
        bonus = np.clip(-(-(extra - r) // pp), 0, vpp)  # chunks r + v·pp below extra
        return vpp * per + bonus

    return rank(0) - first_weight, rank(np.minimum(1, pp - 1)), rank(pp - 1) - last_weight


def split_exists(split: PipelineSplit, num_layers: int, pp: IntColumn, vpp: IntColumn) -> np.ndarray:
    """Where the engine's own split can cut the layers over pp·vpp chunks."""
    if split == "megatron":
        # An edge-accounted chunk of one 'layer' would be the embedding or the loss alone: that is the
        # explicit-edge split's case (a layout string with virtual stages; refused without them).
        chunk_size = (num_layers + 2) // (np.asarray(pp) * np.asarray(vpp))
        return even_split(num_layers, pp, vpp) | (edge_accounted_split(num_layers, pp, vpp) & (chunk_size > 1)) | (
            uneven_edge_split(num_layers, pp, vpp))
    first_weight, last_weight = edge_weights(split, num_layers, pp, vpp)
    stages = np.asarray(pp) * np.asarray(vpp)
    exists = weighted_split_exists(num_layers, stages, first_weight, last_weight)
    return exists & stages_expressible(num_layers, pp, vpp, first_weight, last_weight) if split == "torchtitan" \
        else exists


def edge_chunks(split: PipelineSplit, num_layers: int, pp: IntColumn,
                vpp: IntColumn) -> tuple[np.ndarray, np.ndarray]:
    """(first chunk, last chunk) decoder layers of the engine's split, where it exists."""
    if split == "megatron":
        first, _, last = megatron_chunks(num_layers, pp, vpp)
        return first, last
    first_weight, last_weight = edge_weights(split, num_layers, pp, vpp)
    stages = np.asarray(pp) * np.asarray(vpp)
    return (weighted_chunk(num_layers, stages, first_weight, last_weight, 0),
            weighted_chunk(num_layers, stages, first_weight, last_weight, stages - 1))


def megatron_chunks(num_layers: int, pp: IntColumn, vpp: IntColumn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, middle, last) chunk of Megatron's split: even, edge-accounted or explicit edges."""
    chunks = np.asarray(pp) * np.asarray(vpp)
    even = even_split(num_layers, pp, vpp)
    regular = even | edge_accounted_split(num_layers, pp, vpp)
    first, middle, last = uneven_edge_chunks(num_layers, pp, vpp)
    size = np.where(even, num_layers // chunks, (num_layers + 2) // chunks)
    edge = np.where(even, size, size - 1)
    return np.where(regular, edge, first), np.where(regular, size, middle), np.where(regular, edge, last)


def megatron_rank_layers(num_layers: int, pp: IntColumn,
                         vpp: IntColumn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, middle, last) layers per pipeline rank of Megatron's split."""
    pp, vpp = np.asarray(pp), np.asarray(vpp)
    even = even_split(num_layers, pp, vpp)
    accounted = ~even & edge_accounted_split(num_layers, pp, vpp)
    uneven_first, uneven_middle, uneven_last = uneven_edge_layers(num_layers, pp, vpp)
    per_stage = np.select([even, accounted], [num_layers // pp, (num_layers + 2) // pp], uneven_middle)
    first = np.select([even, accounted], [per_stage, per_stage - 1], uneven_first)
    last = np.select([even, accounted], [per_stage, per_stage - 1], uneven_last)
    return first, per_stage, last


def rank_layers(split: PipelineSplit, num_layers: int, pp: IntColumn,
                vpp: IntColumn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, middle, last) decoder layers per pipeline rank under the engine's split (pp = 1: all)."""
    pp = np.asarray(pp)
    if split == "megatron":
        first, middle, last = megatron_rank_layers(num_layers, pp, vpp)
    else:
        first, middle, last = _weighted_ranks(num_layers, pp, vpp, *edge_weights(split, num_layers, pp, vpp))
    single = pp == 1
    return (np.where(single, num_layers, first), np.where(single, num_layers, middle),
            np.where(single, num_layers, last))
