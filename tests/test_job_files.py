"""Job files users already have: read them (planner/job_files), evaluate and plan from them (--from, --config).

The fixtures under tests/job_files are modelled on Megatron-LM's examples/ scripts, a Megatron training
log, a Megatron-Bridge dry-run ConfigContainer, torchtitan's shipped llama3_8b.toml and DeepSpeed's
launcher; the round trips read back what ``paraplan plan --export`` writes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_bad_input
from export_factory import make_export_plan
from typer.testing import CliRunner

import paraplan
from paraplan.cli.app import app
from paraplan.errors import InputError
from paraplan.exporters import torchtitan as titan_export
from paraplan.job_files import FORMATS, detect_format, read_job_file
from paraplan.job_files import torchtitan as titan_read
from paraplan.job_files.shell import read_script
from paraplan.model_specs.hf_config import load_model

FIXTURES = Path(__file__).parent / "job_files"
runner = CliRunner(env={"COLUMNS": "160"})
JOB_8B = ["--gpu", "h100-sxm", "--gpus", "16", "--seq-len", "4096", "--global-batch", "64"]


def invoke(*args: object):
    return runner.invoke(app, [str(arg) for arg in args])


def line_of(path: Path, needle: str) -> int:
    """1-based line of the first line of ``path`` holding ``needle``."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), start=1) if needle in line)


def at(path: Path, needle: str) -> str:
    return f"{path}:{line_of(path, needle)}"


def evaluated(*args: object) -> dict:
    """The one plan ``evaluate ... --json -`` prints."""
    result = invoke("evaluate", *args, "--json", "-")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["plans"][0]


# -- the shell subset ---------------------------------------------------------------------------------------
def test_shell_expands_variables_arithmetic_arrays_and_the_branch_its_test_takes():
    script = read_script(
        'NODES=2\nPER=8\nWORLD=$(($NODES*$PER))\nOUT=${1:-"runs/a b"}\nA=(\n  --x $WORLD\n)\nB=()\n'
        'if [[ "$NODES" == "3" ]]; then\n  B+=("--y one")\nelse\n  B+=("--y two" --z)\nfi\n'
        'A+=("${B[@]}")\ntorchrun ${A[@]} "$OUT" 2>&1 | tee log\n', "t.sh")
    assert script.variables["WORLD"] == "16" and script.variables["OUT"] == "runs/a b"
    words = script.commands[0]
    assert [w.text for w in words] == ["torchrun", "--x", "16", "--y", "two", "--z", "runs/a b"]
    assert [w.line for w in words] == [15, 6, 6, 12, 12, 12, 15]  # array elements keep their own lines
    assert script.notes == []


def test_shell_test_it_cannot_evaluate_takes_the_first_branch_and_says_so():
    script = read_script('if [[ -f "$HOME/x" ]]; then\nA=1\nelse\nA=2\nfi\n', "t.sh")
    assert script.variables["A"] == "1" and "first branch" in script.notes[0]


# -- readers ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, fmt", [
    ("megatron_llama3_8b_fp8.sh", "megatron-script"), ("megatron_gpt_1b_tp4.log", "megatron-log"),
    ("bridge_llama3_8b_fp8_mx.yaml", "megatron-bridge"), ("torchtitan_llama3_8b.toml", "torchtitan-toml"),
    ("ds_config_zero2.json", "deepspeed-json"), ("deepspeed_hf_llama.sh", "deepspeed-script"),
])
def test_the_format_is_told_from_the_content(name, fmt, tmp_path):
    renamed = tmp_path / "job.txt"  # never from the name
    renamed.write_text((FIXTURES / name).read_text())
    assert detect_format(renamed, renamed.read_text()) == fmt and fmt in FORMATS


def test_megatron_example_script_reads_layout_batch_precision_and_model():
    path = FIXTURES / "megatron_llama3_8b_fp8.sh"
    job = read_job_file(path)
    assert (job.format, job.engine, job.model, job.model_spec) == ("megatron-script", "megatron", "llama-3.1-8b", None)
    assert (job.num_nodes, job.gpus_per_node, job.num_gpus) == (2, 8, 16)
    assert (job.seq_len, job.global_batch, job.precision, job.fp8_recipe) == (8192, 128, "fp8", "delayed")
    assert dict(job.layout) == {"tp": 2, "pp": 1, "dp": 8, "cp": 1, "ep": 1, "vpp": 1, "mbs": 1, "zero": 1,
                                "recompute": "none", "sp": True, "tp_overlap": False, "ep_overlap": False}
    assert job.sources["tp"] == at(path, "--tensor-model-parallel-size $TP_SIZE")
    assert job.sources["precision"] == at(path, '"--fp8-format hybrid"')  # the if-branch DTYPE=fp8 takes
    assert job.sources["zero"] == at(path, "--use-distributed-optimizer")
    assert job.sources["fp8_recipe"] == "engine default"  # Megatron's --fp8-recipe default: delayed
    assert job.missing == ("gpu",) and job.notes == ()


