"""Where ranks, layers and experts go under a plan: the placement its degrees imply.

Ranks follow Megatron-core's default order tp-cp-ep-dp-pp with tp fastest (``RankGenerator`` in
``megatron/core/parallel_state.py``; the dense grid has ep = 1, so it is tp-cp-dp-pp). torchtitan's
device mesh [pp, dp, cp, tp] (outermost first) and DeepSpeed's ``PipeModelDataParallelTopology``
(pipe, data, model) lay ranks out the same way. torchrun numbers ranks node by node:
rank = node · gpus_per_node + local_rank.

Experts live on a second grid over the same ranks, Megatron's expert ``RankGenerator``
(tp=etp, ep, dp=expert_dp, pp, order tp-ep-dp-pp); expert-parallel rank e holds the contiguous
block of num_experts / ep experts starting at e · num_experts / ep.
"""

from __future__ import annotations

from typing import Any

from paraplan.cost_models.pipeline_splits import (
    PipelineSplit,
    edge_weights,
    split_exists,
    uneven_edge_chunks,
    uneven_edge_split,
    weighted_chunk,
)

RANK_ORDER = "tp-cp-dp-pp"
EXPERT_RANK_ORDER = "tp-ep-dp-pp"


def rank_map(*, tp: int, cp: int, dp: int, pp: int, gpus_per_node: int) -> list[dict[str, int]]:
    """Every global rank with its node, local rank and coordinate on each parallel axis."""
    rows = []
    for rank in range(tp * cp * dp * pp):
        rows.append({"rank": rank, "node": rank // gpus_per_node, "local_rank": rank % gpus_per_node,
                     "tp": rank % tp, "cp": rank // tp % cp, "dp": rank // (tp * cp) % dp,
                     "pp": rank // (tp * cp * dp)})
    return rows


def axis_groups(rows: list[dict[str, int]], axis: str) -> list[list[int]]:
    """Ranks that share every coordinate but ``axis``, as sorted groups ordered by their first rank."""
    others = [name for name in ("tp", "cp", "dp", "pp") if name != axis]
    groups: dict[tuple[int, ...], list[int]] = {}
    for row in rows:
        groups.setdefault(tuple(row[name] for name in others), []).append(row["rank"])
    return sorted((sorted(group) for group in groups.values()), key=lambda group: group[0])


def stage_layers(num_layers: int, pp: int, vpp: int, split: PipelineSplit = "megatron") -> list[int]:
    """Decoder layers of each model chunk in model order under the engine's ``split``; chunk k runs on
    pipeline rank k mod pp (cost_models/pipeline_splits.py). ValueError where the split does not exist."""
    if split != "megatron":
        if not split_exists(split, num_layers, pp, vpp):
            raise ValueError(f"{split} cannot split {num_layers} layers over pp·vpp = {pp * vpp} chunks")
        first_weight, last_weight = (int(w) for w in edge_weights(split, num_layers, pp, vpp))
        return [int(weighted_chunk(num_layers, pp * vpp, first_weight, last_weight, k)) for k in range(pp * vpp)]
    return megatron_stage_layers(num_layers, pp, vpp)


def megatron_stage_layers(num_layers: int, pp: int, vpp: int) -> list[int]:
    """An even split when pp·vpp divides the layers; otherwise Megatron's split that counts the
    embedding and the loss as one layer each (--account-for-embedding/loss-in-pipeline-split),
    which leaves one layer fewer on the first and on the last chunk; failing both, explicit first
    and last chunks."""
    chunks = pp * vpp
    if num_layers % chunks == 0:
        return [num_layers // chunks] * chunks
    if chunks > 1 and (num_layers + 2) % chunks == 0 and (num_layers + 2) // chunks > 1:
        layers = [(num_layers + 2) // chunks] * chunks
        layers[0] -= 1
        layers[-1] -= 1
        return layers
    if pp > 1 and uneven_edge_split(num_layers, pp, vpp):
        first, middle, last = (int(x) for x in uneven_edge_chunks(num_layers, pp, vpp))
        return [first] + [middle] * (chunks - 2) + [last]
    raise ValueError(f"{num_layers} layers split neither evenly nor edge-accounted over pp·vpp = {chunks} chunks")


def stage_split(layers: list[int] | tuple[int, ...], num_layers: int, pp: int, vpp: int) -> bool:
    """Whether ``layers`` is a split every launch format expresses literally: one chunk per rank, every
    layer placed, at least one per stage (Megatron's --pipeline-model-parallel-layout, torchtitan's
    module_fqns_per_model_part, DeepSpeed's hand-cut PipelineModule)."""
    return vpp == 1 and len(layers) == pp >= 2 and sum(layers) == num_layers and min(layers) >= 1


def expert_map(*, num_experts: int, moe_layers: list[int], ep: int, etp: int, world_size: int,
               pp: int) -> dict[str, Any]:
    """Expert-parallel groups and the experts each rank holds (empty lists for a dense model)."""
    header = {"num_experts": num_experts, "moe_layers": list(moe_layers), "ep": ep, "etp": etp,
              "rank_order": EXPERT_RANK_ORDER}
    if num_experts == 0:
        return {**header, "expert_dp": 0, "ep_groups": [], "ranks": []}
    per_stage = world_size // pp
    if per_stage % (ep * etp) or num_experts % ep:
        raise ValueError(f"ep·etp = {ep * etp} must divide the {per_stage} ranks of a pipeline stage and ep = {ep} "
                         f"the {num_experts} experts")
    expert_dp, local = per_stage // (ep * etp), num_experts // ep
    ranks: list[dict[str, Any]] = []
    for rank in range(world_size):
        ep_rank = rank // etp % ep
        ranks.append({"rank": rank, "etp": rank % etp, "ep": ep_rank, "expert_dp": rank // (etp * ep) % expert_dp,
                      "pp": rank // per_stage, "experts": list(range(ep_rank * local, (ep_rank + 1) * local))})
    groups: dict[tuple[int, int, int], list[int]] = {}
    for row in ranks:
        groups.setdefault((row["etp"], row["expert_dp"], row["pp"]), []).append(row["rank"])
    ep_groups = sorted(groups.values(), key=lambda group: group[0])
    return {**header, "expert_dp": expert_dp, "ep_groups": ep_groups, "ranks": ranks}
