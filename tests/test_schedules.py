"""DualPipe and DualPipeV (cost_models/schedules.py): the bubble against DeepSeek-V3's Table 2 by hand, the
relations that must hold (never a larger bubble than 1F1B; DualPipe never slower than 1F1B on the same layout;
DualPipe holds two stages' weights), the per-rank placement of the V shape, the search rules, and the schedule
from the command line to torchtitan's flags."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import make_table
from export_factory import files_of, make_export_plan
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.layer import COMM_SM_FRAC
from paraplan.cost_models.schedules import DUALPIPE, DUALPIPEV, dual_bubble_ratio, schedule_bubble_s
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.space import enumerate_space

runner = CliRunner(env={"COLUMNS": "200"})
H100 = quick_cluster("h100-sxm", 64)


def test_the_bubble_of_deepseek_v3_table_2_by_hand():
    # F = 1, B = 2, W = 1 per stage, pp = 8. 1F1B: (pp - 1)(F + B) = 21. DualPipe: (pp/2 - 1)(F&B + B - 3W)
    # with F&B = F + B = 3: 3 x (3 + 2 - 3) = 6. DualPipeV on 8 ranks (16 chunks of half a stage):
    # (16/2 - 1)(1.5 + 1 - 1.5) = 7.
    ratio = float(dual_bubble_ratio(1.0, 2.0, 1.0))
    assert ratio == pytest.approx(1 / 3)
    one_f_one_b = 7 * 3.0
    assert float(schedule_bubble_s(0, 8, 3.0, one_f_one_b, ratio)) == one_f_one_b
    assert float(schedule_bubble_s(DUALPIPE, 8, 3.0, one_f_one_b, ratio)) == pytest.approx(6.0)
    assert float(schedule_bubble_s(DUALPIPEV, 8, 3.0, one_f_one_b, ratio)) == pytest.approx(7.0)
    assert float(schedule_bubble_s(DUALPIPE, 2, 3.0, 3.0, ratio)) == 0.0  # pp/2 - 1 = 0


@given(forward=st.floats(1e-3, 10.0), backward=st.floats(1e-3, 10.0), share=st.floats(0.0, 1.0),
       pp=st.integers(2, 64))
def test_neither_dual_schedule_has_a_larger_bubble_than_1f1b(forward, backward, share, pp):
    weight = share * backward  # the weight gradients are a part of the backward
    ratio = dual_bubble_ratio(forward, backward, weight)
    one_f_one_b = (pp - 1) * (forward + backward)
    for schedule in (DUALPIPE, DUALPIPEV):
        bubble = float(schedule_bubble_s(schedule, pp, forward + backward, one_f_one_b, ratio))
        assert bubble <= one_f_one_b * (1 + 1e-12)


DSV3 = load_model("deepseek-v3")
H800 = quick_cluster("h800-sxm", 2048)
DSV3_JOB = TrainingJob(model=DSV3, seq_len=4096, global_batch=15360, precision="fp8", dispatcher="deepep")


def _dsv3(model=DSV3, **columns):
    table = make_table(tp=[1], pp=[16], dp=[128], ep=[64], mbs=[1], zero=[1], recompute=[3], **columns)
    return estimate(model, H800, dataclasses.replace(DSV3_JOB, model=model).workload(), table)


def test_dualpipe_is_never_slower_than_1f1b_on_the_same_layout_and_holds_two_stages():
    for pp, dp, ep in ((16, 128, 64), (8, 256, 32), (4, 512, 16)):
        table = make_table(tp=[1, 1], pp=[pp, pp], dp=[dp, dp], ep=[ep, ep], mbs=[1, 1], zero=[1, 1],
                           recompute=[3, 3], pp_schedule=[0, DUALPIPE])
        e = estimate(DSV3, H800, DSV3_JOB.workload(), table)
        assert e.step_time_s[1] < e.step_time_s[0]
        assert e.bubble_s[1] < e.bubble_s[0] and e.ep_comm_s[1] < e.ep_comm_s[0] and e.pp_comm_s[1] < e.pp_comm_s[0]
        # Two stages' weights, gradients and optimizer states on every rank: the middle rank's states double.
        assert e.memory.middle_states_bytes[1] == pytest.approx(2 * e.memory.middle_states_bytes[0])


def test_dualpipev_places_both_model_edges_on_rank_0():
    """Llama 3.1 8B (32 layers) on pp 4: 8 chunks of 4 layers under torchtitan's even split. DualPipeV puts
    chunks 0 and 7, the embedding and the output on rank 0 (8 layers + both edges), chunks 3 and 4 on rank 3."""
    llama = load_model("llama-3.1-8b")
    job = TrainingJob(model=llama, seq_len=8192, global_batch=256, engine="torchtitan")
    table = make_table(pp=[4, 4], vpp=[2, 2], dp=[16, 16], pp_schedule=[0, DUALPIPEV])
    e = estimate(llama, H100, job.workload(), table)
    first, last = e.memory.first_allocated_bytes, e.memory.last_allocated_bytes
    # Interleaved: rank 0 has the embedding, rank 3 the output and the loss; V: rank 0 both, rank 3 neither.
    per_layer_params = llama.shared_params_per_layer_mean()
    assert last[1] < last[0]  # the loss and the output weights left the last rank
    weights_bytes_per_param = 18.0  # bf16 weight + fp32 grad + fp32 master + Adam m, v (torchtitan, no sharding)
    held = (first[1] - first[0]) / weights_bytes_per_param
    assert held > llama.output_params() * 0.9 and held < llama.output_params() + 8 * per_layer_params


def test_the_dualpipe_published_deepseek_v3_run_is_priced_as_run():
    """DeepSeek-V3's all-to-alls (7.6 s a step under 1F1B) are shorter than the compute of the paired chunk, so
    under DualPipe what remains of them is the compute they slow by holding 20 of the 132 SMs: 20/132 of their
    time. The pipeline sends of the steady state vanish (the fill's 2·(pp - 1) hops remain, 1/m of 1F1B's
    2·m + 2·(pp - 1) with m = 120 micro-batches per rank) and every rank holds two stages' weights, which puts
    the modelled peak more than 10 GiB above 1F1B's. The relations are per critical layer, so they are checked on
    the main model: with its MTP module on the last rank (3 layers there, 4 on the middle ranks, two output passes)
    1F1B's critical rank holds one layer fewer than DualPipe's."""
    main_model = dataclasses.replace(DSV3, mtp_layers=0)
    one_f_one_b, dualpipe = _dsv3(main_model, pp_schedule=[0]), _dsv3(main_model, pp_schedule=[DUALPIPE])
    assert float(dualpipe.ep_comm_s[0]) == pytest.approx(COMM_SM_FRAC * float(one_f_one_b.ep_comm_s[0]), rel=1e-9)
    m, pp = 15360 / 128, 16
    assert float(dualpipe.pp_comm_s[0]) == pytest.approx(
        float(one_f_one_b.pp_comm_s[0]) * 2 * (pp - 1) / (2 * m + 2 * (pp - 1)), rel=1e-9)
    assert float(dualpipe.memory.peak_bytes[0]) > float(one_f_one_b.memory.peak_bytes[0]) + 10 * 2**30


@pytest.mark.xfail(strict=True, reason=(
    "DeepSeek-V3 as its report ran it (DualPipe, 2,048 H800): paraplan predicts about 2,150 tokens/s/GPU, +39% "
    "over the reported 1,543, and a 103 GiB peak on an 80 GB part. Under DualPipe the step is nearly all compute, "
    "so the gap is the compute rate of DeepSeek's stack (fine-grained fp8 GEMMs with CUDA-core accumulation, MLA "
    "attention at head dims 192/128, 20 SMs held by DeepEP, the MTP module) and its memory recipe (fp8 caching of "
    "activations, bf16 optimizer moments), none of which a published measurement isolates; the 1F1B figure in "
    "test_dispatch.py (-16.5%) is closer only because exposed all-to-alls stand in for that slower compute."))
def test_the_deepseek_v3_report_under_dualpipe_within_10_percent():
    reported = 1e12 / (180e3 * 3600)
    dualpipe = _dsv3(pp_schedule=[DUALPIPE])
    assert abs(float(dualpipe.tokens_per_s_per_gpu[0]) / reported - 1) <= 0.10 and bool(dualpipe.fits[0])


def test_only_torchtitan_offers_dualpipev_and_only_where_it_runs():
    llama = load_model("llama-3.1-8b")
    job = TrainingJob(model=llama, seq_len=8192, global_batch=64, engine="torchtitan")
    space = enumerate_space(job, H100, engine_rules("torchtitan"), {"pp": [1, 4, 8], "zero": [0], "cp": [1],
                                                                     "recompute": [0]})
    t = space.table
    v = t.pp_schedule == DUALPIPEV
    assert np.any(v) and np.all(t.vpp[v] == 2) and np.all(t.pp[v] > 1)
    assert np.all(64 // (t.dp[v] * t.mbs[v]) >= 2 * t.pp[v])  # at least 2·pp micro-batches
    assert "DualPipeV runs exactly two chunks per rank (vpp = 2)" in space.rejected
    megatron = enumerate_space(TrainingJob(model=llama, seq_len=8192, global_batch=64), H100,
                               engine_rules("megatron"), {"pp": [4]})
    assert np.all(megatron.table.pp_schedule == 0)


def test_dualpipev_from_the_command_line_to_the_torchtitan_flags(tmp_path):
    from paraplan.cli.app import app

    out = tmp_path / "plan.json"
    args = ["evaluate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "8192", "--global-batch",
            "256", "--engine", "torchtitan", "--tp", "1", "--pp", "4", "--vpp", "2", "--cost-model", "analytical"]
    result = runner.invoke(app, [*args, "--pp-schedule", "dualpipev", "--json", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())["plans"][0]
    assert plan["config"]["pp_schedule"] == "dualpipev"
    exported = runner.invoke(app, ["export", str(out), "--format", "torchtitan", "-o", str(tmp_path / "tt")])
    assert exported.exit_code == 0, exported.output
    launch = (tmp_path / "tt" / "torchtitan_launch.sh").read_text()
    assert "--parallelism.pipeline_parallel_schedule DualPipeV" in launch
    plain = runner.invoke(app, [*args, "--json", str(tmp_path / "plain.json")])
    assert plain.exit_code == 0 and json.loads((tmp_path / "plain.json").read_text())["plans"][0]["config"][
        "pp_schedule"] == "1f1b"


@pytest.mark.parametrize(("extra", "message"), [
    (["--engine", "megatron", "--vpp", "2", "--pp-schedule", "dualpipev"],
     "megatron does not run this pipeline schedule"),
    (["--engine", "torchtitan", "--vpp", "1", "--pp-schedule", "dualpipev"], "two chunks per rank"),
    (["--engine", "torchtitan", "--vpp", "2", "--pp-schedule", "zb-v"], "--pp-schedule expects"),
])
def test_a_schedule_the_job_cannot_run_is_one_line_and_exit_2(extra, message):
    from paraplan.cli.app import app

    result = runner.invoke(app, ["evaluate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "8192",
                                 "--global-batch", "256", "--tp", "1", "--pp", "4", *extra])
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def test_a_plan_file_naming_a_schedule_its_engine_lacks_is_refused():
    from paraplan.errors import InputError

    with pytest.raises(InputError, match="not a schedule megatron runs"):
        make_export_plan("llama-3.1-8b", pp=4, vpp=2, dp=2, pp_schedule="dualpipev")


def test_the_0_2_toml_of_an_moe_dualpipev_plan_turns_off_the_expert_overlap_it_was_not_priced_with():
    plan = make_export_plan("mixtral-8x7b", engine="torchtitan", pp=2, vpp=2, dp=8, ep=8, zero=3,
                            pp_schedule="dualpipev")
    toml = files_of(plan, "torchtitan", torchtitan_version="0.2",
                    torchtitan_model="deepseek_v3:16B")["torchtitan.toml"].text
    assert 'pipeline_parallel_schedule = "DualPipeV"' in toml
    assert "pipeline_parallel_expert_parallel_overlap = false" in toml
