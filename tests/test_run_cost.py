"""The whole run (planner/run/cost.py, planner/run/failures.py): hand-derived days, dollars and GPU-hours, Young/Daly
against their closed forms, goodput monotone in the failure rate, async at least as good as sync, and the cost
objective against throughput ranking."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from paraplan.cli import render_run
from paraplan.hardware_profiles import load_gpu, quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import TrainingJob
from paraplan.planner.json_schema import validate_own
from paraplan.planner.plan import plan_at, plan_schema, plan_to_json
from paraplan.planner.run import failures as fl
from paraplan.planner.run.cost import RunOptions, num_steps, run_cost, run_document
from paraplan.planner.run.sweep import best_per_size, sweep_point
from paraplan.planner.search import search
from paraplan.request import with_price

GB = 1e9
TOKENS_PER_STEP = 64 * 4096  # global batch 64 x seq 4096 = 262,144


@pytest.fixture(scope="module")
def job() -> TrainingJob:
    return TrainingJob(model=load_model("llama-3.1-8b"), seq_len=4096, global_batch=64)


@pytest.fixture(scope="module")
def h100x8():
    return quick_cluster("h100-sxm", 8, 8)


@pytest.fixture(scope="module")
def best(job, h100x8):
    result = search(job, h100x8)
    return plan_at(job, h100x8, result, int(result.ranked[0]), 1)


def hand_plan(best, step_time_s: float = 2.0, weights_gb: float = 1.0, optimizer_gb: float = 3.0):
    """``best`` with a round step time and model states (4 GB per GPU by default)."""
    memory = {**best.estimate["memory_breakdown_bytes"], "weights_bytes": weights_gb * GB,
              "optimizer_bytes": optimizer_gb * GB}
    return dataclasses.replace(best, estimate={**best.estimate, "step_time_s": step_time_s,
                                               "memory_breakdown_bytes": memory})


# -- days, dollars, GPU-hours, energy by hand ----------------------------------------------------------
def test_days_dollars_gpu_hours_and_energy_by_hand(best):
    # 1,000 steps of 262,144 tokens at 2 s on 8 H100 at $3/GPU-hour, no failures: 2,000 s = 0.023148 days,
    # 8 x 2,000 / 3,600 = 4.4444 GPU-hours, $13.333, 700 W x 8 x 2,000 s = 11.2 MJ.
    run = run_cost(hand_plan(best), RunOptions(tokens=1000 * TOKENS_PER_STEP, price_usd_per_gpu_hour=3.0,
                                               failures_per_gpu_s=0.0))
    assert run.num_steps == 1000 and run.num_tokens == 262_144_000
    assert run.useful_s == pytest.approx(2000.0) and run.wall_s == pytest.approx(2000.0)
    assert render_run.days(run.useful_s) == "0.0231"  # 2,000 s in days, as the breakdown prints it
    assert run.wall_gpu_s / 3600 == pytest.approx(4.44444, rel=1e-5)
    assert run.usd == pytest.approx(13.3333, rel=1e-5)
    assert run.energy_j == pytest.approx(11.2e6)
    assert run.goodput_frac == 1.0 and run.expected_failures == 0.0 and math.isinf(run.interval_s)


def test_a_token_budget_rounds_up_to_whole_steps_and_steps_are_taken_as_given():
    assert num_steps(RunOptions(tokens=1000 * TOKENS_PER_STEP + 1), TOKENS_PER_STEP) == 1001
    assert num_steps(RunOptions(tokens=1000 * TOKENS_PER_STEP), TOKENS_PER_STEP) == 1000
    assert num_steps(RunOptions(steps=7), TOKENS_PER_STEP) == 7


def test_checkpoint_times_by_hand(best):
    # 4 GB per GPU, 8 GPUs a node sharing 2 GB/s write, 4 GB/s read: write 16 s, load 8 s; the snapshot at the
    # H100's PCIe Gen5 64 GB/s x its host-link efficiency.
    gpu = load_gpu("h100-sxm")
    run = run_cost(hand_plan(best), RunOptions(steps=10, checkpoint_write_bytes_per_s_per_node=2 * GB,
                                               checkpoint_load_bytes_per_s_per_node=4 * GB))
    ckpt = run.checkpoint
    assert run.checkpoint_bytes_per_gpu == 4 * GB
    assert ckpt.write_s == pytest.approx(16.0) and ckpt.load_s == pytest.approx(8.0)
    assert ckpt.snapshot_s == pytest.approx(4 * GB / (64 * GB * gpu.efficiency.host_link_frac))
    assert ckpt.stall_s == ckpt.snapshot_s and ckpt.lag_s == ckpt.write_s


def test_no_price_or_power_gives_null_dollars_and_energy_with_the_reason(job):
    cluster = quick_cluster("l40s", 8, 8)  # the catalog has neither a sourced price nor a board power for it
    result = search(job, cluster)
    run = run_cost(plan_at(job, cluster, result, int(result.ranked[0]), 1), RunOptions(steps=100))
    assert run.usd is None and "--price-per-gpu-hour" in run.usd_reason
    assert run.energy_j is None and "board power" in run.energy_reason


def test_the_run_block_is_schema_valid_and_null_where_unbounded(best):
    options = RunOptions(steps=100, failures_per_gpu_s=0.0)
    document = plan_to_json(best, "analytical", run_document(run_cost(best, options), options))
    validate_own(document, plan_schema())
    assert document["run"]["checkpoint_interval_s"] is None and document["run"]["goodput_frac"] == 1.0


# -- Young / Daly ---------------------------------------------------------------------------------------
def test_young_and_daly_against_their_closed_forms():
    stall, mtbf = 60.0, 10_000.0
    young = math.sqrt(2 * 60 * 10_000)  # 1,095.445 s
    ratio = 60 / (2 * 10_000)
    daly = young * (1 + math.sqrt(ratio) / 3 + ratio / 9) - 60  # Daly 2006, eq. 37
    assert fl.young_interval_s(stall, mtbf) == pytest.approx(1095.4451, rel=1e-7)
    assert fl.daly_interval_s(stall, mtbf) == pytest.approx(daly, rel=1e-12)
    assert fl.daly_interval_s(stall, mtbf) == pytest.approx(1055.8103, rel=1e-7)  # 1,095.4451 x 1.0185908 - 60
    assert fl.daly_interval_s(30_000.0, 10_000.0) == 10_000.0  # delta >= 2M: checkpoint once per MTBF
    # vectorized: the array answer equals the one-at-a-time answers
    stalls, mtbfs = np.array([1.0, 60.0, 600.0, 30_000.0]), np.array([1e6, 1e4, 5e3, 1e4])
    assert np.allclose(fl.daly_interval_s(stalls, mtbfs), [fl.daly_interval_s(s, m) for s, m in zip(stalls, mtbfs)])


def test_daly_tends_to_young_when_the_stall_is_small_against_the_mtbf():
    assert fl.daly_interval_s(1.0, 1e9) / fl.young_interval_s(1.0, 1e9) == pytest.approx(1.0, abs=1e-4)


def test_wall_time_of_the_first_order_model_by_hand():
    # useful 1,000 s, interval 100 s, stall 10 s, lost (100 + 10) / 2 + 50 + 20 = 125 s, MTBF 1,000 s:
    # W = 1,000 x 1.1 / (1 - 0.125) = 1,257.142857 s.
    lost = fl.lost_per_failure_s(100.0, 10.0, 0.0, 50.0, 20.0)
    assert lost == 125.0
    assert fl.wall_s(1000.0, 100.0, 10.0, lost, 1000.0) == pytest.approx(1257.142857, rel=1e-9)
    assert math.isinf(fl.wall_s(1000.0, 100.0, 10.0, 1000.0, 1000.0))  # fails faster than it recovers


def test_the_default_failure_rate_is_llama3s_419_interruptions():
    # 419 / (16,384 x 54 x 24) per GPU-hour
    assert fl.DEFAULT_FAILURES_PER_GPU_S * 3600 == pytest.approx(419 / 21_233_664, rel=1e-12)
    assert fl.DEFAULT_FAILURES_PER_GPU_S * 3600 == pytest.approx(1.97328e-5, rel=1e-5)


# -- goodput ----------------------------------------------------------------------------------------------
RATES = st.floats(min_value=1e-7 / 3600, max_value=1e-3 / 3600)


@given(rate=RATES, factor=st.floats(min_value=1.01, max_value=20.0), mode=st.sampled_from(["async", "sync"]),
       write_gbps=st.floats(min_value=0.2, max_value=50.0))
def test_goodput_strictly_falls_as_the_failure_rate_rises(best, rate, factor, mode, write_gbps):
    plan = hand_plan(best)

    def goodput(r: float) -> float:
        return run_cost(plan, RunOptions(steps=100_000, failures_per_gpu_s=r, checkpoint_mode=mode,
                                         checkpoint_write_bytes_per_s_per_node=write_gbps * GB)).goodput_frac

    low, high = goodput(rate), goodput(rate * factor)
    assert 0 < low <= 1
    assert high < low


@given(rate=RATES, write_gbps=st.floats(min_value=0.2, max_value=50.0),
       restart_s=st.floats(min_value=0, max_value=3600))
def test_async_checkpointing_is_at_least_as_good_as_sync(best, rate, write_gbps, restart_s):
    plan = hand_plan(best)
    runs = {mode: run_cost(plan, RunOptions(steps=100_000, failures_per_gpu_s=rate, checkpoint_mode=mode,
                                            restart_s=restart_s, checkpoint_write_bytes_per_s_per_node=write_gbps * GB))
            for mode in ("async", "sync")}
    assert runs["async"].goodput_frac >= runs["sync"].goodput_frac
    assert runs["async"].checkpoint.stall_s < runs["sync"].checkpoint.stall_s


# -- the cost objective -------------------------------------------------------------------------------------
def test_cost_ranks_exactly_as_throughput_with_one_gpu_type_and_one_price(job, h100x8):
    priced = with_price(h100x8, 2.5)
    by_cost, by_speed = search(job, priced, objective="cost"), search(job, priced, objective="throughput")
    assert len(by_cost.ranked) > 10
    assert np.array_equal(by_cost.ranked, by_speed.ranked)


def test_cost_picks_the_cheaper_slower_gpu_type_when_prices_say_so(job):
    options = RunOptions(tokens=1e9)
    points = {}
    for name, price in (("h100-sxm", 2.0), ("h200-sxm", 10.0)):
        cluster = with_price(quick_cluster(name, 8, 8), price)
        (points[name],) = sweep_point(job, cluster, {}, "cost", None, options, [64])
    slow, fast = points["h100-sxm"], points["h200-sxm"]
    assert slow.run.wall_s > fast.run.wall_s  # the H200 is faster...
    assert slow.run.usd < fast.run.usd  # ...but at $10 against $2 per GPU-hour it costs more
    candidates = [slow, fast]
    assert best_per_size(candidates, "cost")[8] is slow
    assert best_per_size(candidates, "throughput")[8] is fast
    # equal prices: the faster type is also the cheaper one, so cost and throughput agree
    same = [sweep_point(job, with_price(quick_cluster(n, 8, 8), 3.0), {}, "cost", None, options, [64])[0]
            for n in ("h100-sxm", "h200-sxm")]
    assert best_per_size(same, "cost")[8] is best_per_size(same, "throughput")[8]


def test_the_checkpoint_bandwidth_is_credited_to_its_source_only_at_its_defaults(best):
    """Write and load are compared one by one: a slower write and a faster load that sum to the defaults are the
    user's numbers, not the Llama 3 file system's."""
    from paraplan.planner.run.cost import CHECKPOINT_SOURCE, DEFAULT_CHECKPOINT_BYTES_PER_S_PER_NODE

    def source(write: float, load: float) -> str:
        options = RunOptions(tokens=10 * TOKENS_PER_STEP, checkpoint_write_bytes_per_s_per_node=write,
                             checkpoint_load_bytes_per_s_per_node=load)
        document = run_document(run_cost(hand_plan(best), options), options)
        return document["inputs"]["sources"]["checkpoint_bandwidth"]
    default = DEFAULT_CHECKPOINT_BYTES_PER_S_PER_NODE
    assert source(default, default) == CHECKPOINT_SOURCE
    assert source(0.5 * default, 1.5 * default) == "user-set"
