"""torchtitan accepts (and rejects) the emitted job configuration.

0.3.0 (the ``validate`` extra): its ConfigManager parses the emitted command line on top of the
config-registry entry, ParallelDims accepts the degrees at the plan's world size, and its own
pipeline-split functions give the plan's layers per stage. 0.2.2 (TOML): checked in a subprocess
against a second install named by PARAPLAN_TORCHTITAN_0_2 (``pip install --no-deps --target DIR
torchtitan==0.2.2``; .ci/run makes one), since both releases are the package ``torchtitan``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from export_factory import captured_argv, engine_module, files_of, make_export_plan

from paraplan.exporters.plan_input import ExportPlan

pytestmark = pytest.mark.engines
engine_module("torchtitan")

import torch  # noqa: E402 - after engine_module's importorskip
from torchtitan.config import ConfigManager  # noqa: E402 - after engine_module's importorskip
from torchtitan.distributed import pipeline_parallel  # noqa: E402 - after engine_module's importorskip
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402 - after engine_module's importorskip

PLANS = {
    "llama70b-fsdp3-tp8-pp4-vpp2-cp2": {"model": "llama-3.1-70b", "tp": 8, "pp": 4, "vpp": 2, "cp": 2, "dp": 2,
                                        "sp": True, "zero": 3, "recompute": "selective", "global_batch": 32,
                                        "seq_len": 8192},
    "llama8b-zero2-dp16-full": {"model": "llama-3.1-8b", "dp": 16, "zero": 2, "mbs": 2, "recompute": "full"},
    "llama8b-ddp-tp2-pp2-1f1b": {"model": "llama-3.1-8b", "tp": 2, "pp": 2, "dp": 4, "sp": True, "zero": 0, "mbs": 2,
                                 "global_batch": 64},
    "llama70b-zero2-tp4-pp4-1f1b-full": {"model": "llama-3.1-70b", "tp": 4, "pp": 4, "dp": 2, "sp": True, "zero": 2,
                                         "global_batch": 32, "recompute": "full"},
    # A typed pipeline on mixed GPUs: a split torchtitan's weighted split cannot give, written module by module.
    "llama8b-pp4-typed-split": {"model": "llama-3.1-8b", "pp": 4, "dp": 2, "zero": 1, "split": [5, 11, 9, 7]},
    # torch.compile as the plan priced it (model and loss, torchtitan's default components).
    "llama8b-fsdp8-compiled": {"model": "llama-3.1-8b", "dp": 8, "zero": 3, "mbs": 2, "recompute": "selective",
                               "compiled": True},
    "llama70b-fsdp4-tp8-async-tp": {"model": "llama-3.1-70b", "tp": 8, "dp": 4, "sp": True, "zero": 3,
                                    "recompute": "full", "compiled": True, "async_tp": True, "global_batch": 32},
    # DualPipeV: two V-placed chunks per rank, rank 0 holding the first and the last.
    "llama8b-pp4-dualpipev": {"model": "llama-3.1-8b", "pp": 4, "vpp": 2, "dp": 2, "zero": 0,
                              "pp_schedule": "dualpipev"},
}


def plan_named(name: str) -> ExportPlan:
    settings = dict(PLANS[name])
    return make_export_plan(settings.pop("model"), engine="torchtitan", **settings)


def launch_argv(plan: ExportPlan, tmp_path: Path) -> list[str]:
    """What the emitted launch script hands torchrun, after torchrun's own options."""
    script = tmp_path / "torchtitan_launch.sh"
    script.write_text(files_of(plan, "torchtitan")["torchtitan_launch.sh"].text)
    env = {"NODE_RANK": "0", "MASTER_ADDR": "head"} if plan.num_nodes > 1 else {}
    argv = captured_argv(script, "torchrun", tmp_path, env=env)
    start = argv.index("-m")
    assert argv[start:start + 2] == ["-m", "torchtitan.train"]
    return argv[start + 2:]


