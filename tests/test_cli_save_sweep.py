"""Every plan the search produces on the benchmark cases and on every reference run is written as JSON
and exported in every format through the CLI (issue 15 part 1): a path the search can produce is a
path these tests have written. Slow (a full search per case, one per reference row): marked ``slow``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.exporters.torchtitan import REGISTRY_0_3
from paraplan.planner.plan import SCHEMA_VERSION, Plan, config_at, estimate_at, plan_to_json
from paraplan.validation.reference import load_reference_runs, search_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from search_speed import CASES  # the benchmark's own case list, so the two cannot drift

pytestmark = pytest.mark.slow
runner = CliRunner(env={"COLUMNS": "160"})
TOP = 5
REFERENCE = load_reference_runs()
# Published layouts paraplan's rules refuse (README accuracy section): ep = 64 on 256 GB200s, which Megatron
# carves from tp·dp·cp = 32 ranks per stage.
RULE_INVALID = {"nemo_bridge_0263"}


def invoke_ok(*args: str) -> None:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output[-2000:]


def export_every_format(path: Path, out: Path, rank: int, model: str, engine: str, precision: str = "bf16") -> None:
    """``paraplan export PATH --format all --rank RANK``; torchtitan models without a registry entry in
    0.3, and fp8 plans (0.3 selects fp8 by registry function), name one, as a user must (the split reads
    only the plan)."""
    named = model not in REGISTRY_0_3 or precision == "fp8"
    extra = ["--torchtitan-model", "llama3:llama3_8b"] if engine == "torchtitan" and named else []
    invoke_ok("export", str(path), "--format", "all", "-o", str(out / f"rank{rank}"), "--rank", str(rank), *extra)
    written = json.loads((out / f"rank{rank}" / "plan.json").read_text())["plans"][0]
    assert written["rank"] == rank


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2]}-{c[3]}" for c in CASES])
def test_bench_case_plans_save_and_export(case, tmp_path):
    model, gpu, num_gpus, seq_len, global_batch, precision = case
    path = tmp_path / "plans.json"
    invoke_ok("plan", model, "--gpu", gpu, "--gpus", str(num_gpus), "--seq-len", str(seq_len), "--global-batch",
              str(global_batch), "--precision", precision, "--top", str(TOP), "--json", str(path),
              "--export", "all", "-o", str(tmp_path / "best"))
    plans = json.loads(path.read_text())["plans"]
    assert [plan["rank"] for plan in plans] == list(range(1, TOP + 1))
    for plan in plans[1:]:
        export_every_format(path, tmp_path, plan["rank"], model, "megatron")


@pytest.mark.parametrize("row_id", list(REFERENCE["id"]))
def test_reference_run_plan_saves_and_exports(row_id, tmp_path):
    row = REFERENCE[REFERENCE["id"] == row_id].iloc[0]
    job, cluster, result, _ = search_row(row)
    if row_id in RULE_INVALID:  # nothing to save: the search must say why
        assert len(result.table) == 0 and result.rejected
        return
    assert len(result.table) > 0, "the published configuration breaks the engine's rules"
    # The best fitting plan, or where none fits the published layout the smallest one (still a plan).
    best = int(result.ranked[0]) if len(result.ranked) else int(result.estimates.memory.peak_bytes.argmin())
    plan = Plan(job=job, cluster=cluster, config=config_at(result.table, best),
                estimate=estimate_at(result.estimates, best), fits=len(result.ranked) > 0, rank=1)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "plans": [plan_to_json(plan, "test")]}))
    export_every_format(path, tmp_path, 1, job.model.name, job.engine, job.precision)
