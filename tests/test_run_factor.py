"""Kernel speed and the distributed-run factor (hardware_profiles/run_factor.py), with hand-derived values.

efficiency.yaml (the numbers these tests read): defaults bf16 0.78, fp8 0.62, fp4 0.5, fused attention 0.5, flash
0.35; fitted bf16 on H100 0.58 and A100 0.66; fitted fp8 H100 0.60, B200 0.50, GB200 0.56, GB300 0.66; fitted fused
attention H100 0.4, B200 0.4, GB200 0.3, GB300 0.5.
"""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.cost_models.compute import analytical_rates
from paraplan.hardware_profiles import catalog, load_gpu
from paraplan.hardware_profiles.run_factor import (
    efficiency_at_scale,
    gpu_at_scale,
    job_factors,
    run_factor,
    scale_share,
    transferred_factors,
)
from paraplan.hardware_profiles.specs import DEFAULTED


@pytest.mark.parametrize(("gpus", "share"), [(1, 0.0), (2, 4 / 7), (4, 6 / 7), (8, 1.0), (512, 1.0)])
def test_the_share_is_the_ring_share_against_eight_gpus(gpus: int, share: float) -> None:
    # (n-1)/n over 7/8: n=2 -> (1/2)/(7/8) = 4/7; n=4 -> (3/4)/(7/8) = 6/7.
    assert scale_share(gpus) == pytest.approx(share, abs=1e-12)


def test_a_fitted_fraction_splits_into_kernel_speed_and_its_own_factor() -> None:
    h100 = load_gpu("h100-sxm").efficiency
    assert efficiency_at_scale(h100, 8).gemm_peak_frac["bf16"] == pytest.approx(0.58)  # as fitted
    assert efficiency_at_scale(h100, 1).gemm_peak_frac["bf16"] == pytest.approx(0.78)  # the kernel: the default
    # 2 GPUs: 0.78 x (0.58 / 0.78)^(4/7) = 0.78 x exp(4/7 x ln 0.74359) = 0.65852
    assert efficiency_at_scale(h100, 2).gemm_peak_frac["bf16"] == pytest.approx(0.65852, abs=1e-4)
    assert efficiency_at_scale(h100, 1).attention_peak_frac["flash"] == pytest.approx(0.35)
    assert efficiency_at_scale(h100, 1).stack_gemm_peak_frac["pytorch"]["fp8"] == pytest.approx(0.62)


def test_a_fraction_above_its_default_is_its_own_kernel_speed() -> None:
    gb300 = load_gpu("gb300").efficiency  # fp8 fitted 0.66 > default 0.62: factor 1
    assert run_factor(0.66, 0.62) == 1.0
    assert efficiency_at_scale(gb300, 1).gemm_peak_frac["fp8"] == pytest.approx(0.66)
    assert efficiency_at_scale(gb300, 64).gemm_peak_frac["fp8"] == pytest.approx(0.66)


def test_a_defaulted_fraction_carries_the_median_factor_fitted_on_other_gpus() -> None:
    h200 = load_gpu("h200-sxm").efficiency  # no entry of its own: every fraction defaulted
    at_scale = efficiency_at_scale(h200, 64)
    # bf16: 0.78 x median(0.58/0.78, 0.66/0.78) = (0.58 + 0.66) / 2 = 0.62; fp16 and tf32 read bf16's factor.
    assert at_scale.gemm_peak_frac["bf16"] == pytest.approx(0.62)
    assert at_scale.gemm_peak_frac["fp16"] == pytest.approx(0.62)
    # fused attention: 0.5 x median(0.8, 0.8, 0.6, 1.0) = 0.5 x 0.8 = 0.4
    assert at_scale.attention_peak_frac["fused"] == pytest.approx(0.40)
    # fp8: 0.62 x median(0.60/0.62, 0.50/0.62, 0.56/0.62, 1) = 0.62 x (0.58/0.62) = 0.58
    assert at_scale.gemm_peak_frac["fp8"] == pytest.approx(0.58)
    one = efficiency_at_scale(h200, 1)
    assert (one.gemm_peak_frac["bf16"], one.attention_peak_frac["fused"]) == pytest.approx((0.78, 0.5))


def test_b200_keeps_its_fp8_fit_and_its_bf16_default_takes_the_transferred_factor() -> None:
    b200 = efficiency_at_scale(load_gpu("b200").efficiency, 8)
    assert b200.gemm_peak_frac["fp8"] == pytest.approx(0.50)
    assert b200.gemm_peak_frac["bf16"] == pytest.approx(0.62)


