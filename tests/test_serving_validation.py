"""``validate --serving``: aiconfigurator's 5,221 measured deployments predicted, with coverage and held-out error.

The rows and model configs ship with the package (paraplan/data/serving); ../shared/data/serving, where they came
from, is needed only to check that the shipped copy equals it."""

from __future__ import annotations

import csv
import gzip
import io
import json
import shutil
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import assert_bad_input
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.errors import InputError
from paraplan.validation.serving_runs import (
    GROUP_KEYS,
    MEASURED_COLUMNS,
    SERVING_DATA_ENV,
    STEP_OVERHEAD_GRID_S,
    OverheadGrid,
    apply_constants,
    fit_constants,
    load_measurements,
    measurements_file,
    serving_data,
    step_overhead_index,
    validate_serving,
)

SHARED_SERVING = Path(__file__).resolve().parents[2] / "shared" / "data" / "serving"
"""The shared folder beside this checkout, where the shipped rows came from (absent from an install)."""
SHARED_FILE = SHARED_SERVING / "aiconfigurator_silicon_sample.csv"
NO_SHARED = "../shared/data/serving is absent (an install, or a checkout without the shared folder): nothing to " \
            "compare the shipped copy with"
DROPPED = ("prefill_batch_size",)
"""Columns of aiconfigurator's file the shipped copy leaves out (no prediction reads them)."""
ADDED = ("source", "licence")
"""Columns the shipped copy adds after ``id``."""


@pytest.fixture(scope="module")
def shipped() -> Iterator[Path]:
    """The data folder shipped with the package, whatever $PARAPLAN_SERVING_DATA says."""
    with resources.as_file(resources.files("paraplan.data") / "serving") as folder:
        yield folder


@pytest.fixture(scope="module")
def report(shipped):
    return validate_serving(shipped)


def _csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _shipped_csv(shipped: Path) -> list[list[str]]:
    return _csv_rows(gzip.decompress((shipped / "serving_runs.csv.gz").read_bytes()).decode("utf-8"))


def test_every_row_is_read_with_its_concurrency(shipped):
    rows = load_measurements(shipped)
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
    """Bounds at the accuracy reached when this was written (docs/serving.md), so a change that loses accuracy fails.
    TTFT's bound rose once, by choice: InferenceX's rows are priced at the ten waves their client sends (the fitted
    five had weighed the first wave's burst double and covered steady-state TTFTs put too low): 37.6% -> 41.0%; since
    SGLang's fixed-length sweeps run every wave as a burst, 39.8%; and rose again, by choice, when InferenceX's
    database rows and the rows repeating InferenceX measurements took its protocol (``inferencex_twins``): 43.0%;
    SGLang's scheduler receive interval, as InferenceX's scripts set it, brought it to 42.1%; the first-token steps
    to 38.3% (TPOT 14.1% -> 14.3%, by model 15.6% -> 16.0%: the joint fit's waves moved 8 -> 20)."""
    overall = report.table[report.table["backend"] == "all"].iloc[0]
    assert overall["tpot_median_err"] <= 0.15  # 14.3% (InferenceX's published deployments and protocol)
    assert overall["ttft_median_err"] <= 0.39  # 38.3%
    for tpot, ttft in report.held_out.values():  # by model 16.0 / 42.2%, by GPU 14.7 / 44.0%
        assert np.isfinite(tpot) and tpot <= 0.165
        assert np.isfinite(ttft) and ttft <= 0.45


