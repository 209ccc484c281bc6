"""DeepSpeed 0.19.8 accepts (and rejects) the emitted ds_config.json, hostfile and launcher command.

``DeepSpeedConfig`` computes its world size from the process group; without one it silently
uses 1. As in Megatron-DeepSpeed, the data-parallel world size comes from an ``mpu`` object (tp and
pp ranks hold the same samples), so the config is checked at the plan's dp out of its world size.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from unittest import mock

import pytest
from export_factory import captured_argv, engine_module, files_of, make_export_plan

from paraplan.exporters.deepspeed import ds_config
from paraplan.exporters.plan_input import ExportPlan

pytestmark = pytest.mark.engines
engine_module("deepspeed")

import deepspeed.runtime.config as ds_runtime_config  # noqa: E402 - after engine_module's importorskip
from deepspeed.launcher.runner import fetch_hostfile, parse_args  # noqa: E402 - after engine_module's importorskip
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402 - after engine_module's importorskip


class PlanMPU:
    """The model-parallel unit DeepSpeed asks for the data-parallel world size of a tp·pp·dp grid."""

    def __init__(self, plan: ExportPlan, data_parallel: int | None = None) -> None:
        self.plan, self.dp = plan, plan.config.dp if data_parallel is None else data_parallel

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_model_parallel_world_size(self) -> int:
        return self.plan.config.tp * self.plan.config.pp


def deepspeed_accepts(config: dict | str, plan: ExportPlan, data_parallel: int | None = None) -> DeepSpeedConfig:
    """DeepSpeedConfig on rank 0 of the plan's world, its dp from the MPU."""
    with mock.patch.object(ds_runtime_config.dist, "get_rank", lambda *_, **__: 0), \
            mock.patch.object(ds_runtime_config.dist, "get_world_size", lambda *_, **__: plan.num_gpus):
        return DeepSpeedConfig(config, mpu=PlanMPU(plan, data_parallel))


PLANS = {
    "zero1-tp2-pp2": {"tp": 2, "pp": 2, "dp": 4, "zero": 1, "mbs": 2, "global_batch": 64},
    "zero2-dp16": {"dp": 16, "zero": 2, "mbs": 1, "global_batch": 64},
    "zero3-dp8-full-recompute": {"dp": 8, "zero": 3, "mbs": 2, "global_batch": 128, "recompute": "full"},
    "zero0-tp4": {"tp": 4, "dp": 4, "zero": 0, "mbs": 4, "global_batch": 64},
}


@pytest.mark.parametrize("name", list(PLANS))
def test_deepspeed_config_accepts_the_emitted_file(name, tmp_path):
    plan = make_export_plan("llama-3.1-8b", engine="deepspeed", **PLANS[name])
    path = tmp_path / "ds_config.json"
    path.write_text(files_of(plan, "deepspeed")["ds_config.json"].text)
    config = deepspeed_accepts(str(path), plan)
    c = plan.config
    assert (config.world_size, config.train_batch_size, config.train_micro_batch_size_per_gpu,
            config.gradient_accumulation_steps) == (c.dp, plan.global_batch, c.mbs, plan.num_microbatches)
    assert config.zero_optimization_stage == c.zero and config.bfloat16_config.enabled
    assert config.gradient_clipping == 1.0
    assert config.tensor_parallel_config.autotp_size == (c.tp if c.tp > 1 else 0)
    if c.zero == 3:
        zero = config.zero_config
        assert (zero.prefetch_bucket_size, zero.param_persistence_threshold) == (int(0.9 * 4096 ** 2), 40960)
    if c.recompute == "full":
        assert config.activation_checkpointing_config.partition_activations is False  # tp = 1


def test_deepspeed_rejects_the_config_at_a_wrong_data_parallel_size():
    plan = make_export_plan("llama-3.1-8b", engine="deepspeed", **PLANS["zero1-tp2-pp2"])
    config = ds_config(plan)
    deepspeed_accepts(config, plan)
    with pytest.raises(AssertionError, match=r"64 != 2 \* 8 \* 8"):
        deepspeed_accepts(config, plan, data_parallel=8)


