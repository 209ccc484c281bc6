"""``paraplan serve`` end to end: the table, the JSON against its schema, every export format of a winning plan
(aggregated and disaggregated), and bad input as one line with exit code 2."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml
from conftest import assert_bad_input
from test_user_hardware import hardware_text
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.exporters.serving import SERVING_FORMATS
from paraplan.hardware_profiles.user_file import HARDWARE_ENV
from paraplan.planner.json_schema import schema_errors
from paraplan.planner.serving.plan import serving_schema

runner = CliRunner(env={"COLUMNS": "200", HARDWARE_ENV: ""})
LLAMA = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--isl", "1024", "--osl", "512"]
QWEN_MOE = ["serve", "qwen3-30b-a3b", "--gpu", "h200-sxm", "--gpus", "16", "--isl", "2048", "--osl", "256"]


def invoke(*args: str):
    return runner.invoke(app, list(args))


def _document(tmp_path: Path, *args: str) -> dict:
    path = tmp_path / "serve.json"
    result = invoke(*args, "--json", str(path))
    assert result.exit_code == 0, result.output
    document = json.loads(path.read_text())
    assert schema_errors(document, serving_schema()) == []
    return document


def test_serve_table_and_json_agree(tmp_path: Path):
    path = tmp_path / "serve.json"
    result = invoke(*LLAMA, "--concurrency", "64", "--tpot-ms", "20", "--json", str(path))
    assert result.exit_code == 0, result.output
    document = json.loads(path.read_text())
    best = document["plans"][0]
    assert best["rank"] == 1 and best["meets_targets"] and best["estimate"]["tpot_s"]["p50"] <= 0.020
    assert f"{best['estimate']['tokens_per_s_per_gpu']:,.0f}" in result.stdout
    assert "TTFT ms  mean" in result.stdout and "cost model:" in result.stdout
    assert document["search"]["considered"] >= document["search"]["feasible"] > 0
    assert all(p["num_gpus"] <= 8 for p in document["plans"])
    front = document["pareto"]
    assert front and all(a["tokens_per_s_per_gpu"] >= b["tokens_per_s_per_gpu"] for a, b in itertools.pairwise(front))


def test_serve_json_to_stdout_keeps_the_table_off_it():
    result = invoke(*LLAMA, "--concurrency", "16", "--top", "2", "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["kind"] == "serving" and len(document["plans"]) <= 2


@pytest.mark.parametrize("mode", ["agg", "disagg"])
@pytest.mark.parametrize("fmt", SERVING_FORMATS)
def test_every_export_of_a_winning_plan_is_written(tmp_path: Path, mode: str, fmt: str):
    out = tmp_path / "launch"
    result = invoke(*QWEN_MOE, "--rate", "6", "--ttft-ms", "2000", "--tpot-ms", "40", "--mode", mode,
                    "--export", fmt, "-o", str(out))
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in out.iterdir())
    assert written and all(f"wrote {out / name}" in result.stdout for name in written)
    again = invoke(*QWEN_MOE, "--rate", "6", "--mode", mode, "--export", fmt, "-o", str(out))
    assert_bad_input(again, "--force")


def test_each_engine_can_win_and_be_exported(tmp_path: Path):
    for engine in ("vllm", "sglang", "trtllm"):
        document = _document(tmp_path, *LLAMA, "--concurrency", "32", "--engine", engine, "--top", "1", "--force")
        assert document["plans"][0]["engine"] == engine
        result = invoke("serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--isl", "1024", "--osl",
                        "512", "--concurrency", "32", "--engine", engine, "--export", "all", "-o",
                        str(tmp_path / engine))
        assert result.exit_code == 0, result.output


def test_fixed_axes_are_respected(tmp_path: Path):
    document = _document(tmp_path, *LLAMA, "--concurrency", "32", "--tp", "2", "--batch", "16", "--chunk", "4096",
                         "--mode", "agg", "--engine", "vllm", "--kv-dtype", "bf16")
    for plan in document["plans"]:
        (pool,) = plan["pools"]
        assert (pool["tp"], pool["max_batch"], pool["max_batched_tokens"]) == (2, 16, 4096)
        assert plan["quantization"]["kv_cache_dtype"] == "bf16"


def test_cost_objective_with_a_price(tmp_path: Path):
    document = _document(tmp_path, *LLAMA, "--rate", "5", "--objective", "cost", "--price-per-gpu-hour", "2.5",
                         "--ttft-ms", "800", "--tpot-ms", "30")
    best = document["plans"][0]
    e = best["estimate"]
    # dollars per million output tokens = price x GPUs / (tokens per second x 3600) x 1e6
    assert e["usd_per_million_output_tokens"] == pytest.approx(
        2.5 * best["num_gpus"] / (e["tokens_per_s"] * 3600) * 1e6)
    keys = [p["estimate"]["usd_per_million_output_tokens"] for p in document["plans"]]
    assert keys == sorted(keys)


@pytest.mark.parametrize("args, needles", [
    (["--concurrency", "8", "--rate", "2"], ["one of --concurrency"]),
    ([], ["one of --concurrency"]),
    (["--concurrency", "8", "--engine", "tgi"], ["tgi", "vllm"]),
    (["--concurrency", "8", "--percentile", "75"], ["50, 90 or 99"]),
    (["--rate", "-1"], ["--rate"]),
    (["--concurrency", "8", "--tpot-ms", "0.001"], ["meets the targets"]),
    (["--concurrency", "8", "--isl-dist", "lognormal"], ["--isl-dist", "gamma:CV"]),
    (["--concurrency", "8", "--mode", "split"], ["--mode"]),
    (["--concurrency", "8", "--tp", "x"], ["--tp"]),
    (["--concurrency", "8", "--export", "vllm"], ["-o/--out"]),
    (["--concurrency", "8", "--export", "helm", "-o", "out"], ["--export", "vllm"]),
    (["--concurrency", "8", "--precision", "int3"], ["--precision"]),
    (["--concurrency", "8", "--objective", "speed"], ["--objective"]),
    (["--rate", "2", "--arrival", "weibull"], ["poisson"]),
])
def test_bad_input_is_one_line(args, needles):
    assert_bad_input(invoke(*LLAMA, *args), *needles)


def test_bad_model_and_cluster_are_one_line():
    assert_bad_input(invoke("serve", "no-such-model", "--gpu", "h100-sxm", "--gpus", "8", "--isl", "8", "--osl", "8",
                            "--concurrency", "1"), "unknown model")
    assert_bad_input(invoke("serve", "llama-3.1-8b", "--gpu", "z100", "--gpus", "8", "--isl", "8", "--osl", "8",
                            "--concurrency", "1"), "z100")
    assert_bad_input(invoke(*LLAMA[:6], "--isl", "0", "--osl", "8", "--concurrency", "1"), "positive")


def test_two_gpu_types_at_their_prices_and_the_fleet_exports(tmp_path: Path):
    args = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm,h200-sxm", "--gpus", "6,4", "--isl", "1024", "--osl", "512",
            "--rate", "20", "--ttft-ms", "800", "--tpot-ms", "25", "--percentile", "90", "--mode", "agg",
            "--objective", "cost", "--price-per-gpu-hour", "2.0,2.6"]
    document = _document(tmp_path, *args)
    assert [(h["gpu"], h["num_gpus"], h["price_usd_per_gpu_hour"]) for h in document["hardware"]] == \
        [("h100-sxm", 6, 2.0), ("h200-sxm", 4, 2.6)]
    for plan in document["plans"]:
        used = {"h100-sxm": 0, "h200-sxm": 0}
        for pool in plan["pools"]:
            used[pool["gpu"]] += pool["workers"] * pool["gpus_per_worker"]
        assert used["h100-sxm"] <= 6 and used["h200-sxm"] <= 4
        price = {"h100-sxm": 2.0, "h200-sxm": 2.6}
        assert plan["estimate"]["usd_per_hour"] == pytest.approx(sum(price[g] * n for g, n in used.items()))
    out = tmp_path / "fleet"
    result = invoke(*args, "--export", "all", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "serve.sh").is_file() and (out / "serving-plan.json").is_file()


@pytest.mark.parametrize("args, needles", [
    (["--gpu", "h100-sxm,h200-sxm", "--gpus", "8"], ["one count each"]),
    (["--gpu", "h100-sxm,h100-sxm", "--gpus", "8,8"], ["each GPU type once"]),
    (["--gpu", "h100-sxm,h200-sxm", "--gpus", "8,8", "--price-per-gpu-hour", "1,2,3"], ["one per --gpu type"]),
    (["--gpu", "h100-sxm", "--gpus", "8", "--price-per-gpu-hour", "-2"], ["non-negative"]),
    (["--gpu", "h100-sxm"], ["--gpu needs --gpus"]),
    ([], ["--gpu NAME --gpus N"]),
])
def test_bad_gpu_lists_are_one_line(args, needles):
    assert_bad_input(invoke("serve", "llama-3.1-8b", *args, "--isl", "64", "--osl", "64", "--concurrency", "4"),
                     *needles)


def test_the_library_call_returns_what_the_command_writes(tmp_path: Path):
    import paraplan

    document = _document(tmp_path, *LLAMA, "--rate", "8", "--ttft-ms", "600", "--tpot-ms", "20", "--percentile",
                         "90", "--tp", "1,2", "--top", "3")
    result = paraplan.serve("llama-3.1-8b", gpu="h100-sxm", gpus=8, isl=1024, osl=512, rate=8.0, ttft_ms=600,
                            tpot_ms=20, percentile=90, tp=[1, 2], top=3)
    assert result.document["plans"] == document["plans"] and result.document["pareto"] == document["pareto"]
    assert [p.rank for p in result.plans] == list(range(1, len(result.plans) + 1))
    with pytest.raises(paraplan.InputError, match="unknown serving axis"):
        paraplan.serve("llama-3.1-8b", gpu="h100-sxm", gpus=8, isl=64, osl=64, concurrency=1, vpp=2)


def test_a_saved_serving_plan_exports_later_by_rank(tmp_path: Path):
    path = tmp_path / "serve.json"
    result = invoke(*LLAMA, "--concurrency", "32", "--top", "3", "--json", str(path))
    assert result.exit_code == 0, result.output
    document = json.loads(path.read_text())
    for rank in range(1, len(document["plans"]) + 1):
        engine = document["plans"][rank - 1]["engine"]
        out = tmp_path / f"rank{rank}"
        exported = invoke("export", str(path), "--format", engine, "-o", str(out), "--rank", str(rank))
        assert exported.exit_code == 0, exported.output
        tpot = document["plans"][rank - 1]["estimate"]["tpot_s"]
        # the header carries the plan's own prediction (the statistics the planner writes, not 'n/a')
        header = f"TPOT p50 {tpot['p50'] * 1e3:.1f} ms (mean {tpot['mean'] * 1e3:.1f} ms)"
        assert header in (out / "serve.sh").read_text()
    assert_bad_input(invoke("export", str(path), "--format", "all", "-o", str(tmp_path / "x"), "--rank", "99"),
                     "not 99")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**document, "plans": [{**document["plans"][0], "engine": "tgi"}]}))
    assert_bad_input(invoke("export", str(broken), "--format", "json", "-o", str(tmp_path / "y")), "tgi")
    huge = tmp_path / "huge.json"
    pools = [{**document["plans"][0]["pools"][0], "workers": 1_000_000}]
    huge.write_text(json.dumps({**document, "plans": [{**document["plans"][0], "pools": pools}]}))
    assert_bad_input(invoke("export", str(huge), "--format", "json", "-o", str(tmp_path / "z")), "at most 65,536")


@pytest.mark.parametrize("given", ["config.json", "folder"])
def test_a_local_checkpoint_launches_its_own_folder(tmp_path: Path, given: str):
    """A model given as a config.json (or its folder) is served from the folder holding it, the weights' folder:
    the JSON's model path and the MODEL that serve.sh and k8s.yaml default to."""
    checkpoint = (tmp_path / "models" / "site-llama").resolve()
    checkpoint.mkdir(parents=True)
    source = Path(__file__).resolve().parents[1] / "data" / "models" / "llama-3.1-8b" / "config.json"
    (checkpoint / "config.json").write_text(source.read_text())
    model = str(checkpoint / "config.json") if given == "config.json" else str(checkpoint)
    out = tmp_path / "out"
    document = _document(tmp_path, "serve", model, "--gpu", "h100-sxm", "--gpus", "8", "--isl", "1024", "--osl",
                         "512", "--concurrency", "16", "--engine", "vllm", "--export", "all", "-o", str(out))
    assert document["model"]["path"] == str(checkpoint) and document["model"]["hf_repo"] is None
    assert json.loads((out / "serving-plan.json").read_text())["model"]["path"] == str(checkpoint)
    assert f"MODEL=${{MODEL:-{checkpoint}}}\n" in (out / "serve.sh").read_text()
    pods = [d for d in yaml.safe_load_all((out / "k8s.yaml").read_text()) if d["kind"] == "Deployment"]
    assert pods and all(str(checkpoint) in c["args"] and str(checkpoint.parent) not in c["args"]
                        for d in pods for c in d["spec"]["template"]["spec"]["containers"])


