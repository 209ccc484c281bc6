"""paraplan as a library: ``paraplan.plan(...)`` and ``paraplan.evaluate(...)`` return typed results.

The same search, cost model and plan documents as the ``plan`` and ``evaluate`` commands: a configuration axis is
an int, a name (``recompute="selective"``, ``cp_comm="a2a"``, ``pp_schedule="dualpipev"``), a bool (``sp``,
``tp_overlap``, ``ep_overlap``) or a list of them; an axis left out is searched. Bad input raises
``paraplan.InputError`` with the same one-line message the CLI prints.

    import paraplan
    result = paraplan.plan("llama-3.1-70b", gpu="h100-sxm", gpus=64, seq_len=8192, global_batch=256,
                           precision="fp8", tp=[4, 8])
    best = result.plans[0]
    best.config.tp, best.estimate["step_time_s"], best.estimate["mfu"]
    paraplan.plan_document(result)        # the schema-checked JSON document of `paraplan plan --json`
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paraplan.choices import CP_COMM_CODES, PIPELINE_SCHEDULE_CODES, RECOMPUTE_CODES
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec, cluster_from_file, load_cluster, quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.model_specs.model_spec import ModelSpec
from paraplan.planner.job import TrainingJob
from paraplan.planner.plan import SCHEMA_VERSION, Plan, plan_at, plan_to_json
from paraplan.planner.search import OBJECTIVES, explain_no_fit, search
from paraplan.planner.space import AXES

NAMED_AXES = {"recompute": RECOMPUTE_CODES, "cp_comm": CP_COMM_CODES, "pp_schedule": PIPELINE_SCHEDULE_CODES}
SWITCH_AXES = ("sp", "tp_overlap", "ep_overlap")


@dataclass(frozen=True, slots=True)
class PlanResult:
    """The ranked plans of one search and what the search saw."""

    plans: list[Plan]
    """Best first, at most ``top`` of them; each has ``config`` (ParallelConfig) and ``estimate`` (SI units)."""
    cost_model: str
    """Which model produced the predictions."""
    considered: int
    """Candidates the search counted, rule-breaking ones included."""
    fitting: int
    """Valid candidates that fit in memory."""
    rejected: dict[str, int]
    """Candidates rejected, per reason."""


def plan(model: str | ModelSpec, *, seq_len: int, global_batch: int, gpu: str | None = None, gpus: int | None = None,
         cluster: str | None = None, nodes: int | None = None, gpus_per_node: int = 8, precision: str = "bf16",
         engine: str = "megatron", objective: str = "throughput", top: int = 5, **job_and_axes: Any) -> PlanResult:
    """Search every parallel layout of ``model`` on the cluster and return the best ``top`` that fit.

    ``job_and_axes``: TrainingJob fields (attention, fp8_recipe, dispatcher, compiled, async_tp,
    expert_imbalance, capacity_factor, flops_convention, memory_headroom_frac) and configuration axes
    (``AXES``) to fix."""
    if not isinstance(top, int) or top < 1:
        raise InputError(f"top must be a positive integer, got {top!r}")
    if objective not in OBJECTIVES:
        raise InputError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    job, spec, fixed = _job_cluster_axes(model, seq_len, global_batch, gpu, gpus, cluster, nodes, gpus_per_node,
                                         precision, engine, job_and_axes)
    result = search(job, spec, fixed, objective)
    if len(result.ranked) == 0:
        raise InputError(explain_no_fit(result, spec))
    plans = [plan_at(job, spec, result, int(row), rank) for rank, row in enumerate(result.ranked[:top], start=1)]
    return PlanResult(plans=plans, cost_model=result.estimates.cost_model, considered=result.considered,
                      fitting=len(result.ranked), rejected=dict(result.rejected))


def evaluate(model: str | ModelSpec, *, seq_len: int, global_batch: int, tp: int, pp: int,
             gpu: str | None = None, gpus: int | None = None, cluster: str | None = None, nodes: int | None = None,
             gpus_per_node: int = 8, precision: str = "bf16", engine: str = "megatron",
             **job_and_axes: Any) -> Plan:
    """Predict one configuration. Axes left out take ``evaluate``'s defaults (dp = GPUs / (tp·pp·cp), cp 1,
    vpp 1, mbs 1, ZeRO 0, no recompute, sp off, 1F1B, no overlaps); a configuration that breaks a rule raises
    InputError naming the rule. The result's ``fits`` says whether it fits in memory."""
    defaults = {"cp": 1, "cp_comm": "p2p", "ep": 1, "etp": 1, "vpp": 1, "mbs": 1, "zero": 0, "recompute": "none",
                "sp": False, "offload": 0, "pp_schedule": "1f1b", "tp_overlap": False, "ep_overlap": False}
    given = {**defaults, **job_and_axes, "tp": tp, "pp": pp}
    several = [axis for axis in AXES if isinstance(given.get(axis), (list, tuple, set))]
    if several:
        raise InputError(f"evaluate takes one value per axis; {several[0]} has several (use paraplan.plan)")
    job, spec, fixed = _job_cluster_axes(model, seq_len, global_batch, gpu, gpus, cluster, nodes, gpus_per_node,
                                         precision, engine, given)
    if "dp" not in fixed:
        shape = fixed["tp"][0] * fixed["pp"][0] * fixed["cp"][0]
        if spec.num_gpus % shape:
            raise InputError(f"tp·pp·cp = {shape} does not divide the {spec.num_gpus} GPUs of {spec.name}")
        fixed["dp"] = [spec.num_gpus // shape]
    result = search(job, spec, fixed, "throughput")
    if len(result.table) == 0:
        raise InputError(f"the configuration breaks a rule: {max(result.rejected, key=result.rejected.get)}")
    return plan_at(job, spec, result, 0, rank=1)


def plan_document(result: PlanResult | Plan, cost_model: str | None = None) -> dict[str, Any]:
    """The JSON document ``paraplan plan --json`` writes (``paraplan export`` reads it), schema-checked."""
    plans = result.plans if isinstance(result, PlanResult) else [result]
    model = cost_model or (result.cost_model if isinstance(result, PlanResult) else "analytical")
    return {"schema_version": SCHEMA_VERSION, "plans": [plan_to_json(p, model) for p in plans]}


def evaluate_file(path: str | Path, **overrides: Any) -> Plan:
    """Predict the job a launch script, log or engine config describes (``paraplan evaluate --from``): the
    file's model, cluster, batch, precision and layout, under ``overrides`` (evaluate's keyword arguments)."""
    from paraplan.job_files import merge, read_job_file
    return evaluate(**merge.api_arguments(read_job_file(Path(path)), overrides, layout=True))


def plan_file(path: str | Path, **overrides: Any) -> PlanResult:
    """Search every layout for the job a file describes (``paraplan plan --from``): its model, cluster, batch
    and precision, under ``overrides`` (plan's keyword arguments); ``evaluate_file`` prices its own layout."""
    from paraplan.job_files import merge, read_job_file
    return plan(**merge.api_arguments(read_job_file(Path(path)), overrides, layout=False))


# -- helpers --------------------------------------------------------------------------------------------------
def _job_cluster_axes(model, seq_len, global_batch, gpu, gpus, cluster, nodes, gpus_per_node, precision, engine,
                      job_and_axes: dict[str, Any]) -> tuple[TrainingJob, ClusterSpec, dict[str, list[int]]]:
    axes = {k: v for k, v in job_and_axes.items() if k in AXES}
    job_fields = {k: v for k, v in job_and_axes.items() if k not in AXES}
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    try:
        job = TrainingJob(model=spec, seq_len=seq_len, global_batch=global_batch, precision=precision, engine=engine,
                          **job_fields)
    except TypeError as exc:
        raise InputError(f"unknown job field: {exc}") from None
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return job, _cluster(cluster, nodes, gpu, gpus, gpus_per_node), {a: _codes(a, v) for a, v in axes.items()}


def _cluster(cluster: str | None, nodes: int | None, gpu: str | None, gpus: int | None,
             gpus_per_node: int) -> ClusterSpec:
    if (cluster is None) == (gpu is None):
        raise InputError("give either cluster=NAME|FILE (with nodes= or gpus=) or gpu=NAME with gpus=N")
    if gpu is not None:
        if gpus is None or nodes is not None:
            raise InputError("gpu= needs gpus= (total GPUs) and takes no nodes=")
        return quick_cluster(gpu, gpus, gpus_per_node)
    path = Path(cluster)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return cluster_from_file(path, num_nodes=nodes, num_gpus=gpus)
    return load_cluster(cluster, num_nodes=nodes, num_gpus=gpus)


def _codes(axis: str, value: Any) -> list[int]:
    values = list(value) if isinstance(value, Iterable) and not isinstance(value, str) else [value]
    if not values:
        raise InputError(f"{axis} needs at least one value")
    out = []
    for item in values:
        if axis in NAMED_AXES:
            names = NAMED_AXES[axis]
            if item not in names:
                raise InputError(f"{axis} must be one of {', '.join(names)}, got {item!r}")
            out.append(names[item])
        elif axis in SWITCH_AXES:
            if not isinstance(item, bool):
                raise InputError(f"{axis} takes True or False, got {item!r}")
            out.append(int(item))
        else:
            if isinstance(item, bool) or not isinstance(item, int) or item < (0 if axis in ("zero", "offload") else 1):
                raise InputError(f"{axis} takes {'non-negative' if axis in ('zero', 'offload') else 'positive'} "
                                 f"integers, got {item!r}")
            out.append(item)
    return sorted(set(out))
