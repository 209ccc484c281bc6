"""Stack profiles: `paraplan calibrate` from the user's measured runs, `--stack-profile` on plan/evaluate.

Hand-derived factors and held-out errors, the calibrated prediction as an exact multiple of the analytical
one, the file round trip, every refusal as one line with exit code 2, the runs reader fuzzed, and (slow) how
far three runs of one NeMo container bring the rest of its rows, against the issue's bound.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from paraplan.errors import InputError
from paraplan.validation import stack_profile as sp
from paraplan.validation.reference import load_reference_runs, predict_row

runner = CliRunner(env={"COLUMNS": "200"})
EVALUATE = ["evaluate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch",
            "64", "--tp", "1", "--pp", "1", "--mbs", "1", "--zero", "1", "--recompute", "full",
            "--cost-model", "analytical"]
MINIMAL = "id,model,gpu,num_gpus,seq_len,global_batch,precision,engine,tp,pp,measured_step_time_s\n"


def _app():
    from paraplan.cli.app import app

    return app


@pytest.fixture(autouse=True)
def profiles(tmp_path, monkeypatch):
    folder = tmp_path / "profiles"
    monkeypatch.setenv(sp.PROFILES_ENV, str(folder))
    monkeypatch.setenv("PARAPLAN_STORE", str(tmp_path / "store.sqlite"))
    return folder


def _reference_csv(tmp_path, ids: list[str]):
    """A runs file of published rows, in the reference-runs columns (as a user could write them)."""
    frame = pd.read_csv(sp.Path(__file__).parents[1] / "data" / "reference_runs.csv", dtype=str,
                        keep_default_na=False)
    path = tmp_path / "runs.csv"
    frame[frame.id.isin(ids)].to_csv(path, index=False)
    return path


# -- the factor and its held-out error, by hand ---------------------------------------------------------------------
def test_the_factor_is_the_geometric_median_of_measured_over_predicted_steps():
    assert sp.fit_factor([1.2, 1.5, 2.0]) == pytest.approx(1.5)
    assert sp.fit_factor([1.0, 4.0]) == pytest.approx(2.0)  # median of logs of two: the geometric mean


def test_each_run_held_out_is_predicted_with_the_others_factor():
    runs = [sp.RunPrediction(f"r{i}", "m", "h100-sxm", "megatron", 8, measured, 100.0)
            for i, measured in enumerate((50.0, 80.0, 100.0))]  # step ratios 2.0, 1.25, 1.0
    held = sp.leave_one_out_errors(runs)
    np.testing.assert_allclose(held, [2.0 / math.sqrt(1.25) - 1, 1.25 / math.sqrt(2.0) - 1,
                                      1.0 / math.sqrt(2.5) - 1])
    profile = sp.fit_profile("p", runs)
    assert profile.step_time_factor == pytest.approx(1.25)
    np.testing.assert_allclose(profile.calibrated_errors, [2.0 / 1.25 - 1, 0.0, 1 / 1.25 - 1])
    assert sp.fit_profile("one", runs[:1]).held_out_errors is None


def test_the_rest_of_a_container_is_scored_on_every_pick_of_n_runs():
    ratios = [1.0, 2.0, 4.0]
    np.testing.assert_allclose(sp.calibrated_rest_errors(ratios, [1]), [-0.5, 1.0])
    curve = sp.runs_needed_curve(ratios, 1)
    np.testing.assert_allclose(sorted(curve), sorted([np.median([1.0, 3.0]), 0.75, np.median([0.75, 0.5])]))
    assert len(sp.runs_needed_curve(ratios, 3)) == 0  # nothing left to predict


def test_an_implausible_factor_names_the_likely_unit_slip():
    runs = [sp.RunPrediction("r", "m", "h100-sxm", "megatron", 8, 1.0, 100.0)]
    with pytest.raises(InputError, match="units"):
        sp.fit_profile("p", runs)


# -- calibrate, then plan with it ------------------------------------------------------------------------------------
def test_calibrate_saves_a_profile_whose_factor_the_published_runs_give(tmp_path, profiles):
    ids = ["nemo_bridge_0124", "nemo_bridge_0125", "nemo_bridge_0126"]
    result = runner.invoke(_app(), ["calibrate", str(_reference_csv(tmp_path, ids)), "--name", "nemo-26.04"])
    assert result.exit_code == 0, result.output
    runs = load_reference_runs()
    ratios = [predict_row(row) for _, row in runs[runs.id.isin(ids)].iterrows()]
    expected = sp.fit_factor([p.predicted_tokens_per_s_per_gpu / p.measured_tokens_per_s_per_gpu for p in ratios])
    saved = json.loads((profiles / "nemo-26.04.json").read_text())
    assert saved["step_time_factor"] == pytest.approx(expected)
    assert [r["id"] for r in saved["runs"]] == ids
    assert saved["leave_one_run_out_error"]["median_abs_error_frac"] > 0
    assert f"step time x {expected:.3f}" in result.output and "saved" in result.output
    again = runner.invoke(_app(), ["calibrate", str(_reference_csv(tmp_path, ids)), "--name", "nemo-26.04"])
    assert again.exit_code == 2 and "--force" in again.output


def _profile(profiles, factor: float, gpu: str = "h100-sxm") -> None:
    profiles.mkdir(exist_ok=True)
    run = {"id": "r1", "model": "llama-3.1-8b", "gpu": gpu, "engine": "megatron", "num_gpus": 8,
           "measured_tokens_per_s_per_gpu": 1000.0, "predicted_tokens_per_s_per_gpu": 1000.0 * factor}
    document = {"schema_version": 1, "kind": sp.KIND, "name": "mine", "step_time_factor": factor, "runs": [run]}
    (profiles / "mine.json").write_text(json.dumps(document))


def test_a_profile_scales_every_step_by_its_factor_and_says_so(tmp_path, profiles):
    _profile(profiles, 1.25)
    plain_json, profiled_json = tmp_path / "plain.json", tmp_path / "profiled.json"
    plain = runner.invoke(_app(), [*EVALUATE, "--json", str(plain_json)])
    profiled = runner.invoke(_app(), [*EVALUATE, "--stack-profile", "mine", "--json", str(profiled_json)])
    assert plain.exit_code == 0 and profiled.exit_code == 0, profiled.output
    before, after = (json.loads(p.read_text())["plans"][0] for p in (plain_json, profiled_json))
    assert after["estimate"]["step_time_s"] == pytest.approx(1.25 * before["estimate"]["step_time_s"])
    assert after["estimate"]["tokens_per_s"] == pytest.approx(before["estimate"]["tokens_per_s"] / 1.25)
    assert after["estimate"]["memory_breakdown_bytes"] == before["estimate"]["memory_breakdown_bytes"]  # time only
    assert "stack profile mine: step time x 1.250" in after["provenance"]["cost_model"]
    assert "stack profile" not in before["provenance"]["cost_model"]


def test_plan_with_a_profile_keeps_the_ranking_and_exports(tmp_path, profiles):
    _profile(profiles, 1.5, gpu="b200")
    args = ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64",
            "--cost-model", "analytical", "--top", "3"]
    plain = runner.invoke(_app(), [*args, "--json", str(tmp_path / "a.json")])
    assert plain.exit_code == 0, plain.output
    profiled = runner.invoke(_app(), [*args, "--stack-profile", "mine", "--json", str(tmp_path / "b.json"),
                                      "--export", "megatron", "-o", str(tmp_path / "out")])
    assert profiled.exit_code == 0, profiled.output
    assert "fitted on b200/megatron; this job runs h100-sxm/megatron" in " ".join(profiled.output.split())
    a, b = (json.loads((tmp_path / f).read_text())["plans"] for f in ("a.json", "b.json"))
    assert [p["config"] for p in a] == [p["config"] for p in b]
    for x, y in zip(a, b):
        assert y["estimate"]["step_time_s"] == pytest.approx(1.5 * x["estimate"]["step_time_s"])
    assert any((tmp_path / "out").iterdir())


def test_megatron_logs_calibrate_from_their_own_arguments(tmp_path, profiles):
    """Each log is one run: the median iteration after the first against paraplan's prediction from the
    log's arguments (the same prediction `learn` uses)."""
    from test_learned_steps import ARGS, _log

    from paraplan.cost_models.learned.megatron_runs import predict_step_s

    (tmp_path / "a.log").write_text(_log(ARGS, [5000, 3100, 3000, 3050]))  # median after the first: 3.05 s
    (tmp_path / "b.log").write_text(_log({**ARGS, "global_batch_size": 128}, [9000, 6100, 6000]))  # 6.05 s
    result = runner.invoke(_app(), ["calibrate", str(tmp_path / "a.log"), str(tmp_path / "b.log"),
                                    "--hardware", "h100-sxm", "--name", "site"])
    assert result.exit_code == 0, result.output
    a = 3.05 / predict_step_s(ARGS, "h100-sxm")
    b = 6.05 / predict_step_s({**ARGS, "global_batch_size": 128}, "h100-sxm")
    saved = json.loads((profiles / "site.json").read_text())
    assert saved["step_time_factor"] == pytest.approx(math.sqrt(a * b))
    assert [r["id"] for r in saved["runs"]] == ["a.log", "b.log"]
    assert saved["runs"][0]["measured_tokens_per_s_per_gpu"] == pytest.approx(64 * 4096 / 8 / 3.05)
    no_gpu = runner.invoke(_app(), ["calibrate", str(tmp_path / "a.log"), "--name", "x"])
    assert no_gpu.exit_code == 2 and "--hardware" in no_gpu.output
    (tmp_path / "short.log").write_text(_log(ARGS, [5000]))
    short = runner.invoke(_app(), ["calibrate", str(tmp_path / "short.log"), "--hardware", "h100-sxm", "--name", "x"])
    assert short.exit_code == 2 and "at least two" in short.output


