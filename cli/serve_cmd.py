"""``paraplan serve``: the serving deployment that meets latency targets at the lowest cost, with launch files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from paraplan.cli.profile_cmd import StoreOpt
from paraplan.cli.train_flags import HardwareFileOpt
from paraplan.errors import InputError

_W, _D, _C = "Workload", "Deployment", "Cluster"
_GRID_AXES = ("tp", "pp", "ep", "dp_attention", "batch", "chunk")


def _axis_option(text: str) -> Any:
    """The typer option of a deployment axis flag (annotated ``str | None``): a comma list, searched when absent."""
    return typer.Option(help=text + " Comma list; default: searched.", rich_help_panel=_D)


def parse_length_dist(flag: str, text: str) -> float:
    """--isl-dist / --osl-dist: fixed, exponential or gamma:CV -> the lengths' coefficient of variation."""
    if text == "fixed":
        return 0.0
    if text == "exponential":
        return 1.0
    if text.startswith("gamma:"):
        try:
            return float(text.split(":", 1)[1])
        except ValueError:
            pass
    raise InputError(f"{flag} {text[:40]!r}: give fixed, exponential or gamma:CV (e.g. gamma:0.5)")


def _engines(engine: str | None, export: str | None) -> tuple[str, ...]:
    """The engines searched: as given, else the one an engine-named --export asks for, else all three."""
    from paraplan.cost_models.serving import ENGINES

    if engine is None:
        return (export,) if export in ENGINES else ENGINES
    engines = tuple(e.strip() for e in engine.split(","))
    if export in ENGINES and export not in engines:
        raise InputError(f"--export {export} writes {export} launch files but --engine searches only "
                         f"{', '.join(engines)[:60]}; add {export} to --engine or export k8s, json or all")
    return engines


def _counts(text: str | None) -> list[int] | None:
    """--gpus: GPU counts in the order of --gpu's types."""
    from paraplan.cli.train_flags import parse_ints

    return None if text is None else [parse_ints("--gpus", part)[0] for part in text.split(",")]


def _prices(text: str | None) -> list[float] | None:
    """--price-per-gpu-hour: one value, or one per --gpu type."""
    if text is None:
        return None
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise InputError(f"--price-per-gpu-hour {text[:40]!r}: non-negative USD, one value or one per --gpu "
                         "type") from None


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",")]


def _engine_versions(text: str | None) -> dict[str, str] | None:
    """--engine-version ENGINE=VERSION[,...] -> {engine: version}."""
    if text is None:
        return None
    pairs = [part.strip().partition("=") for part in text.split(",")]
    if any(not engine or not sep or not version for engine, sep, version in pairs):
        raise InputError(f"--engine-version {text[:60]!r}: give ENGINE=VERSION, comma separated (e.g. vllm=0.24.0)")
    return {engine.strip(): version.strip() for engine, _, version in pairs}


def _fixed_axes(values: dict[str, str | None]) -> dict[str, tuple[int, ...]]:
    from paraplan.cli.train_flags import parse_ints

    return {axis: tuple(parse_ints(f"--{axis.replace('_', '-')}", text)) for axis, text in values.items()
            if text is not None}


ModelOpt = Annotated[str, typer.Argument(help="Preset name, config.json path or cached Hugging Face repo id.")]
IslOpt = Annotated[int, typer.Option(help="Mean prompt (input) tokens per request.", rich_help_panel=_W)]
OslOpt = Annotated[int, typer.Option(help="Mean output tokens per request.", rich_help_panel=_W)]
GpuOpt = Annotated[str | None, typer.Option(help="GPU name (with --gpus); a comma list for several GPU types (a "
    "plan may mix them).",
    rich_help_panel=_C)]
GpusOpt = Annotated[str | None, typer.Option(help="GPUs available (the most a plan may use); one count per --gpu type.",
    rich_help_panel=_C)]
GpusPerNodeOpt = Annotated[int | None, typer.Option(help="GPUs per node with --gpu (default 8).", rich_help_panel=_C)]
ClusterOpt = Annotated[str | None, typer.Option(help="Built-in cluster name or cluster YAML.", rich_help_panel=_C)]
NodesOpt = Annotated[int | None, typer.Option(help="Nodes of the --cluster.", rich_help_panel=_C)]
IslDistOpt = Annotated[str, typer.Option(help="Prompt lengths: fixed, exponential or gamma:CV.", rich_help_panel=_W)]
OslDistOpt = Annotated[str, typer.Option(help="Output lengths: fixed, exponential or gamma:CV.", rich_help_panel=_W)]
ConcurrencyOpt = Annotated[int | None, typer.Option(help="Closed loop: requests in flight.", rich_help_panel=_W)]
RateOpt = Annotated[float | None, typer.Option(help="Open loop: requests per second.", rich_help_panel=_W)]
ArrivalOpt = Annotated[str, typer.Option(help="With --rate: poisson, gamma:CV (burstier for CV > 1) or trace:FILE "
    "(timestamps; --rate then rescales it).",
    rich_help_panel=_W)]
