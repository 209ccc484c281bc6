"""The plan the search picks can always be saved and exported (issue 15 part 1, issue 20).

Regressions first: the 16,384-GPU Llama 3.1 405B plan (edge chunks without a decoder layer) and
the MoE plans that recompute the ``modules`` set. The sweeps over every bench case and every
reference run live in test_cli_save_sweep.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from paraplan.cli.app import app

runner = CliRunner(env={"COLUMNS": "160"})


def plan_json_and_export(tmp_path: Path, *args: str) -> tuple[dict, Path]:
    """``paraplan plan ARGS --json P --export all -o DIR``; the best plan and the export folder."""
    path, out = tmp_path / "p.json", tmp_path / "launch"
    result = runner.invoke(app, ["plan", *args, "--top", "1", "--json", str(path), "--export", "all", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(path.read_text())["plans"][0], out


def test_the_16k_gpu_405b_plan_saves_and_exports_its_empty_edge_chunks(tmp_path):
    best, out = plan_json_and_export(tmp_path, "llama-3.1-405b", "--gpu", "h100-sxm", "--gpus", "16384",
                                     "--seq-len", "8192", "--global-batch", "2048")
    layers = best["placement"]["stage_layers"]
    assert (best["config"]["pp"], best["config"]["vpp"]) == (16, 8)
    assert layers == [0] + [1] * 126 + [0]  # 126 + 2 over 128 chunks: embedding and loss alone at the edges
    assert "--pipeline-model-parallel-layout 'E|(t|)*126L'" in (out / "megatron_launch.sh").read_text()
    assert json.loads((out / "plan.json").read_text())["plans"][0]["placement"]["stage_layers"] == layers


def test_a_modules_recompute_moe_plan_exports(tmp_path):
    best, out = plan_json_and_export(tmp_path, "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len",
                                     "4096", "--global-batch", "256", "--recompute", "modules", "--pp", "1")
    assert best["config"]["recompute"] == "modules"
    assert "--recompute-modules layernorm moe_act" in (out / "megatron_launch.sh").read_text()
