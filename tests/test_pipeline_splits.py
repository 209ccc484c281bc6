"""Each engine's own pipeline split: layer counts by hand, the vectorized per-rank view against the
chunk list, and the search offering (and pricing) exactly what the engine runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from paraplan.cost_models.pipeline_splits import PIPELINE_SPLITS, rank_layers, split_exists
from paraplan.cost_models.stages import stage_layout
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.layout import stage_layers
from paraplan.planner.space import enumerate_space


def test_deepspeed_uniform_by_hand():
    # partition_uniform over [embedding, L layers, head]: N = L + 2 specs, N // pp each, the first N % pp one more.
    assert stage_layers(126, 8, 1, "deepspeed_uniform") == [15] + [16] * 6 + [15]  # 128 / 8 = 16
    assert stage_layers(70, 12, 1, "deepspeed_uniform") == [5] + [6] * 10 + [5]  # BLOOM: 72 / 12 = 6
    assert stage_layers(61, 4, 1, "deepspeed_uniform") == [15, 16, 16, 14]  # 63 = 4·15 + 3: 16, 16, 16, 15 specs
    assert stage_layers(32, 4, 1, "deepspeed_uniform") == [8, 9, 8, 7]  # 34 = 4·8 + 2: 9, 9, 8, 8 specs
    assert stage_layers(6, 8, 1, "deepspeed_uniform") == [0] + [1] * 6 + [0]  # 8 specs: the edges alone
    with pytest.raises(ValueError):
        stage_layers(5, 8, 1, "deepspeed_uniform")  # 7 specs on 8 stages: one would be empty


def test_torchtitan_by_hand():
    assert stage_layers(32, 4, 1, "torchtitan") == [8] * 4  # pp divides: weights 0, the even split
    assert stage_layers(126, 8, 1, "torchtitan") == [15] + [16] * 6 + [15]  # (126 + 2) / 8
    assert stage_layers(126, 12, 1, "torchtitan") == [10] + [11] * 7 + [10, 10, 10, 9]  # 128 = 12·10 + 8
    assert stage_layers(61, 4, 4, "torchtitan") == [3] + [4] * 14 + [2]  # 63 = 16·3 + 15
    assert stage_layers(126, 16, 8, "torchtitan") == [0] + [1] * 126 + [0]  # weights equal to the stage size
    # pp 2 x vpp 4 = 8 stages of E = 12 + 2: layers_per_stage 2 gives ⌈14 / 2⌉ = 7 stages, 1 gives 14, none 8.
    assert not split_exists("torchtitan", 12, 2, 4) and split_exists("torchtitan", 12, 2, 2)


@pytest.mark.parametrize("split", PIPELINE_SPLITS)
def test_per_rank_view_matches_the_chunk_list(split):
    """rank_layers (vectorized, priced) agrees with the chunk list (exported) on every split that exists:
    rank r runs chunks r, r + pp, ...; the middle value is the busiest middle rank."""
    for layers in (24, 32, 61, 70, 126):
        pp, vpp = np.meshgrid(np.arange(1, 17), np.arange(1, 9))
        pp, vpp = pp.ravel(), vpp.ravel()
        first, middle, last = rank_layers(split, layers, pp, vpp)
        for index in np.flatnonzero(split_exists(split, layers, pp, vpp)):
            p, v = int(pp[index]), int(vpp[index])
            chunks = stage_layers(layers, p, v, split)
            ranks = [sum(chunks[r::p]) for r in range(p)]
            assert sum(chunks) == layers and min(chunks) >= 0
            assert (first[index], last[index]) == (ranks[0], ranks[-1]), (split, layers, p, v)
            if p >= 3:
                assert middle[index] == max(ranks[1:-1]), (split, layers, p, v)


def test_deepspeed_prices_the_stage_its_partition_overloads():
    llama8b = load_model("llama-3.1-8b")
    megatron = stage_layout(llama8b, 1, 4, 1, split="megatron")
    deepspeed = stage_layout(llama8b, 1, 4, 1, split="deepspeed_uniform")
    assert (int(megatron.middle_layers), int(deepspeed.middle_layers)) == (8, 9)  # [8, 8, 8, 8] vs [8, 9, 8, 7]
    assert int(deepspeed.last_layers) == 7 and deepspeed.last_params < megatron.last_params


def _space(engine: str, rules=None, **fixed):
    job = TrainingJob(model=load_model(fixed.pop("model", "llama-3.1-405b")), seq_len=8192, global_batch=64,
                      engine=engine)
    return enumerate_space(job, quick_cluster("h100-sxm", fixed.pop("gpus", 64)), rules or engine_rules(engine),
                           {key: [value] for key, value in fixed.items()})


@pytest.mark.parametrize("engine", ["deepspeed", "torchtitan"])
def test_engines_run_pp_that_does_not_divide_the_layers(engine):
    # Llama 3.1 405B: 126 layers on pp 8 (both used to refuse it: pp did not divide the layers).
    space = _space(engine, pp=8, tp=8, cp=1, vpp=1)
    assert len(space.table) > 0 and set(space.table.pp) == {8}


def test_an_engine_without_empty_edge_chunks_is_not_offered_them():
    fixed = {"pp": 16, "vpp": 8, "tp": 8, "cp": 1, "gpus": 128}  # 126 + 2 over 128 chunks: edges hold none
    assert len(_space("megatron", **fixed).table) > 0
    strict = dataclasses.replace(engine_rules("megatron"), empty_edge_chunks=False)
    space = _space("megatron", strict, **fixed)
    assert len(space.table) == 0 and space.rejected["megatron cannot run an edge chunk without a decoder layer"] > 0
