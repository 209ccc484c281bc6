"""torchtitan job files: a 0.2 job TOML and a 0.3 launch (``-m torchtitan.train --module llama3 --config
llama3_8b --parallelism.tensor_parallel_degree 8 ... activation-checkpoint:full``).

Field names are torchtitan's ``config/job_config.py`` (0.2.2) and ``torchtitan.config`` ParallelismConfig /
TrainingConfig / CompileConfig (0.3.0); their defaults apply to what a file leaves out. A 0.3 config-registry
function sets its own batch, sequence and activation checkpointing, restated in REGISTRY_0_3 for the ones
paraplan exports (``models/llama3/config_registry.py``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Protocol

from paraplan.errors import InputError
from paraplan.files import read_user_text, shown
from paraplan.job_files.imported import Facts, ImportedJob
from paraplan.job_files.launch import cluster_facts, find_launch, flag_values, header_facts
from paraplan.job_files.models import resolve_model
from paraplan.job_files.shell import read_script
from paraplan.model_specs.hf_config import load_model

Fields = dict[str, dict[str, tuple[Any, str]]]
"""section -> key -> (value, where)."""
FLAVORS_0_2 = {("llama3", "8B"): "llama-3.1-8b", ("llama3", "70B"): "llama-3.1-70b",
               ("llama3", "405B"): "llama-3.1-405b"}
"""torchtitan 0.2 (model name, flavor) -> preset (exporters/torchtitan.py FLAVORS_0_2, inverted)."""
REGISTRY_0_3: dict[tuple[str, str], dict[str, Any]] = {
    ("llama3", "llama3_8b"): {"model": "llama-3.1-8b", "local_batch_size": 1, "seq_len": 8192, "tp": 1,
                              "recompute": "selective"},
    ("llama3", "llama3_70b"): {"model": "llama-3.1-70b", "local_batch_size": 8, "seq_len": 8192, "tp": 8,
                               "recompute": "full"},
}
"""torchtitan 0.3.0 config-registry functions: the model and what they set over TrainingConfig's defaults."""
# TrainingConfig (0.3.0) / [training] (0.2.2) defaults.
_LOCAL_BATCH, _SEQ_LEN = 8, 2048
_SUBCOMMAND = re.compile(r"^[a-z][a-z_-]*:[a-z0-9_]+$")


class _Get(Protocol):
    """:func:`apply_fields`'s lookup: the file's value, else the config registry's, else torchtitan's default."""

    def __call__(self, section: str, key: str, default: Any = None,
                 registry_key: str | None = None) -> tuple[Any, str]:
        """(value, where it was read) of ``section.key``."""
_SCHEDULES = {"1F1B": ("1f1b", False), "GPipe": ("1f1b", False), "Interleaved1F1B": ("1f1b", True),
              "InterleavedZeroBubble": ("1f1b", True), "DualPipeV": ("dualpipev", True)}


def is_torchtitan_toml(text: str) -> bool:
    """Whether ``text`` is a torchtitan job TOML (a [parallelism], [training] or [model] table)."""
    return bool(re.search(r"^\s*\[(parallelism|training|model)\]", text, re.MULTILINE)) and "=" in text


def is_torchtitan_script(text: str) -> bool:
    """Whether ``text`` launches torchtitan's trainer with its own flags."""
    return "torchtitan" in text and bool(re.search(r"--(module|job\.config_file|parallelism\.)", text))


