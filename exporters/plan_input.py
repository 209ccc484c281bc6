"""Read a plan file for export: check it against the plan schema and pick one plan.

A plan file is what ``paraplan plan --json`` writes, ``{"schema_version": 1, "plans": [...]}``
(``paraplan export --format json`` writes the same with one plan). Anything malformed is an
InputError: one line naming the problem.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paraplan.choices import Engine, Precision
from paraplan.errors import InputError
from paraplan.files import one_line, parse_user_json, read_user_text, shown
from paraplan.limits import (
    MAX_EXPERTS,
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SEQ_LEN,
    MAX_VOCAB,
    MAX_WIDTH,
)
from paraplan.model_specs.hf_config import load_model
from paraplan.model_specs.model_spec import ModelSpec
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import ParallelConfig
from paraplan.planner.json_schema import schema_errors
from paraplan.planner.layout import RANK_ORDER, rank_map, stage_layers, stage_split
from paraplan.planner.plan import SCHEMA_VERSION, UNSTORED_MODEL_FIELDS, model_from_shape, plan_schema


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportPlan:
    """One plan, read and checked, with everything a launcher needs."""

    document: dict[str, Any]
    """The plan exactly as the file holds it (schema-valid)."""
    model: ModelSpec
    """The model's shape (the plan's own, else its preset)."""
    config: ParallelConfig
    """The parallel layout."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    precision: Precision
    """GEMM precision the plan was priced with."""
    engine: Engine
    """Training engine the plan was made for."""
    attention: str
    """Attention kernel the plan was priced with."""
    num_nodes: int
    gpus_per_node: int
    """Processes torchrun starts on each node."""
    domain_gpus: int
    """GPUs of one NVLink domain."""
    num_microbatches: int
    """Micro-batches per step on each data-parallel rank: global_batch / (mbs · dp)."""
    stage_layers: tuple[int, ...]
    """Decoder layers per model chunk in model order (pp·vpp chunks)."""
    ranks: tuple[dict[str, int], ...]
    """The rank map: the plan's own, or the default layout of its rank order."""
    capacity_factor: float | None = None
    """MoE token dropping, padded to capacity (None = dropless)."""
    dispatcher: str = "alltoall"
    """MoE token dispatcher the plan was priced with (cost_models.moe.DISPATCHERS)."""
    fp8_recipe: str = "tensorwise"
    """fp8 scaling recipe the plan was priced with (cost_models.fp8_recipes.FP8_RECIPES)."""
    compiled: bool = False
    """torchtitan: the plan was priced with the model under torch.compile."""
    async_tp: bool = False
    """torchtitan: the plan was priced with async tensor parallelism."""
    fused_expert_mlp: bool = False
    """MoE: the plan was priced with the routed experts' MLP fused (Transformer Engine's op fuser)."""
    hosts: tuple[str, ...] = ()
    """Host of each node rank chosen by rank placement (``paraplan place``); empty = the scheduler's order."""

    @property
    def num_gpus(self) -> int:
        """World size."""
        return self.num_nodes * self.gpus_per_node


