"""Routed experts' grouped GEMMs priced from a measured ``torch._grouped_mm`` table (``--cost-model measured``)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from conftest import make_table

from paraplan.cost_models.compute import analytical_rates
from paraplan.cost_models.kernel_pricing import table_grouped_gemm_fn
from paraplan.cost_models.kernel_source_grouped import GROUPED_AXES, grouped_gemm_table
from paraplan.cost_models.kernel_tables import build_table
from paraplan.cost_models.learned.provider import compute_rates
from paraplan.cost_models.moe import grouped_gemm_time_s, moe_block_times
from paraplan.hardware_profiles import load_cluster, load_gpu
from paraplan.measurements.ingest.records import Measurement, ParsedFile
from paraplan.measurements.store import ingest_parsed
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import TrainingJob

NO_STORE = Path("no-user-store.sqlite")
RATE = 4e14  # flop/s of the synthetic kernel: t = 2 · experts · tokens · n · k / RATE
ANALYTICAL = analytical_rates(load_gpu("h100-sxm"), "bf16", "flash", "pytorch")
QWEN3_30B = load_model("qwen3-30b-a3b")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))


def _power_law() -> tuple[np.ndarray, np.ndarray]:
    """A grid of (tokens per expert, experts, n, k) with t = 2·e·t·n·k / RATE: a power law in every axis."""
    shapes = np.array(list(itertools.product((128.0, 2048.0), (8.0, 64.0), (512.0, 4096.0), (512.0, 4096.0))))
    return shapes, 2.0 * shapes.prod(axis=1) / RATE


def _rates_with(table: object) -> object:
    return dataclasses.replace(ANALYTICAL, grouped_gemm_table_fn=table_grouped_gemm_fn(table))


def test_a_power_law_table_prices_a_covered_grouped_gemm_exactly() -> None:
    """20 experts of 1,000 tokens, [1000, 1000, 2000] each: 2 x 20 x 1000 x 1000 x 2000 / 4e14 = 0.2 ms."""
    rates = _rates_with(build_table("grouped_gemm", GROUPED_AXES, *_power_law(), "synthetic",
                                    exponents_above=(1.0, 1.0, None, None)))
    assert float(grouped_gemm_time_s(1000, 20, 1000, 2000, rates)) == pytest.approx(2e-4, rel=1e-12)
    # Past the largest tokens per expert and experts: linear (8,192 tokens, 128 experts: 4 x 2 past the grid).
    assert float(grouped_gemm_time_s(8192, 128, 4096, 512, rates)) == pytest.approx(
        2 * 8192 * 128 * 4096 * 512 / RATE, rel=1e-12)


def test_outside_the_measured_widths_and_for_the_weight_gradient_the_model_prices_it() -> None:
    """A width past the table (8,192), fewer tokens than measured (64) or ``measured=False`` (the weight gradient,
    which the table never timed): the tiled GEMM model, bit for bit."""
    rates = _rates_with(build_table("grouped_gemm", GROUPED_AXES, *_power_law(), "synthetic",
                                    exponents_above=(1.0, 1.0, None, None)))
    for shape in ((1024, 16, 8192, 1024), (64, 16, 1024, 1024)):
        assert float(grouped_gemm_time_s(*shape, rates)) == float(grouped_gemm_time_s(*shape, ANALYTICAL))
    assert float(grouped_gemm_time_s(1024, 16, 1024, 1024, rates, measured=False)) == float(
        grouped_gemm_time_s(1024, 16, 1024, 1024, ANALYTICAL))
    batch = grouped_gemm_time_s(np.array([1000.0, 64.0]), np.array([20.0, 16.0]), 1000.0, 2000.0, rates)
    single = [float(grouped_gemm_time_s(r, e, 1000.0, 2000.0, rates)) for r, e in ((1000.0, 20.0), (64.0, 16.0))]
    assert batch.tolist() == single


def test_an_moe_block_takes_its_forward_and_input_gradient_experts_from_the_table() -> None:
    """Qwen3-30B-A3B on 8 H100 with ep 8: 16 local experts of 2,048 tokens. A table pricing every grouped GEMM at
    1 ms makes the experts' forward and input gradients 2 ms each (up and down); the weight gradients stay the
    model's."""
    cluster = load_cluster("dgx-h100", num_gpus=8)
    job = TrainingJob(model=QWEN3_30B, seq_len=4096, global_batch=64, expert_imbalance=1.0)
    table = make_table(ep=8, dp=8, mbs=1)

    def one_ms(rows: object, groups: object, n: object, k: object) -> tuple[np.ndarray, np.ndarray]:
        shape = np.broadcast_shapes(*(np.shape(x) for x in (rows, groups, n, k)))
        return np.full(shape, 1e-3), np.ones(shape, dtype=bool)

    measured = moe_block_times(QWEN3_30B, job.workload(), table,
                               dataclasses.replace(ANALYTICAL, grouped_gemm_table_fn=one_ms), cluster)
    plain = moe_block_times(QWEN3_30B, job.workload(), table, ANALYTICAL, cluster)
    assert float(measured.mlp_forward_s[0]) == pytest.approx(2e-3, rel=1e-12)
    assert float(measured.mlp_input_grad_s[0]) == pytest.approx(2e-3, rel=1e-12)
    assert float(measured.mlp_weight_grad_s[0]) == float(plain.mlp_weight_grad_s[0])


def _grouped_file() -> ParsedFile:
    shapes, seconds = _power_law()
    rows = tuple(Measurement(kind="gemm", name="grouped_mm", time_s=float(t), line=i + 1,
                             params={"tokens_per_expert": s[0], "experts": s[1], "m": s[0] * s[1], "n": s[2],
                                     "k": s[3], "dtype": "bf16", "pass": "forward", "stack": "pytorch 2.11.0+cu130"})
                 for i, (s, t) in enumerate(zip(shapes, seconds, strict=True)))
    return ParsedFile(path="g.json", sha256="g" * 64, kind="paraplan-json", hardware="h100-sxm",
                      software="pytorch 2.11.0+cu130", measurements=rows)


def test_a_users_grouped_rows_build_the_table_and_fp8_has_none(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    ingest_parsed(_grouped_file(), store)
    table = grouped_gemm_table(store, "h100-sxm", "bf16")
    assert table is not None and table.num_rows == 16 and "torch._grouped_mm" in table.label
    assert grouped_gemm_table(store, "h100-sxm", "fp8") is None
    assert grouped_gemm_table(tmp_path / "absent.sqlite", "h100-sxm", "bf16") is None


def test_the_shipped_h100_table_prices_what_the_suite_measured_and_h200_has_none() -> None:
    """The shipped H100 suite timed 16 experts of 2,048 tokens, 2,048 x 2,048 each, in 0.415 ms (a grid point is at
    most its median: the table is monotone)."""
    h100 = compute_rates("measured", load_gpu("h100-sxm"), "bf16", "flash", "pytorch", NO_STORE)
    priced = float(grouped_gemm_time_s(2048, 16, 2048, 2048, h100))
    assert priced <= 4.151e-4 * 1.001 and priced == pytest.approx(4.151e-4, rel=0.05)
    assert "routed experts' forward and input-gradient grouped GEMMs: measured torch._grouped_mm table (h100-sxm" \
        in h100.source
    h200 = compute_rates("measured", load_gpu("h200-sxm"), "bf16", "flash", "pytorch", NO_STORE)
    assert h200.grouped_gemm_table_fn is None and "grouped GEMMs" not in h200.source
