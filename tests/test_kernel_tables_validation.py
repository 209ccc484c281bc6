"""Dense training priced from aiconfigurator's measured GEMM tables (``validate --kernel-tables``), per source.

Runs against the real aiconfigurator-core 0.12.0 wheel, which CI downloads (.ci/run) and names in
PARAPLAN_AICONFIGURATOR_WHEEL; without it these tests skip, and under PARAPLAN_REQUIRE_AICONFIGURATOR=1 they fail.
Each store holds only aiconfigurator's GEMM tables (``--op gemm``), so attention, the memory-bound kernels and the
optimizer step of an H100 job come from paraplan's shipped H100 suite; on the A100 they stay analytical (nothing
measured there but the GEMMs). Nothing is fitted to these rows: the tables are isolated-kernel timings of vLLM's and
SGLang's PyTorch linear layer, and the distributed-run factor they are divided by was fitted on the efficiency
fractions (hardware_profiles/run_factor.py). docs/accuracy.md ("Measured kernel tables") gives the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import aiconfigurator_wheel
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.validation.kernel_tables import TableRow, reference_rows

MOSAIC = "MosaicML llm-foundry MPT training benchmarks"
NARAYANAN = ("Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM "
             "(SC21)")


def _ingest_gemms(store: Path, *hardware: str) -> None:
    """aiconfigurator's GEMM tables of ``hardware`` (and nothing else of the wheel) into ``store``."""
    for name in hardware:
        result = CliRunner().invoke(app, ["ingest", "aiconfigurator", str(aiconfigurator_wheel()), "--hardware", name,
                                          "--op", "gemm", "--store", str(store)])
        assert result.exit_code == 0, result.output


def _median_abs(rows: list[TableRow], field: str) -> float:
    return float(np.median([abs(getattr(r, field)) for r in rows]))


@pytest.fixture(scope="module")
def h100_rows(tmp_path_factory: pytest.TempPathFactory) -> list[TableRow]:
    """The 16-bit reference runs on H100, priced with aiconfigurator's H100 GEMM tables and without."""
    store = tmp_path_factory.mktemp("h100") / "store.sqlite"
    _ingest_gemms(store, "h100-sxm")
    return [r for r in reference_rows(store) if r.gpu == "h100-sxm"]


def test_mosaicml_h100_bf16_runs_with_aiconfigurator_gemm_tables(h100_rows: list[TableRow]) -> None:
    """Measured 2026-11-28: 6.5% median (max 19.9%), -4.7% signed. Before flash jobs read the suite's FlashAttention-2
    rows (they read SDPA's default pick, cuDNN's speed, up to 1.9x faster) it was 9.1% (max 52.6%), +8.9% signed, the
    8k-64k-token rows 23-53% too fast; now 7.4% (17 rows), -7.3% signed. Analytical: 3.5%, in sample."""
    mosaic = [r for r in h100_rows if r.source == MOSAIC]
    assert len(mosaic) == 70
    assert _median_abs(mosaic, "analytical_error") == pytest.approx(0.035, abs=0.005)
    assert _median_abs(mosaic, "tables_error") == pytest.approx(0.065, abs=0.01)
    assert max(abs(r.tables_error) for r in mosaic) <= 0.25
    assert float(np.median([r.tables_error for r in mosaic])) < 0.0  # too slow now, as measured (-4.7%)
    short = [r for r in mosaic if r.run_id in _short_sequence_ids()]
    assert _median_abs(short, "tables_error") <= 0.10  # up to 4,096 tokens: 5.6% measured (53 rows)
    long = [r for r in mosaic if r.run_id not in _short_sequence_ids()]
    assert len(long) == 17 and _median_abs(long, "tables_error") <= 0.10  # 8k-64k tokens: 7.4% (38.0% on cuDNN rows)


def _short_sequence_ids() -> set[str]:
    from paraplan.validation.reference import load_reference_runs

    runs = load_reference_runs()
    return set(runs.loc[runs["seq_len"] <= 4096, "id"])


@pytest.mark.xfail(strict=True, reason=(
    "issue 31's dense target (median <= 3.6% in sample) is not met with aiconfigurator's GEMM tables: the 154 "
    "16-bit dense rows they cover (H100 and A100 80GB) come to 5.4% median (analytical 4.2%), -1.8% signed; 6.3% over "
    "the 71 H100 rows (MosaicML -4.7% signed: too slow at every length) and 4.6% over the 83 A100 rows; worst: "
    "mpt_foundry_080 (8 A100 at 8k tokens, +35%; +25% analytical) and mpt_foundry_121 (+25%)"))
def test_dense_rows_with_tables_meet_the_in_sample_target(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    _ingest_gemms(store, "h100-sxm", "a100-sxm-80gb")
    dense = [r for r in reference_rows(store) if r.source in (MOSAIC, NARAYANAN) or r.source.startswith("PyTorch")]
    assert len(dense) == 154
    assert _median_abs(dense, "tables_error") <= 0.036
