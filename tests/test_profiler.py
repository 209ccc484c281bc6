"""``paraplan profile`` on CPU (labelled cpu), its shapes, its NCCL-path under torchrun with gloo, and ingesting it."""

from __future__ import annotations

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
    assert kinds == [("gemm", ""), ("gemm", ""), ("memory", ""), ("attention", "forward"), ("attention", "backward")]
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