def test_a_gpu_from_a_hardware_file_is_served(tmp_path: Path):
    """--hardware FILE (else $PARAPLAN_HARDWARE) adds the file's GPUs and clusters to serve's catalog, as for plan:
    the command, its exports and paraplan.serve(hardware=...) all reach them; without the file the GPU is unknown."""
    import paraplan

    hardware = tmp_path / "site.yaml"
    hardware.write_text(hardware_text())
    args = ["--isl", "1024", "--osl", "512", "--concurrency", "16", "--engine", "vllm", "--top", "2"]
    document = _document(tmp_path, "serve", "llama-3.1-8b", "--gpu", "h20-site", "--gpus", "8", *args,
                         "--hardware", str(hardware), "--export", "all", "-o", str(tmp_path / "out"))
    assert [h["gpu"] for h in document["hardware"]] == ["h20-site"]
    assert all(p["gpu"] == "h20-site" for plan in document["plans"] for p in plan["pools"])
    assert (tmp_path / "out" / "serve.sh").is_file() and (tmp_path / "out" / "k8s.yaml").is_file()
    via_env = runner.invoke(app, ["serve", "llama-3.1-8b", "--cluster", "site-h20", "--nodes", "1", *args,
                                  "--json", "-"], env={HARDWARE_ENV: str(hardware)})
    assert via_env.exit_code == 0, via_env.output
    assert [h["gpu"] for h in json.loads(via_env.stdout)["hardware"]] == ["h20-site"]
    mixed = invoke("serve", "llama-3.1-8b", "--gpu", "h20-site,h100-sxm", "--gpus", "8,8", *args, "--hardware",
                   str(hardware))
    assert mixed.exit_code == 0, mixed.output
    assert f"GPU h20-site: user hardware file {hardware}" in mixed.stdout
    result = paraplan.serve("llama-3.1-8b", gpu="h20-site", gpus=8, isl=1024, osl=512, concurrency=16,
                            engines=["vllm"], top=2, hardware=hardware)
    assert result.document["plans"] == document["plans"]
    assert_bad_input(invoke("serve", "llama-3.1-8b", "--gpu", "h20-site", "--gpus", "8", *args),
                     "unknown GPU 'h20-site'", "--hardware")
