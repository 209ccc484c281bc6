"""The run-level flags of ``plan``, ``evaluate`` and ``sweep``: a token budget or step count, a price, and the
failure and checkpoint model (planner/run/cost.py, planner/run/failures.py). ``paraplan.request.run_options`` turns
them into RunOptions, in SI."""

from __future__ import annotations

from typing import Annotated

import typer

from paraplan.hardware_profiles.units import BYTES_PER_GB, SECONDS_PER_HOUR
from paraplan.planner.run import failures as fl
from paraplan.planner.run.cost import (
    DEFAULT_CHECKPOINT_BYTES_PER_S_PER_NODE,
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