def test_megatron_gpt3_example_as_shipped_asks_for_more_gpus_than_it_starts():
    path = FIXTURES / "megatron_gpt3_175b.sh"
    with pytest.raises(InputError, match=r"tp·pp·cp = 128 does not divide the world size 8") as caught:
        read_job_file(path)
    assert str(caught.value).startswith(at(path, "--tensor-model-parallel-size 8"))


def test_megatron_gpt3_on_16_nodes_pads_the_gpt2_vocabulary_like_megatron(tmp_path):
    path = tmp_path / "gpt3.sh"
    path.write_text((FIXTURES / "megatron_gpt3_175b.sh").read_text().replace("NUM_NODES=1\n", "NUM_NODES=16\n"))
    job = read_job_file(path)
    # 50257 GPT-2 tokens padded to a multiple of 128 x tp 8 = 51200: Narayanan et al.'s GPT-3 175B preset.
    assert job.model == "megatron-gpt-174.6b" and load_model(job.model).vocab_size == 51200
    assert (job.num_gpus, job.layout["tp"], job.layout["pp"], job.layout["dp"]) == (128, 8, 16, 1)
    assert (job.global_batch, job.precision) == (1536, "bf16")
    assert any(note.startswith("fp16") for note in job.notes)


def test_megatron_log_arguments_block():
    path = FIXTURES / "megatron_gpt_1b_tp4.log"
    job = read_job_file(path)
    padded = int(re.search(r"new size: (\d+)", path.read_text()).group(1))  # what Megatron itself logged
    spec = job.model_spec
    assert spec is not None and spec.vocab_size == padded
    assert (spec.num_layers, spec.hidden_size, spec.ffn_size, spec.num_heads, spec.num_kv_heads) == (
        28, 3072, 10752, 24, 24)
    assert spec.gated_mlp and spec.norm == "rmsnorm" and not spec.tied_embeddings and not spec.linear_bias
    assert (job.num_gpus, job.seq_len, job.global_batch) == (4, 2048, 512)
    # use_distributed_optimizer True over dp = 1 shards nothing: priced (and named) as no ZeRO
    assert {k: job.layout[k] for k in ("tp", "pp", "dp", "zero", "recompute", "sp")} == {
        "tp": 4, "pp": 1, "dp": 1, "zero": 0, "recompute": "selective", "sp": True}
    assert job.sources["zero"].startswith(at(path, "use_distributed_optimizer ...")) and "one data-parallel" in \
        job.notes[-1]
    assert job.sources["tp"] == at(path, "tensor_model_parallel_size ...")
    plan = evaluated("--from", path, "--gpu", "h100-sxm")
    assert (plan["model"]["name"], plan["model"]["shape"]["vocab_size"], plan["cluster"]["num_gpus"]) == (
        "megatron_gpt_1b_tp4.log model", padded, 4)
    assert {k: plan["config"][k] for k in ("tp", "dp", "zero", "recompute", "sp")} == {
        "tp": 4, "dp": 1, "zero": 0, "recompute": "selective", "sp": True}


def test_megatron_bridge_config_container():
    path = FIXTURES / "bridge_llama3_8b_fp8_mx.yaml"
    job = read_job_file(path)
    assert (job.model, job.precision, job.fp8_recipe) == ("llama-3.1-8b", "fp8", "mxfp8")
    assert (job.seq_len, job.global_batch, job.layout["mbs"], job.layout["zero"]) == (4096, 8, 1, 1)
    assert job.sources["seq_len"] == at(path, "  seq_length: 4096")  # the dataset's, not model.seq_length
    assert job.sources["fp8_recipe"] == at(path, "  fp8_recipe: mxfp8")  # mixed_precision over the model's
    assert job.missing == ("gpu", "num_gpus")


def test_nemo_1_config_resolves_its_references_and_takes_the_model_from_the_command_line():
    path = FIXTURES / "nemo_llama2_13b.yaml"
    job = read_job_file(path)
    assert (job.num_gpus, job.seq_len, job.global_batch, job.precision) == (16, 4096, 128, "bf16")
    assert {k: job.layout[k] for k in ("tp", "pp", "dp", "zero", "recompute", "sp")} == {
        "tp": 2, "pp": 2, "dp": 4, "zero": 1, "recompute": "selective", "sp": True}
    assert job.model is None and "no vocab_size" in job.model_problem  # sentencepiece: no size in the file
    plan = evaluated("llama-2-13b", "--from", path, "--gpu", "h100-sxm")
    assert (plan["model"]["name"], plan["config"]["tp"], plan["config"]["pp"], plan["config"]["dp"]) == (
        "llama-2-13b", 2, 2, 4)


