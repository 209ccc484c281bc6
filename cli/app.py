"""The ``paraplan`` command line. Each command parses its flags, calls the library, renders.

Bad input anywhere (an :class:`InputError`) becomes one ``error: ...`` line on stderr and exit
code 2; any other exception is a bug and propagates (exit code 1).
"""

import difflib
import functools
import math
import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from paraplan.choices import CP_COMM_CODES, PIPELINE_SCHEDULE_CODES, RECOMPUTE_CODES
from paraplan.cli import (
    calibrate_cmd,
    catalog_json,
    export_cmd,
    place_cmd,
    profile_cmd,
    render,
    render_run,
    report_cmd,
    run_flags,
    serve_cmd,
    sweep_cmd,
)
from paraplan.cost_models.device_memory import usable_capacity_bytes
from paraplan.errors import INTERNAL_ERROR_EXIT_CODE, REPORT_REQUEST, InputError, InternalError
from paraplan.hardware_profiles import Catalog, ClusterSpec, cluster_from_file, load_cluster, quick_cluster
from paraplan.hardware_profiles.device_names import looks_like_device_name
from paraplan.hardware_profiles.topology_file import is_topology_file
from paraplan.hardware_profiles.user_file import resolve_catalog
from paraplan.measurements.routing import read_routing_csv
from paraplan.model_specs.hf_config import load_model, preset_names
from paraplan.model_specs.model_spec import AttentionFlops
from paraplan.planner.job import TrainingJob
from paraplan.planner.plan import SCHEMA_VERSION, Plan, plan_at, plan_to_json
from paraplan.planner.search import explain_no_fit, search
from paraplan.version import __version__

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Plan distributed training of transformers: search parallel layouts, predict step time, "
                       "MFU and memory.")
models_app = typer.Typer(no_args_is_help=True, help="Model presets: list them or show one in detail.")
hardware_app = typer.Typer(no_args_is_help=True, help="GPU and cluster catalog: list it or show one entry.")
app.add_typer(models_app, name="models")
app.add_typer(hardware_app, name="hardware")
profiles_app = typer.Typer(no_args_is_help=True, help="The profile store: what it holds per hardware.")
app.add_typer(profiles_app, name="profiles")


def _print_version(requested: bool) -> None:
    if requested:
        typer.echo(f"paraplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print paraplan's version and exit.")] = False) -> None:
    """Plan distributed training of transformers: search parallel layouts, predict step time, MFU and memory."""
    render.route_human_output(None)  # each command says where its own output goes

_SEARCH_AXES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero")
_SP_VALUES = {"on": [1], "off": [0], "both": [0, 1]}

# -- options shared by plan and evaluate ------------------------------------------------------
_CLUSTER, _JOB, _CONFIG = "Cluster", "Job", "Parallel configuration"
ModelArg = Annotated[str, typer.Argument(help="Preset name (see 'paraplan models list') or a config.json path.")]
JobModelArg = Annotated[str | None, typer.Argument(
    help="Preset name (see 'paraplan models list') or a config.json path; optional with --from or --config.")]
ClusterOpt = Annotated[str | None, typer.Option(help="Built-in cluster name or a cluster YAML file.",
                                                rich_help_panel=_CLUSTER)]
NodesOpt = Annotated[int | None, typer.Option(help="Nodes of the --cluster.", rich_help_panel=_CLUSTER)]
GpuOpt = Annotated[str | None, typer.Option(help="GPU name for a quick cluster (with --gpus).",
                                            rich_help_panel=_CLUSTER)]
GpusOpt = Annotated[int | None, typer.Option(help="Total GPUs (quick cluster, or to size --cluster).",
                                             rich_help_panel=_CLUSTER)]
PerNodeOpt = Annotated[int | None, typer.Option(help="GPUs per node with --gpu (default 8).",
                                                rich_help_panel=_CLUSTER)]
HardwareFileOpt = Annotated[Path | None, typer.Option(
    "--hardware", help="Your own hardware file (gpus: and clusters: in the catalog's schema) beside the built-in "
                       "catalog; default $PARAPLAN_HARDWARE. See docs/hardware.md.",
    rich_help_panel=_CLUSTER)]
SeqLenOpt = Annotated[int | None, typer.Option(help="Tokens per sequence.", rich_help_panel=_JOB)]
BatchOpt = Annotated[int | None, typer.Option(help="Sequences per optimizer step.", rich_help_panel=_JOB)]
FromOpt = Annotated[Path | None, typer.Option(
    "--from", help="Read model, cluster, batch, precision and layout from a job file: a Megatron-LM launch script or "
                   "log, Megatron-Bridge/NeMo YAML, torchtitan TOML or launch script, DeepSpeed ds_config.json or "
                   "launch script. Flags given here override it.", rich_help_panel="Job file")]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", help="A YAML file of this command's options (seq-len: 4096, gpu: h100-sxm, tp: 8, from: train.sh); "
                     "flags given here override it.", rich_help_panel="Job file")]
EngineOpt = Annotated[str, typer.Option(help="megatron, deepspeed or torchtitan.", rich_help_panel=_JOB)]
PrecisionOpt = Annotated[str, typer.Option(help="GEMM precision: bf16, fp8 or fp4.", rich_help_panel=_JOB)]
AttentionOpt = Annotated[str, typer.Option(
    help="Attention kernel: auto (engine default), fused (cuDNN via Transformer Engine), flash (FlashAttention-2), "
         "unfused.", rich_help_panel=_JOB)]
