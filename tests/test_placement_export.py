"""Placement results in launch files: host order (SLURM, DeepSpeed hostfile), uneven edge stages
(Megatron, torchtitan), and the plans the formats cannot express."""

from __future__ import annotations

import pytest
from export_factory import files_of, make_plan_document

from paraplan.errors import InputError
from paraplan.exporters.plan_input import plan_from_document


def placed_document(engine: str = "megatron", stage_layers=None, hosts=("h0", "h2", "h1", "h3"), **config):
    config = {"tp": 8, "dp": 2, "pp": 2, **config}
    document = make_plan_document(engine=engine, global_batch=64, **config)
    document["placement"]["host_order"] = list(hosts)
    if stage_layers is not None:
        document["placement"]["stage_layers"] = list(stage_layers)
    return document


def test_slurm_pins_the_host_order():
    text = files_of(plan_from_document(placed_document()), "slurm")["slurm.sbatch"].text
    assert "#SBATCH --nodelist=h0,h2,h1,h3" in text
    assert "HOST_ORDER=(h0 h2 h1 h3)" in text and "MASTER_ADDR=${MASTER_ADDR:-${HOST_ORDER[0]}}" in text
    assert "scontrol show hostnames" not in text


def test_unplaced_slurm_script_is_unchanged():
    text = files_of(plan_from_document(make_plan_document(tp=8, dp=2, pp=2, global_batch=64)), "slurm")
    assert "HOST_ORDER" not in text["slurm.sbatch"].text and "--nodelist" not in text["slurm.sbatch"].text


def test_deepspeed_hostfile_lists_hosts_in_rank_order():
    files = files_of(plan_from_document(placed_document("deepspeed")), "deepspeed")
    lines = files["hostfile"].text.splitlines()[1:]
    assert lines == ["h0 slots=8", "h2 slots=8", "h1 slots=8", "h3 slots=8"]


def test_megatron_takes_uneven_edge_stages():
    plan = plan_from_document(placed_document(stage_layers=(7, 9, 9, 7), pp=4, dp=1, hosts=("a", "b", "c", "d")))
    text = files_of(plan, "megatron")["megatron_launch.sh"].text
    assert "--decoder-first-pipeline-num-layers 7" in text and "--decoder-last-pipeline-num-layers 7" in text
    plan = plan_from_document(placed_document(stage_layers=(8, 9, 9, 6), pp=4, dp=1, hosts=("a", "b", "c", "d")))
    text = files_of(plan, "megatron")["megatron_launch.sh"].text
    assert "--decoder-first-pipeline-num-layers 8" in text and "--decoder-last-pipeline-num-layers 6" in text


def test_torchtitan_takes_edges_no_larger_than_the_middle():
    document = placed_document("torchtitan", stage_layers=(8, 9, 9, 6), pp=4, dp=1, hosts=("a", "b", "c", "d"))
    text = files_of(plan_from_document(document), "torchtitan", torchtitan_version="0.2")["torchtitan.toml"].text
    assert "pipeline_parallel_layers_per_stage = 9" in text
    assert "pipeline_parallel_first_stage_less_layers = 1" in text
    assert "pipeline_parallel_last_stage_less_layers = 3" in text
    # An edge heavier than the middle is beyond torchtitan's weighted split: written module by module.
    heavy_edge = placed_document("torchtitan", stage_layers=(10, 8, 8, 6), pp=4, dp=1, hosts=("a", "b", "c", "d"))
    text = files_of(plan_from_document(heavy_edge), "torchtitan", torchtitan_version="0.2")["torchtitan.toml"].text
    assert "stage_less_layers" not in text
    assert '"layers.9"], ["layers.10"' in text and '["layers.26", "layers.27", "layers.28", "layers.29", ' \
        '"layers.30", "layers.31", "norm", "output"]' in text


def test_splits_no_launcher_can_express_are_refused():
    with pytest.raises(InputError, match="not a split the launch formats can express"):  # an empty stage
        plan_from_document(placed_document(stage_layers=(0, 12, 10, 10), pp=4, dp=1, hosts=("a", "b", "c", "d")))
    with pytest.raises(InputError, match="host_order must name 4 distinct hosts"):
        plan_from_document(placed_document(hosts=("h0", "h1", "h1", "h2")))
