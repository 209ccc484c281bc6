"""``paraplan plan`` and ``paraplan evaluate``: parse the flags into a PlanRequest, call the library, render.

A ``--from`` job file or ``--config`` YAML is merged into the flags first (cli/from_file.py); the request then goes
to ``paraplan.api.plan_request`` / ``evaluate_request``, the calls ``paraplan.plan(...)`` / ``evaluate(...)`` make.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from paraplan.cli import calibrate_cmd, export_cmd, profile_cmd, render, render_run, report_cmd, run_flags
from paraplan.cli import from_file as job_file
from paraplan.cli.train_flags import (
    CP_COMM_HELP,
    SCHEDULE_HELP,
    TP_OVERLAP_HELP,
    AsyncTPOpt,
    AttentionOpt,
    BatchOpt,
    CapacityOpt,
    ClusterOpt,
    CompileOpt,
    ConfigOpt,
    ConventionOpt,
    DispatcherOpt,
    EngineOpt,
    ExportOpt,
    ExportOutOpt,
    ForceOpt,
    Fp8RecipeOpt,
    FromOpt,
    FusedExpertMlpOpt,
    GpuOpt,
    GpusOpt,
    HardwareFileOpt,
    HeadroomOpt,
    ImbalanceOpt,
    JobModelArg,
    JsonOpt,
    NodesOpt,
    ObjectiveOpt,
    PerNodeOpt,
    PlaceOpt,
    PrecisionOpt,
    ReportOpt,
    RoutingOpt,
    SeqLenOpt,
    TopOpt,
    axis_option,
    request_from_flags,
)

if TYPE_CHECKING:  # annotations only: the library loads when a command runs
    from paraplan.api import PlanResult
    from paraplan.choices import Objective
    from paraplan.planner.placement.refine import PlacementReport, PlacementRow

# The axis flags, named once (mypy takes no call as a type); ``Plan*`` are plan's help texts where evaluate's differ.
PlanTpOpt = Annotated[str | None, axis_option("Tensor parallel, e.g. 8 or 4,8.")]
TpOpt = Annotated[str | None, axis_option("Tensor parallel.")]
PpOpt = Annotated[str | None, axis_option("Pipeline parallel.")]
PlanDpOpt = Annotated[str | None, axis_option("Data parallel.")]
DpOpt = Annotated[str | None, axis_option("Data parallel (default: GPUs / (tp·pp·cp)).")]
CpOpt = Annotated[str | None, axis_option("Context parallel.")]
CpCommOpt = Annotated[str | None, axis_option(CP_COMM_HELP)]
EvalCpCommOpt = Annotated[str | None, axis_option(
    "How context parallelism moves K and V: p2p (ring), a2a (Ulysses), allgather, a2a+p2p (default: the engine's "
    "own, Megatron p2p, torchtitan allgather).")]
EpOpt = Annotated[str | None, axis_option("Expert parallel (MoE models).")]
EtpOpt = Annotated[str | None, axis_option("Expert tensor parallel (MoE).")]
VppOpt = Annotated[str | None, axis_option("Virtual pipeline stages.")]
MbsOpt = Annotated[str | None, axis_option("Micro-batch size.")]
PlanZeroOpt = Annotated[str | None, axis_option("ZeRO stages 0-3.")]
ZeroOpt = Annotated[str | None, axis_option(
    "ZeRO stage 0-3 (default 0; torchtitan with cp > 1: 3, the FSDP2 sharding it always runs there).")]
PlanRecomputeOpt = Annotated[str | None, axis_option(
    "none, selective, full, modules (comma list; modules = Megatron's --recompute-modules).")]
RecomputeOpt = Annotated[str | None, axis_option("none, selective, full or modules (Megatron's --recompute-modules).")]
PlanSpOpt = Annotated[str | None, axis_option("Sequence parallel: on, off or both.")]
SpOpt = Annotated[str | None, axis_option(
    "Sequence parallel: on or off (default off; on where the engine always runs it with tp > 1, torchtitan).")]
PlanOffloadOpt = Annotated[str | None, axis_option(
    "Layers whose activations go to host memory (Megatron --cpu-offloading-num-layers; pp = 1, no recompute).")]
OffloadOpt = Annotated[str | None, axis_option("Layers whose activations go to host memory (pp = 1, no recompute).")]
PpScheduleOpt = Annotated[str | None, axis_option(SCHEDULE_HELP)]
PlanTpOverlapOpt = Annotated[str | None, axis_option(TP_OVERLAP_HELP + " on, off or both.")]
TpOverlapOpt = Annotated[str | None, axis_option(TP_OVERLAP_HELP + " on or off.")]


def plan(
    ctx: typer.Context, model: JobModelArg = None, seq_len: SeqLenOpt = None, global_batch: BatchOpt = None,
    cluster: ClusterOpt = None, nodes: NodesOpt = None,
    gpu: GpuOpt = None, gpus: GpusOpt = None, gpus_per_node: PerNodeOpt = None, hardware: HardwareFileOpt = None,
    engine: EngineOpt = "megatron",
    attention: AttentionOpt = "auto", precision: PrecisionOpt = "bf16", flops_convention: ConventionOpt = "full",
    headroom: HeadroomOpt = 0.0, expert_imbalance: ImbalanceOpt = None, routing: RoutingOpt = None,
    capacity_factor: CapacityOpt = None, dispatcher: DispatcherOpt = "auto", compile_model: CompileOpt = False,
    async_tp: AsyncTPOpt = False, fp8_recipe: Fp8RecipeOpt = "tensorwise", fused_expert_mlp: FusedExpertMlpOpt = False,
    objective: ObjectiveOpt = "throughput", top: TopOpt = 5,
    json_path: JsonOpt = None, force: ForceOpt = False, export: ExportOpt = None, out: ExportOutOpt = None,
    place: PlaceOpt = False,
    tp: PlanTpOpt = None, pp: PpOpt = None, dp: PlanDpOpt = None, cp: CpOpt = None, cp_comm: CpCommOpt = None,
    ep: EpOpt = None, etp: EtpOpt = None, vpp: VppOpt = None, mbs: MbsOpt = None, zero: PlanZeroOpt = None,
    recompute: PlanRecomputeOpt = None, sp: PlanSpOpt = None, offload: PlanOffloadOpt = None,
    pp_schedule: PpScheduleOpt = None, tp_comm_overlap: PlanTpOverlapOpt = None,
    cost_model: profile_cmd.CostModelOpt = "auto", store: profile_cmd.StoreOpt = None,
    stack_profile: calibrate_cmd.StackProfileOpt = None, from_file: FromOpt = None, config: ConfigOpt = None,
    tokens: run_flags.TokensOpt = None, steps: run_flags.StepsOpt = None, price_per_gpu_hour: run_flags.PriceOpt = None,
    failure_rate_per_gpu_hour: run_flags.FailureRateOpt = None, checkpoint_write_gbps: run_flags.WriteOpt = None,
    checkpoint_load_gbps: run_flags.LoadOpt = None, checkpoint: run_flags.ModeOpt = None,
    restart_s: run_flags.RestartOpt = None, report: ReportOpt = None,
) -> None:
    """Search every parallel layout and show the fastest plans that fit."""
    from paraplan.api import plan_request

    flags = {name: value for name, value in locals().items() if name != "ctx"}
    if from_file is not None or config is not None:
        return plan(**job_file.merged(ctx, plan, from_file, config, searching=True))
    job_file.require(model=model, seq_len=seq_len, global_batch=global_batch)
    request = request_from_flags(flags, compare=job_file.file_layout(ctx))
    render.prepare_json(json_path, force)
    export_cmd.check_plan_export(export, out, request.engine, force)
    if report is not None:
        report_cmd.check_report_folder(report, force)
    with render.working(render.make_console(stderr=True), "searching parallel layouts"):
        result = plan_request(request)
    show_plans(result, request.objective)
    if json_path is not None:
        render.write_json(json_path, result.document, force)
    if export is not None:
        assert out is not None  # check_plan_export refused --export without -o before the search
        export_cmd.export_plan_document(result.documents[0], export, out, force)
    if report is not None:
        typer.echo(f"wrote {report_cmd.write_report(result.documents, report, force)}")
    return None


def evaluate(
    ctx: typer.Context, model: JobModelArg = None, seq_len: SeqLenOpt = None, global_batch: BatchOpt = None,
    tp: TpOpt = None, pp: PpOpt = None, cluster: ClusterOpt = None,
    nodes: NodesOpt = None, gpu: GpuOpt = None,
    gpus: GpusOpt = None, gpus_per_node: PerNodeOpt = None, hardware: HardwareFileOpt = None,
    engine: EngineOpt = "megatron",
    attention: AttentionOpt = "auto", precision: PrecisionOpt = "bf16", flops_convention: ConventionOpt = "full",
    headroom: HeadroomOpt = 0.0, expert_imbalance: ImbalanceOpt = None, routing: RoutingOpt = None,
    capacity_factor: CapacityOpt = None, dispatcher: DispatcherOpt = "auto", compile_model: CompileOpt = False,
    async_tp: AsyncTPOpt = False, fp8_recipe: Fp8RecipeOpt = "tensorwise", fused_expert_mlp: FusedExpertMlpOpt = False,
    dp: DpOpt = None, cp: CpOpt = "1", cp_comm: EvalCpCommOpt = None, ep: EpOpt = "1", etp: EtpOpt = "1",
    vpp: VppOpt = "1", mbs: MbsOpt = "1", zero: ZeroOpt = None, recompute: RecomputeOpt = "none", sp: SpOpt = None,
    offload: OffloadOpt = "0", pp_schedule: PpScheduleOpt = "1f1b", tp_comm_overlap: TpOverlapOpt = "off",
    json_path: JsonOpt = None, force: ForceOpt = False, cost_model: profile_cmd.CostModelOpt = "auto",
    store: profile_cmd.StoreOpt = None, stack_profile: calibrate_cmd.StackProfileOpt = None,
    from_file: FromOpt = None, config: ConfigOpt = None,
    tokens: run_flags.TokensOpt = None, steps: run_flags.StepsOpt = None, price_per_gpu_hour: run_flags.PriceOpt = None,
    failure_rate_per_gpu_hour: run_flags.FailureRateOpt = None, checkpoint_write_gbps: run_flags.WriteOpt = None,
    checkpoint_load_gbps: run_flags.LoadOpt = None, checkpoint: run_flags.ModeOpt = None,
    restart_s: run_flags.RestartOpt = None,
) -> None:
    """Predict step time, throughput and memory of one parallel configuration."""
    from paraplan.api import evaluate_request

    flags = {name: value for name, value in locals().items() if name != "ctx"}
    if from_file is not None or config is not None:
        return evaluate(**job_file.merged(ctx, evaluate, from_file, config, searching=False))
    job_file.require(model=model, seq_len=seq_len, global_batch=global_batch, tp=tp, pp=pp)
    request = request_from_flags(flags, extra_axes=job_file.fixed_extras(ctx))
    render.prepare_json(json_path, force)
    result = evaluate_request(request)
    show_notes(result.notes)
    console = render.make_console()
    render.evaluation(console, result.plan, result.capacity_bytes, result.cost_model)
    render.hardware_origin(console, result.cluster.gpu)
    render.calibration_note(console, result.document["plans"][0]["provenance"])
    if result.run is not None:
        render_run.run_breakdown(console, result.run)
    if json_path is not None:
        render.write_json(json_path, result.document, force)
    return None


def show_plans(result: PlanResult, objective: Objective) -> None:
    """A search's answer: the ranked plans, why the first wins, its run, the search's counts, the hardware's
    origin, the job file's own layout beside the best, and what placement found."""
    show_notes(result.notes)
    console, job, cluster = render.make_console(), result.job, result.cluster
    title = (f"{job.model.name} on {cluster.name} ({render.cluster_size(cluster)}), seq {job.seq_len}, "
             f"batch {job.global_batch}, {job.precision}, {job.engine}, {job.attention_kernel} attention; "
             f"best {len(result.plans)} by {objective}")
    render.plan_table(console, result.plans, result.capacity_bytes, title)
    render.why_best(console, result.plans, result.capacity_bytes, result.cost_model, objective)
    if result.runs[0] is not None:
        render_run.run_breakdown(console, result.runs[0])
    render.search_summary(console, result.rejected, result.considered, result.evaluated, result.fitting)
    render.hardware_origin(console, cluster.gpu)
    render.calibration_note(console, result.documents[0]["provenance"])
    if result.from_job is not None:
        job_file.show_comparison(render.make_console(), result.from_job)
    if result.placement is not None:
        show_placement(result.placement)