def test_slices_partition_the_rows_and_name_the_issue_32_breakdowns(report):
    slices = {s["slice"]: s for s in report.slices}
    rows = {label: s["rows"] for label, s in slices.items()}
    assert rows["vllm"] + rows["sglang"] + rows["trtllm"] == 5221
    assert rows["aggregated"] + rows["disaggregated, worker counts stated"] \
        + rows["disaggregated, worker counts not stated"] == 5221
    assert rows["dense models"] + rows["MoE models"] == 5221
    assert rows["aggregated"] == 3619 and rows["disaggregated, worker counts stated"] == 274 + 663
    # 663 published for InferenceX's API rows, 108 more for database rows repeating one of their measurements
    assert rows["disaggregated, deployment published by InferenceX"] == 663 + 108
    assert rows["disaggregated with MTP (acceptance fitted)"] == 241
    assert rows["aggregated with MTP (acceptance from the disaggregated rows)"] == 126 + 21
    assert rows["aggregated SGLang, fixed lengths (every wave a burst)"] == 154
    for s in report.slices:
        assert 0.0 < s["tpot_median_err"] < 1.0 and 0.0 < s["ttft_median_err_model_out"] < 1.0


def _slice(report, name: str) -> dict:
    """One row of ``validate --serving``'s by-slice table."""
    return next(s for s in report.slices if s["slice"] == name)


def test_issue_32_disaggregated_rows_with_worker_counts(report):
    """Issue 32: disaggregated rows that state their worker counts, TPOT median <= 15%: 10.6% over the 166 rows that
    state them and the 771 whose deployment InferenceX published, 108 of them through a database row repeating an API
    row (10.7% over 274 stating and 663 published; 10.7% over the 274 alone, before those were
    known; 12.5% before the constants were fitted on the rows that state their deployment; 14.5% without the
    attention-DP step sync; 15.5% at the training fractions)."""
    stated = _slice(report, "disaggregated, worker counts stated")
    assert stated["tpot_median_err"] <= 0.15


def test_issue_32_disaggregated_rows_with_worker_counts_each_model_left_out(report):
    """The same rows with each model left out of the fit: 11.8% (11.3% before InferenceX's database rows took their
    API twins' deployments) with InferenceX's published deployments (the MTP
    acceptance is not refitted per fold); 12.9% over the 274 rows alone once the constants were fitted on the rows
    that state their deployment (13.8% before, 15.3% with the DSA indexer's floor but every row fitted to: the 22 GLM-5
    TensorRT-LLM rows without worker counts then moved a fold's TRT-LLM constant from 1.0 to 0.75 ms; 14.1% before
    vLLM's tp-1 MoE rows read as attention DP; 15.7% before gpt-oss's experts were read as MXFP4)."""
    stated = _slice(report, "disaggregated, worker counts stated")
    assert stated["tpot_median_err_model_out"] <= 0.15


@pytest.mark.xfail(strict=True, reason="issue 31: aggregated rows, TPOT median <= 10% in sample and with each model "
                                       "left out: 13.1% / 14.7% (11.6% / 13.5% priced from aiconfigurator's kernel "
                                       "tables; docs/serving.md). The worst cells: TRT-LLM on GB200 "
                                       "48.5% and H200 20.7%, SGLang on B300 18.1%; vLLM's aggregated rows read "
                                       "8.4-17.3% by GPU")
def test_issue_31_aggregated_tpot(report):
    aggregated = _slice(report, "aggregated")
    assert aggregated["tpot_median_err"] <= 0.10 and aggregated["tpot_median_err_model_out"] <= 0.10


def _one_engine_grid(step_s: np.ndarray, measured_tpot_s: np.ndarray) -> OverheadGrid:
    """vLLM rows whose predicted TPOT is ``step_s`` + the step overhead (no burst: every wave count scores alike)
    and whose TTFT is predicted exactly (100 ms)."""
    overhead = np.asarray(STEP_OVERHEAD_GRID_S)[:, None]
    tpot = np.broadcast_to(step_s, (len(overhead), len(step_s))) + overhead
    ttft = np.full_like(tpot, 0.1)
    rows = pd.DataFrame({"backend": "vllm", "reason": "", "mode": "agg", "silicon_tpot_ms": measured_tpot_s * 1e3,
                         "silicon_ttft_ms": 100.0, "prefill_num_workers": np.nan, "decode_num_workers": np.nan})
    return OverheadGrid(rows=rows, tpot_steady_s=tpot, tpot_burst_s=tpot, ttft_steady_s=ttft, ttft_burst_s=ttft)