def toml_fields(path: Path, text: str) -> Fields:
    """The TOML's values with the line of each key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: malformed TOML: {exc}") from None
    lines: dict[tuple[str, str], int] = {}
    section = ""
    for number, line in enumerate(text.splitlines(), start=1):
        header = re.match(r"\s*\[([^\]]+)\]", line)
        assigned = re.match(r"\s*([A-Za-z0-9_]+)\s*=", line)
        if header:
            section = header.group(1).strip()
        elif assigned:
            lines.setdefault((section, assigned.group(1)), number)
    fields: Fields = {}
    for name, table in _flatten(data).items():
        for key, value in table.items():
            fields.setdefault(name, {})[key] = (value, f"{path}:{lines.get((name, key), 0)}")
    return fields


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """{"quantize": {"linear": {"float8": {...}}}} -> {"quantize.linear.float8": {...}} (leaf tables only)."""
    out: dict[str, dict[str, Any]] = {}
    leaves = {k: v for k, v in data.items() if not isinstance(v, dict)}
    if leaves:
        out[prefix] = leaves
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else key))
    return out


def read_torchtitan_toml(path: Path, text: str) -> ImportedJob:
    """The job of a torchtitan 0.2 job TOML."""
    facts = Facts(str(path), "torchtitan-toml", "torchtitan")
    apply_fields(toml_fields(path, text), facts, "0.2")
    return facts.build()


def read_torchtitan_script(path: Path, text: str) -> ImportedJob:
    """A launch of torchtitan's trainer: 0.3 overrides, or a 0.2 --job.config_file plus overrides."""
    script = read_script(text, str(path))
    launch = find_launch(script, lambda word: word in ("torchtitan.train", "torchtitan/train.py")
                         or word.endswith("torchtitan/train.py"))
    if launch is None:
        raise InputError(f"{path}: no command runs torchtitan's trainer (torchrun ... -m torchtitan.train --module "
                         "... --config ...); is this the launch script?")
    # tyro's subcommand (activation-checkpoint:full) is a positional word, not a flag's value.
    program = flag_values([w for w in launch.program if not _SUBCOMMAND.match(w.text)])
    toml = program.get("job.config_file")
    fields: Fields = {}
    version = "0.3"
    if toml is not None and isinstance(toml[0], str):
        config = _beside(toml[0], path, f"{path}:{toml[1]}")
        fields = toml_fields(config, read_user_text(config, 4 * 1024 * 1024, "torchtitan job config"))
        version = "0.2"
    facts = Facts(str(path), "torchtitan-args", "torchtitan")
    cluster_facts(launch, script, facts)
    for name, (value, line) in program.items():
        section, _, key = name.rpartition(".")
        if not section and key not in ("module", "config"):
            fields.setdefault("registry", {})[key] = (value, facts.at(line))  # Trainer.Config's own fields
        elif section and section != "job":
            negated = key.startswith("no_") and value is True
            fields.setdefault(section, {})[key[3:] if negated else key] = (
                not negated if value is True else value, facts.at(line))
    checkpoint = next((w for w in launch.program if w.text.startswith("activation-checkpoint:")), None)
    if checkpoint is not None:
        fields.setdefault("activation_checkpoint", {})["mode"] = (checkpoint.text.split(":", 1)[1],
                                                                  facts.at(checkpoint.line))
    for key in ("module", "config"):
        if key in program:
            fields.setdefault("registry", {})[key] = (program[key][0], facts.at(program[key][1]))
    apply_fields(fields, facts, version)
    header_facts(script, facts)
    return facts.build()


def _beside(name: str, script: Path, where: str) -> Path:
    for candidate in (Path(name), script.parent / name, script.parent / Path(name).name):
        if "$" not in str(candidate) and candidate.is_file():
            return candidate
    raise InputError(f"{where}: --job.config_file {shown(name)} is not beside {script.name}; pass the TOML to --from")


def apply_fields(fields: Fields, facts: Facts, version: str) -> None:
    """Set the job of torchtitan's sections in ``facts``, with torchtitan's defaults for what is left out."""
    registry = _registry(fields, facts)

    def get(section: str, key: str, default: Any = None, registry_key: str | None = None) -> tuple[Any, str]:
        """The file's value, else the config-registry function's, else torchtitan's default."""
        if key in fields.get(section, {}):
            return fields[section][key]
        if registry_key in registry:
            return registry[registry_key], f"{registry['where']} (config registry)"
        return default, "engine default"

    _model(fields, facts, registry)
    seq, where = get("training", "seq_len", _SEQ_LEN, "seq_len")
    facts.put("seq_len", _int(seq, "training.seq_len", where), where)
    names = {"tp": "tensor_parallel_degree", "pp": "pipeline_parallel_degree", "cp": "context_parallel_degree",
             "ep": "expert_parallel_degree", "etp": "expert_tensor_parallel_degree",
             "replicate": "data_parallel_replicate_degree"}
    degrees: dict[str, int] = {}
    for key, name in names.items():
        value, where = get("parallelism", name, 1, key)
        degrees[key] = _int(value, f"parallelism.{name}", where)
        if key != "replicate":
            facts.put(key, degrees[key], where)
    _context_parallel(get, facts, degrees["cp"])
    _expert_dispatch(get, facts, degrees.get("ep", 1))
    _data_parallel(get, facts, degrees)
    _pipeline(get, facts, degrees["pp"])
    _batch(get, facts, registry, degrees["pp"])
    tp_sp = get("parallelism", "enable_sequence_parallel", True)
    facts.put("sp", bool(tp_sp[0]) and degrees["tp"] > 1 if version == "0.3" else degrees["tp"] > 1, tp_sp[1])
    mode = get("activation_checkpoint", "mode", "selective", "recompute")
    if mode[0] not in ("none", "selective", "full"):
        raise InputError(f"{mode[1]}: activation_checkpoint mode {shown(mode[0])} is not none, selective or full")
    facts.put("recompute", mode[0], mode[1])
    compiled = get("compile", "enable", None)
    compiled = compiled if compiled[0] is not None else get("training", "compile", False)  # before 0.2
    facts.put("compiled", bool(compiled[0]), compiled[1])
    async_tp = get("compile", "enable_async_tensor_parallel", None)
    async_tp = async_tp if async_tp[0] is not None else get("parallelism", "enable_async_tensor_parallel", False)
    facts.put("async_tp", bool(async_tp[0]), async_tp[1])
    _precision(fields, facts, registry)


