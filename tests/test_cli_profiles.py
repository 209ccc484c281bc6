"""``paraplan ingest``, ``profiles list|show``, ``learn`` and ``--cost-model`` through the CLI."""

from __future__ import annotations

import json

import pytest
from conftest import assert_bad_input
from profiles_factory import H100_ALL_REDUCE, PHI2_H100, need_vidur
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.measurements.store import count_rows

runner = CliRunner(env={"COLUMNS": "200"})
EVALUATE = ["evaluate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "64", "--tp", "8", "--pp", "1"]


@pytest.fixture()
def store(tmp_path, monkeypatch):
    path = tmp_path / "profiles.sqlite"
    monkeypatch.setenv("PARAPLAN_STORE", str(path))
    return path


def test_ingest_twice_adds_nothing(store):
    need_vidur()
    first = runner.invoke(app, ["ingest", str(PHI2_H100), str(H100_ALL_REDUCE)])
    assert first.exit_code == 0, first.output
    rows = count_rows(store)
    assert "h100-sxm" in first.output and "2,982" in first.output and rows > 2982
    again = runner.invoke(app, ["ingest", str(PHI2_H100), "--store", str(store)])
    assert again.exit_code == 0 and "already stored" in again.output and count_rows(store) == rows
    listed = runner.invoke(app, ["profiles", "list"])
    assert listed.exit_code == 0 and "collective" in listed.output and "2,982" in listed.output
    shown = runner.invoke(app, ["profiles", "show", "h100-sxm"])
    assert shown.exit_code == 0 and "all_reduce.csv" in shown.output and "vidur" in shown.output


def test_malformed_file_writes_nothing(store, tmp_path):
    need_vidur()
    good = runner.invoke(app, ["ingest", str(H100_ALL_REDUCE)])
    assert good.exit_code == 0
    rows = count_rows(store)
    broken = tmp_path / "all_reduce_perf.txt"
    broken.write_text("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
                      "# nThread 1 nGpus 8\n  1024 256 float sum -1 12.5 0.08\n")
    result = runner.invoke(app, ["ingest", str(PHI2_H100), str(broken)])
    assert_bad_input(result, "all_reduce_perf.txt", "line 3", "the header names 13")
    assert count_rows(store) == rows  # not even the good file before it


@pytest.mark.parametrize(("args", "needles"), [
    (["ingest", "nope.csv"], ["cannot read profiling file nope.csv"]),
    (["ingest", "--kind", "excel", "x.csv"], ["unknown --kind 'excel'"]),
    (["profiles", "list"], ["no profile store at", "paraplan ingest"]),
    (["learn"], ["no profile store at"]),
    ([*EVALUATE, "--cost-model", "learned"], ["no learned bf16 GEMM model for h100-sxm", "--cost-model analytical"]),
    ([*EVALUATE, "--cost-model", "magic"], ["--cost-model expects analytical, learned, auto"]),
])
def test_bad_input_one_line(store, args, needles):
    assert_bad_input(runner.invoke(app, args), *needles)


def test_unknown_hardware_in_store(store):
    need_vidur()
    runner.invoke(app, ["ingest", str(H100_ALL_REDUCE)])
    assert_bad_input(runner.invoke(app, ["profiles", "show", "b200"]), "no measurements for 'b200'", "h100-sxm")
    assert_bad_input(runner.invoke(app, ["ingest", str(PHI2_H100), "--hardware", "h900"]), "unknown hardware 'h900'")


def test_learn_then_plan_uses_learned_model(store, tmp_path):
    need_vidur()
    assert runner.invoke(app, ["ingest", str(PHI2_H100), str(H100_ALL_REDUCE)]).exit_code == 0
    learned = runner.invoke(app, ["learn", "--hardware", "h100-sxm"])
    assert learned.exit_code == 0, learned.output
    assert "gemm-16bit" in learned.output and "all_reduce" in learned.output and "held-out sizes" in learned.output
    analytical = runner.invoke(app, [*EVALUATE, "--cost-model", "analytical", "--json", str(tmp_path / "a.json")])
    auto = runner.invoke(app, [*EVALUATE, "--json", str(tmp_path / "l.json")])
    assert analytical.exit_code == 0 and auto.exit_code == 0, auto.output
    assert "GEMMs: learned (h100-sxm gemm-16bit" in " ".join(auto.output.split())
    plan_a = json.loads((tmp_path / "a.json").read_text())["plans"][0]
    plan_l = json.loads((tmp_path / "l.json").read_text())["plans"][0]
    assert plan_a["provenance"]["cost_model"].startswith("analytical roofline")
    assert plan_l["provenance"]["cost_model"].startswith("GEMMs: learned")
    assert plan_l["estimate"]["step_time_s"] != plan_a["estimate"]["step_time_s"]


def test_plan_and_evaluate_read_the_store_given_by_flag(tmp_path, monkeypatch):
    # The learned model lives in a store named by --store, not the environment's: plan and evaluate take
    # --store like ingest, learn and profiles do.
    need_vidur()
    other = tmp_path / "elsewhere.sqlite"
    monkeypatch.setenv("PARAPLAN_STORE", str(tmp_path / "empty.sqlite"))
    assert runner.invoke(app, ["ingest", str(PHI2_H100), str(H100_ALL_REDUCE), "--store", str(other)]).exit_code == 0
    assert runner.invoke(app, ["learn", "--hardware", "h100-sxm", "--store", str(other)]).exit_code == 0
    by_flag = runner.invoke(app, [*EVALUATE, "--store", str(other)])
    by_env = runner.invoke(app, EVALUATE)
    assert by_flag.exit_code == 0 and by_env.exit_code == 0, by_flag.output
    assert "GEMMs: learned (h100-sxm gemm-16bit" in " ".join(by_flag.output.split())
    assert "GEMMs: learned" not in " ".join(by_env.output.split())
    plan = runner.invoke(app, ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "2048",
                               "--global-batch", "16", "--top", "1", "--store", str(other)])
    assert plan.exit_code == 0 and "GEMMs: learned" in " ".join(plan.output.split())