def test_serve_prices_with_the_constants_validate_fits_in_sample(report):
    """``paraplan serve`` reads ENGINE_TRAITS; the in-sample figures validate prints use its fit on every row. They
    are the same numbers, so what validate reports is what serve predicts."""
    from paraplan.cost_models.serving import BENCHMARK_WAVES, ENGINE_TRAITS

    fitted = report.constants
    for engine, traits in ENGINE_TRAITS.items():
        assert traits.step_overhead_s == pytest.approx(fitted.step_overhead_s[engine]), engine
        assert traits.request_overhead_s == pytest.approx(fitted.request_overhead_s[engine]), engine
        assert traits.first_token_steps == pytest.approx(fitted.first_token_steps[engine]), engine
        assert traits.dp_sync_s == pytest.approx(fitted.dp_sync_s), engine
    assert BENCHMARK_WAVES == fitted.waves


def test_the_plan_provenance_quotes_what_validate_measures(report):
    """``paraplan serve`` writes the accuracy of its model into every plan; the four medians it quotes are
    validate's, rounded to 0.1 point."""
    import re

    from paraplan.planner.serving.plan import PROVENANCE

    quoted = [float(x) for x in re.findall(r"(\d+\.\d)%", PROVENANCE)]
    overall = report.table[report.table["backend"] == "all"].iloc[0]
    tpot_out, ttft_out = report.held_out["leave one model out"]
    measured = [overall["tpot_median_err"], tpot_out, overall["ttft_median_err"], ttft_out]
    assert quoted == [round(100 * x, 1) for x in measured]


def test_step_overhead_is_fitted_by_the_mean_log_error_by_hand():
    """Three rows measured at 10 ms, two predicted 8 ms before the overhead o and one 1 ms. For 2 < o < 9 the sum
    of |log error| is 2·ln((8 + o)/10) + ln(10/(1 + o)), flat where 2/(8 + o) = 1/(1 + o): o = 6 ms, a grid point
    (sum 2·ln 1.4 + ln(10/7) = 1.0296; 1.0355 at 5 ms, 1.0451 at 8 ms). The median |log error| would take 2 ms,
    where the two rows are exact; the mean weighs the row the overhead moves most (its step is shortest)."""
    grid = _one_engine_grid(np.array([8e-3, 8e-3, 1e-3]), np.full(3, 10e-3))
    tpot_s = grid.tpot_steady_s
    measured_s = grid.rows["silicon_tpot_ms"].to_numpy() / 1e3
    sums = np.abs(np.log(tpot_s / measured_s)).sum(axis=1)
    at = {o: sums[STEP_OVERHEAD_GRID_S.index(o)] for o in (2e-3, 5e-3, 6e-3, 8e-3)}
    assert at[6e-3] == pytest.approx(2 * np.log(1.4) + np.log(10 / 7), rel=1e-12)
    assert at[5e-3] == pytest.approx(2 * np.log(1.3) + np.log(10 / 6), rel=1e-12)
    assert STEP_OVERHEAD_GRID_S[step_overhead_index(tpot_s, measured_s)] == 6e-3
    constants = fit_constants(grid, np.ones(3, dtype=bool))
    assert constants.step_overhead_s == {"vllm": 6e-3, "sglang": 0.0, "trtllm": 0.0}  # no rows: nothing fitted
    assert constants.request_overhead_s["vllm"] == 0.0 and constants.fitted_rows == 3
    median_pick = np.argmin(np.median(np.abs(np.log(tpot_s / measured_s)), axis=1))
    assert STEP_OVERHEAD_GRID_S[median_pick] == 2e-3