Fp8RecipeOpt = Annotated[str, typer.Option(
    "--fp8-recipe", help="How fp8 GEMM inputs are scaled: tensorwise (per tensor, current scaling), delayed, rowwise "
                         "(torchao), blockwise (1x128/128x128 tiles) or mxfp8 (Blackwell); with --precision fp8.",
    rich_help_panel="Job")]
DispatcherOpt = Annotated[str, typer.Option(
    help="MoE token dispatcher: auto (engine default), alltoall (each routed copy to its expert's GPU), deepep "
         "(DeepEP: once per destination node, fp8 dispatch with fp8 GEMMs; Megatron's flex dispatcher).",
    rich_help_panel=_JOB)]
CompileOpt = Annotated[bool, typer.Option(
    "--compile/--no-compile", help="torchtitan: the model runs under torch.compile (its memory-bound ops fused; "
    "exported as compile.enable). torchtitan's own default, and paraplan's, is eager.", rich_help_panel=_JOB)]
AsyncTPOpt = Annotated[bool, typer.Option(
    "--async-tp", help="torchtitan with --compile: async tensor parallelism, TP collectives under the matmuls "
    "(exported as compile.enable_async_tensor_parallel).", rich_help_panel=_JOB)]
HeadroomOpt = Annotated[float, typer.Option(help="Fraction of HBM to keep free (0-1).", rich_help_panel=_JOB)]
ConventionOpt = Annotated[str, typer.Option(help="Attention FLOPs counted in MFU: full or causal.",
                                            rich_help_panel=_JOB)]
ImbalanceOpt = Annotated[float | None, typer.Option(
    help="MoE: busiest expert-parallel rank's tokens over the mean (1 = force-balanced); default: a balanced "
         "router's sampling noise.", rich_help_panel=_JOB)]
RoutingOpt = Annotated[Path | None, typer.Option(
    help="MoE: routing statistics CSV (layer,expert,next_expert,tokens) that set the imbalance per ep.",
    rich_help_panel=_JOB)]
CapacityOpt = Annotated[float | None, typer.Option(
    help="MoE token dropping: expert capacity as a multiple of the balanced share, padded to it (Megatron "
         "--moe-expert-capacity-factor); default dropless.", rich_help_panel=_JOB)]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write machine-readable JSON to this file "
                                                             "('-': to standard output, the tables to stderr).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing --json file (and exported files).")]
ExportOpt = Annotated[str | None, typer.Option("--export", help="Also write launch configs of the top plan: "
                                               "megatron, deepspeed, torchtitan, slurm, k8s, json or all.")]
ExportOutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Folder for --export.")]


_CP_COMM_HELP = ("How context parallelism moves K and V: p2p (ring), a2a (Ulysses), allgather, a2a+p2p "
                 "(all-to-all inside an NVLink domain, ring across); comma list.")


_SCHEDULE_HELP = ("Pipeline schedule: 1f1b (interleaved with vpp > 1) or dualpipev (torchtitan's DualPipeV: "
                  "vpp 2, rank 0 holds both model edges); comma list.")


_TP_OVERLAP_HELP = ("Megatron --tp-comm-overlap: TP collectives pipelined under their GEMMs (tp > 1, sequence "
                    "parallel):")


def _axis_opt(text: str) -> Any:
    return Annotated[str | None, typer.Option(help=text, rich_help_panel=_CONFIG)]


# -- parsing helpers --------------------------------------------------------------------------
def user_errors(command: Callable) -> Callable:
    """InputError: one ``error:`` line on stderr and exit code 2. Any other exception is a defect in paraplan:
    its traceback, then one ``internal error`` line asking for a report, and exit code 70 (EX_SOFTWARE), so
    neither the user nor a script takes a bug for a mistake in the command."""
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except InputError as exc:
            typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
            raise typer.Exit(2) from None
        except InternalError as exc:
            typer.echo(f"internal error (a paraplan defect, not your input): {' '.join(str(exc).split())}; "
                       f"{REPORT_REQUEST}", err=True)
            raise typer.Exit(INTERNAL_ERROR_EXIT_CODE) from None
        except (typer.Exit, typer.Abort, typer.BadParameter):
            raise
        except Exception as exc:  # noqa: BLE001 - the one place every other defect is reported as one
            typer.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
            what = " ".join(f"{type(exc).__name__}: {exc}".split())
            typer.echo(f"internal error (a paraplan defect, not your input): {what}; {REPORT_REQUEST}", err=True)
            raise typer.Exit(INTERNAL_ERROR_EXIT_CODE) from None
    return wrapper


def parse_ints(flag: str, text: str, minimum: int = 1, maximum: int | None = None) -> list[int]:
    """``"8"`` or ``"4,8"`` as sorted unique ints within bounds; InputError naming the flag otherwise."""
    parts = [part.strip() for part in text.split(",")]
    ok = all(re.fullmatch(r"[0-9]+", part) for part in parts)
    values = sorted({int(part) for part in parts}) if ok else []
    if not ok or values[0] < minimum or (maximum is not None and values[-1] > maximum):
        span = f"integers from {minimum} to {maximum}" if maximum is not None else f"integers >= {minimum}"
        example = "8 or 4,8" if minimum > 0 else f"{minimum} or {minimum},{minimum + 1}"
        raise InputError(f"--{flag} expects one value or a comma list of {span} (e.g. {example}), got {text!r}")
    return values


