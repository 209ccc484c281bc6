"""Failures and checkpoints over a training run: the Young/Daly checkpoint interval, the work a failure
loses, and goodput (useful time over wall time).

The model is first order in the failure rate, as in Daly (2006, section 3): failures arrive as a Poisson
process at the job's rate (one GPU failing stops the synchronous job), each costs the restart, the
checkpoint load and the work since the last checkpoint that is safely on storage. Every formula here is
numpy, so one call prices one plan or an array of them. All times are seconds.

References:
  J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974.
  J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22(3):303-312, 2006 (equation 37).

"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from paraplan.arrays import Column, IntColumn
from paraplan.hardware_profiles.units import SECONDS_PER_HOUR

CheckpointMode = Literal["async", "sync"]
CHECKPOINT_MODES = ("async", "sync")

# The Llama 3 report (arXiv 2407.21783, section 3.3.4, Table 5): 466 job interruptions in a 54-day snapshot
# of the 405B run on 16,384 H100, 47 planned (automated maintenance, firmware upgrades) and 419 unexpected.
# Planned ones are scheduled at a checkpoint and lose no work, so the rate uses the 419 unexpected ones:
# 419 / (16,384 GPUs x 54 d x 24 h) = 419 / 21,233,664 GPU-hours = 1.973e-5 per GPU-hour (466 would give 2.195e-5).
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
LLAMA3_GPU_HOURS = 16_384 * 54 * 24
DEFAULT_FAILURES_PER_GPU_S = LLAMA3_UNEXPECTED_INTERRUPTIONS / LLAMA3_GPU_HOURS / SECONDS_PER_HOUR
FAILURE_SOURCE = ("Llama 3 report (arXiv 2407.21783, Table 5): 419 unexpected interruptions in 54 days on 16,384 "
                  "H100 = 1.973e-5 per GPU-hour (the 47 planned ones excluded)")
# FlashRecovery (arXiv 2509.03047, 2025) measures detection, restart and communication-group rebuild of a
# 4,800-accelerator training job at 150 s: an engineered fast restart, so a lower bound for most stacks. The
# checkpoint load is priced apart (from its bytes and the load bandwidth). Cross-check: the Llama 3 run kept
# more than 90% effective training time over 466 interruptions in 54 days, at most 0.1 x 54 x 86,400 / 466
# = 1,001 s lost per interruption, restart and lost work together.
DEFAULT_RESTART_S = 150.0
RESTART_SOURCE = ("FlashRecovery (arXiv 2509.03047): a 4,800-device job restored in 150 s (a fast restart; the "
                  "checkpoint load is added from its bytes)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpointing:
    """How a run checkpoints and recovers (SI units)."""

    failures_per_gpu_s: float
    """Failures that stop the job, per GPU and second of wall time (>= 0)."""
    restart_s: float
    """From a failure to the job running again, checkpoint load excluded, seconds."""
    write_s: float
    """Writing one checkpoint to storage, seconds (every rank writes its shard in parallel)."""
    load_s: float
    """Reading one checkpoint back at restart, seconds."""
    snapshot_s: float
    """Copying one rank's shard from GPU to host memory, seconds (the stall of an asynchronous checkpoint)."""
    mode: CheckpointMode
    """``async``: training stalls only for the snapshot and storage is written behind it; ``sync``: for the write."""

    def __post_init__(self) -> None:
        if self.mode not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoint mode must be one of {CHECKPOINT_MODES}, got {self.mode!r}")
        for name in ("failures_per_gpu_s", "restart_s", "write_s", "load_s", "snapshot_s"):
            value = getattr(self, name)
            if not value >= 0 or not np.isfinite(value):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    @property
    def stall_s(self) -> float:
        """Training time lost per checkpoint, seconds."""
        return self.snapshot_s if self.mode == "async" else self.write_s

    @property
    def lag_s(self) -> float:
        """How long after a checkpoint starts it becomes a recovery point (async: once the write is done), seconds."""
        return self.write_s if self.mode == "async" else 0.0


def job_mtbf_s(failures_per_gpu_s: Column, num_gpus: IntColumn) -> np.ndarray:
    """Mean time between failures of a synchronous job on ``num_gpus`` (inf without failures), seconds."""
    rate = np.asarray(failures_per_gpu_s, dtype=float) * num_gpus
    with np.errstate(divide="ignore"):
        return np.where(rate > 0, 1.0 / np.maximum(rate, 1e-300), np.inf)


def young_interval_s(stall_s: Column, mtbf_s: Column) -> Column:
    """Young (1974): the compute time between checkpoints that minimises lost time, sqrt(2 delta M), seconds."""
    return np.sqrt(2.0 * np.asarray(stall_s, dtype=float) * mtbf_s)


def daly_interval_s(stall_s: Column, mtbf_s: Column) -> np.ndarray:
    """Daly (2006, eq. 37): sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta for delta < 2M,
    else M. Equals Young's interval to first order when delta << M; inf when M is (no failures)."""
    stall, mtbf = np.asarray(stall_s, dtype=float), np.asarray(mtbf_s, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(np.isfinite(mtbf), stall / (2.0 * mtbf), 0.0)
        higher = np.sqrt(2.0 * stall * mtbf) * (1.0 + np.sqrt(ratio) / 3.0 + ratio / 9.0) - stall
    return np.where(ratio < 1.0, higher, mtbf)


def lost_per_failure_s(interval_s: Column, stall_s: Column, lag_s: Column, restart_s: Column,
                       load_s: Column) -> Column:
    """Expected time one failure costs: half a checkpoint period (interval + stall) of work, the extra ``lag``
    while the newest checkpoint is still being written (async), the restart and the load; seconds."""
    return (np.asarray(interval_s, dtype=float) + stall_s) / 2.0 + lag_s + restart_s + load_s


def wall_s(useful_s: Column, interval_s: Column, stall_s: Column, lost_s: Column, mtbf_s: Column) -> np.ndarray:
    """Wall time of ``useful_s`` of training (Daly 2006's first-order model): the checkpoint stalls stretch it by
    (1 + stall / interval) and failures, arriving once per ``mtbf_s`` of wall time, each cost ``lost_s``:
    W = useful (1 + stall / interval) / (1 - lost / M). inf when lost >= M: the job fails faster than it recovers."""
    useful = np.asarray(useful_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        period = np.asarray(interval_s, dtype=float)
        stretched = useful * (1.0 + np.where(np.isfinite(period) & (period > 0), stall_s / period, 0.0))
        left = 1.0 - np.where(np.isfinite(mtbf_s), lost_s / mtbf_s, 0.0)
        return np.where(left > 0, stretched / np.where(left > 0, left, 1.0), np.inf)


def checkpoint_interval_s(ckpt: Checkpointing, mtbf_s: float) -> float:
    """Daly's interval for this run's stall; an asynchronous write must end before the next snapshot starts."""
    interval = float(daly_interval_s(ckpt.stall_s, mtbf_s))
    return max(interval, ckpt.write_s) if ckpt.mode == "async" else interval
