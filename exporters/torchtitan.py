"""torchtitan: the job configuration for ``python -m torchtitan.train``.

torchtitan 0.3 builds its config from a Python config-registry function (``--module llama3 --config
llama3_70b``) with dotted overrides (``--parallelism.tensor_parallel_degree 8``) parsed by tyro;
0.2 reads a TOML file (``--job.config_file``). Field names are those of ``torchtitan.config``'s
ParallelismConfig / TrainingConfig (0.3.0) and ``config/job_config.py`` (0.2.2).
"""

from __future__ import annotations

import itertools
import json
from typing import Literal, get_args

from paraplan.cost_models.pipeline_splits import edge_weights, weighted_chunk, weighted_split_exists
from paraplan.errors import InputError
from paraplan.exporters.plan_input import ExportPlan
from paraplan.exporters.program import Arg, ArgGroup, ConfigPath, OutputFile, Program

TorchtitanVersion = Literal["0.3", "0.2"]
TORCHTITAN_VERSIONS: tuple[TorchtitanVersion, ...] = get_args(TorchtitanVersion)
TOML_NAME = "torchtitan.toml"
# Presets torchtitan ships a config for: 0.3 config-registry (module, function), 0.2 (model name, flavor).
# 0.3's llama3_405b swaps in float8 rowwise linears when it is built, so it is no bf16 405B and is left
# out (pass --torchtitan-model for it).
REGISTRY_0_3 = {"llama-3.1-8b": ("llama3", "llama3_8b"), "llama-3.1-70b": ("llama3", "llama3_70b")}
ROTATE_METHOD = "allgather"
"""torchtitan's context_parallel_rotate_method for the plan's cp_comm allgather, the one CP communication the
torchtitan rules price (planner/engines.py); job_files/torchtitan.py reads it back."""
FLAVORS_0_2 = {"llama-3.1-8b": ("llama3", "8B"), "llama-3.1-70b": ("llama3", "70B"),
               "llama-3.1-405b": ("llama3", "405B")}


def parallelism(plan: ExportPlan, version: TorchtitanVersion) -> dict[str, int | str | bool | list[list[str]]]:
    """[parallelism] fields: ZeRO as FSDP2 sharding or replication, TP (+SP), PP split, CP, EP."""
    c = plan.config
    fields: dict[str, int | str | bool | list[list[str]]] = {
        "data_parallel_replicate_degree": c.dp if c.zero == 0 else 1,
        "data_parallel_shard_degree": 1 if c.zero == 0 else c.dp}
    if c.zero in (2, 3):
        # ZeRO-3 reshards after every forward; ZeRO-2 keeps gathered weights until backward.
        fields["fsdp_reshard_after_forward"] = "always" if c.zero == 3 else "never"
    fields["tensor_parallel_degree"] = c.tp
    if c.tp > 1 and version == "0.3":  # 0.2 always shards norms with TP
        fields["enable_sequence_parallel"] = c.sp
    fields["pipeline_parallel_degree"] = c.pp
    if c.pp > 1:
        fields.update(pipeline_fields(plan, version))
    fields["context_parallel_degree"] = c.cp
    if c.cp > 1 and version == "0.2":  # 0.3.0 has no such field: it runs PyTorch's default, allgather
        fields["context_parallel_rotate_method"] = ROTATE_METHOD
    if plan.model.is_moe:
        fields["expert_parallel_degree"] = c.ep
        if version == "0.2":
            fields["expert_tensor_parallel_degree"] = c.etp
        if c.ep > 1 and plan.dispatcher == "deepep":  # 0.2.2's field; torchtitan_program refuses 0.3.0, which lacks it
            fields["expert_parallel_comm_backend"] = "deepep"
    return fields