def test_first_token_steps_and_request_overhead_are_told_apart_by_the_step_time():
    """Rows whose TTFT is predicted 100 ms before overheads and measured 100 ms + 20 ms + 4 TPOTs, at TPOTs of 5 to
    40 ms (predicted exactly at no step overhead): the joint grid recovers vLLM's 20 ms and 4 steps exactly (both grid
    points; a constant alone cannot follow the TPOT). SGLang's steps are not fitted (``FIRST_TOKEN_STEPS_FITTED``):
    its request overhead alone takes the grid point nearest the rows' median excess."""
    step_s = np.array([5e-3, 10e-3, 20e-3, 40e-3])
    overhead = np.asarray(STEP_OVERHEAD_GRID_S)[:, None]
    tpot = np.broadcast_to(np.tile(step_s, 2), (len(overhead), 8)) + overhead
    ttft = np.full_like(tpot, 0.1)
    measured_ttft_ms = (0.1 + 0.02 + 4.0 * np.tile(step_s, 2)) * 1e3  # 140, 160, 200, 280 ms
    rows = pd.DataFrame({"backend": ["vllm"] * 4 + ["sglang"] * 4, "reason": "", "mode": "agg",
                         "silicon_tpot_ms": np.tile(step_s, 2) * 1e3, "silicon_ttft_ms": measured_ttft_ms,
                         "prefill_num_workers": np.nan, "decode_num_workers": np.nan})
    grid = OverheadGrid(rows=rows, tpot_steady_s=tpot, tpot_burst_s=tpot, ttft_steady_s=ttft, ttft_burst_s=ttft)
    constants = fit_constants(grid, np.ones(8, dtype=bool))
    assert constants.step_overhead_s["vllm"] == 0.0 and constants.step_overhead_s["sglang"] == 0.0
    assert constants.first_token_steps["vllm"] == 4.0 and constants.request_overhead_s["vllm"] == 20e-3
    assert constants.first_token_steps["sglang"] == 0.0
    # SGLang's excess is 40, 60, 100, 180 ms (measured 140, 160, 200, 280 ms); the median of four |log errors| is the
    # mean of the middle two. At 60 ms the errors are ln(160/140), 0, ln(200/160), ln(280/160): median
    # (0.1335 + 0.2231)/2 = 0.1783. At 80 ms they are ln(180/140), ln(180/160), ln(200/180), ln(280/180), sorted
    # 0.1054, 0.1178, 0.2513, 0.4418: median 0.1845. Every other grid point is worse.
    assert constants.request_overhead_s["sglang"] == 60e-3
    predicted = apply_constants(grid, constants)
    assert predicted["ttft_pred_s"].to_numpy()[:4] == pytest.approx(measured_ttft_ms[:4] / 1e3, rel=1e-12)


def test_llama70b_fp8_h200_trtllm_tpot_across_tensor_parallel_sizes(shipped):
    """A clean sweep: Llama 3.1 70B fp8 on H200 under TRT-LLM, 1024/1024 at concurrency 16, tp 1-8 (measured
    23.0 / 13.4 / 8.9 / 7.7 ms): weight streaming, KV reads and small all-reduces within 15% each at the one step
    overhead that suits the sweep (0.25 ms: +1.8% / +1.3% / +0.4% / -9.1%), and within 20% at TRT-LLM's fitted
    1.5 ms (+7% / +11% / +14% / +7%): fitted on every row that states its deployment, the constant sits above what
    this sweep alone asks."""
    from paraplan.validation.serving_runs import predict_rows

    rows = load_measurements(shipped)
    pick = rows[(rows["model_path"] == "meta-llama/Llama-3.1-70B") & (rows["system"] == "h200_sxm")
                & (rows["backend"] == "trtllm") & (rows["isl"] == 1024) & (rows["osl"] == 1024)
                & (rows["concurrency"] == 16) & (rows["precision"] == "fp8")]
    predicted = predict_rows(pick, shipped)
    measured = pick["silicon_tpot_ms"].to_numpy() / 1e3
    tpot = predicted["tpot_steady_s"].to_numpy()  # steady state with the engine's default step overhead
    assert sorted(pick["tp_size"].astype(int)) == [1, 2, 4, 8]
    assert np.all(np.abs(tpot / measured - 1) < 0.20), (tpot, measured)
    from paraplan.cost_models.serving import ENGINE_TRAITS

    gpu = tpot - ENGINE_TRAITS["trtllm"].step_overhead_s  # a step overhead adds to every decode step alike
    best = min((np.mean(np.abs(np.log((gpu + o) / measured))), o) for o in np.arange(0.0, 3.01e-3, 0.25e-3))[1]
    assert best <= 1.25e-3
    assert np.all(np.abs((gpu + best) / measured - 1) < 0.15), (gpu + best, measured)


