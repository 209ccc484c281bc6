"""Megatron-LM's arguments (``megatron/training/arguments.py``, core_v0.16) as a job: layout, batch, precision.

One reader for every place the arguments appear: a launch script's command line (``--tensor-model-parallel-size
8``), a training log's arguments block (``tensor_model_parallel_size ... 8``) and a Megatron-Bridge YAML
(``model.tensor_model_parallel_size: 8``). Names are argparse's dest names (underscores).
"""

from __future__ import annotations

import re

from paraplan.choices import MEGATRON_CP_COMM_TYPES
from paraplan.errors import InputError
from paraplan.files import shown
from paraplan.job_files.megatron_model import matching_preset, megatron_model
from paraplan.job_files.megatron_values import Args

_CP_COMM = {spelling: name for name, spelling in MEGATRON_CP_COMM_TYPES.items()}
# cost_models.table's "modules" set: the cheap modules Megatron's --recompute-modules can name.
_CHEAP_MODULES = {"layernorm", "mla_up_proj", "moe_act"}
_SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
_ATTENTION = {"flash": "flash", "fused": "fused", "unfused": "unfused"}


def read_megatron(args: Args, model_name: str) -> None:
    """Model, sequence, batch, precision and layout of a Megatron job into ``args.facts``."""
    facts = args.facts
    if args.has("num_layers"):
        try:
            spec = megatron_model(args, model_name)
        except InputError as exc:  # e.g. no vocabulary size: MODEL on the command line can still name it
            facts.put("model_problem", str(exc), args.where("num_layers"))
        else:
            preset = matching_preset(spec)
            facts.put("model", preset, args.where("num_layers")) if preset else facts.put(
                "model_spec", spec, args.where("num_layers"))
    for key, name in (("seq_len", "seq_length"), ("seq_len", "encoder_seq_length"),
                      ("global_batch", "global_batch_size"), ("mbs", "micro_batch_size"), ("num_gpus", "world_size")):
        if args.has(name):
            args.put(key, name, args.int(name))
    _parallel(args)
    _memory(args)
    _precision(args)
    _moe_job(args)
    if args.has("data_parallel_size"):
        args.put("dp", "data_parallel_size", args.int("data_parallel_size"))
    if "global_batch" not in facts.values and {"mbs", "num_gpus"} <= facts.values.keys():
        shape = facts.values.get("tp", 1) * facts.values.get("pp", 1) * facts.values.get("cp", 1)
        facts.put("global_batch", facts.values["mbs"] * facts.values["num_gpus"] // shape,
                  "Megatron default: micro-batch x data-parallel")
    elif "global_batch" not in facts.values and "mbs" in facts.values:
        facts.put("local_batch", facts.values["mbs"], facts.sources["mbs"])


def _parallel(args: Args) -> None:
    for key, name in (("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"),
                      ("cp", "context_parallel_size"), ("ep", "expert_model_parallel_size")):
        if args.has(name):
            args.put(key, name, args.int(name))
        args.facts.default(key, 1)
    cp_comm = args.text("cp_comm_type")
    if cp_comm is not None and args.facts.values["cp"] > 1:
        if cp_comm not in _CP_COMM:
            raise InputError(f"{args.where('cp_comm_type')}: {args.spell('cp_comm_type')} {shown(cp_comm)} is not "
                             f"one of {', '.join(_CP_COMM)}")
        args.put("cp_comm", "cp_comm_type", _CP_COMM[cp_comm])
    if args.has("num_experts"):
        etp = args.int("expert_tensor_parallel_size")
        # Megatron sets ETP to the dense TP degree when it is not given.
        args.facts.put("etp", etp, args.where("expert_tensor_parallel_size")) if etp else args.facts.default(
            "etp", args.facts.values["tp"])
    source = next((n for n in ("virtual_pipeline_model_parallel_size", "pipeline_model_parallel_layout",
                                "num_virtual_stages_per_pipeline_rank", "num_layers_per_virtual_pipeline_stage")
                   if args.has(n)), "")
    args.facts.put("vpp", _virtual_stages(args), args.where(source))
    args.facts.default("vpp", 1)
    for key, name in (("sp", "sequence_parallel"), ("tp_overlap", "tp_comm_overlap"),
                      ("ep_overlap", "overlap_moe_expert_parallel_comm")):
        args.put(key, name, True) if args.flag(name) else args.facts.default(key, False)
    for name in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                 "pipeline_model_parallel_layout", "num_layers_in_first_pipeline_stage"):
        if args.has(name):
            args.facts.note(f"{args.spell(name)} ({args.where(name)}): layers per stage are priced as the engine "
                            "splits them")


def _virtual_stages(args: Args) -> int | None:
    if args.has("virtual_pipeline_model_parallel_size"):
        return args.int("virtual_pipeline_model_parallel_size")
    if args.has("pipeline_model_parallel_layout"):
        return _layout_stages(args)
    if args.has("num_virtual_stages_per_pipeline_rank"):  # Megatron takes it as the virtual pipeline size as it is
        return args.int("num_virtual_stages_per_pipeline_rank")
    if not args.has("num_layers_per_virtual_pipeline_stage"):
        return None
    # has() above: the argument is set, so int() gives a number (``or 0`` only tells mypy it is not None).
    per_chunk = args.int("num_layers_per_virtual_pipeline_stage") or 0
    pp = args.int("pipeline_model_parallel_size") or 1
    layers = (args.int("num_layers") or 0) + args.flag("account_for_embedding_in_pipeline_split") + args.flag(
        "account_for_loss_in_pipeline_split")
    if per_chunk == 0 or layers % (pp * per_chunk):
        raise InputError(f"{args.where('num_layers_per_virtual_pipeline_stage')}: {layers} layers do not split into "
                         f"{pp} stages of {args.spell('num_layers_per_virtual_pipeline_stage')} {per_chunk}")
    return layers // (pp * per_chunk)


