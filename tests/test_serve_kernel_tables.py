"""``paraplan serve --cost-model measured --store S``: each engine's deployments priced from the store's engine kernel
tables where they cover a term (a plan's TPOT moves by exactly the table's seconds minus the roofline's), the plan
document and the table naming which tables priced what, the tables cached beside the store, every bad input one line,
and the real aiconfigurator wheel end to end (skipped without it)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import aiconfigurator_wheel, assert_bad_input
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cost_models.inference_step import GRAPH_KERNEL_OVERHEAD_S, _saturation, rates_for
from paraplan.cost_models.kernel_tables import build_table
from paraplan.cost_models.serving_kernel_source import DeploymentTables
from paraplan.cost_models.serving_kernels import ServingKernels
from paraplan.hardware_profiles import quick_cluster
from paraplan.hardware_profiles.user_file import HARDWARE_ENV
from paraplan.measurements.store_location import STORE_ENV
from paraplan.model_specs.served import served_model
from paraplan.planner.json_schema import schema_errors
from paraplan.planner.serving.plan import serving_schema
from paraplan.planner.serving.problem import MeasuredTables, ServingProblem
from paraplan.planner.serving.rank import search_serving
from paraplan.planner.serving.space import ServingChoices, ServingWorkload

runner = CliRunner(env={"COLUMNS": "200", HARDWARE_ENV: "", STORE_ENV: ""})
VOCAB, HIDDEN, BATCH = 128256, 4096, 8
"""llama-3.1-8b's output head is a (sequences, 128256, 4096) GEMM at tp 1; its decode pool runs 8 sequences."""
PINNED = ["--engine", "vllm", "--kv-dtype", "bf16", "--tp", "1", "--batch", str(BATCH), "--chunk", "8192"]
SERVE = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "2", "--isl", "1024", "--osl", "256",
         "--concurrency", "64", *PINNED]
"""One prefill and one decode worker of one H100 each (disaggregated), the decode batch held at its cap of 8 by
64 requests in flight: TPOT is one decode step at batch 8 plus the engine's step overhead."""


def invoke(*args: str):
    return runner.invoke(app, list(args))


def head_table(seconds: float):
    """The head GEMM at every m from 1 to 4096, ``seconds`` each."""
    shapes = np.array([[m, VOCAB, HIDDEN] for m in (1, 16, 256, 4096)], dtype=float)
    return build_table("gemm", ("m", "n", "k"), shapes, np.full(4, seconds), "synthetic head")


def head_roofline_s(batch: float) -> float:
    """The analytical head at ``batch`` sequences: max(FLOPs at the shape-saturated bf16 rate, weights at HBM rate)."""
    rates = rates_for(quick_cluster("h100-sxm", 2), "bf16")
    compute = 2.0 * batch * VOCAB * HIDDEN / (rates.gemm_flops_per_s * float(_saturation(batch, rates.gemm_half_dim)))
    return max(compute, VOCAB * HIDDEN * 2.0 / rates.memory_bytes_per_s)


def disagg_tpot_s(head_s: float | None) -> tuple[float, dict]:
    """(TPOT, the plan's document entry) of SERVE's deployment with the head GEMM priced at ``head_s`` (None:
    analytical), through the library: a synthetic ``ServingKernels`` on the vLLM bf16 setup."""
    served = served_model("llama-3.1-8b")
    choices = ServingChoices(engines=("vllm",), kv_dtypes=("bf16",), modes=("disagg",),
                             fixed={"tp": (1,), "batch": (BATCH,), "chunk": (8192,)})
    measured = None
    if head_s is not None:
        tables = DeploymentTables(kernels=ServingKernels(head_gemm=head_table(head_s), label="synthetic"),
                                  terms=(("head and router", "synthetic head on vllm 0.9.0"),), engine="vllm")
        measured = MeasuredTables(store="synthetic", by_setup=((("h100-sxm", "vllm", "bf16"), tables),))
    problem = ServingProblem(model=served.spec, clusters=(quick_cluster("h100-sxm", 2),),
                             workload=ServingWorkload(isl=1024, osl=256, concurrency=64), choices=choices,
                             measured=measured)
    plan = search_serving(problem, top=1).plans[0]
    assert [(p.shape.role, p.shape.num_workers, p.shape.tp) for p in plan.pools] == [("prefill", 1, 1),
                                                                                     ("decode", 1, 1)]
    assert plan.estimate["running_batch"] == BATCH
    return plan.estimate["tpot_s"]["mean"], plan


def test_tpot_moves_by_exactly_the_tables_seconds():
    """Metamorphic: a head table of 300 us instead of 100 us adds exactly 200 us to each decode step, hence to TPOT.
    Hand-derived: against the roofline, TPOT moves by the table's seconds minus the roofline head at batch 8, less
    the one CUDA-graph kernel gap the table's time already holds."""
    plain, _ = disagg_tpot_s(None)
    low, plan = disagg_tpot_s(100e-6)
    high, _ = disagg_tpot_s(300e-6)
    assert high - low == pytest.approx(200e-6, rel=1e-9)
    assert low - plain == pytest.approx(100e-6 - head_roofline_s(BATCH) - GRAPH_KERNEL_OVERHEAD_S, rel=1e-9)
    assert plan.pools[1].setup.cluster.serving_kernels is not None