@pytest.mark.xfail(strict=True, reason="issues 18 and 32: every row, TPOT median <= 10% and TTFT median <= 20% in "
                                       "sample and with each model left out. Reached: TPOT 14.3% / 16.0%, TTFT 38.3% "
                                       "/ 42.2%. TTFT's worst slices are the disaggregated rows (62.0% with worker "
                                       "counts, 71.8% without) and SGLang's aggregated rows on B200/B300 (39-49%); "
                                       "TPOT's, MoE deployments (17.0%) against dense (8.7%). docs/serving.md, "
                                       "Accuracy and Not covered")
def test_issue_18_and_32_targets(report):
    overall = report.table[report.table["backend"] == "all"].iloc[0]
    tpot_out, ttft_out = report.held_out["leave one model out"]
    assert overall["tpot_median_err"] <= 0.10 and overall["ttft_median_err"] <= 0.20
    assert tpot_out <= 0.10 and ttft_out <= 0.20


def test_validate_serving_needs_no_shared_folder_and_no_flag(tmp_path, monkeypatch):
    """From a folder with no ../shared beside it and no $PARAPLAN_SERVING_DATA, the command reads the rows and
    model configs shipped with the package, and says where they come from."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(SERVING_DATA_ENV, raising=False)
    out = tmp_path / "serving.json"
    result = CliRunner(env={"COLUMNS": "160"}).invoke(app, ["validate", "--serving", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "TPOT med" in result.stdout and "leave one model out" in result.stdout
    document = json.loads(out.read_text())
    overall = next(g for g in document["groups"] if g["backend"] == "all")
    assert overall["rows"] == 5221 and overall["covered_frac"] >= 0.9
    assert set(document["held_out"]) == {"leave one model out", "leave one GPU out"}
    assert "aiconfigurator 0.12.0" in document["source"] and "(Apache-2.0)" in document["source"]


def test_serving_data_takes_the_flag_then_the_environment_then_the_package(tmp_path, monkeypatch, shipped):
    (tmp_path / "serving_runs.csv").write_text("id\n")
    monkeypatch.setenv(SERVING_DATA_ENV, str(shipped))
    with serving_data(tmp_path) as folder:
        assert folder == tmp_path
    with serving_data() as folder:
        assert folder == shipped
    monkeypatch.setenv(SERVING_DATA_ENV, str(tmp_path))
    with serving_data() as folder:
        assert folder == tmp_path
    monkeypatch.delenv(SERVING_DATA_ENV)
    with serving_data() as folder:
        assert measurements_file(folder) == folder / "serving_runs.csv.gz"


def test_serving_data_reads_another_folder_in_the_same_layout(tmp_path, shipped):
    """--serving-data FOLDER: a plain serving_runs.csv (here the Llama rows) with its model_configs/."""
    header, *rows = _shipped_csv(shipped)
    llama = [row for row in rows if row[header.index("model_path")] == "meta-llama/Llama-3.1-70B"]
    with (tmp_path / "serving_runs.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([header, *llama])
    shutil.copytree(shipped / "model_configs", tmp_path / "model_configs")
    out = tmp_path / "serving.json"
    result = CliRunner(env={"COLUMNS": "160"}).invoke(app, ["validate", "--serving", "--serving-data", str(tmp_path),
                                                            "--json", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    overall = next(g for g in document["groups"] if g["backend"] == "all")
    assert overall["rows"] == len(llama) == 441 and overall["covered_frac"] == 1.0
    # One model: no other model to fit the constants on, so no leave-one-model-out figure (and no crash).
    assert document["held_out"]["leave one model out"] == {"tpot_median_err": None, "ttft_median_err": None}
    assert "leave one model out: TPOT median - %" in result.stdout
    assert document["held_out"]["leave one GPU out"]["tpot_median_err"] is not None
    assert document["source"].startswith("NVIDIA aiconfigurator 0.12.0")  # the rows' own source column


@pytest.mark.skipif(not SHARED_FILE.is_file(), reason=NO_SHARED)
def test_shipped_rows_equal_the_shared_rows_they_came_from(shipped):
    """Field for field as text (no number re-formatted), in the same order, less DROPPED and plus ADDED."""
    header, *rows = _shipped_csv(shipped)
    source_header, *source_rows = _csv_rows(SHARED_FILE.read_text(encoding="utf-8"))
    kept = [i for i, name in enumerate(source_header) if name not in DROPPED]
    mine = [i for i, name in enumerate(header) if name not in ADDED]
    assert [header[i] for i in mine] == [source_header[i] for i in kept]
    assert header[1:3] == list(ADDED)
    assert len(rows) == len(source_rows) == 5221
    for row, source in zip(rows, source_rows):
        assert [row[i] for i in mine] == [source[i] for i in kept]


@pytest.mark.skipif(not SHARED_FILE.is_file(), reason=NO_SHARED)
def test_shipped_model_configs_are_the_shared_files_byte_for_byte(shipped):
    files = sorted((shipped / "model_configs").iterdir())
    assert len(files) == 11
    for path in files:
        assert path.read_bytes() == (SHARED_SERVING / "model_configs" / path.name).read_bytes(), path.name


def test_every_shipped_row_has_a_source_and_a_licence(shipped):
    header, *rows = _shipped_csv(shipped)
    assert set(MEASURED_COLUMNS) <= set(header)
    for name in ADDED:
        values = {row[header.index(name)].strip() for row in rows}
        assert "" not in values, name
    assert {row[header.index("licence")] for row in rows} == {"Apache-2.0"}
    assert all("aiconfigurator 0.12.0" in row[header.index("source")] for row in rows)


def test_every_model_config_has_its_repo_licence_and_source_and_every_row_its_config(shipped):
    from paraplan.validation.serving_runs import _config_path

    with (shipped / "model_configs.csv").open(newline="") as handle:
        manifest = list(csv.DictReader(handle))
    assert sorted(entry["file"] for entry in manifest) == sorted(p.name for p in (shipped / "model_configs").iterdir())
    for entry in manifest:
        assert all(entry[key].strip() for key in ("repo_id", "serves", "licence", "source")), entry
        assert entry["file"] == f"{entry['repo_id'].replace('/', '--')}_config.json"
    served = {model: entry["file"] for entry in manifest for model in entry["serves"].split()}
    models = set(load_measurements(shipped)["model_path"])
    assert set(served) == models
    assert all(_config_path(shipped, model).name == served[model] for model in models)


def test_the_shipped_folder_says_where_the_data_comes_from(shipped):
    notice = (shipped / "README.md").read_text()
    assert "Apache License, Version 2.0" in notice and "NVIDIA" in notice and "aiconfigurator 0.12.0" in notice
    assert "Apache License" in (shipped / "LICENSE-Apache-2.0.txt").read_text()


def test_cli_refuses_a_folder_without_measurements(tmp_path):
    result = CliRunner().invoke(app, ["validate", "--serving", "--serving-data", str(tmp_path)])
    assert_bad_input(result, "aiconfigurator_silicon_sample.csv")


def test_a_file_that_is_not_the_measurements_layout_is_one_line(tmp_path):
    path = tmp_path / "aiconfigurator_silicon_sample.csv"
    path.write_text("id,backend\nx,vllm\n")
    with pytest.raises(InputError, match="lacks the columns silicon_data_source"):
        load_measurements(tmp_path)
    path.write_text('a,b\n"1,2\n')
    with pytest.raises(InputError, match="not a CSV of serving measurements"):
        load_measurements(tmp_path)


def test_a_word_where_a_number_belongs_is_one_line(tmp_path, shipped):
    """A measurements file whose tp_size says "eight" is refused naming the column, not read as a missing value."""
    lines = gzip.decompress((shipped / "serving_runs.csv.gz").read_bytes()).decode().splitlines()[:3]
    header = lines[0].split(",")
    cells = next(csv.reader([lines[1]]))
    cells[header.index("tp_size")] = "eight"
    with (tmp_path / "serving_runs.csv").open("w", newline="") as out:
        csv.writer(out).writerows([header, cells, next(csv.reader([lines[2]]))])
    with pytest.raises(InputError, match="the columns tp_size must hold numbers"):
        load_measurements(tmp_path)


def test_a_row_id_listed_twice_is_one_line(tmp_path, shipped):
    """Published deployments and repeated measurements are applied by row id: an id listed twice is refused."""
    lines = gzip.decompress((shipped / "serving_runs.csv.gz").read_bytes()).decode().splitlines()
    (tmp_path / "serving_runs.csv").write_text("\n".join([lines[0], lines[1], lines[1], lines[2]]) + "\n")
    with pytest.raises(InputError, match="is listed more than once"):
        load_measurements(tmp_path)


def test_a_gzip_file_that_is_not_gzip_is_one_line(tmp_path):
    (tmp_path / "serving_runs.csv.gz").write_bytes(b"id,backend\nx,vllm\n")
    with pytest.raises(InputError, match="not a gzip file of serving measurements"):
        load_measurements(tmp_path)
    (tmp_path / "serving_runs.csv.gz").write_bytes(gzip.compress(b"id,backend\nx,vllm\n")[:-12])
    with pytest.raises(InputError, match="not a gzip file of serving measurements"):
        load_measurements(tmp_path)


def test_an_nvfp4_label_on_an_mxfp4_checkpoint_is_read_as_mxfp4(shipped):
    """aiconfigurator labels gpt-oss-120b's experts nvfp4; its checkpoint stores them MXFP4 (quant_method mxfp4), so
    the experts are priced as MXFP4 (4.25 bits, the w4a16_mxfp4 kernel tables). DeepSeek-R1's fp8 checkpoint keeps
    the label it is given, and an mxfp4 checkpoint keeps any other label."""
    from paraplan.cost_models.serving import weight_precision
    from paraplan.model_specs.hf_config import load_model
    from paraplan.validation.serving_runs import _config_path, checkpoint_moe_mode

    gpt_oss = load_model(str(_config_path(shipped, "openai/gpt-oss-120b")))
    deepseek = load_model(str(_config_path(shipped, "deepseek-ai/DeepSeek-R1")))
    assert checkpoint_moe_mode(gpt_oss, "nvfp4") == "mxfp4"
    assert checkpoint_moe_mode(gpt_oss, "fp8") == "fp8" and checkpoint_moe_mode(deepseek, "nvfp4") == "nvfp4"
    bytes_per_weight = weight_precision(gpt_oss, "nvfp4", checkpoint_moe_mode(gpt_oss, "nvfp4"), "bf16").expert_bytes
    assert bytes_per_weight == 0.5 + 1 / 32  # 4 bits and one 1-byte e8m0 scale per 32, not nvfp4's 0.5 + 1/16


def test_rows_that_do_not_state_their_deployment_fit_no_constant():
    """A disaggregated row without worker counts is priced at a guessed split: the fit ignores it however far off it
    is, and a row that states its counts counts."""
    from paraplan.validation.serving_runs import deployment_stated, fit_constants

    step = np.full(4, 5e-3)
    measured = np.array([6e-3, 6e-3, 6e-3, 30e-3])  # the last row alone wants a 25-ms overhead
    grid = _one_engine_grid(step, measured)
    rows = grid.rows.assign(mode=["agg", "agg", "disagg", "disagg"], prefill_num_workers=[np.nan, np.nan, 1, np.nan],
                            decode_num_workers=[np.nan, np.nan, 2, np.nan])
    grid = OverheadGrid(rows=rows, tpot_steady_s=grid.tpot_steady_s, tpot_burst_s=grid.tpot_burst_s,
                        ttft_steady_s=grid.ttft_steady_s, ttft_burst_s=grid.ttft_burst_s)
    assert deployment_stated(rows).tolist() == [True, True, True, False]
    fitted = fit_constants(grid, np.ones(4, dtype=bool))
    assert fitted.step_overhead_s["vllm"] == pytest.approx(1e-3)  # 5 ms + 1 ms = the three stated rows exactly
    assert fitted.fitted_rows == 3


def test_sglang_fixed_length_sweeps_run_every_wave_as_a_burst(report):
    """aiconfigurator's own sweeps send every request at exactly its stated lengths; SGLang prefills each wave whole
    before decoding it, so the wave finishes in one step and returns as a burst (``benchmark_waves``). Priced so,
    its 154 aggregated rows come to TPOT 14.0% / TTFT 27.0% (14.3 / 27.0% with each model left out); priced as the
    other sweeps' steady state plus one burst in five waves they were 26.1% / 54.2% (TPOT 23% too slow and TTFT 50%
    too fast, signed)."""
    fixed = _slice(report, "aggregated SGLang, fixed lengths (every wave a burst)")
    assert fixed["tpot_median_err"] <= 0.15 and fixed["tpot_median_err_model_out"] <= 0.16
    assert fixed["ttft_median_err"] <= 0.29 and fixed["ttft_median_err_model_out"] <= 0.29


def test_each_measurement_counts_once_in_its_own_slice(report):
    """5,221 rows carry 3,787 distinct measurements (InferenceX's two files repeat runs, its database and two gap
    analyses copy them); the slice counting each once reads TPOT 14.0% / TTFT 36.8% (15.5 / 40.6% with each model left
    out) against 14.3 / 38.3% over every row."""
    once = _slice(report, "each measurement once (its repeats in other sweeps left out)")
    assert once["rows"] == 3787
    assert once["tpot_median_err"] <= 0.145 and once["ttft_median_err"] <= 0.38


def test_the_first_of_a_repeated_measurement_is_kept():
    """Two rows with one measurement (TPOT equal to 0.01 ms, TTFT to 0.1 ms) at one point: the first is kept; another
    concurrency, or a TPOT 0.01 ms off, is another measurement."""
    from paraplan.validation.serving_runs import first_of_each_measurement

    point = {"system": "b200_sxm", "backend": "sglang", "mode": "agg", "isl": 1024, "osl": 1024}
    rows = pd.DataFrame([{**point, "concurrency": 256, "silicon_tpot_ms": 47.874849, "silicon_ttft_ms": 2485.321115},
                         {**point, "concurrency": 256, "silicon_tpot_ms": 47.87, "silicon_ttft_ms": 2485.32},
                         {**point, "concurrency": 128, "silicon_tpot_ms": 47.87, "silicon_ttft_ms": 2485.32},
                         {**point, "concurrency": 256, "silicon_tpot_ms": 47.88, "silicon_ttft_ms": 2485.32}])
    assert first_of_each_measurement(rows).tolist() == [True, False, True, True]
