"""Megatron-Bridge and NeMo YAML: the ConfigContainer a recipe dumps, and NeMo 1.0's trainer/model config.

A ConfigContainer (``megatron/bridge/training/config.py``) holds ``model`` (GPTModelProvider: Megatron-core
TransformerConfig names), ``train`` (global_batch_size, micro_batch_size), ``dataset`` (seq_length),
``ddp`` (use_distributed_optimizer, use_megatron_fsdp, data_parallel_sharding_strategy), ``optimizer``,
``comm_overlap`` and ``mixed_precision`` (a MixedPrecisionConfig, or a recipe name such as
``bf16_with_fp8_current_scaling_mixed``). Their names become Megatron's argument names and go through the
same reader as a Megatron launch script. The world size is not part of a ConfigContainer (give --gpus).

NeMo 1.0 (``megatron_gpt_config.yaml``): ``trainer.num_nodes``, ``trainer.devices``, ``trainer.precision`` and
``model.*`` with NeMo's own names (activation, bias, activations_checkpoint_granularity, optim.name).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from paraplan.errors import InputError
from paraplan.files import shown
from paraplan.hardware_profiles.yaml_schema import parse_yaml
from paraplan.job_files.imported import Facts, ImportedJob
from paraplan.job_files.launch import FlagValues
from paraplan.job_files.megatron_args import read_megatron
from paraplan.job_files.megatron_values import Args
from paraplan.job_files.models import resolve_model

# Megatron-Bridge mixed-precision recipe names (megatron/bridge/training/mixed_precision.py) -> (fp8, recipe).
_RECIPES = {"current_scaling": "tensorwise", "delayed": "delayed", "mxfp8": "mxfp8", "subchannel": "blockwise",
            "blockwise": "blockwise"}


def is_bridge(data: dict[str, Any]) -> bool:
    """Whether parsed YAML ``data`` is a Megatron-Bridge ConfigContainer or a NeMo 1.0 config (a model section with
    a layout or shape, beside train, trainer or a ConfigContainer target)."""
    model = data.get("model")
    return isinstance(model, dict) and ("tensor_model_parallel_size" in model or "num_layers" in model) and (
        "train" in data or "trainer" in data or "ConfigContainer" in str(data.get("_target_", "")))


def yaml_lines(text: str) -> dict[str, int]:
    """Dotted key path -> line, by indentation (block-style YAML as the dumps write it)."""
    lines: dict[str, int] = {}
    stack: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.match(r"^(\s*)([A-Za-z_][A-Za-z0-9_.-]*)\s*:", line)
        if not match or line.lstrip().startswith(("#", "-")):
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        lines.setdefault(".".join(key for _, key in stack), number)
    return lines


def read_bridge(path: Path, text: str) -> ImportedJob:
    """The job of a Megatron-Bridge ConfigContainer dump or a NeMo 1.0 YAML config."""
    data = _interpolated(parse_yaml(text, str(path)))
    lines = yaml_lines(text)
    facts = Facts(str(path), "megatron-bridge", "megatron")
    if "trainer" in data and "train" not in data:
        values = _nemo1(data, lines, facts)
    else:
        values = _container(data, lines, facts)
    hf_id = (data.get("model") or {}).get("hf_model_id")
    if isinstance(hf_id, str) and not values.get("num_layers"):
        facts.put("model", resolve_model(hf_id, path.parent), facts.at(lines.get("model.hf_model_id")))
    read_megatron(Args(values, facts, dashed=False), f"{path.name} model")
    return facts.build()


_REFERENCE = re.compile(r"^\$\{(\.?)([A-Za-z_][A-Za-z0-9_.]*)\}$")


def _interpolated(data: dict[str, Any]) -> dict[str, Any]:
    """NeMo's OmegaConf references resolved where they are plain: ``${.encoder_seq_length}`` (a sibling) and
    ``${trainer.precision}`` (from the top); others stay as written."""
    def resolve(table: dict[str, Any], key: str, depth: int = 0) -> Any:
        value = table[key]
        match = _REFERENCE.match(value) if isinstance(value, str) else None
        if match is None or depth > 8:
            return value
        scope: Any = table if match.group(1) else data
        target = match.group(2)
        *parents, leaf = target.split(".")
        for parent in parents:
            scope = scope.get(parent) if isinstance(scope, dict) else None
        if not isinstance(scope, dict) or leaf not in scope:
            return value
        return resolve(scope, leaf, depth + 1)

    def walk(table: dict[str, Any]) -> dict[str, Any]:
        return {k: walk(v) if isinstance(v, dict) else resolve(table, k) for k, v in table.items()}
    return walk(data)


def _pick(data: dict[str, Any], lines: dict[str, int], section: str, key: str) -> tuple[Any, int | None] | None:
    table = data.get(section)
    if not isinstance(table, dict) or table.get(key) is None:
        return None
    value = table[key]
    if isinstance(value, bool):
        value = "True" if value else "False"
    elif isinstance(value, list):
        value = [str(v) for v in value]
    elif isinstance(value, dict):
        return None
    return (value if isinstance(value, list) else str(value), lines.get(f"{section}.{key}"))


def _section(data: dict[str, Any], key: str, facts: Facts) -> dict[str, Any]:
    """``data[key]`` when it is a mapping (absent or null: empty); InputError naming the key otherwise."""
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise InputError(f"{facts.path}: {key} must be a mapping of settings, got {shown(value)}")
    return value


def _container(data: dict[str, Any], lines: dict[str, int], facts: Facts) -> FlagValues:
    values: FlagValues = {k: v for k in _section(data, "model", facts)
                          if (v := _pick(data, lines, "model", k)) is not None}
    renames = {"gated_linear_unit": "swiglu", "num_moe_experts": "num_experts"}
    for old, new in renames.items():
        if old in values:
            values[new] = values[old]
    if "share_embeddings_and_output_weights" in values:
        share, line = values["share_embeddings_and_output_weights"]
        values["untie_embeddings_and_output_weights"] = ("False" if share == "True" else "True", line)
    if "num_query_groups" in values and values["num_query_groups"][0] != values.get("num_attention_heads", (0,))[0]:
        values["group_query_attention"] = ("True", values["num_query_groups"][1])
    for section, keys in (("train", ("global_batch_size", "micro_batch_size")),
                          ("dataset", ("seq_length", "sequence_length")),
                          ("ddp", ("use_distributed_optimizer", "use_megatron_fsdp",
                                   "data_parallel_sharding_strategy")),
                          ("optimizer", ("use_distributed_optimizer",)), ("comm_overlap", ("tp_comm_overlap",)),
                          ("tokenizer", ("vocab_size",))):
        for key in keys:
            picked = _pick(data, lines, section, key)
            if picked is not None and not (key in values and picked[0] in ("False", "None")):
                values["seq_length" if key == "sequence_length" else key] = picked
    _mixed_precision(data, lines, values, facts)
    return values


def _mixed_precision(data: dict[str, Any], lines: dict[str, int], values: FlagValues, facts: Facts) -> None:
    """mixed_precision overrides the model's own precision fields (Bridge applies it to the provider)."""
    mixed = data.get("mixed_precision")
    line = lines.get("mixed_precision")
    if isinstance(mixed, str):
        fp8 = next((recipe for key, recipe in _RECIPES.items() if key in mixed), None)
        values.update(bf16=("True", line), fp8=("hybrid" if fp8 else "None", line))
        if "fp8" in mixed and fp8:
            values["fp8_recipe"] = (fp8, line)
        if "fp4" in mixed:
            values["fp4"] = ("nvfp4", line)
    elif isinstance(mixed, dict):
        for key in ("bf16", "fp16", "fp8", "fp8_recipe", "fp4"):
            picked = _pick(data, lines, "mixed_precision", key)
            values[key] = picked if picked is not None else ("None", line)


