"""paraplan as a library: the training search and evaluation behind ``paraplan plan`` and ``paraplan evaluate``.

``plan_request(PlanRequest)`` and ``evaluate_request(PlanRequest)`` are what the commands call; ``paraplan.plan(...)``
and ``paraplan.evaluate(...)`` build the same request from keyword arguments (paraplan/request.py), so a Python
caller gets everything the command does: user hardware and topology files, placement, learned rates, stack
profiles, prices and the whole run. A configuration axis is an int, a name (``recompute="selective"``,
``cp_comm="a2a"``, ``pp_schedule="dualpipev"``), a bool (``sp``, ``tp_overlap``, ``ep_overlap``) or a list of them;
an axis left out is searched. Bad input raises ``paraplan.InputError`` naming the parameter at fault.

    import paraplan
    result = paraplan.plan("llama-3.1-70b", gpu="h100-sxm", gpus=64, seq_len=8192, global_batch=256,
                           precision="fp8", tp=[4, 8])
    best = result.plans[0]
    best.config.tp, best.estimate["step_time_s"], best.estimate["mfu"]
    result.document                        # the schema-checked JSON document of `paraplan plan --json`
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paraplan.cost_models.compute import ComputeRates
from paraplan.cost_models.device_memory import usable_capacity_bytes
from paraplan.errors import InputError
from paraplan.hardware_profiles import Catalog, ClusterSpec
from paraplan.model_specs.model_spec import ModelSpec
from paraplan.planner.job import TrainingJob
from paraplan.planner.placement.refine import (
    MAX_TYPED_PIPELINE_SCAN,
    PlacementReport,
    placement_topology,
    refine,
    typed_pipeline_rows,
)
from paraplan.planner.plan import SCHEMA_VERSION, Plan, plan_at, plan_to_json
from paraplan.planner.run.cost import RunCost, RunOptions, run_cost, run_document
from paraplan.planner.search import SearchResult, explain_no_fit, search
from paraplan.request import (
    FileLayout,
    PlanRequest,
    cost_inputs,
    evaluation_axes,
    make_request,
    resolve_cluster,
    training_job,
    with_price,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """The ranked plans of one search, what the search saw, and the document ``plan --json`` writes."""

    plans: list[Plan]
    """Best first (as the search ranked them), at most ``top``; each has ``config`` and ``estimate`` (SI units)."""
    documents: list[dict[str, Any]]
    """The plans' JSON documents, best first after placement (placement may re-rank and add typed pipelines)."""
    runs: list[RunCost | None]
    """Each plan's whole run (None without a budget)."""
    cost_model: str
    """Which model produced the predictions."""
    considered: int
    """Candidates the search counted, rule-breaking ones included."""
    evaluated: int
    """Candidates that obey every rule (priced)."""
    fitting: int
    """Valid candidates that fit in memory."""
    rejected: dict[str, int]
    """Candidates rejected, per reason."""
    job: TrainingJob
    """The job searched."""
    cluster: ClusterSpec
    """The cluster priced on (its learned collective models attached)."""
    capacity_bytes: float
    """The per-GPU memory plans were checked against (usable HBM less the headroom)."""
    placement: PlacementReport | None
    """What placement found for each refined plan; None without placement."""
    from_job: dict[str, Any] | None
    """``plan --from``: the job file's own layout priced beside the best plan."""
    notes: tuple[str, ...]
    """What the caller should be told (a stack profile measured on another GPU or engine)."""

    @property
    def document(self) -> dict[str, Any]:
        """The JSON document ``paraplan plan --json`` writes (``paraplan export`` reads it)."""
        extra = {"from_job": self.from_job} if self.from_job else {}
        return {"schema_version": SCHEMA_VERSION, "plans": self.documents, **extra}


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """One configuration priced: the plan, its whole run, and the document ``evaluate --json`` writes."""

    plan: Plan
    """The configuration, its estimate and whether it fits."""
    run: RunCost | None
    """Its whole run (None without a budget)."""
    document: dict[str, Any]
    """The JSON document ``paraplan evaluate --json`` writes."""
    cost_model: str
    """Which model produced the prediction."""
    cluster: ClusterSpec
    """The cluster priced on."""
    capacity_bytes: float
    """The per-GPU memory the plan was checked against."""
    notes: tuple[str, ...]
    """What the caller should be told."""


