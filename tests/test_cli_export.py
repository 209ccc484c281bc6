"""``paraplan export`` and ``paraplan plan --export`` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_bad_input
from export_factory import make_plan_document, write_plan_file
from typer.testing import CliRunner

from paraplan.cli.app import app

runner = CliRunner(env={"COLUMNS": "160"})
QUICK_8B = ["llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "16", "--seq-len", "4096", "--global-batch", "64"]


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    return write_plan_file(tmp_path / "plans.json", make_plan_document(tp=2, dp=8, rank=1),
                           make_plan_document(tp=4, dp=4, rank=2))


def test_export_all_writes_every_file_and_reports_each(plan_file, tmp_path):
    out = tmp_path / "launch"
    result = invoke("export", str(plan_file), "--format", "all", "-o", str(out))
    assert result.exit_code == 0, result.output
    names = ["plan.json", "rank_map.json", "expert_map.json", "megatron_launch.sh", "slurm.sbatch", "pytorchjob.yaml"]
    assert result.stdout.splitlines() == [f"wrote {out / name}" for name in names]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    rank_map = json.loads((out / "rank_map.json").read_text())
    assert rank_map["world_size"] == 16 and rank_map["ranks"][9] == {
        "rank": 9, "node": 1, "local_rank": 1, "tp": 1, "cp": 0, "dp": 4, "pp": 0}
    assert "--tensor-model-parallel-size 2" in (out / "megatron_launch.sh").read_text()


def test_export_picks_the_plan_by_rank_and_round_trips_its_json(plan_file, tmp_path):
    result = invoke("export", str(plan_file), "-f", "json", "-o", str(tmp_path / "j"), "--rank", "2")
    assert result.exit_code == 0, result.output
    exported = tmp_path / "j" / "plan.json"
    assert json.loads(exported.read_text())["plans"][0]["config"]["tp"] == 4
    again = invoke("export", str(exported), "-f", "megatron", "-o", str(tmp_path / "m"))
    assert again.exit_code == 0, again.output
    assert "--tensor-model-parallel-size 4" in (tmp_path / "m" / "megatron_launch.sh").read_text()


def test_export_refuses_to_overwrite_without_force(plan_file, tmp_path):
    out = tmp_path / "o"
    assert invoke("export", str(plan_file), "-f", "json", "-o", str(out)).exit_code == 0
    before = (out / "plan.json").read_text()
    (out / "plan.json").write_text("edited")
    assert_bad_input(invoke("export", str(plan_file), "-f", "json", "-o", str(out)), "--force", "plan.json")
    assert (out / "plan.json").read_text() == "edited"
    assert invoke("export", str(plan_file), "-f", "json", "-o", str(out), "--force").exit_code == 0
    assert (out / "plan.json").read_text() == before


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["plans"][0]["config"].update(tp=0), "plans[0] does not match the plan schema: $.config.tp"),
    (lambda d: d["plans"][0].pop("estimate"), "missing required key 'estimate'"),
    (lambda d: d["plans"][0]["job"].update(engine="colossal"), "$.job.engine"),
    (lambda d: d.update(extra=1), "expected {\"schema_version\": 1"),
])
def test_a_plan_that_fails_the_schema_is_one_line(plan_file, tmp_path, mutate, needle):
    document = json.loads(plan_file.read_text())
    mutate(document)
    plan_file.write_text(json.dumps(document))
    result = invoke("export", str(plan_file), "-f", "json", "-o", str(tmp_path / "x"))
    assert_bad_input(result, needle)
    assert not (tmp_path / "x").exists()


def test_export_bad_inputs_are_one_line(plan_file, tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    assert_bad_input(invoke("export", str(tmp_path / "broken.json"), "-f", "json", "-o", str(tmp_path / "a")),
                     "not a JSON plan file")
    assert_bad_input(invoke("export", str(tmp_path / "none.json"), "-f", "json", "-o", str(tmp_path / "a")),
                     "does not exist")
    assert_bad_input(invoke("export", str(plan_file), "-f", "json", "-o", str(tmp_path / "a"), "--rank", "7"),
                     "no plan ranked 7", "1, 2")
    assert_bad_input(invoke("export", str(plan_file), "-f", "deepspeed", "-o", str(tmp_path / "a")),
                     "needs a plan made for deepspeed")
    assert_bad_input(invoke("export", str(plan_file), "-f", "tar", "-o", str(tmp_path / "a")), "--format expects")
    assert_bad_input(invoke("export", str(plan_file), "-f", "slurm", "-o", str(tmp_path / "a"), "--job-name", "A B"),
                     "--job-name")
    assert not (tmp_path / "a").exists()


def test_plan_export_writes_the_top_plan(tmp_path):
    out = tmp_path / "top"
    result = invoke("plan", *QUICK_8B, "--json", str(tmp_path / "p.json"), "--export", "all", "-o", str(out))
    assert result.exit_code == 0, result.output
    plans = json.loads((tmp_path / "p.json").read_text())["plans"]
    exported = json.loads((out / "plan.json").read_text())["plans"]
    assert exported == [plans[0]]
    assert plans[0]["model"]["shape"]["num_layers"] == 32 and plans[0]["placement"]["stage_layers"]
    config = plans[0]["config"]
    script = (out / "megatron_launch.sh").read_text()
    assert f"--tensor-model-parallel-size {config['tp']}\n" in script
    assert f"--micro-batch-size {config['mbs']}\n" in script


def test_plan_export_checks_its_folder_and_format_before_searching(tmp_path):
    assert_bad_input(invoke("plan", *QUICK_8B, "--export", "all"), "--export needs -o/--out")
    assert_bad_input(invoke("plan", *QUICK_8B, "-o", str(tmp_path / "x")), "goes with --export")
    assert_bad_input(invoke("plan", *QUICK_8B, "--export", "torchtitan", "-o", str(tmp_path / "t")),
                     "needs a plan made for torchtitan")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "slurm.sbatch").write_text("mine")
    assert_bad_input(invoke("plan", *QUICK_8B, "--export", "slurm", "-o", str(tmp_path / "busy")), "--force")
    assert (tmp_path / "busy" / "slurm.sbatch").read_text() == "mine"