MAX_PLAN_BYTES = 64 << 20
"""A plan file: ``paraplan plan --json`` writes a few KB per plan (its rank map lists every GPU: about 80 bytes
each, 8 MB for 100,000 GPUs); 64 MiB holds the top plans of the largest cluster MAX_GPUS allows."""
# Upper bounds of a plan's counts, checked after the schema (which sets only minimums) and before any is used
# to build a per-GPU or per-layer structure: the limits every other input of paraplan obeys (paraplan.limits).
_BOUNDS = {
    "cluster": {"num_gpus": MAX_GPUS, "gpus_per_node": MAX_GPUS_PER_NODE, "nvlink_domain_gpus": MAX_GPUS},
    "job": {"seq_len": MAX_SEQ_LEN, "global_batch": MAX_GLOBAL_BATCH},
    "config": {"tp": MAX_GPUS, "pp": MAX_GPUS, "dp": MAX_GPUS, "cp": MAX_GPUS, "ep": MAX_GPUS, "etp": MAX_GPUS,
               "vpp": MAX_LAYERS, "mbs": MAX_GLOBAL_BATCH, "offload": MAX_LAYERS},
}
_SHAPE_BOUNDS = {"num_layers": MAX_LAYERS, "mtp_layers": MAX_LAYERS, "sliding_layers": MAX_LAYERS,
                 "num_heads": MAX_HEADS, "num_kv_heads": MAX_HEADS, "vocab_size": MAX_VOCAB,
                 "max_positions": MAX_SEQ_LEN, "sliding_window": MAX_SEQ_LEN, "num_experts": MAX_EXPERTS,
                 "experts_per_token": MAX_EXPERTS, "expert_groups": MAX_EXPERTS, "groups_per_token": MAX_EXPERTS}


def read_plan_document(path: Path) -> Any:
    """The parsed JSON of a plan file (a training plan file or a serving plan file), through the guarded reader."""
    if not path.is_file():
        raise InputError(f"plan file {path} does not exist (write one with 'paraplan plan ... --json {path}')")
    text = read_user_text(path, MAX_PLAN_BYTES, "plan file")
    try:
        return parse_user_json(text, str(path), top=None)
    except InputError as exc:
        raise InputError(one_line(f"{exc} (not a JSON plan file)")) from None


def is_serving_document(document: Any) -> bool:
    """Whether a plan file holds serving plans ('paraplan serve --json')."""
    return isinstance(document, dict) and document.get("kind") == "serving"


def read_plan_file(path: Path, rank: int | None = None) -> ExportPlan:
    """The plan ranked ``rank`` in the file at ``path`` (default: its best-ranked plan)."""
    return plan_from_document(select_plan(read_plan_document(path), rank, str(path)))


def select_plan(document: Any, rank: int | None, origin: str) -> dict[str, Any]:
    """Check the file's wrapper and every plan in it against the schema; return the one ranked ``rank``
    (None: the best-ranked one)."""
    if not isinstance(document, dict) or set(document) - {"from_job"} != {"schema_version", "plans"}:
        raise InputError(f"{origin}: expected {{\"schema_version\": {SCHEMA_VERSION}, \"plans\": [...]}} as "
                         "'paraplan plan --json' writes")
    if document["schema_version"] != SCHEMA_VERSION or not isinstance(document["plans"], list):
        raise InputError(f"{origin}: schema_version must be {SCHEMA_VERSION} and plans a list")
    schema = plan_schema()
    for index, plan in enumerate(document["plans"]):
        problems = schema_errors(plan, schema)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise InputError(f"{origin} plans[{index}] does not match the plan schema: "
                             f"{one_line(problems[0], 160)}{more}")
        _check_bounds(plan, f"{origin} plans[{index}]")
        _check_experts(plan, f"{origin} plans[{index}]")
    if not document["plans"]:
        raise InputError(f"{origin}: the file holds no plans")
    if rank is None:
        return min(document["plans"], key=lambda plan: plan["rank"])
    chosen = [plan for plan in document["plans"] if plan["rank"] == rank]
    if not chosen:
        ranks = sorted({plan["rank"] for plan in document["plans"]})
        listed = ", ".join(map(str, ranks[:10])) + (", ..." if len(ranks) > 10 else "")
        raise InputError(f"{origin}: no plan ranked {shown(rank)} (ranks in the file: {listed})")
    return chosen[0]


