"""Memory predictions against measured runs (../shared/calibration/memory_runs.csv) and hand-derived
values of the memory model's new terms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paraplan.cost_models.device_memory import FRAGMENTATION_FRAC, non_torch_bytes, reserved_bytes
from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.memory import alternate_matmul_bytes_per_token, in_flight_chunks
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import ParallelConfig, TrainingJob, configs_to_table

SHARED = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "memory_runs.csv"
needs_shared = pytest.mark.skipif(not SHARED.is_file(), reason=f"{SHARED} absent: measured memory runs not available")


def test_op_level_checkpointing_keeps_every_other_matmul_by_hand():
    # Llama 3.1 8B, tp 1: input 4096 + Q 4096 + V 1024 + w1 14336 + w2 4096 + attention out 4096, all bf16,
    # plus a 4 B log-sum-exp per head (32 heads).
    model = load_model("llama-3.1-8b")
    assert float(alternate_matmul_bytes_per_token(model, 1, 1)) == 2 * (4096 * 3 + 1024 + 14336 + 4096) + 4 * 32


def test_interleaved_in_flight_chunks_follow_megatrons_warmup_count():
    # pp 4, vpp 8, 4 micro-batches: the last rank warms up (8 - 1)·4 = 28 chunks and holds 29; the first
    # would hold 3·2 + 28 + 1 = 35 but the step has only 32 chunks.
    assert float(in_flight_chunks(4, 8, 4, last_rank=True)) == 29
    assert float(in_flight_chunks(4, 8, 4, last_rank=False)) == 32
    # Without interleaving: pp − r micro-batches, at most m (Narayanan et al. 2021, 1F1B).
    assert float(in_flight_chunks(8, 1, 100, last_rank=False)) == 8
    assert float(in_flight_chunks(8, 1, 100, last_rank=True)) == 1
    # Korthikanti et al.'s first-stage factor p·(1 + (p − 1)/(p·v)) micro-batches = (p·v + p − 1) chunks.
    assert float(in_flight_chunks(8, 3, 64, last_rank=False)) == 8 * 3 + 8 - 1


def test_device_memory_is_reserved_plus_context_and_nccl():
    model = load_model("llama-3.1-8b")
    job = TrainingJob(model=model, seq_len=8192, global_batch=16, engine="torchtitan")
    config = ParallelConfig(tp=1, pp=1, dp=8, mbs=2, zero=3, recompute="selective")
    # torchtitan's own benchmark GPU (96 GB): on an 80 GB H100 the cache would be trimmed to capacity.
    mem = estimate(model, quick_cluster("h100-sxm-96gb", 8), job.workload(), configs_to_table([config])).memory
    # The fragmented activation peak plus the fp32 gradient shards created after it (4 B / param / 8 ranks).
    late_grads = 4 * model.total_params() / 8
    assert float(mem.reserved_bytes[0]) == pytest.approx(
        float(mem.allocated_bytes[0]) * (1 + FRAGMENTATION_FRAC["eager"]) + late_grads)
    # One data-parallel communicator beside the world one: 0.5 GiB context + 2 x 0.3 GiB NCCL.
    assert float(non_torch_bytes(1, 1, 8, 1, 1)) == pytest.approx(1.1 * 2**30)
    assert float(mem.peak_bytes[0]) == pytest.approx(float(mem.reserved_bytes[0]) + 1.1 * 2**30)
    compiled = TrainingJob(model=model, seq_len=8192, global_batch=16, engine="torchtitan", compiled=True)
    mem_c = estimate(model, quick_cluster("h100-sxm-96gb", 8), compiled.workload(), configs_to_table([config])).memory
    assert float(mem_c.allocated_bytes[0]) == float(mem.allocated_bytes[0])  # compile changes the cache only
    assert float(mem_c.reserved_bytes[0]) < float(mem.reserved_bytes[0])
    assert float(reserved_bytes(100.0, "compiled")) == pytest.approx(105.0)


def _predictions():
    from paraplan.validation.memory_runs import load_memory_runs, predict_memory_all
    return predict_memory_all(load_memory_runs(SHARED))


@needs_shared
def test_every_fit_and_oom_label_is_decided_right():
    labels = [p for p in _predictions() if not p.out_of_scope and p.metric in ("fits", "oom")]
    assert len(labels) >= 7
    assert all(p.label_right for p in labels), [p.run_id for p in labels if not p.label_right]


@needs_shared
@pytest.mark.parametrize("metric", ["reserved", "allocated", "activations", "states"])
def test_median_memory_error_per_metric_within_5_percent(metric):
    errors = np.array([abs(p.error_frac) for p in _predictions() if not p.out_of_scope and p.metric == metric])
    assert len(errors) >= 4
    assert np.median(errors) <= 0.05


@needs_shared
@pytest.mark.parametrize("metric", ["allocated", "activations", "states"])
def test_no_row_beyond_12_percent(metric):
    errors = {p.run_id: p.error_frac for p in _predictions() if not p.out_of_scope and p.metric == metric}
    assert max(abs(e) for e in errors.values()) <= 0.12, errors


# Reserved rows beyond 12%, each with its reason (test_no_reserved_row_beyond_12_percent is a strict xfail):
# tt24-11/12 (Llama 3.1 70B, FSDP 32 x TP 8, local batch 16, full AC, float8 + compile): -21%, -16%; the
# TP-sharded loss-parallel working set and async-TP buffers are not modelled. tt24-13 (405B, TP 8 x PP 8 x
# FSDP 8, 1F1B): -13%, its micro-batch count is assumed (8). tt24-18 (the same at CP 8, 262k tokens): -15%;
# what grows with the context-parallel degree at a fixed local sequence (75.3 -> 84.9 GiB from CP 1 to 8) is
# not modelled.
KNOWN_RESERVED_MISSES = {"tt24-11", "tt24-12", "tt24-13", "tt24-18"}


@needs_shared
def test_reserved_rows_beyond_12_percent_are_only_the_known_ones():
    beyond = {p.run_id for p in _predictions() if not p.out_of_scope and p.metric == "reserved"
              and abs(p.error_frac) > 0.12}
    assert beyond == KNOWN_RESERVED_MISSES


@needs_shared
@pytest.mark.xfail(strict=True, reason=f"{sorted(KNOWN_RESERVED_MISSES)} miss by more than 12% (see above)")
def test_no_reserved_row_beyond_12_percent():
    errors = [p.error_frac for p in _predictions() if not p.out_of_scope and p.metric == "reserved"]
    assert max(abs(e) for e in errors) <= 0.12


@needs_shared
def test_out_of_scope_rows_are_listed_with_a_reason():
    skipped = [p for p in _predictions() if p.out_of_scope]
    assert {p.run_id for p in skipped} >= {"ttune-03", "ttune-05", "ttune-06", "ttune-16"}
    assert all(len(p.out_of_scope) > 3 for p in skipped)
