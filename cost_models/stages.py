"""How layers and parameters fall on pipeline stages, under each engine's own split (pipeline_splits.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.arrays import IntColumn
from paraplan.cost_models.pipeline_splits import (  # noqa: F401 (Megatron's split rules, re-exported)
    PipelineSplit,
    edge_accounted_split,
    even_split,
    rank_layers,
    uneven_edge_chunks,
    uneven_edge_layers,
    uneven_edge_split,
)
from paraplan.model_specs.model_spec import ModelSpec


@dataclass(frozen=True, slots=True)
class StageLayout:
    """Layers and parameters per GPU on the first, a middle and the last pipeline stage."""

    first_layers: np.ndarray
    middle_layers: np.ndarray
    last_layers: np.ndarray
    first_params: np.ndarray
    """Parameters on one GPU of the first stage (already divided by tp)."""
    last_params: np.ndarray
    """Parameters on one GPU of the last stage (already divided by tp)."""
    first_expert_params: np.ndarray
    """Routed-expert parameters on one GPU of the first stage (already divided by ep·etp)."""
    last_expert_params: np.ndarray
    """Routed-expert parameters on one GPU of the last stage (already divided by ep·etp)."""


def stage_layout(model: ModelSpec, tp: IntColumn, pp: IntColumn, vpp: IntColumn, expert_shards: IntColumn = 1,
                 split: PipelineSplit = "megatron", mtp_layers: int = 0) -> StageLayout:
    """Layers and per-GPU parameters by stage (vectorized) under the engine's ``split``
    (pipeline_splits.PIPELINE_SPLITS); the middle stage is the middle rank with the most layers, which
    decides time and memory. Routed experts are split over
    ``expert_shards`` = ep·etp GPUs, everything else over tp. MoE and dense layers are spread
    evenly (each stage holds the layer mean), which is exact for models whose layers are all
    MoE and close for DeepSeek-V3 (3 dense of 61, with about the FLOPs of an MoE layer).

    ``mtp_layers`` multi-token-prediction modules follow the last decoder layer on the stage that runs the loss
    (Megatron-core places the MTP block in the post-process stage; its layout strings end ``...t m L``): each counts
    there as one more layer (time, activations) and holds its own parameters (``ModelSpec.mtp_params``: a decoder
    layer, the 2h -> h projection, three norms; its routed experts split over ep·etp like every MoE layer's)."""
    layers = model.num_layers
    pp = np.asarray(pp)
    first, per_stage, last = rank_layers(split, layers, pp, vpp)
    single = pp == 1
    layer_params = model.shared_params_per_layer_mean()
    expert_params = model.routed_params_per_layer_mean()
    mtp_routed, mtp_shared = mtp_stage_params(model, mtp_layers)
    # With pp > 1 and tied embeddings the last stage keeps its own copy of the word embedding.
    tied_copy = np.where(single, 0, model.vocab_size * model.hidden_size if model.tied_embeddings else 0)
    first_params = first * layer_params + model.embedding_params() \
        + np.where(single, model.output_params() + mtp_shared, 0)
    last_params = np.where(single, first_params, last * layer_params + model.output_params() + tied_copy + mtp_shared)
    first_experts = first * expert_params + np.where(single, mtp_routed, 0)
    last_experts = last * expert_params + mtp_routed
    tp = np.asarray(tp, dtype=float)
    expert_shards = np.asarray(expert_shards, dtype=float)
    return StageLayout(first + np.where(single, mtp_layers, 0), per_stage, last + mtp_layers, first_params / tp,
                       last_params / tp, first_experts / expert_shards, last_experts / expert_shards)


def mtp_stage_params(model: ModelSpec, mtp_layers: int) -> tuple[int, int]:
    """(routed-expert, other) parameters of ``mtp_layers`` of the model's MTP modules (0 to model.mtp_layers)."""
    if not mtp_layers:
        return 0, 0
    routed = mtp_layers * model.num_experts * model.expert_params() if model.is_moe else 0
    return routed, model.mtp_params() * mtp_layers // model.mtp_layers - routed
