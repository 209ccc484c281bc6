"""What a plan's communication costs on links of a given speed, from the existing cost model.

Placement never re-derives collective times: it asks ``cost_models.estimate`` for the plan's
step-time breakdown on a uniform cluster whose every inter-node link has one bus bandwidth, once per
distinct link speed of the topology, and reads the per-axis exposed communication terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.fp8_recipes import recipe_error
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec, GPUSpec
from paraplan.planner.job import ParallelConfig, TrainingJob, configs_to_table
from paraplan.planner.plan import model_from_shape

AXIS_TERMS = {"tp": "tp_comm_s", "cp": "cp_comm_s", "ep": "ep_comm_s", "dp": "dp_comm_s", "pp": "pp_comm_s"}
"""The estimate's exposed-communication term of each parallel axis."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AxisTimes:
    """One plan priced on one uniform cluster."""

    step_time_s: float
    """Predicted step time, seconds."""
    axis_s: dict[str, float]
    """Exposed communication per step of each axis (keys of AXIS_TERMS), seconds."""


def precision_error(gpu: GPUSpec, precision: str, fp8_recipe: str) -> str | None:
    """Why ``gpu`` cannot run a plan's GEMM ``precision`` (and fp8 recipe), as the search refuses it; None if it can."""
    try:
        gpu.peak(precision)
    except ValueError as exc:
        return f"{exc}; re-plan with another --precision"
    return recipe_error(fp8_recipe, gpu.architecture, gpu.name) if precision == "fp8" else None


def job_of_plan(document: dict[str, Any]) -> tuple[TrainingJob, ParallelConfig]:
    """The TrainingJob and ParallelConfig a schema-valid plan document describes."""
    model = model_from_shape(document["model"]["name"], document["model"].get("shape", {}))
    job, config = document["job"], document["config"]
    try:
        return (TrainingJob(model=model, seq_len=job["seq_len"], global_batch=job["global_batch"],
                            precision=job["precision"], engine=job["engine"], attention=job["attention"],
                            flops_convention=job["flops_convention"], capacity_factor=job.get("capacity_factor"),
                            dispatcher=job.get("dispatcher", "auto"), compiled=bool(job.get("compiled", False)),
                            compiled_loss=bool(job.get("compiled", False)), async_tp=bool(job.get("async_tp", False)),
                            fp8_recipe=job.get("fp8_recipe", "tensorwise")),
                ParallelConfig(**config))
    except (TypeError, ValueError) as exc:
        raise InputError(f"plan cannot be priced: {exc}") from None


def axis_times(job: TrainingJob, config: ParallelConfig, cluster: ClusterSpec) -> AxisTimes:
    """The plan's step time and per-axis exposed communication on ``cluster``."""
    est = estimate(job.model, cluster, job.workload(), configs_to_table([config]))
    return AxisTimes(step_time_s=float(est.step_time_s[0]),
                     axis_s={axis: float(getattr(est, term)[0]) for axis, term in AXIS_TERMS.items()})