@pytest.mark.parametrize("name", list(PLANS))
def test_torchtitan_0_3_parses_the_emitted_overrides(name, tmp_path):
    plan = plan_named(name)
    c = plan.config
    config = ConfigManager().parse_args(launch_argv(plan, tmp_path))
    p, t = config.parallelism, config.training
    dims = ParallelDims.from_config(p, plan.num_gpus)
    assert (dims.dp_replicate * dims.dp_shard, dims.tp, dims.pp, dims.cp) == (c.dp, c.tp, c.pp, c.cp)
    assert (dims.dp_shard > 1 or c.dp == 1) == (c.zero != 0 or c.dp == 1)
    assert p.enable_sequence_parallel == (c.sp or c.tp == 1)
    assert plan.seq_len % dims.seq_len_divisor == 0 and t.seq_len == plan.seq_len
    # Trainer.__init__'s batch arithmetic (it needs a process group, so it is restated here):
    batch_degree = dims.dp_replicate * dims.dp_shard
    assert t.global_batch_size % (t.local_batch_size * batch_degree) == 0
    accumulation = t.global_batch_size // (t.local_batch_size * batch_degree)
    micro = t.local_batch_size // p.pipeline_parallel_microbatch_size if c.pp > 1 else 1
    assert accumulation * micro == plan.num_microbatches
    assert len(config.model_spec.model.layers) == plan.model.num_layers
    assert config.model_spec.model.dim == plan.model.hidden_size
    assert config.compile.enable == plan.compiled and (not plan.compiled or config.compile.components == ["model",
                                                                                                          "loss"])
    assert config.compile.enable_async_tensor_parallel == plan.async_tp
    recompute = type(config.activation_checkpoint).__qualname__
    assert recompute == {"none": "NoneType", "selective": "SelectiveAC.Config", "full": "FullAC.Config"}[c.recompute]


@pytest.mark.parametrize("name", [n for n in PLANS if PLANS[n].get("pp", 1) > 1])
def test_torchtitan_0_3_splits_layers_as_the_plan_says(name, tmp_path):
    plan = plan_named(name)
    config = ConfigManager().parse_args(launch_argv(plan, tmp_path))
    dims = ParallelDims.from_config(config.parallelism, plan.num_gpus)
    stages, layers, first, last = pipeline_parallel._get_pipeline_metadata(dims, config.parallelism,
                                                                           config.model_spec.model)
    parts = config.parallelism.module_fqns_per_model_part or \
        pipeline_parallel._generate_llm_fqn_per_model_part(stages, layers, first, last)
    if config.parallelism.module_fqns_per_model_part:  # every name is a module of the model torchtitan builds
        with torch.device("meta"):
            model = config.model_spec.model.build()
        assert {name.split(".")[0] for part in parts for name in part} == {n for n, _ in model.named_children()}
        assert [name for part in parts for name in part if name.startswith("layers.")] == \
            [f"layers.{i}" for i in range(plan.model.num_layers)]
    assert [sum(name.startswith("layers.") for name in part) for part in parts] == list(plan.stage_layers)
    v_shape = plan.config.pp_schedule == "dualpipev"
    assert config.parallelism.pipeline_parallel_schedule == ("DualPipeV" if v_shape else
                                                             "1F1B" if plan.config.vpp == 1 else "Interleaved1F1B")
    for rank in range(plan.config.pp):  # chunk k runs on pipeline rank k mod pp; DualPipeV: ranks r and 2pp - 1 - r
        mapping = pipeline_parallel._get_pp_rank_to_stage_indices_mapping(
            rank, plan.config.pp, config.parallelism.pipeline_parallel_schedule, stages)
        expected = [rank, 2 * plan.config.pp - 1 - rank] if v_shape else list(range(rank, stages, plan.config.pp))
        assert list(mapping) == expected


