"""How layers and parameters fall on pipeline stages.

Even split when pp·vpp divides the layers; otherwise Megatron's layout that counts the
embedding and the loss as one layer each (``account_for_embedding/loss_in_pipeline_split``):
(L + 2) / pp per stage, one fewer on the first and on the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.cost_models.model_spec import ModelSpec


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


def even_split(num_layers: int, pp, vpp):
    """True where pp·vpp divides the layers."""
    return num_layers % (np.asarray(pp) * np.asarray(vpp)) == 0


def edge_accounted_split(num_layers: int, pp, vpp):
    """True where (layers + 2) splits evenly over pp·vpp chunks (embedding and loss count as layers)."""
    return (num_layers + 2) % (np.asarray(pp) * np.asarray(vpp)) == 0


def stage_layout(model: ModelSpec, tp, pp, vpp, expert_shards=1) -> StageLayout:
    """Layers and per-GPU parameters by stage (vectorized). Routed experts are split over
    ``expert_shards`` = ep·etp GPUs, everything else over tp. MoE and dense layers are spread
    evenly (each stage holds the layer mean), which is exact for models whose layers are all
    MoE and close for DeepSeek-V3 (3 dense of 61, with about the FLOPs of an MoE layer)."""
    layers = model.num_layers
    pp = np.asarray(pp)
    even = even_split(layers, pp, vpp)
    per_stage = np.where(even, layers / pp, (layers + 2) / pp)
    edge = np.where(even, per_stage, per_stage - 1)
    single = pp == 1
    first = np.where(single, layers, edge)
    last = np.where(single, layers, edge)
    layer_params = model.shared_params_per_layer_mean()
    expert_params = model.routed_params_per_layer_mean()
    # With pp > 1 and tied embeddings the last stage keeps its own copy of the word embedding.
    tied_copy = np.where(single, 0, model.vocab_size * model.hidden_size if model.tied_embeddings else 0)
    first_params = first * layer_params + model.embedding_params() + np.where(single, model.output_params(), 0)
    last_params = np.where(single, first_params, last * layer_params + model.output_params() + tied_copy)
    tp = np.asarray(tp, dtype=float)
    expert_shards = np.asarray(expert_shards, dtype=float)
    return StageLayout(first, per_stage, last, first_params / tp, last_params / tp,
                       first * expert_params / expert_shards, last * expert_params / expert_shards)