def synthetic_store(path: Path, seconds: float = 100e-6, hardware: str = "h100-sxm") -> Path:
    """A profile store holding one aiconfigurator-style GEMM table: vLLM 0.9.0's bf16 head GEMM on ``hardware``."""
    from paraplan.measurements.ingest.records import Measurement, ParsedFile
    from paraplan.measurements.store import ingest_all

    rows = tuple(Measurement(kind="gemm", name="synthetic_linear", time_s=seconds, line=n + 1,
                             params={"m": m, "n": VOCAB, "k": HIDDEN, "dtype": "bf16", "stack": "vllm 0.9.0"})
                 for n, m in enumerate((1, 16, 256, 4096)))
    digest = hashlib.sha256(repr((hardware, rows)).encode()).hexdigest()
    ingest_all([ParsedFile(path="synthetic.parquet", sha256=digest, kind="aiconfigurator", hardware=hardware,
                           software="synthetic", measurements=rows)], path)
    return path


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return synthetic_store(tmp_path / "store.sqlite")


def _document(path: Path) -> dict:
    document = json.loads(path.read_text())
    assert schema_errors(document, serving_schema()) == []
    return document


def test_cli_prices_from_the_store_and_names_the_tables(tmp_path: Path, store: Path):
    """End to end: the plan's TPOT is the analytical one moved by the table's 100 us less the roofline head; the
    document and the table name the engine, version and terms; the tables are cached beside the store and a second
    run reads them to the same document."""
    plain = tmp_path / "plain.json"
    assert invoke(*SERVE, "--mode", "disagg", "--json", str(plain)).exit_code == 0
    measured = tmp_path / "measured.json"
    result = invoke(*SERVE, "--mode", "disagg", "--cost-model", "measured", "--store", str(store), "--json",
                    str(measured))
    assert result.exit_code == 0, result.output
    before, after = _document(plain), _document(measured)
    moved = after["plans"][0]["estimate"]["tpot_s"]["mean"] - before["plans"][0]["estimate"]["tpot_s"]["mean"]
    assert moved == pytest.approx(100e-6 - head_roofline_s(BATCH) - GRAPH_KERNEL_OVERHEAD_S, rel=1e-9)
    assert "kernel_tables" not in before["provenance"] and "kernel_tables" not in before["plans"][0]
    pools = after["plans"][0]["kernel_tables"]
    assert [p["role"] for p in pools] == ["prefill", "decode"]
    assert all(p["engine"] == "vllm" and p["versions"] == ["0.9.0"] for p in pools)
    assert "synthetic_linear on vllm 0.9.0" in pools[1]["terms"]["head and router"]
    assert 0 < pools[1]["decode_step_table_frac"] < 0.1 and pools[1]["prefill_table_frac"] is None
    assert pools[0]["decode_step_table_frac"] is None
    assert after["provenance"]["kernel_tables"]["store"] == str(store)
    assert after["provenance"]["cost_model"].startswith("measured engine kernel tables")
    assert "kernel tables from" in result.stdout and "vllm 0.9.0 tables priced" in result.stdout
    cached = list((tmp_path / "store.models" / "kernel_tables" / "h100-sxm").glob("serving-vllm-*.npz"))
    assert len(cached) == 1
    again = tmp_path / "again.json"
    assert invoke(*SERVE, "--mode", "disagg", "--cost-model", "measured", "--store", str(store), "--json",
                  str(again)).exit_code == 0
    assert json.loads(again.read_text()) == after


@pytest.mark.parametrize("mode", ["agg", "disagg"])
def test_every_export_of_a_measured_plan_is_written(tmp_path: Path, store: Path, mode: str):
    out = tmp_path / "launch"
    result = invoke(*SERVE, "--mode", mode, "--cost-model", "measured", "--store", str(store), "--export", "all",
                    "-o", str(out))
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in out.iterdir())
    assert "serving-plan.json" in written and all(f"wrote {out / name}" in result.stdout for name in written)
    document = _document(out / "serving-plan.json")
    assert document["plans"][0]["mode"] == mode and document["plans"][0]["kernel_tables"]