def parse_names(flag: str, text: str, known: dict[str, int | list[int]]) -> list[int]:
    """A comma list of names from ``known`` mapped to their integer codes."""
    parts = [part.strip() for part in text.split(",")]
    unknown = [part for part in parts if part not in known]
    if unknown:
        raise InputError(f"--{flag} expects {', '.join(known)} (or a comma list of them), got {text!r}")
    values: set[int] = set()
    for part in parts:
        mapped = known[part]
        values.update(mapped if isinstance(mapped, list) else [mapped])
    return sorted(values)


def constraints(**flags: str | None) -> dict[str, list[int]]:
    """The search's ``fixed`` axes from the config flags that were given."""
    fixed = {}
    for axis, text in flags.items():
        if text is None:
            continue
        if axis == "recompute":
            fixed[axis] = parse_names(axis, text, RECOMPUTE_CODES)
        elif axis == "sp":
            fixed[axis] = parse_names(axis, text, _SP_VALUES)
        elif axis == "tp_overlap":
            fixed[axis] = parse_names("tp-comm-overlap", text, _SP_VALUES)
        elif axis == "cp_comm":
            fixed[axis] = parse_names("cp-comm", text, CP_COMM_CODES)
        elif axis == "pp_schedule":
            fixed[axis] = parse_names("pp-schedule", text, PIPELINE_SCHEDULE_CODES)
        else:
            bounds = {"zero": (0, 3), "offload": (0,)}.get(axis, (1,))
            fixed[axis] = parse_ints(axis, text, *bounds)
    return fixed


def make_cluster(cluster: str | None, nodes: int | None, gpu: str | None, gpus: int | None,
                 gpus_per_node: int | None, catalog: Catalog | None = None) -> ClusterSpec:
    """``--cluster NAME|FILE [--nodes N|--gpus N]`` or ``--gpu NAME --gpus N [--gpus-per-node 8]``; names are
    looked up in ``catalog`` (default: the built-in one)."""
    if (cluster is None) == (gpu is None):
        raise InputError("give either --cluster NAME|FILE [--nodes N|--gpus N] or --gpu NAME --gpus N")
    if gpu is not None:
        if gpus is None or nodes is not None:
            raise InputError("--gpu needs --gpus N (total GPUs) and takes no --nodes")
        return quick_cluster(gpu, gpus, 8 if gpus_per_node is None else gpus_per_node, catalog=catalog)
    if gpus_per_node is not None:
        raise InputError("--gpus-per-node goes with --gpu; a --cluster fixes its own node size")
    if is_topology_file(Path(cluster)):
        return place_cmd.search_cluster(Path(cluster), nodes, gpus, catalog)
    looks_like_file = Path(cluster).suffix in (".yaml", ".yml") or "/" in cluster
    if Path(cluster).is_file() or looks_like_file:
        return cluster_from_file(Path(cluster), num_nodes=nodes, num_gpus=gpus, catalog=catalog)
    return load_cluster(cluster, num_nodes=nodes, num_gpus=gpus, catalog=catalog)


def make_job(model: str, seq_len: int, global_batch: int, precision: str, engine: str, convention: str,
             headroom: float, attention: str = "auto", expert_imbalance: float | None = None,
             routing: Path | None = None, capacity_factor: float | None = None,
             dispatcher: str = "auto", compiled: bool = False, async_tp: bool = False,
             fp8_recipe: str = "tensorwise") -> TrainingJob:
    """The TrainingJob, with its own validation errors reported as bad input."""
    if convention not in get_args(AttentionFlops):
        raise InputError(f"--flops-convention expects {' or '.join(get_args(AttentionFlops))}, got {convention!r}")
    spec = load_model(model) if isinstance(model, str) else model  # a ModelSpec read from a job file
    moe_flags = [flag for flag, value in (("--expert-imbalance", expert_imbalance), ("--routing", routing),
                                          ("--capacity-factor", capacity_factor),
                                          ("--dispatcher", None if dispatcher == "auto" else dispatcher))
                 if value is not None]
    if moe_flags and not spec.is_moe:
        raise InputError(f"{' and '.join(moe_flags)} apply to MoE models; {spec.name} is dense")
    if expert_imbalance is not None and routing is not None:
        raise InputError("give --expert-imbalance or --routing, not both (routing statistics set the imbalance)")
    stats = read_routing_csv(routing) if routing is not None else None
    if compiled and engine != "torchtitan":
        raise InputError(f"--compile applies to torchtitan's eager PyTorch model; {engine}'s model already runs fused "
                         "kernels (drop --compile or use --engine torchtitan)")
    try:
        return TrainingJob(model=spec, seq_len=seq_len, global_batch=global_batch, precision=precision,
                           engine=engine, attention=attention, flops_convention=convention,
                           memory_headroom_frac=headroom, expert_imbalance=expert_imbalance, routing=stats,
                           capacity_factor=capacity_factor, dispatcher=dispatcher, compiled=compiled,
                           compiled_loss=compiled, async_tp=async_tp, fp8_recipe=fp8_recipe)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def capacity_bytes(job: TrainingJob, cluster: ClusterSpec) -> float:
    """The per-GPU memory plans are checked against."""
    return float(usable_capacity_bytes(cluster.gpu.hbm_bytes)) * (1.0 - job.memory_headroom_frac)


