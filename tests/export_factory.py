"""Plan documents for exporter tests, built directly (MoE and MLA models included, which the search
does not plan yet), plus helpers shared by the engine tests."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from paraplan.exporters.formats import ExportOptions, export_files
from paraplan.exporters.plan_input import ExportPlan, plan_from_document
from paraplan.exporters.program import OutputFile
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.engines import engine_rules
from paraplan.planner.json_schema import validate_instance
from paraplan.planner.layout import stage_layers
from paraplan.planner.plan import SCHEMA_VERSION, model_shape, plan_schema

CONFIG_DEFAULTS: dict[str, Any] = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "mbs": 1,
                                   "zero": 0, "recompute": "none", "sp": False, "offload": 0}
ATTENTION = {"megatron": "fused", "deepspeed": "flash", "torchtitan": "flash"}


def make_plan_document(model: str = "llama-3.1-8b", *, engine: str = "megatron", gpus_per_node: int = 8,
                       seq_len: int = 4096, global_batch: int = 64, precision: str = "bf16", rank: int = 1,
                       shape: dict[str, Any] | None = None, capacity_factor: float | None = None,
                       split: list[int] | None = None, dispatcher: str | None = None,
                       compiled: bool | None = None, async_tp: bool | None = None,
                       fused_expert_mlp: bool | None = None, **config: Any) -> dict[str, Any]:
    """One schema-valid plan; the world size is tp·pp·dp·cp of ``config``; ``shape`` overrides model fields;
    ``split`` replaces the engine's layers per stage (as a stage partition or a typed pipeline writes them)."""
    spec = load_model(model)
    if shape:
        spec = dataclasses.replace(spec, **shape)
    merged = {**CONFIG_DEFAULTS, **config}
    num_gpus = merged["tp"] * merged["pp"] * merged["dp"] * merged["cp"]
    microbatches = global_batch // (merged["mbs"] * merged["dp"])
    document = {
        "schema_version": SCHEMA_VERSION, "rank": rank,
        "model": {"name": spec.name, "params": spec.total_params(), "shape": model_shape(spec)},
        "cluster": {"name": f"test-{num_gpus}", "gpu": "h100-sxm", "num_gpus": num_gpus,
                    "gpus_per_node": gpus_per_node, "nvlink_domain_gpus": gpus_per_node},
        "job": {"seq_len": seq_len, "global_batch": global_batch, "precision": precision, "engine": engine,
                "attention": ATTENTION[engine], "flops_convention": "full",
                **({"capacity_factor": capacity_factor} if capacity_factor is not None else {}),
                **({"dispatcher": dispatcher} if dispatcher is not None else {}),
                **({"compiled": compiled} if compiled is not None else {}),
                **({"async_tp": async_tp} if async_tp is not None else {}),
                **({"fused_expert_mlp": fused_expert_mlp} if fused_expert_mlp is not None else {})},
        "config": merged,
        "estimate": {"step_time_s": 1.5, "tokens_per_s": 1e5, "tokens_per_s_per_gpu": 1e5 / num_gpus, "mfu": 0.4,
                     "hfu": 0.45, "model_tflops_per_gpu": 400.0, "num_microbatches": max(microbatches, 1),
                     "peak_memory_bytes": 60e9, "peak_memory_stage": "first", "host_memory_bytes": 0.0,
                     "step_time_breakdown_s": {"compute_s": 1.2}, "memory_breakdown_bytes": {"weights_bytes": 1e10}},
        "fits": True,
        "placement": {"rank_order": "tp-cp-dp-pp", "rank_map": None,
                      "stage_layers": split or stage_layers(spec.num_layers, merged["pp"], merged["vpp"],
                                                            engine_rules(engine).pipeline_split)},
        "provenance": {"paraplan_version": "0.1.0", "cost_model": "test", "calibration": "test"},
    }
    validate_instance(document, plan_schema())
    return document


def make_export_plan(model: str = "llama-3.1-8b", **kwargs: Any) -> ExportPlan:
    """make_plan_document read back as the exporters read a file."""
    return plan_from_document(make_plan_document(model, **kwargs))


def files_of(plan: ExportPlan, fmt: str, **options: Any) -> dict[str, OutputFile]:
    """The export's files by name."""
    return {f.name: f for f in export_files(plan, fmt, ExportOptions(**options))}


def write_plan_file(path: Path, *documents: dict[str, Any]) -> Path:
    """A plan file as 'paraplan plan --json' writes it."""
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "plans": list(documents)}))
    return path


def engine_module(name: str, install: str = "pip install torch==2.13.0, then '.[validate]'") -> ModuleType:
    """Import an engine package; skip without it, fail instead when PARAPLAN_REQUIRE_ENGINES=1 (CI)."""
    if os.environ.get("PARAPLAN_REQUIRE_ENGINES") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=f"{name} is not installed ({install})")


def serving_engine_module(name: str) -> ModuleType:
    """engine_module for vLLM, SGLang and sglang-router, looked up first in the folder PARAPLAN_SERVING_ENGINES
    names: their wheels pull CUDA builds of torch, so .ci/run installs them (and the few imports their parsers
    need) with ``pip install --no-deps --target DIR`` rather than into the environment."""
    target = os.environ.get("PARAPLAN_SERVING_ENGINES")
    if target and target not in sys.path:
        sys.path.insert(0, target)
    return engine_module(name, "set PARAPLAN_SERVING_ENGINES to a 'pip install --no-deps --target DIR' folder "
                               "of the vLLM/SGLang pins in .ci/run")


def argv_shim(bin_dir: Path, command: str, log: Path) -> None:
    """A fake ``command`` on PATH that records its argv (one argument per line, NUL-separated) and exits 0."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / command
    shim.write_text(f"#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" > {shlex.quote(str(log))}\n")
    shim.chmod(0o755)


def captured_argv(script: Path, command: str, tmp_path: Path, env: dict[str, str] | None = None,
                  args: tuple[str, ...] = ()) -> list[str]:
    """Run ``script`` with ``command`` replaced by an argv-recording shim; the argv it was given."""
    bin_dir, log = tmp_path / "shim-bin", tmp_path / f"{command}.argv"
    argv_shim(bin_dir, command, log)
    full_env = {**os.environ, **(env or {}), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(script), *args], env=full_env, check=True, capture_output=True, text=True)
    return log.read_text().split("\0")[:-1]
