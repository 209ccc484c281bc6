"""One typed request for a training search or evaluation, and the one place it becomes a job, a cluster and axes.

``paraplan plan`` / ``evaluate`` parse their flags into a :class:`PlanRequest`; ``paraplan.plan(...)`` /
``evaluate(...)`` build the same request from keyword arguments (``make_request``). Everything below it, the job,
the cluster (catalog, user hardware file, topology file), the cost-model inputs (learned rates, stack profile,
price) and the whole-run options, is resolved here once, so the command and the library answer alike. Errors
name the parameter at fault (:class:`~paraplan.errors.ParameterError`): the command line spells it as its flag.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from paraplan.choices import (
    NAMED_AXES,
    OBJECTIVES,
    SWITCH_AXES,
    Engine,
    Objective,
    Precision,
)
from paraplan.cost_models.compute import ComputeRates
from paraplan.errors import InputError, ParameterError
from paraplan.hardware_profiles import Catalog, ClusterSpec, cluster_from_file, load_cluster, quick_cluster
from paraplan.hardware_profiles.run_factor import gpu_at_scale
from paraplan.hardware_profiles.topology_file import is_topology_file
from paraplan.hardware_profiles.units import BYTES_PER_GB, SECONDS_PER_HOUR
from paraplan.model_specs.model_spec import AttentionFlops, ModelSpec
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.run import failures as fl
from paraplan.planner.run.cost import RunOptions
from paraplan.planner.space import AXES

EVALUATE_DEFAULTS: dict[str, Any] = {
    "cp": 1, "cp_comm": "p2p", "ep": 1, "etp": 1, "vpp": 1, "mbs": 1, "zero": 0, "recompute": "none", "sp": False,
    "offload": 0, "pp_schedule": "1f1b", "tp_overlap": False, "ep_overlap": False}
"""What ``evaluate`` prices for an axis left out (dp follows from the GPU count; cp_comm is the engine's default, an
engine that shards over the context-parallel ranks takes ZeRO 3 when cp > 1, and one that always runs sequence
parallelism with TP takes it when tp > 1)."""
DEFAULT_GPUS_PER_NODE = 8
"""Node size of a quick cluster (``--gpu NAME --gpus N``): an HGX/DGX board."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSource:
    """Where the cluster comes from: a built-in cluster, a cluster or topology file, or N GPUs of one type."""

    cluster: str | None = None
    """Built-in cluster name, cluster YAML or topology YAML (``node_groups``: placement then runs on it)."""
    nodes: int | None = None
    """Nodes of ``cluster`` (a built-in cluster or cluster file)."""
    gpu: str | None = None
    """GPU name of a quick cluster (with ``gpus``)."""
    gpus: int | None = None
    """Total GPUs: of the quick cluster, or to size ``cluster``."""
    gpus_per_node: int | None = None
    """GPUs per node of the quick cluster (default 8)."""
    hardware: Path | None = None
    """The user's hardware file beside the built-in catalog (default ``$PARAPLAN_HARDWARE``)."""

    @property
    def topology_file(self) -> Path | None:
        """The topology file the cluster comes from, if it comes from one."""
        return Path(self.cluster) if self.cluster is not None and is_topology_file(Path(self.cluster)) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class FileLayout:
    """``plan --from``: the layout a user's job file runs, priced beside the search's best plan."""

    path: str
    """The job file."""
    format: str
    """Its format (job_files' FORMATS)."""
    sources: Mapping[str, str]
    """Where in the file each value was read (``file:line``)."""
    notes: tuple[str, ...]
    """What the reader noticed about the file."""
    fixed: Mapping[str, tuple[int, ...]]
    """The layout's axes, one code each (dp follows from the GPU count)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRequest:
    """Everything a training search (or an evaluation of one layout) takes."""

    model: str | ModelSpec
    """A preset name, a config.json path, or a ModelSpec (read from a job file)."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    cluster: ClusterSource
    """Where the cluster comes from."""
    precision: Precision = "bf16"
    """GEMM precision."""
    engine: Engine = "megatron"
    """The training engine whose rules, recipes and launch files apply."""
    attention: str = "auto"
    """Attention kernel: auto (the engine's default), fused, flash or unfused."""
    flops_convention: AttentionFlops = "full"
    """Attention FLOPs counted in MFU."""
    memory_headroom_frac: float = 0.0
    """Fraction of HBM to keep free, 0-1."""
    expert_imbalance: float | None = None
    """MoE: busiest EP rank's tokens over the mean; None: a balanced router's sampling noise."""
    routing: Path | None = None
    """MoE: a routing statistics CSV that sets the imbalance per ep."""
    capacity_factor: float | None = None
    """MoE token dropping: expert capacity over the balanced share; None: dropless."""
    dispatcher: str = "auto"
    """MoE token dispatcher: auto, alltoall or deepep."""
    compiled: bool = False
    """torchtitan under torch.compile (its loss too)."""
    async_tp: bool = False
    """torchtitan with compile: async tensor parallelism."""
    fused_expert_mlp: bool = False
    """MoE: the routed experts' MLP runs fused (Transformer Engine's op fuser; TrainingJob.fused_expert_mlp)."""
    fp8_recipe: str = "tensorwise"
    """How fp8 GEMM inputs are scaled."""
    fixed: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Axes constrained to these codes (an axis left out is searched)."""
    objective: Objective = "throughput"
    """What the search ranks by."""
    top: int = 5
    """How many plans to return."""
    place: bool = False
    """Refine the top plans by placement (always on a topology file)."""
    run: RunOptions | None = None
    """The whole run (budget, failures, checkpoints); None: step-level answers only."""
    price_usd_per_gpu_hour: float | None = None
    """The user's GPU price; None: the catalog's."""
    cost_model: str = "auto"
    """analytical, learned, or auto (learned where the store holds a model for the GPU)."""
    store: Path | None = None
    """The profile store learned models come from; None: the default store."""
    stack_profile: str | None = None
    """A stack profile (name or .json) whose step-time factor applies."""
    compare: FileLayout | None = None
    """``plan --from``: the job file's own layout, priced beside the best plan."""


