"""bench/kernel_fractions.py: the share of the dense peak a stored GEMM table reaches at training shapes."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest

from paraplan.hardware_profiles import load_gpu
from paraplan.measurements.ingest.records import Measurement, ParsedFile
from paraplan.measurements.store import ingest_parsed

BENCH = Path(__file__).resolve().parents[1] / "bench" / "kernel_fractions.py"


def _bench():
    spec = importlib.util.spec_from_file_location("kernel_fractions_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gemm_file(fractions: dict[tuple[float, float, float], float]) -> ParsedFile:
    """One bf16 GEMM table on B200 whose rows run at the given share of the dense peak, by (m, n, k)."""
    peak = load_gpu("b200").peak("bf16")
    rows = tuple(Measurement(kind="gemm", name="torch_flow", time_s=2.0 * m * n * k / (share * peak), line=i + 1,
                             params={"m": m, "n": n, "k": k, "dtype": "bf16", "stack": "trtllm 1.3.0rc20"})
                 for i, ((m, n, k), share) in enumerate(fractions.items()))
    return ParsedFile(path="t.parquet", sha256="t" * 64, kind="aiconfigurator", hardware="b200",
                      software="trtllm 1.3.0rc20", measurements=rows)


def test_the_quartiles_cover_only_training_shapes(tmp_path: Path) -> None:
    # Four training-sized shapes at 0.60, 0.64, 0.68 and 0.72 of peak; small shapes at 0.10 must not count.
    big = list(itertools.product((8192.0, 16384.0), (4096.0,), (4096.0, 8192.0)))
    shares = dict(zip(big, (0.60, 0.64, 0.68, 0.72), strict=True))
    shares |= {(128.0, 4096.0, 4096.0): 0.10, (8192.0, 512.0, 4096.0): 0.10}
    store = tmp_path / "store.sqlite"
    ingest_parsed(_gemm_file(shares), store)
    table = _bench().measured_fractions(store, "b200", 8192.0, 4096.0)
    assert len(table) == 1
    row = table.iloc[0]
    assert row["shapes"] == 4 and row["dtype"] == "bf16" and row["kernel"] == "torch_flow"
    assert row["median"] == pytest.approx(0.66, rel=1e-9)  # numpy's median of the four
    assert row["p25"] == pytest.approx(0.63, rel=1e-9) and row["p75"] == pytest.approx(0.69, rel=1e-9)