def test_torchtitan_0_3_rejects_wrong_values(tmp_path, capsys):
    argv = launch_argv(plan_named("llama8b-ddp-tp2-pp2-1f1b"), tmp_path)
    typo = [w.replace("tensor_parallel_degree", "tensor_parallel_size") for w in argv]
    with pytest.raises(SystemExit):
        ConfigManager().parse_args(typo)
    assert "tensor-parallel-size" in capsys.readouterr().err.replace("_", "-")
    config = ConfigManager().parse_args(argv)
    with pytest.raises(AssertionError, match="Invalid parallel dims"):
        ParallelDims.from_config(config.parallelism, 12)
    cuda_graphs_on = [w for w in argv if w != "--training.disable_cuda_graphs"]
    with pytest.raises(SystemExit):
        ConfigManager().parse_args(cuda_graphs_on)
    assert "CUDA graphs do not support pipeline parallelism" in capsys.readouterr().err


# -- torchtitan 0.2 (TOML) --------------------------------------------------------------------
CHECK_0_2 = """
import json, sys
from torchtitan.config import ConfigManager
from torchtitan.distributed.parallel_dims import ParallelDims
import torchtitan
config = ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
p, t = config.parallelism, config.training
dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                    cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                    ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=int(sys.argv[2]))
print(json.dumps({"file": torchtitan.__file__, "dp_shard": dims.dp_shard, "dp_replicate": dims.dp_replicate,
                  "tp": dims.tp, "pp": dims.pp, "cp": dims.cp, "local": t.local_batch_size,
                  "global": t.global_batch_size, "seq": t.seq_len, "mode": config.activation_checkpoint.mode,
                  "model": [config.model.name, config.model.flavor], "converters": config.model.converters,
                  "layers_per_stage": p.pipeline_parallel_layers_per_stage,
                  "reshard": p.fsdp_reshard_after_forward}))
"""


def run_torchtitan_0_2(toml: Path, world_size: int, script: str = CHECK_0_2) -> subprocess.CompletedProcess:
    target = os.environ.get("PARAPLAN_TORCHTITAN_0_2")
    if not target:
        if os.environ.get("PARAPLAN_REQUIRE_ENGINES") == "1":
            pytest.fail("PARAPLAN_REQUIRE_ENGINES=1 but PARAPLAN_TORCHTITAN_0_2 names no torchtitan 0.2 install")
        pytest.skip("set PARAPLAN_TORCHTITAN_0_2 to a 'pip install --no-deps --target DIR torchtitan==0.2.2' folder")
    env = {**os.environ, "PYTHONPATH": target}
    return subprocess.run([sys.executable, "-c", script, str(toml), str(world_size)], check=False, env=env,
                          capture_output=True, text=True, timeout=300)


def test_torchtitan_0_2_parses_the_emitted_toml(tmp_path):
    plan = plan_named("llama70b-fsdp3-tp8-pp4-vpp2-cp2")
    files = files_of(plan, "torchtitan", torchtitan_version="0.2")
    toml = tmp_path / "torchtitan.toml"
    toml.write_text(files["torchtitan.toml"].text)
    result = run_torchtitan_0_2(toml, plan.num_gpus)
    assert result.returncode == 0, result.stderr[-2000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    assert parsed["file"].startswith(os.environ["PARAPLAN_TORCHTITAN_0_2"])  # really 0.2, not the 0.3 install
    assert parsed | {"file": None} == {
        "file": None, "dp_shard": 2, "dp_replicate": 1, "tp": 8, "pp": 4, "cp": 2, "local": 16, "global": 32,
        "seq": 8192, "mode": "selective", "model": ["llama3", "70B"], "converters": [], "layers_per_stage": 10,
        "reshard": "always"}


DUALPIPE_0_2 = """
import json, sys
from torchtitan.config import ConfigManager
config = ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
p = config.parallelism
print(json.dumps({"schedule": p.pipeline_parallel_schedule, "overlap": p.pipeline_parallel_expert_parallel_overlap,
                  "ep": p.expert_parallel_degree, "recipe": config.quantize.linear.float8.recipe_name}))
"""


def test_torchtitan_0_2_reads_dualpipev_without_the_expert_overlap_and_the_rowwise_recipe(tmp_path):
    plan = make_export_plan("deepseek-v3", engine="torchtitan", pp=2, vpp=2, dp=8, ep=8, zero=3, precision="fp8",
                            pp_schedule="dualpipev")
    plan = dataclasses.replace(plan, fp8_recipe="rowwise")
    toml = tmp_path / "torchtitan.toml"
    toml.write_text(files_of(plan, "torchtitan", torchtitan_version="0.2",
                             torchtitan_model="deepseek_v3:16B")["torchtitan.toml"].text)
    result = run_torchtitan_0_2(toml, plan.num_gpus, DUALPIPE_0_2)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"schedule": "DualPipeV", "overlap": False, "ep": 8,
                                                                  "recipe": "rowwise"}


