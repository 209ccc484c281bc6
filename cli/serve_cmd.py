"""``paraplan serve``: the serving deployment that meets latency targets at the lowest cost, with launch files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.errors import InputError

_W, _D, _C = "Workload", "Deployment", "Cluster"
_GRID_AXES = ("tp", "pp", "ep", "dp_attention", "batch", "chunk")


def _axis(text: str):
    return Annotated[str | None, typer.Option(help=text + " Comma list; default: searched.", rich_help_panel=_D)]


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


def _clusters(cluster: str | None, nodes: int | None, gpu: str | None, gpus: str | None,
              gpus_per_node: int | None) -> tuple:
    """One cluster per GPU type: ``--gpu a,b --gpus n,m`` (or one --cluster)."""
    from paraplan.cli.app import make_cluster
    from paraplan.hardware_profiles.user_file import resolve_catalog

    catalog = resolve_catalog(None)
    names = [] if gpu is None else [g.strip() for g in gpu.split(",")]
    counts = None if gpus is None else _counts(gpus)
    if len(names) <= 1:
        total = None if counts is None else counts[0] if len(counts) == 1 else -1
        if total == -1:
            raise InputError(f"--gpus {gpus[:40]}: one count for one --gpu type")
        return (make_cluster(cluster, nodes, gpu, total, gpus_per_node, catalog),)
    if cluster is not None or counts is None or len(counts) != len(names):
        raise InputError(f"--gpu lists {len(names)} GPU types: give --gpus with one count each (e.g. --gpus "
                         f"{','.join(['8'] * len(names))}) and no --cluster")
    if len(set(names)) != len(names):
        raise InputError(f"--gpu {gpu[:60]}: each GPU type once")
    return tuple(make_cluster(None, None, name, n, gpus_per_node, catalog) for name, n in zip(names, counts))


def _counts(text: str) -> list[int]:
    """--gpus: GPU counts in the order of --gpu's types."""
    from paraplan.cli.app import parse_ints

    return [parse_ints("--gpus", part)[0] for part in text.split(",")]


def _prices(text: str | None, types: int) -> tuple[float | None, ...]:
    """--price-per-gpu-hour: one value for every type, or one per --gpu type; () = the catalog's."""
    if text is None:
        return ()
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not (v >= 0 and v < 1e6) for v in values) or len(values) not in (1, types):
        raise InputError(f"--price-per-gpu-hour {text[:40]!r}: non-negative USD, one value or one per --gpu type "
                         f"({types})")
    return tuple(values * types if len(values) == 1 else values)


def _fixed_axes(values: dict[str, str | None]) -> dict[str, tuple[int, ...]]:
    from paraplan.cli.app import parse_ints

    return {axis: tuple(parse_ints(f"--{axis.replace('_', '-')}", text)) for axis, text in values.items()
            if text is not None}