def plan_request(request: PlanRequest) -> PlanResult:
    """Search every parallel layout of the request and return the best ``request.top`` that fit, placed where
    asked (or on a topology file), with their whole runs and the job file's own layout where one was given."""
    cluster, catalog = resolve_cluster(request.cluster)
    cluster = with_price(cluster, request.price_usd_per_gpu_hour)
    job = training_job(request)
    rates, cluster, notes = cost_inputs(request, job, cluster)
    placing = request.place or request.cluster.topology_file is not None
    # Only the rows the answer can show are kept: the top plans, and on a mixed-GPU topology the typed pipelines that
    # placement scans for among the next MAX_TYPED_PIPELINE_SCAN (search prices the rest in freed blocks).
    keep = request.top + (MAX_TYPED_PIPELINE_SCAN if placing else 0)
    result = search(job, cluster, {axis: list(codes) for axis, codes in request.fixed.items()}, request.objective,
                    rates, keep=keep)
    if len(result.ranked) == 0:
        raise InputError(explain_no_fit(result, cluster))
    cost_model = result.estimates.cost_model
    plans = [plan_at(job, cluster, result, int(row), rank) for rank, row in enumerate(result.ranked[:request.top],
                                                                                        start=1)]
    runs = [None if request.run is None else run_cost(p, request.run) for p in plans]
    documents = [plan_to_json(p, cost_model, _run_block(run, request.run)) for p, run in zip(plans, runs)]
    from_job = None if request.compare is None else \
        _file_layout_block(request.compare, job, cluster, rates, plans[0], cost_model)
    placement = _placement(request, result, job, cluster, catalog, documents) if placing else None
    return PlanResult(plans=plans, documents=documents if placement is None else placement.documents, runs=runs,
                      cost_model=cost_model, considered=result.considered, evaluated=result.evaluated,
                      fitting=result.fitting, rejected=dict(result.rejected), job=job, cluster=cluster,
                      capacity_bytes=_capacity_bytes(job, cluster), placement=placement, from_job=from_job,
                      notes=notes)


def evaluate_request(request: PlanRequest) -> Evaluation:
    """Price the one configuration the request fixes (``evaluation_axes``: defaults for the axes left out, dp from
    the GPU count); InputError naming the rule a configuration breaks."""
    cluster, _ = resolve_cluster(request.cluster)
    cluster = with_price(cluster, request.price_usd_per_gpu_hour)
    job = training_job(request)
    fixed = evaluation_axes(request, cluster.num_gpus, cluster.name)
    rates, cluster, notes = cost_inputs(request, job, cluster)
    result = search(job, cluster, fixed, rates=rates)
    if len(result.table) == 0:
        reason = max(result.rejected, key=result.rejected.__getitem__)
        raise InputError(f"{_config_text(fixed)} breaks a rule: {reason}")
    one = plan_at(job, cluster, result, 0, rank=1)
    run = None if request.run is None else run_cost(one, request.run)
    document = {"schema_version": SCHEMA_VERSION,
                "plans": [plan_to_json(one, result.estimates.cost_model, _run_block(run, request.run))]}
    return Evaluation(plan=one, run=run, document=document, cost_model=result.estimates.cost_model, cluster=cluster,
                      capacity_bytes=_capacity_bytes(job, cluster), notes=notes)


def plan(model: str | ModelSpec, *, seq_len: int, global_batch: int, **options: Any) -> PlanResult:
    """Search every parallel layout of ``model`` and return the best ``top`` that fit.

    ``options``: the cluster (``gpu`` + ``gpus`` [+ ``gpus_per_node``], or ``cluster`` [+ ``nodes`` or ``gpus``]: a
    built-in name, a cluster YAML or a topology YAML; ``hardware``: your hardware file), the job (precision, engine,
    attention, fp8_recipe, dispatcher, compiled, async_tp, fused_expert_mlp, expert_imbalance, routing, capacity_factor,
    flops_convention, memory_headroom_frac), axes to fix (``AXES``), ``objective``, ``top``, ``place``, the cost
    model (``cost_model``, ``store``, ``stack_profile``, ``price_per_gpu_hour``) and the whole run (``run``:
    a RunOptions, or ``paraplan.request.run_options(tokens=...)``). See ``paraplan.request.make_request``."""
    return plan_request(make_request(model, seq_len=seq_len, global_batch=global_batch, **options))


def evaluate(model: str | ModelSpec, *, seq_len: int, global_batch: int, tp: int, pp: int,
             **options: Any) -> Plan:
    """Predict one configuration. Axes left out take ``evaluate``'s defaults (dp = GPUs / (tp·pp·cp), cp 1,
    vpp 1, mbs 1, ZeRO 0, no recompute, sp off, 1F1B, no overlaps); a configuration that breaks a rule raises
    InputError naming the rule. The result's ``fits`` says whether it fits in memory; ``evaluate_request`` also
    returns its whole run and document. ``options`` as for ``plan``."""
    request = make_request(model, seq_len=seq_len, global_batch=global_batch, tp=tp, pp=pp, **options)
    return evaluate_request(request).plan


