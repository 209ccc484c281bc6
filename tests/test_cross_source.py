"""Leave-one-source-out refits of the efficiency fractions (validation/cross_source.py, validate --cross-source).

The mechanics are checked on hand-built grids whose optimum is known; the figures on the shipped reference
runs (one slow run of ``paraplan validate --cross-source``) are guarded per source, and the issue's overall
target for the left-out-source median (<= 6%) is a strict xfail until the model meets it.
"""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.hardware_profiles import catalog
from paraplan.validation import cross_source as cs
from paraplan.validation.reference import load_reference_runs

H100_BF16 = cs.Constant("h100-sxm", cs.GEMM_FIELD, "bf16")
H100_FP8 = cs.Constant("h100-sxm", cs.GEMM_FIELD, "fp8")
H100_PYTORCH_FP8 = cs.Constant("h100-sxm", cs.STACK_FIELD, "fp8", "pytorch")
H100_FLASH = cs.Constant("h100-sxm", cs.ATTENTION_FIELD, "flash")
GB200_FP8 = cs.Constant("gb200", cs.GEMM_FIELD, "fp8")


def _row(**fields) -> pd.Series:
    return pd.Series({"gpu": "h100-sxm", "engine": "megatron", "precision": "bf16", "attention": "fused"} | fields)


# -- which constants a row reads --------------------------------------------------------------------------------
def test_gpus_of_one_chip_share_one_entry_and_gpus_without_one_read_the_defaults():
    assert cs.chip_entry("a100-sxm-40gb") == "a100-sxm-80gb"  # same silicon, identical constants
    assert cs.chip_entry("h800-sxm") == "h100-sxm"
    assert cs.chip_entry("gb200") == "gb200"
    assert cs.chip_entry("b300") == "*"  # no efficiency.yaml entry
    assert set(cs.entry_members("a100-sxm-80gb")) == {"a100-sxm-80gb", "a100-sxm-40gb"}


def test_a_row_reads_the_override_of_its_stack_else_the_shared_fraction():
    gemm, attention = cs.row_constants(_row(engine="torchtitan", precision="fp8", attention="flash"))
    assert (gemm, attention) == (H100_PYTORCH_FP8, H100_FLASH)
    assert cs.row_constants(_row(precision="fp8"))[0] == H100_FP8  # Megatron: Transformer Engine, no override
    assert cs.row_constants(_row(engine="torchtitan", attention="flash"))[0] == H100_BF16  # no bf16 override


def test_unfused_attention_adds_no_constant_and_reads_the_16_bit_gemm_fraction():
    assert cs.row_constants(_row(gpu="a100-sxm-40gb", engine="deepspeed", attention="unfused")) == (
        cs.Constant("a100-sxm-80gb", cs.GEMM_FIELD, "bf16"), None)


def test_fitted_constants_are_the_entries_own_fractions_once_per_chip():
    fitted = cs.fitted_constants()
    assert H100_PYTORCH_FP8 in fitted and GB200_FP8 in fitted
    assert not any(c.gpu in ("h800-sxm", "a100-sxm-40gb") for c in fitted)  # copies of h100 / a100-80
    assert cs.shipped_value(H100_PYTORCH_FP8) == 0.45 and cs.shipped_value(H100_FLASH) == 0.18


# -- running with other constants -------------------------------------------------------------------------------
def test_with_constants_and_without_overrides_change_only_what_they_name():
    spec = catalog.efficiency_of("h100-sxm")[0]
    changed = cs.with_constants(spec, {H100_FP8: 0.5, H100_FLASH: 0.25})
    assert (changed.gemm_peak_frac["fp8"], changed.attention_peak_frac["flash"]) == (0.5, 0.25)
    assert changed.gemm_peak_frac["bf16"] == spec.gemm_peak_frac["bf16"]
    assert changed.stack_gemm_peak_frac == spec.stack_gemm_peak_frac
    assert cs.without_overrides(spec, [H100_PYTORCH_FP8]).stack_gemm_peak_frac == {}