# -- the request from keyword arguments (paraplan.plan / evaluate) ----------------------------------------------
def make_request(model: str | ModelSpec, *, seq_len: int, global_batch: int, gpu: str | None = None,
                 gpus: int | None = None, gpus_per_node: int | None = None, cluster: str | None = None,
                 nodes: int | None = None, hardware: str | Path | None = None, objective: str = "throughput",
                 top: int = 5, place: bool = False, cost_model: str = "auto", store: str | Path | None = None,
                 stack_profile: str | None = None, price_per_gpu_hour: float | None = None,
                 run: RunOptions | None = None, routing: str | Path | None = None,
                 compare: FileLayout | None = None, **job_and_axes: Any) -> PlanRequest:
    """The request ``paraplan.plan(...)`` and the ``plan`` command both build. ``job_and_axes``: TrainingJob
    options (precision, engine, attention, flops_convention, memory_headroom_frac, expert_imbalance,
    capacity_factor, dispatcher, compiled, async_tp, fp8_recipe, fused_expert_mlp) and axes to fix (an int, a name,
    a bool or a list of them; ``AXES``)."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ParameterError("{top} expects a positive integer, got {value}", value=top)
    if objective not in OBJECTIVES:
        raise ParameterError("{objective} expects " + ", ".join(OBJECTIVES) + ", got {value!r}", value=objective)
    _check_price(price_per_gpu_hour)
    axes = {axis: value for axis, value in job_and_axes.items() if axis in AXES}
    options = {name: value for name, value in job_and_axes.items() if name not in AXES}
    unknown = sorted(set(options) - set(_JOB_OPTIONS))
    if unknown:
        raise InputError(f"unknown job field {unknown[0]!r}: choose from {', '.join(_JOB_OPTIONS)} or an axis "
                         f"({', '.join(AXES)})")
    engine_rules(options.get("engine", "megatron"))  # an unknown engine is refused before anything is written
    return PlanRequest(
        model=model, seq_len=seq_len, global_batch=global_batch, objective=objective, top=top, place=place,
        cluster=ClusterSource(cluster=cluster, nodes=nodes, gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node,
                              hardware=None if hardware is None else Path(hardware)),
        cost_model=cost_model, store=None if store is None else Path(store), stack_profile=stack_profile,
        price_usd_per_gpu_hour=price_per_gpu_hour, run=_priced(run, price_per_gpu_hour),
        routing=None if routing is None else Path(routing), compare=compare,
        fixed={axis: axis_codes(axis, value) for axis, value in axes.items()}, **options)


_JOB_OPTIONS = ("precision", "engine", "attention", "flops_convention", "memory_headroom_frac", "expert_imbalance",
                "capacity_factor", "dispatcher", "compiled", "async_tp", "fp8_recipe", "fused_expert_mlp")


def _priced(run: RunOptions | None, price: float | None) -> RunOptions | None:
    """The run priced at the user's price where one was given and the run states none."""
    if run is None or price is None or run.price_usd_per_gpu_hour is not None:
        return run
    return dataclasses.replace(run, price_usd_per_gpu_hour=price)