def write_plans(path: Path | None, plans: list[Plan], cost_model: str, force: bool) -> None:
    """``{"schema_version": 1, "plans": [...]}`` to ``path`` when one was given."""
    if path is not None:
        document = {"schema_version": SCHEMA_VERSION, "plans": [plan_to_json(p, cost_model) for p in plans]}
        render.write_json(path, document, force)


# -- commands ---------------------------------------------------------------------------------
@app.command()
@user_errors
def plan(
    ctx: typer.Context, model: JobModelArg = None, seq_len: SeqLenOpt = None, global_batch: BatchOpt = None,
    cluster: ClusterOpt = None, nodes: NodesOpt = None,
    gpu: GpuOpt = None, gpus: GpusOpt = None, gpus_per_node: PerNodeOpt = None, hardware: HardwareFileOpt = None,
    engine: EngineOpt = "megatron",
    attention: AttentionOpt = "auto", precision: PrecisionOpt = "bf16", flops_convention: ConventionOpt = "full",
    headroom: HeadroomOpt = 0.0, expert_imbalance: ImbalanceOpt = None, routing: RoutingOpt = None,
    capacity_factor: CapacityOpt = None, dispatcher: DispatcherOpt = "auto", compile_model: CompileOpt = False,
    async_tp: AsyncTPOpt = False, fp8_recipe: Fp8RecipeOpt = "tensorwise",
    objective: Annotated[str, typer.Option(help="throughput, cost or memory.")] = "throughput",
    top: Annotated[int, typer.Option(help="How many plans to show.")] = 5,
    json_path: JsonOpt = None, force: ForceOpt = False, export: ExportOpt = None, out: ExportOutOpt = None,
    place: Annotated[bool, typer.Option("--place", help="Refine the top plans: host order and layers per stage "
                                        "(automatic on a mixed-GPU topology file).")] = False,
    tp: _axis_opt("Tensor parallel, e.g. 8 or 4,8.") = None, pp: _axis_opt("Pipeline parallel.") = None,
    dp: _axis_opt("Data parallel.") = None, cp: _axis_opt("Context parallel.") = None,
    cp_comm: _axis_opt(_CP_COMM_HELP) = None,
    ep: _axis_opt("Expert parallel (MoE models).") = None, etp: _axis_opt("Expert tensor parallel (MoE).") = None,
    vpp: _axis_opt("Virtual pipeline stages.") = None, mbs: _axis_opt("Micro-batch size.") = None,
    zero: _axis_opt("ZeRO stages 0-3.") = None, recompute: _axis_opt("none, selective, full, modules (comma list; modules = Megatron's "
                                                     "--recompute-modules).") = None,
    sp: _axis_opt("Sequence parallel: on, off or both.") = None,
    offload: _axis_opt("Layers whose activations go to host memory (Megatron --cpu-offloading-num-layers; "
                       "pp = 1, no recompute).") = None,
    pp_schedule: _axis_opt(_SCHEDULE_HELP) = None,
    tp_comm_overlap: _axis_opt(_TP_OVERLAP_HELP + " on, off or both.") = None,
    cost_model: profile_cmd.CostModelOpt = "auto", store: profile_cmd.StoreOpt = None,
    stack_profile: calibrate_cmd.StackProfileOpt = None, from_file: FromOpt = None, config: ConfigOpt = None,
    tokens: run_flags.TokensOpt = None, steps: run_flags.StepsOpt = None, price_per_gpu_hour: run_flags.PriceOpt = None,
    failure_rate_per_gpu_hour: run_flags.FailureRateOpt = None, checkpoint_write_gbps: run_flags.WriteOpt = None,
    checkpoint_load_gbps: run_flags.LoadOpt = None, checkpoint: run_flags.ModeOpt = None,
    restart_s: run_flags.RestartOpt = None,
    report: Annotated[Path | None, typer.Option("--report", help="Also write an HTML report of the plans (figures: "
                                                "pipeline timeline, memory, step time) as DIR/report.html.")] = None,
) -> None:
    """Search every parallel layout and show the fastest plans that fit."""
    from paraplan.cli import from_file as job_file  # --from / --config: the job a user's file states

    if from_file is not None or config is not None:
        return plan(**job_file.merged(ctx, plan, from_file, config, searching=True))
    job_file.require(model=model, seq_len=seq_len, global_batch=global_batch)
    catalog = resolve_catalog(hardware)
    spec = make_cluster(cluster, nodes, gpu, gpus, gpus_per_node, catalog)
    run_options = run_flags.run_options(tokens, steps, price_per_gpu_hour, failure_rate_per_gpu_hour,
                                        checkpoint_write_gbps, checkpoint_load_gbps, checkpoint, restart_s)
    spec = run_flags.with_price(spec, price_per_gpu_hour)
    job = make_job(model, seq_len, global_batch, precision, engine, flops_convention, headroom, attention,
                   expert_imbalance, routing, capacity_factor, dispatcher, compile_model, async_tp, fp8_recipe)
    fixed = constraints(tp=tp, pp=pp, dp=dp, cp=cp, cp_comm=cp_comm, ep=ep, etp=etp, vpp=vpp, mbs=mbs, zero=zero,
                        recompute=recompute, sp=sp, offload=offload, pp_schedule=pp_schedule,
                        tp_overlap=tp_comm_overlap)
    if top < 1:
        raise InputError(f"--top expects a positive integer, got {top}")
    render.prepare_json(json_path, force)
    export_cmd.check_plan_export(export, out, job.engine, force)
    if report is not None:
        report_cmd.check_report_folder(report, force)
    rates, spec = profile_cmd.rates_for(cost_model, spec, job, store), profile_cmd.cluster_for(cost_model, spec, store)
    rates = calibrate_cmd.apply_profile(stack_profile, rates, spec.gpu.name, job.engine)
    with render.working(render.make_console(stderr=True), "searching parallel layouts"):
        result = search(job, spec, fixed, objective, rates)
    if len(result.ranked) == 0:
        raise InputError(explain_no_fit(result, spec))
    plans = [plan_at(job, spec, result, int(row), rank) for rank, row in enumerate(result.ranked[:top], start=1)]
    console, capacity = render.make_console(), capacity_bytes(job, spec)
    title = (f"{job.model.name} on {spec.name} ({render.cluster_size(spec)}), seq {job.seq_len}, "
             f"batch {job.global_batch}, {job.precision}, {job.engine}, {job.attention_kernel} attention; "
             f"best {len(plans)} by {objective}")
    render.plan_table(console, plans, capacity, title)
    render.why_best(console, plans, capacity, result.estimates.cost_model, objective)
    runs, run_blocks = run_flags.plan_runs(plans, run_options)
    if runs[0] is not None:
        render_run.run_breakdown(console, runs[0])
    render.search_summary(console, result.rejected, result.considered, len(result.table), len(result.ranked))
    render.hardware_origin(console, spec.gpu)
    documents = [plan_to_json(p, result.estimates.cost_model, run) for p, run in zip(plans, run_blocks)]
    from_job = job_file.compare(ctx, job, spec, rates, plans[0], result.estimates.cost_model)
    if place or (cluster is not None and is_topology_file(Path(cluster))):
        topology = place_cmd.placement_topology(cluster, spec, catalog)
        typed = place_cmd.typed_pipeline_rows(topology, result, skip=len(plans), limit=top) \
            if objective == "throughput" else []
        documents += [plan_to_json(plan_at(job, spec, result, row, rank), result.estimates.cost_model)
                      for rank, row in typed]
        documents = place_cmd.refine(documents, topology, objective, keep=top)
    if json_path is not None:
        render.write_json(json_path, {"schema_version": SCHEMA_VERSION, "plans": documents,
                                      **({"from_job": from_job} if from_job else {})}, force)
    if export is not None:
        export_cmd.export_plan_document(documents[0], export, out, force)
    if report is not None:
        typer.echo(f"wrote {report_cmd.write_report(documents, report, force)}")