def _nemo1(data: dict[str, Any], lines: dict[str, int], facts: Facts) -> FlagValues:
    trainer, model = _section(data, "trainer", facts), _section(data, "model", facts)
    for key, name in (("num_nodes", "num_nodes"), ("gpus_per_node", "devices")):
        if isinstance(trainer.get(name), int) and not isinstance(trainer.get(name), bool):
            facts.put(key, trainer[name], facts.at(lines.get(f"trainer.{name}")))
    values: FlagValues = {k: v for k in model if (v := _pick(data, lines, "model", k)) is not None}
    precision = str(trainer.get("precision", ""))
    line = lines.get("trainer.precision")
    values["bf16" if "bf16" in precision else "fp16" if "16" in precision else "fp32"] = ("True", line)
    if str(model.get("activation", "")).endswith("swiglu"):
        values["swiglu"] = ("True", lines.get("model.activation"))
    if model.get("bias") is False:
        values["disable_bias_linear"] = ("True", lines.get("model.bias"))
    if "encoder_seq_length" in values:
        values["seq_length"] = values["encoder_seq_length"]
    if model.get("share_embeddings_and_output_weights") is False:
        values["untie_embeddings_and_output_weights"] = ("True", lines.get("model.share_embeddings_and_output_weights"))
    if model.get("num_query_groups") and model.get("num_query_groups") != model.get("num_attention_heads"):
        values["group_query_attention"] = ("True", lines.get("model.num_query_groups"))
    for nemo, megatron in (("activations_checkpoint_granularity", "recompute_granularity"),
                           ("activations_checkpoint_method", "recompute_method"),
                           ("activations_checkpoint_num_layers", "recompute_num_layers")):
        if nemo in values:
            values[megatron] = values[nemo]
    optim = model.get("optim") or {}
    if isinstance(optim, dict) and "distributed" in str(optim.get("name", "")):
        values["use_distributed_optimizer"] = ("True", lines.get("model.optim.name"))
    if model.get("fp8") is True:
        values["fp8"] = ("hybrid" if model.get("fp8_hybrid") else "e4m3", lines.get("model.fp8"))
    if not isinstance(data.get("model"), dict):
        raise InputError(f"{facts.path}: model must be a mapping")
    return values
