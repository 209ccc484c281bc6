"""paraplan's own GPU measurements of torchtitan's memory, and its predictions of them.

``data/measured/torchtitan_memory_h100.csv`` holds what ``bench/gpu_memory_probe.py`` measured on one
H100 80GB HBM3 (PyTorch 2.11.0+cu130, torchtitan 0.2.2's model, op-level SAC, per-block compile and
FSDP2 applied as its ``parallelize_llama`` applies them, on a one-rank mesh) on 2026-11-24: allocated,
reserved and device peaks of Llama-3-shaped models, or ``oom`` where the step ran out of memory.
Configurations after the first ran in the same process and started with 0.55 GiB already reserved
(``reserved_at_start_gib``).

Which paraplan mechanisms these rows informed (they are not a left-out source for those): gradients
freed between steps (torchtitan's ``zero_grad``), the compiled loss, the allocator trimming its cache at
capacity. The allocator's fragmentation fraction was fitted on torchtitan's published rows only.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from io import StringIO
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.choices import Recompute
from paraplan.cost_models.estimate import EstimateTable, estimate
from paraplan.hardware_profiles import quick_cluster
from paraplan.hardware_profiles.run_factor import gpu_at_scale
from paraplan.hardware_profiles.units import BYTES_PER_GIB
from paraplan.model_specs.model_spec import ModelSpec
from paraplan.planner.job import ParallelConfig, TrainingJob, configs_to_table

# The probe's shapes as torchtitan's Llama 3 model builds them: (hidden, layers, heads, kv heads, ffn).
# torchtitan never ties the output projection to the embedding, so the 1B and 3B shapes are untied.
PROBE_SHAPES = {
    "llama3-1b": (2048, 16, 32, 8, 8192),
    "llama3-3b": (3072, 28, 24, 8, 8192),
    "llama3-8b-8l": (4096, 8, 32, 8, 14336),
}
PROBE_VOCAB = 128256
PROBE_GPU = "h100-sxm"
# The probe's activation-checkpointing modes as paraplan's recompute kinds for torchtitan.
PROBE_RECOMPUTE: dict[str, Recompute] = {"none": "none", "op": "selective", "full": "full"}


@dataclass(frozen=True, slots=True)
class ProbePrediction:
    """One probe row beside paraplan's prediction (GiB; NaN where the step ran out of memory)."""

    label: str
    measured_oom: bool
    compiled: bool
    allocated_gib: float
    predicted_allocated_gib: float
    reserved_gib: float
    predicted_reserved_gib: float
    predicted_fits: bool
    params: float
    predicted_params: int


def load_probe_rows() -> pd.DataFrame:
    """The measured rows shipped with paraplan."""
    text = resources.files("paraplan.data").joinpath("measured/torchtitan_memory_h100.csv").read_text()
    return pd.read_csv(StringIO(text), keep_default_na=False, na_values={"params": [""]})


def probe_model(shape: str) -> ModelSpec:
    """The probe's model as a paraplan spec (RMSNorm, SwiGLU, RoPE, no biases, untied output)."""
    hidden, layers, heads, kv_heads, ffn = PROBE_SHAPES[shape]
    return ModelSpec(name=f"{shape} (torchtitan)", model_type="llama", num_layers=layers, hidden_size=hidden,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads, ffn_size=ffn,
                     vocab_size=PROBE_VOCAB, gated_mlp=True, tied_embeddings=False, norm="rmsnorm",
                     norm_bias=False, qkv_bias=False, linear_bias=False, qk_norm=False, position="rope",
                     max_positions=131072, dropout=False)


