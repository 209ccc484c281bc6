"""DeepSpeed job files: ``ds_config.json`` and the ``deepspeed`` launch command that names it.

Keys are DeepSpeed 0.19's (``runtime/config.py``, ``runtime/zero/config.py``,
``runtime/tensor_parallel/config.py``): train_batch_size = micro-batch x gradient accumulation x
data-parallel size. Pipeline stages live in the model code (``PipelineModule(num_stages=...)``), so they
come from Megatron-DeepSpeed's ``--pipeline-model-parallel-size`` on the command line, else 1. The model
comes from Megatron-DeepSpeed's shape flags, a ``--model_name_or_path`` (Hugging Face style), or the
header of a paraplan export.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from paraplan.errors import InputError
from paraplan.files import parse_user_json, read_user_text, shown
from paraplan.job_files.imported import Facts, ImportedJob
from paraplan.job_files.launch import FlagValues, Launch, cluster_facts, find_launch, flag_values, header_facts
from paraplan.job_files.megatron_args import read_megatron
from paraplan.job_files.megatron_values import Args
from paraplan.job_files.models import resolve_model
from paraplan.job_files.shell import read_script
from paraplan.limits import MAX_GLOBAL_BATCH

MAX_JOB_FILE_BYTES = 4 * 1024 * 1024
"""Launch scripts and configs are a few KiB; logs can be long, but the arguments block sits at the start."""
_CONFIG_FLAGS = ("deepspeed_config", "deepspeed")
_SEQ_FLAGS = ("seq_length", "max_seq_length", "seq_len", "max_seq_len", "block_size", "model_max_length")
_MODEL_FLAGS = ("model_name_or_path", "model_name", "model", "model_path")


def is_ds_config(data: Any) -> bool:
    """Whether parsed JSON ``data`` is a DeepSpeed config (it sets a batch size or ZeRO)."""
    return isinstance(data, dict) and bool({"train_batch_size", "train_micro_batch_size_per_gpu",
                                            "zero_optimization"} & data.keys())


def is_deepspeed_script(text: str) -> bool:
    """Whether ``text`` runs the ``deepspeed`` launcher or passes a DeepSpeed config."""
    return bool(re.search(r"(^|[\s/])deepspeed\s|--deepspeed_config|--deepspeed-config", text))


def read_ds_config(path: Path, text: str, facts: Facts | None = None) -> ImportedJob | None:
    """A ds_config.json alone (``facts`` None) or as named by a launch script (its facts)."""
    alone = facts is None
    facts = facts or Facts(str(path), "deepspeed-json", "deepspeed")
    data = cast(dict[str, Any], parse_user_json(text, str(path)))  # top=dict: an object
    lines = _key_lines(text)

    def where(key: str) -> str:
        return f"{path}:{lines[key]}" if key in lines else str(path)

    def number(key: str, section: dict[str, Any] | None = None) -> int | None:
        value = (section if section is not None else data).get(key)
        if value is None or value == "auto":
            if value == "auto":
                facts.note(f"{key} is \"auto\" ({where(key)}): the Hugging Face Trainer fills it in; give it on the "
                           "command line")
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GLOBAL_BATCH:
            raise InputError(f"{where(key)}: {key} expects an integer from 0 to {MAX_GLOBAL_BATCH:,}, got "
                             f"{shown(value)}")
        return value

    tbs, mbs, gas = number("train_batch_size"), number("train_micro_batch_size_per_gpu"), \
        number("gradient_accumulation_steps")
    facts.put("global_batch", tbs, where("train_batch_size"))
    facts.put("mbs", mbs, where("train_micro_batch_size_per_gpu"))
    if tbs and mbs and gas:
        if tbs % (mbs * gas):
            raise InputError(f"{where('train_batch_size')}: train_batch_size {tbs} is not "
                             f"train_micro_batch_size_per_gpu {mbs} x gradient_accumulation_steps {gas} x a "
                             "data-parallel size; fix one of them")
        facts.put("dp", tbs // (mbs * gas), f"{where('train_batch_size')} / (micro-batch x accumulation)")
    zero = data.get("zero_optimization") or {}
    facts.put("zero", number("stage", zero) if isinstance(zero, dict) else None, where("stage"))
    tp = data.get("tensor_parallel") or {}
    facts.put("tp", number("autotp_size", tp) if isinstance(tp, dict) else None, where("autotp_size"))
    _precision(data, facts, where)
    if isinstance(data.get("activation_checkpointing"), dict):
        facts.put("recompute", "full", where("activation_checkpointing"))
        facts.note("activation_checkpointing in ds_config is read as full recompute (the model code decides what "
                   "it wraps in deepspeed.checkpointing.checkpoint)")
    if alone:
        _defaults(facts)
        return facts.build()
    return None


def _precision(data: dict[str, Any], facts: Facts, where: Callable[[str], str]) -> None:
    def enabled(key: str) -> bool:
        section = data.get(key)
        return isinstance(section, dict) and section.get("enabled") is True

    if enabled("bf16") or enabled("bfloat16"):
        facts.put("precision", "bf16", where("bf16") if "bf16" in data else where("bfloat16"))
    elif enabled("fp16"):
        facts.put("precision", "bf16", where("fp16"))
        facts.note(f"fp16 ({where('fp16')}) is priced as bf16: the same tensor-core rate and bytes")


def _defaults(facts: Facts) -> None:
    for key, value in (("tp", 1), ("pp", 1), ("cp", 1), ("zero", 0), ("recompute", "none"), ("sp", False),
                       ("precision", "bf16")):
        facts.default(key, value)
    if "pp" not in facts.sources or facts.sources["pp"] == "engine default":
        facts.note("DeepSpeed pipeline stages are set in the model code (PipelineModule); read as pp = 1")


def _key_lines(text: str) -> dict[str, int]:
    """First line of each JSON key (for ``file:line`` sources)."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        for key in re.findall(r'"([A-Za-z0-9_]+)"\s*:', line):
            lines.setdefault(key, number)
    return lines