app.command("export")(user_errors(export_cmd.export))
app.command("report")(user_errors(report_cmd.report))
app.command("sweep")(user_errors(sweep_cmd.sweep))
app.command("serve")(user_errors(serve_cmd.serve))
app.command("experts")(user_errors(place_cmd.experts))
app.command("place")(user_errors(place_cmd.place))


@app.command()
@user_errors
def evaluate(
    ctx: typer.Context, model: JobModelArg = None, seq_len: SeqLenOpt = None, global_batch: BatchOpt = None,
    tp: _axis_opt("Tensor parallel.") = None, pp: _axis_opt("Pipeline parallel.") = None, cluster: ClusterOpt = None, nodes: NodesOpt = None, gpu: GpuOpt = None,
    gpus: GpusOpt = None, gpus_per_node: PerNodeOpt = None, hardware: HardwareFileOpt = None,
    engine: EngineOpt = "megatron",
    attention: AttentionOpt = "auto", precision: PrecisionOpt = "bf16", flops_convention: ConventionOpt = "full",
    headroom: HeadroomOpt = 0.0, expert_imbalance: ImbalanceOpt = None, routing: RoutingOpt = None,
    capacity_factor: CapacityOpt = None, dispatcher: DispatcherOpt = "auto", compile_model: CompileOpt = False,
    async_tp: AsyncTPOpt = False, fp8_recipe: Fp8RecipeOpt = "tensorwise",
    dp: _axis_opt("Data parallel (default: GPUs / (tp·pp·cp)).") = None, cp: _axis_opt("Context parallel.") = "1",
    cp_comm: _axis_opt(_CP_COMM_HELP) = "p2p",
    ep: _axis_opt("Expert parallel (MoE models).") = "1", etp: _axis_opt("Expert tensor parallel (MoE).") = "1",
    vpp: _axis_opt("Virtual pipeline stages.") = "1", mbs: _axis_opt("Micro-batch size.") = "1",
    zero: _axis_opt("ZeRO stage 0-3.") = "0", recompute: _axis_opt("none, selective, full or modules (Megatron's --recompute-modules).") = "none",
    sp: _axis_opt("Sequence parallel: on or off.") = "off",
    offload: _axis_opt("Layers whose activations go to host memory (pp = 1, no recompute).") = "0",
    pp_schedule: _axis_opt(_SCHEDULE_HELP) = "1f1b",
    tp_comm_overlap: _axis_opt(_TP_OVERLAP_HELP + " on or off.") = "off",
    json_path: JsonOpt = None, force: ForceOpt = False, cost_model: profile_cmd.CostModelOpt = "auto",
    store: profile_cmd.StoreOpt = None, stack_profile: calibrate_cmd.StackProfileOpt = None,
    from_file: FromOpt = None, config: ConfigOpt = None,
    tokens: run_flags.TokensOpt = None, steps: run_flags.StepsOpt = None, price_per_gpu_hour: run_flags.PriceOpt = None,
    failure_rate_per_gpu_hour: run_flags.FailureRateOpt = None, checkpoint_write_gbps: run_flags.WriteOpt = None,
    checkpoint_load_gbps: run_flags.LoadOpt = None, checkpoint: run_flags.ModeOpt = None,
    restart_s: run_flags.RestartOpt = None,
) -> None:
    """Predict step time, throughput and memory of one parallel configuration."""
    from paraplan.cli import from_file as job_file  # --from / --config: the job a user's file states

    if from_file is not None or config is not None:
        return evaluate(**job_file.merged(ctx, evaluate, from_file, config, searching=False))
    job_file.require(model=model, seq_len=seq_len, global_batch=global_batch, tp=tp, pp=pp)
    spec = make_cluster(cluster, nodes, gpu, gpus, gpus_per_node, resolve_catalog(hardware))
    run_options = run_flags.run_options(tokens, steps, price_per_gpu_hour, failure_rate_per_gpu_hour,
                                        checkpoint_write_gbps, checkpoint_load_gbps, checkpoint, restart_s)
    spec = run_flags.with_price(spec, price_per_gpu_hour)
    job = make_job(model, seq_len, global_batch, precision, engine, flops_convention, headroom, attention,
                   expert_imbalance, routing, capacity_factor, dispatcher, compile_model, async_tp, fp8_recipe)
    fixed = constraints(tp=tp, pp=pp, dp=dp, cp=cp, cp_comm=cp_comm, ep=ep, etp=etp, vpp=vpp, mbs=mbs, zero=zero,
                        recompute=recompute, sp=sp, offload=offload, pp_schedule=pp_schedule,
                        tp_overlap=tp_comm_overlap)
    fixed.update(job_file.fixed_extras(ctx))  # a job file's axes that have no flag (ep_overlap)
    several = [axis for axis, values in fixed.items() if len(values) > 1]
    if several:
        raise InputError(f"evaluate takes one value per flag; --{several[0]} has {len(fixed[several[0]])} "
                         "(use 'paraplan plan' to compare several)")
    shape = fixed["tp"][0] * fixed["pp"][0] * fixed["cp"][0]
    if "dp" not in fixed and spec.num_gpus % shape == 0:
        fixed["dp"] = [spec.num_gpus // shape]
    elif "dp" not in fixed or shape * fixed["dp"][0] != spec.num_gpus:
        raise InputError(f"tp·pp·cp{'·dp' if 'dp' in fixed else ''} = {shape * fixed.get('dp', [1])[0]} does not "
                         f"match the {spec.num_gpus} GPUs of {spec.name}; choose degrees whose product is the GPU count")
    render.prepare_json(json_path, force)
    spec = profile_cmd.cluster_for(cost_model, spec, store)
    rates = calibrate_cmd.apply_profile(stack_profile, profile_cmd.rates_for(cost_model, spec, job, store),
                                        spec.gpu.name, job.engine)
    result = search(job, spec, fixed, rates=rates)
    if len(result.table) == 0:
        reason = max(result.rejected, key=result.rejected.get)
        described = render.config_text({a: fixed[a][0] for a in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs",
                                                                 "zero")})
        raise InputError(f"{described} cp_comm={cp_comm} recompute={recompute} sp={sp} offload={offload} "
                         f"pp_schedule={pp_schedule} tp_comm_overlap={tp_comm_overlap} breaks a "
                         f"rule: {reason}")
    one = plan_at(job, spec, result, 0, rank=1)
    console = render.make_console()
    render.evaluation(console, one, capacity_bytes(job, spec), result.estimates.cost_model)
    render.hardware_origin(console, spec.gpu)
    runs, run_blocks = run_flags.plan_runs([one], run_options)
    if runs[0] is not None:
        render_run.run_breakdown(console, runs[0])
    if json_path is not None:
        render.write_json(json_path, {"schema_version": SCHEMA_VERSION, "plans": [
            plan_to_json(one, result.estimates.cost_model, run_blocks[0])]}, force)


