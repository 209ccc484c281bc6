"""``paraplan profile`` on CPU (labelled cpu), its shapes, its NCCL-path under torchrun with gloo, and ingesting it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.errors import InputError
from paraplan.measurements.ingest import parse_file
from paraplan.measurements.profiler import ProfileSettings, model_gemm_shapes, run_profile
from paraplan.model_specs.hf_config import load_model

DISTRIBUTED = """
import json, sys, torch.distributed as dist
from paraplan.measurements.profiler import ProfileSettings, run_profile
dist.init_process_group("gloo")
doc = run_profile(ProfileSettings(gemm_shapes=((8, 16, 32),), collective_bytes=(4096,), repeats=2, warmup=1,
                                  device="cpu"))
if dist.get_rank() == 0:
    json.dump(doc, open(sys.argv[1], "w"))
dist.destroy_process_group()
"""


def test_llama_layer_shapes():
    shapes = model_gemm_shapes(load_model("llama-3.1-8b"), tokens=(8,), tps=(1, 8))
    # hidden 4096, 32 heads of 128, 8 KV heads, gated FFN 14336: QKV N = 4096 + 2·1024, up N = 2·14336.
    assert set(shapes) == {(8, 6144, 4096), (8, 4096, 4096), (8, 28672, 4096), (8, 4096, 14336),
                           (8, 768, 4096), (8, 4096, 512), (8, 3584, 4096), (8, 4096, 1792)}


def test_without_torch_is_input_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(InputError, match=r"needs PyTorch: pip install 'paraplan\[profile\]'"):
        run_profile(ProfileSettings(gemm_shapes=((8, 8, 8),), device="cpu"))


def test_cpu_profile_is_labelled_cpu():
    pytest.importorskip("torch", reason="the [profile] extra (PyTorch) is not installed")
    doc = run_profile(ProfileSettings(gemm_shapes=((8, 16, 32), (256, 256, 256)), attention_shapes=((1, 2, 64, 32),),
                                      copy_bytes=(2**20,), repeats=3, warmup=1, device="cpu"))
    assert (doc["hardware"], doc["device"]) == ("cpu", "cpu") and "device: cpu" in doc["software"]
    kinds = [(m["kind"], m["params"].get("pass", "")) for m in doc["measurements"]]
    assert kinds == [("gemm", "forward"), ("gemm", "forward"), ("memory", ""), ("attention", "forward"),
                     ("attention", "backward")]
    import torch

    assert {m["params"]["stack"] for m in doc["measurements"]} == {f"pytorch {torch.__version__}"}
    small, large = doc["measurements"][:2]
    assert 0 < small["time_s"] < large["time_s"]  # 2·256³ FLOPs against 2·8·16·32: 4096x the work
    assert doc["measurements"][2]["params"]["bytes"] == 2 * 2**20


def test_cli_profile_then_ingest(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="the [profile] extra (PyTorch) is not installed")
    monkeypatch.setenv("PARAPLAN_STORE", str(tmp_path / "p.sqlite"))
    out = tmp_path / "prof.json"
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(app, ["profile", "--model", "llama-3.1-8b", "--device", "cpu", "--tokens", "4",
                                 "--tp", "8", "--seq-len", "32", "--copy-mib", "1", "--repeats", "2", "--warmup", "0",
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "4 gemm" in result.output and "next: paraplan ingest" in result.output
    parsed = parse_file(out)
    assert parsed.kind == "paraplan-json" and parsed.hardware == "cpu" and len(parsed.measurements) == 4 + 1 + 2
    ingested = runner.invoke(app, ["ingest", str(out)])
    assert ingested.exit_code == 0 and " cpu " in ingested.output
    again = runner.invoke(app, ["profile", "--device", "cpu", "-o", str(out)])
    assert again.exit_code == 2 and "already exists" in again.stderr


def test_collectives_under_torchrun_gloo(tmp_path):
    pytest.importorskip("torch", reason="the [profile] extra (PyTorch) is not installed")
    script, out = tmp_path / "dist.py", tmp_path / "doc.json"
    script.write_text(DISTRIBUTED)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", "127.0.0.1:0", str(script), str(out)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [m for m in json.loads(out.read_text())["measurements"] if m["kind"] == "collective"]
    assert [r["name"] for r in rows] == ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
    assert all(r["params"]["group_size"] == 2 and r["params"]["size_bytes"] == 4096 and r["time_s"] > 0 for r in rows)


def test_run_time_estimate_counts_every_run_of_every_shape():
    from paraplan.measurements.profiler import ProfileSettings, estimated_seconds

    settings = ProfileSettings(gemm_shapes=((16, 512, 4096), (64, 512, 4096)), attention_shapes=((1, 4, 256, 128),),
                               warmup=1, repeats=3)
    gemm = 2 * 16 * 512 * 4096 + 2 * 64 * 512 * 4096
    attention = 4 * 1 * 4 * 256 * 256 * 128 * 3.5
    assert estimated_seconds(settings, 1e9) == pytest.approx((gemm + attention) * 4 / 1e9, rel=1e-12)


def test_cpu_defaults_are_cpu_sized():
    # At the 0.37 GFLOP/s bf16 this machine's CPU runs, the CPU defaults take seconds, the GPU ones hours.
    from paraplan.cli.profile_cmd import DEVICE_DEFAULTS
    from paraplan.measurements.profiler import ProfileSettings, estimated_seconds, model_gemm_shapes
    from paraplan.model_specs.hf_config import load_model

    def seconds(defaults):
        spec = load_model("llama-3.1-8b")
        tps = tuple(int(t) for t in defaults["tp"].split(","))
        settings = ProfileSettings(
            gemm_shapes=model_gemm_shapes(spec, tuple(int(t) for t in defaults["tokens"].split(",")), tps),
            attention_shapes=tuple((1, spec.num_heads // t, int(s), spec.head_dim)
                                   for s in defaults["seq_len"].split(",") for t in tps),
            warmup=defaults["warmup"], repeats=defaults["repeats"])
        return estimated_seconds(settings, 0.37e9)

    assert seconds(DEVICE_DEFAULTS["cpu"]) < 60
    assert seconds(DEVICE_DEFAULTS["cuda"]) > 3600  # what --device cpu ran before: over 10 minutes, silent


def test_cli_profile_on_cpu_says_its_estimate_first(tmp_path):
    pytest.importorskip("torch", reason="paraplan profile needs PyTorch (the [profile] extra)")
    result = CliRunner().invoke(app, ["profile", "--device", "cpu", "--tokens", "4", "--tp", "8", "--seq-len", "64",
                                 "--copy-mib", "1", "--repeats", "1", "--warmup", "0", "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    assert "estimated run time about" in " ".join(result.stderr.split())


# ---- the training suite (paraplan profile --suite training) ----

NEEDS_TORCH = "the training suite needs PyTorch (the [profile] extra), which is not installed"


def _stack():
    import torch

    return f"pytorch {torch.__version__}"


def _invoke(*args):
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, ["profile", "--suite", "training", "--device", "cpu", *args])


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    """The whole quick suite, once, through the command line on CPU: (command result, document, its path)."""
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    out = tmp_path_factory.mktemp("suite") / "training.json"
    result = _invoke("-o", str(out))
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text()), out


def _rows(document, kind, name=None):
    return [r for r in document["measurements"] if r["kind"] == kind and (name is None or r["name"] == name)]


def test_suite_runs_every_part_but_collectives_in_one_process(suite_run):
    result, doc, _ = suite_run
    assert (doc["suite"], doc["hardware"], doc["stack"]) == ("training", "cpu", _stack())
    assert list(doc["parts"]) == ["gemm", "attention", "elementwise", "grouped_gemm", "optimizer"]
    assert all(entry["grid"] == "quick" and entry["rows"] > 0 for entry in doc["parts"].values())
    assert sum(entry["rows"] for entry in doc["parts"].values()) == len(doc["measurements"])
    err = " ".join(result.stderr.split())
    for part in ("gemm", "attention", "elementwise", "grouped_gemm", "optimizer", "collectives"):
        assert f"{part}: " in err and "estimated" in err  # each part's estimate, before it runs
    assert "run this part under torchrun" in err


def test_suite_rows_carry_stack_pass_and_backend(suite_run):
    _, doc, _ = suite_run
    assert {r["params"]["stack"] for r in doc["measurements"]} == {_stack()}
    matmuls = _rows(doc, "gemm", "matmul")
    assert len(matmuls) == 3 * 2 * 2 * 2 and {r["params"]["pass"] for r in matmuls} == {"forward", "dgrad", "wgrad"}
    assert all(r["params"]["dtype"] == "bf16" for r in matmuls)
    attention = _rows(doc, "attention")
    # CPU PyTorch has flash and math; cuDNN and memory-efficient attention are CUDA kernels, noted as left out.
    assert {r["params"]["backend"] for r in attention} == {"default", "flash", "math"}
    assert len(attention) == 3 * 2 * 2  # 3 backends x 2 sequence lengths x (forward, backward)
    assert all(r["params"]["causal"] == 1 and r["params"]["pass"] in ("forward", "backward") for r in attention)
    assert all((r["params"]["heads"], r["params"]["kv_heads"]) == (4, 2) for r in attention)
    left_out = {s["what"] for s in doc["parts"]["attention"]["skipped"]}
    assert left_out == {"attention backend efficient", "attention backend cudnn"}


def test_suite_elementwise_grouped_and_optimizer_rows(suite_run):
    _, doc, _ = suite_run
    ops = _rows(doc, "elementwise")
    assert {(r["name"], r["params"]["compiled"]) for r in ops if r["name"] != "adamw_step"} == {
        (op, c) for op in ("rmsnorm", "swiglu", "rotary", "residual_add") for c in (0, 1)}
    # llama-3.1-8b at 8 tokens: hidden 4096, FFN 14336, 32 query and 8 KV heads of 128; bf16, each tensor once.
    nbytes = {r["name"]: r["params"]["bytes"] for r in ops}
    assert nbytes["rmsnorm"] == 2 * (2 * 8 * 4096 + 4096) and nbytes["swiglu"] == 2 * 3 * 8 * 14336
    assert nbytes["residual_add"] == 2 * 3 * 8 * 4096 and nbytes["rotary"] == 2 * (2 * 8 * 40 * 128 + 2 * 8 * 128)
    grouped = _rows(doc, "gemm", "grouped_mm")
    assert [(r["params"]["experts"], r["params"]["tokens_per_expert"], r["params"]["m"]) for r in grouped] == [
        (2, 16, 32), (4, 16, 64)]
    adamw = _rows(doc, "elementwise", "adamw_step")
    assert [(r["params"]["parameters"], r["params"]["implementation"]) for r in adamw] == [
        (1024, "foreach"), (4096, "foreach")]
    assert all(r["params"]["bytes"] == 28 * r["params"]["parameters"] for r in adamw)


def test_suite_dgrad_and_wgrad_are_the_forward_shape_permuted(suite_run):
    from paraplan.measurements.profile_grids import gemm_pass_shape

    # Y[m, n] = X[m, k]·W[n, k]ᵀ with m = 8192 tokens, n = 14336, k = 4096 (an up projection):
    # dX[8192, 4096] = dY[8192, 14336]·W[14336, 4096]; dW[14336, 4096] = dYᵀ[14336, 8192]·X[8192, 4096].
    assert gemm_pass_shape(8192, 14336, 4096, "forward") == (8192, 14336, 4096)
    assert gemm_pass_shape(8192, 14336, 4096, "dgrad") == (8192, 4096, 14336)
    assert gemm_pass_shape(8192, 14336, 4096, "wgrad") == (14336, 4096, 8192)
    _, doc, _ = suite_run
    by_pass = {}
    for r in _rows(doc, "gemm", "matmul"):
        by_pass.setdefault(r["params"]["pass"], []).append((r["params"]["m"], r["params"]["n"], r["params"]["k"]))
    assert len(by_pass["forward"]) == len(by_pass["dgrad"]) == len(by_pass["wgrad"]) == 8
    # Rows are written forward, dgrad, wgrad per layer shape: each triple is one layer's three GEMMs.
    for (m, n, k), dgrad, wgrad in zip(by_pass["forward"], by_pass["dgrad"], by_pass["wgrad"], strict=True):
        assert (dgrad, wgrad) == ((m, k, n), (n, k, m))


def test_suite_gemm_calls_make_the_shapes_their_rows_name(monkeypatch):
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    from paraplan.measurements import profile_kernels
    from paraplan.measurements.profile_grids import grid_for

    outputs = []

    def run_once(self, fn):
        outputs.append(tuple(fn().shape))
        return 1.0

    monkeypatch.setattr(profile_kernels.Bench, "time", run_once)
    grid = dataclasses.replace(grid_for(load_model("llama-3.1-8b"), quick=True), gemm_m=(8,), gemm_nk=(16, 48))
    bench = profile_kernels.Bench(torch=torch, device="cpu", stack="s", warmup=0, repeats=1)
    rows = profile_kernels.gemm_rows(bench, grid)
    assert [(r["params"]["m"], r["params"]["n"]) for r in rows] == outputs  # C[m, n] of every call
    assert (8, 48, 16) in [(r["params"]["m"], r["params"]["n"], r["params"]["k"]) for r in rows
                           if r["params"]["pass"] == "dgrad"]  # forward 8x16x48: dX[8, 48] = dY[8, 16]·W[16, 48]


def test_suite_output_ingests_every_row(suite_run, tmp_path):
    from paraplan.measurements.store import count_rows, load_measurements

    _, doc, out = suite_run
    store = tmp_path / "store.sqlite"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["ingest", str(out), "--store", str(store)])
    assert result.exit_code == 0, result.output
    assert count_rows(store) == len(doc["measurements"])
    stored = load_measurements(store, "cpu", "attention")
    assert set(stored["backend"]) == {"default", "flash", "math"} and set(stored["stack"]) == {_stack()}


def test_resume_keeps_parts_present_and_adds_the_rest(tmp_path):
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    out = tmp_path / "suite.json"
    first = _invoke("--part", "gemm", "-o", str(out))
    assert first.exit_code == 0, first.output
    gemm_only = json.loads(out.read_text())
    assert list(gemm_only["parts"]) == ["gemm"]
    again = _invoke("--resume", str(out), "--part", "gemm,optimizer")
    assert again.exit_code == 0, again.output
    assert "already in" in " ".join(again.stderr.split())
    both = json.loads(out.read_text())
    assert list(both["parts"]) == ["gemm", "optimizer"]
    n = len(gemm_only["measurements"])
    assert both["measurements"][:n] == gemm_only["measurements"]  # the first part's rows, untouched
    assert {r["name"] for r in both["measurements"][n:]} == {"adamw_step"}
    done = _invoke("--resume", str(out), "--part", "gemm")
    assert done.exit_code == 0 and json.loads(out.read_text()) == both  # nothing left to run, nothing rewritten


def test_a_part_that_dies_leaves_no_partial_file(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    from paraplan.measurements import profile_suite

    def killed(bench, grid):
        raise KeyboardInterrupt  # as a kill mid-part would: no row of the part, no temporary file

    monkeypatch.setattr(profile_suite, "optimizer_rows", killed)
    fresh = tmp_path / "fresh.json"
    assert _invoke("--part", "optimizer", "-o", str(fresh)).exit_code != 0
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept.json"
    assert _invoke("--part", "gemm", "-o", str(kept)).exit_code == 0
    before = kept.read_bytes()
    assert _invoke("--resume", str(kept), "--part", "gemm,optimizer").exit_code != 0
    assert kept.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]


def test_resume_refuses_another_stack_or_a_layers_profile(tmp_path):
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    out = tmp_path / "suite.json"
    assert _invoke("--part", "optimizer", "-o", str(out)).exit_code == 0
    document = json.loads(out.read_text())
    out.write_text(json.dumps({**document, "stack": "pytorch 0.0.1"}))
    other = _invoke("--resume", str(out))
    assert other.exit_code == 2 and "same machine and stack" in " ".join(other.stderr.split())
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps({k: v for k, v in document.items() if k not in ("suite", "parts")}))
    refused = _invoke("--resume", str(layers))
    assert refused.exit_code == 2 and "--suite training" in " ".join(refused.stderr.split())
    mixed = _invoke("--resume", str(out), "-o", str(tmp_path / "other.json"))
    assert mixed.exit_code == 2 and "writes back to" in " ".join(mixed.stderr.split())
    unknown = _invoke("--part", "gemms", "-o", str(tmp_path / "x.json"))
    assert unknown.exit_code == 2 and "--part expects one or more of gemm, attention" in unknown.stderr


def test_budget_stops_before_a_part_that_would_pass_it(tmp_path):
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    out = tmp_path / "suite.json"
    result = _invoke("--part", "gemm", "--budget-s", "0", "-o", str(out))
    assert result.exit_code == 0 and not out.exists()
    assert "stopping before gemm" in " ".join(result.stderr.split())


def test_layers_flags_do_not_mix_with_the_suite_flags(tmp_path):
    result = CliRunner().invoke(app, ["profile", "--part", "gemm", "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "go with --suite training" in result.stderr
    shaped = CliRunner().invoke(app, ["profile", "--suite", "training", "--tokens", "512", "-o", str(tmp_path / "p")])
    assert shaped.exit_code == 2 and "go with --suite layers" in shaped.stderr
    stdout = CliRunner().invoke(app, ["profile", "--suite", "training", "-o", "-"])
    assert stdout.exit_code == 2 and "give a file path" in stdout.stderr
    assert list(tmp_path.iterdir()) == []


def test_suite_without_torch_is_input_error(monkeypatch):
    from paraplan.measurements.profile_suite import start_session

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(InputError, match=r"needs PyTorch"):
        start_session(load_model("llama-3.1-8b"), "cpu", quick=True)


def test_left_out_kernels_are_noted_with_their_reason(monkeypatch):
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    from types import SimpleNamespace

    from paraplan.measurements import profile_kernels
    from paraplan.measurements.profile_grids import grid_for

    grid = dataclasses.replace(grid_for(load_model("llama-3.1-8b"), quick=True), elementwise_tokens=(4,))
    old = profile_kernels.Bench(torch=SimpleNamespace(__version__="2.3.0"), device="cpu", stack="s", warmup=0,
                                repeats=1)
    assert profile_kernels.grouped_rows(old, grid) == []
    assert old.skipped == {("grouped_mm", "torch 2.3.0 has no torch._grouped_mm"): 1}

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler\nmore detail")

    monkeypatch.setattr(torch, "compile", no_compiler)
    bench = profile_kernels.Bench(torch=torch, device="cpu", stack="s", warmup=0, repeats=1)
    rows = profile_kernels.elementwise_rows(bench, grid)
    assert {r["params"]["compiled"] for r in rows} == {0} and len(rows) == 4  # the eager rows stand alone
    assert bench.skipped[("torch.compile of rmsnorm", "no C++ compiler")] == 1


def test_suite_estimates_fit_a_ten_minute_call_on_an_h100():
    from paraplan.measurements.profile_grids import (
        PARTS,
        SuiteRates,
        gemm_layer_shapes,
        grid_for,
        part_estimated_seconds,
    )
    from paraplan.measurements.profiler import ProfileSettings, estimated_seconds

    # H100 SXM: about 700 TFLOP/s on an 8192³ bf16 GEMM, about 2.6 TB/s (read + write) on a large copy.
    h100 = SuiteRates(flops_per_s=7e14, bytes_per_s=2.6e12, compile_s=6.0)
    for model in ("llama-3.1-8b", "llama-3.1-405b"):
        grid = grid_for(load_model(model), quick=False)
        seconds = {part: part_estimated_seconds(part, grid, h100) for part in PARTS}
        assert all(0 < s < 300 for s in seconds.values()), seconds
        assert sum(seconds.values()) < 420, seconds  # the whole suite, with room for start-up, in one call
    # m and n, k 512-65536 cover Llama/Qwen training GEMMs; the GEMM estimate is estimated_seconds of every pass.
    assert (min(grid.gemm_m), max(grid.gemm_m), min(grid.gemm_nk), max(grid.gemm_nk)) == (512, 65536, 512, 65536)
    flops = sum(2 * m * n * k for m, n, k in gemm_layer_shapes(grid))
    assert seconds["gemm"] == pytest.approx(3 * flops * (grid.warmup + grid.repeats) / 7e14)
    assert seconds["gemm"] == pytest.approx(estimated_seconds(
        ProfileSettings(gemm_shapes=gemm_layer_shapes(grid) * 3, warmup=grid.warmup, repeats=grid.repeats), 7e14))
    seq = {s.seq_len for s in grid.attention}
    bh = {s.batch * s.heads for s in grid.attention}
    assert (min(seq), max(seq), min(bh), max(bh)) == (1024, 32768, 8, 256)
    assert {s.head_dim for s in grid.attention} == {64, 128}


COLLECTIVES = """
import json, sys
from paraplan.measurements.profile_suite import close_session, run_part, start_session
from paraplan.model_specs.hf_config import load_model
session = start_session(load_model("llama-3.1-8b"), "cpu", quick=True)
result = run_part(session, "collectives")
if session.rank == 0:
    json.dump({"rows": result.rows, "complete": result.complete}, open(sys.argv[1], "w"))
close_session(session)
"""


def test_suite_collectives_under_torchrun_gloo(tmp_path):
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    script, out = tmp_path / "collectives.py", tmp_path / "rows.json"
    script.write_text(COLLECTIVES)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", "127.0.0.1:0", str(script), str(out)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["complete"] and {r["name"] for r in result["rows"]} == {
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    assert {r["params"]["stack"] for r in result["rows"]} == {_stack()}
    assert {r["params"]["size_bytes"] for r in result["rows"]} == {4096, 65536}