def read_deepspeed_script(path: Path, text: str) -> ImportedJob:
    """A ``deepspeed`` launch: its nodes and GPUs, the ds_config.json it names, Megatron-DeepSpeed flags."""
    script = read_script(text, str(path))
    facts = Facts(str(path), "deepspeed-script", "deepspeed")
    launch = find_launch(script, lambda word: word.endswith(".py") and not word.startswith("-"))
    if launch is None:
        raise InputError(f"{path}: no command runs a training script (deepspeed --num_nodes N --num_gpus G train.py "
                         "--deepspeed_config ds_config.json); is this the launch script?")
    cluster_facts(launch, script, facts)
    _hostfile(launch, path, facts)
    program = flag_values(launch.program)
    config = next((given for name in _CONFIG_FLAGS if (given := _word_value(program, name)) is not None), None)
    if config is None:
        raise InputError(f"{facts.at(launch.entry.line)}: the command names no --deepspeed_config FILE; add it, or "
                         "pass the ds_config.json itself to --from")
    config_path = _resolve(config[0], path, facts.at(config[1]))
    read_ds_config(config_path, read_user_text(config_path, MAX_JOB_FILE_BYTES, "DeepSpeed config"), facts)
    if any(name in program for name in ("num_layers", "tensor_model_parallel_size", "pipeline_model_parallel_size")):
        _megatron_deepspeed(program, facts, path)
    for name in _MODEL_FLAGS:
        given = _word_value(program, name)
        if given is not None and "model" not in facts.values:
            preset = resolve_model(given[0], path.parent)
            facts.put("model", preset, facts.at(given[1]))
    for name in _SEQ_FLAGS:
        if isinstance(program.get(name, (True,))[0], str):
            facts.put("seq_len", Args(program, facts, dashed=True).int(name), facts.at(program[name][1]))
    header_facts(script, facts)
    _defaults(facts)
    return facts.build()


def _word_value(program: FlagValues, name: str) -> tuple[str, int | None] | None:
    """``program[name]`` (value, line) when the flag has one word as its value; None when absent, bare or a list."""
    value, line = program.get(name, (True, None))
    return (value, line) if isinstance(value, str) else None


def _megatron_deepspeed(program: FlagValues, facts: Facts, path: Path) -> None:
    """Megatron-DeepSpeed's flags: tp, pp and the model shape; they must agree with ds_config."""
    before = {key: (facts.values.get(key), facts.sources.get(key)) for key in ("global_batch", "mbs", "tp")}
    read_megatron(Args(program, facts, dashed=True), f"{path.name} model")
    args = Args(program, facts, dashed=True)
    for key, name in (("global_batch", "global_batch_size"), ("mbs", "micro_batch_size"),
                      ("tp", "tensor_model_parallel_size")):
        value, source = before[key]
        if value is not None and args.has(name) and args.int(name) != value:
            raise InputError(f"{args.where(name)}: {args.spell(name)} {args.int(name)} contradicts {source} ({value}); "
                             "make them agree")


def _hostfile(launch: Launch, path: Path, facts: Facts) -> None:
    """Nodes and slots from the --hostfile the launcher names (comments and blank lines skipped)."""
    entry = launch.launcher.get("hostfile")
    if entry is None or not isinstance(entry[0], str):
        return
    hostfile = _beside(entry[0], path)
    if hostfile is None:
        return
    slots = [int(m.group(1)) for line in read_user_text(hostfile, MAX_JOB_FILE_BYTES, "hostfile").splitlines()
             if not line.strip().startswith("#") and (m := re.search(r"slots\s*=\s*([0-9]+)", line))]
    if slots:
        facts.put("num_nodes", len(slots), f"{hostfile} ({len(slots)} hosts)")
        facts.put("gpus_per_node", max(slots), f"{hostfile} (slots)")


def _beside(name: str, script: Path) -> Path | None:
    """A file a script names: as written, beside the script, or its base name beside the script (a path through
    $CONFIG_DIR or another variable the script sets at run time); None when none of these is a file."""
    for candidate in (Path(name), script.parent / name, script.parent / Path(name.replace("\\", "/")).name):
        if "$" not in str(candidate) and candidate.is_file():
            return candidate
    return None


def _resolve(name: str, script: Path, where: str) -> Path:
    """:func:`_beside`, or InputError naming ``where`` the script names the file."""
    found = _beside(name, script)
    if found is not None:
        return found
    raise InputError(f"{where}: names {shown(name)}, which is not beside {script.name} ({script.parent}); pass "
                     "ds_config.json to --from directly")