def serve(
    model: Annotated[str, typer.Argument(help="Preset name, config.json path or cached Hugging Face repo id.")],
    isl: Annotated[int, typer.Option(help="Mean prompt (input) tokens per request.", rich_help_panel=_W)],
    osl: Annotated[int, typer.Option(help="Mean output tokens per request.", rich_help_panel=_W)],
    gpu: Annotated[str | None, typer.Option(help="GPU name (with --gpus); a comma list for several GPU types (a "
                                                 "plan may mix them).", rich_help_panel=_C)] = None,
    gpus: Annotated[str | None, typer.Option(help="GPUs available (the most a plan may use); one count per --gpu "
                                                  "type.", rich_help_panel=_C)] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs per node with --gpu (default 8).",
                                                      rich_help_panel=_C)] = None,
    cluster: Annotated[str | None, typer.Option(help="Built-in cluster name or cluster YAML.", rich_help_panel=_C)] = None,
    nodes: Annotated[int | None, typer.Option(help="Nodes of the --cluster.", rich_help_panel=_C)] = None,
    isl_dist: Annotated[str, typer.Option(help="Prompt lengths: fixed, exponential or gamma:CV.",
                                          rich_help_panel=_W)] = "fixed",
    osl_dist: Annotated[str, typer.Option(help="Output lengths: fixed, exponential or gamma:CV.",
                                          rich_help_panel=_W)] = "fixed",
    concurrency: Annotated[int | None, typer.Option(help="Closed loop: requests in flight.", rich_help_panel=_W)] = None,
    rate: Annotated[float | None, typer.Option(help="Open loop: requests per second.", rich_help_panel=_W)] = None,
    arrival: Annotated[str, typer.Option(help="With --rate: poisson, gamma:CV (burstier for CV > 1) or trace:FILE "
                                              "(timestamps; --rate then rescales it).", rich_help_panel=_W)] = "poisson",
    ttft_ms: Annotated[float | None, typer.Option(help="Time-to-first-token target (ms).", rich_help_panel=_W)] = None,
    tpot_ms: Annotated[float | None, typer.Option(help="Time-per-output-token target (ms).", rich_help_panel=_W)] = None,
    percentile: Annotated[int, typer.Option(help="Percentile the targets bind: 50, 90 or 99.",
                                            rich_help_panel=_W)] = 50,
    engine: Annotated[str | None, typer.Option(help="vllm, sglang, trtllm; comma list (default: all three, or the "
                                                   "one --export names).", rich_help_panel=_D)] = None,
    precision: Annotated[str, typer.Option(help="Weights: auto (the checkpoint's format), bf16, fp8 or fp4.",
                                           rich_help_panel=_D)] = "auto",
    kv_dtype: Annotated[str, typer.Option(help="KV cache: auto (search bf16 and fp8), bf16 or fp8.",
                                          rich_help_panel=_D)] = "auto",
    mode: Annotated[str, typer.Option(help="agg (prefill and decode together), disagg (split pools) or both.",
                                      rich_help_panel=_D)] = "both",
    tp: _axis("Attention tensor parallel per worker.") = None, pp: _axis("Pipeline stages per worker.") = None,
    ep: _axis("Expert parallel (MoE).") = None, dp_attention: _axis("Attention data-parallel ranks (MoE).") = None,
    batch: _axis("Running-batch cap (max_num_seqs).") = None, chunk: _axis("Max batched tokens per step.") = None,
    objective: Annotated[str, typer.Option(help="throughput (tokens/s per GPU), cost ($ per token) or latency.")]
    = "throughput",
    price_per_gpu_hour: Annotated[str | None, typer.Option(help="USD per GPU-hour, one value or one per --gpu type "
                                                                "(default: the catalog's).")] = None,
    top: Annotated[int, typer.Option(help="How many plans to show.")] = 5,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the serving plans as JSON ('-': stdout).")]
    = None,
    export: Annotated[str | None, typer.Option(help="Write launch files of the best plan: vllm, sglang, trtllm, "
                                                    "k8s, json or all.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder for --export.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --json file or exported files.")]
    = False,
) -> None:
    """Plan a serving deployment: engine, parallelism, batch and chunk limits, aggregated or disaggregated."""
    from paraplan.cli import render, render_serving
    from paraplan.planner.serving_queue import parse_arrival
    from paraplan.planner.serving_rank import ServingProblem, search_serving
    from paraplan.planner.serving_space import KV_DTYPES, ServingChoices, ServingWorkload

    if top < 1:
        raise InputError(f"--top expects a positive integer, got {top}")
    if rate is not None and not rate > 0:
        raise InputError(f"--rate must be a positive number of requests per second, got {rate}")
    arrivals = parse_arrival(arrival, rate) if rate is not None or arrival != "poisson" else None
    workload = ServingWorkload(
        isl=isl, osl=osl, isl_cv=parse_length_dist("--isl-dist", isl_dist),
        osl_cv=parse_length_dist("--osl-dist", osl_dist), concurrency=concurrency, arrivals=arrivals,
        ttft_target_s=None if ttft_ms is None else ttft_ms / 1e3,
        tpot_target_s=None if tpot_ms is None else tpot_ms / 1e3, percentile=percentile)
    choices = ServingChoices(
        engines=_engines(engine, export), precision=precision,
        kv_dtypes=KV_DTYPES if kv_dtype == "auto" else tuple(kv_dtype.split(",")),
        modes=("agg", "disagg") if mode == "both" else tuple(mode.split(",")),
        fixed=_fixed_axes({"tp": tp, "pp": pp, "ep": ep, "dp_attention": dp_attention, "batch": batch,
                           "chunk": chunk}),
        objective=objective)
    clusters = _clusters(cluster, nodes, gpu, gpus, gpus_per_node)
    prices = _prices(price_per_gpu_hour, len(clusters))
    from paraplan.planner.serving_model import served_model

    served = served_model(model)
    render.route_human_output(json_path)
    if json_path is not None:
        render.check_writable(json_path, force)
    render_serving.check_export(export, out, force)
    problem = ServingProblem(model=served.spec, mixers=served.mixers, clusters=clusters, workload=workload,
                             choices=choices, prices_usd_per_gpu_hour=prices)
    with render.working(render.make_console(stderr=True), "searching serving deployments"):
        result = search_serving(problem, top)
    document = render_serving.document(served, problem, result)
    render_serving.serving_plans(render.make_console(), document, problem)
    if json_path is not None:
        render.write_json(json_path, document, force)
    if export is not None:
        render_serving.export(document, export, out, force)