def pipeline_fields(plan: ExportPlan, version: TorchtitanVersion) -> dict[str, int | str | bool | list[list[str]]]:
    """Schedule, layers per virtual stage and the embedding/loss weights that reproduce stage_layers
    through torchtitan's own split (cost_models/pipeline_splits.py); a one-chunk-per-rank split that split
    cannot give is written module by module (module_fqns_per_model_part)."""
    layers, vpp = plan.stage_layers, plan.config.vpp
    schedule = "DualPipeV" if plan.config.pp_schedule == "dualpipev" else "1F1B" if vpp == 1 else "Interleaved1F1B"
    fields: dict[str, int | str | bool | list[list[str]]] = {"pipeline_parallel_schedule": schedule}
    if schedule == "DualPipeV" and version == "0.2" and plan.model.is_moe:
        # 0.2.2 hooks the expert all-to-alls into DualPipeV by default and then refuses activation
        # checkpointing; the plan was priced as 0.3.0 runs DualPipeV, without that overlap.
        fields["pipeline_parallel_expert_parallel_overlap"] = False
    try:
        first_weight, last_weight = split_weights(layers, plan.model.num_layers)
    except InputError:
        if vpp > 1:
            raise
        return {**fields, "module_fqns_per_model_part": module_fqns(layers, version),
                "pipeline_parallel_microbatch_size": plan.config.mbs}
    size = stage_size(plan.model.num_layers + first_weight + last_weight, len(layers))
    if size is not None:
        fields["pipeline_parallel_layers_per_stage"] = size
    elif vpp > 2:  # without it torchtitan runs pp (1F1B) or 2·pp (Interleaved1F1B) stages
        raise InputError(f"torchtitan cannot run {len(layers)} stages of {list(layers)} layers: no "
                         "pipeline_parallel_layers_per_stage gives that many; re-plan with --engine torchtitan")
    return {**fields, "pipeline_parallel_first_stage_less_layers": first_weight,
            "pipeline_parallel_last_stage_less_layers": last_weight,
            "pipeline_parallel_microbatch_size": plan.config.mbs}


def module_fqns(layers: tuple[int, ...], version: TorchtitanVersion) -> list[list[str]]:
    """The modules of each pipeline stage: the embedding on the first, the final norm and the output head
    on the last (named ``lm_head`` in 0.3's common decoder, ``output`` in 0.2's models)."""
    bounds = [0, *itertools.accumulate(layers)]
    stages = [[f"layers.{i}" for i in range(bounds[s], bounds[s + 1])] for s in range(len(layers))]
    stages[0].insert(0, "tok_embeddings")
    stages[-1] += ["norm", "lm_head" if version == "0.3" else "output"]
    return stages


def split_weights(layers: tuple[int, ...], num_layers: int) -> tuple[int, int]:
    """(first_stage_less_layers, last_stage_less_layers) under which torchtitan's split gives ``layers``:
    its own choice for the job (pipeline_splits.edge_weights), or, for a partition that moved layers off
    the edges, the largest chunk less each edge chunk."""
    stages = len(layers)
    own = tuple(int(w) for w in edge_weights("torchtitan", num_layers, stages, 1))
    for first, last in (own, (max(layers) - layers[0], max(layers) - layers[-1])):
        if weighted_split_exists(num_layers, stages, first, last) and [
                int(weighted_chunk(num_layers, stages, first, last, k)) for k in range(stages)] == list(layers):
            return first, last
    raise InputError(f"torchtitan cannot express stage layers {list(layers)}: its split gives the first stages one "
                     "layer more and takes whole layers off the edges; export for Megatron or re-run the partition")