def axis_codes(axis: str, value: Any) -> tuple[int, ...]:
    """One axis's allowed values as the table's sorted codes: ints as they are, names by their code, switches
    as 0/1; ParameterError naming the axis for anything else."""
    values = list(value) if isinstance(value, Iterable) and not isinstance(value, str) else [value]
    if not values:
        raise ParameterError("{" + axis + "} needs at least one value")
    return tuple(sorted({_axis_code(axis, item) for item in values}))


def _axis_code(axis: str, item: Any) -> int:
    if axis in NAMED_AXES:
        names = NAMED_AXES[axis]
        if item not in names:
            raise ParameterError("{" + axis + "} must be one of " + ", ".join(names) + ", got {value!r}", value=item)
        return names[item]
    if axis in SWITCH_AXES:
        if not isinstance(item, bool):
            raise ParameterError("{" + axis + "} takes True or False, got {value!r}", value=item)
        return int(item)
    lowest = 0 if axis in ("zero", "offload") else 1
    if isinstance(item, bool) or not isinstance(item, int) or item < lowest:
        kind = "non-negative" if lowest == 0 else "positive"
        raise ParameterError("{" + axis + "} takes " + kind + " integers, got {value!r}", value=item)
    return item


def _engine_defaults(request: PlanRequest) -> dict[str, Any]:
    """EVALUATE_DEFAULTS with the engine's own context-parallel communication (Megatron p2p, torchtitan allgather)."""
    rules = engine_rules(request.engine)
    return {**EVALUATE_DEFAULTS, "cp_comm": rules.cp_comm_types[0]} if rules.cp_comm_types else dict(EVALUATE_DEFAULTS)