def test_catalog_efficiency_applies_to_every_gpu_of_the_chip_and_is_restored_even_on_error():
    before = {name: catalog.load_gpu(name) for name in ("a100-sxm-80gb", "a100-sxm-40gb")}
    spec = cs.with_constants(catalog.efficiency_of("a100-sxm-80gb")[0],
                             {cs.Constant("a100-sxm-80gb", cs.GEMM_FIELD, "bf16"): 0.31})
    with pytest.raises(RuntimeError), cs.catalog_efficiency({"a100-sxm-80gb": spec}):
        assert catalog.load_gpu("a100-sxm-40gb").efficiency.gemm_peak_frac["bf16"] == 0.31
        raise RuntimeError
    assert {name: catalog.load_gpu(name) for name in before} == before


def test_a_faster_gemm_fraction_predicts_a_faster_reference_row():
    runs = load_reference_runs()
    row = runs[runs.id == "megatron2021_t1_03"].iloc[0]  # 7.5B, tp 4, unfused attention: GEMM-bound
    gemm, _ = cs.row_constants(row)
    base = catalog.efficiency_of(gemm.gpu)[0]
    speeds = []
    for fraction in (0.4, 0.8):
        with cs.catalog_efficiency({gemm.gpu: cs.with_constants(base, {gemm: fraction})}):
            speeds.append(cs.predict_tokens_per_s(row))
    assert 1.6 < speeds[1] / speeds[0] < 2.0  # twice the rate, less than twice the speed (comm, memory ops)


# -- the surrogate and the fit ----------------------------------------------------------------------------------
def test_a_row_on_a_gpu_without_an_entry_is_gridded_on_the_defaults():
    runs = load_reference_runs()
    row = runs[runs.id == "tt24_t1_02"].iloc[0].copy()
    row["gpu"] = "b300"  # no efficiency.yaml entry: it reads the defaults
    grid = cs.row_grid(pd.DataFrame([row]))
    assert grid.gemm == [cs.Constant("*", cs.GEMM_FIELD, "bf16")]
    assert grid.tokens_per_s.shape == (1, len(grid.fine_gemm), len(grid.fine_attention))
    assert np.all(np.diff(grid.tokens_per_s[0, :, 0]) > 0)  # a faster GEMM fraction, a faster row


def test_interpolation_in_the_reciprocal_is_exact_for_work_over_rate():
    fine = cs._fine(cs.COARSE_GEMM)
    seconds = 3.0 / np.asarray(cs.COARSE_GEMM) + 0.5
    interpolated = cs._interpolate(cs.COARSE_GEMM, fine, seconds[:, None], 0)[:, 0]
    np.testing.assert_allclose(interpolated, 3.0 / fine + 0.5, rtol=1e-12)
    assert fine[0] == 0.30 and fine[-1] == 0.90 and len(fine) == 61


def _grid(rows: list[tuple[str, str, cs.Constant, cs.Constant | None]], truth: dict[cs.Constant, float]) -> cs.RowGrid:
    """Rows whose measured tokens/s is what the grid predicts at ``truth``: tokens/s = 100 g (+ 100 a)."""
    fine_g, fine_a = cs._fine(cs.COARSE_GEMM), cs._fine(cs.COARSE_ATTENTION)
    surfaces, measured = [], []
    for _, _, gemm, attention in rows:
        surface = 100 * fine_g[:, None] + (100 * fine_a[None, :] if attention else 0 * fine_a[None, :])
        surfaces.append(surface)
        measured.append(100 * truth[gemm] + (100 * truth[attention] if attention else 0))
    frame = pd.DataFrame({"id": [f"r{i}" for i in range(len(rows))], "source": [r[0] for r in rows],
                          "table": [r[1] for r in rows], "measured": measured})
    return cs.RowGrid(frame, [r[2] for r in rows], [r[3] for r in rows], fine_g, fine_a, np.array(surfaces))