@pytest.mark.parametrize(("text", "message"), [
    ("id,model\nr1,llama-3.1-8b\n", "lacks column"),
    (MINIMAL.replace(",measured_step_time_s", "") + "r1,llama-3.1-8b,h100-sxm,8,4096,64,bf16,megatron,1,1\n",
     "needs a measured column"),
    (MINIMAL + "r1,llama-3.1-8b,h100-sxm,eight,4096,64,bf16,megatron,1,1,5.0\n", "line 2: num_gpus must be"),
    (MINIMAL + "r1,llama-3.1-8b,h100-sxm,8,4096,64,bf16,megatron,1,1,-5\n", "must be positive"),
    (MINIMAL + "r1,llama-3.1-8b,h100-sxm,8,4096,64,bf16,megatron,1,1,5\nr1,llama-3.1-8b,h100-sxm,8,4096,64,bf16,"
     "megatron,1,1,5\n", "appears twice"),
    (MINIMAL + "r1,no-such-model,h100-sxm,8,4096,64,bf16,megatron,1,1,5\n", "line 2 (run r1)"),
    (MINIMAL + "r1,llama-3.1-8b,h100-sxm,8,4096,64,bf16,megatron,3,1,5\n", "line 2 (run r1)"),
    (MINIMAL + "r1,llama-3.1-8b,h100-sxm,8,4096,64,fp9,megatron,1,1,5\n", "line 2 (run r1)"),
    (MINIMAL, "no runs"),
])
def test_bad_runs_files_get_one_line_and_exit_2(tmp_path, profiles, text, message):
    path = tmp_path / "runs.csv"
    path.write_text(text)
    result = runner.invoke(_app(), ["calibrate", str(path), "--name", "x"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output and not profiles.exists()  # nothing half-written


def test_a_run_faster_than_the_gpu_can_compute_is_refused_by_name(tmp_path, profiles):
    """A measured throughput whose model FLOPs exceed the GPU's dense peak at its precision (MFU > 100%) is a
    wrong column, GPU or precision, not a fast stack: refused in one line naming the run, nothing saved."""
    from paraplan.hardware_profiles.catalog import load_gpu
    from paraplan.model_specs.hf_config import load_model

    flops_per_token = load_model("llama-3.1-8b").model_flops_per_token(4096)
    peak_tokens = load_gpu("h100-sxm").peak("bf16") / flops_per_token  # MFU 100%
    header = MINIMAL.replace("measured_step_time_s", "measured_tokens_per_s_per_gpu")
    path = tmp_path / "runs.csv"
    path.write_text(header + f"too-fast,llama-3.1-8b,h100-sxm,8,4096,64,bf16,megatron,1,1,{5 * peak_tokens:.0f}\n")
    result = runner.invoke(_app(), ["calibrate", str(path), "--name", "x"])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert "too-fast" in line and "100%" in line and "peak" in line and "bf16" in line, line
    assert "500%" in line, line  # the implied utilisation, as the planner computes MFU
    assert len(result.output.strip()) <= 300 and "\n" not in result.output.strip(), result.output
    assert "Traceback" not in result.output and not profiles.exists()


@pytest.mark.parametrize(("content", "message"), [
    ("{", "invalid JSON"),
    ('{"kind": "other"}', "not a stack profile"),
    (json.dumps({"schema_version": 1, "kind": sp.KIND, "step_time_factor": 50, "runs": [{}]}), "0.1-10.0"),
    (json.dumps({"schema_version": 1, "kind": sp.KIND, "step_time_factor": 1.1, "runs": [{"id": 1}]}), "malformed"),
    (json.dumps({"schema_version": 2, "kind": sp.KIND}), "schema_version"),
])
def test_bad_profiles_and_names_get_one_line_and_exit_2(profiles, content, message):
    profiles.mkdir()
    (profiles / "bad.json").write_text(content)
    result = runner.invoke(_app(), [*EVALUATE, "--stack-profile", "bad"])
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    for name in ("../escape", "missing"):
        result = runner.invoke(_app(), [*EVALUATE, "--stack-profile", name])
        assert result.exit_code == 2 and result.output.startswith("error:"), result.output


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.text(max_size=300), header=st.sampled_from([MINIMAL, MINIMAL.replace("tp,pp", "pp,tp"), ""]))
def test_the_runs_reader_refuses_anything_malformed_with_input_error(tmp_path, body, header):
    path = tmp_path / "fuzz.csv"
    path.write_text(header + body, encoding="utf-8")
    try:
        frame = sp.read_runs(path)
    except InputError:
        return
    assert len(frame) >= 1 and (frame.measured_tokens_per_s_per_gpu > 0).all()


# -- the issue's question: how many runs does a container need? -----------------------------------------------------
def _nemo_container_ratios(moe: bool) -> dict[str, np.ndarray]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("stack_calibration", sp.Path(__file__).parents[1] / "bench" /
                                                  "stack_calibration.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.container_ratios(moe)


@pytest.mark.slow
def test_three_runs_of_a_container_calibrate_its_dense_rows_and_halve_its_moe_error():
    """Guards today's figures of bench/stack_calibration.py: with 3 runs, every container's other dense rows
    stay within 8% median; the older containers' MoE rows fall from 24-48% uncalibrated to at most 27%, and never
    rise (26.04.01, the closest to today's model at 24%, reaches 21%). 26.02 reaches 26.5% since the routed experts
    are priced as one grouped GEMM of whole tiles (cost_models/moe.py; 26.0% before)."""
    for release, ratios in _nemo_container_ratios(moe=False).items():
        assert np.median(sp.runs_needed_curve(ratios, 3)) <= 0.08, release
    for release, ratios in _nemo_container_ratios(moe=True).items():
        if release < "26.06":
            uncalibrated = np.median(np.abs(ratios - 1))
            assert np.median(sp.runs_needed_curve(ratios, 3)) <= min(0.27, uncalibrated), release


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="issue 16's bound: 3 runs of an older container bring its other MoE rows to "
                   "median <= 10%. One factor per container reaches 9.6-25.1%: within a container the error differs "
                   "by model (GPT-OSS +80%, Qwen3 +20% in 26.04), which one step factor cannot absorb")
def test_issue_target_three_runs_bring_moe_rows_within_ten_percent():
    for release, ratios in _nemo_container_ratios(moe=True).items():
        if release < "26.06":
            assert np.median(sp.runs_needed_curve(ratios, 3)) <= 0.10, release