def _check_bounds(plan: dict[str, Any], origin: str) -> None:
    """InputError naming the first count of ``plan`` beyond the limits of paraplan.limits."""
    sections = [(f"{name}.{key}", plan[name].get(key), bound) for name, keys in _BOUNDS.items()
                for key, bound in keys.items()]
    shape = plan["model"].get("shape") or {}
    sections += [(f"model.shape.{key}", value, _SHAPE_BOUNDS.get(key, MAX_WIDTH)) for key, value in shape.items()
                 if isinstance(value, int) and not isinstance(value, bool)]
    sections += [(f"model.shape.moe_layers[{i}]", value, MAX_LAYERS)
                 for i, value in enumerate(shape.get("moe_layers") or ()) if isinstance(value, int)]
    for key, value, bound in sections:
        if isinstance(value, int) and value > bound:
            raise InputError(f"{origin}: {key} = {shown(value, 30)} is implausibly large (at most {bound:,}); is "
                             "this a plan paraplan wrote?")
    if len(str(plan["model"]["name"])) > 200:
        raise InputError(f"{origin}: model.name is {len(plan['model']['name']):,} characters (at most 200)")


def _check_experts(plan: dict[str, Any], origin: str) -> None:
    """InputError unless the plan's expert grid can be built (planner/layout.expert_map): ep and etp only on an MoE
    model, ep dividing its routed experts, and ep·etp the ranks of a pipeline stage. Every engine's rules imply
    these, so only a plan file edited by hand fails them."""
    config, shape = plan["config"], plan["model"].get("shape")
    ep, etp = config.get("ep", 1), config.get("etp", 1)
    stage_ranks = config.get("tp", 1) * config.get("cp", 1) * config.get("dp", 1)
    if shape is not None:
        experts = shape.get("num_experts", 0) if shape.get("moe_layers") else 0
        if experts == 0 and (ep > 1 or etp > 1):
            raise InputError(f"{origin}: ep = {ep}, etp = {etp} but ep and etp apply to MoE models only "
                             f"({shown(plan['model']['name'], 60)} is dense); is this a plan paraplan wrote?")
        if experts and experts % ep:
            raise InputError(f"{origin}: ep = {ep} must divide the {experts} routed experts of "
                             f"{shown(plan['model']['name'], 60)}; is this a plan paraplan wrote?")
    if stage_ranks % (ep * etp):
        raise InputError(f"{origin}: ep·etp = {ep * etp} must divide the {stage_ranks} ranks of a pipeline stage "
                         "(tp·cp·dp); is this a plan paraplan wrote?")