def show_notes(notes: tuple[str, ...]) -> None:
    """The library's notes, on stderr."""
    for note in notes:
        render.make_console(stderr=True).print(escape(note))


def show_placement(report: PlacementReport) -> None:
    """One row per placed plan, then the re-ranking placement made."""
    from rich.table import Table

    topology = report.topology
    table = Table(title=f"placement on {topology.name} ({topology.num_nodes} nodes, {', '.join(topology.gpu_types)})")
    for column in ("#", "search step s", "placed step s", "layers per stage", "note"):
        table.add_column(column, justify="left" if column in ("layers per stage", "note") else "right")
    for row in report.rows:
        table.add_row(str(row.rank), render.seconds(row.search_step_s), render.seconds(row.placed_step_s),
                      "-" if row.stage_layers is None else layers_text(row.stage_layers), placement_note(row))
    render.print_table(render.make_console(), table)
    if report.moves:
        render.make_console().print("re-ranked by the placed step time: " + ", ".join(
            f"#{before} -> #{after}" for before, after in report.moves) + " (the JSON and the export take the new #1)")


def placement_note(row: PlacementRow) -> str:
    """What placement did to one plan, in words."""
    if row.as_searched is not None:
        weakest, why = row.as_searched
        return f"every GPU at the {weakest} pace, as searched ({why})"
    if row.stage_types:
        assert row.pipeline_step_s is not None and row.fast_only is not None  # set with stage_types
        types = "/".join(gpu.split("-")[0] for gpu in row.stage_types)
        fast_type, fast_s = row.fast_only
        return (f"stages on {types} ({row.typed_status}); pipeline time per step: placed "
                f"{render.seconds(row.pipeline_step_s[0])} s, naive split {render.seconds(row.pipeline_step_s[1])} s, "
                f"{fast_type} only {'-' if fast_s is None else render.seconds(fast_s)} s")
    note = f"hosts {row.hosts_status}"
    if row.slowest_stage_s is not None:
        before, after = row.slowest_stage_s
        note += (f"; slowest stage {render.seconds(before)} -> {render.seconds(after)} s per micro-batch "
                 f"({row.split_status})")
    return note


def layers_text(layers: tuple[int, ...] | list[int]) -> str:
    """Layers per chunk, runs of equal counts written once: [4, 4, 4, 3] -> '4 x3, 3'."""
    runs = [(count, len(list(group))) for count, group in itertools.groupby(layers)]
    return ", ".join(f"{count} x{times}" if times > 1 else str(count) for count, times in runs)
