"""``validate --serving``: aiconfigurator's 5,221 measured deployments predicted, with coverage and held-out error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_bad_input
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.validation.serving_runs import (
    GROUP_KEYS,
    load_measurements,
    serving_data_dir,
    validate_serving,
)

SHARED_SERVING = Path(__file__).resolve().parents[2] / "shared" / "data" / "serving"
"""The shared folder beside this checkout (found from the tests, so a non-editable install finds it too)."""

try:
    FOLDER = serving_data_dir(os.environ.get("PARAPLAN_SERVING_DATA", SHARED_SERVING))
except Exception as exc:  # noqa: BLE001 - any reason the shared data is absent skips these tests
    FOLDER = None
    REASON = f"serving measurements not available: {exc}"
else:
    REASON = ""

pytestmark = pytest.mark.skipif(FOLDER is None, reason=REASON or "serving measurements not available")


@pytest.fixture(scope="module")
def report():
    return validate_serving(FOLDER)


def test_every_row_is_read_with_its_concurrency():
    rows = load_measurements(FOLDER)
    assert len(rows) == 5221
    # The concurrency comes from the source note (or batch x attention-DP, or the decode pool's batch).
    assert rows["concurrency"].notna().sum() >= 5214


def test_coverage_and_every_uncovered_row_has_a_reason(report):
    overall = report.table[report.table["backend"] == "all"].iloc[0]
    assert overall["rows"] == 5221
    assert overall["covered_frac"] >= 0.99  # every row since Gated DeltaNet and DSA are priced
    uncovered = round((1 - overall["covered_frac"]) * 5221)
    assert sum(report.uncovered.values()) == uncovered
    assert all(reason for reason in report.uncovered)


def test_table_has_one_row_per_engine_gpu_mode(report):
    groups = report.table[report.table["backend"] != "all"]
    assert len(groups) == 26
    assert set(groups.columns) >= {*GROUP_KEYS, "rows", "covered_frac", "tpot_median_err", "ttft_median_err"}
    assert groups["rows"].sum() == 5221


def test_accuracy_does_not_regress(report):
    """Bounds at the accuracy reached when this was written (docs/serving.md), so a change that loses accuracy fails."""
    overall = report.table[report.table["backend"] == "all"].iloc[0]
    assert overall["tpot_median_err"] <= 0.21
    assert overall["ttft_median_err"] <= 0.43
    for tpot, ttft in report.held_out.values():
        assert np.isfinite(tpot) and tpot <= 0.24
        assert np.isfinite(ttft) and ttft <= 0.48


def test_llama70b_fp8_h200_trtllm_tpot_across_tensor_parallel_sizes():
    """A clean sweep: Llama 3.1 70B fp8 on H200 under TRT-LLM, 1024/1024 at concurrency 16, tp 1-8 (measured
    23.0 / 13.4 / 8.9 / 7.7 ms): weight streaming, KV reads and small all-reduces within 15% each."""
    from paraplan.validation.serving_runs import predict_rows

    rows = load_measurements(FOLDER)
    pick = rows[(rows["model_path"] == "meta-llama/Llama-3.1-70B") & (rows["system"] == "h200_sxm")
                & (rows["backend"] == "trtllm") & (rows["isl"] == 1024) & (rows["osl"] == 1024)
                & (rows["concurrency"] == 16) & (rows["precision"] == "fp8")]
    predicted = predict_rows(pick, FOLDER)
    measured = pick["silicon_tpot_ms"].to_numpy() / 1e3
    tpot = predicted["tpot_steady_s"].to_numpy()  # steady state with the engine's default step overhead
    assert sorted(pick["tp_size"].astype(int)) == [1, 2, 4, 8]
    assert np.all(np.abs(tpot / measured - 1) < 0.15), (tpot, measured)


@pytest.mark.xfail(strict=True, reason="issue 18 targets TPOT median <= 10% and TTFT median <= 20%; reached: see "
                                       "docs/serving.md (TTFT's burst and queueing, disaggregated worker counts)")
def test_issue_18_targets(report):
    overall = report.table[report.table["backend"] == "all"].iloc[0]
    assert overall["tpot_median_err"] <= 0.10 and overall["ttft_median_err"] <= 0.20


def test_cli_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "serving.json"
    result = CliRunner(env={"COLUMNS": "160"}).invoke(app, ["validate", "--serving", "--serving-data", str(FOLDER),
                                                            "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "TPOT med" in result.stdout and "leave one model out" in result.stdout
    document = json.loads(out.read_text())
    overall = next(g for g in document["groups"] if g["backend"] == "all")
    assert overall["rows"] == 5221 and overall["covered_frac"] >= 0.9
    assert set(document["held_out"]) == {"leave one model out", "leave one GPU out"}


def test_cli_refuses_a_folder_without_measurements(tmp_path):
    result = CliRunner().invoke(app, ["validate", "--serving", "--serving-data", str(tmp_path)])
    assert_bad_input(result, "aiconfigurator_silicon_sample.csv")


def test_a_file_that_is_not_the_measurements_layout_is_one_line(tmp_path):
    from paraplan.errors import InputError
    from paraplan.validation.serving_runs import MEASUREMENTS_FILE, load_measurements

    (tmp_path / MEASUREMENTS_FILE).write_text("id,backend\nx,vllm\n")
    with pytest.raises(InputError, match="lacks the columns silicon_data_source"):
        load_measurements(tmp_path)
    (tmp_path / MEASUREMENTS_FILE).write_text('a,b\n"1,2\n')
    with pytest.raises(InputError, match="not a CSV of serving measurements"):
        load_measurements(tmp_path)