def stage_size(effective_layers: int, stages: int) -> int | None:
    """pipeline_parallel_layers_per_stage from which torchtitan derives exactly ``stages`` (⌈E / size⌉),
    or None where no size does."""
    size = -(-effective_layers // stages)
    return size if -(-effective_layers // size) == stages else None


def training(plan: ExportPlan) -> dict[str, int]:
    """[training] batch fields: with PP the local batch is split into micro-batches, else accumulated."""
    c = plan.config
    local = plan.global_batch // c.dp if c.pp > 1 else c.mbs
    return {"local_batch_size": local, "global_batch_size": plan.global_batch, "seq_len": plan.seq_len}


def model_choice(plan: ExportPlan, version: TorchtitanVersion, override: str | None) -> tuple[str, str]:
    """(module, config function) for 0.3 or (model name, flavor) for 0.2."""
    if override is not None:
        parts = override.split(":")
        if len(parts) != 2 or not all(parts):
            raise InputError(f"--torchtitan-model expects MODULE:CONFIG (0.3) or NAME:FLAVOR (0.2), got {override!r}")
        return parts[0], parts[1]
    table = REGISTRY_0_3 if version == "0.3" else FLAVORS_0_2
    if plan.model.name not in table:
        kind = "MODULE:CONFIG, e.g. llama3:llama3_8b" if version == "0.3" else "NAME:FLAVOR, e.g. llama3:8B"
        raise InputError(f"torchtitan {version} ships no config known to paraplan for {plan.model.name!r} (known: "
                         f"{', '.join(table)}); pass --torchtitan-model {kind}")
    return table[plan.model.name]


def parse_torchtitan_version(text: str) -> TorchtitanVersion:
    """``text`` as a torchtitan release line (TORCHTITAN_VERSIONS); InputError otherwise."""
    for version in TORCHTITAN_VERSIONS:
        if text == version:
            return version
    raise InputError(f"--torchtitan-version expects {' or '.join(TORCHTITAN_VERSIONS)}, got {text!r}")


def torchtitan_program(plan: ExportPlan, version: TorchtitanVersion, override: str | None = None) -> Program:
    """``-m torchtitan.train`` with 0.3 overrides or a 0.2 TOML file."""
    if plan.engine != "torchtitan":
        raise InputError(f"the plan was made for {plan.engine}, not torchtitan: its predictions and rules are that "
                         "engine's; re-plan with --engine torchtitan to export a torchtitan config")
    if version not in TORCHTITAN_VERSIONS:
        raise InputError(f"--torchtitan-version expects {' or '.join(TORCHTITAN_VERSIONS)}, got {version!r}")
    if plan.precision == "fp4" or (plan.precision == "fp8" and version == "0.3" and override is None):
        raise InputError(f"torchtitan {version} selects {plan.precision} training through a config-registry function "
                         "(e.g. llama3_8b_mxfp8), not an override; pass --torchtitan-model MODULE:CONFIG naming one"
                         if version == "0.3" else "torchtitan 0.2 has no fp4 training converter")
    if version == "0.3" and plan.model.is_moe and plan.config.ep > 1 and plan.dispatcher == "deepep":
        raise InputError("the plan dispatches experts with DeepEP; torchtitan 0.3.0 has no "
                         "expert_parallel_comm_backend to launch it with: export --torchtitan-version 0.2, or plan "
                         "with --dispatcher alltoall")
    c = plan.config
    # 0.2.2's parallelize: without FSDP (dp_shard = cp = 1) it applies DDP and raises when the world is not all dp.
    if version == "0.2" and c.zero == 0 and c.dp > 1 and c.cp == 1 and c.tp * c.pp > 1:
        raise InputError(f"torchtitan 0.2 runs ZeRO 0 (DDP over data_parallel_replicate_degree) only when every GPU is "
                         f"data parallel: with tp={c.tp}, pp={c.pp} it stops with 'DDP has not supported > 1D "
                         "parallelism'; export --torchtitan-version 0.3, or plan with --zero 2 or 3")
    module, config = model_choice(plan, version, override)
    notes = (f"attention kernel ({plan.attention}) and rotary settings come from torchtitan's model config",
             *cp_notes(plan), *fused_expert_notes(plan))
    entry = ("-m", "torchtitan.train")
    comment = "torchtitan's trainer (installed torchtitan package; TRAIN_SCRIPT replaces it)"
    if version == "0.2":
        group = ArgGroup(name="TORCHTITAN_ARGS", comment=f"torchtitan 0.2 job config ({TOML_NAME})",
                         args=(("--job.config_file", ConfigPath(TOML_NAME)),))
        toml = OutputFile(name=TOML_NAME, text=toml_text(plan, module, config))
        return Program(engine="torchtitan", entry=entry, entry_comment=comment, groups=(group,),
                       config_files=(toml,), notes=notes)
    return Program(engine="torchtitan", entry=entry, entry_comment=comment, groups=overrides(plan, module, config),
                   notes=notes)


def fused_expert_notes(plan: ExportPlan) -> tuple[str, ...]:
    """A plan priced with the experts' MLP fused (--fused-expert-mlp: Transformer Engine's op fuser, a Megatron
    switch): torchtitan has no such switch and runs its own grouped experts."""
    if not plan.fused_expert_mlp:
        return ()
    return ("the plan priced the routed experts' MLP fused (Transformer Engine's op fuser, --fused-expert-mlp); "
            "torchtitan has no switch for it and runs its own grouped experts (re-plan without --fused-expert-mlp "
            "to price them)",)


def cp_notes(plan: ExportPlan) -> tuple[str, ...]:
    """Where torchtitan's context parallelism runs other than the plan priced: it all-gathers K and V, and it
    shards parameters with FSDP over dp_shard·cp whenever cp > 1 (ParallelDims.fsdp_enabled), so ZeRO 0 is
    not replicated over the cp ranks."""
    c = plan.config
    notes: list[str] = []
    if c.cp > 1 and c.cp_comm != ROTATE_METHOD:
        notes.append(f"the plan priced context-parallel cp_comm {c.cp_comm}; torchtitan all-gathers K and V "
                     "(re-plan with --engine torchtitan to price that)")
    if c.cp > 1 and c.zero == 0:
        notes.append(f"torchtitan shards parameters over the {c.cp} context-parallel ranks (FSDP) whenever cp > 1: "
                     "this zero-0 plan runs sharded, not replicated as priced (re-plan with --zero 2,3)")
    return tuple(notes)


def overrides(plan: ExportPlan, module: str, config: str) -> tuple[ArgGroup, ...]:
    """The command-line groups of torchtitan 0.3; the activation-checkpoint subcommand must come last."""
    def dotted(section: str, fields: dict) -> tuple[Arg, ...]:
        args: list[Arg] = []
        for name, value in fields.items():
            if isinstance(value, list):  # tyro reads list[list[str]] as one comma-joined token per inner list
                args.append((f"--{section}.{name}", tuple(",".join(inner) for inner in value)))
            elif isinstance(value, bool):
                args.append((f"--{section}.{name}" if value else f"--{section}.no_{name}", None))
            else:
                args.append((f"--{section}.{name}", str(value)))
        return tuple(args)

    train = dict(training(plan))
    cuda_graphs_off = plan.config.pp > 1 or plan.config.ep > 1  # 0.3 refuses CUDA graphs with PP (and most EP)
    return (
        ArgGroup(name="MODEL_ARGS", comment="torchtitan config-registry entry of the model",
                 args=(("--module", module), ("--config", config))),
        ArgGroup(name="PARALLEL_ARGS", comment="Parallel layout (from the plan)",
                 args=dotted("parallelism", parallelism(plan, "0.3"))),
        ArgGroup(name="TRAINING_ARGS", comment="Batch and sequence (from the plan)",
                 args=dotted("training", {**train, "disable_cuda_graphs": True} if cuda_graphs_off else train)),
        *((ArgGroup(name="COMPILE_ARGS", comment="torch.compile of the model and the loss, as the plan priced",
                    args=(("--compile.enable", None),
                          *((("--compile.enable_async_tensor_parallel", None),) if plan.async_tp else ()))),)
          if plan.compiled else ()),
        ArgGroup(name="RECOMPUTE_ARGS", comment="Activation checkpointing (from the plan; a tyro subcommand, last)",
                 args=((f"activation-checkpoint:{plan.config.recompute}", None),), last=True),
    )


def toml_text(plan: ExportPlan, name: str, flavor: str) -> str:
    """The torchtitan 0.2 job TOML of ``plan``."""
    model: dict = {"name": name, "flavor": flavor}
    sections: dict[str, dict] = {"model": model, "training": training(plan),
                                 "parallelism": parallelism(plan, "0.2"),
                                 "activation_checkpoint": {"mode": plan.config.recompute}}
    if plan.compiled:
        sections["compile"] = {"enable": True, "components": ["model", "loss"]}
    if plan.async_tp:
        sections["parallelism"]["enable_async_tensor_parallel"] = True
    if plan.precision == "fp8":
        model["converters"] = ["quantize.linear.float8"]
        fsdp = plan.config.zero in (2, 3) and plan.config.dp > 1
        # torchao casts FSDP's all-gather to fp8 only under tensorwise scaling; rowwise gathers bf16.
        fsdp = fsdp and plan.fp8_recipe == "tensorwise"
        sections["quantize.linear.float8"] = {"recipe_name": plan.fp8_recipe, "enable_fsdp_float8_all_gather": fsdp,
                                              "precompute_float8_dynamic_scale_for_fsdp": fsdp}
    lines = [f"# torchtitan 0.2 job config written by paraplan for {plan.model.name}"]
    for section, fields in sections.items():
        lines.append(f"\n[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"


def toml_value(value: int | str | bool | list) -> str:
    """A TOML scalar or (nested) string list (JSON string escapes and arrays are valid TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)