DEEPEP_0_2 = """
import json, sys
from torchtitan.config import ConfigManager
config = ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
p = config.parallelism
print(json.dumps({"ep": p.expert_parallel_degree, "backend": p.expert_parallel_comm_backend}))
"""


def test_torchtitan_0_2_reads_the_deepep_backend_of_a_deepep_plan(tmp_path):
    plan = dataclasses.replace(make_export_plan("deepseek-v3", engine="torchtitan", pp=1, dp=16, ep=8, zero=3),
                               dispatcher="deepep")
    toml = tmp_path / "torchtitan.toml"
    toml.write_text(files_of(plan, "torchtitan", torchtitan_version="0.2",
                             torchtitan_model="deepseek_v3:16B")["torchtitan.toml"].text)
    result = run_torchtitan_0_2(toml, plan.num_gpus, DEEPEP_0_2)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"ep": 8, "backend": "deepep"}


def test_torchtitan_0_2_rejects_a_misspelt_key(tmp_path):
    plan = plan_named("llama8b-zero2-dp16-full")
    text = files_of(plan, "torchtitan", torchtitan_version="0.2")["torchtitan.toml"].text
    toml = tmp_path / "torchtitan.toml"
    toml.write_text(text.replace("tensor_parallel_degree", "tensor_parallel_size"))
    result = run_torchtitan_0_2(toml, plan.num_gpus)
    assert result.returncode != 0 and "tensor_parallel_size" in result.stderr


# -- pipeline split: torchtitan's own split functions on the emitted settings -------------------------
SPLITS = {  # name -> (model, shape override, pp, vpp, decoder layers per stage derived by hand)
    # 126 + 1 + 1 over 8: 16 each, the embedding and the output weigh one layer.
    "llama405b-126-on-pp8": ("llama-3.1-405b", None, 8, 1, [15] + [16] * 6 + [15]),
    # 128 / 12 = 10 rest 8: the first 8 stages take 11, then the weights come off the edges.
    "llama405b-126-on-pp12": ("llama-3.1-405b", None, 12, 1, [10] + [11] * 7 + [10, 10, 10, 9]),
    "bloom-70-on-pp12": ("llama-2-7b", {"num_layers": 70}, 12, 1, [5] + [6] * 10 + [5]),  # 72 / 12
    "deepseek-v3-61-on-pp4": ("deepseek-v3", None, 4, 1, [15, 16, 16, 14]),  # 63 / 4 = 15 rest 3
    # 63 / 16 = 3 rest 15 over pp 4 x vpp 4 (needs layers_per_stage 4: ⌈63 / 4⌉ = 16 stages).
    "deepseek-v3-61-on-pp4-vpp4": ("deepseek-v3", None, 4, 4, [3] + [4] * 14 + [2]),
    # 128 / 128 = 1: the first stage holds the embedding alone, the last the output alone.
    "llama405b-126-on-pp16-vpp8": ("llama-3.1-405b", None, 16, 8, [0] + [1] * 126 + [0]),
    "llama8b-32-on-pp4-even": ("llama-3.1-8b", None, 4, 1, [8, 8, 8, 8]),  # weights 0: the even split
}


def split_plan(name: str) -> ExportPlan:
    model, shape, pp, vpp, _ = SPLITS[name]
    return make_export_plan(model, engine="torchtitan", shape=shape, pp=pp, vpp=vpp, dp=1, zero=0,
                            global_batch=2 * pp, gpus_per_node=pp)