def test_the_fit_recovers_the_fractions_that_produced_the_measurements(monkeypatch):
    """Exactly without the prior; with it, within one grid step (the prior trades a row's error of under 2%
    in the worst-row term for a fraction closer to the defaults)."""
    truth = {H100_BF16: 0.55, H100_FLASH: 0.20, H100_PYTORCH_FP8: 0.47}
    rows = [("A", "a1", H100_BF16, None), ("A", "a1", H100_BF16, H100_FLASH), ("A", "a2", H100_BF16, H100_FLASH),
            ("A", "a2", H100_PYTORCH_FP8, H100_FLASH), ("A", "a2", H100_PYTORCH_FP8, None)]
    grid = _grid(rows, truth)
    assert cs.fit(grid, np.ones(len(rows), bool)) == pytest.approx(truth, abs=cs.FINE_STEP + 1e-9)
    monkeypatch.setattr(cs, "PRIOR_WEIGHT", 0.0)
    assert cs.fit(grid, np.ones(len(rows), bool)) == pytest.approx(truth)


def test_the_fit_matches_brute_force_when_each_constant_has_rows_of_its_own():
    """Separable rows: the descent must land on each constant's exhaustive optimum."""
    rng = np.random.default_rng(7)
    rows = [("A", "t", H100_BF16, None)] * 6 + [("A", "t", H100_FP8, None)] * 5
    grid = _grid(rows, {H100_BF16: 0.6, H100_FP8: 0.7})
    grid.frame["measured"] *= rng.uniform(0.85, 1.15, len(rows))  # noise: no exact solution
    fitted = cs.fit(grid, np.ones(len(rows), bool))
    for constant, members in ((H100_BF16, slice(0, 6)), (H100_FP8, slice(6, 11))):
        predicted = grid.tokens_per_s[members, :, 0]  # [row, gemm value]
        scores = cs.criterion((predicted / grid.frame.measured.to_numpy()[members, None] - 1).T)
        scores = scores + cs._prior_penalty(constant, grid.fine_gemm)  # the same objective, every value tried
        assert fitted[constant] == grid.fine_gemm[np.argmin(scores)]


def test_unfitted_constants_transfer_from_peers_then_defaults_and_overrides_drop():
    specs = cs.fold_specs({H100_FP8: 0.71, H100_BF16: 0.5})
    assert specs["gb200"].gemm_peak_frac["fp8"] == 0.71  # the median of the fold's fitted fp8 fractions
    assert specs["gb200"].gemm_peak_frac["fp4"] == catalog.default_efficiency().gemm_peak_frac["fp4"]
    assert specs["h100-sxm"].stack_gemm_peak_frac == {}  # no pytorch fp8 evidence: the shared 0.71 applies
    assert specs["h100-sxm"].attention_peak_frac["flash"] == catalog.default_efficiency().attention_peak_frac["flash"]
    assert specs["a100-sxm-80gb"].gemm_peak_frac["bf16"] == 0.5


def test_a_source_left_out_is_predicted_without_its_rows():
    """Each source alone reads one GPU's fp8 fraction: left out, that fraction falls back to the other GPU's
    fitted one, so B (measured at 0.50) is predicted at 0.70, 40% fast, and A (0.70) at 0.50, 2/7 slow."""
    truth = {H100_FP8: 0.70, GB200_FP8: 0.50}
    rows = [("A", "a", H100_FP8, None)] * 3 + [("B", "b", GB200_FP8, None)] * 2
    grid = _grid(rows, truth)

    def surrogate(frame, specs):
        index = frame.index.to_numpy()
        values = [cs._value(specs.get(grid.gemm[i].gpu, catalog.efficiency_of(grid.gemm[i].gpu)[0]), grid.gemm[i])
                  if specs else truth[grid.gemm[i]] for i in index]
        return 100 * np.array(values) / frame.measured.to_numpy() - 1

    result = cs.folds_of(grid, surrogate)
    by_name = {(f.level, f.name): f for f in result.folds}
    np.testing.assert_allclose(by_name["source", "B"].left_out_errors, [0.4, 0.4])
    np.testing.assert_allclose(by_name["source", "A"].left_out_errors, [-2 / 7] * 3)
    assert ("gb200 gemm fp8", cs.shipped_value(GB200_FP8), 0.70) in by_name["source", "B"].moved
    assert cs.summary(result.left_out_errors["source"])["median_abs_error_frac"] == pytest.approx(2 / 7)
    assert cs.summary(result.left_out_errors["source"])["max_abs_error_frac"] == pytest.approx(0.4)
    np.testing.assert_allclose(result.in_sample_errors, 0, atol=1e-12)  # every row fits its truth in sample
    assert result.all_rows_refit == pytest.approx(truth)


