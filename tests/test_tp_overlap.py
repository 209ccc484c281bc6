"""Megatron's --tp-comm-overlap (Transformer Engine userbuffers) as a searched option: the exposed time by hand,
never slower than the plain collectives, where the search offers it, and the flag from the command line to the
Megatron arguments."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_table
from typer.testing import CliRunner

from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.layer import TP_OVERLAP_SM_FRAC, _exposed_tp_comm_s
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.space import DOMINATED_TP_OVERLAP, enumerate_space

runner = CliRunner(env={"COLUMNS": "200"})
H100 = quick_cluster("h100-sxm", 64)
LLAMA70 = load_model("llama-3.1-70b")


def test_the_overlapped_collectives_by_hand():
    # 6 s of TP traffic at tp 4: the first 1.5 s chunk is exposed; the GEMMs take 3 x 2 = 6 s (forward and two
    # backward passes), so the other 4.5 s hide, and the reduce-scatter half of them slows the GEMMs by 20 of 132
    # SMs: 1.5 + 0.5 x 4.5 x 20/132.
    table = make_table(tp=[4, 4], sp=[1, 1], tp_overlap=[1, 0])
    exposed = _exposed_tp_comm_s(np.array([6.0, 6.0]), np.array([2.0, 2.0]), table, False)
    np.testing.assert_allclose(exposed, [1.5 + 0.5 * 4.5 * 20 / 132, 6.0])
    assert TP_OVERLAP_SM_FRAC == pytest.approx(20 / 132)


def test_overlap_is_never_slower_and_changes_nothing_but_tp_communication():
    job = TrainingJob(model=LLAMA70, seq_len=8192, global_batch=128, precision="fp8")
    for tp, pp, dp in ((8, 4, 2), (4, 8, 2), (2, 8, 4), (8, 1, 8)):
        table = make_table(tp=[tp, tp], pp=[pp, pp], dp=[dp, dp], sp=[1, 1], zero=[1, 1], vpp=[1, 1],
                           tp_overlap=[0, 1])
        e = estimate(LLAMA70, H100, job.workload(), table)
        assert e.tp_comm_s[1] < e.tp_comm_s[0] and e.step_time_s[1] < e.step_time_s[0]
        assert e.compute_s[1] == pytest.approx(e.compute_s[0], rel=1e-12)
        assert e.memory.peak_bytes[1] == e.memory.peak_bytes[0]


def test_only_megatron_offers_it_and_only_with_tp_and_sequence_parallel():
    job = TrainingJob(model=load_model("llama-3.1-8b"), seq_len=8192, global_batch=64)
    space = enumerate_space(job, H100, engine_rules("megatron"), {"pp": [1], "cp": [1], "zero": [1]})
    t = space.table
    on = t.tp_overlap == 1
    assert np.any(on) and np.all(t.tp[on] > 1) and np.all(t.sp[on] == 1)
    # A free search keeps only the overlapped variant where it runs (never slower, same memory) and counts the other.
    assert not np.any((t.tp > 1) & (t.sp == 1) & ~on) and space.rejected[DOMINATED_TP_OVERLAP] > 0
    both = enumerate_space(job, H100, engine_rules("megatron"), {"pp": [1], "cp": [1], "zero": [1],
                                                                 "tp_overlap": [0, 1]}).table
    assert np.sum((both.tp > 1) & (both.sp == 1) & (both.tp_overlap == 0)) == np.sum(on)
    titan = TrainingJob(model=load_model("llama-3.1-8b"), seq_len=8192, global_batch=64, engine="torchtitan")
    titan_space = enumerate_space(titan, H100, engine_rules("torchtitan"), {"pp": [1], "cp": [1]})
    assert np.all(titan_space.table.tp_overlap == 0)


def test_the_search_turns_it_on_and_the_export_writes_the_flag(tmp_path):
    from paraplan.cli.app import app

    out = tmp_path / "plan.json"
    args = ["plan", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "8192", "--global-batch", "128",
            "--precision", "fp8", "--tp", "4", "--pp", "8", "--top", "1"]
    result = runner.invoke(app, [*args, "--json", str(out), "--export", "megatron", "-o", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["plans"][0]["config"]["tp_overlap"] is True
    text = " ".join(p.read_text() for p in (tmp_path / "m").rglob("*") if p.is_file())
    assert "--tp-comm-overlap" in text and "--sequence-parallel" in text
    off = runner.invoke(app, [*args, "--tp-comm-overlap", "off", "--json", str(tmp_path / "off.json")])
    assert off.exit_code == 0 and json.loads((tmp_path / "off.json").read_text())["plans"][0]["config"][
        "tp_overlap"] is False


def test_evaluate_takes_it_off_unless_asked_and_refuses_it_without_tp():
    from paraplan.cli.app import app

    base = ["evaluate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192", "--global-batch", "8"]
    refused = runner.invoke(app, [*base, "--tp", "1", "--pp", "1", "--tp-comm-overlap", "on"])
    assert refused.exit_code == 2
    assert "TP communication overlap needs tp > 1 and sequence parallel" in " ".join(refused.output.split())
    plain = runner.invoke(app, [*base, "--tp", "2", "--pp", "1", "--sp", "on"])
    overlapped = runner.invoke(app, [*base, "--tp", "2", "--pp", "1", "--sp", "on", "--tp-comm-overlap", "on"])
    assert plain.exit_code == 0 and overlapped.exit_code == 0
    assert "TP communication" in plain.output