def test_every_published_run_is_priced_as_fitted() -> None:
    """From 8 GPUs on (every reference run), a fraction that is not defaulted is exactly efficiency.yaml's."""
    for name in catalog.gpu_names():
        spec = load_gpu(name).efficiency
        for gpus in (8, 3072):
            scaled = efficiency_at_scale(spec, gpus)
            for dtype, value in spec.gemm_peak_frac.items():
                if spec.origin(f"gemm_peak_frac.{dtype}") != DEFAULTED:
                    assert scaled.gemm_peak_frac[dtype] == pytest.approx(value), (name, dtype)
            for kernel, value in spec.attention_peak_frac.items():
                if spec.origin(f"attention_peak_frac.{kernel}") != DEFAULTED:
                    assert scaled.attention_peak_frac[kernel] == pytest.approx(value), (name, kernel)
            for stack, table in spec.stack_gemm_peak_frac.items():
                assert scaled.stack_gemm_peak_frac[stack] == pytest.approx(table), (name, stack)


def test_fractions_never_rise_with_more_gpus() -> None:
    for name in ("h100-sxm", "a100-sxm-80gb", "h200-sxm", "b200", "gb200", "mi300x"):
        series = [efficiency_at_scale(load_gpu(name).efficiency, n) for n in (1, 2, 3, 4, 6, 8, 16)]
        for dtype in series[0].gemm_peak_frac:
            values = [s.gemm_peak_frac[dtype] for s in series]
            assert np.all(np.diff(values) <= 1e-12), (name, dtype, values)


def test_transferred_factors_are_medians_per_kind() -> None:
    defaults = catalog.default_efficiency()
    factors = transferred_factors([("gemm_peak_frac.bf16", 0.39), ("gemm_peak_frac.bf16", 0.78),
                                   ("gemm_peak_frac.bf16", 0.585), ("attention_peak_frac.flash", 0.175)], defaults)
    assert factors[("gemm_peak_frac", "bf16")] == pytest.approx(0.75)  # median(0.5, 1.0, 0.75)
    assert factors[("attention_peak_frac", "flash")] == pytest.approx(0.5)
    assert factors[("gemm_peak_frac", "*")] == pytest.approx(0.75)


def test_the_cost_model_label_says_which_share_a_job_pays() -> None:
    one = analytical_rates(gpu_at_scale(load_gpu("h100-sxm"), 1), "bf16", "flash", "pytorch")
    assert one.source.endswith("fitted); one GPU: kernel fractions, no distributed-run factor)")
    # 0.78 of the 989.4 TFLOP/s bf16 peak on one GPU, 0.58 on eight.
    assert one.gemm_flops_per_s == pytest.approx(0.78 * load_gpu("h100-sxm").peak("bf16"))
    two = analytical_rates(gpu_at_scale(load_gpu("h100-sxm"), 2), "bf16", "flash", "pytorch")
    assert "2 GPUs: 0.57 of the distributed-run factor" in two.source
    eight = analytical_rates(gpu_at_scale(load_gpu("h100-sxm"), 8), "bf16", "flash", "pytorch")
    assert eight.source == analytical_rates(load_gpu("h100-sxm"), "bf16", "flash", "pytorch").source
    assert eight.gemm_flops_per_s == pytest.approx(0.58 * load_gpu("h100-sxm").peak("bf16"))


def test_a_one_gpu_job_is_priced_at_kernel_speed() -> None:
    """End to end: Llama-3.1-8B with the same work per GPU (8 micro-batches of one 4,096-token sequence) on one H100
    and on eight (FSDP). One GPU reads the kernel fractions and pays no collective, so its step is shorter; by no
    more than the kernels' own ratios allow (GEMMs 0.58/0.78 = 0.74, flash attention 0.18/0.35 = 0.51)."""
    from paraplan.api import evaluate_request
    from paraplan.request import make_request

    def step(gpus: int) -> tuple[float, str]:
        done = evaluate_request(make_request("llama-3.1-8b", gpu="h100-sxm", gpus=gpus, seq_len=4096,
                                             global_batch=8 * gpus, tp=1, pp=1, mbs=1, zero=0 if gpus == 1 else 3,
                                             engine="torchtitan"))
        return float(done.plan.estimate["step_time_s"]), done.cost_model

    one, label = step(1)
    eight, label8 = step(8)
    assert label.endswith("one GPU: kernel fractions, no distributed-run factor)")
    assert "distributed-run" not in label8
    assert 0.51 < one / eight < 0.85