def test_deepspeed_launch_reads_the_config_it_names():
    path = FIXTURES / "deepspeed_hf_llama.sh"
    job = read_job_file(path)
    config = FIXTURES / "ds_config_zero2.json"
    assert (job.engine, job.model, job.num_gpus, job.seq_len) == ("deepspeed", "llama-3.1-8b", 16, 4096)
    assert (job.global_batch, job.layout["mbs"], job.layout["dp"], job.layout["zero"]) == (256, 2, 16, 2)
    assert job.sources["zero"] == at(config, '"stage": 2')
    assert job.sources["model"] == at(path, "--model_name_or_path")


def test_torchtitan_0_3_launch_takes_what_its_config_function_sets(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("torchrun --nnodes 4 --nproc-per-node 8 -m torchtitan.train --module llama3 "
                    "--config llama3_70b \\\n"
                    "  --hf_assets_path ./assets/hf/Llama-3.1-70B --training.global_batch_size 64 \\\n"
                    "  --parallelism.no_enable_sequence_parallel --compile.enable activation-checkpoint:selective\n")
    job = read_job_file(path)
    # llama3_70b (config_registry.py): tensor_parallel_degree 8, local_batch_size 8, seq_len 8192
    assert (job.model, job.num_gpus, job.seq_len, job.global_batch) == ("llama-3.1-70b", 32, 8192, 64)
    assert {k: job.layout[k] for k in ("tp", "dp", "mbs", "zero", "recompute", "sp")} == {
        "tp": 8, "dp": 4, "mbs": 8, "zero": 3, "recompute": "selective", "sp": False}
    assert job.job["compiled"] is True and job.sources["tp"] == f"{path}:1 (config registry)"
    assert job.sources["recompute"] == f"{path}:3"


def test_torchtitan_tables_restate_the_exporter():
    assert titan_read.FLAVORS_0_2 == {flavor: preset for preset, flavor in titan_export.FLAVORS_0_2.items()}
    assert {key: value["model"] for key, value in titan_read.REGISTRY_0_3.items()} == {
        entry: preset for preset, entry in titan_export.REGISTRY_0_3.items()}


# -- evaluate --from and --config ---------------------------------------------------------------------------
def test_shipped_torchtitan_toml_evaluates_exactly_like_its_flags():
    toml = FIXTURES / "torchtitan_llama3_8b.toml"
    from_file = evaluated("--from", toml, "--gpu", "a100-sxm-80gb", "--gpus", "64")
    by_hand = evaluated("llama-3.1-8b", "--engine", "torchtitan", "--gpu", "a100-sxm-80gb", "--gpus", "64",
                        "--seq-len", "8192", "--global-batch", "64", "--tp", "1", "--pp", "1", "--mbs", "1",
                        "--zero", "3", "--recompute", "selective")
    assert from_file["config"] == by_hand["config"] and from_file["job"] == by_hand["job"]
    assert from_file["estimate"]["step_time_s"] == by_hand["estimate"]["step_time_s"]


def test_flags_on_the_command_line_override_the_file():
    path = FIXTURES / "megatron_llama3_8b_fp8.sh"
    plan = evaluated("--from", path, "--gpu", "h100-sxm", "--tp", "4", "--precision", "bf16")
    assert (plan["config"]["tp"], plan["config"]["dp"], plan["config"]["sp"]) == (4, 4, True)
    assert (plan["job"]["precision"], plan["job"]["seq_len"], plan["job"]["global_batch"]) == ("bf16", 8192, 128)


def test_config_yaml_options_under_the_command_line(tmp_path):
    (tmp_path / "train.sh").write_text((FIXTURES / "megatron_llama3_8b_fp8.sh").read_text())
    options = tmp_path / "job.yaml"
    options.write_text("from: train.sh\ngpu: h100-sxm\nseq-len: 4096\nglobal_batch: 64\nmbs: 1\nsp: on\n")
    plan = evaluated("--config", options, "--mbs", "2")
    assert (plan["job"]["seq_len"], plan["job"]["global_batch"], plan["config"]["mbs"]) == (4096, 64, 2)
    assert (plan["config"]["tp"], plan["cluster"]["gpu"]) == (2, "h100-sxm")


def test_config_yaml_alone_needs_no_job_file(tmp_path):
    options = tmp_path / "job.yaml"
    options.write_text("model: llama-3.1-8b\ngpu: h100-sxm\ngpus: 8\nseq_len: 4096\nglobal-batch: 32\ntp: 2\npp: 1\n")
    plan = evaluated("--config", options)
    by_hand = evaluated("llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch",
                        "32", "--tp", "2", "--pp", "1")
    assert plan["estimate"]["step_time_s"] == by_hand["estimate"]["step_time_s"]


def test_one_job_yaml_serves_plan_and_evaluate(tmp_path):
    """A job file's search-only keys (top, objective, ...) are plan's; evaluate prices the one layout and says it
    leaves them aside, instead of refusing the file plan accepts."""
    options = tmp_path / "job.yaml"
    options.write_text("model: llama-3.1-8b\ngpu: h100-sxm\ngpus: 8\nseq_len: 4096\nglobal-batch: 32\ntp: 2\npp: 1\n"
                       "top: 2\nobjective: throughput\n")
    searched = invoke("plan", "--config", options, "--json", "-")
    assert searched.exit_code == 0, searched.output
    assert len(json.loads(searched.stdout)["plans"]) == 2
    result = invoke("evaluate", "--config", options, "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plans"][0]["config"]["tp"] == 2
    assert "evaluate leaves aside plan's top, objective" in result.stderr
    typo = tmp_path / "typo.yaml"
    typo.write_text("model: llama-3.1-8b\ngpu: h100-sxm\ngpus: 8\nseq_len: 4096\nglobal-batch: 32\ntp: 2\npp: 1\n"
                    "topp: 2\n")
    refused = invoke("evaluate", "--config", typo)
    assert refused.exit_code == 2 and "unknown option 'topp'; did you mean top?" in refused.stderr


# -- round trips: plan --export, then evaluate --from the written file ------------------------------------
LLAMA_16 = ["llama-3.1-8b", *JOB_8B]
MOE = ["--gpu", "h100-sxm", "--seq-len", "4096", "--global-batch", "512"]


@pytest.mark.parametrize("job, engine, constraints, version, launcher", [
    (LLAMA_16, "megatron", [], "0.3", "megatron_launch.sh"),
    (LLAMA_16, "megatron", ["--tp", "2", "--pp", "2", "--vpp", "2", "--recompute", "selective", "--sp", "on"], "0.3",
     "megatron_launch.sh"),
    # MoE with expert parallelism, its all-to-all overlap, GQA + qk-norm (Qwen3), MLA + MTP + a pipeline layout
    # string + context parallelism (DeepSeek-V3): the architecture flags must rebuild the same preset.
    (["qwen3-30b-a3b", "--gpus", "64", *MOE], "megatron", [], "0.3", "megatron_launch.sh"),
    # the fused expert MLP: --use-transformer-engine-op-fuser written and read back (plan job.fused_expert_mlp)
    (["qwen3-30b-a3b", "--gpus", "64", *MOE, "--fused-expert-mlp"], "megatron", [], "0.3", "megatron_launch.sh"),
    (["qwen3-30b-a3b", "--gpus", "64", *MOE, "--fused-expert-mlp"], "megatron", [], "0.3", "slurm.sbatch"),
    (["deepseek-v3", "--gpus", "256", *MOE], "megatron", [], "0.3", "megatron_launch.sh"),
    (LLAMA_16, "torchtitan", [], "0.3", "torchtitan_launch.sh"),
    (LLAMA_16, "torchtitan", ["--tp", "2", "--pp", "2"], "0.3", "torchtitan_launch.sh"),
    (LLAMA_16, "torchtitan", [], "0.2", "torchtitan_launch.sh"),
    (LLAMA_16, "torchtitan", [], "0.2", "torchtitan.toml"),
    # context parallelism: the rotate method torchtitan runs (allgather) is written (0.2) or its default (0.3)
    (LLAMA_16, "torchtitan", ["--cp", "2"], "0.2", "torchtitan.toml"),
    (LLAMA_16, "torchtitan", ["--cp", "2"], "0.3", "torchtitan_launch.sh"),
    (LLAMA_16, "deepspeed", ["--pp", "1"], "0.3", "deepspeed_launch.sh"),
    (LLAMA_16, "megatron", [], "0.3", "slurm.sbatch"),
    (LLAMA_16, "torchtitan", [], "0.3", "slurm.sbatch"),
    (LLAMA_16, "deepspeed", ["--pp", "1"], "0.3", "slurm.sbatch"),
])
def test_evaluate_from_an_exported_file_reproduces_the_plan(tmp_path, job, engine, constraints, version, launcher):
    plans = tmp_path / "plans.json"
    result = invoke("plan", *job, "--engine", engine, *constraints, "--top", "1", "--json", plans)
    assert result.exit_code == 0, result.output
    out = tmp_path / "launch"
    fmt = "slurm" if launcher == "slurm.sbatch" else engine
    result = invoke("export", plans, "-f", fmt, "-o", out, "--torchtitan-version", version)
    assert result.exit_code == 0, result.output
    planned = json.loads(plans.read_text())["plans"][0]
    cluster = ["--gpu", "h100-sxm", "--gpus", "16"] if launcher.endswith(".toml") else []
    again = evaluated("--from", out / launcher, *cluster)
    assert again["config"] == planned["config"]
    assert again["job"] == planned["job"] and again["model"] == planned["model"]
    assert again["estimate"]["step_time_s"] == planned["estimate"]["step_time_s"]


def test_a_fused_expert_plan_states_its_switch_and_reads_back(tmp_path):
    """--fused-expert-mlp reaches the plan file, the launch (--use-transformer-engine-op-fuser with Transformer
    Engine's NVTE_CUTEDSL_FUSED_GROUPED_MLP=1) and comes back from it; a plan without it writes neither."""
    for fused in (True, False):
        plans, out = tmp_path / f"plans{fused}.json", tmp_path / f"launch{fused}"
        extra = ["--fused-expert-mlp"] if fused else []
        result = invoke("plan", "qwen3-30b-a3b", "--gpus", "64", *MOE, *extra, "--top", "1", "--json", plans)
        assert result.exit_code == 0, result.output
        assert ("fused_expert_mlp" in json.loads(plans.read_text())["plans"][0]["job"]) is fused
        assert invoke("export", plans, "-f", "megatron", "-o", out).exit_code == 0
        script = out / "megatron_launch.sh"
        text = script.read_text()
        assert ("--use-transformer-engine-op-fuser" in text, "export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in text) == \
            (fused, fused)
        job = read_job_file(script)
        assert job.job.get("fused_expert_mlp", False) is fused
        if fused:
            assert job.sources["fused_expert_mlp"] == at(script, "  --use-transformer-engine-op-fuser")


def test_megatron_bridge_reads_the_op_fuser_as_a_fused_expert_mlp(tmp_path):
    """Megatron-Bridge's model.use_transformer_engine_op_fuser (what its cutedsl_fused_grouped_mlp recipes set)."""
    text = (FIXTURES / "bridge_llama3_8b_fp8_mx.yaml").read_text()
    path = tmp_path / "bridge.yaml"
    path.write_text(text.replace("\nmodel:\n", "\nmodel:\n  use_transformer_engine_op_fuser: true\n", 1))
    job = read_job_file(path)
    assert job.job["fused_expert_mlp"] is True
    assert job.sources["fused_expert_mlp"] == at(path, "use_transformer_engine_op_fuser: true")
    assert "fused_expert_mlp" not in read_job_file(FIXTURES / "bridge_llama3_8b_fp8_mx.yaml").job


def test_plan_from_an_exported_torchtitan_cp_toml_compares_it(tmp_path):
    """plan --from a torchtitan TOML with context parallelism prices its layout beside the best plan (it said
    'breaks a rule: torchtitan does not offer this context-parallel communication' before)."""
    plans, out = tmp_path / "plans.json", tmp_path / "launch"
    planned = invoke("plan", *LLAMA_16, "--engine", "torchtitan", "--cp", "2", "--top", "1", "--json", plans)
    assert planned.exit_code == 0, planned.output
    assert invoke("export", plans, "-f", "torchtitan", "-o", out, "--torchtitan-version", "0.2").exit_code == 0
    toml = out / "torchtitan.toml"
    assert 'context_parallel_rotate_method = "allgather"' in toml.read_text()
    document = tmp_path / "from.json"
    result = invoke("plan", "--from", toml, "--gpu", "h100-sxm", "--gpus", "16", "--top", "1", "--json", document)
    assert result.exit_code == 0, result.output
    block = json.loads(document.read_text())["from_job"]
    assert "error" not in block, block.get("error")
    yours = block["plan"]["config"]
    assert (yours["cp"], yours["cp_comm"]) == (2, "allgather") and block["comparison"]["speedup"] > 0
    assert block["sources"]["cp_comm"] == at(toml, "context_parallel_rotate_method")
    assert "your layout" in result.stdout


@pytest.mark.parametrize("method, note", [
    ("", None), ('context_parallel_rotate_method = "allgather"\n', None),
    ('context_parallel_rotate_method = "alltoall"\n', "priced as allgather")])
def test_torchtitan_rotate_method_reads_as_its_cp_communication(tmp_path, method, note):
    path = tmp_path / "job.toml"
    path.write_text(f"[model]\nname = 'llama3'\nflavor = '8B'\n[parallelism]\ncontext_parallel_degree = 2\n{method}")
    job = read_job_file(path)
    assert (job.layout["cp"], job.layout["cp_comm"]) == (2, "allgather")
    assert job.sources["cp_comm"] == (f"{path}:6" if method else "engine default")
    assert any(note in n for n in job.notes) if note else not any("rotate" in n for n in job.notes)


@pytest.mark.parametrize("parallelism, zero, note", [
    ("data_parallel_shard_degree = 1\nfsdp_reshard_after_forward = 'never'\n", 2, None),
    ("data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 1\n", 3, "HSDP (2 replicas x 4 shards)")])
def test_torchtitan_shards_over_context_parallel_ranks(tmp_path, parallelism, zero, note):
    """torchtitan applies FSDP over dp_shard·cp whenever cp > 1 (ParallelDims.fsdp_enabled): one data-parallel
    shard with cp 4 is ZeRO over the cp ranks (it read as ZeRO 0, so an exported dp-1 ZeRO-2 plan came back 0)."""
    path = tmp_path / "job.toml"
    path.write_text(f"[parallelism]\ncontext_parallel_degree = 4\n{parallelism}")
    job = read_job_file(path)
    assert (job.layout["cp"], job.layout["zero"]) == (4, zero)
    assert any(note in n for n in job.notes) if note else not any("HSDP" in n for n in job.notes)


def test_torchtitan_export_says_where_its_context_parallelism_differs_from_the_plan():
    notes = titan_export.torchtitan_program(make_export_plan(engine="torchtitan", cp=2, dp=4, zero=0), "0.2").notes
    assert any("all-gathers K and V" in n for n in notes)  # the factory's plan priced cp_comm p2p
    assert any("zero-0 plan runs sharded" in n for n in notes)
    sharded = make_export_plan(engine="torchtitan", cp=2, dp=4, zero=3, cp_comm="allgather")
    assert not any("cp" in n for n in titan_export.torchtitan_program(sharded, "0.2").notes)


def test_evaluate_defaults_follow_the_engine():
    # Left out, cp_comm, zero and sp are the engine's own: torchtitan all-gathers K/V, shards over dp_shard x cp
    # (ZeRO 3) with cp > 1 and always runs SequenceParallel with TP; Megatron's defaults stay p2p, 0, off.
    base = ("llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "2", "--pp", "1", "--cp", "2",
            "--seq-len", "8192", "--global-batch", "16")
    titan = evaluated(*base, "--engine", "torchtitan")["config"]
    assert (titan["cp_comm"], titan["zero"], titan["sp"]) == ("allgather", 3, True)
    megatron = evaluated(*base)["config"]
    assert (megatron["cp_comm"], megatron["zero"], megatron["sp"]) == ("p2p", 0, False)
    refused = invoke("evaluate", *base, "--engine", "torchtitan", "--cp-comm", "p2p")
    assert refused.exit_code == 2 and "torchtitan does not offer this context-parallel communication" in refused.output


def test_torchtitan_0_2_refuses_ddp_beside_tensor_or_pipeline_parallelism():
    # torchtitan 0.2.2's parallelize applies DDP when neither dp_shard nor cp shards (ZeRO 0, cp = 1) and raises
    # 'DDP has not supported > 1D parallelism' unless every GPU is data parallel; 0.3 replicates through FSDP2.
    for layout in ({"tp": 2}, {"pp": 2}):
        plan = make_export_plan(engine="torchtitan", dp=4, zero=0, **layout)
        with pytest.raises(InputError, match=r"torchtitan 0.2 runs ZeRO 0 .* only when every GPU is data parallel"):
            titan_export.torchtitan_program(plan, "0.2")
        assert titan_export.torchtitan_program(plan, "0.3").engine == "torchtitan"
    assert titan_export.torchtitan_program(make_export_plan(engine="torchtitan", dp=8, zero=0), "0.2")
    assert titan_export.torchtitan_program(make_export_plan(engine="torchtitan", tp=2, dp=4, zero=3), "0.2")


def test_torchtitan_unknown_rotate_method_is_one_line(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[parallelism]\ncontext_parallel_degree = 2\ncontext_parallel_rotate_method = 'ring'\n")
    with pytest.raises(InputError, match=r"job.toml:3: context_parallel_rotate_method 'ring' is not allgather or "
                                         r"alltoall"):
        read_job_file(path)


def test_the_python_api_reads_job_files_like_the_cli():
    path = FIXTURES / "megatron_poor_layout.sh"
    yours = paraplan.evaluate_file(path, gpu="h100-sxm")
    cli = evaluated("--from", path, "--gpu", "h100-sxm")
    assert yours.config.as_dict() == cli["config"] and yours.estimate["step_time_s"] == cli["estimate"]["step_time_s"]
    best = paraplan.plan_file(path, gpu="h100-sxm", top=1).plans[0]
    assert best.estimate["step_time_s"] < yours.estimate["step_time_s"] and best.job.global_batch == 64
    with pytest.raises(paraplan.InputError, match=r"does not give gpu; pass gpu='h100-sxm' \(or cluster=...\)"):
        paraplan.evaluate_file(path)


def test_plan_from_a_poor_layout_finds_a_faster_one(tmp_path):
    path = FIXTURES / "megatron_poor_layout.sh"
    document = tmp_path / "plans.json"
    result = invoke("plan", "--from", path, "--gpu", "h100-sxm", "--top", "3", "--json", document)
    assert result.exit_code == 0, result.output
    assert "your layout" in result.stdout
    saved = json.loads(document.read_text())
    block, best = saved["from_job"], saved["plans"][0]
    yours = block["plan"]
    assert {k: yours["config"][k] for k in ("tp", "pp", "dp", "mbs", "recompute", "sp")} == {
        "tp": 8, "pp": 2, "dp": 1, "mbs": 1, "recompute": "full", "sp": True}
    assert best["estimate"]["step_time_s"] < yours["estimate"]["step_time_s"]
    assert block["comparison"]["speedup"] == pytest.approx(
        yours["estimate"]["step_time_s"] / best["estimate"]["step_time_s"])
    assert block["sources"]["tp"] == at(path, "--tensor-model-parallel-size $TP")
    # the file's layout priced by plan --from is exactly what evaluate --from predicts for it
    alone = evaluated("--from", path, "--gpu", "h100-sxm")
    assert alone["estimate"]["step_time_s"] == yours["estimate"]["step_time_s"]
    # and the plan file still exports
    assert invoke("export", document, "-f", "megatron", "-o", tmp_path / "m").exit_code == 0


# -- one-line refusals --------------------------------------------------------------------------------------
def _bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {"notes.txt": "shopping list\n- milk\n", "bad.toml": "[parallelism]\ntensor_parallel_degree = \n",
             "ds.json": '{"train_batch_size": 250, "train_micro_batch_size_per_gpu": 2, '
                        '"gradient_accumulation_steps": 8}', "plan.json": '{"schema_version": 1, "plans": []}',
             "job.yaml": "from: x.sh\nseq-lenght: 4096\n",
             "titan.sh": "torchrun --nnodes 2 --nproc-per-node 8 -m torchtitan.train --job.config_file t.toml\n",
             "t.toml": "[model]\nname = 'llama3'\nflavor = '8B'\n[parallelism]\ndata_parallel_shard_degree = 4\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return {name: tmp_path / name for name in files}


@pytest.mark.parametrize("case, needles", [
    ("notes.txt", ("not a job file paraplan reads", "Megatron-LM launch script")),
    ("bad.toml", ("bad.toml: malformed TOML",)),
    ("ds.json", ("train_batch_size 250 is not", "ds.json:1")),
    ("plan.json", ("not a DeepSpeed config",)),
    ("job.yaml", ("unknown option 'seq-lenght'", "did you mean seq-len?", "job.yaml:2")),
    ("gpt3", ("tp·pp·cp = 128 does not divide the world size 8",)),
    ("no-gpu", ("states no GPU type", "add --gpu NAME (e.g. --gpu h100-sxm")),
    ("no-vocab", ("nemo_llama2_13b.yaml: no vocab_size", "give MODEL")),
    ("titan.sh", ("t.toml:5: tp·pp·cp·dp = 1·4 = 4 does not match the world size 16", "titan.sh:1")),
])
def test_bad_job_files_are_one_line(tmp_path, case, needles):
    files = _bad_files(tmp_path)
    if case == "job.yaml":
        args = ["--config", files[case]]
    elif case == "gpt3":
        args = ["--from", FIXTURES / "megatron_gpt3_175b.sh", "--gpu", "h100-sxm"]
    elif case == "no-gpu":
        args = ["--from", FIXTURES / "megatron_llama3_8b_fp8.sh"]
    elif case == "no-vocab":
        args = ["--from", FIXTURES / "nemo_llama2_13b.yaml", "--gpu", "h100-sxm"]
    else:
        args = ["--from", files[case], "--gpu", "h100-sxm", "--gpus", "16"]
    for command in ("evaluate", "plan"):
        line = assert_bad_input(invoke(command, *args), *needles)
        assert len(line) < 300, line


def test_without_a_file_the_job_flags_are_still_required():
    assert_bad_input(invoke("evaluate", "llama-3.1-8b", *JOB_8B, "--pp", "1"), "missing --tp", "--from FILE")
    assert_bad_input(invoke("plan", "--gpu", "h100-sxm", "--gpus", "8"), "missing MODEL")


def test_the_installed_command_reads_a_job_file_from_a_neutral_folder(tmp_path):
    """A real process (not CliRunner), run outside the repository so its paraplan/ folder cannot shadow the
    installed package."""
    result = subprocess.run([sys.executable, "-m", "paraplan", "evaluate", "--from",
                             str(FIXTURES / "megatron_llama3_8b_fp8.sh"), "--gpu", "h100-sxm", "--json", "-"],
                            check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "COLUMNS": "160"})
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plans"][0]
    assert (plan["config"]["tp"], plan["config"]["dp"], plan["job"]["fp8_recipe"]) == (2, 8, "delayed")
    assert "read from" in result.stderr  # the provenance table goes to stderr with --json -


def test_an_empty_substitution_is_kept_as_written(tmp_path):
    """bash calls ${} a bad substitution; the reader keeps it as text instead of failing (a fuzz finding)."""
    from paraplan.job_files.detect import read_job_file

    script = tmp_path / "train.sh"
    script.write_text('#!/bin/bash\nNOTE="${}"\ntorchrun --nproc_per_node 8 pretrain_gpt.py '
                      "--tensor-model-parallel-size 2 "
                      "--seq-length 4096 --global-batch-size 64 --micro-batch-size 1\n")
    job = read_job_file(script)
    assert job.layout["tp"] == 2 and job.seq_len == 4096 and job.global_batch == 64


def test_a_torchtitan_deepep_plan_exports_its_backend_for_0_2_reads_back_and_0_3_refuses(tmp_path):
    """torchtitan prices DeepEP (planner/engines.py); 0.2.2's parallelism.expert_parallel_comm_backend launches it,
    and 0.3.0 has no such field, so a 0.3 export of the plan would launch the all-to-all instead."""
    plans, out = tmp_path / "plans.json", tmp_path / "launch"
    planned = invoke("plan", "qwen3-30b-a3b", "--gpus", "16", *MOE, "--engine", "torchtitan", "--ep", "8",
                     "--dispatcher", "deepep", "--top", "1", "--json", plans)
    assert planned.exit_code == 0, planned.output
    assert json.loads(plans.read_text())["plans"][0]["job"]["dispatcher"] == "deepep"
    exported = invoke("export", plans, "-f", "torchtitan", "-o", out, "--torchtitan-version", "0.2",
                      "--torchtitan-model", "qwen3:30B-A3B")
    assert exported.exit_code == 0, exported.output
    toml = out / "torchtitan.toml"
    assert 'expert_parallel_comm_backend = "deepep"' in toml.read_text()
    job = read_job_file(toml)
    assert (job.layout["ep"], job.job["dispatcher"]) == (8, "deepep")
    assert job.sources["dispatcher"] == at(toml, "expert_parallel_comm_backend")
    refused = invoke("export", plans, "-f", "torchtitan", "-o", tmp_path / "v3", "--torchtitan-version", "0.3",
                     "--torchtitan-model", "qwen3:qwen3_30b_a3b")
    assert refused.exit_code == 2 and "torchtitan 0.3.0 has no expert_parallel_comm_backend" in refused.output
    assert not (tmp_path / "v3").exists()


def test_megatron_virtual_stages_per_rank_are_the_virtual_pipeline_size(tmp_path):
    """Megatron-core's --num-virtual-stages-per-pipeline-rank N sets virtual_pipeline_model_parallel_size = N as it
    is (megatron/training/arguments.py), as Megatron-LM CI's MLA/MoE proxy states its interleaving."""
    path = tmp_path / "vpp.sh"
    path.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 16 --hidden-size 1024 "
                    "--num-attention-heads 16 --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 "
                    "--global-batch-size 32 --vocab-size 50257 --bf16 --tensor-model-parallel-size 2 "
                    "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 4\n")
    job = read_job_file(path)
    assert (job.layout["pp"], job.layout["vpp"]) == (2, 4)
    assert job.sources["vpp"] == at(path, "--num-virtual-stages-per-pipeline-rank 4")
