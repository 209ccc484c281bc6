"""paraplan's own H100 probe priced with aiconfigurator's measured H100 GEMM tables.

Runs against the real aiconfigurator-core 0.12.0 wheel, which CI downloads (.ci/run) and names in
PARAPLAN_AICONFIGURATOR_WHEEL; without it these tests skip, and under PARAPLAN_REQUIRE_AICONFIGURATOR=1 they fail.
The store holds only aiconfigurator's GEMMs, so attention comes from paraplan's shipped H100 suite (the measured
cost model's fallback). Nothing here is fitted to the probe: the tables are isolated-kernel timings, the probe is
torchtitan steps paraplan measured (data/measured/torchtitan_memory_h100.csv). tests/test_probe_step_time.py
prices the probe from the shipped tables alone (issue 31's first target).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import aiconfigurator_wheel
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.validation.memory_probe import load_probe_rows, predict_probe_step_s


def _wheel() -> Path:
    return aiconfigurator_wheel()


@pytest.fixture(scope="module")
def probe_errors(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, np.ndarray]:
    """(analytical, measured-table) relative step-time errors of the 14 probe steps that ran."""
    store = tmp_path_factory.mktemp("kernels") / "store.sqlite"
    result = CliRunner().invoke(app, ["ingest", "aiconfigurator", str(_wheel()), "--hardware", "h100-sxm", "--op",
                                      "gemm", "--store", str(store)])
    assert result.exit_code == 0, result.output
    rows = load_probe_rows()
    rows = rows[rows["error"] != "oom"]
    measured = rows["step_s"].astype(float).to_numpy()
    analytical = np.array([predict_probe_step_s(row, "analytical") for _, row in rows.iterrows()])
    tables = np.array([predict_probe_step_s(row, "measured", store) for _, row in rows.iterrows()])
    return analytical / measured - 1.0, tables / measured - 1.0


def test_measured_gemm_tables_price_the_probe_as_closely_as_the_kernel_fractions(
        probe_errors: tuple[np.ndarray, np.ndarray]) -> None:
    analytical, tables = probe_errors
    assert len(tables) == 14
    # bench/kernel_tables_accuracy.py --store STORE: analytical median 4.0% (max 14.0%; one GPU reads the kernel
    # fractions, hardware_profiles/run_factor.py: it was 39.0% at the fitted ones, and 6.8% while the probe was priced
    # as FlashAttention-2: torchtitan 0.2.2 runs cuDNN's), tables 3.7% (max 15.3%): the 3B and 8B-slice steps come out
    # 12-15% fast on aiconfigurator's GEMMs, the rest closer than the roofline; half the rows closer either way.
    assert np.median(np.abs(analytical)) == pytest.approx(0.040, abs=0.01)
    assert np.median(np.abs(tables)) == pytest.approx(0.037, abs=0.01)
    assert np.max(np.abs(tables)) == pytest.approx(0.153, abs=0.01)
    assert np.sum(np.abs(tables) < np.abs(analytical)) == 7


def test_validate_reports_each_source_with_the_tables_and_without(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    runner = CliRunner()
    assert runner.invoke(app, ["ingest", "aiconfigurator", str(_wheel()), "--hardware", "h100-sxm", "--op", "gemm",
                               "--store", str(store)]).exit_code == 0
    out = tmp_path / "v.json"
    result = runner.invoke(app, ["validate", "--kernel-tables", str(store), "--json", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())["kernel_tables"]["summary"]
    mosaic = summary["MosaicML llm-foundry MPT training benchmarks"]
    # docs/profiling.md: the fitted fractions are in sample for these 70 runs; isolated kernels of today's stack,
    # divided by the distributed-run factor split off those fractions (hardware_profiles/run_factor.py), price them
    # 6.5% off (48.3% too fast before the factor: what a distributed run of 2023 lost around its kernels; 9.1% while
    # flash jobs read SDPA's default rows, cuDNN's speed, instead of FlashAttention-2's).
    assert mosaic["rows"] == 70
    assert mosaic["analytical_median"] == pytest.approx(0.035, abs=0.005)
    assert mosaic["tables_median"] == pytest.approx(0.065, abs=0.01)
    probe = summary["paraplan H100 probe (torchtitan 0.2.2, PyTorch 2.11, 1 GPU; step time)"]
    assert probe["rows"] == 14 and probe["tables_median"] == pytest.approx(0.038, abs=0.01)
