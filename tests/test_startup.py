"""Start-up and machine-readable output: the CLI loads no solver or learning library until a command needs one,
``--version``, and ``--json -`` (the document alone on stdout, the tables on stderr) for every command that
writes JSON. Timings live in bench/startup.py, not here."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile

import pytest
from profiles_factory import PHI2_H100, need_vidur, store_with
from typer.testing import CliRunner

import paraplan

HEAVY = ("sklearn", "ortools", "pulp", "scipy", "torch", "pandas", "threadpoolctl")
"""Libraries no command needs merely to start: pandas loads with validate, calibrate and the profile store;
scikit-learn with learned models; the solvers when they solve."""
runner = CliRunner(env={"COLUMNS": "200"})


# Run from a neutral folder: from the repository root, its paraplan/ folder would shadow the installed package.
NEUTRAL = tempfile.gettempdir()


def _paraplan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paraplan", *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=NEUTRAL)


def test_the_cli_imports_no_solver_learning_or_dataframe_library():
    probe = ("import sys, paraplan.cli.app; "
             f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            cwd=NEUTRAL).stdout
    assert loaded.strip() == "[]", loaded


def test_placement_modules_load_their_solvers_only_when_they_solve():
    probe = ("import sys\n"
             "import paraplan.planner.placement.rank_placement, paraplan.planner.placement.stage_partition\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'ortools', 'pulp'}))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            cwd=NEUTRAL).stdout
    assert loaded.strip() == "[]", loaded


def test_version():
    result = _paraplan("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"paraplan {paraplan.__version__}"


@pytest.mark.parametrize("args, key", [
    (["evaluate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192", "--global-batch", "64",
      "--tp", "1", "--pp", "1"], "plans"),
    (["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192", "--global-batch", "64",
      "--top", "2"], "plans"),
    (["models", "list"], "models"),
    (["models", "show", "deepseek-v3"], "model"),
    (["hardware", "list"], "gpus"),
    (["hardware", "show", "h100-sxm"], "gpu"),
    (["hardware", "show", "dgx-h100"], "cluster"),
])
def test_json_dash_writes_the_document_alone_to_stdout(args, key):
    result = _paraplan(*args, "--json", "-")
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(result.stdout)  # nothing but the document on stdout
    assert document["schema_version"] == 1 and key in document
    assert result.stderr.strip()  # the tables went to stderr


def test_catalog_documents_carry_exact_numbers(tmp_path):
    from paraplan.cli.app import app

    out = tmp_path / "models.json"
    assert runner.invoke(app, ["models", "list", "--json", str(out)]).exit_code == 0
    models = {m["name"]: m for m in json.loads(out.read_text())["models"]}
    assert models["deepseek-v3"]["params"] == 671_026_419_200  # DeepSeek-V3's published count
    assert models["deepseek-v3"]["active_params"] == 37_552_297_472
    again = runner.invoke(app, ["models", "list", "--json", str(out)])
    assert again.exit_code == 2 and "--force" in again.output  # never overwritten without --force
    hardware = tmp_path / "hw.json"
    assert runner.invoke(app, ["hardware", "show", "h100-sxm", "--json", str(hardware)]).exit_code == 0
    gpu = json.loads(hardware.read_text())["gpu"]
    # NVIDIA's H100 SXM datasheet: 1,979 TFLOPS bf16 with sparsity (989.4 dense), 80 GB read as GiB
    assert gpu["peak_flops_per_s"]["bf16"] == pytest.approx(989.4e12) and gpu["hbm_bytes"] == 80 * 2**30


def test_profiles_list_as_json(tmp_path):
    need_vidur()
    from paraplan.cli.app import app

    store = store_with(tmp_path, [PHI2_H100])
    out = tmp_path / "profiles.json"
    result = runner.invoke(app, ["profiles", "list", "--store", str(store), "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["measurements"]
    assert {row["kind"] for row in rows} == {"gemm", "elementwise"} and all(r["hardware"] == "h100-sxm" for r in rows)
    with sqlite3.connect(store) as db:  # every stored measurement is counted once
        assert sum(row["rows"] for row in rows) == db.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
