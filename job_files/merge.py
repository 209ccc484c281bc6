"""An ImportedJob as the values of ``plan`` / ``evaluate``'s options, and the checks before a prediction.

Values are keyed by the commands' parameter names (``seq_len``, ``gpus_per_node``, ``tp`` ...) and typed as
their options are: configuration axes as the text a flag takes (``"8"``, ``"full"``, ``"on"``), so a value from
a file goes through the same parsing and rules as one typed on the command line.
"""

from __future__ import annotations

from typing import Any

from paraplan.errors import InputError
from paraplan.job_files.imported import DEFAULT, ImportedJob

_AXES = {"tp": "tp", "pp": "pp", "cp": "cp", "cp_comm": "cp_comm", "ep": "ep", "etp": "etp", "vpp": "vpp",
         "mbs": "mbs", "zero": "zero", "recompute": "recompute", "sp": "sp", "offload": "offload",
         "pp_schedule": "pp_schedule", "tp_overlap": "tp_comm_overlap"}
"""ImportedJob layout key -> the commands' parameter name."""
_JOB = {"attention": "attention", "dispatcher": "dispatcher", "capacity_factor": "capacity_factor",
        "compiled": "compile_model", "async_tp": "async_tp", "fused_expert_mlp": "fused_expert_mlp"}
_FLAGS = {"model": "MODEL (a preset or a config.json)", "gpu": "--gpu NAME (e.g. --gpu h100-sxm; see 'paraplan "
          "hardware list') or --cluster NAME", "num_gpus": "--gpus N", "seq_len": "--seq-len N",
          "global_batch": "--global-batch N"}


def option_values(job: ImportedJob) -> dict[str, tuple[Any, str]]:
    """Parameter name -> (value, where it came from) for everything ``job`` states."""
    out: dict[str, tuple[Any, str]] = {}
    src = job.sources

    def put(name: str, value: Any, key: str) -> None:
        if value is not None:
            out[name] = (value, src.get(key, job.path))

    put("model", job.model if job.model is not None else job.model_spec,
        "model" if job.model is not None else "model_spec")
    put("seq_len", job.seq_len, "seq_len")
    put("global_batch", job.global_batch, "global_batch")
    put("gpu", job.gpu, "gpu")
    put("gpus", job.num_gpus, "num_gpus")
    put("gpus_per_node", job.gpus_per_node, "gpus_per_node")
    put("nodes", job.num_nodes, "num_nodes")
    out["engine"] = (job.engine, f"{job.path} ({job.format})")
    put("precision", job.precision, "precision")
    put("fp8_recipe", job.fp8_recipe if job.precision == "fp8" else None, "fp8_recipe")
    for key, name in _JOB.items():
        put(name, job.job.get(key), key)
    for key, name in _AXES.items():
        if key in job.layout:
            put(name, axis_text(job.layout[key]), key)
    if "dp" in job.layout and not _derived(src.get("dp", DEFAULT)):
        put("dp", str(job.layout["dp"]), "dp")
    return out


def _derived(source: str) -> bool:
    return source == DEFAULT or source.startswith("world size")


def axis_text(value: Any) -> str:
    """A layout value as its flag takes it: True -> "on", 8 -> "8"."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def fill_global_batch(job: ImportedJob, values: dict[str, Any]) -> None:
    """Global batch = local batch x data-parallel, for a file that leaves it to the world size (now known)."""
    if values.get("global_batch") is not None or job.local_batch is None or values.get("gpus") is None:
        return
    shape = 1
    for axis in ("tp", "pp", "cp"):
        given = values.get(axis) or str(job.layout.get(axis, 1))
        shape *= int(given) if str(given).isdigit() else 1
    if values["gpus"] % shape == 0:
        values["global_batch"] = job.local_batch * values["gpus"] // shape


def missing_flag(job: ImportedJob, values: dict[str, Any]) -> None:
    """InputError naming the first required value neither the file nor the command line gives."""
    needs = {"model": values.get("model") is None, "gpu": values.get("gpu") is None and values.get("cluster") is None,
             "num_gpus": values.get("gpus") is None and values.get("cluster") is None,
             "seq_len": values.get("seq_len") is None, "global_batch": values.get("global_batch") is None}
    for key, missing in needs.items():
        if missing and key == "model" and job.model_problem:
            raise InputError(job.model_problem)
        if missing:
            what = {"model": "no model shape or name", "gpu": "no GPU type", "num_gpus": "no world size",
                    "seq_len": "no sequence length", "global_batch": "no global batch"}[key]
            raise InputError(f"{job.path} ({job.format}) states {what}; add {_FLAGS[key]}")


def api_arguments(job: ImportedJob, overrides: dict[str, Any], layout: bool) -> dict[str, Any]:
    """Keyword arguments of ``paraplan.evaluate`` (``layout``) or ``paraplan.plan`` for ``job``, under
    ``overrides`` (the API's own names: model, gpu, gpus, seq_len, tp, recompute ...)."""
    args: dict[str, Any] = {"model": job.model if job.model is not None else job.model_spec, "seq_len": job.seq_len,
                            "global_batch": job.global_batch, "gpu": job.gpu, "gpus": job.num_gpus,
                            "gpus_per_node": job.gpus_per_node, "engine": job.engine, "precision": job.precision,
                            "fp8_recipe": job.fp8_recipe if job.precision == "fp8" else None, **dict(job.job)}
    if layout:
        args.update({k: v for k, v in job.layout.items() if k != "dp" or not _derived(job.sources.get("dp", DEFAULT))})
    if "cluster" in overrides:
        args = {k: v for k, v in args.items() if k not in ("gpu", "gpus", "gpus_per_node")}
    if overrides.keys() & {"cluster", "gpus", "nodes"}:
        args.pop("dp", None)
    if "precision" in overrides and overrides["precision"] != "fp8":
        args.pop("fp8_recipe", None)
    args = {k: v for k, v in args.items() if v is not None} | overrides
    if args.get("global_batch") is None and job.local_batch is not None and args.get("gpus"):
        shape = args.get("tp", 1) * args.get("pp", 1) * args.get("cp", 1)
        args["global_batch"] = job.local_batch * args["gpus"] // shape
    names = {"model": "model='llama-3.1-8b' (a preset or a config.json)", "gpu": "gpu='h100-sxm' (or cluster=...)",
             "gpus": "gpus=N", "seq_len": "seq_len=N", "global_batch": "global_batch=N"}
    for key, name in names.items():
        if args.get(key) is None and not (key in ("gpu", "gpus") and "cluster" in args):
            raise InputError(job.model_problem if key == "model" and job.model_problem else
                             f"{job.path} ({job.format}) does not give {key}; pass {name}")
    return args
