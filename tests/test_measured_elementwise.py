"""Memory-bound kernels and the optimizer step priced from measured tables (``--cost-model measured``), by hand."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.cost_models.compute import analytical_rates, memory_bound_time_s
from paraplan.cost_models.estimate import (
    CLIP_BYTES_PER_PARAM,
    FUSED_ADAMW_BYTES_PER_PARAM,
    OPTIMIZER_BYTES_PER_PARAM,
    OPTIMIZER_KERNELS,
    optimizer_step_s,
)
from paraplan.cost_models.kernel_pricing import (
    curve_seconds,
    memory_coverage,
    table_memory_fn,
    table_memory_seconds,
    table_parameter_fn,
)
from paraplan.cost_models.kernel_source_memory import elementwise_table, optimizer_table
from paraplan.cost_models.kernel_tables import build_table, lookup
from paraplan.cost_models.learned.provider import compute_rates
from paraplan.cost_models.recipes import FSDP2_MIXED, MEGATRON_MIXED
from paraplan.hardware_profiles import load_gpu
from paraplan.measurements.ingest.records import Measurement, ParsedFile
from paraplan.measurements.profile_grids import ADAMW_BYTES_PER_PARAMETER
from paraplan.measurements.store import ingest_parsed

NO_STORE = Path("no-user-store.sqlite")
ANALYTICAL = analytical_rates(load_gpu("h100-sxm"), "bf16", "flash", "pytorch")
STACK = "pytorch 2.11.0+cu130"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))


def _two_points() -> object:
    """One kernel moving 1 MB takes 10 us, 100 MB 100 us: time ∝ bytes^0.5 between them."""
    return build_table("memory_bound", ("bytes",), np.array([[1e6], [1e8]]), np.array([10e-6, 100e-6]), "two points",
                       exponents_above=(None,))


def test_between_two_points_time_follows_the_power_law_through_them() -> None:
    """10 MB is halfway in log bytes: 10 us x 10^0.5 = 31.62 us a kernel; 20 MB over two kernels is two of those."""
    table = _two_points()
    seconds, covered = table_memory_seconds(table, ANALYTICAL, 2e7, 2)
    assert bool(covered) and float(seconds) == pytest.approx(2 * 10e-6 * math.sqrt(10.0), rel=1e-12)
    assert float(table_memory_seconds(table, ANALYTICAL, 1e8, 1)[0]) == pytest.approx(100e-6, rel=1e-12)


def test_outside_the_measured_bytes_the_roofline_prices_it() -> None:
    """1 GB a kernel is past the table: bytes / (3.35 TB/s x 0.8) + one 5.2 us launch, as memory_bound_time_s
    prices it; 100 kB is below it: the roofline, 5.24 us, under the smallest measured 10 us."""
    table = _two_points()
    bandwidth, launch = ANALYTICAL.memory_bytes_per_s, ANALYTICAL.kernel_overhead_s
    assert bandwidth == pytest.approx(3.35e12 * 0.8) and launch == pytest.approx(5.2e-6)
    seconds, covered = table_memory_seconds(table, ANALYTICAL, np.array([1e9, 2e5]), np.array([1, 2]))
    assert covered.tolist() == [False, False]
    np.testing.assert_allclose(seconds, [1e9 / bandwidth + launch, 2 * (1e5 / bandwidth + launch)], rtol=1e-12)
    np.testing.assert_allclose(seconds, memory_bound_time_s(np.array([1e9, 2e5]), np.array([1, 2]), ANALYTICAL),
                               rtol=1e-12)
    assert memory_coverage(table, ANALYTICAL, np.array([2e7, 1e9]), np.array([2, 1])) == pytest.approx(
        2 * 10e-6 * math.sqrt(10.0) / (2 * 10e-6 * math.sqrt(10.0) + 1e9 / bandwidth + launch))


def test_the_roofline_outside_never_undercuts_the_curve_inside() -> None:
    """A curve slower than the roofline at its top (100 MB in 1 ms, 0.1 TB/s): just past it the roofline's 42 us
    is raised to the measured 1 ms, so time never falls as bytes grow; below a curve faster than the roofline
    the roofline is capped at the smallest measured time."""
    slow = build_table("memory_bound", ("bytes",), np.array([[1e6], [1e8]]), np.array([2e-6, 1e-3]), "slow",
                       exponents_above=(None,))
    above = float(table_memory_seconds(slow, ANALYTICAL, 1.01e8, 1)[0])
    assert above == pytest.approx(1e-3)
    below = float(table_memory_seconds(slow, ANALYTICAL, 9e5, 1)[0])
    assert below == pytest.approx(2e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=1e3, max_value=1e11), min_size=2, max_size=40),
       st.lists(st.floats(min_value=1e-6, max_value=1e-2), min_size=4, max_size=4),
       st.integers(min_value=1, max_value=20))
def test_time_never_falls_as_bytes_grow(sizes: list[float], seconds: list[float], kernels: int) -> None:
    """Any measured curve (noise included: the table lowers a cell to the fastest larger one) and the roofline
    around it: more bytes over the same kernels never take less time."""
    table = build_table("memory_bound", ("bytes",), np.array([[1e5], [1e6], [1e7], [1e8]]), np.array(seconds), "x",
                        exponents_above=(None,))
    ordered = np.sort(np.array(sizes))
    priced, _ = table_memory_seconds(table, ANALYTICAL, ordered, kernels)
    assert np.all(np.diff(priced) >= -1e-15 * priced[1:])


def test_the_one_axis_interpolation_is_lookups() -> None:
    rng = np.random.default_rng(7)
    sizes = np.array([[1e5], [4e5], [3e6], [5e7], [1e9]])
    table = build_table("memory_bound", ("bytes",), sizes, rng.uniform(1e-6, 1e-3, 5), "x", exponents_above=(1.0,))
    queries = 10.0 ** rng.uniform(4, 10, 200)
    fast, fast_covered = curve_seconds(table, queries)
    slow, slow_covered = lookup(table, queries[:, None])
    assert (fast_covered == slow_covered).all()
    np.testing.assert_allclose(fast[fast_covered], slow[slow_covered], rtol=1e-12)


def test_memory_bound_time_s_defers_to_the_curve_and_the_analytical_rates_stay_the_roofline() -> None:
    rates = dataclasses.replace(ANALYTICAL, memory_time_fn=table_memory_fn(_two_points(), ANALYTICAL))
    assert float(memory_bound_time_s(2e7, 2, rates)) == pytest.approx(2 * 10e-6 * math.sqrt(10.0), rel=1e-12)
    sizes = np.array([0.0, 1e6, 3.3e9])
    assert (memory_bound_time_s(sizes, 8, ANALYTICAL)
            == sizes / ANALYTICAL.memory_bytes_per_s + 8 * ANALYTICAL.kernel_overhead_s).all()


def _adamw_table() -> object:
    """A fused AdamW step measured at 2**20 parameters in 0.1 ms and 2**30 in 11.2 ms (2.56 TB/s at 28 B)."""
    return build_table("optimizer_step", ("parameters",), np.array([[2.0**20], [2.0**30]]), np.array([1e-4, 1.12e-2]),
                       "adamw", exponents_above=(1.0,))


def test_the_optimizer_step_from_a_table_scales_its_28_bytes_to_clipping_and_the_copy() -> None:
    """FSDP2 (fp32 weights): (28 + 12) / 28 of the step; Megatron's recipe adds its 2-byte bf16 weight copy; past
    the largest count linear in parameters; below the smallest the analytical 42 bytes and 8 launches."""
    assert FUSED_ADAMW_BYTES_PER_PARAM == ADAMW_BYTES_PER_PARAMETER and CLIP_BYTES_PER_PARAM == 12.0
    rates = dataclasses.replace(ANALYTICAL, optimizer_table_fn=table_parameter_fn(_adamw_table()))
    fsdp, megatron = FSDP2_MIXED, MEGATRON_MIXED
    assert float(optimizer_step_s(2.0**30, rates, fsdp)) == pytest.approx(1.12e-2 * 40 / 28, rel=1e-12)
    assert float(optimizer_step_s(2.0**30, rates, megatron)) == pytest.approx(1.12e-2 * 42 / 28, rel=1e-12)
    assert float(optimizer_step_s(3 * 2.0**30, rates, fsdp)) == pytest.approx(3 * 1.12e-2 * 40 / 28, rel=1e-12)
    # Half-way in log parameters (2**25): sqrt(0.1 ms x 11.2 ms) for the step.
    assert float(optimizer_step_s(2.0**25, rates, fsdp)) == pytest.approx(math.sqrt(1e-4 * 1.12e-2) * 40 / 28)
    small = 2.0**19
    assert float(optimizer_step_s(small, rates, fsdp)) == float(memory_bound_time_s(
        small * OPTIMIZER_BYTES_PER_PARAM, OPTIMIZER_KERNELS, ANALYTICAL))
    assert float(optimizer_step_s(small, ANALYTICAL, fsdp)) == float(optimizer_step_s(small, rates, fsdp))


def _suite_file(sha: str) -> ParsedFile:
    """A training-suite file: eager and compiled residual adds, an eager norm, the AdamW step and a GEMM."""
    rows = [("elementwise", "residual_add", 2e-5, {"bytes": 1e7, "compiled": 0, "op": "residual_add"}),
            ("elementwise", "residual_add", 2e-4, {"bytes": 1e9, "compiled": 0, "op": "residual_add"}),
            ("elementwise", "residual_add", 9e-5, {"bytes": 1e7, "compiled": 1, "op": "residual_add"}),
            ("elementwise", "rmsnorm", 1e-3, {"bytes": 1e8, "compiled": 0, "op": "rmsnorm"}),
            ("elementwise", "adamw_step", 1e-4, {"parameters": 2.0**20, "implementation": "fused", "dtype": "fp32"}),
            ("elementwise", "adamw_step", 1e-2, {"parameters": 2.0**30, "implementation": "fused", "dtype": "fp32"}),
            ("gemm", "matmul", 1e-3, {"m": 4096.0, "n": 4096.0, "k": 4096.0})]
    measurements = tuple(Measurement(kind=kind, name=name, time_s=t, line=i + 1,
                                     params={"dtype": "bf16", "pass": "forward", **params, "stack": STACK})
                         for i, (kind, name, t, params) in enumerate(rows))
    return ParsedFile(path=f"{sha}.json", sha256=sha * 64, kind="paraplan-json", hardware="h100-sxm", software=STACK,
                      measurements=measurements)


def test_a_users_suite_gives_the_curve_from_one_kernel_rows_and_the_fused_step(tmp_path: Path) -> None:
    """The curve takes the eager residual add alone (the compiled row carries torch.compile's dispatch, the eager
    norm runs several kernels); both tables price the measured model, and the provenance names them."""
    store = tmp_path / "store.sqlite"
    ingest_parsed(_suite_file("a"), store)
    curve, adamw = elementwise_table(store, "h100-sxm"), optimizer_table(store, "h100-sxm")
    assert curve is not None and adamw is not None
    assert curve.num_rows == 2 and np.exp(curve.log_seconds).tolist() == pytest.approx([2e-5, 2e-4])
    assert adamw.num_rows == 2
    rates = compute_rates("measured", load_gpu("h100-sxm"), "bf16", "flash", "pytorch", store)
    # 1e8 B is halfway in log bytes between 1e7 (20 us) and 1e9 (200 us): sqrt(20 x 200) = 63.2 us.
    assert float(memory_bound_time_s(1e8, 1, rates)) == pytest.approx(math.sqrt(2e-5 * 2e-4), rel=1e-12)
    assert "element-wise: measured one-kernel HBM time by bytes (h100-sxm, eager residual_add" in rates.source
    assert "optimizer step: measured fused AdamW step by parameters (h100-sxm" in rates.source
    assert elementwise_table(tmp_path / "absent.sqlite", "h100-sxm") is None


def test_the_shipped_h100_tables_price_element_wise_kernels_and_the_step_and_h200_stays_analytical() -> None:
    """The shipped H100 suite timed an eager residual add of 402,653,184 B in 142.9 us (a grid point is at most its
    median) and 2**30 AdamW parameters in 11.7 ms; the H200 file holds neither, so its rates say so."""
    h100 = compute_rates("measured", load_gpu("h100-sxm"), "bf16", "flash", "pytorch", NO_STORE)
    priced = float(memory_bound_time_s(402_653_184.0, 1, h100))
    assert priced <= 142.9e-6 * 1.001 and priced == pytest.approx(142.9e-6, rel=0.01)
    assert float(h100.optimizer_table_fn(2.0**30)[0]) == pytest.approx(11.71e-3, rel=0.01)
    assert "element-wise: measured one-kernel HBM time by bytes (h100-sxm" in h100.source
    assert "; communication: analytical" in h100.source
    h200 = compute_rates("measured", load_gpu("h200-sxm"), "bf16", "flash", "pytorch", NO_STORE)
    assert h200.memory_time_fn is None and h200.optimizer_table_fn is None
    assert "element-wise, optimizer step, communication: analytical" in h200.source