def _layout_stages(args: Args) -> int:
    """Virtual stages of --pipeline-model-parallel-layout: its '|'-separated chunks (``(tttt|)*14`` unrolled,
    as PipelineParallelLayerLayout.parse_str_to_list does) over the pipeline ranks."""
    text = re.sub(r"[\s,'\"]", "", args.text("pipeline_model_parallel_layout") or "")
    previous = None
    while previous != text:  # innermost groups first
        previous, text = text, re.sub(r"\(([^()]*)\)\*([0-9]+)", lambda m: m.group(1) * int(m.group(2)), text)
    chunks, pp = text.count("|") + 1, args.int("pipeline_model_parallel_size") or 1
    if chunks % pp:
        raise InputError(f"{args.where('pipeline_model_parallel_layout')}: the layout has {chunks} chunks, not a "
                         f"multiple of {args.spell('pipeline_model_parallel_size')} {pp}")
    return chunks // pp


def _memory(args: Args) -> None:
    """Distributed optimizer / FSDP as ZeRO stages, recompute, activation offload."""
    facts = args.facts
    fsdp = next((name for name in ("use_megatron_fsdp", "use_torch_fsdp2", "use_custom_fsdp") if args.flag(name)), None)
    if fsdp:
        strategy = args.text("data_parallel_sharding_strategy") or "optim_grads_params"
        args.put("zero", fsdp, _SHARDING.get(strategy, 3))
    elif args.flag("use_distributed_optimizer"):
        args.put("zero", "use_distributed_optimizer", 1)
    facts.default("zero", 0)
    granularity = args.text("recompute_granularity")
    if granularity == "full":
        if (args.text("recompute_method") or "uniform") != "uniform" or (args.int("recompute_num_layers") or 1) != 1:
            facts.note(f"full recompute with {args.spell('recompute_method')} {args.text('recompute_method')} "
                       f"{args.spell('recompute_num_layers')} {args.text('recompute_num_layers')} is priced as every "
                       "layer recomputed")
        args.put("recompute", "recompute_granularity", "full")
    elif granularity == "selective":
        modules = set((args.text("recompute_modules") or "core_attn").replace(",", " ").split())
        cheap = bool(modules) and modules <= _CHEAP_MODULES
        if not cheap and modules != {"core_attn"}:
            facts.note(f"--recompute-modules {' '.join(sorted(modules))} is priced as selective (core attention)")
        args.put("recompute", "recompute_granularity", "modules" if cheap else "selective")
    facts.default("recompute", "none")
    if args.int("cpu_offloading_num_layers"):
        args.put("offload", "cpu_offloading_num_layers", args.int("cpu_offloading_num_layers"))


def _precision(args: Args) -> None:
    facts = args.facts
    fp8 = _enabled(args.text("fp8")) or _enabled(args.text("fp8_format"))
    if _enabled(args.text("fp4")) or _enabled(args.text("fp4_format")):
        args.put("precision", "fp4_format" if args.has("fp4_format") else "fp4", "fp4")
    elif fp8:
        args.put("precision", "fp8_format" if args.has("fp8_format") else "fp8", "fp8")
        # Megatron's --fp8-recipe defaults to delayed scaling.
        args.put("fp8_recipe", "fp8_recipe", args.text("fp8_recipe")) if args.has("fp8_recipe") else facts.default(
            "fp8_recipe", "delayed")
    elif args.flag("bf16"):
        args.put("precision", "bf16", "bf16")
    elif args.flag("fp16"):
        args.put("precision", "fp16", "bf16")
        facts.note(f"fp16 ({args.where('fp16')}) is priced as bf16: the same tensor-core rate and bytes")
    else:
        facts.note("neither --bf16 nor --fp16: Megatron trains in fp32, which paraplan does not model; priced as bf16")
        facts.default("precision", "bf16")
    backend = args.text("attention_backend")
    if backend is not None:
        backend = backend.rsplit(".", 1)[-1]  # a log writes AttnBackend.fused
        args.put("attention", "attention_backend", _ATTENTION.get(backend, "auto"))


def _enabled(value: str | None) -> str | None:
    """A format name, or None for an unset or switched-off one (NeMo writes fp8: False)."""
    return None if value is None or value.lower() in ("false", "0") else value


def _moe_job(args: Args) -> None:
    if args.text("moe_token_dispatcher_type") == "flex" and (args.text("moe_flex_dispatcher_backend") or "deepep") == \
            "deepep" or args.flag("moe_enable_deepep"):
        args.put("dispatcher", "moe_token_dispatcher_type", "deepep")
    elif args.text("moe_token_dispatcher_type") == "alltoall":
        args.put("dispatcher", "moe_token_dispatcher_type", "alltoall")
    if args.has("moe_expert_capacity_factor"):
        args.put("capacity_factor", "moe_expert_capacity_factor", args.number("moe_expert_capacity_factor"))
    # --use-transformer-engine-op-fuser (Megatron-LM core_r0.18+), Bridge's model.use_transformer_engine_op_fuser.
    if args.flag("use_transformer_engine_op_fuser"):
        args.put("fused_expert_mlp", "use_transformer_engine_op_fuser", True)
