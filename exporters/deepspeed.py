"""DeepSpeed: ``ds_config.json``, an MPI-style hostfile and the ``deepspeed`` launcher command.

Keys are DeepSpeed 0.19's (``deepspeed/runtime/config.py``, ``runtime/zero/config.py``,
``runtime/tensor_parallel/config.py``); the launcher flags are ``deepspeed/launcher/runner.py``'s.
DeepSpeed takes tensor parallelism from ``tensor_parallel.autotp_size`` (AutoTP training) and
pipeline stages from the model code (``deepspeed.pipe.PipelineModule(num_stages=pp)``).
"""

from __future__ import annotations

import json
from typing import Any

from paraplan.cost_models.pipeline_splits import split_exists
from paraplan.errors import InputError
from paraplan.exporters.plan_input import ExportPlan
from paraplan.exporters.program import (
    ArgGroup,
    ConfigPath,
    OutputFile,
    Program,
    bash_array,
    bash_entry,
    bash_program_words,
    comment_block,
)
from paraplan.planner.layout import stage_layers

DS_CONFIG = "ds_config.json"
HOSTFILE = "hostfile"
GRADIENT_CLIPPING = 1.0  # global-norm clipping every engine here defaults to (Megatron --clip-grad 1.0)


def ds_config(plan: ExportPlan) -> dict[str, Any]:
    """The DeepSpeed config of ``plan``: batch sizes in sequences, ZeRO, bf16, clipping, TP."""
    c = plan.config
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": c.mbs,
        "gradient_accumulation_steps": plan.num_microbatches,
        "gradient_clipping": GRADIENT_CLIPPING,
        "bf16": {"enabled": True},
        "zero_optimization": zero_section(c.zero, plan.model.hidden_size),
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if c.tp > 1:
        config["tensor_parallel"] = {"autotp_size": c.tp}
    if c.recompute == "full":
        # deepspeed.checkpointing settings; partitioning the saved inputs over TP is what Megatron-DeepSpeed does.
        config["activation_checkpointing"] = {"partition_activations": c.tp > 1,
                                              "contiguous_memory_optimization": False, "cpu_checkpointing": False}
    return config


def zero_section(stage: int, hidden_size: int) -> dict[str, Any]:
    """ZeRO stage with overlapped communication; bucket sizes from the hidden size.

    The stage-3 sizes follow Hugging Face Transformers' DeepSpeed integration ("auto" values):
    reduce bucket h², prefetch bucket 0.9·h², parameters below 10·h stay whole on every rank.
    """
    if stage == 0:
        return {"stage": 0}
    section: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                               "reduce_bucket_size": hidden_size * hidden_size}
    if stage in (1, 2):
        section.update(reduce_scatter=True, allgather_partitions=True)
    if stage == 3:
        section.update(stage3_prefetch_bucket_size=int(0.9 * hidden_size * hidden_size),
                       stage3_param_persistence_threshold=10 * hidden_size,
                       stage3_gather_16bit_weights_on_model_save=True)
    return section


def deepspeed_program(plan: ExportPlan) -> Program:
    """The user's DeepSpeed training script with ``--deepspeed --deepspeed_config``."""
    if plan.engine != "deepspeed":
        raise InputError(f"the plan was made for {plan.engine}, not deepspeed: its predictions and rules are that "
                         "engine's; re-plan with --engine deepspeed to export a DeepSpeed config")
    c = plan.config
    notes = ["read --deepspeed_config with deepspeed.add_config_arguments(parser) and pass it to deepspeed.initialize"]
    if c.pp > 1:
        notes += pipeline_notes(plan)
    if c.tp > 1:
        notes.append(f"let AutoTP shard it {c.tp} ways (ds_config tensor_parallel.autotp_size; a Hugging Face model)")
    if c.recompute == "full":
        notes.append("wrap each transformer layer in deepspeed.checkpointing.checkpoint (full recompute)")
    if plan.precision != "bf16":
        notes.append(f"{plan.precision} GEMMs come from the model code (e.g. Transformer Engine layers); ds_config "
                     "only sets bf16")
    if plan.fused_expert_mlp:
        notes.append("run the routed experts' MLP fused, as the plan priced it (one grouped operation with its biases "
                     "and clamp inside, e.g. Transformer Engine's op fuser); ds_config has no switch for it")
    group = ArgGroup(name="DEEPSPEED_ARGS", comment="DeepSpeed config of the plan",
                     args=(("--deepspeed", None), ("--deepspeed_config", ConfigPath(DS_CONFIG))))
    return Program(engine="deepspeed", entry=("train.py",),
                   entry_comment="your DeepSpeed training script (set TRAIN_SCRIPT)", groups=(group,),
                   config_files=(OutputFile(name=DS_CONFIG, text=json.dumps(ds_config(plan), indent=2) + "\n"),),
                   notes=tuple(notes))