def test_an_engine_without_tables_is_priced_analytically_with_a_note(tmp_path: Path, store: Path):
    path = tmp_path / "serve.json"
    args = [a if a != "vllm" else "vllm,trtllm" for a in SERVE]
    result = invoke(*args, "--cost-model", "measured", "--store", str(store), "--top", "10", "--json", str(path))
    assert result.exit_code == 0, result.output
    assert f"the store {store} holds no trtllm tables for h100-sxm: trtllm is priced analytically" in result.stderr
    document = _document(path)
    setups = {s["engine"]: s for s in document["provenance"]["kernel_tables"]["setups"]}
    assert setups["trtllm"]["versions"] == [] and setups["trtllm"]["terms"] == {}
    assert setups["vllm"]["versions"] == ["0.9.0"]
    trtllm = [p for p in document["plans"] if p["engine"] == "trtllm"]
    assert trtllm and all(pool["versions"] == [] for p in trtllm for pool in p["kernel_tables"])
    assert "none stored, analytical" in result.stdout


def test_store_without_measured_changes_nothing(tmp_path: Path, store: Path):
    plain, given = tmp_path / "plain.json", tmp_path / "given.json"
    assert invoke(*SERVE, "--json", str(plain)).exit_code == 0
    result = invoke(*SERVE, "--store", str(store), "--json", str(given))
    assert result.exit_code == 0, result.output
    assert "is read only with --cost-model measured" in result.stderr
    assert json.loads(plain.read_text()) == json.loads(given.read_text())


def test_bad_store_and_cost_model_inputs_are_one_line(tmp_path: Path, store: Path):
    measured = ["--cost-model", "measured", "--store"]
    assert_bad_input(invoke(*SERVE, *measured, str(tmp_path / "none.sqlite")), "no such profile store")
    other_gpu = [a if a != "h100-sxm" else "h200-sxm" for a in SERVE]
    assert_bad_input(invoke(*other_gpu, *measured, str(store)), "holds no aiconfigurator serving tables for h200-sxm",
                     "paraplan ingest aiconfigurator")
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(os.urandom(4096))
    assert_bad_input(invoke(*SERVE, *measured, str(garbage)))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_bad_input(invoke(*SERVE, *measured, str(empty)), "no such profile store")
    assert_bad_input(invoke(*SERVE, "--cost-model", "learned"), "serve has no learned models")
    assert_bad_input(invoke(*SERVE, "--cost-model", "roofline"), "--cost-model expects")
    assert_bad_input(invoke(*SERVE, *measured, str(store), "--engine-version", "vllm=0.1.0"),
                     "holds no vllm 0.1.0 tables for h100-sxm", "0.9.0")
    assert_bad_input(invoke(*SERVE, "--engine-version", "vllm=0.9.0"), "add --cost-model measured")
    assert_bad_input(invoke(*SERVE, *measured, str(store), "--engine-version", "vllm"), "ENGINE=VERSION")
    assert_bad_input(invoke(*SERVE, *measured, str(store), "--engine-version", "sglang=0.5.14"), "not searched")


def test_a_pinned_version_prices_as_the_newest_when_it_is_the_one_stored(tmp_path: Path, store: Path):
    newest, pinned = tmp_path / "newest.json", tmp_path / "pinned.json"
    for path, extra in ((newest, []), (pinned, ["--engine-version", "vllm=0.9.0"])):
        result = invoke(*SERVE, "--cost-model", "measured", "--store", str(store), *extra, "--json", str(path))
        assert result.exit_code == 0, result.output
    assert json.loads(newest.read_text())["plans"] == json.loads(pinned.read_text())["plans"]


# -- the real wheel -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h100_store(tmp_path_factory) -> Path:
    """aiconfigurator 0.12's H100 tables (GEMM, attention, collectives, MoE) ingested into a fresh store (~8 s)."""
    named = aiconfigurator_wheel()
    store = tmp_path_factory.mktemp("aic") / "store.sqlite"
    result = invoke("ingest", "aiconfigurator", str(named), "--hardware", "h100-sxm", "--op",
                    "gemm,attention,collective,moe", "--store", str(store))
    assert result.exit_code == 0, result.output
    return store


def test_real_wheel_serve_with_the_store(h100_store: Path, tmp_path: Path):
    """Llama 3.1 8B on 8 H100 under vLLM: the newest vLLM tables (0.24.0 in aiconfigurator 0.12) price most of the
    decode step; the second run reads the cached tables and writes the same document."""
    args = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--isl", "1024", "--osl", "256",
            "--concurrency", "32", "--engine", "vllm", "--cost-model", "measured", "--store", str(h100_store)]
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    result = invoke(*args, "--json", str(first))
    assert result.exit_code == 0, result.output
    document = _document(first)
    best = document["plans"][0]["kernel_tables"][0]
    assert best["engine"] == "vllm" and best["versions"] == ["0.24.0"]
    assert {"dense GEMMs", "attention projections", "decode attention", "prefill attention"} <= set(best["terms"])
    assert best["decode_step_table_frac"] > 0.5
    assert invoke(*args, "--json", str(second)).exit_code == 0
    assert json.loads(second.read_text()) == document
    pinned = invoke(*args, "--engine-version", "vllm=0.24.0", "--json", "-")
    assert pinned.exit_code == 0 and json.loads(pinned.stdout)["plans"] == document["plans"]
