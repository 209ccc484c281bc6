"""Two terms of a training step, derived by hand: gradient clipping in the optimizer step, and what torchtitan's
op-level selective checkpointing reruns (both measured on one H100: tests/test_probe_step_time.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from paraplan.cost_models.compute import analytical_rates
from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.layer import layer_times
from paraplan.hardware_profiles import quick_cluster
from paraplan.planner.job import ParallelConfig, TrainingJob, configs_to_table
from paraplan.validation.memory_probe import probe_model

RATE = 5e14  # flop/s of a synthetic GEMM: t = 2mnk / RATE


def _job(engine: str, recompute: str) -> tuple[TrainingJob, ParallelConfig]:
    model = probe_model("llama3-1b")
    job = TrainingJob(model=model, seq_len=4096, global_batch=2, precision="bf16", engine=engine,
                      attention="flash")
    config = ParallelConfig(tp=1, pp=1, dp=1, cp=1, vpp=1, mbs=2, zero=3 if engine == "torchtitan" else 1,
                            recompute=recompute, sp=False, cp_comm="allgather")
    return job, config


def _flop_rates() -> object:
    """Rates whose GEMMs take 2mnk / RATE and whose memory-bound ops take nothing (no bytes, no launches)."""
    base = analytical_rates(quick_cluster("h100-sxm", 1).gpu, "bf16", "flash", "pytorch")
    return dataclasses.replace(base, gemm_time_fn=lambda m, n, k: 2.0 * np.asarray(m, dtype=float) * n * k / RATE,
                               memory_bytes_per_s=1e30, kernel_overhead_s=0.0)


def test_op_level_checkpointing_reruns_the_key_output_and_up_projections() -> None:
    """Llama 3.2 1B at 8,192 tokens: wk (2048 -> 512), wo (2048 -> 2048) and w3 (2048 -> 8192) forward again, the
    attention core not at all: 2 x 8192 x 2048 x (512 + 2048 + 8192) flop."""
    job, config = _job("torchtitan", "selective")
    model, work, rates = job.model, job.workload(), _flop_rates()
    cluster = quick_cluster("h100-sxm", 1)
    times = layer_times(model, work, configs_to_table([config]), rates, cluster)
    assert float(times.recompute_s[0]) == pytest.approx(2 * 8192 * 2048 * (512 + 2048 + 8192) / RATE, rel=1e-12)
    full = layer_times(model, work, configs_to_table([dataclasses.replace(config, recompute="full")]), rates, cluster)
    assert float(times.recompute_s[0]) < float(full.recompute_s[0])


def test_megatron_selective_recompute_still_reruns_the_attention_core_alone() -> None:
    job, config = _job("megatron", "selective")
    rates, cluster = _flop_rates(), quick_cluster("h100-sxm", 1)
    times = layer_times(job.model, job.workload(), configs_to_table([config]), rates, cluster)
    none = layer_times(job.model, job.workload(), configs_to_table([dataclasses.replace(config, recompute="none")]),
                       rates, cluster)
    gemms = 2 * 8192 * 2048 * (2048 + 2 * 512 + 2048 + 3 * 8192) / RATE  # every projection's forward
    assert float(times.recompute_s[0]) == pytest.approx(float(none.forward_compute_s[0]) - gemms, rel=1e-9)


def test_the_optimizer_step_reads_and_writes_42_bytes_a_parameter() -> None:
    """Adam 30 B (fp32 weight, gradient and moments read; weight, moments and the 16-bit copy written) and clipping
    12 B (the norm reads the fp32 gradient, the scaling reads and writes it), plus 8 launches, on one GPU."""
    job, config = _job("torchtitan", "none")
    cluster = quick_cluster("h100-sxm", 1)
    rates = analytical_rates(cluster.gpu, "bf16", "flash", "pytorch")
    result = estimate(job.model, cluster, job.workload(), configs_to_table([config]), rates)
    parameters = 1_498_482_688  # torchtitan's count on the probe (data/measured/torchtitan_step_split_h100.csv)
    expected = parameters * 42.0 / rates.memory_bytes_per_s + 8 * rates.kernel_overhead_s
    assert float(result.optimizer_s[0]) == pytest.approx(expected, rel=1e-6)
