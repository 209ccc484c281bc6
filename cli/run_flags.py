"""The run-level flags of ``plan``, ``evaluate`` and ``sweep``: a token budget or step count, a price, and the
failure and checkpoint model (planner/run/cost.py, planner/run/failures.py). Parsed here into RunOptions, in SI."""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated

import typer

from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.units import BYTES_PER_GB, SECONDS_PER_HOUR
from paraplan.planner.run import failures as fl
from paraplan.planner.run.cost import (
    DEFAULT_CHECKPOINT_BYTES_PER_S_PER_NODE,
    RunCost,
    RunOptions,
    run_cost,
    run_document,
)

_RUN = "Whole run (time, cost, goodput)"
_DEFAULT_RATE_PER_GPU_HOUR = fl.DEFAULT_FAILURES_PER_GPU_S * SECONDS_PER_HOUR
_DEFAULT_GBPS = DEFAULT_CHECKPOINT_BYTES_PER_S_PER_NODE / BYTES_PER_GB

TokensOpt = Annotated[float | None, typer.Option(
    "--tokens", help="Token budget of the whole run, e.g. 15e12 (or --steps): adds days, GPU-hours, dollars, energy "
                     "and goodput.", rich_help_panel=_RUN)]
StepsOpt = Annotated[int | None, typer.Option("--steps", help="Optimizer steps of the whole run (or --tokens).",
                                              rich_help_panel=_RUN)]
PriceOpt = Annotated[float | None, typer.Option(
    "--price-per-gpu-hour", help="US dollars per GPU-hour; default: the catalog's sourced price, if any "
                                 "('paraplan hardware show GPU').", rich_help_panel=_RUN)]
FailureRateOpt = Annotated[float | None, typer.Option(
    "--failure-rate-per-gpu-hour", help=f"Job-stopping failures per GPU-hour; default {_DEFAULT_RATE_PER_GPU_HOUR:.4g} "
    "(Llama 3 report: 419 unexpected interruptions in 54 days on 16,384 H100).", rich_help_panel=_RUN)]
WriteOpt = Annotated[float | None, typer.Option(
    "--checkpoint-write-gbps", help=f"Checkpoint write bandwidth per node, GB/s (the node's GPUs share it); default "
    f"{_DEFAULT_GBPS:.3g} (Llama 3's Tectonic file system: 2 TB/s over 2,048 nodes).", rich_help_panel=_RUN)]
LoadOpt = Annotated[float | None, typer.Option(
    "--checkpoint-load-gbps", help=f"Checkpoint read bandwidth per node at restart, GB/s; default {_DEFAULT_GBPS:.3g}.",
    rich_help_panel=_RUN)]
ModeOpt = Annotated[str | None, typer.Option(
    "--checkpoint", help="async (training stalls only to copy the shard to host memory; default) or sync (stalls for "
                         "the whole write).", rich_help_panel=_RUN)]
RestartOpt = Annotated[float | None, typer.Option(
    "--restart-s", help=f"Seconds from a failure to training again, checkpoint load excluded; default "
    f"{fl.DEFAULT_RESTART_S:g} (FlashRecovery, arXiv 2509.03047: a 4,800-device job restored in 150 s).",
    rich_help_panel=_RUN)]


def _check(flag: str, value: float | None, minimum: float, strict: bool, example: str) -> None:
    if value is None:
        return
    ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise InputError(f"{flag} expects a number {bound} (e.g. {example}), got {value:g}")


def run_options(tokens: float | None, steps: int | None, price: float | None, failure_rate: float | None,
                write_gbps: float | None, load_gbps: float | None, mode: str | None,
                restart_s: float | None) -> RunOptions | None:
    """The run the flags describe; None without a budget. InputError naming the flag for anything wrong."""
    if tokens is not None and steps is not None:
        raise InputError("give --tokens or --steps, not both (the steps follow from the tokens and the global batch)")
    _check("--tokens", tokens, 1.0, False, "15e12")
    _check("--steps", steps, 1.0, False, "100000")
    _check("--price-per-gpu-hour", price, 0.0, True, "2.5")
    _check("--failure-rate-per-gpu-hour", failure_rate, 0.0, False, "2e-5")
    _check("--checkpoint-write-gbps", write_gbps, 0.0, True, "1.0")
    _check("--checkpoint-load-gbps", load_gbps, 0.0, True, "1.0")
    _check("--restart-s", restart_s, 0.0, False, "150")
    if mode is not None and mode not in fl.CHECKPOINT_MODES:
        raise InputError(f"--checkpoint expects async or sync, got {mode!r}")
    given = [flag for flag, value in (("--failure-rate-per-gpu-hour", failure_rate), ("--checkpoint-write-gbps",
             write_gbps), ("--checkpoint-load-gbps", load_gbps), ("--checkpoint", mode), ("--restart-s", restart_s))
             if value is not None]
    if tokens is None and steps is None:
        if given:
            raise InputError(f"{given[0]} describes the whole run: add a budget, --tokens N (e.g. 15e12) or --steps N")
        return None
    set_flags = {"failures_per_gpu_s": None if failure_rate is None else failure_rate / SECONDS_PER_HOUR,
                 "restart_s": restart_s, "checkpoint_mode": mode,
                 "checkpoint_write_bytes_per_s_per_node": None if write_gbps is None else write_gbps * BYTES_PER_GB,
                 "checkpoint_load_bytes_per_s_per_node": None if load_gbps is None else load_gbps * BYTES_PER_GB}
    # Flags left out keep RunOptions' defaults (each with its source there).
    return RunOptions(tokens=tokens, steps=steps, price_usd_per_gpu_hour=price,
                      **{name: value for name, value in set_flags.items() if value is not None})


def with_price(cluster: ClusterSpec, price: float | None) -> ClusterSpec:
    """``cluster`` with its GPU priced at the user's ``price`` (what ``--objective cost`` ranks by)."""
    if price is None:
        return cluster
    gpu = dataclasses.replace(cluster.gpu, price_usd_per_gpu_hour=price,
                              sources={**cluster.gpu.sources, "price": "--price-per-gpu-hour"})
    return dataclasses.replace(cluster, gpu=gpu)


def plan_runs(plans: list, options: RunOptions | None) -> tuple[list[RunCost | None], list[dict | None]]:
    """Each plan's run and its plan-JSON ``run`` block (None and None without a budget)."""
    if options is None:
        return [None] * len(plans), [None] * len(plans)
    runs = [run_cost(plan, options) for plan in plans]
    return runs, [run_document(run, options) for run in runs]