app.command("ingest")(user_errors(profile_cmd.ingest))
app.command("calibrate")(user_errors(calibrate_cmd.calibrate))
app.command("learn")(user_errors(profile_cmd.learn))
app.command("profile")(user_errors(profile_cmd.profile))
profiles_app.command("list")(user_errors(profile_cmd.profiles_list))
profiles_app.command("show")(user_errors(profile_cmd.profiles_show))


@models_app.command("list")
@user_errors
def models_list(json_path: JsonOpt = None, force: ForceOpt = False) -> None:
    """Every shipped model preset."""
    render.prepare_json(json_path, force)
    models = [load_model(name) for name in preset_names()]
    render.model_list(render.make_console(), models)
    if json_path is not None:
        render.write_json(json_path, {"schema_version": catalog_json.SCHEMA_VERSION,
                                      "models": [catalog_json.model_document(m) for m in models]}, force)


@models_app.command("types")
@user_errors
def models_types(json_path: JsonOpt = None, force: ForceOpt = False) -> None:
    """Every Hugging Face model_type a config.json may have, and the known ones refused with their reason."""
    from paraplan.model_specs.hf_config import supported_model_types
    from paraplan.model_specs.model_families import REFUSED, TEXT_CONFIG_WRAPPERS

    render.prepare_json(json_path, force)
    decoders = [t for t in supported_model_types() if t not in TEXT_CONFIG_WRAPPERS]
    render.model_types(render.make_console(), decoders, TEXT_CONFIG_WRAPPERS, REFUSED)
    if json_path is not None:
        render.write_json(json_path, {"schema_version": catalog_json.SCHEMA_VERSION, "read": decoders,
                                      "text_config_wrappers": TEXT_CONFIG_WRAPPERS, "refused": REFUSED}, force)


