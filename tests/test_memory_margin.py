"""The fit rule's default margin (cost_models/device_memory.FIT_MARGIN_FRAC): a hand-built job just inside and
just outside it, the user's headroom taken on top of it, every measured fit verdict before and after it, the
measured error the plan table cites, and the output that states it."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import numpy as np
import pytest

from paraplan.cost_models import device_memory
from paraplan.cost_models.device_memory import (
    DRIVER_VISIBLE_FRAC,
    FIT_MARGIN_FRAC,
    MEASURED_LIVE_UNDER_FRAC,
    driver_visible_bytes,
    usable_capacity_bytes,
)
from paraplan.cost_models.estimate import estimate
from paraplan.hardware_profiles import ClusterSpec, quick_cluster
from paraplan.planner.job import ParallelConfig, TrainingJob, configs_to_table
from paraplan.planner.plan import memory_capacity
from paraplan.planner.search import search
from paraplan.validation.memory_probe import predict_probe_all, probe_model

SHARED = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "memory_runs.csv"
needs_shared = pytest.mark.skipif(not SHARED.is_file(), reason=f"{SHARED} absent: measured memory runs not available")
GIB = 2**30

JOB = TrainingJob(model=probe_model("llama3-1b"), seq_len=8192, global_batch=1, precision="bf16", engine="torchtitan",
                  attention="flash")
CONFIG = ParallelConfig(tp=1, pp=1, dp=1, cp=1, vpp=1, mbs=1, zero=3, recompute="none", sp=False, cp_comm="allgather")


def _visible(num_bytes: float) -> ClusterSpec:
    """One H100 whose driver exposes ``num_bytes`` of HBM."""
    base = quick_cluster("h100-sxm", 1)
    return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, hbm_bytes=num_bytes / DRIVER_VISIBLE_FRAC))


def _required_and_fits(cluster: ClusterSpec) -> tuple[float, bool]:
    est = estimate(JOB.model, cluster, JOB.workload(), configs_to_table([CONFIG]))
    return float(est.memory.required_bytes[0]), bool(est.fits[0])


def test_the_margin_is_small_and_a_fraction():
    assert 0 < FIT_MARGIN_FRAC < 0.01
    hbm = 80 * GIB
    assert float(usable_capacity_bytes(hbm)) == pytest.approx(hbm * 0.987 * (1 - FIT_MARGIN_FRAC), rel=1e-12)
    assert float(driver_visible_bytes(hbm)) == pytest.approx(hbm * 0.987, rel=1e-12)


def test_a_job_just_inside_the_margin_fits_and_just_outside_does_not(monkeypatch):
    need, _ = _required_and_fits(quick_cluster("h100-sxm", 1))  # what must fit does not depend on the HBM
    assert need == pytest.approx(43.9 * GIB, rel=0.01)
    # Half the margin short: the last bytes the driver exposes would hold it, the margin does not.
    tight = _visible(need / (1 - FIT_MARGIN_FRAC / 2))
    assert _required_and_fits(tight) == (pytest.approx(need), False)
    # A hair inside the margin: fits.
    roomy = _visible(need / (1 - FIT_MARGIN_FRAC) * (1 + 1e-9))
    assert _required_and_fits(roomy)[1]
    # Without the margin the rule credited every byte: the tight GPU fitted.
    monkeypatch.setattr(device_memory, "FIT_MARGIN_FRAC", 0.0)
    assert _required_and_fits(tight)[1]


def test_the_users_headroom_is_taken_on_top_of_the_margin():
    cluster = quick_cluster("h100-sxm", 8)
    job = dataclasses.replace(TrainingJob(model=probe_model("llama3-3b"), seq_len=8192, global_batch=8,
                                          engine="torchtitan", attention="flash"), memory_headroom_frac=0.1)
    cap = memory_capacity(job, cluster)
    visible = 80 * GIB * DRIVER_VISIBLE_FRAC
    assert cap == {"driver_visible_bytes": pytest.approx(visible), "margin_frac": FIT_MARGIN_FRAC,
                   "headroom_frac": 0.1, "capacity_bytes": pytest.approx(visible * (1 - FIT_MARGIN_FRAC) * 0.9)}
    result = search(job, cluster)
    required = result.estimates.memory.required_bytes
    assert len(result.ranked) and (required[result.ranked] <= cap["capacity_bytes"]).all()
    # Some candidate needs more than the headroom leaves but less than the margin alone would: rejected.
    between = (required > cap["capacity_bytes"]) & (required <= visible * (1 - FIT_MARGIN_FRAC))
    assert between.any() and not np.isin(np.flatnonzero(between), result.ranked).any()


# -- every measured verdict -------------------------------------------------------------------------------------
def _measured_verdicts() -> list[tuple[str, bool, bool]]:
    """(row, ran, predicted to fit) for every measured run and out-of-memory step: the H100 probe's rows, and the
    scored memory_runs.csv rows with a fit/OOM label or a measured peak of a run that ran (component values of
    Korthikanti et al. describe no run)."""
    verdicts = [(p.label, not p.measured_oom, p.predicted_fits) for p in predict_probe_all()]
    if SHARED.is_file():
        from paraplan.validation.memory_runs import load_memory_runs, predict_memory_all

        runs = predict_memory_all(load_memory_runs(SHARED))
        verdicts += [(p.run_id, p.metric != "oom", p.predicted_fits) for p in runs
                     if not p.out_of_scope and p.metric in ("fits", "oom", "reserved", "allocated")]
    return verdicts


@needs_shared
def test_every_measured_verdict_is_right_before_and_after_the_margin(monkeypatch):
    after = _measured_verdicts()
    monkeypatch.setattr(device_memory, "FIT_MARGIN_FRAC", 0.0)
    before = _measured_verdicts()
    assert len(after) == len(before) == 50  # 18 probe rows (4 out of memory), 32 memory_runs.csv rows (1)
    assert sum(ran for _, ran, _ in after) == 45
    assert [row for row, ran, fits in before if ran != fits] == []
    assert [row for row, ran, fits in after if ran != fits] == []


def test_a_larger_margin_would_call_a_measured_run_out_of_memory(monkeypatch):
    # The bound FIT_MARGIN_FRAC's comment derives: the 3B probe run at 4096 x 4 needs 99.7% of usable HBM as
    # predicted, and it ran.
    monkeypatch.setattr(device_memory, "FIT_MARGIN_FRAC", 0.003)
    wrong = [p.label for p in predict_probe_all() if p.predicted_fits is p.measured_oom]
    assert wrong == ["llama3-3b seq 4096 x 4 ac=full"]


@needs_shared
def test_the_live_tensor_error_the_table_cites_is_the_measured_one():
    from paraplan.validation.memory_runs import load_memory_runs, predict_memory_all

    under = [p.allocated_gib / p.predicted_allocated_gib - 1 for p in predict_probe_all() if not p.measured_oom]
    under += [p.measured_bytes / p.predicted_bytes - 1 for p in predict_memory_all(load_memory_runs(SHARED))
              if not p.out_of_scope and p.metric == "allocated"]
    assert len(under) == 22
    assert max(under) == pytest.approx(MEASURED_LIVE_UNDER_FRAC, abs=0.001)


# -- the output says it -----------------------------------------------------------------------------------------
def _words(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as single spaces (captions wrap to the table's width)."""
    return " ".join(text.split())