def _probe_job(row: pd.Series) -> tuple[TrainingJob, ParallelConfig]:
    """The row's torchtitan job and layout: one GPU, FSDP (ZeRO-3) over one rank, cuDNN attention (torchtitan 0.2.2's
    SDPA wrapper puts CUDNN_ATTENTION first)."""
    compiled, batch = str(row["compile"]).lower() == "true", int(row["batch"])
    job = TrainingJob(model=probe_model(row["shape"]), seq_len=int(row["seq"]), global_batch=batch, precision="bf16",
                      engine="torchtitan", attention="fused", compiled=compiled, compiled_loss=compiled)
    config = ParallelConfig(tp=1, pp=1, dp=1, cp=1, vpp=1, mbs=batch, zero=3, recompute=PROBE_RECOMPUTE[row["ac"]],
                            sp=False, cp_comm="allgather")
    return job, config


def predict_probe_row(row: pd.Series) -> ProbePrediction:
    """Paraplan's torchtitan prediction at the row's configuration (``_probe_job``)."""
    job, config = _probe_job(row)
    model, compiled, batch = job.model, job.compiled, config.mbs
    est = estimate(model, quick_cluster(PROBE_GPU, 1), job.workload(), configs_to_table([config]))
    oom = row["error"] == "oom"
    measured = (np.nan, np.nan) if oom else (float(row["max_allocated_gib"]), float(row["max_reserved_gib"]))
    label = f"{row['shape']} seq {row['seq']} x {batch} ac={row['ac']}{' compiled' if compiled else ''}"
    return ProbePrediction(
        label=label, measured_oom=oom, compiled=compiled,
        allocated_gib=measured[0], predicted_allocated_gib=float(est.memory.allocated_bytes[0]) / BYTES_PER_GIB,
        reserved_gib=measured[1], predicted_reserved_gib=float(est.memory.reserved_bytes[0]) / BYTES_PER_GIB,
        predicted_fits=bool(est.fits[0]), params=float(row["params"]) if not oom else np.nan,
        predicted_params=model.total_params())


def probe_estimate(row: pd.Series, cost_model: str = "analytical", store: Path | None = None) -> EstimateTable:
    """Paraplan's estimate for one probe row, priced by ``cost_model`` (with the profile ``store``'s data for
    ``learned``, ``auto`` and ``measured``; ``measured`` falls back to paraplan's shipped tables), at the row's
    configuration as ``predict_probe_row`` builds it."""
    from paraplan.cost_models.learned.provider import compute_rates  # the store's readers: only when pricing steps

    job, config = _probe_job(row)
    cluster, work = quick_cluster(PROBE_GPU, 1), job.workload()
    gpu = gpu_at_scale(cluster.gpu, cluster.num_gpus)
    rates = compute_rates(cost_model, gpu, work.precision, work.attention, work.kernel_stack,
                          store if store is not None else Path("absent-store.sqlite"))
    return estimate(job.model, cluster, work, configs_to_table([config]), rates)


def predict_probe_step_s(row: pd.Series, cost_model: str = "analytical", store: Path | None = None) -> float:
    """Paraplan's step time (s) for one probe row (``probe_estimate``)."""
    return float(probe_estimate(row, cost_model, store).step_time_s[0])


SPLIT_COLUMNS = ("step_s", "fwd_s", "bwd_s", "clip_s", "opt_s")
"""Seconds of the whole step and of its parts (empty where the configuration ran out of memory)."""


def load_step_split_rows() -> pd.DataFrame:
    """The probe run again on 2026-11-27 (same GPU, stack and grid) with each step split by CUDA events into the
    forward with the loss (fwd_s), the backward (bwd_s), gradient clipping (clip_s) and the optimizer step (opt_s)."""
    text = resources.files("paraplan.data").joinpath("measured/torchtitan_step_split_h100.csv").read_text()
    frame = pd.read_csv(StringIO(text), keep_default_na=False, na_values={"params": [""]})
    return frame.assign(**{column: pd.to_numeric(frame[column], errors="coerce") for column in SPLIT_COLUMNS})


def predict_probe_all(frame: pd.DataFrame | None = None) -> list[ProbePrediction]:
    """Predict every probe row (the shipped probe measurements unless ``frame`` is given)."""
    frame = load_probe_rows() if frame is None else frame
    return [predict_probe_row(row) for _, row in frame.iterrows()]