def _int(value: Any, name: str, where: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        number = None
    if number is None or isinstance(value, bool):
        raise InputError(f"{where}: {name} expects an integer, got {shown(value)}")
    return number


def _registry(fields: Fields, facts: Facts) -> dict[str, Any]:
    entry = fields.get("registry", {})
    if "module" not in entry:
        return {}
    key = (str(entry["module"][0]), str(entry.get("config", ("", ""))[0]))
    if key not in REGISTRY_0_3:
        facts.note(f"torchtitan config {key[0]}:{key[1]} ({entry['module'][1]}) is not one paraplan knows; its "
                   "own batch and checkpointing defaults are not read")
        return {}
    return {**REGISTRY_0_3[key], "where": entry["module"][1]}


def _model(fields: Fields, facts: Facts, registry: dict[str, Any]) -> None:
    model = fields.get("model", {})
    if "model" in registry:
        facts.put("model", registry["model"], registry["where"])
    name, flavor = model.get("name", (None, "")), model.get("flavor", (None, ""))
    if (name[0], flavor[0]) in FLAVORS_0_2:
        facts.put("model", FLAVORS_0_2[(name[0], flavor[0])], flavor[1])
    for key in ("hf_assets_path", "tokenizer_path"):
        for section in ("model", "registry"):
            value = fields.get(section, {}).get(key)
            if value and isinstance(value[0], str):
                facts.put("model", resolve_model(value[0], Path(facts.path).parent), value[1])
    if name[0] is not None and "model" not in facts.values:
        facts.note(f"torchtitan model {name[0]} flavor {flavor[0]} ({flavor[1]}) is not a paraplan preset")


def _context_parallel(get: _Get, facts: Facts, cp: int) -> None:
    """How context parallelism moves K and V: PyTorch's ring attention rotate method (0.2.2's
    ``parallelism.context_parallel_rotate_method``; 0.3.0 has no such field and runs PyTorch's default,
    allgather)."""
    if cp == 1:
        return
    method, where = get("parallelism", "context_parallel_rotate_method", "allgather")
    if method not in ("allgather", "alltoall"):
        raise InputError(f"{where}: context_parallel_rotate_method {shown(method)} is not allgather or alltoall")
    if method == "alltoall":
        # PyTorch's _AllToAllRotater passes each rank's K and V to the next, cp - 1 hops: the bytes of one
        # all-gather, hidden hop by hop instead of once under the local chunk.
        facts.note(f"torchtitan context_parallel_rotate_method alltoall ({where}) is priced as allgather, the "
                   "rotate method paraplan models for torchtitan (the same K/V bytes, overlapped hop by hop)")
    facts.put("cp_comm", "allgather", where)


def _expert_dispatch(get: _Get, facts: Facts, ep: int) -> None:
    """How experts' tokens travel: 0.2.2's ``parallelism.expert_parallel_comm_backend`` (standard: PyTorch's
    all-to-all; deepep: DeepEP's kernels); 0.3.0 has no such field and runs the all-to-all."""
    if ep <= 1:
        return
    backend, where = get("parallelism", "expert_parallel_comm_backend", "standard")
    if backend not in ("standard", "deepep"):
        raise InputError(f"{where}: expert_parallel_comm_backend {shown(backend)} is not standard or deepep")
    facts.put("dispatcher", "deepep" if backend == "deepep" else "alltoall", where)


def _data_parallel(get: _Get, facts: Facts, degrees: dict[str, int]) -> None:
    shard, where = get("parallelism", "data_parallel_shard_degree", -1)
    shard = _int(shard, "parallelism.data_parallel_shard_degree", where)
    replicate = degrees["replicate"]
    rest = degrees["tp"] * degrees["pp"] * degrees["cp"] * replicate
    if shard == -1:
        if "num_gpus" not in facts.values:
            facts.default("zero", 3)
            return
        shard = facts.values["num_gpus"] // rest
        where = f"world size / (tp·pp·cp·replicate) ({facts.sources['num_gpus']})"
    facts.put("dp", shard * replicate, where)
    # torchtitan shards with FSDP over dp_shard·cp whenever either is > 1 (ParallelDims.fsdp_enabled), as
    # paraplan's ZeRO shards over dp·cp.
    shards = shard * degrees["cp"]
    if shards > 1 and replicate > 1:
        facts.note(f"HSDP ({replicate} replicas x {shards} shards) is priced as sharding over all "
                   f"{shards * replicate}")
    reshard, reshard_where = get("parallelism", "fsdp_reshard_after_forward", "default")
    # torchtitan's "default" reshards after forward unless pipeline parallel is on.
    stage = {"always": 3, "never": 2}.get(str(reshard), 2 if degrees["pp"] > 1 else 3)
    facts.put("zero", stage if shards > 1 else 0, reshard_where if shards > 1 else where)


def _pipeline(get: _Get, facts: Facts, pp: int) -> None:
    schedule, where = get("parallelism", "pipeline_parallel_schedule", "1F1B")
    if pp == 1:
        facts.default("vpp", 1)
        return
    if schedule not in _SCHEDULES:
        raise InputError(f"{where}: pipeline_parallel_schedule {shown(schedule)} is not one of {', '.join(_SCHEDULES)}")
    name, interleaved = _SCHEDULES[schedule]
    facts.put("pp_schedule", name, where)
    parts = get("parallelism", "module_fqns_per_model_part", None)
    per_stage = get("parallelism", "pipeline_parallel_layers_per_stage", None)
    if parts[0]:
        facts.put("vpp", max(1, len(parts[0]) // pp), parts[1])
    elif name == "dualpipev" or (interleaved and per_stage[0] is None):
        facts.put("vpp", 2, where)
    elif interleaved and "model" in facts.values:  # the layer count decides the stage count
        layers = load_model(facts.values["model"]).num_layers
        first = _int(get("parallelism", "pipeline_parallel_first_stage_less_layers", 1)[0], "first_stage_less", where)
        last = _int(get("parallelism", "pipeline_parallel_last_stage_less_layers", 1)[0], "last_stage_less", where)
        size = _int(per_stage[0], "pipeline_parallel_layers_per_stage", per_stage[1])
        facts.put("vpp", max(1, -(-(layers + first + last) // size) // pp), per_stage[1])
    facts.default("vpp", 1)


def _batch(get: _Get, facts: Facts, registry: dict[str, Any], pp: int) -> None:
    # torchtitan before 0.2 named the local batch batch_size.
    local, where = get("training", "local_batch_size", None)
    if local is None:
        local, where = get("training", "batch_size", _LOCAL_BATCH, "local_batch_size")
    local = _int(local, "training.local_batch_size", where)
    if pp > 1:
        mbs, mbs_where = get("parallelism", "pipeline_parallel_microbatch_size", 1)
        facts.put("mbs", _int(mbs, "parallelism.pipeline_parallel_microbatch_size", mbs_where), mbs_where)
    else:
        facts.put("mbs", local, where)
    total, total_where = get("training", "global_batch_size", -1)
    total = _int(total, "training.global_batch_size", total_where)
    if total > 0:
        facts.put("global_batch", total, total_where)
    elif "dp" in facts.values:
        facts.put("global_batch", local * facts.values["dp"], f"local_batch_size x data-parallel ({where})")
    else:
        facts.put("local_batch", local, where)  # global_batch_size -1: local x data-parallel, once GPUs are known


def _precision(fields: Fields, facts: Facts, registry: dict[str, Any]) -> None:
    converters = fields.get("model", {}).get("converters", ([], ""))
    names = converters[0] if isinstance(converters[0], list) else [converters[0]]
    float8 = next((s for s in ("quantize.linear.float8", "float8") if s in fields), None)
    if any("float8" in str(n) for n in names):
        recipe = fields.get(float8 or "", {}).get("recipe_name", ("tensorwise", "engine default"))
        facts.put("precision", "fp8", converters[1])
        facts.put("fp8_recipe", recipe[0] or "tensorwise", recipe[1])
    elif any("mx" in str(n) for n in names):
        facts.put("precision", "fp8", converters[1])
        facts.put("fp8_recipe", "mxfp8", converters[1])
    facts.default("precision", "bf16")