def pipeline_module(plan: ExportPlan) -> dict[str, Any] | None:
    """PipelineModule arguments that reproduce stage_layers: the layer specs [embedding, L decoder layers,
    norm + head] cut by partition_method="uniform" (partition_uniform over L + 2 specs); None where the plan
    holds another split (a stage partition), which no partition_method takes as layer counts."""
    num_layers = plan.model.num_layers
    uniform = stage_layers(num_layers, plan.config.pp, 1, "deepspeed_uniform") if split_exists(
        "deepspeed_uniform", num_layers, plan.config.pp, 1) else None
    if uniform != list(plan.stage_layers):
        return None
    return {"num_stages": plan.config.pp, "partition_method": "uniform", "num_layer_specs": num_layers + 2}


def pipeline_notes(plan: ExportPlan) -> list[str]:
    """How the model code must build its PipelineModule for the plan's layers per stage."""
    module = pipeline_module(plan)
    if module is None:
        return [(f"build the model as deepspeed.pipe.PipelineModule(num_stages={plan.config.pp}) and cut the "
                 f"pipeline so stage s holds {list(plan.stage_layers)}[s] decoder layers")]
    return [(f"build the model as deepspeed.pipe.PipelineModule(layers=[embedding, the {plan.model.num_layers} "
             f"decoder layers, final norm + output head as one spec], num_stages={module['num_stages']}, "
             f"partition_method='uniform'): its stages hold {list(plan.stage_layers)} decoder layers")]


def hostfile(plan: ExportPlan) -> OutputFile:
    """``node-i slots=G`` per node: replace the names with your hosts (DeepSpeed skips # lines)."""
    if plan.hosts:  # rank placement chose the order: DeepSpeed numbers ranks in hostfile order
        lines = ["# DeepSpeed hostfile in the host order paraplan place chose (ranks follow this order)."]
        lines += [f"{host} slots={plan.gpus_per_node}" for host in plan.hosts]
        return OutputFile(name=HOSTFILE, text="\n".join(lines) + "\n")
    lines = ["# DeepSpeed hostfile: one line per node, 'hostname slots=GPUs'. Replace node-<i> with your hosts."]
    lines += [f"node-{index} slots={plan.gpus_per_node}" for index in range(plan.num_nodes)]
    return OutputFile(name=HOSTFILE, text="\n".join(lines) + "\n")


def deepspeed_launcher_script(plan: ExportPlan, program: Program, header: list[str]) -> OutputFile:
    """``deepspeed --hostfile ... --num_nodes N --num_gpus G train.py --deepspeed --deepspeed_config ...``."""
    text = "\n".join([
        "#!/usr/bin/env bash",
        comment_block(header + ["Run once, on the first host of the hostfile (the DeepSpeed launcher reaches the",
                                "others over ssh):  bash deepspeed_launch.sh [extra training args]"]),
        comment_block(["Model code must: " + note for note in program.notes]),
        "set -euo pipefail",
        'CONFIG_DIR=${CONFIG_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}',
        "MASTER_PORT=${MASTER_PORT:-29500}",
        bash_entry(program),
        *[bash_array(group) for group in program.groups],
        (f'exec deepspeed --hostfile "$CONFIG_DIR"/{HOSTFILE} --num_nodes {plan.num_nodes} '
        f'--num_gpus {plan.gpus_per_node} --master_port "$MASTER_PORT" {bash_program_words(program)}'),
    ])
    return OutputFile(name="deepspeed_launch.sh", text=text + "\n", executable=True)
