"""Which files each export format writes, and building them from a plan.

``megatron``, ``deepspeed`` and ``torchtitan`` must match the plan's engine (a plan's predictions
and rules belong to one engine); ``slurm`` and ``k8s`` launch that engine; ``json`` writes the plan
with its rank and expert maps; ``all`` is json + the engine's files + slurm + k8s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from paraplan.choices import ENGINES
from paraplan.errors import InputError
from paraplan.exporters.deepspeed import DS_CONFIG, HOSTFILE, deepspeed_launcher_script, deepspeed_program, hostfile
from paraplan.exporters.defaults import DEFAULT_IMAGE, FORMATS
from paraplan.exporters.json_files import expert_map_file, plan_file, rank_map_file
from paraplan.exporters.launchers import plan_header, pytorchjob, slurm_script, torchrun_script
from paraplan.exporters.megatron import megatron_program
from paraplan.exporters.plan_input import ExportPlan
from paraplan.exporters.program import OutputFile, Program, already_built
from paraplan.exporters.torchtitan import TOML_NAME, TORCHTITAN_VERSIONS, parse_torchtitan_version, torchtitan_program

_JOB_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a Kubernetes DNS-1123 label


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportOptions:
    """Choices an export needs beyond the plan."""

    torchtitan_version: str = "0.3"
    """torchtitan release line to target: 0.3 (CLI overrides) or 0.2 (TOML)."""
    torchtitan_model: str | None = None
    """torchtitan model: MODULE:CONFIG (0.3) or NAME:FLAVOR (0.2); default from the model preset."""
    job_name: str | None = None
    """SLURM job and PyTorchJob name; default from the model name."""
    image: str = DEFAULT_IMAGE
    """Container image of the PyTorchJob."""


def output_names(fmt: str, engine: str, options: ExportOptions) -> list[str]:
    """The files ``fmt`` writes for a plan of ``engine`` (InputError for an unknown or mismatched format)."""
    if fmt not in FORMATS:
        raise InputError(f"--format expects one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt in ENGINES and fmt != engine:
        raise InputError(f"--format {fmt} needs a plan made for {fmt}; this plan is for {engine} (re-plan with "
                         f"--engine {fmt}, or export --format {engine})")
    if options.torchtitan_version not in TORCHTITAN_VERSIONS:
        raise InputError(f"--torchtitan-version expects {' or '.join(TORCHTITAN_VERSIONS)}, "
                         f"got {options.torchtitan_version!r}")
    configs = {"megatron": [], "deepspeed": [DS_CONFIG],
               "torchtitan": [TOML_NAME] if options.torchtitan_version == "0.2" else []}[engine]
    per_format = {"json": ["plan.json", "rank_map.json", "expert_map.json"],
                  "megatron": ["megatron_launch.sh"], "torchtitan": ["torchtitan_launch.sh", *configs],
                  "deepspeed": [*configs, HOSTFILE, "deepspeed_launch.sh"],
                  "slurm": ["slurm.sbatch", *configs], "k8s": ["pytorchjob.yaml"]}
    chosen = ["json", engine, "slurm", "k8s"] if fmt == "all" else [fmt]
    return list(dict.fromkeys(name for part in chosen for name in per_format[part]))


def job_name_for(plan: ExportPlan, options: ExportOptions) -> str:
    """The given job name (checked), or one derived from the model name."""
    if options.job_name is not None:
        if not _JOB_NAME.fullmatch(options.job_name):
            raise InputError(f"--job-name must be lowercase letters, digits and '-', at most 63 characters, "
                             f"starting and ending alphanumeric (a Kubernetes name), got {options.job_name!r}")
        return options.job_name
    stem = re.sub(r"[^a-z0-9]+", "-", plan.model.name.rsplit("/", 1)[-1].lower()).strip("-")[:50] or "model"
    return f"{stem}-paraplan"


def engine_program(plan: ExportPlan, options: ExportOptions) -> Program:
    """The plan's training program for its own engine."""
    if plan.engine == "megatron":
        return megatron_program(plan)
    if plan.engine == "deepspeed":
        return deepspeed_program(plan)
    return torchtitan_program(plan, parse_torchtitan_version(options.torchtitan_version), options.torchtitan_model)


def export_files(plan: ExportPlan, fmt: str, options: ExportOptions) -> list[OutputFile]:
    """Every file of ``fmt`` for ``plan``, in output_names order."""
    names = output_names(fmt, plan.engine, options)
    program = engine_program(plan, options)
    job_name = job_name_for(plan, options)
    builders: dict[str, Callable[[], OutputFile]] = {
        "plan.json": lambda: plan_file(plan), "rank_map.json": lambda: rank_map_file(plan),
        "expert_map.json": lambda: expert_map_file(plan),
        "slurm.sbatch": lambda: slurm_script(plan, program, job_name),
        "pytorchjob.yaml": lambda: pytorchjob(plan, program, job_name, options.image),
        **{f.name: already_built(f) for f in program.config_files},
    }
    if plan.engine == "deepspeed":
        builders[HOSTFILE] = lambda: hostfile(plan)
        builders["deepspeed_launch.sh"] = lambda: deepspeed_launcher_script(plan, program, plan_header(plan))
    else:
        script = f"{plan.engine}_launch.sh"
        builders[script] = lambda: torchrun_script(plan, program, script)
    return [builders[name]() for name in names]