def plan_from_document(plan: dict[str, Any]) -> ExportPlan:
    """An ExportPlan from one schema-valid plan dict; InputError when its numbers disagree."""
    model = _model_of(plan["model"])
    try:
        config = ParallelConfig(**plan["config"])
    except (TypeError, ValueError) as exc:
        raise InputError(f"plan config: {exc}") from None
    cluster, job = plan["cluster"], plan["job"]
    per_node = min(cluster["gpus_per_node"], cluster["num_gpus"])
    if config.num_gpus != cluster["num_gpus"] or cluster["num_gpus"] % per_node:
        raise InputError(f"plan config tp·pp·dp·cp = {config.num_gpus} must equal the cluster's {cluster['num_gpus']} "
                         f"GPUs, a whole number of {per_node}-GPU nodes")
    recipe = job.get("fp8_recipe", "tensorwise")
    if recipe not in engine_rules(job["engine"]).fp8_recipes:
        raise InputError(f"plan job fp8_recipe {shown(recipe, 30)} is not a recipe {job['engine']} runs "
                         f"({', '.join(engine_rules(job['engine']).fp8_recipes)}); re-plan for that engine")
    if config.pp_schedule not in engine_rules(job["engine"]).pipeline_schedules:
        raise InputError(f"plan config pp_schedule {shown(config.pp_schedule, 30)} is not a schedule {job['engine']} "
                         f"runs ({', '.join(engine_rules(job['engine']).pipeline_schedules)}); re-plan for that "
                         "engine")
    if job["global_batch"] % (config.mbs * config.dp):
        raise InputError(f"plan global batch {job['global_batch']} is not a multiple of "
                         f"mbs·dp = {config.mbs * config.dp}")
    return ExportPlan(
        document=plan, model=model, config=config, seq_len=job["seq_len"], global_batch=job["global_batch"],
        precision=job["precision"], engine=job["engine"], attention=job["attention"],
        num_nodes=cluster["num_gpus"] // per_node, gpus_per_node=per_node, domain_gpus=cluster["nvlink_domain_gpus"],
        num_microbatches=job["global_batch"] // (config.mbs * config.dp),
        stage_layers=tuple(_stage_layers(plan, model, config, job["engine"])),
        ranks=tuple(_ranks(plan, config, per_node)),
        hosts=tuple(_hosts(plan, cluster["num_gpus"] // per_node)), capacity_factor=job.get("capacity_factor"),
        dispatcher=job.get("dispatcher", "alltoall"), compiled=bool(job.get("compiled", False)),
        async_tp=bool(job.get("async_tp", False)), fp8_recipe=job.get("fp8_recipe", "tensorwise"),
        fused_expert_mlp=bool(job.get("fused_expert_mlp", False)) and model.is_moe)


def _model_of(section: dict[str, Any]) -> ModelSpec:
    if "shape" in section:
        known = {field.name for field in dataclasses.fields(ModelSpec)} - set(UNSTORED_MODEL_FIELDS)
        unknown = sorted(set(section["shape"]) - known)
        if unknown:
            raise InputError(f"plan model.shape: unknown key {shown(unknown[0], 40)}; is this a plan paraplan wrote?")
        return model_from_shape(section["name"], section["shape"])
    try:
        return load_model(section["name"])
    except InputError as exc:
        raise InputError(f"the plan has no model shape (written before paraplan stored it) and {exc}") from None


def _stage_layers(plan: dict[str, Any], model: ModelSpec, config: ParallelConfig, engine: Engine) -> list[int]:
    try:
        layout = stage_layers(model.num_layers, config.pp, config.vpp, engine_rules(engine).pipeline_split)
    except ValueError as exc:
        raise InputError(f"plan placement: {exc}") from None
    stored = plan["placement"]["stage_layers"]
    if stored is not None and stored != layout and stage_split(stored, model.num_layers, config.pp, config.vpp):
        return stored  # a stage partition's (or a typed pipeline's) layers per stage
    if stored is not None and stored != layout:
        # With virtual stages the launch formats express the engine's own split only.
        raise InputError(f"plan placement.stage_layers {shown(stored, 60)} is not a split the launch formats can "
                         f"express for {model.num_layers} layers over pp·vpp = {config.pp * config.vpp} chunks: one "
                         f"chunk per rank with at least one layer each, or the engine's own split {shown(layout, 60)}")
    return layout


def _ranks(plan: dict[str, Any], config: ParallelConfig, per_node: int) -> list[dict[str, int]]:
    default = rank_map(tp=config.tp, cp=config.cp, dp=config.dp, pp=config.pp, gpus_per_node=per_node)
    stored = plan["placement"]["rank_map"]
    if stored is not None and stored != default:
        # torchrun numbers ranks node by node and every engine lays its groups out in this order, so a
        # launcher cannot start a different placement; say so instead of writing a script that ignores it.
        raise InputError(f"plan placement.rank_map differs from the {plan['placement']['rank_order']} layout of its "
                         "degrees; the launch formats can only start ranks in that layout")
    if plan["placement"]["rank_order"] != RANK_ORDER:
        raise InputError(f"plan placement.rank_order {shown(plan['placement']['rank_order'], 30)} is not "
                         f"{RANK_ORDER!r}, the only order the launch formats start")
    return default


def _hosts(plan: dict[str, Any], num_nodes: int) -> list[str]:
    hosts = plan["placement"].get("host_order", [])
    if hosts and (len(hosts) != num_nodes or len(set(hosts)) != len(hosts)):
        raise InputError(f"plan placement.host_order must name {num_nodes} distinct hosts, one per node rank, got "
                         f"{len(hosts)}")
    return hosts
