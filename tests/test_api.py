"""The Python API (paraplan/api.py): the same answers as the CLI, typed results, one-line errors, and a light
``import paraplan``."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import paraplan
from paraplan.errors import InputError
from paraplan.exporters.plan_input import plan_from_document

runner = CliRunner(env={"COLUMNS": "200"})
JOB = {"seq_len": 8192, "global_batch": 256, "gpu": "h100-sxm", "gpus": 64, "precision": "fp8"}


def test_plan_returns_what_the_cli_ranks(tmp_path):
    from paraplan.cli.app import app

    result = paraplan.plan("llama-3.1-70b", tp=[4, 8], top=3, **JOB)
    out = tmp_path / "plans.json"
    cli = runner.invoke(app, ["plan", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "8192",
                              "--global-batch", "256", "--precision", "fp8", "--tp", "4,8", "--top", "3",
                              "--json", str(out)])
    assert cli.exit_code == 0, cli.output
    documents = json.loads(out.read_text())["plans"]
    assert [p.config.as_dict() for p in result.plans] == [d["config"] for d in documents]
    assert [p.estimate["step_time_s"] for p in result.plans] == [d["estimate"]["step_time_s"] for d in documents]
    assert all(p.config.tp in (4, 8) and p.fits for p in result.plans)
    assert result.fitting >= 3 and result.considered > result.fitting and "analytical" in result.cost_model


def test_evaluate_matches_the_cli_and_its_document_exports():
    from paraplan.cli.app import app

    one = paraplan.evaluate("llama-3.1-8b", seq_len=8192, global_batch=64, gpu="h100-sxm", gpus=8, tp=2, pp=1,
                            sp=True, zero=1, recompute="selective")
    assert (one.config.tp, one.config.dp, one.config.recompute, one.config.sp) == (2, 4, "selective", True)
    with tempfile.TemporaryDirectory() as folder:
        out = f"{folder}/p.json"
        cli = runner.invoke(app, ["evaluate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192",
                                  "--global-batch", "64", "--tp", "2", "--pp", "1", "--sp", "on", "--zero", "1",
                                  "--recompute", "selective", "--json", out])
        assert cli.exit_code == 0, cli.output
        assert json.loads(Path(out).read_text())["plans"][0]["estimate"] == one.estimate
    document = paraplan.plan_document(one)
    assert plan_from_document(document["plans"][0]).config == one.config  # what `paraplan export` reads


@pytest.mark.parametrize(("call", "message"), [
    (lambda: paraplan.plan("llama-9000", **JOB), "unknown model"),
    (lambda: paraplan.plan("llama-3.1-8b", tp=[3], **JOB), "tp·pp·cp"),
    (lambda: paraplan.plan("llama-3.1-8b", recompute="some", **JOB), "recompute must be one of"),
    (lambda: paraplan.plan("llama-3.1-8b", sp=1, **JOB), "sp takes True or False"),
    (lambda: paraplan.plan("llama-3.1-8b", warp_speed=True, **JOB), "unknown job field"),
    (lambda: paraplan.plan("llama-3.1-8b", seq_len=8192, global_batch=256), "give either cluster"),
    (lambda: paraplan.evaluate("llama-3.1-8b", tp=[1, 2], pp=1, **JOB), "one value per axis"),
    (lambda: paraplan.evaluate("llama-3.1-8b", tp=3, pp=1, **JOB), "does not divide"),
])
def test_bad_input_is_an_input_error_with_one_line(call, message):
    with pytest.raises(InputError) as caught:
        call()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_import_paraplan_stays_light():
    probe = "import sys, paraplan; print(sorted(m for m in ('pandas', 'typer', 'rich', 'sklearn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir()).stdout
    assert out.strip() == "[]", out
