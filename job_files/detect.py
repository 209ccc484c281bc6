"""Which format a job file is in, told from its content (never its name), and the reader for it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from paraplan.errors import InputError
from paraplan.files import parse_user_json, read_user_text
from paraplan.hardware_profiles.yaml_schema import parse_yaml
from paraplan.job_files import bridge, deepspeed, megatron, torchtitan
from paraplan.job_files.imported import ImportedJob

MAX_JOB_FILE_BYTES = 64 * 1024 * 1024
"""Scripts and configs are a few KiB; a training log's arguments block sits in its first few hundred KiB, but
the log goes on per iteration: 64 MiB holds days of logging while refusing a checkpoint passed by mistake."""
KINDS = ("Megatron-LM launch script or log, Megatron-Bridge/NeMo YAML, torchtitan TOML or launch script, DeepSpeed "
         "ds_config.json or launch script")


def detect_format(path: Path, text: str) -> str:
    """One of imported.FORMATS; InputError naming the formats when nothing matches."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        if deepspeed.is_ds_config(parse_user_json(text, str(path), top=None)):
            return "deepspeed-json"
        raise InputError(f"{path}: JSON, but not a DeepSpeed config (no train_batch_size, "
                         "train_micro_batch_size_per_gpu or zero_optimization); is this the ds_config.json the launch "
                         "script names?")
    if megatron.is_megatron_log(text):
        return "megatron-log"
    if torchtitan.is_torchtitan_toml(text) and not stripped.startswith(("#!", "export ")):
        return "torchtitan-toml"
    mapping = _yaml_mapping(path, text)
    if mapping is not None:
        if bridge.is_bridge(mapping):
            return "megatron-bridge"
        raise InputError(f"{path}: YAML, but not a Megatron-Bridge or NeMo config (no model.tensor_model_parallel_size "
                         "beside train: or trainer:); is this the config the recipe dumped?")
    if torchtitan.is_torchtitan_script(text):
        return "torchtitan-args"
    if deepspeed.is_deepspeed_script(text):
        return "deepspeed-script"
    if megatron.is_megatron_script(text):
        return "megatron-script"
    raise InputError(f"{path}: not a job file paraplan reads; --from takes a {KINDS}")


def _yaml_mapping(path: Path, text: str) -> dict[str, Any] | None:
    """The YAML mapping of a file that looks like block YAML (``key:`` lines, no shell commands)."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines or not all(":" in line or line.lstrip().startswith("-") for line in lines[:5]):
        return None
    try:
        return parse_yaml(text, str(path))
    except InputError:
        if text.lstrip().startswith(("model:", "_target_:", "trainer:", "train:")):
            raise
        return None


_READERS: dict[str, Callable[[Path, str], ImportedJob | None]] = {
    "megatron-script": megatron.read_megatron_script, "megatron-log": megatron.read_megatron_log,
    "megatron-bridge": bridge.read_bridge, "torchtitan-toml": torchtitan.read_torchtitan_toml,
    "torchtitan-args": torchtitan.read_torchtitan_script, "deepspeed-json": deepspeed.read_ds_config,
    "deepspeed-script": deepspeed.read_deepspeed_script,
}


def read_job_file(path: Path) -> ImportedJob:
    """The job ``path`` describes, whatever format it is in."""
    path = Path(path)
    text = read_user_text(path, MAX_JOB_FILE_BYTES, "job file")
    job = _READERS[detect_format(path, text)](path, text)
    assert job is not None  # read_ds_config returns the job when it reads the JSON alone
    return job
