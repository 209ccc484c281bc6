"""The whole run from the command line (typer's CliRunner): plan --tokens and evaluate --steps write a schema-valid
run block, sweep prints its table and writes the sweep JSON, and bad input is one line and exit code 2."""

from __future__ import annotations

import json
import math

import pytest
from conftest import assert_bad_input
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.planner.json_schema import validate_own
from paraplan.planner.plan import plan_schema
from paraplan.planner.run.sweep import batch_candidates

runner = CliRunner(env={"COLUMNS": "200"})
QUICK_8B = ["llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64"]
TOKENS_PER_STEP = 64 * 4096


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_plan_with_a_token_budget_writes_a_schema_valid_run_block(tmp_path):
    out = tmp_path / "plan.json"
    result = invoke("plan", *QUICK_8B, "--top", "2", "--tokens", "1e9", "--price-per-gpu-hour", "2",
                    "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "whole run of #1" in result.stdout and "goodput" in result.stdout
    plans = json.loads(out.read_text())["plans"]
    for plan in plans:
        validate_own(plan, plan_schema())
        run = plan["run"]
        assert run["num_steps"] == math.ceil(1e9 / TOKENS_PER_STEP) == 3815
        assert run["useful_s"] == pytest.approx(3815 * plan["estimate"]["step_time_s"])
        # dollars: $2 x 8 GPUs x wall hours
        assert run["usd"] == pytest.approx(2 * 8 * run["wall_s"] / 3600)
        assert run["inputs"]["sources"]["price"] == "--price-per-gpu-hour"
        assert 0 < run["goodput_frac"] <= 1 and run["wall_s"] >= run["useful_s"]


def test_evaluate_with_steps_and_sync_checkpoints(tmp_path):
    out = tmp_path / "eval.json"
    result = invoke("evaluate", *QUICK_8B, "--tp", "1", "--pp", "1", "--zero", "1", "--steps", "1000",
                    "--checkpoint", "sync", "--failure-rate-per-gpu-hour", "1e-3", "--restart-s", "600",
                    "--json", str(out))
    assert result.exit_code == 0, result.output
    (plan,) = json.loads(out.read_text())["plans"]
    validate_own(plan, plan_schema())
    run = plan["run"]
    assert run["num_steps"] == 1000 and run["inputs"]["tokens"] is None and run["inputs"]["steps"] == 1000
    assert run["useful_s"] == pytest.approx(1000 * plan["estimate"]["step_time_s"])
    assert run["inputs"]["failures_per_gpu_s"] == pytest.approx(1e-3 / 3600)
    assert run["job_mtbf_s"] == pytest.approx(3600 / (1e-3 * 8))  # 450,000 s for 8 GPUs
    assert run["checkpoint_stall_s"] == run["checkpoint_write_s"]  # sync stalls for the whole write
    assert run["inputs"]["sources"]["restart"] == "user-set"


def test_plan_without_a_budget_has_no_run_block(tmp_path):
    out = tmp_path / "plan.json"
    result = invoke("plan", *QUICK_8B, "--top", "1", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "run" not in json.loads(out.read_text())["plans"][0]
    assert "whole run" not in result.stdout


def test_sweep_table_and_json(tmp_path):
    out = tmp_path / "sweep.json"
    result = invoke("sweep", "llama-3.1-8b", "--gpus", "8,16", "--gpu", "h100-sxm,h200-sxm", "--seq-len", "4096",
                    "--global-batch-range", "64:256", "--tokens", "1e10", "--price-per-gpu-hour", "2,3",
                    "--json", str(out))
    assert result.exit_code == 0, result.output
    for header in ("GPUs", "speedup", "efficiency %", "goodput %", "days", "cost"):
        assert header in result.stdout
    assert "token budget is fixed" in result.stdout
    document = json.loads(out.read_text())
    assert document["schema_version"] == 1 and document["kind"] == "sweep"
    points = document["points"]
    assert [(p["num_gpus"], p["gpu"]) for p in points] == [(8, "h100-sxm"), (8, "h200-sxm"), (16, "h100-sxm"),
                                                             (16, "h200-sxm")]
    for point in points:
        validate_own(point["plan"], plan_schema())
        assert point["global_batch"] in (64, 128, 256)
        assert point["plan"]["job"]["global_batch"] == point["global_batch"]
        assert point["plan"]["cluster"]["num_gpus"] == point["num_gpus"]
        price = {"h100-sxm": 2.0, "h200-sxm": 3.0}[point["gpu"]]
        run = point["plan"]["run"]
        assert run["usd"] == pytest.approx(price * point["num_gpus"] * run["wall_s"] / 3600)
    assert document["inputs"]["gpus"] == [8, 16] and document["inputs"]["gpu"] == ["h100-sxm", "h200-sxm"]


def test_batch_candidates_are_the_powers_of_two_in_the_range():
    assert batch_candidates(512, 2048) == [512, 1024, 2048]
    assert batch_candidates(300, 1100) == [512, 1024]
    assert batch_candidates(300, 500) == [300, 500]  # no power of two inside: the range's ends


@pytest.mark.parametrize(("args", "needle"), [
    (["plan", *QUICK_8B, "--tokens", "-5"], "--tokens"),
    (["plan", *QUICK_8B, "--tokens", "1e9", "--steps", "10"], "not both"),
    (["plan", *QUICK_8B, "--tokens", "1e9", "--failure-rate-per-gpu-hour", "-1"], "--failure-rate-per-gpu-hour"),
    (["evaluate", *QUICK_8B, "--tp", "1", "--pp", "1", "--steps", "0"], "--steps"),
    (["evaluate", *QUICK_8B, "--tp", "1", "--pp", "1", "--restart-s", "60"], "--tokens N"),
    (["plan", *QUICK_8B, "--steps", "10", "--checkpoint", "lazy"], "--checkpoint"),
    (["sweep", "llama-3.1-8b", "--gpus", "8", "--gpu", "h100-sxm,h999", "--seq-len", "4096", "--global-batch", "64",
      "--tokens", "1e9"], "h999"),
    (["sweep", "llama-3.1-8b", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "4096", "--global-batch", "64"],
     "--tokens"),
    (["sweep", "llama-3.1-8b", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "4096", "--global-batch-range",
      "512-2048", "--tokens", "1e9"], "--global-batch-range"),
    (["sweep", "llama-3.1-8b", "--gpus", "8", "--gpu", "h100-sxm,h200-sxm", "--seq-len", "4096", "--global-batch",
      "64", "--tokens", "1e9", "--price-per-gpu-hour", "1,2,3"], "--price-per-gpu-hour"),
])
def test_bad_run_input_is_one_line_and_exit_2(args, needle):
    assert_bad_input(invoke(*args), needle)
