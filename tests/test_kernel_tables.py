"""Measured kernel tables: interpolation, physics, coverage, and the measured cost model end to end."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cost_models.compute import analytical_rates, gemm_time_s
from paraplan.cost_models.kernel_pricing import distinct_queries, gemm_coverage, table_gemm_seconds
from paraplan.cost_models.kernel_source import training_gemm_table
from paraplan.cost_models.kernel_tables import build_table, lookup
from paraplan.cost_models.learned.provider import compute_rates
from paraplan.hardware_profiles import load_gpu
from paraplan.measurements import builtin_kernels
from paraplan.measurements.ingest.records import Measurement, ParsedFile
from paraplan.measurements.store import ingest_parsed

GRID = (256.0, 1024.0, 4096.0)
RATE = 5e14  # flop/s of the synthetic kernel: t = 2mnk / RATE, a power law in every axis


def _power_law_rows() -> tuple[np.ndarray, np.ndarray]:
    shapes = np.array(list(itertools.product(GRID, GRID, GRID)))
    return shapes, 2.0 * shapes.prod(axis=1) / RATE


def test_power_law_is_exact_on_and_between_grid_points() -> None:
    # Multilinear in (log2 shape, log seconds) reproduces a power law exactly, on the grid and between its lines.
    table = build_table("gemm", ("m", "n", "k"), *_power_law_rows(), label="synthetic")
    queries = np.array([[256, 256, 256], [512, 1024, 3000], [300, 2000, 4096], [4096, 4096, 4096]], dtype=float)
    seconds, covered = lookup(table, queries)
    assert covered.all()
    np.testing.assert_allclose(seconds, 2.0 * queries.prod(axis=1) / RATE, rtol=1e-12)


def test_above_the_largest_size_gemm_time_scales_linearly_and_below_the_smallest_is_not_covered() -> None:
    table = build_table("gemm", ("m", "n", "k"), *_power_law_rows(), label="synthetic")
    seconds, covered = lookup(table, np.array([[8192, 4096, 4096], [16384, 8192, 1024], [128, 1024, 1024]]))
    np.testing.assert_allclose(seconds[:2], [2 * 8192 * 4096 * 4096 / RATE, 2 * 16384 * 8192 * 1024 / RATE],
                               rtol=1e-12)
    assert covered.tolist() == [True, True, False] and np.isnan(seconds[2])


def test_an_axis_without_an_exponent_covers_nothing_above_its_largest_line() -> None:
    shapes = np.array([[1024.0, 8.0], [2048.0, 8.0], [1024.0, 16.0], [2048.0, 16.0]])
    table = build_table("attention_forward", ("seq_len", "heads"), shapes, np.array([1.0, 4.0, 2.0, 8.0]), "x",
                        exponents_above=(2.0, None))
    seconds, covered = lookup(table, np.array([[4096.0, 16.0], [2048.0, 32.0]]))
    assert covered.tolist() == [True, False]
    assert seconds[0] == pytest.approx(8.0 * 4.0)  # s² above the largest sequence: twice as long, 4x the time


def test_a_spike_in_measured_time_is_lowered_to_the_larger_shapes_and_duplicates_take_the_median() -> None:
    shapes = np.array([[1.0], [2.0], [4.0], [4.0], [4.0], [8.0]])
    table = build_table("copy", ("bytes",), shapes, np.array([1.0, 5.0, 3.0, 2.0, 10.0, 4.0]), "x")
    # 5.0 (a glitch) lowered to median(2, 3, 10) = 3.0 above it; 1.0 and 4.0 kept.
    np.testing.assert_allclose(np.exp(table.log_seconds), [1.0, 3.0, 3.0, 4.0])


def test_one_slow_glitch_does_not_spread_to_larger_shapes() -> None:
    """The H100 suite's (2048, 1024, 4096) GEMM ran at 35 TFLOP/s during a few seconds' glitch; the shapes above it
    keep their own times (a running maximum raised (8192, 4096, 4096) from 415 to 490 us)."""
    shapes = np.array(list(itertools.product(GRID, GRID, GRID)), dtype=float)
    seconds = 2 * shapes.prod(axis=1) / RATE
    glitch = np.all(shapes == [1024.0, 1024.0, 1024.0], axis=1)
    seconds[glitch] *= 20.0
    table = build_table("gemm", ("m", "n", "k"), shapes, seconds, label="glitch")
    priced, _ = lookup(table, np.array([[2048.0, 4096.0, 4096.0], [1024.0, 1024.0, 1024.0]]))
    assert priced[0] == pytest.approx(2 * 2048 * 4096 * 4096 / RATE, rel=1e-12)
    assert priced[1] == pytest.approx(2 * 4096 * 1024 * 1024 / RATE, rel=1e-12)  # the next larger measured shape


def test_a_query_touching_an_unmeasured_cell_is_not_covered_and_one_away_from_it_is() -> None:
    shapes, seconds = _power_law_rows()
    keep = ~np.all(shapes == [4096.0, 4096.0, 4096.0], axis=1)
    table = build_table("gemm", ("m", "n", "k"), shapes[keep], seconds[keep], label="synthetic")
    _, covered = lookup(table, np.array([[3000, 3000, 3000], [1024, 1024, 1024], [700, 4096, 4096]]))
    assert covered.tolist() == [False, True, True]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=9, max_size=9), st.floats(256.0, 4096.0), st.floats(256.0, 4096.0),
       st.floats(256.0, 4096.0))
def test_lookups_never_fall_as_any_axis_grows(noise: list[float], a: float, b: float, c: float) -> None:
    shapes = np.array(list(itertools.product(GRID, GRID)))
    table = build_table("t", ("x", "y"), shapes, np.array(noise), "noisy")
    lo, _ = lookup(table, np.array([[a, b]]))
    hi_x, _ = lookup(table, np.array([[max(a, c), b]]))
    hi_y, _ = lookup(table, np.array([[a, max(b, c)]]))
    assert hi_x[0] >= lo[0] * (1 - 1e-12) and hi_y[0] >= lo[0] * (1 - 1e-12)


def test_the_pricer_takes_the_table_where_it_covers_and_the_analytical_roofline_elsewhere() -> None:
    rates = analytical_rates(load_gpu("h100-sxm"), "bf16")
    table = build_table("gemm", ("m", "n", "k"), *_power_law_rows(), label="synthetic")
    m, n, k = np.array([512.0, 64.0]), np.array([1024.0, 1024.0]), np.array([2048.0, 2048.0])
    seconds, covered = table_gemm_seconds(table, rates, m, n, k)
    assert covered.tolist() == [True, False]
    assert seconds[0] == pytest.approx(2 * 512 * 1024 * 2048 / RATE, rel=1e-12)
    assert seconds[1] == pytest.approx(float(gemm_time_s(64.0, 1024.0, 2048.0, rates)), rel=1e-12)
    share = gemm_coverage(table, rates, np.column_stack([m, n, k]))
    assert share == pytest.approx(seconds[0] / seconds.sum(), rel=1e-12)


def _gemm_file(sha: str, name: str, dtype: str, scale: float, stack: str = "vllm 0.24.0") -> ParsedFile:
    shapes, seconds = _power_law_rows()
    rows = tuple(Measurement(kind="gemm", name=name, time_s=float(t * scale), line=i + 1,
                             params={"m": float(s[0]), "n": float(s[1]), "k": float(s[2]), "dtype": dtype,
                                     "stack": stack})
                 for i, (s, t) in enumerate(zip(shapes, seconds, strict=True)))
    return ParsedFile(path=f"{sha}.parquet", sha256=sha * 64, kind="aiconfigurator", hardware="h100-sxm",
                      software=stack, measurements=rows)


def test_training_takes_pytorch_linear_16bit_gemms_and_new_data_replaces_the_cached_table(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    ingest_parsed(_gemm_file("b", "CutlassFP8ScaledMMLinearKernel", "fp8", 0.5), store)
    assert training_gemm_table(store, "h100-sxm", "bf16") is None  # no 16-bit rows: remembered, not rescanned
    assert list((tmp_path / "store.models" / "kernel_tables" / "h100-sxm").glob("gemm-bf16-*.none"))
    ingest_parsed(_gemm_file("a", "torch.nn.functional.linear", "bf16", 1.0), store)
    table = training_gemm_table(store, "h100-sxm", "bf16")
    assert table is not None and "torch.nn.functional.linear on vllm 0.24.0" in table.label
    assert training_gemm_table(store, "h100-sxm", "fp8") is None  # low-precision recipes stay analytical
    cached = list((tmp_path / "store.models" / "kernel_tables" / "h100-sxm").glob("gemm-bf16-*.npz"))
    assert len(cached) == 1
    cached[0].write_bytes(b"not a table")  # a damaged cache is rebuilt from the store, never trusted
    rebuilt = training_gemm_table(store, "h100-sxm", "bf16")
    assert rebuilt is not None and np.array_equal(rebuilt.log_seconds, table.log_seconds, equal_nan=True)
    ingest_parsed(_gemm_file("c", "gemm", "bf16", 2.0, stack="pytorch 2.11.0+cu130"), store)
    own = training_gemm_table(store, "h100-sxm", "bf16")  # paraplan's own suite wins over a serving engine's
    assert own is not None and "pytorch 2.11.0+cu130" in own.label
    seconds, _ = lookup(own, np.array([[1024.0, 1024.0, 1024.0]]))
    assert seconds[0] == pytest.approx(2.0 * 2 * 1024**3 / RATE, rel=1e-12)


def test_older_collectors_16bit_rows_are_pytorch_linear_and_each_engines_newest_version_prices(tmp_path: Path) -> None:
    """aiconfigurator's A100 tables name their 16-bit F.linear rows by engine alone (``sglang`` on SGLang 0.5.10,
    ``vllm_default`` on vLLM 0.14.0): they price training GEMMs, pooled by the cell median; an engine's older
    release (SGLang 0.5.6.post2) and the same kernel name's fp8 rows do not."""
    store = tmp_path / "store.sqlite"
    ingest_parsed(_gemm_file("a", "sglang", "bf16", 1.0, stack="sglang 0.5.10"), store)
    ingest_parsed(_gemm_file("b", "vllm_default", "bf16", 4.0, stack="vllm 0.14.0"), store)
    ingest_parsed(_gemm_file("c", "sglang", "bf16", 100.0, stack="sglang 0.5.6.post2"), store)
    ingest_parsed(_gemm_file("d", "sglang", "fp8", 0.01, stack="sglang 0.5.10"), store)
    table = training_gemm_table(store, "h100-sxm", "bf16")
    assert table is not None
    assert "sglang on sglang 0.5.10" in table.label and "vllm_default on vllm 0.14.0" in table.label
    assert "0.5.6.post2" not in table.label
    # Two rows a cell, 1x and 4x the power law: the median of their log-seconds is the power law times 2.
    seconds, covered = lookup(table, np.array([[1024.0, 1024.0, 1024.0], [512.0, 2048.0, 4096.0]]))
    assert covered.all()
    np.testing.assert_allclose(seconds, [2.0 * 2 * 1024**3 / RATE, 2.0 * 2 * 512 * 2048 * 4096 / RATE], rtol=1e-12)