TtftMsOpt = Annotated[float | None, typer.Option(help="Time-to-first-token target (ms).", rich_help_panel=_W)]
TpotMsOpt = Annotated[float | None, typer.Option(help="Time-per-output-token target (ms).", rich_help_panel=_W)]
PercentileOpt = Annotated[int, typer.Option(help="Percentile the targets bind: 50, 90 or 99.", rich_help_panel=_W)]
EngineOpt = Annotated[str | None, typer.Option(help="vllm, sglang, trtllm; comma list (default: all three, or the "
    "one --export names).",
    rich_help_panel=_D)]
PrecisionOpt = Annotated[str, typer.Option(help="Weights: auto (the checkpoint's format), bf16, fp8 or fp4.",
    rich_help_panel=_D)]
KvDtypeOpt = Annotated[str, typer.Option(help="KV cache: auto (search bf16 and fp8), bf16 or fp8.", rich_help_panel=_D)]
ModeOpt = Annotated[str, typer.Option(help="agg (prefill and decode together), disagg (split pools) or both.",
    rich_help_panel=_D)]
ObjectiveOpt = Annotated[str, typer.Option(help="throughput (tokens/s per GPU), cost ($ per token) or latency.")]
PricePerGpuHourOpt = Annotated[str | None, typer.Option(
    help="USD per GPU-hour, one value or one per --gpu type (default: the catalog's).")]