def split_argv(plan: ExportPlan, tmp_path: Path) -> list[str]:
    """The emitted 0.3 command line (the llama3_8b registry entry stands in for the model: the split reads
    only the parallelism fields and the layer count, which the test gives torchtitan itself)."""
    script = tmp_path / "torchtitan_launch.sh"
    script.write_text(files_of(plan, "torchtitan", torchtitan_model="llama3:llama3_8b")["torchtitan_launch.sh"].text)
    argv = captured_argv(script, "torchrun", tmp_path, env={"NODE_RANK": "0", "MASTER_ADDR": "head"})
    return argv[argv.index("-m") + 2:]


@pytest.mark.parametrize("name", list(SPLITS))
def test_torchtitan_0_3_splits_uneven_layer_counts_as_the_plan_priced(name, tmp_path):
    from types import SimpleNamespace

    plan, by_hand = split_plan(name), SPLITS[name][-1]
    assert list(plan.stage_layers) == by_hand
    config = ConfigManager().parse_args(split_argv(plan, tmp_path))
    dims = ParallelDims.from_config(config.parallelism, plan.num_gpus)
    model = SimpleNamespace(layers=[None] * plan.model.num_layers)
    stages, layers, first, last = pipeline_parallel._get_pipeline_metadata(dims, config.parallelism, model)
    parts = pipeline_parallel._generate_llm_fqn_per_model_part(stages, layers, first, last)
    assert [sum(name.startswith("layers.") for name in part) for part in parts] == by_hand
    assert ("tok_embeddings" in parts[0], "lm_head" in parts[-1]) == (True, True)


SPLIT_0_2 = """
import json, math, sys
from torchtitan.config import ConfigManager
from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part
p = ConfigManager().parse_args(["--job.config_file", sys.argv[1]]).parallelism
num_layers = int(sys.argv[3])
first, last, size = (p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers,
                     p.pipeline_parallel_layers_per_stage)
# pipeline_llm (0.2.2): ceil((layers + weights) / layers_per_stage) stages, else pp x (1 or 2) by schedule.
single = p.pipeline_parallel_schedule == "1F1B"
stages = math.ceil((num_layers + first + last) / size) if size else p.pipeline_parallel_degree * (1 if single else 2)
parts = generate_llm_fqn_per_model_part(stages, num_layers, first, last)
print(json.dumps([sum(m.startswith("layers.") for m in part) for part in parts]))
"""


@pytest.mark.parametrize("name", ["llama405b-126-on-pp8", "bloom-70-on-pp12", "deepseek-v3-61-on-pp4-vpp4"])
def test_torchtitan_0_2_splits_uneven_layer_counts_as_the_plan_priced(name, tmp_path):
    plan = split_plan(name)
    toml = tmp_path / "torchtitan.toml"
    toml.write_text(files_of(plan, "torchtitan", torchtitan_version="0.2",
                             torchtitan_model="llama3:8B")["torchtitan.toml"].text)
    result = run_torchtitan_0_2(toml, plan.num_gpus, f"import sys; sys.argv.append('{plan.model.num_layers}')\n"
                                + SPLIT_0_2)  # the layer count: argv[3]
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == SPLITS[name][-1]


FQNS_0_2 = """
import json, sys
from torchtitan.config import ConfigManager
print(json.dumps(ConfigManager().parse_args(["--job.config_file", sys.argv[1]]).parallelism.module_fqns_per_model_part))
"""


def test_torchtitan_0_2_reads_a_typed_split_module_by_module(tmp_path):
    plan = plan_named("llama8b-pp4-typed-split")
    toml = tmp_path / "torchtitan.toml"
    toml.write_text(files_of(plan, "torchtitan", torchtitan_version="0.2")["torchtitan.toml"].text)
    result = run_torchtitan_0_2(toml, plan.num_gpus, FQNS_0_2)
    assert result.returncode == 0, result.stderr[-2000:]
    parts = json.loads(result.stdout.strip().splitlines()[-1])
    assert [sum(m.startswith("layers.") for m in part) for part in parts] == list(plan.stage_layers)
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]  # 0.2's llama3 head
