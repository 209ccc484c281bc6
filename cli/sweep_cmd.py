"""``paraplan sweep``: the best plan and its whole run at each GPU count and GPU type, and what each step up in
GPUs bought (planner/run/sweep.py)."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from paraplan.cli import render, render_run, run_flags
from paraplan.errors import InputError
from paraplan.hardware_profiles import Catalog
from paraplan.planner.job import TrainingJob
from paraplan.planner.plan import SCHEMA_VERSION, plan_to_json
from paraplan.planner.run.cost import RunOptions, run_document
from paraplan.planner.run.sweep import SweepPoint, batch_candidates, best_per_size, scaling, sweep_point
from paraplan.planner.search import OBJECTIVES

if TYPE_CHECKING:  # annotations only
    from paraplan.request import PlanRequest

_SWEEP = "Sweep"
SWEEP_SCHEMA_VERSION = 1
BATCH_NOTE = ("global batch co-tuned per point (the power of two in the range with the shortest run); the token "
              "budget is fixed: a larger batch changes convergence, which paraplan does not model")


def _gpu_names(text: str, catalog: Catalog) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    for name in names:
        catalog.gpu(name)  # an unknown name is one line naming the known ones
    return list(dict.fromkeys(names))


def _prices(text: str | None, gpus: list[str]) -> list[float | None]:
    """``--price-per-gpu-hour``: one price for every GPU type, or one per ``--gpu`` name in order."""
    if text is None:
        return [None] * len(gpus)
    parts = [part.strip() for part in text.split(",")]
    ok = all(re.fullmatch(r"[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?", part) for part in parts)
    if not ok or any(float(part) <= 0 for part in parts) or len(parts) not in (1, len(gpus)):
        raise InputError(f"--price-per-gpu-hour expects one positive price or one per --gpu name ({len(gpus)}), "
                         f"e.g. 2.5 or {','.join(['2.5'] * len(gpus))}; got {text!r}")
    return [float(parts[0])] * len(gpus) if len(parts) == 1 else [float(part) for part in parts]


def _batches(global_batch: int | None, batch_range: str | None) -> list[int]:
    if (global_batch is None) == (batch_range is None):
        raise InputError("give --global-batch N or --global-batch-range LOW:HIGH (e.g. 512:2048), one of them")
    if global_batch is not None:
        return [global_batch]
    assert batch_range is not None  # exactly one of the two was given (checked above)
    match = re.fullmatch(r"\s*([0-9]+)\s*:\s*([0-9]+)\s*", batch_range)
    if not match:
        raise InputError(f"--global-batch-range expects LOW:HIGH sequences (e.g. 512:2048), got {batch_range!r}")
    return batch_candidates(int(match.group(1)), int(match.group(2)))


def sweep(
    model: Annotated[str, typer.Argument(help="Preset name (see 'paraplan models list') or a config.json path.")],
    gpus: Annotated[str, typer.Option(help="GPU counts, a comma list, e.g. 1024,2048,4096,8192.",
                                      rich_help_panel=_SWEEP)],
    gpu: Annotated[str, typer.Option(help="GPU types, a comma list, e.g. h100-sxm,h200-sxm.", rich_help_panel=_SWEEP)],
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")],
    tokens: run_flags.TokensOpt = None, steps: run_flags.StepsOpt = None,
    global_batch: Annotated[int | None, typer.Option(help="Sequences per optimizer step (or --global-batch-range).")]
    = None,
    global_batch_range: Annotated[str | None, typer.Option(
        "--global-batch-range", help="LOW:HIGH: co-tune the batch per point over the powers of two in the range. "
                                     "The token budget stays fixed (convergence is not modelled).")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs per node (default 8).")] = None,
    engine: Annotated[str, typer.Option(help="megatron, deepspeed or torchtitan.")] = "megatron",
    precision: Annotated[str, typer.Option(help="GEMM precision: bf16, fp8 or fp4.")] = "bf16",
    objective: Annotated[str, typer.Option(help="throughput, cost or memory: ranks the plans of each point and "
                                                "marks the best GPU type per GPU count.")] = "throughput",
    top: Annotated[int, typer.Option(help="Plans per point.")] = 1,
    price: Annotated[str | None, typer.Option(
        "--price-per-gpu-hour", help="US dollars per GPU-hour: one for every GPU type or one per --gpu name; "
                                     "default: the catalog's sourced price.", rich_help_panel=_SWEEP)] = None,
    failure_rate: run_flags.FailureRateOpt = None, write_gbps: run_flags.WriteOpt = None,
    load_gbps: run_flags.LoadOpt = None, checkpoint: run_flags.ModeOpt = None, restart_s: run_flags.RestartOpt = None,
    hardware: Annotated[Path | None, typer.Option("--hardware", help="Your own hardware file.")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the sweep as JSON ('-': stdout).")]
    = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --json file.")] = False,
) -> None:
    """Best plan, days, dollars and goodput at each GPU count and type: where adding GPUs stops paying."""
    from paraplan.cli.train_flags import parse_ints
    from paraplan.hardware_profiles.user_file import resolve_catalog
    from paraplan.request import make_request, run_options, training_job

    counts = parse_ints("gpus", gpus)
    catalog = resolve_catalog(hardware)
    names, batches = _gpu_names(gpu, catalog), _batches(global_batch, global_batch_range)
    prices = _prices(price, names)
    options = run_options(tokens, steps, None, failure_rate, write_gbps, load_gbps, checkpoint, restart_s)
    if options is None:
        raise InputError("sweep needs the run's budget: --tokens N (e.g. 15e12) or --steps N")
    if objective not in OBJECTIVES or top < 1 or seq_len < 1:
        raise InputError(f"--objective expects {', '.join(OBJECTIVES)}, --top and --seq-len positive integers; got "
                         f"{objective!r}, {top}, {seq_len}")
    render.prepare_json(json_path, force)
    request = make_request(model, seq_len=seq_len, global_batch=batches[0], precision=precision, engine=engine,
                           gpu=names[0], gpus=counts[0], gpus_per_node=gpus_per_node)
    job = training_job(request)
    points, skipped = _points(request, job, counts, names, prices, catalog, objective, options, batches, top)
    if not points:
        raise InputError(f"no plan fits at any point of the sweep ({', '.join(map(str, counts))} x "
                         f"{', '.join(names)}); use more GPUs, a shorter sequence or a larger GPU")
    _show(points, skipped, objective, job, batches, global_batch_range)
    if json_path is not None:
        render.write_json(json_path, sweep_document(points, skipped, options, {
            "model": job.model.name, "gpus": counts, "gpu": names, "seq_len": seq_len,
            "global_batch": global_batch, "global_batch_range": global_batch_range, "engine": engine,
            "precision": precision, "objective": objective, "top": top}), force)



def _points(request: PlanRequest, job: TrainingJob, counts: list[int], names: list[str], prices: list[float | None],
            catalog: Catalog, objective: str, options: RunOptions, batches: list[int],
            top: int) -> tuple[list[SweepPoint], list[dict[str, Any]]]:
    """The best plans at each GPU count and type, and the points where none fits."""
    from paraplan.request import build_cluster, cost_inputs, with_price

    points: list[SweepPoint] = []
    skipped: list[dict[str, Any]] = []
    with render.working(render.make_console(stderr=True), "sweeping") as status:
        for count in counts:
            for name, unit_price in zip(names, prices):
                if status is not None:
                    status.update(f"sweeping: {count} x {name}")
                point = dataclasses.replace(request.cluster, gpu=name, gpus=count)
                cluster = with_price(build_cluster(point, catalog), unit_price)
                rates, learned, _ = cost_inputs(request, job, cluster)
                found = sweep_point(job, learned, {}, objective, rates, options, batches, top)
                points += found
                if not found:
                    skipped.append({"num_gpus": count, "gpu": name, "reason": "no plan fits"})
    return points, skipped


def _show(points: list[SweepPoint], skipped: list[dict], objective: str, job: TrainingJob, batches: list[int],
          batch_range: str | None) -> None:
    console = render.make_console()
    title = (f"{job.model.name}, seq {job.seq_len}, {job.precision}, {job.engine}: best plan per point by "
             f"{objective}; days and cost include checkpoints and failures (* = best GPU type at that count)")
    render_run.sweep_table(console, points, scaling(points), best_per_size(points, objective), title)
    for skip in skipped:
        console.print(f"{skip['num_gpus']} x {skip['gpu']}: {skip['reason']}")
    if batch_range is not None:
        console.print(f"{BATCH_NOTE}; tried {', '.join(map(str, batches))}", soft_wrap=True)
    reasons = dict.fromkeys(f"{p.gpu}: {p.run.usd_reason}" for p in points)
    for reason in reasons:
        console.print(f"price {reason}", soft_wrap=True, markup=False)


def sweep_document(points: list[SweepPoint], skipped: list[dict], options: RunOptions,
                   inputs: dict[str, Any]) -> dict[str, Any]:
    """``{"schema_version": 1, "kind": "sweep", "points": [...], "inputs": {...}}``: each point's plan is the plan
    JSON document ``plan --json`` writes, with its ``run`` block."""
    documents: list[dict[str, Any]] = [{"num_gpus": p.num_gpus, "gpu": p.gpu, "global_batch": p.global_batch,
                  "plan": plan_to_json(p.plan, p.cost_model, run_document(p.run, options))} for p in points]
    run_inputs = copy.deepcopy(documents[0]["plan"]["run"]["inputs"])
    run_inputs["sources"].pop("price")
    run_inputs["sources"].pop("energy")  # per GPU type: in each point's run block
    return {"schema_version": SWEEP_SCHEMA_VERSION, "kind": "sweep", "points": documents,
            "inputs": {**inputs, "run": run_inputs, "plan_schema_version": SCHEMA_VERSION,
                       **({"batch_note": BATCH_NOTE} if inputs.get("global_batch_range") else {})},
            "skipped": skipped}