def test_fold_labels_keep_what_tells_them_apart():
    assert cs.short_label("table", "performance-summary-archive.md; 26.06 NeMo container; DGX-GB300; "
                                   "pre-training") == "26.06 NeMo container; DGX-GB300"
    assert cs.short_label("source", "Narayanan et al. 2021, Efficient Large-Scale") == "Narayanan et al. 2021"
    assert (cs.short_label("source", "torchtitan benchmarks (H100, Dec 2024)")
            == "torchtitan benchmarks (H100, Dec 2024)")


# -- the shipped reference runs ----------------------------------------------------------------------------------
@cache
def _validate_cross_source() -> tuple[str, dict]:
    """One run of `paraplan validate --cross-source --json` (about a minute): its output and report."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "validate.json"
        result = CliRunner().invoke(app, ["validate", "--cross-source", "--json", str(out)])
        assert result.exit_code == 0, result.output
        return result.output, json.loads(out.read_text())["cross_source"]


@pytest.mark.slow
def test_validate_cross_source_reports_in_sample_beside_left_out():
    """Guards: each publication left out has a median within the issue's 10% but NeMo (11.2%: no other source
    measures Transformer Engine fp8 on Blackwell, whose fractions then fall back to the defaults' 0.62 against
    the fitted 0.50-0.66); leaving out one table (a NeMo release on one system) costs under a point of median
    over the in-sample 3.6%; the automated refit is as good in sample as the hand fit."""
    output, report = _validate_cross_source()
    assert "cross-source validation: 342 dense rows" in output
    assert report["rows"] == 342
    assert report["in_sample"]["median_abs_error_frac"] == pytest.approx(0.036, abs=0.002)
    assert report["in_sample_refit"]["median_abs_error_frac"] <= report["in_sample"]["median_abs_error_frac"] + 0.005
    sources = {f["label"]: f for f in report["folds"] if f["level"] == "source"}
    nemo = "NVIDIA NeMo Framework (Megatron-Bridge) performance summary"
    assert set(sources) == {"Narayanan et al. 2021", "MosaicML llm-foundry MPT training benchmarks", nemo,
                            "torchtitan Llama 3.1 performance benchmarks (H100, Dec 2024)",
                            "PyTorch torchao float8 training benchmarks (README)"}
    for label, fold in sources.items():
        assert fold["left_out_error"]["median_abs_error_frac"] <= (0.125 if label == nemo else 0.10), label
    assert report["left_out"]["table"]["median_abs_error_frac"] <= 0.045
    assert report["left_out"]["source"]["median_abs_error_frac"] <= 0.08  # 7.4% today, guarded


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="issue 16's target: no publication's left-out median beyond 10%. NeMo left "
                   "out is 11.1%: it alone measures Transformer Engine fp8 on Blackwell, so without it those fractions "
                   "are the defaults' prior (0.62), 11% fast on average once TP overlap is priced as NeMo runs it")
def test_issue_target_every_source_left_out_within_ten_percent():
    _, report = _validate_cross_source()
    for fold in report["folds"]:
        if fold["level"] == "source":
            assert fold["left_out_error"]["median_abs_error_frac"] <= 0.10, fold["label"]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="issue 16's target: dense rows, each predicted with its publication "
                   "left out, median <= 6% (7.4% today: a stack or GPU no fit has seen falls back to other GPUs' "
                   "fractions or the defaults)")
def test_issue_target_left_out_source_median():
    _, report = _validate_cross_source()
    assert report["left_out"]["source"]["median_abs_error_frac"] <= 0.06
