"""The whole training run over one plan: steps, days, GPU-hours, dollars, energy, checkpoints and goodput.

A layer over a plan's step time (DESIGN.md section 9): pure functions of the plan and a few stated rates, so a
sweep is many plans. SI inside (seconds, bytes, joules, watts); dollars are US dollars. Failures and
checkpoints follow planner/run/failures.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paraplan.hardware_profiles.units import SECONDS_PER_HOUR
from paraplan.planner.run import failures as fl

if TYPE_CHECKING:
    from paraplan.planner.plan import Plan

# Checkpoint storage: the Llama 3 report (arXiv 2407.21783, section 3.3.1) trains on Tectonic, 240 PB on 7,500
# SSD servers, 2 TB/s sustained and 7 TB/s peak. Shared by the 2,048 nodes of the 16,384-GPU job (8 GPUs a node):
# 2e12 / 2,048 = 0.977 GB/s per node, used for writes and reads alike (the peak would read at 3.42 GB/s per node).
LLAMA3_NODES = 16_384 // 8
DEFAULT_CHECKPOINT_BYTES_PER_S_PER_NODE = 2e12 / LLAMA3_NODES
CHECKPOINT_SOURCE = ("Llama 3 report (arXiv 2407.21783, section 3.3.1): Tectonic parallel file system, 2 TB/s "
                     "sustained, shared by the job's 2,048 nodes = 0.977 GB/s per node")
# Energy: every GPU at its board power (the datasheet's maximum TDP) for the whole wall time. No measured busy
# fraction of a training run is shipped, so this is an upper bound on the GPUs' own energy (host, network and
# cooling are not counted).
DEFAULT_BUSY_FRAC = 1.0
BUSY_SOURCE = "upper bound: every GPU at its datasheet board power for the whole wall time (GPUs only, no PUE)"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """What a user states about the run beyond the plan (SI units)."""

    tokens: float | None = None
    """Token budget of the run; or ``steps``."""
    steps: int | None = None
    """Optimizer steps of the run; or ``tokens``."""
    price_usd_per_gpu_hour: float | None = None
    """The user's price per GPU-hour in US dollars; None: the catalog's."""
    failures_per_gpu_s: float = fl.DEFAULT_FAILURES_PER_GPU_S
    """Job-stopping failures per GPU and second (see planner/run/failures.py for the default's source)."""
    restart_s: float = fl.DEFAULT_RESTART_S
    """Restart after a failure, checkpoint load excluded, seconds."""
    checkpoint_write_bytes_per_s_per_node: float = DEFAULT_CHECKPOINT_BYTES_PER_S_PER_NODE
    """Storage write bandwidth per node, bytes/s (the node's GPUs share it)."""
    checkpoint_load_bytes_per_s_per_node: float = DEFAULT_CHECKPOINT_BYTES_PER_S_PER_NODE
    """Storage read bandwidth per node at restart, bytes/s."""
    checkpoint_mode: fl.CheckpointMode = "async"
    """``async`` (training stalls for the copy to host memory only) or ``sync`` (for the whole write)."""
    busy_frac: float = DEFAULT_BUSY_FRAC
    """Fraction of board power the GPUs draw over the wall time, 0-1."""

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.steps is None):
            raise ValueError("give a token budget or a step count, one of them")
        if self.tokens is not None and not (math.isfinite(self.tokens) and self.tokens >= 1):
            raise ValueError(f"the token budget must be a number >= 1, got {self.tokens!r}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"the step count must be a positive integer, got {self.steps!r}")
        positive = ("checkpoint_write_bytes_per_s_per_node", "checkpoint_load_bytes_per_s_per_node")
        for name in positive + (("price_usd_per_gpu_hour",) if self.price_usd_per_gpu_hour is not None else ()):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)!r}")
        for name in ("failures_per_gpu_s", "restart_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        if self.checkpoint_mode not in fl.CHECKPOINT_MODES:
            raise ValueError(f"checkpoint mode must be async or sync, got {self.checkpoint_mode!r}")
        if not 0 < self.busy_frac <= 1:
            raise ValueError(f"busy_frac must be in (0, 1], got {self.busy_frac!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCost:
    """One run over one plan; inf where the job fails faster than it recovers, None where a figure is unpriced."""

    num_steps: int
    """Optimizer steps."""
    num_tokens: float
    """Tokens trained (steps x tokens per step; a token budget rounds up to whole steps)."""
    useful_s: float
    """Steps x step time, seconds: the run without checkpoints or failures."""
    wall_s: float
    """Wall-clock time with checkpoint stalls and failures, seconds."""
    useful_gpu_s: float
    """GPU-seconds of useful work."""
    wall_gpu_s: float
    """GPU-seconds held over the wall time (what is paid for)."""
    usd: float | None
    """Dollars for the wall time; None without a price."""
    usd_reason: str
    """Where the price comes from, or why there are no dollars."""
    energy_j: float | None
    """GPU energy over the wall time, joules; None without a board power."""
    energy_reason: str
    """Where the board power and the busy fraction come from, or why there is no energy."""
    checkpoint_bytes_per_gpu: float
    """One rank's checkpoint shard (weights + optimizer states), bytes."""
    checkpoint: fl.Checkpointing
    """Write, load, snapshot and restart times and the mode."""
    job_mtbf_s: float
    """Mean time between job-stopping failures, seconds."""
    young_interval_s: float
    """Young's interval sqrt(2 stall M), seconds."""
    daly_interval_s: float
    """Daly's higher-order interval, seconds."""
    interval_s: float
    """The interval the run is costed with (Daly's; async: at least one write), seconds of training."""
    lost_per_failure_s: float
    """Expected seconds one failure costs (half a period, the async lag, restart, load)."""
    expected_failures: float
    """Failures expected over the wall time."""
    goodput_frac: float
    """Useful time over wall time, 0-1."""


def num_steps(options: RunOptions, tokens_per_step: int) -> int:
    """Steps of the run: the step count, or the token budget rounded up to whole steps."""
    if options.steps is not None:
        return options.steps
    assert options.tokens is not None  # RunOptions.__post_init__: a token budget or a step count, one of them
    return max(1, math.ceil(options.tokens / tokens_per_step - 1e-9))


def checkpointing(options: RunOptions, shard_bytes: float, gpus_per_node: int,
                  snapshot_bytes_per_s: float) -> fl.Checkpointing:
    """Write, load and snapshot times of one checkpoint: every rank's shard in parallel, the node's GPUs sharing
    its storage bandwidth; the snapshot at the GPU's own host-link rate."""
    node_bytes = shard_bytes * gpus_per_node
    return fl.Checkpointing(failures_per_gpu_s=options.failures_per_gpu_s, restart_s=options.restart_s,
                            write_s=node_bytes / options.checkpoint_write_bytes_per_s_per_node,
                            load_s=node_bytes / options.checkpoint_load_bytes_per_s_per_node,
                            snapshot_s=shard_bytes / snapshot_bytes_per_s, mode=options.checkpoint_mode)


def run_cost(plan: Plan, options: RunOptions) -> RunCost:
    """The run of ``options``' budget over ``plan``."""
    gpu, cluster = plan.cluster.gpu, plan.cluster
    tokens_per_step = plan.job.global_batch * plan.job.seq_len
    steps = num_steps(options, tokens_per_step)
    memory = plan.estimate["memory_breakdown_bytes"]
    shard = memory["weights_bytes"] + memory["optimizer_bytes"]
    snapshot_rate = gpu.host_link_bytes_per_s * gpu.efficiency.host_link_frac
    ckpt = checkpointing(options, shard, min(cluster.gpus_per_node, cluster.num_gpus), snapshot_rate)
    useful = steps * plan.estimate["step_time_s"]
    mtbf = float(fl.job_mtbf_s(ckpt.failures_per_gpu_s, cluster.num_gpus))
    interval = fl.checkpoint_interval_s(ckpt, mtbf)
    lost = float(fl.lost_per_failure_s(interval, ckpt.stall_s, ckpt.lag_s, ckpt.restart_s, ckpt.load_s))
    wall = float(fl.wall_s(useful, interval, ckpt.stall_s, lost, mtbf))
    usd, usd_reason = _dollars(plan, options, wall)
    energy, energy_reason = _energy(plan, options, wall)
    return RunCost(
        num_steps=steps, num_tokens=float(steps * tokens_per_step), useful_s=useful, wall_s=wall,
        useful_gpu_s=useful * cluster.num_gpus, wall_gpu_s=wall * cluster.num_gpus, usd=usd, usd_reason=usd_reason,
        energy_j=energy, energy_reason=energy_reason, checkpoint_bytes_per_gpu=shard, checkpoint=ckpt,
        job_mtbf_s=mtbf, young_interval_s=float(fl.young_interval_s(ckpt.stall_s, mtbf)),
        daly_interval_s=float(fl.daly_interval_s(ckpt.stall_s, mtbf)), interval_s=interval,
        lost_per_failure_s=lost, expected_failures=wall / mtbf if math.isfinite(wall) else math.inf,
        goodput_frac=useful / wall if math.isfinite(wall) else 0.0)


def price_of(plan: Plan, options: RunOptions) -> tuple[float | None, str]:
    """(US dollars per GPU-hour, where it comes from), or (None, why there is none)."""
    if options.price_usd_per_gpu_hour is not None:
        return options.price_usd_per_gpu_hour, "--price-per-gpu-hour"
    gpu = plan.cluster.gpu
    if gpu.price_usd_per_gpu_hour is not None:
        return gpu.price_usd_per_gpu_hour, gpu.sources.get("price", "catalog")
    return None, f"no price: the catalog has no sourced price for {gpu.name}; give --price-per-gpu-hour"


def _dollars(plan: Plan, options: RunOptions, wall: float) -> tuple[float | None, str]:
    price, reason = price_of(plan, options)
    if price is None:
        return None, reason
    return price * plan.cluster.num_gpus * wall / SECONDS_PER_HOUR, reason


def _energy(plan: Plan, options: RunOptions, wall: float) -> tuple[float | None, str]:
    gpu = plan.cluster.gpu
    if gpu.board_power_w is None:
        return None, f"no energy: the catalog has no sourced board power for {gpu.name}"
    busy = BUSY_SOURCE if options.busy_frac == DEFAULT_BUSY_FRAC else f"busy fraction {options.busy_frac:g}"
    return (gpu.board_power_w * options.busy_frac * plan.cluster.num_gpus * wall,
            f"{gpu.board_power_w:g} W board power ({gpu.sources.get('power', 'catalog')}); {busy}")


def run_document(run: RunCost, options: RunOptions) -> dict[str, Any]:
    """The plan JSON's ``run`` block: the numbers (SI; null where infinite or unpriced) and the inputs used."""
    ckpt = run.checkpoint
    inputs = {
        "tokens": options.tokens, "steps": options.steps, "checkpoint_mode": ckpt.mode,
        "failures_per_gpu_s": options.failures_per_gpu_s, "restart_s": options.restart_s,
        "checkpoint_write_bytes_per_s_per_node": options.checkpoint_write_bytes_per_s_per_node,
        "checkpoint_load_bytes_per_s_per_node": options.checkpoint_load_bytes_per_s_per_node,
        "busy_frac": options.busy_frac,
        "sources": {"failures": _source(options.failures_per_gpu_s, fl.DEFAULT_FAILURES_PER_GPU_S, fl.FAILURE_SOURCE),
                    "restart": _source(options.restart_s, fl.DEFAULT_RESTART_S, fl.RESTART_SOURCE),
                    "checkpoint_bandwidth": _source((options.checkpoint_write_bytes_per_s_per_node,
                                                     options.checkpoint_load_bytes_per_s_per_node),
                                                    (DEFAULT_CHECKPOINT_BYTES_PER_S_PER_NODE,) * 2, CHECKPOINT_SOURCE),
                    "price": run.usd_reason, "energy": run.energy_reason}}
    numbers = {"num_steps": run.num_steps, "num_tokens": run.num_tokens, "useful_s": run.useful_s,
               "wall_s": run.wall_s, "useful_gpu_s": run.useful_gpu_s, "wall_gpu_s": run.wall_gpu_s, "usd": run.usd,
               "energy_j": run.energy_j, "checkpoint_bytes_per_gpu": run.checkpoint_bytes_per_gpu,
               "checkpoint_write_s": ckpt.write_s, "checkpoint_load_s": ckpt.load_s,
               "checkpoint_snapshot_s": ckpt.snapshot_s, "checkpoint_stall_s": ckpt.stall_s,
               "job_mtbf_s": run.job_mtbf_s, "young_interval_s": run.young_interval_s,
               "daly_interval_s": run.daly_interval_s, "checkpoint_interval_s": run.interval_s,
               "lost_per_failure_s": run.lost_per_failure_s, "expected_failures": run.expected_failures,
               "goodput_frac": run.goodput_frac}
    return {**{k: _finite(v) for k, v in numbers.items()}, "inputs": inputs}


def _source(value: float | tuple[float, ...], default: float | tuple[float, ...], source: str) -> str:
    """``source`` where the user kept the default, else "user-set"."""
    return source if value == default else "user-set"


def _finite(value: float | None) -> float | None:
    """JSON has no inf: an unbounded figure (no failures, or a job that never finishes) is null."""
    return value if value is None or math.isfinite(value) else None