TopOpt = Annotated[int, typer.Option(help="How many plans to show.")]
JsonPathOpt = Annotated[Path | None, typer.Option("--json", help="Write the serving plans as JSON ('-': stdout).")]
ExportOpt = Annotated[str | None, typer.Option(
    help="Write launch files of the best plan: vllm, sglang, trtllm, k8s, json or all.")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Folder for --export.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing --json file or exported files.")]
_E = "Engine"
MemoryFractionOpt = Annotated[float | None, typer.Option(
    help="The engine's memory fraction, in (0, 1], under its own rule: vLLM --gpu-memory-utilization (of all GPU "
    "memory), SGLang --mem-fraction-static (weights + KV), TRT-LLM free_gpu_memory_fraction (of what is free after "
    "weights). Default: each engine's.", rich_help_panel=_E)]
CudaGraphsOpt = Annotated[bool, typer.Option(
    "--cuda-graphs/--no-cuda-graphs", help="Decode with CUDA graphs (--no-cuda-graphs: vLLM --enforce-eager, SGLang "
    "--disable-cuda-graph, TRT-LLM cuda_graph_config null; each decode kernel then pays its host launch).",
    rich_help_panel=_E)]
SpeculativeOpt = Annotated[str | None, typer.Option(
    help="Speculative decoding: mtp (the model's MTP layers), eagle[:MODEL] (an EAGLE head) or draft:MODEL (a draft "
    "model); needs --spec-tokens and --acceptance.", rich_help_panel=_E)]
SpecTokensOpt = Annotated[int | None, typer.Option(help="Draft tokens per step (N >= 1).", rich_help_panel=_E)]
AcceptanceOpt = Annotated[float | None, typer.Option(
    help="Per-token acceptance probability A in [0, 1): a step emits (1 - A^(N+1))/(1 - A) tokens.",
    rich_help_panel=_E)]
_P = "Pricing"
ServeCostModelOpt = Annotated[str, typer.Option(
    "--cost-model", help="auto or analytical: the analytical serving model; measured: each engine's steps priced "
    "from the --store's aiconfigurator kernel tables of that engine on the GPU (GEMMs, MoE, attention, TP all-reduce) "
    "where they cover a term, analytical elsewhere (store: --store, $PARAPLAN_STORE or the default).",
    rich_help_panel=_P)]
EngineVersionOpt = Annotated[str | None, typer.Option(
    help="With --cost-model measured: the engine versions whose tables price it, ENGINE=VERSION comma list (e.g. "
    "vllm=0.24.0); default: the newest each engine has in the store.", rich_help_panel=_P)]
TpOpt = Annotated[str | None, _axis_option("Attention tensor parallel per worker.")]
PpOpt = Annotated[str | None, _axis_option("Pipeline stages per worker.")]
EpOpt = Annotated[str | None, _axis_option("Expert parallel (MoE).")]
DpAttentionOpt = Annotated[str | None, _axis_option("Attention data-parallel ranks (MoE).")]
BatchOpt = Annotated[str | None, _axis_option("Running-batch cap (max_num_seqs).")]
ChunkOpt = Annotated[str | None, _axis_option("Max batched tokens per step.")]


def serve(
    model: ModelOpt, isl: IslOpt, osl: OslOpt, gpu: GpuOpt = None, gpus: GpusOpt = None,
    gpus_per_node: GpusPerNodeOpt = None, cluster: ClusterOpt = None, nodes: NodesOpt = None,
    hardware: HardwareFileOpt = None, isl_dist: IslDistOpt = "fixed", osl_dist: OslDistOpt = "fixed",
    concurrency: ConcurrencyOpt = None, rate: RateOpt = None, arrival: ArrivalOpt = "poisson",
    ttft_ms: TtftMsOpt = None, tpot_ms: TpotMsOpt = None, percentile: PercentileOpt = 50, engine: EngineOpt = None,
    precision: PrecisionOpt = "auto", kv_dtype: KvDtypeOpt = "auto", mode: ModeOpt = "both", tp: TpOpt = None,
    pp: PpOpt = None, ep: EpOpt = None,
    dp_attention: DpAttentionOpt = None, batch: BatchOpt = None, chunk: ChunkOpt = None,
    objective: ObjectiveOpt = "throughput", price_per_gpu_hour: PricePerGpuHourOpt = None, top: TopOpt = 5,
    json_path: JsonPathOpt = None, export: ExportOpt = None, out: OutOpt = None, force: ForceOpt = False,
    memory_fraction: MemoryFractionOpt = None, cuda_graphs: CudaGraphsOpt = True, speculative: SpeculativeOpt = None,
    spec_tokens: SpecTokensOpt = None, acceptance: AcceptanceOpt = None, cost_model: ServeCostModelOpt = "auto",
    store: StoreOpt = None, engine_version: EngineVersionOpt = None,
) -> None:
    """Plan a serving deployment: engine, parallelism, batch and chunk limits, aggregated or disaggregated."""
    from paraplan.cli import render, render_serving
    from paraplan.cli.train_cmd import show_notes
    from paraplan.serving_api import serve as serve_api

    render.prepare_json(json_path, force)
    render_serving.check_export(export, out, force)
    if cluster is not None and gpus_per_node is not None:
        raise InputError("--gpus-per-node goes with --gpu; a --cluster fixes its own node size")
    fixed = _fixed_axes({"tp": tp, "pp": pp, "ep": ep, "dp_attention": dp_attention, "batch": batch, "chunk": chunk})
    with render.working(render.make_console(stderr=True), "searching serving deployments"):
        result = serve_api(
            model, isl=isl, osl=osl, gpu=_names(gpu), gpus=_counts(gpus), cluster=cluster, nodes=nodes,
            gpus_per_node=gpus_per_node, concurrency=concurrency, rate=rate, arrival=arrival,
            isl_cv=parse_length_dist("--isl-dist", isl_dist), osl_cv=parse_length_dist("--osl-dist", osl_dist),
            ttft_ms=ttft_ms, tpot_ms=tpot_ms, percentile=percentile, engines=_engines(engine, export),
            precision=precision, kv_dtypes=None if kv_dtype == "auto" else _names(kv_dtype),
            modes=None if mode == "both" else _names(mode), objective=objective,
            price_per_gpu_hour=_prices(price_per_gpu_hour), top=top, hardware=hardware,
            memory_fraction=memory_fraction, cuda_graphs=cuda_graphs, speculative=speculative,
            spec_tokens=spec_tokens, acceptance=acceptance, cost_model=cost_model, store=store,
            engine_versions=_engine_versions(engine_version), **fixed)
    show_notes(result.notes)
    console = render.make_console()
    render_serving.serving_plans(console, result.document, result.problem)
    for serving_cluster in result.problem.clusters:  # one per GPU type; a user-file GPU says where it is from
        render.hardware_origin(console, serving_cluster.gpu)
    if json_path is not None:
        render.write_json(json_path, result.document, force)
    if export is not None:
        assert out is not None  # check_export refused --export without -o before the search
        render_serving.export(result.document, export, out, force)