def test_deepspeed_rejects_a_bad_zero_stage_and_a_misspelt_key():
    plan = make_export_plan("llama-3.1-8b", engine="deepspeed", **PLANS["zero3-dp8-full-recompute"])
    config = ds_config(plan)
    with pytest.raises(Exception, match="stage"):
        deepspeed_accepts({**config, "zero_optimization": {**config["zero_optimization"], "stage": 4}}, plan)
    misspelt = dict(config["zero_optimization"])
    misspelt["stage3_prefetch_bucket_sz"] = misspelt.pop("stage3_prefetch_bucket_size")
    with pytest.raises(Exception, match="Extra inputs are not permitted"):
        deepspeed_accepts({**config, "zero_optimization": misspelt}, plan)


def test_deepspeed_launcher_parses_the_emitted_command_and_hostfile(tmp_path):
    plan = make_export_plan("llama-3.1-8b", engine="deepspeed", **PLANS["zero2-dp16"])
    for f in files_of(plan, "deepspeed").values():
        (tmp_path / f.name).write_text(f.text)
    argv = captured_argv(tmp_path / "deepspeed_launch.sh", "deepspeed", tmp_path,
                         env={"TRAIN_SCRIPT": "pretrain.py", "MASTER_PORT": "29777"})
    args = parse_args(argv)  # the deepspeed launcher's own argparse
    assert (args.num_nodes, args.num_gpus, args.master_port, args.user_script) == (2, 8, 29777, "pretrain.py")
    assert args.user_args == ["--deepspeed", "--deepspeed_config", str(tmp_path / "ds_config.json")]
    pool = fetch_hostfile(args.hostfile)
    assert list(pool.items()) == [("node-0", 8), ("node-1", 8)]
    config = deepspeed_accepts(args.user_args[-1], plan)
    assert config.train_batch_size == json.loads(Path(args.user_args[-1]).read_text())["train_batch_size"]


# -- pipeline split: DeepSpeed's own partition of the layer specs the export asks for -----------------
SPLITS = {  # (model, shape override, pp) -> decoder layers per stage, derived by hand from partition_uniform
    "llama405b-126-on-pp8": ("llama-3.1-405b", None, 8, [15] + [16] * 6 + [15]),  # 128 specs / 8 = 16 each
    "bloom-70-on-pp12": ("llama-2-7b", {"num_layers": 70}, 12, [5] + [6] * 10 + [5]),  # BLOOM's depth: 72 / 12
    "deepseek-v3-61-on-pp4": ("deepseek-v3", None, 4, [15, 16, 16, 14]),  # 63 specs: 16, 16, 16, 15
    "llama8b-32-on-pp4": ("llama-3.1-8b", None, 4, [8, 9, 8, 7]),  # 34 specs: 9, 9, 8, 8
}


class StandInModule:
    """What PipelineModule._partition_layers reads of its module: specs, stage count, topology, rank."""

    def __init__(self, specs: list, num_stages: int) -> None:
        self._layer_specs, self.num_stages, self.global_rank = specs, num_stages, 1  # rank 1: no printout
        self._topo = mock.Mock(get_coord=lambda rank: mock.Mock(pipe=0))
        self.bounds = None

    def _set_bounds(self, start, stop):
        self.bounds = (start, stop)


@pytest.mark.parametrize("name", list(SPLITS))
def test_deepspeed_partitions_the_layers_as_the_plan_priced(name):
    from deepspeed.runtime.pipe.module import PipelineModule

    from paraplan.exporters.deepspeed import pipeline_module

    model, shape, pp, by_hand = SPLITS[name]
    plan = make_export_plan(model, engine="deepspeed", shape=shape, pp=pp, dp=1, zero=1, global_batch=2 * pp,
                            gpus_per_node=pp)
    assert list(plan.stage_layers) == by_hand
    module = pipeline_module(plan)
    specs = ["embedding"] + ["decoder"] * plan.model.num_layers + ["head"]
    assert len(specs) == module["num_layer_specs"]
    stand_in = StandInModule(specs, module["num_stages"])
    PipelineModule._partition_layers(stand_in, method=module["partition_method"])  # DeepSpeed's own code
    parts = stand_in.parts
    assert [specs[a:b].count("decoder") for a, b in pairwise(parts)] == by_hand
    script = files_of(plan, "deepspeed")["deepspeed_launch.sh"].text
    assert f"num_stages={pp}, partition_method='uniform'" in script