def plan_document(result: PlanResult | Plan, cost_model: str | None = None) -> dict[str, Any]:
    """The JSON document ``paraplan plan --json`` writes (``paraplan export`` reads it), schema-checked."""
    if isinstance(result, PlanResult):
        return result.document
    return {"schema_version": SCHEMA_VERSION, "plans": [plan_to_json(result, cost_model or "analytical")]}


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
def _capacity_bytes(job: TrainingJob, cluster: ClusterSpec) -> float:
    """The per-GPU memory plans are checked against."""
    return float(usable_capacity_bytes(cluster.gpu.hbm_bytes)) * (1.0 - job.memory_headroom_frac)


def _run_block(run: RunCost | None, options: RunOptions | None) -> dict[str, Any] | None:
    """The plan document's ``run`` block (None without a budget)."""
    return None if run is None or options is None else run_document(run, options)


def _config_text(fixed: dict[str, list[int]]) -> str:
    """``tp=8 pp=2 ... recompute=selective sp=on`` of one configuration's codes, for a rule it breaks."""
    from paraplan.choices import CP_COMM_NAMES, PIPELINE_SCHEDULE_NAMES, RECOMPUTE_NAMES, SWITCH_AXES

    names: dict[str, Mapping[int, str]] = {"cp_comm": CP_COMM_NAMES, "recompute": RECOMPUTE_NAMES,
                                           "pp_schedule": PIPELINE_SCHEDULE_NAMES}
    names.update(dict.fromkeys(SWITCH_AXES, {0: "off", 1: "on"}))
    order = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero", "cp_comm", "recompute", "sp", "offload",
             "pp_schedule", "tp_overlap", "ep_overlap")
    return " ".join(f"{axis}={names.get(axis, {}).get(fixed[axis][0], fixed[axis][0])}" for axis in order
                    if axis in fixed)


def _placement(request: PlanRequest, result: SearchResult, job: TrainingJob, cluster: ClusterSpec,
               catalog: Catalog, documents: list[dict[str, Any]]) -> PlacementReport:
    """The top plans placed on the topology (the topology file, else the cluster's uniform one); on a mixed-GPU
    topology, ranked by throughput, the best plans a typed pipeline can run join them."""
    topology = placement_topology(request.cluster.cluster, cluster, catalog)
    typed = typed_pipeline_rows(topology, result, skip=len(documents), limit=request.top) \
        if request.objective == "throughput" else []
    cost_model = result.estimates.cost_model
    extra = [plan_to_json(plan_at(job, cluster, result, row, rank), cost_model) for rank, row in typed]
    return refine(documents + extra, topology, request.objective, keep=request.top)


_COMPARED = ("step_time_s", "tokens_per_s_per_gpu", "mfu", "peak_memory_bytes")


def _file_layout_block(layout: FileLayout, job: TrainingJob, cluster: ClusterSpec, rates: ComputeRates, best: Plan,
                       cost_model: str) -> dict[str, Any]:
    """``plan --from``: the file's own layout, priced like the search's rows, beside the best plan."""
    fixed = {axis: list(codes) for axis, codes in layout.fixed.items()}
    fixed.pop("dp", None)
    shape = fixed["tp"][0] * fixed["pp"][0] * fixed["cp"][0]
    block: dict[str, Any] = {"file": layout.path, "format": layout.format, "sources": dict(layout.sources),
                             "notes": list(layout.notes)}
    if cluster.num_gpus % shape:
        block["error"] = f"tp·pp·cp = {shape} does not divide the {cluster.num_gpus} GPUs"
        return block
    fixed["dp"] = [cluster.num_gpus // shape]
    result = search(job, cluster, fixed, rates=rates)
    if len(result.table) == 0:
        block["error"] = f"the file's layout breaks a rule: {max(result.rejected, key=result.rejected.__getitem__)}"
        return block
    yours = plan_at(job, cluster, result, 0, rank=1)
    block.update(plan=plan_to_json(yours, cost_model), comparison=_comparison(yours, best))
    return block


def _comparison(yours: Plan, best: Plan) -> dict[str, Any]:
    """The file's layout against the best plan, metric by metric (``change_frac``: best over yours, less 1)."""
    rows: dict[str, Any] = {
        key: {"yours": yours.estimate[key], "best": best.estimate[key],
              "change_frac": best.estimate[key] / yours.estimate[key] - 1 if yours.estimate[key] else None}
        for key in _COMPARED}
    rows["fits"] = {"yours": yours.fits, "best": best.fits}
    return {"yours_config": yours.config.as_dict(), "best_config": best.config.as_dict(), "metrics": rows,
            "speedup": yours.estimate["step_time_s"] / best.estimate["step_time_s"]}
