"""Attention-DP ranks agree on every step before they run it (``EngineTraits.dp_sync_s``): vLLM's DP ranks all-reduce
their token counts, SGLang's gather their batch shapes, TRT-LLM's gather their request counts. A deployment with
dp > 1 pays it once a step on top of the engine's step overhead; one with dp 1 never does. Exact relations, and the
fit that finds it (``validation.serving_runs``), by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from test_serving_mechanics import BF16, small_moe

from paraplan.cost_models.inference_step import Sharding
from paraplan.cost_models.serving import (
    ENGINE_TRAITS,
    aggregated,
    disaggregated,
    engine_decode_s,
    engine_step_overhead_s,
)
from paraplan.hardware_profiles import load_cluster
from paraplan.validation.serving_runs import (
    DP_SYNC_GRID_S,
    STEP_OVERHEAD_GRID_S,
    OverheadGrid,
    apply_constants,
    fit_constants,
)

SYNC_S = 3e-3
VLLM = replace(ENGINE_TRAITS["vllm"], step_overhead_s=2e-3, dp_sync_s=SYNC_S)
NO_SYNC = replace(VLLM, dp_sync_s=0.0)


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100", num_gpus=16)


def test_the_step_overhead_adds_the_sync_only_where_ranks_step_together():
    shard = Sharding.of(np.array([1.0, 2.0, 1.0, 8.0]), dp=np.array([1.0, 1.0, 4.0, 8.0]))
    assert engine_step_overhead_s(VLLM, shard).tolist() == [2e-3, 2e-3, 5e-3, 5e-3]
    assert engine_step_overhead_s(NO_SYNC, shard).tolist() == [2e-3] * 4


def test_a_decode_step_with_attention_dp_costs_exactly_one_sync_more(h100):
    model = small_moe()
    for dp in (2.0, 8.0):
        shard = Sharding.of(1, dp=dp, moe_ep=dp)
        synced = engine_decode_s(model, h100, VLLM, BF16, shard, 16, 2000)
        plain = engine_decode_s(model, h100, NO_SYNC, BF16, shard, 16, 2000)
        assert float(synced - plain) == pytest.approx(SYNC_S, rel=1e-12)


def test_without_attention_dp_the_sync_changes_nothing(h100):
    model, shard = small_moe(), Sharding.of(2, moe_ep=2)
    kw = dict(concurrency=np.array([4.0, 64.0]), isl=np.array([1000.0, 8000.0]), osl=np.array([500.0, 100.0]))
    synced = aggregated(model, h100, VLLM, BF16, shard, **kw)
    plain = aggregated(model, h100, NO_SYNC, BF16, shard, **kw)
    for name in ("ttft_steady_s", "ttft_burst_s", "tpot_steady_s", "tpot_burst_s"):
        assert np.array_equal(getattr(synced, name), getattr(plain, name)), name


def test_aggregated_tpot_grows_by_the_sync_of_every_step_it_waits_for(h100):
    """A decode step pays one sync; below one prompt a step (k = B/osl = 16/4000 per rank) a fraction of the steps
    prefill one prompt alone, itself one step: k·sync more, and the busiest of 2 vLLM ranks admits in a fraction
    min(1, 2k) of the steps (``busiest_admission_frac``), so TPOT grows by sync·(1 + 2k). The first wave's 16
    prompts a rank prefill 8 a step (8,192 tokens) in 2 steps, each paying one sync; a prompt's first token comes a
    mean 1.5 steps in, so it shares the GPU with 0.5 prefill steps more over its 3,999 later tokens
    (``burst_tpot_s``): its TPOT grows by sync·(1 + 0.5/3999)."""
    model, shard = small_moe(), Sharding.of(1, dp=2, moe_ep=2)
    kw = dict(concurrency=32.0, isl=1000.0, osl=4000.0)
    synced = aggregated(model, h100, VLLM, BF16, shard, **kw)
    plain = aggregated(model, h100, NO_SYNC, BF16, shard, **kw)
    k = 16.0 / 4000.0
    assert float(synced.tpot_steady_s - plain.tpot_steady_s) == pytest.approx(SYNC_S * (1 + 2 * k), rel=1e-9)
    assert float(synced.tpot_burst_s - plain.tpot_burst_s) == pytest.approx(SYNC_S * (1 + 0.5 / 3999), rel=1e-9)


def test_disaggregated_pools_each_pay_their_own(h100):
    """The decode pool runs attention DP and its TPOT grows by one sync; the prefill pool (dp 1) prefills as before."""
    model = small_moe()
    prefill, decode = Sharding.of(2, moe_ep=2), Sharding.of(1, dp=4, moe_ep=4)
    kw = dict(concurrency=16.0, prefill_workers=1.0, decode_workers=1.0, isl=1000.0, osl=500.0)
    synced = disaggregated(model, h100, VLLM, BF16, prefill, decode, **kw)
    plain = disaggregated(model, h100, NO_SYNC, BF16, prefill, decode, **kw)
    assert float(synced.tpot_steady_s - plain.tpot_steady_s) == pytest.approx(SYNC_S, rel=1e-12)
    assert float(synced.prefill_s) == float(plain.prefill_s)


def _synced_grid(sync_s: float) -> OverheadGrid:
    """Four vLLM rows measured at 10 ms: two without attention DP predicted 8 ms + the step overhead o, two with it
    predicted 5 ms + o + the sync d. The step overhead fits 2 ms on the first two alone only where d = 3 ms fits the
    other two exactly, so the fit must find (2 ms, 3 ms)."""
    overhead = np.asarray(STEP_OVERHEAD_GRID_S)[:, None]
    tpot = np.broadcast_to(np.array([8e-3, 8e-3, 5e-3, 5e-3]), (len(overhead), 4)) + overhead
    ttft = np.full_like(tpot, 0.1)
    synced = {name: np.stack([(tpot if "tpot" in name else ttft)[:, 2:] + (d if "tpot" in name else 0.0)
                              for d in DP_SYNC_GRID_S]) for name in ("tpot_steady_s", "tpot_burst_s",
                                                                     "ttft_steady_s", "ttft_burst_s")}
    rows = pd.DataFrame({"backend": "vllm", "reason": "", "mode": "agg", "silicon_tpot_ms": [10.0] * 4,
                         "silicon_ttft_ms": 100.0, "prefill_num_workers": np.nan, "decode_num_workers": np.nan})
    return OverheadGrid(rows=rows, tpot_steady_s=tpot, tpot_burst_s=tpot, ttft_steady_s=ttft, ttft_burst_s=ttft,
                        synced_rows=np.array([2, 3]), synced=synced)


def test_the_fit_finds_the_sync_and_applies_it_to_the_dp_rows_only():
    grid = _synced_grid(SYNC_S)
    constants = fit_constants(grid, np.ones(4, dtype=bool))
    assert constants.step_overhead_s["vllm"] == 2e-3 and constants.dp_sync_s == 3e-3
    predicted = apply_constants(grid, constants)
    assert predicted["tpot_pred_s"].to_numpy() == pytest.approx([10e-3] * 4, rel=1e-12)
    assert grid.column("tpot_steady_s", 0)[:, 2:] == pytest.approx(grid.tpot_steady_s[:, 2:])


@pytest.mark.parametrize("model, gpus, concurrency", [("deepseek-v3", 16, 256), ("llama-3.1-8b", 8, 32)])
def test_serve_states_the_host_time_of_each_plans_decode_step(tmp_path, model, gpus, concurrency):
    """``serve --json`` gives each plan's engine host time a decode step and the attention-DP sync within it: the
    engine's step overhead, plus the sync exactly where the decode pool runs attention DP; the table says so too."""
    import json

    from typer.testing import CliRunner

    from paraplan.cli.app import app

    out = tmp_path / "plan.json"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, [
        "serve", model, "--gpu", "h200-sxm", "--gpus", str(gpus), "--isl", "1024", "--osl", "1024",
        "--concurrency", str(concurrency), "--top", "3", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "engine host time a decode step" in result.output
    plans = json.loads(out.read_text())["plans"]
    for plan in plans:
        traits = ENGINE_TRAITS[plan["engine"]]
        estimate, decode = plan["estimate"], plan["pools"][-1]
        synced = decode["dp_attention"] > 1
        assert estimate["dp_sync_s"] == (traits.dp_sync_s if synced else 0.0)
        assert estimate["step_overhead_s"] == pytest.approx(traits.step_overhead_s + estimate["dp_sync_s"], rel=1e-12)
        # The TTFT's engine parts: the request overhead, and first_token_steps TPOTs at the mean TPOT.
        assert estimate["request_overhead_s"] == traits.request_overhead_s
        assert estimate["first_token_steps_s"] == pytest.approx(
            traits.first_token_steps * estimate["tpot_s"]["mean"], rel=1e-12)
        assert estimate["request_overhead_s"] + estimate["first_token_steps_s"] < estimate["ttft_s"]["mean"]
    assert "first-token steps" in result.output
    assert any(p["pools"][-1]["dp_attention"] > 1 for p in plans) == (model == "deepseek-v3")


def test_a_prefill_pool_slower_than_demand_holds_the_rest_of_the_concurrency(h100):
    """Closed loop (Little's law): one prefill rank serving a prompt in ``one`` seconds admits at most 1/one requests
    a second, so with C in flight a request spends C·one in all; its decode lifetime osl·step is the rest, and the
    prefill queue holds TTFT = C·one − osl·step (+ the KV transfer), above the open M/D/1 wait once C·one exceeds
    the lifetime. Below that the open queue stands."""
    from paraplan.cost_models.serving import kv_transfer_s

    model = small_moe()
    prefill, decode = Sharding.of(1), Sharding.of(1, dp=8, moe_ep=8)
    kw = dict(prefill_workers=1.0, decode_workers=1.0, isl=8000.0, osl=16.0)
    many = disaggregated(model, h100, NO_SYNC, BF16, prefill, decode, concurrency=256.0, **kw)
    transfer = float(kv_transfer_s(model, h100, BF16, prefill, 8000.0))
    one, lifetime = float(many.prefill_s), 16.0 * float(many.decode_step_s)
    assert float(many.running_batch) == 32.0  # every request fits: nothing queues at the decode pool
    assert 256.0 * one > 2.0 * lifetime  # saturated: the prefill rank is the bottleneck
    hops = NO_SYNC.first_token_steps * float(many.decode_step_s)  # the decode loop streams the first token
    assert float(many.ttft_steady_s) == pytest.approx(256.0 * one - lifetime + transfer + hops, rel=1e-9)
    few = disaggregated(model, h100, NO_SYNC, BF16, prefill, decode, concurrency=1.0, **kw)
    utilisation = 1.0 / (16.0 * float(few.decode_step_s)) * float(few.prefill_s)
    assert utilisation < 0.95  # one request in flight: the open queue's M/D/1 wait, not the closed loop's
    wait = utilisation * float(few.prefill_s) / (2.0 * (1.0 - utilisation))
    hops = NO_SYNC.first_token_steps * float(few.decode_step_s)
    assert float(few.ttft_steady_s) == pytest.approx(float(few.prefill_s) + wait + transfer + hops, rel=1e-9)