@models_app.command("show")
@user_errors
def models_show(model: ModelArg,
                seq_len: Annotated[int, typer.Option(help="Sequence length for FLOPs per token.")] = 4096,
                json_path: JsonOpt = None, force: ForceOpt = False) -> None:
    """Shape, exact parameter counts and FLOPs per token of one model."""
    if seq_len < 1:
        raise InputError(f"--seq-len expects a positive integer, got {seq_len}")
    render.prepare_json(json_path, force)
    spec = load_model(model)
    render.model_detail(render.make_console(), spec, seq_len)
    if json_path is not None:
        render.write_json(json_path, {"schema_version": catalog_json.SCHEMA_VERSION,
                                      "model": catalog_json.model_document(spec, seq_len)}, force)


@hardware_app.command("list")
@user_errors
def hardware_list(hardware: HardwareFileOpt = None, json_path: JsonOpt = None, force: ForceOpt = False) -> None:
    """Every GPU and cluster type: the built-in catalog and your hardware file's entries."""
    render.prepare_json(json_path, force)
    catalog = resolve_catalog(hardware)
    gpus = [catalog.gpus[name] for name in sorted(catalog.gpus)]
    clusters = [catalog.cluster(name, num_nodes=1) for name in sorted(catalog.clusters)]
    render.hardware_lists(render.make_console(), gpus, clusters, catalog.cluster_origins)
    if json_path is not None:
        render.write_json(json_path, {
            "schema_version": catalog_json.SCHEMA_VERSION, "gpus": [catalog_json.gpu_document(g) for g in gpus],
            "clusters": [catalog_json.cluster_document(c, catalog.cluster_origins[c.name]) for c in clusters]}, force)


@hardware_app.command("show")
@user_errors
def hardware_show(name: Annotated[str, typer.Argument(help="A GPU or cluster name from 'hardware list'.")],
                  hardware: HardwareFileOpt = None, json_path: JsonOpt = None, force: ForceOpt = False) -> None:
    """Every number of one GPU or cluster type, with its source."""
    render.prepare_json(json_path, force)
    console, catalog = render.make_console(), resolve_catalog(hardware)
    document: dict[str, Any] = {"schema_version": catalog_json.SCHEMA_VERSION}
    if name in catalog.gpus or (name not in catalog.clusters and looks_like_device_name(name)):
        gpu = catalog.gpu(name)  # a driver's product name resolves (or is refused) here
        render.gpu_detail(console, gpu)
        document["gpu"] = catalog_json.gpu_document(gpu)
    elif name in catalog.clusters:
        cluster = catalog.cluster(name, num_nodes=1)
        render.cluster_detail(console, cluster, catalog.cluster_origins[name])
        document["cluster"] = catalog_json.cluster_document(cluster, catalog.cluster_origins[name])
    else:
        known = sorted(catalog.gpus) + sorted(catalog.clusters)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise InputError(f"unknown GPU or cluster {name!r}{hint} (known: {', '.join(known)})")
    if json_path is not None:
        render.write_json(json_path, document, force)