def test_the_plan_table_and_json_state_the_margin():
    import json

    from typer.testing import CliRunner

    from paraplan.cli.app import app

    args = ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64",
            "--top", "2", "--headroom", "0.1"]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, args)
    assert result.exit_code == 0, result.output
    assert ("capacity 70.9 GiB: the 79.0 GiB the driver exposes less paraplan's 0.2% fit margin and 10.0% --headroom"
            in _words(result.stdout))  # the caption under the plan table
    document = json.loads(CliRunner(env={"COLUMNS": "200"}).invoke(app, [*args, "--json", "-"]).stdout)
    capacity = document["plans"][0]["provenance"]["memory_capacity"]
    assert capacity["margin_frac"] == FIT_MARGIN_FRAC and capacity["headroom_frac"] == 0.1
    assert capacity["capacity_bytes"] == pytest.approx(80 * GIB * DRIVER_VISIBLE_FRAC * (1 - FIT_MARGIN_FRAC) * 0.9)


def test_plans_at_capacity_are_named_with_the_measured_error():
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    # mpt-3b on two H100s: the best plans' fragmented peak passes capacity and the allocator trims its cache.
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, [
        "plan", "mpt-3b", "--gpu", "h100-sxm", "--gpus", "2", "--seq-len", "8192", "--global-batch", "8",
        "--engine", "torchtitan", "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "78.8 / 78.8" in result.stdout
    assert "at capacity: the allocator frees cached blocks and retries to run; live tensors have measured up to 5.3%" \
        in _words(result.stdout)


def test_the_headroom_help_states_the_margin():
    from paraplan.cli.train_flags import HeadroomOpt

    help_text = typing.get_args(HeadroomOpt)[1].help
    assert f"{FIT_MARGIN_FRAC:.1%}" in help_text and "on top of" in help_text