def test_a_jobs_factors_are_those_of_the_fractions_it_reads() -> None:
    h100 = load_gpu("h100-sxm")
    # bf16 on PyTorch: 0.58 / 0.78; flash attention 0.18 / 0.35; fp8 on PyTorch reads its stack override 0.45 / 0.62.
    assert job_factors(h100, "bf16", "flash", "pytorch") == pytest.approx((0.58 / 0.78, 0.18 / 0.35))
    assert job_factors(h100, "fp8", "fused", "pytorch") == pytest.approx((0.45 / 0.62, 0.4 / 0.5))
    # Unfused attention runs at the bf16 GEMM fraction; H200 (defaulted) carries the transferred medians.
    assert job_factors(h100, "bf16", "unfused", "transformer_engine")[1] == pytest.approx(0.58 / 0.78)
    assert job_factors(load_gpu("h200-sxm"), "bf16", "fused", "transformer_engine") == pytest.approx((0.62 / 0.78,
                                                                                                       0.8))


def test_the_one_gpu_probe_at_kernel_fractions() -> None:
    """paraplan's H100 probe (14 torchtitan 0.2.2 steps that ran on one H100 with PyTorch 2.11, nothing fitted to
    them) under the default analytical cost model: median 6.8%, max 13.5% (39.0% and 55.1% at the fitted fractions
    before the run factor was split out; ``python bench/kernel_tables_accuracy.py --store none.sqlite``)."""
    from paraplan.validation.memory_probe import load_probe_rows, predict_probe_step_s

    rows = load_probe_rows()
    rows = rows[rows["error"] != "oom"]
    errors = np.array([predict_probe_step_s(r) / float(r["step_s"]) - 1.0 for _, r in rows.iterrows()])
    assert len(errors) == 14
    assert np.median(np.abs(errors)) <= 0.08 and np.max(np.abs(errors)) <= 0.15


def test_measured_kernels_pay_the_run_factor_of_a_distributed_job(tmp_path, monkeypatch) -> None:
    """``--cost-model measured`` on the shipped H100 tables: a covered GEMM on 8 GPUs takes its one-GPU measured
    time / (0.58 / 0.78), flash attention / (0.18 / 0.35); on 2 GPUs the factors to the power 4/7; a shape the
    table does not cover stays on the analytical roofline, whose fractions already carry the factor."""
    from pathlib import Path

    from paraplan.cost_models.compute import gemm_time_s
    from paraplan.cost_models.learned.provider import compute_rates

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    h100 = load_gpu("h100-sxm")

    def rates(gpus: int):
        return compute_rates("measured", gpu_at_scale(h100, gpus), "bf16", "flash", "pytorch", Path("none.sqlite"))

    one, two, eight = rates(1), rates(2), rates(8)
    covered = float(gemm_time_s(8192.0, 4096.0, 4096.0, one))
    assert float(gemm_time_s(8192.0, 4096.0, 4096.0, eight)) == pytest.approx(covered / (0.58 / 0.78))
    assert float(gemm_time_s(8192.0, 4096.0, 4096.0, two)) == pytest.approx(covered / (0.58 / 0.78) ** (4 / 7))
    heads = np.array([32.0])
    forward_one, backward_one, hit = one.attention_table_fn(heads, 4096, 128)
    forward_eight, backward_eight, _ = eight.attention_table_fn(heads, 4096, 128)
    assert bool(hit[0])
    assert float(forward_eight[0]) == pytest.approx(float(forward_one[0]) / (0.18 / 0.35))
    assert float(backward_eight[0]) == pytest.approx(float(backward_one[0]) / (0.18 / 0.35))
    # 1 x 1 x 1: below the table's smallest shape, so each is the roofline at its own (scaled) fractions.
    for gpus, measured in ((1, one), (8, eight)):
        roofline = analytical_rates(gpu_at_scale(h100, gpus), "bf16", "flash", "pytorch")
        assert float(gemm_time_s(1.0, 1.0, 1.0, measured)) == pytest.approx(float(gemm_time_s(1.0, 1.0, 1.0,
                                                                                              roofline)))
    assert "distributed-run factor 0.744 and 0.514 (8 GPUs)" in eight.source
    assert "distributed-run" not in one.source.split("analytical roofline")[0]