def evaluation_axes(request: PlanRequest, num_gpus: int, cluster_name: str) -> dict[str, list[int]]:
    """The one configuration ``evaluate`` prices: each axis one code (defaults for those left out), dp from the
    GPU count unless given; ParameterError for an axis with several values or degrees that miss the GPU count."""
    fixed = {axis: list(axis_codes(axis, value)) for axis, value in _engine_defaults(request).items()}
    fixed.update({axis: list(codes) for axis, codes in request.fixed.items()})
    rules = engine_rules(request.engine)
    if rules.shards_over_cp and fixed["cp"][0] > 1 and "zero" not in request.fixed:
        fixed["zero"] = list(axis_codes("zero", 3))  # FSDP over dp_shard x cp, resharding after forward: its default
    if "sp" not in request.fixed and fixed.get("tp", [1])[0] > 1 and 0 not in rules.sp_modes_with_tp:
        fixed["sp"] = [rules.sp_modes_with_tp[0]]  # torchtitan always shards norms with TP (SequenceParallel)
    for axis, codes in fixed.items():
        if len(codes) > 1:
            raise ParameterError("evaluate takes one value per axis; {" + axis + "} has {count} (use plan to "
                                 "compare several)", count=len(codes))
    for axis in ("tp", "pp"):
        if axis not in fixed:
            raise ParameterError("evaluate needs {" + axis + "}")
    shape = fixed["tp"][0] * fixed["pp"][0] * fixed["cp"][0]
    if "dp" not in fixed and num_gpus % shape == 0:
        fixed["dp"] = [num_gpus // shape]
    elif "dp" not in fixed:
        raise InputError(f"tp·pp·cp = {shape} does not divide the {num_gpus} GPUs of {cluster_name}; choose "
                         "degrees whose product divides the GPU count")
    elif shape * fixed["dp"][0] != num_gpus:
        raise InputError(f"tp·pp·cp·dp = {shape * fixed['dp'][0]} does not match the {num_gpus} GPUs of "
                         f"{cluster_name}; choose degrees whose product is the GPU count")
    return fixed


# -- the job, the cluster, the cost-model inputs ----------------------------------------------------------------
def training_job(request: PlanRequest) -> TrainingJob:
    """The TrainingJob of the request, its own validation errors reported as bad input."""
    from paraplan.model_specs.hf_config import load_model

    if request.flops_convention not in get_args(AttentionFlops):
        raise ParameterError("{flops_convention} expects " + " or ".join(get_args(AttentionFlops)) + ", got "
                             "{value!r}", value=request.flops_convention)
    spec = load_model(request.model) if isinstance(request.model, str) else request.model
    _check_moe_options(request, spec)
    if request.compiled and request.engine != "torchtitan":
        raise ParameterError("{compiled} applies to torchtitan's eager PyTorch model; {name}'s model already runs "
                             "fused kernels (drop {compiled} or use {engine} torchtitan)", name=request.engine)
    stats = _routing_stats(request.routing)
    try:
        return TrainingJob(model=spec, seq_len=request.seq_len, global_batch=request.global_batch,
                           precision=request.precision, engine=request.engine, attention=request.attention,
                           flops_convention=request.flops_convention,
                           memory_headroom_frac=request.memory_headroom_frac,
                           expert_imbalance=request.expert_imbalance, routing=stats,
                           capacity_factor=request.capacity_factor, dispatcher=request.dispatcher,
                           compiled=request.compiled, compiled_loss=request.compiled, async_tp=request.async_tp,
                           fp8_recipe=request.fp8_recipe, fused_expert_mlp=request.fused_expert_mlp)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _check_moe_options(request: PlanRequest, spec: ModelSpec) -> None:
    """The MoE options apply to MoE models, and the imbalance comes from one of them."""
    given = [name for name, value in (("expert_imbalance", request.expert_imbalance), ("routing", request.routing),
                                      ("capacity_factor", request.capacity_factor),
                                      ("dispatcher", None if request.dispatcher == "auto" else request.dispatcher))
             if value is not None]
    if given and not spec.is_moe:
        raise ParameterError(" and ".join("{" + name + "}" for name in given) + " apply to MoE models; {name} is "
                             "dense", name=spec.name)
    if request.expert_imbalance is not None and request.routing is not None:
        raise ParameterError("give {expert_imbalance} or {routing}, not both (routing statistics set the imbalance)")


def _routing_stats(path: Path | None) -> Any:
    """The routing statistics of ``path`` (measurements/routing.py), None without one."""
    if path is None:
        return None
    from paraplan.measurements.routing import read_routing_csv

    return read_routing_csv(path)


def resolve_cluster(source: ClusterSource) -> tuple[ClusterSpec, Catalog]:
    """The cluster ``source`` names and the catalog its names were looked up in (the built-in one with the user's
    hardware file merged in). A topology file gives the cluster the search prices on: its weakest GPU type and
    slowest link everywhere (placement then places on the topology itself)."""
    from paraplan.hardware_profiles.user_file import resolve_catalog

    catalog = resolve_catalog(source.hardware)
    return build_cluster(source, catalog), catalog


def build_cluster(source: ClusterSource, catalog: Catalog | None = None) -> ClusterSpec:
    """``cluster`` (a built-in name or file, sized by ``nodes`` or ``gpus``) or ``gpu`` with ``gpus``."""
    if (source.cluster is None) == (source.gpu is None):
        raise ParameterError("give either {cluster} NAME|FILE [{nodes} N|{gpus} N] or {gpu} NAME {gpus} N")
    if source.gpu is not None:
        if source.gpus is None or source.nodes is not None:
            raise ParameterError("{gpu} needs {gpus} N (total GPUs) and takes no {nodes}")
        per_node = DEFAULT_GPUS_PER_NODE if source.gpus_per_node is None else source.gpus_per_node
        return quick_cluster(source.gpu, source.gpus, per_node, catalog=catalog)
    if source.gpus_per_node is not None:
        raise ParameterError("{gpus_per_node} goes with {gpu}; a {cluster} fixes its own node size")
    assert source.cluster is not None  # the first check: exactly one of cluster and gpu
    path = Path(source.cluster)
    if source.topology_file is not None:
        from paraplan.planner.placement.refine import search_cluster

        return search_cluster(path, source.nodes, source.gpus, catalog)
    if path.is_file() or path.suffix in (".yaml", ".yml") or "/" in source.cluster:
        return cluster_from_file(path, num_nodes=source.nodes, num_gpus=source.gpus, catalog=catalog)
    return load_cluster(source.cluster, num_nodes=source.nodes, num_gpus=source.gpus, catalog=catalog)


def with_price(cluster: ClusterSpec, price: float | None) -> ClusterSpec:
    """``cluster`` with its GPU priced at the user's ``price`` (what ``objective="cost"`` ranks by)."""
    if price is None:
        return cluster
    gpu = dataclasses.replace(cluster.gpu, price_usd_per_gpu_hour=price,
                              sources={**cluster.gpu.sources, "price": "--price-per-gpu-hour"})
    return dataclasses.replace(cluster, gpu=gpu)


def cost_inputs(request: PlanRequest, job: TrainingJob,
                cluster: ClusterSpec) -> tuple[ComputeRates, ClusterSpec, tuple[str, ...]]:
    """The compute rates (learned where the store has a model for the GPU, scaled by the stack profile), the
    cluster with its learned collective models attached, and the notes to show (a stack profile measured on
    another GPU or engine)."""
    from paraplan.cost_models.learned.provider import compute_rates, learned_cluster
    from paraplan.measurements.store_location import default_store_path

    store = request.store if request.store is not None else default_store_path()
    work = job.workload()
    gpu = gpu_at_scale(cluster.gpu, cluster.num_gpus)
    rates = compute_rates(request.cost_model, gpu, work.precision, work.attention, work.kernel_stack, store)
    learned = learned_cluster(request.cost_model, cluster, store)  # its collectives learned; the GPU is the same
    kernel = _sinks_note(job.model, work.attention) + _mtp_note(job.model, job.engine, work.mtp_layers)
    if request.stack_profile is None:
        return rates, learned, kernel
    from paraplan.validation import stack_profile as sp  # pandas: loaded only when a profile is applied

    profile = sp.load_profile(request.stack_profile)
    note = sp.mismatch_note(profile, learned.gpu.name, job.engine)
    return sp.with_profile(rates, profile), learned, ((note,) if note else ()) + kernel


def _sinks_note(model: ModelSpec, attention: str) -> tuple[str, ...]:
    """What the price assumes of a model with attention sinks (GPT-OSS): FlashAttention-2 and PyTorch's SDPA have
    no sink logits (FlashAttention-3 and recent cuDNN do; torchtitan runs such models with FlexAttention, and
    Transformer Engine falls back to its unfused attention where cuDNN lacks them)."""
    if not model.attention_sinks or attention == "unfused":
        return ()
    return (f"{model.name} has attention sinks: priced at the {attention} attention kernel's rate as if it had them; "
            "FlashAttention-2 and PyTorch SDPA do not (FlashAttention-3 and recent cuDNN do), and Transformer Engine "
            "falls back to unfused attention without them (--attention unfused prices that)",)


def _mtp_note(model: ModelSpec, engine: str, trained: int) -> tuple[str, ...]:
    """What the price does with a model's multi-token-prediction modules (DeepSeek-V3): trained and priced on the
    stage that runs the loss where the engine trains them (Megatron), left out where it has none."""
    if not model.mtp_layers:
        return ()
    if trained:
        return (f"{model.name}: its {trained} MTP module(s) are trained (Megatron --mtp-num-layers {trained}) and "
                "priced after the last decoder layer on the stage that runs the loss",)
    return (f"{model.name} has {model.mtp_layers} MTP module(s); {engine} trains the main model only, so they are "
            "neither priced nor launched",)


# -- the whole run ------------------------------------------------------------------------------------------------
def run_options(tokens: float | None = None, steps: int | None = None, price_per_gpu_hour: float | None = None,
                failure_rate_per_gpu_hour: float | None = None, checkpoint_write_gbps: float | None = None,
                checkpoint_load_gbps: float | None = None, checkpoint: str | None = None,
                restart_s: float | None = None) -> RunOptions | None:
    """The run these options describe, in SI (None without a budget): GB/s per node and failures per GPU-hour as
    the command line takes them. ParameterError naming the option for anything wrong."""
    if tokens is not None and steps is not None:
        raise ParameterError("give {tokens} or {steps}, not both (the steps follow from the tokens and the global "
                             "batch)")
    for name, value, minimum, strict, example in (
            ("tokens", tokens, 1.0, False, "15e12"), ("steps", steps, 1.0, False, "100000"),
            ("price_per_gpu_hour", price_per_gpu_hour, 0.0, True, "2.5"),
            ("failure_rate_per_gpu_hour", failure_rate_per_gpu_hour, 0.0, False, "2e-5"),
            ("checkpoint_write_gbps", checkpoint_write_gbps, 0.0, True, "1.0"),
            ("checkpoint_load_gbps", checkpoint_load_gbps, 0.0, True, "1.0"), ("restart_s", restart_s, 0.0, False,
                                                                               "150")):
        _check_number(name, value, minimum, strict, example)
    if checkpoint is not None and checkpoint not in fl.CHECKPOINT_MODES:
        raise ParameterError("{checkpoint} expects async or sync, got {value!r}", value=checkpoint)
    described = {"failure_rate_per_gpu_hour": failure_rate_per_gpu_hour, "checkpoint_write_gbps": checkpoint_write_gbps,
                 "checkpoint_load_gbps": checkpoint_load_gbps, "checkpoint": checkpoint, "restart_s": restart_s}
    given = [name for name, value in described.items() if value is not None]
    if tokens is None and steps is None:
        if given:
            raise ParameterError("{" + given[0] + "} describes the whole run: add a budget, {tokens} N (e.g. 15e12) "
                                 "or {steps} N")
        return None
    # Mixed keyword values (floats, the checkpoint mode checked against CHECKPOINT_MODES above): Any, by name.
    set_values: dict[str, Any] = {"failures_per_gpu_s": _per_s(failure_rate_per_gpu_hour), "restart_s": restart_s,
                  "checkpoint_mode": checkpoint, "checkpoint_write_bytes_per_s_per_node": _bytes(checkpoint_write_gbps),
                  "checkpoint_load_bytes_per_s_per_node": _bytes(checkpoint_load_gbps)}
    # Options left out keep RunOptions' defaults (each with its source there).
    return RunOptions(tokens=tokens, steps=steps, price_usd_per_gpu_hour=price_per_gpu_hour,
                      **{name: value for name, value in set_values.items() if value is not None})


def _per_s(rate_per_hour: float | None) -> float | None:
    return None if rate_per_hour is None else rate_per_hour / SECONDS_PER_HOUR


def _bytes(gb_per_s: float | None) -> float | None:
    return None if gb_per_s is None else gb_per_s * BYTES_PER_GB


def _check_number(name: str, value: float | None, minimum: float, strict: bool, example: str) -> None:
    if value is None:
        return
    ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ParameterError("{" + name + "} expects a number {bound} (e.g. {example}), got {value}", bound=bound,
                             example=example, value=f"{value:g}")


def _check_price(price: float | None) -> None:
    _check_number("price_per_gpu_hour", price, 0.0, True, "2.5")
