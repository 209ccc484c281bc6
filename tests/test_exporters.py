"""Exporters without the engines installed: exact flags, layouts, file safety and shell quoting.

The engines' own code checks the same outputs in tests/test_engines_*.py (marked ``engines``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from export_factory import captured_argv, files_of, make_export_plan, make_plan_document

from paraplan.errors import InputError
from paraplan.exporters import writer
from paraplan.exporters.deepspeed import ds_config
from paraplan.exporters.formats import ExportOptions, export_files, output_names
from paraplan.exporters.megatron import layer_pattern, megatron_program, vocab_divisor
from paraplan.exporters.plan_input import plan_from_document
from paraplan.exporters.program import OutputFile
from paraplan.exporters.torchtitan import parallelism as torchtitan_parallelism
from paraplan.exporters.torchtitan import torchtitan_program
from paraplan.model_specs.hf_config import load_model, preset_names
from paraplan.planner.layout import axis_groups, expert_map, rank_map, stage_layers
from paraplan.planner.plan import model_from_shape, model_shape


def group_args(program, name: str) -> list[str]:
    """One argument group of a Program as flat strings."""
    group = next(g for g in program.groups if g.name == name)
    def words(value) -> list[str]:
        return [] if value is None else list(value) if isinstance(value, tuple) else [str(value)]
    return [word for flag, value in group.args for word in (flag, *words(value))]


# -- layout -----------------------------------------------------------------------------------
def test_rank_map_puts_tp_fastest_then_cp_dp_pp_and_numbers_nodes_like_torchrun():
    rows = rank_map(tp=2, cp=2, dp=2, pp=2, gpus_per_node=8)
    assert rows[5] == {"rank": 5, "node": 0, "local_rank": 5, "tp": 1, "cp": 0, "dp": 1, "pp": 0}
    assert rows[13] == {"rank": 13, "node": 1, "local_rank": 5, "tp": 1, "cp": 0, "dp": 1, "pp": 1}
    # Megatron's RankGenerator(tp=2, dp=2, pp=2, cp=2, order="tp-cp-ep-dp-pp") gives these groups.
    assert axis_groups(rows, "tp")[:2] == [[0, 1], [2, 3]]
    assert axis_groups(rows, "cp")[:2] == [[0, 2], [1, 3]]
    assert axis_groups(rows, "dp")[:2] == [[0, 4], [1, 5]]
    assert axis_groups(rows, "pp")[:2] == [[0, 8], [1, 9]]


def test_stage_layers_even_edge_accounted_explicit_or_refused():
    assert stage_layers(80, 4, 5) == [4] * 20
    assert stage_layers(30, 4, 1) == [7, 8, 8, 7]  # (30 + 2) / 4, one fewer on the first and last stage
    assert stage_layers(62, 4, 2) == [7, 8, 8, 8, 8, 8, 8, 7]
    assert stage_layers(31, 4, 1) == [7, 9, 9, 6]  # explicit edges: middle ⌈33/4⌉, the first the larger half
    with pytest.raises(ValueError, match="61 layers"):
        stage_layers(61, 32, 1)


def test_expert_map_groups_and_contiguous_expert_blocks():
    mapping = expert_map(num_experts=8, moe_layers=[0, 1], ep=4, etp=1, world_size=16, pp=2)
    assert mapping["expert_dp"] == 2
    assert mapping["ep_groups"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert mapping["ranks"][6]["experts"] == [4, 5] and mapping["ranks"][6]["ep"] == 2
    with_etp = expert_map(num_experts=8, moe_layers=[0], ep=2, etp=2, world_size=8, pp=1)
    assert with_etp["ep_groups"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    with pytest.raises(ValueError, match="divide"):
        expert_map(num_experts=6, moe_layers=[0], ep=4, etp=1, world_size=8, pp=1)
    assert expert_map(num_experts=0, moe_layers=[], ep=1, etp=1, world_size=8, pp=1)["ranks"] == []


@pytest.mark.parametrize("name", preset_names())
def test_plan_model_shape_round_trips_every_preset(name):
    spec = load_model(name)
    assert model_from_shape(name, json.loads(json.dumps(model_shape(spec)))) == spec


def test_a_bad_shape_is_one_input_error():
    shape = model_shape(load_model("llama-3.1-8b")) | {"num_kv_heads": 5}
    with pytest.raises(InputError, match="not a multiple of 5 KV heads"):
        model_from_shape("x", shape)


# -- plan input -------------------------------------------------------------------------------
def test_plan_input_derives_nodes_microbatches_and_checks_the_world_size():
    plan = make_export_plan(tp=2, dp=8, mbs=2, global_batch=64)
    assert (plan.num_nodes, plan.gpus_per_node, plan.num_microbatches) == (2, 8, 4)
    document = make_plan_document(tp=2, dp=8)
    document["cluster"]["num_gpus"] = 32
    with pytest.raises(InputError, match="must equal the cluster's 32 GPUs"):
        plan_from_document(document)


def test_any_one_chunk_per_rank_split_is_kept_and_other_splits_are_refused():
    document = make_plan_document("llama-3.1-8b", pp=4, dp=2)
    assert plan_from_document(document).stage_layers == (8, 8, 8, 8)
    document["placement"]["stage_layers"] = [7, 9, 10, 6]  # a typed pipeline's split: unequal middle stages
    assert plan_from_document(document).stage_layers == (7, 9, 10, 6)
    for wrong in ([7, 9, 8, 9], [0, 12, 10, 10]):  # 33 layers; an empty stage
        document["placement"]["stage_layers"] = wrong
        with pytest.raises(InputError, match=r"is not a split the launch formats can express"):
            plan_from_document(document)
    interleaved = make_plan_document("llama-3.1-8b", pp=2, vpp=2, dp=2)
    interleaved["placement"]["stage_layers"] = [7, 9, 8, 8]  # virtual stages keep the engine's own split
    with pytest.raises(InputError, match=r"the engine's own split \[8, 8, 8, 8\]"):
        plan_from_document(interleaved)


def test_unequal_middle_stages_export_literally():
    split = [7, 9, 10, 6]
    megatron = make_export_plan("llama-3.1-8b", pp=4, dp=2, split=split)
    args = group_args(megatron_program(megatron), "PARALLEL_ARGS")
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "E" + "t" * 7 + "|" + "t" * 9 + "|" \
        + "t" * 10 + "|" + "t" * 6 + "L"
    assert "--decoder-first-pipeline-num-layers" not in args
    titan = make_export_plan("llama-3.1-8b", engine="torchtitan", pp=4, dp=2, split=split)
    parts = {version: torchtitan_parallelism(titan, version)["module_fqns_per_model_part"]
             for version in ("0.3", "0.2")}
    assert [sum(m.startswith("layers.") for m in part) for part in parts["0.3"]] == split
    assert parts["0.3"][0][:2] == ["tok_embeddings", "layers.0"]
    assert parts["0.3"][-1][-3:] == ["layers.31", "norm", "lm_head"]
    assert parts["0.2"][-1][-1] == "output" and parts["0.2"][:-1] == parts["0.3"][:-1]
    assert "pipeline_parallel_first_stage_less_layers" not in torchtitan_parallelism(titan, "0.3")


def test_a_custom_rank_map_is_refused_not_ignored():
    document = make_plan_document(tp=2, dp=2, gpus_per_node=4)
    rows = rank_map(tp=2, cp=1, dp=2, pp=1, gpus_per_node=4)
    document["placement"]["rank_map"] = rows
    assert plan_from_document(document).ranks == tuple(rows)
    rows[0]["tp"], rows[1]["tp"] = 1, 0
    with pytest.raises(InputError, match="can only start ranks in that layout"):
        plan_from_document(document)


# -- Megatron ---------------------------------------------------------------------------------
def test_megatron_llama70b_parallel_flags_exact():
    plan = make_export_plan("llama-3.1-70b", tp=8, pp=4, vpp=5, cp=2, dp=2, sp=True, zero=1, recompute="full",
                            global_batch=64, seq_len=8192)
    program = megatron_program(plan)
    assert group_args(program, "PARALLEL_ARGS") == [
        "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "4", "--context-parallel-size", "2",
        "--cp-comm-type", "p2p", "--num-layers-per-virtual-pipeline-stage", "4", "--sequence-parallel",
        "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    assert group_args(program, "BATCH_ARGS") == [
        "--micro-batch-size", "1", "--global-batch-size", "64", "--recompute-granularity", "full",
        "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    model = group_args(program, "MODEL_ARGS")
    for pair in (["--num-layers", "80"], ["--hidden-size", "8192"], ["--ffn-hidden-size", "28672"],
                 ["--num-query-groups", "8"], ["--kv-channels", "128"], ["--seq-length", "8192"],
                 ["--normalization", "RMSNorm"], ["--hidden-dropout", "0.0"]):
        index = model.index(pair[0])
        assert model[index:index + 2] == pair
    assert {"--swiglu", "--group-query-attention", "--untie-embeddings-and-output-weights",
            "--disable-bias-linear"} <= set(model)
    assert program.env == (("CUDA_DEVICE_MAX_CONNECTIONS", "1", program.env[0][2]),)


def test_megatron_uneven_first_last_and_edge_accounted_virtual_stages():
    # deepseek-v3: 61 layers. pp = 3: (61 + 2) / 3 = 21 -> stages 20, 21, 20.
    plan = make_export_plan("deepseek-v3", pp=3, dp=8, ep=8, global_batch=48)
    args = group_args(megatron_program(plan), "PARALLEL_ARGS")
    assert args[args.index("--decoder-first-pipeline-num-layers"):][:4] == [
        "--decoder-first-pipeline-num-layers", "20", "--decoder-last-pipeline-num-layers", "20"]
    # pp = 9, vpp = 7: (61 + 2) / 63 = 1 per chunk is too thin; pp = 3, vpp = 3: 63 / 9 = 7 per chunk.
    plan = make_export_plan("deepseek-v3", pp=3, vpp=3, dp=8, ep=8, global_batch=48)
    args = group_args(megatron_program(plan), "PARALLEL_ARGS")
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(args)
    assert args[args.index("--num-layers-per-virtual-pipeline-stage") + 1] == "7"
    assert "--decoder-first-pipeline-num-layers" not in args
    # pp = 4, vpp = 4: 63 / 16 chunks does not divide; Megatron's layout string names every chunk.
    plan = make_export_plan("deepseek-v3", pp=4, vpp=4, dp=8, ep=8, global_batch=64)
    args = group_args(megatron_program(plan), "PARALLEL_ARGS")
    layout = args[args.index("--pipeline-model-parallel-layout") + 1]
    assert layout == "Ettt|(tttt|)*14ttmL"  # 14 middle chunks of 4; its MTP layer rides with the loss
    assert "--num-layers-per-virtual-pipeline-stage" not in args


def test_megatron_layout_puts_the_embedding_or_the_loss_alone_in_an_edge_chunk():
    # llama-3.1-405b on pp 16 x vpp 8 (what the 16,384-GPU search picks): 126 + 2 over 128 chunks.
    plan = make_export_plan("llama-3.1-405b", tp=8, pp=16, vpp=8, global_batch=32)
    assert plan.stage_layers == (0,) + (1,) * 126 + (0,)
    args = group_args(megatron_program(plan), "PARALLEL_ARGS")
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "E|(t|)*126L"
    assert "--account-for-embedding-in-pipeline-split" not in args
    # DeepSeek-V3 on pp 16 x vpp 2: 30 chunks of 2, one of 1; the last chunk holds MTP and the loss.
    plan = make_export_plan("deepseek-v3", pp=16, vpp=2, dp=8, ep=8, global_batch=128)
    args = group_args(megatron_program(plan), "PARALLEL_ARGS")
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et|(tt|)*30mL"


def test_megatron_modules_recompute_names_the_modules_the_model_has():
    def batch(model, **config):
        return group_args(megatron_program(make_export_plan(model, recompute="modules", **config)), "BATCH_ARGS")
    assert batch("llama-3.1-8b", tp=2, dp=4, sp=True)[4:] == [
        "--recompute-granularity", "selective", "--recompute-modules", "layernorm"]
    assert batch("mixtral-8x7b", dp=8, ep=8)[4:] == [
        "--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act"]
    assert batch("deepseek-v3", pp=4, dp=8, ep=8, global_batch=64)[4:] == [
        "--recompute-granularity", "selective", "--recompute-modules", "layernorm", "mla_up_proj", "moe_act"]


def test_megatron_moe_and_mla_flags():
    program = megatron_program(make_export_plan("deepseek-v3", pp=3, dp=8, ep=8, global_batch=48))
    parallel, model = group_args(program, "PARALLEL_ARGS"), group_args(program, "MODEL_ARGS")
    assert parallel[parallel.index("--expert-model-parallel-size"):][:4] == [
        "--expert-model-parallel-size", "8", "--expert-tensor-parallel-size", "1"]
    for pair in (["--num-experts", "256"], ["--moe-router-topk", "8"], ["--moe-ffn-hidden-size", "2048"],
                 ["--moe-shared-expert-intermediate-size", "2048"], ["--moe-layer-freq", "([0]*3+[1]*58)"],
                 ["--moe-token-dispatcher-type", "alltoall"], ["--q-lora-rank", "1536"], ["--kv-lora-rank", "512"],
                 ["--qk-head-dim", "128"], ["--qk-pos-emb-head-dim", "64"], ["--v-head-dim", "128"],
                 ["--mtp-num-layers", "1"]):
        index = model.index(pair[0])
        assert model[index:index + 2] == pair
    assert "--multi-latent-attention" in model and "--kv-channels" not in model and "--num-query-groups" not in model
    dense = megatron_program(make_export_plan("llama-3.1-8b", dp=8))
    assert "--expert-model-parallel-size" not in group_args(dense, "PARALLEL_ARGS")


def test_megatron_fused_expert_mlp_is_the_op_fuser_flag_with_its_kernel_switch():
    """--use-transformer-engine-op-fuser (TransformerConfig.use_transformer_engine_op_fuser, Megatron-LM core_r0.18
    arguments.py) and NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 (Megatron-Bridge's cutedsl_fused_grouped_mlp), only when the
    plan was priced fused; expert tensor parallelism is refused (TEGroupedMLP._is_fused_impl_supported)."""
    fused = megatron_program(make_export_plan("gpt-oss-120b", dp=8, ep=8, fused_expert_mlp=True))
    assert group_args(fused, "MODEL_ARGS")[-1] == "--use-transformer-engine-op-fuser"
    assert [(name, value) for name, value, _ in fused.env] == [("NVTE_CUTEDSL_FUSED_GROUPED_MLP", "1")]
    eager = megatron_program(make_export_plan("gpt-oss-120b", dp=8, ep=8))
    assert "--use-transformer-engine-op-fuser" not in eager.argv() and eager.env == ()
    assert make_export_plan("gpt-oss-120b", dp=8, ep=8, fused_expert_mlp=False).fused_expert_mlp is False
    dense = megatron_program(make_export_plan("llama-3.1-8b", dp=8, fused_expert_mlp=True))
    assert "--use-transformer-engine-op-fuser" not in dense.argv() and dense.env == ()
    with pytest.raises(InputError, match="expert tensor parallelism 1 only"):
        megatron_program(make_export_plan("gpt-oss-120b", dp=8, ep=4, etp=2, fused_expert_mlp=True))


def test_engines_without_a_fused_expert_switch_say_so():
    titan = make_export_plan("qwen3-30b-a3b", engine="torchtitan", dp=8, ep=8, zero=3, fused_expert_mlp=True)
    text = files_of(titan, "torchtitan", torchtitan_model="qwen3:qwen3_30b_a3b")["torchtitan_launch.sh"].text
    assert "# Not expressed: the plan priced the routed experts' MLP fused" in text
    speed = make_export_plan("qwen3-30b-a3b", engine="deepspeed", dp=8, zero=1, fused_expert_mlp=True)
    launch = files_of(speed, "deepspeed")["deepspeed_launch.sh"].text
    assert "# Model code must: run the routed experts' MLP fused" in launch
    eager = make_export_plan("qwen3-30b-a3b", engine="deepspeed", dp=8, zero=1)
    assert "routed experts' MLP fused" not in files_of(eager, "deepspeed")["deepspeed_launch.sh"].text


def test_the_json_export_keeps_the_fused_expert_mlp():
    plan = make_export_plan("gpt-oss-120b", dp=8, ep=8, fused_expert_mlp=True)
    written = json.loads(files_of(plan, "json")["plan.json"].text)
    assert written["plans"][0]["job"]["fused_expert_mlp"] is True
    assert plan_from_document(written["plans"][0]).fused_expert_mlp is True


def test_layer_pattern_run_length_codes_moe_layers():
    assert layer_pattern(6, (1, 2, 5)) == "([0]*1+[1]*2+[0]*2+[1]*1)"
    assert layer_pattern(3, (0, 1, 2)) == "([1]*3)"


@pytest.mark.parametrize("precision, zero, expected", [
    ("bf16", 1, ["--bf16", "--attention-backend", "fused"]),
    ("fp8", 1, ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--grad-reduce-in-bf16",
                "--fp8-param-gather", "--attention-backend", "fused"]),
    ("fp8", 0, ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--grad-reduce-in-bf16",
                "--attention-backend", "fused"]),
    ("fp4", 3, ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4", "--grad-reduce-in-bf16",
                "--fp4-param-gather", "--attention-backend", "fused"]),
])
def test_megatron_precision_flags(precision, zero, expected):
    plan = make_export_plan(dp=8, zero=zero, precision=precision)
    assert group_args(megatron_program(plan), "PRECISION_ARGS") == expected


def test_megatron_fsdp_and_offload_and_the_connections_variable():
    fsdp = megatron_program(make_export_plan(tp=2, dp=4, zero=3))
    assert group_args(fsdp, "PARALLEL_ARGS")[6:] == [
        "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
        "--use-distributed-optimizer", "--no-gradient-accumulation-fusion", "--ckpt-format", "fsdp_dtensor",
        "--overlap-grad-reduce", "--overlap-param-gather"]
    assert fsdp.env == ()  # Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1
    offload = megatron_program(make_export_plan(dp=8, offload=12))
    assert group_args(offload, "BATCH_ARGS")[-2:] == ["--cpu-offloading-num-layers", "12"]
    assert megatron_program(make_export_plan(dp=8)).env == ()  # no TP, no CP: not needed


def test_megatron_refuses_alibi_and_other_engines_plans():
    with pytest.raises(InputError, match="ALiBi"):
        megatron_program(make_export_plan("mpt-7b", dp=8))
    with pytest.raises(InputError, match="re-plan with --engine megatron"):
        megatron_program(make_export_plan(dp=8, engine="deepspeed"))


def test_vocab_divisor_keeps_the_exact_vocabulary_when_tp_divides_it():
    assert vocab_divisor(128256, 8) == 32 and 128256 % (32 * 8) == 0
    assert vocab_divisor(32000, 1) == 128
    assert vocab_divisor(50257, 2) == 128  # odd vocabulary: Megatron must pad anyway


# -- DeepSpeed ---------------------------------------------------------------------------------
def test_ds_config_batch_zero_tp_and_recompute():
    config = ds_config(make_export_plan(engine="deepspeed", tp=2, dp=4, mbs=2, global_batch=64, zero=3,
                                        recompute="full"))
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"],
            config["gradient_accumulation_steps"]) == (64, 2, 8)
    assert config["zero_optimization"] == {
        "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 4096 ** 2,
        "stage3_prefetch_bucket_size": int(0.9 * 4096 ** 2), "stage3_param_persistence_threshold": 40960,
        "stage3_gather_16bit_weights_on_model_save": True}
    assert config["tensor_parallel"] == {"autotp_size": 2}
    assert config["activation_checkpointing"]["partition_activations"] is True
    assert config["bf16"] == {"enabled": True} and config["gradient_clipping"] == 1.0
    plain = ds_config(make_export_plan(engine="deepspeed", dp=8))
    assert plain["zero_optimization"] == {"stage": 0} and "tensor_parallel" not in plain


def test_deepspeed_hostfile_and_launcher_command(tmp_path):
    plan = make_export_plan(engine="deepspeed", dp=16, zero=2)
    files = files_of(plan, "deepspeed")
    assert files["hostfile"].text.splitlines()[1:] == ["node-0 slots=8", "node-1 slots=8"]
    for f in files.values():
        (tmp_path / f.name).write_text(f.text)
    argv = captured_argv(tmp_path / "deepspeed_launch.sh", "deepspeed", tmp_path, args=("--seed", "7"))
    assert argv == ["--hostfile", f"{tmp_path}/hostfile", "--num_nodes", "2", "--num_gpus", "8", "--master_port",
                    "29500", "train.py", "--deepspeed", "--deepspeed_config", f"{tmp_path}/ds_config.json",
                    "--seed", "7"]


# -- torchtitan -------------------------------------------------------------------------------
def test_torchtitan_0_3_overrides_exact():
    plan = make_export_plan("llama-3.1-70b", engine="torchtitan", tp=8, pp=4, vpp=2, cp=2, dp=2, sp=True, zero=3,
                            recompute="selective", mbs=1, global_batch=32, seq_len=8192)
    assert torchtitan_program(plan, "0.3").argv() == [
        "--module", "llama3", "--config", "llama3_70b",
        "--parallelism.data_parallel_replicate_degree", "1", "--parallelism.data_parallel_shard_degree", "2",
        "--parallelism.fsdp_reshard_after_forward", "always", "--parallelism.tensor_parallel_degree", "8",
        "--parallelism.enable_sequence_parallel", "--parallelism.pipeline_parallel_degree", "4",
        "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B",
        "--parallelism.pipeline_parallel_layers_per_stage", "10",
        "--parallelism.pipeline_parallel_first_stage_less_layers", "0",
        "--parallelism.pipeline_parallel_last_stage_less_layers", "0",
        "--parallelism.pipeline_parallel_microbatch_size", "1", "--parallelism.context_parallel_degree", "2",
        "--training.local_batch_size", "16", "--training.global_batch_size", "32", "--training.seq_len", "8192",
        "--training.disable_cuda_graphs", "activation-checkpoint:selective"]


def test_torchtitan_0_2_toml_and_refusals():
    plan = make_export_plan("llama-3.1-8b", engine="torchtitan", dp=8, zero=2, mbs=2, global_batch=64,
                            precision="fp8")
    program = torchtitan_program(plan, "0.2")
    assert program.argv() == ["--job.config_file", "torchtitan.toml"]
    toml = program.config_files[0].text
    assert '[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["quantize.linear.float8"]' in toml
    assert "data_parallel_shard_degree = 8" in toml and 'fsdp_reshard_after_forward = "never"' in toml
    assert "local_batch_size = 2\nglobal_batch_size = 64" in toml and 'mode = "none"' in toml
    with pytest.raises(InputError, match="config-registry function"):
        torchtitan_program(plan, "0.3")
    with pytest.raises(InputError, match="--torchtitan-model"):
        torchtitan_program(make_export_plan("gpt3-175b", engine="torchtitan", dp=8), "0.3")
    assert torchtitan_program(make_export_plan("gpt3-175b", engine="torchtitan", dp=8), "0.3",
                              "mymodels:gpt3_175b").argv()[:4] == ["--module", "mymodels", "--config", "gpt3_175b"]


# -- formats and launchers ----------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["megatron", "deepspeed", "torchtitan"])
@pytest.mark.parametrize("fmt", ["json", "slurm", "k8s", "all", "engine"])
def test_output_names_match_the_files_written(engine, fmt):
    fmt = engine if fmt == "engine" else fmt
    plan = make_export_plan(engine=engine, dp=16)
    for version in ("0.3", "0.2"):
        options = ExportOptions(torchtitan_version=version)
        assert [f.name for f in export_files(plan, fmt, options)] == output_names(fmt, engine, options)


def test_an_engine_format_must_match_the_plans_engine():
    with pytest.raises(InputError, match="--format deepspeed needs a plan made for deepspeed"):
        output_names("deepspeed", "megatron", ExportOptions())
    with pytest.raises(InputError, match="--format expects"):
        output_names("docker", "megatron", ExportOptions())


def test_every_shell_script_passes_bash_n(tmp_path):
    plans = [make_export_plan(dp=16), make_export_plan(engine="deepspeed", dp=8, tp=2),
             make_export_plan(engine="torchtitan", dp=16, zero=3), make_export_plan(dp=1, tp=1, gpus_per_node=1)]
    scripts = 0
    for index, plan in enumerate(plans):
        for f in export_files(plan, "all", ExportOptions()):
            if f.executable:
                path = tmp_path / f"{index}-{f.name}"
                path.write_text(f.text)
                subprocess.run(["bash", "-n", str(path)], check=True)
                scripts += 1
    assert scripts == 8


def test_pytorchjob_structure():
    files = files_of(make_export_plan(engine="deepspeed", dp=24, global_batch=48), "k8s", job_name="run-1",
                     image="img:1")
    job, config_map = yaml.safe_load_all(files["pytorchjob.yaml"].text)
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == ("kubeflow.org/v1", "PyTorchJob", "run-1")
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"], job["spec"]["nprocPerNode"]) == (1, 2, "8")
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert (container["name"], container["image"]) == ("pytorch", "img:1")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["args"][:3] == ["train.py", "--deepspeed", "--deepspeed_config"]
    assert container["args"][3] == "/etc/paraplan/ds_config.json"
    assert json.loads(config_map["data"]["ds_config.json"])["train_batch_size"] == 48
    assert "&id" not in files["pytorchjob.yaml"].text  # no YAML anchors between Master and Worker


def test_job_names_are_checked():
    with pytest.raises(InputError, match="--job-name"):
        files_of(make_export_plan(dp=8), "slurm", job_name="Bad Name;rm")
    assert "#SBATCH --job-name=llama-3-1-8b-paraplan" in files_of(make_export_plan(dp=8), "slurm")["slurm.sbatch"].text


def test_plan_values_reach_the_program_verbatim_however_they_are_spelled(tmp_path):
    """A hostile model name and torchtitan config stay inside comments and single words."""
    document = make_plan_document("llama-3.1-8b", engine="torchtitan", dp=2, gpus_per_node=2)
    document["model"]["name"] = "evil\n$(touch pwned) `id`; rm -rf x"
    plan = plan_from_document(document)
    weird = "llama3:llama3_8b'; touch pwned2 #"
    files = files_of(plan, "torchtitan", torchtitan_model=weird)
    script = tmp_path / "torchtitan_launch.sh"
    script.write_text(files["torchtitan_launch.sh"].text)
    argv = captured_argv(script, "torchrun", tmp_path, env={"PWD": str(tmp_path)})
    assert argv[argv.index("--config") + 1] == "llama3_8b'; touch pwned2 #"
    assert not list(tmp_path.glob("pwned*")) and not list(Path.cwd().glob("pwned*"))


# -- writing -----------------------------------------------------------------------------------
def test_writer_creates_refuses_and_forces(tmp_path):
    out = tmp_path / "out"
    files = [OutputFile(name="a.sh", text="echo a\n", executable=True), OutputFile(name="b.json", text="{}\n")]
    assert writer.write_files(out, files, force=False) == [out / "a.sh", out / "b.json"]
    assert os.access(out / "a.sh", os.X_OK) and not os.access(out / "b.json", os.X_OK)
    with pytest.raises(InputError, match="already holds a.sh, b.json; pass --force"):
        writer.write_files(out, files, force=False)
    (out / "keep.txt").write_text("mine")
    writer.write_files(out, [OutputFile(name="a.sh", text="echo new\n")], force=True)
    assert (out / "a.sh").read_text() == "echo new\n" and (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["a.sh", "b.json", "keep.txt"]  # no staging folder left


def test_writer_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "plan.json").symlink_to(outside)
    writer.write_files(out, [OutputFile(name="plan.json", text="{}")], force=True)
    assert outside.read_text() == "precious" and not (out / "plan.json").is_symlink()


def test_writer_leaves_nothing_when_a_file_fails(tmp_path, monkeypatch):
    out = tmp_path / "new"
    real = Path.write_text

    def failing(self, text, *args, **kwargs):
        if self.name == "second":
            raise OSError("disk full")
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", failing)
    with pytest.raises(OSError, match="disk full"):
        writer.write_files(out, [OutputFile(name="first", text="1"), OutputFile(name="second", text="2")], False)
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a staging folder


def test_writer_refuses_missing_parents_folders_and_unsafe_names(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        writer.check_destination(tmp_path / "no" / "such", ["a"], force=False)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").mkdir()
    with pytest.raises(InputError, match="is a folder"):
        writer.check_destination(tmp_path / "d", ["a"], force=True)
    with pytest.raises(ValueError):
        writer.check_destination(tmp_path, ["../escape"], force=True)