def test_measured_rates_price_gemms_from_the_table_and_say_so(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    ingest_parsed(_gemm_file("a", "torch.nn.functional.linear", "bf16", 1.0), store)
    gpu = load_gpu("h100-sxm")
    rates = compute_rates("measured", gpu, "bf16", "flash", "pytorch", store)
    assert "measured bf16 GEMM table (h100-sxm" in rates.source
    assert float(gemm_time_s(1024.0, 2048.0, 512.0, rates)) == pytest.approx(2 * 1024 * 2048 * 512 / RATE, rel=1e-12)
    # The store has no attention table: paraplan's shipped H100 suite prices attention (measured/kernels/README.md).
    assert "attention: measured causal SDPA table (h100-sxm, backend flash on pytorch 2.11.0+cu130)" in rates.source
    assert rates.attention_table_fn is not None
    plain = compute_rates("auto", gpu, "bf16", "flash", "pytorch", store)
    assert plain.gemm_time_fn is None  # auto does not take the tables yet (COST_MODELS docstring says why)
    assert dataclasses.replace(rates, gemm_time_fn=None, attention_table_fn=None, memory_time_fn=None,
                               optimizer_table_fn=None, grouped_gemm_table_fn=None, source=plain.source) == plain


def test_measured_cost_model_without_a_table_is_one_line_exit_2(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    ingest_parsed(_gemm_file("a", "torch.nn.functional.linear", "bf16", 1.0), store)
    runner = CliRunner()
    args = ["evaluate", "llama-3.1-8b", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64", "--tp", "1",
            "--pp", "1", "--store", str(store), "--cost-model", "measured"]
    result = runner.invoke(app, [*args, "--gpu", "a100-sxm-80gb"])
    assert result.exit_code == 2 and "no measured bf16 GEMM table for a100-sxm-80gb" in result.output
    assert len(result.output.strip().splitlines()) == 1
    ok = runner.invoke(app, [*args, "--gpu", "h100-sxm", "--json", "-"])
    assert ok.exit_code == 0, ok.output
    assert "measured bf16 GEMM table (h100-sxm" in ok.output


def test_learned_models_train_on_training_stacks_not_on_serving_engines_kernel_tables(tmp_path: Path) -> None:
    from paraplan.cost_models.learned.learn import learn_hardware

    store = tmp_path / "store.sqlite"
    ingest_parsed(_gemm_file("a", "torch.nn.functional.linear", "bf16", 1.0), store)  # vLLM's: a kernel table only
    assert [t for t in learn_hardware(store, "h100-sxm") if t.meta.target.startswith("gemm")] == []
    ingest_parsed(_gemm_file("c", "matmul", "bf16", 1.0, stack="pytorch 2.11.0+cu130"), store)  # paraplan's suite
    learned = [t for t in learn_hardware(store, "h100-sxm") if t.meta.target.startswith("gemm")]
    assert [t.meta.target for t in learned] == ["gemm-16bit"]


ATTENTION_K = 3e-13  # seconds per (token² x head) of the synthetic SDPA kernel: forward = K·s²·(sequences x heads)


def _attention_file(sha: str, backend: str, scale: float = 1.0) -> ParsedFile:
    """A training-suite SDPA table: head dim 64, forward ``scale``·K·s²·b·h, backward 2.5x forward."""
    rows, line = [], 0
    for seq, batch, heads in itertools.product((1024.0, 4096.0, 16384.0), (1.0, 4.0), (8.0, 32.0)):
        for which, factor in (("forward", 1.0), ("backward", 2.5)):
            line += 1
            rows.append(Measurement(kind="attention", name="sdpa",
                                    time_s=scale * factor * ATTENTION_K * seq**2 * batch * heads,
                                    line=line, params={"batch": batch, "seq_len": seq, "heads": heads,
                                                       "kv_heads": heads / 4, "head_dim": 64.0, "causal": 1,
                                                       "pass": which, "backend": backend, "dtype": "bf16",
                                                       "stack": "pytorch 2.11.0+cu130"}))
    return ParsedFile(path=f"{sha}.json", sha256=sha * 64, kind="paraplan-json", hardware="h100-sxm",
                      software="pytorch 2.11.0+cu130", measurements=tuple(rows))


def test_measured_attention_prices_whole_sequences_per_gpu_and_leaves_context_parallel_shards_analytical(
        tmp_path: Path) -> None:
    from paraplan.cost_models.layer import _attention_core_s
    from paraplan.planner.job import ParallelConfig, TrainingJob, configs_to_table
    from paraplan.validation.memory_probe import probe_model

    store = tmp_path / "store.sqlite"
    ingest_parsed(_gemm_file("c", "matmul", "bf16", 1.0, stack="pytorch 2.11.0+cu130"), store)
    ingest_parsed(_attention_file("d", "flash"), store)
    ingest_parsed(_attention_file("e", "cudnn"), store)
    ingest_parsed(_attention_file("f", "default", scale=0.5), store)  # SDPA's own pick (cuDNN's speed): not flash
    gpu = load_gpu("h100-sxm")
    rates = compute_rates("measured", gpu, "bf16", "flash", "pytorch", store)
    assert "attention: measured causal SDPA table (h100-sxm, backend flash on pytorch 2.11.0+cu130) for head dims " \
        "64" in rates.source
    model = probe_model("llama3-1b")  # 32 heads of 64
    job = TrainingJob(model=model, seq_len=8192, global_batch=2, precision="bf16", engine="torchtitan",
                      attention="flash")
    configs = [ParallelConfig(tp=tp, pp=1, dp=1, cp=cp, vpp=1, mbs=2, zero=0, recompute="none", sp=False,
                              cp_comm="allgather") for tp, cp in ((1, 1), (2, 1), (1, 2))]
    t = configs_to_table(configs)
    tokens = t.mbs * job.seq_len / t.cp
    forward, backward = _attention_core_s(model, job.workload(), tokens, t, rates)
    # Whole sequences: 2 sequences x 32 heads (x 16 under tp 2) at s = 8,192, between measured grid points.
    expected = ATTENTION_K * 8192.0**2 * np.array([64.0, 32.0])
    np.testing.assert_allclose(forward[:2], expected, rtol=1e-9)
    np.testing.assert_allclose(backward[:2], 2.5 * expected, rtol=1e-9)
    plain = dataclasses.replace(rates, attention_table_fn=None)
    analytical = _attention_core_s(model, job.workload(), tokens, t, plain)
    assert forward[2] == analytical[0][2] and backward[2] == analytical[1][2]  # cp 2: each GPU holds half a sequence
    fused = compute_rates("measured", gpu, "bf16", "fused", "transformer_engine", store)
    assert "backend cudnn" in fused.source  # Transformer Engine's cuDNN attention reads the cuDNN rows


def test_validate_kernel_tables_without_a_store_is_one_line_and_a_store_without_tables_says_so(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["validate", "--kernel-tables", str(tmp_path / "none.sqlite")])
    assert missing.exit_code == 2 and "no profile store at" in missing.output
    assert len(missing.output.strip().splitlines()) == 1
    store = tmp_path / "store.sqlite"
    ingest_parsed(_gemm_file("b", "CutlassFP8ScaledMMLinearKernel", "fp8", 0.5), store)  # no 16-bit table
    with pytest.MonkeyPatch.context() as patch:  # without paraplan's shipped tables too
        patch.setattr(builtin_kernels, "shipped_files", lambda: [])
        empty = runner.invoke(app, ["validate", "--kernel-tables", str(store)])
    assert empty.exit_code == 0 and "nothing to compare" in empty.output


def _nccl_file(sha: str, stack: str, scale: float) -> ParsedFile:
    """all_reduce of 1 MiB .. 64 MiB over 2-8 GPUs inside one node: t = scale x 2(n-1)/n x bytes / 300 GB/s."""
    rows, line = [], 0
    for size, n in itertools.product((2.0**20, 2.0**23, 2.0**26), (2.0, 4.0, 8.0)):
        line += 1
        rows.append(Measurement(kind="collective", name="all_reduce", line=line,
                                time_s=scale * 2 * (n - 1) / n * size / 3e11,
                                params={"size_bytes": size, "group_size": n, "domain": "intra", "dtype": "fp16",
                                        "stack": stack}))
    return ParsedFile(path=f"{sha}.parquet", sha256=sha * 64, kind="aiconfigurator", hardware="h100-sxm",
                      software=stack, measurements=tuple(rows))


def test_measured_collectives_price_groups_inside_one_node_from_the_newest_nccl(tmp_path: Path) -> None:
    from paraplan.cost_models.collectives import collective_time_s
    from paraplan.cost_models.learned.provider import learned_cluster
    from paraplan.hardware_profiles import quick_cluster

    store = tmp_path / "store.sqlite"
    ingest_parsed(_gemm_file("a", "torch.nn.functional.linear", "bf16", 1.0), store)
    ingest_parsed(_nccl_file("b", "nccl 2.23", 2.0), store)
    ingest_parsed(_nccl_file("c", "nccl 2.29.2", 1.0), store)
    plain = quick_cluster("h100-sxm", 16)
    cluster = learned_cluster("measured", plain, store)
    assert "all_reduce (h100-sxm, nccl 2.29.2, 9 rows)" in cluster.collective_source
    # Inside a node, between measured sizes: the newest version's law; twice the largest buffer: twice the time.
    inside = collective_time_s("all_reduce", np.array([2.0**22, 2.0**27]), 8, 1, cluster)
    np.testing.assert_allclose(inside, 2 * 7 / 8 * np.array([2.0**22, 2.0**27]) / 3e11, rtol=1e-9)
    # 16 GPUs span two nodes, and an all-gather has no table: both analytical.
    for kind, n in (("all_reduce", 16), ("all_gather", 8)):
        assert collective_time_s(kind, 2.0**24, n, 1, cluster) == collective_time_s(kind, 2.0**24, n, 1, plain)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 5),
                                             st.integers(0, 5)), min_size=1, max_size=60))
def test_distinct_queries_is_numpys_unique_over_rows(width, rows):
    # The lexsort grouping the table lookups use: the same distinct rows, in the same order, and the same inverse
    # as np.unique(axis=0, return_inverse=True).
    data = np.array(rows, dtype=float)[:, :width] * 0.5
    distinct, inverse = distinct_queries([data[:, i] for i in range(width)])
    expected, expected_inverse = np.unique(data, axis=0, return_inverse=True)
    np.testing.assert_array_equal(distinct, expected)
    np.testing.assert_array_equal(inverse, np.asarray(expected_inverse).ravel())