@app.command()
@user_errors
def validate(json_path: JsonOpt = None, force: ForceOpt = False,
             memory_runs: Annotated[Path | None, typer.Option(
                 "--memory-runs", help="Measured memory runs (memory_runs.csv); default $PARAPLAN_MEMORY_RUNS or "
                 "../shared/calibration/memory_runs.csv. The memory section is skipped when none is found.")] = None,
             cross_source: Annotated[bool, typer.Option(
                 "--cross-source", help="Also refit the efficiency fractions with each source (and each table of "
                 "one) left out and predict it with constants it did not influence: in-sample beside left-out "
                 "error per source (about a minute more).")] = False,
             serving: Annotated[bool, typer.Option(
                 "--serving", help="Validate the serving cost model instead: predict TTFT and TPOT of the 5,221 "
                 "measured serving deployments (../shared/data/serving) and report per engine, GPU and mode.")] = False,
             serving_data: Annotated[Path | None, typer.Option(
                 "--serving-data", help="Folder with aiconfigurator_silicon_sample.csv and model_configs/; default "
                 "$PARAPLAN_SERVING_DATA or ../shared/data/serving.")] = None,
             ) -> None:
    """Predict every published reference run and report the error against its measurement."""
    from paraplan.validation.reference import load_reference_runs, predict_all, summarize  # pandas: this command only

    render.prepare_json(json_path, force)
    if serving:
        _serving_validation(json_path, force, serving_data)
        return
    memory = _memory_validation(memory_runs)
    frame = load_reference_runs()
    with render.working(render.make_console(stderr=True), f"predicting {len(frame)} reference runs"):
        predictions = predict_all(frame)
    held_out = _cross_source_validation(frame) if cross_source else None
    rows = [{"id": p.run_id, "source": p.source, "model": row["model"], "gpu": row["gpu"],
             "num_gpus": int(row["num_gpus"]), "measured_tokens_per_s_per_gpu": p.measured_tokens_per_s_per_gpu,
             "predicted_tokens_per_s_per_gpu": _finite(p.predicted_tokens_per_s_per_gpu),
             "error_frac": _finite(p.error_frac), "chosen": p.chosen}
            for p, (_, row) in zip(predictions, frame.iterrows())]
    groups = dict.fromkeys(p.group for p in predictions)
    summaries = {g: summarize([p for p in predictions if p.group == g]) for g in groups}
    summaries["all sources"] = summarize(predictions)
    render.validation(render.make_console(), rows, summaries)
    if memory is not None:
        render.memory_validation(render.make_console(), memory)
    if held_out is not None:
        render.cross_source_validation(render.make_console(), held_out)
    if json_path is not None:
        clean = {s: {k: _finite(v) for k, v in summary.items()} for s, summary in summaries.items()}
        render.write_json(json_path, {"schema_version": 1, "runs": rows, "summary": clean,
                                      "memory": memory, "cross_source": held_out}, force)


def _serving_validation(json_path: Path | None, force: bool, folder: Path | None) -> None:
    """``validate --serving``: the serving accuracy table (and its JSON)."""
    from paraplan.cli.render_serving import serving_validation
    from paraplan.validation.serving_runs import validate_serving, validation_document

    with render.working(render.make_console(stderr=True), "predicting the measured serving deployments"):
        document = validation_document(validate_serving(folder))
    serving_validation(render.make_console(), document)
    if json_path is not None:
        render.write_json(json_path, document, force)


def _cross_source_validation(frame) -> dict:
    """Leave-one-source-out (and leave-one-table-out) refits of the fitted fractions, as plain data."""
    from paraplan.validation import cross_source as cs  # only this flag pays for the refits

    console = render.make_console(stderr=True)
    with render.working(console, "cross-source refits: predicting the dense rows on a grid of constants") as status:
        def progress(done: int, total: int) -> None:
            if status is not None:
                status.update(f"cross-source refits: row {done} of {total} on a grid of constants")
        result = cs.cross_source(frame, progress)
    folds = [{"level": f.level, "left_out": f.name, "label": cs.short_label(f.level, f.name), "rows": f.rows, "in_sample": cs.summary(f.in_sample_errors),
              "left_out_error": cs.summary(f.left_out_errors),
              "moved": [{"constant": label, "shipped": shipped, "fold": fold} for label, shipped, fold in f.moved]}
             for f in result.folds]
    refit = [{"constant": c.label, "shipped": cs.shipped_value(c), "refit_on_all_rows": value}
             for c, value in sorted(result.all_rows_refit.items())]
    return {"rows": len(result.row_ids), "in_sample": cs.summary(result.in_sample_errors),
            "in_sample_refit": cs.summary(result.refit_errors),
            "left_out": {level: cs.summary(errors) for level, errors in result.left_out_errors.items()},
            "folds": folds, "refit_on_all_rows": refit,
            "method": "efficiency fractions refitted without the left-out rows (validation/cross_source.py); "
                      "in-sample = the shipped efficiency.yaml constants"}


def _memory_validation(path: Path | None) -> dict | None:
    """Measured memory rows beside their predictions, per-source summaries and the fit/OOM confusion
    table; None (with a note on stderr) when no measurements file is found and none was named."""
    from paraplan.validation.memory_runs import confusion, load_memory_runs, predict_memory_all, summarize_memory

    try:
        frame = load_memory_runs(path)
    except InputError:
        if path is not None:
            raise
        render.make_console(stderr=True).print("memory: no memory_runs.csv found (--memory-runs PATH); skipped")
        return None
    predictions = predict_memory_all(frame)
    rows = [{"id": p.run_id, "source": p.source, "metric": p.metric,
             "measured_bytes": _finite(p.measured_bytes), "predicted_bytes": _finite(p.predicted_bytes),
             "error_frac": _finite(p.error_frac) if p.metric not in ("fits", "oom") else None,
             "predicted_fits": p.predicted_fits, "out_of_scope": p.out_of_scope} for p in predictions]
    return {"runs": rows, "summary": summarize_memory(predictions), "fit_oom": confusion(predictions)}


def _finite(value: float) -> float | None:
    """JSON has no NaN: an infeasible prediction is null."""
    return value if math.isfinite(value) else None


def main() -> None:
    """Console-script entry point."""
    app()
