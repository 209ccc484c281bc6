"""torchtitan's job knobs: torch.compile (eager PyTorch's memory-bound kernels priced, cost_models/layer.py) and
async tensor parallelism, each from the command line to torchtitan's config, and torchtitan's own published runs
with and without them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_table
from export_factory import files_of, make_export_plan
from typer.testing import CliRunner

from paraplan.cost_models.layer import _eager_extra_bytes_per_token, _exposed_tp_comm_s
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import TrainingJob
from paraplan.planner.search import search
from paraplan.validation.reference import load_reference_runs, predict_row

LLAMA8B = load_model("llama-3.1-8b")
runner = CliRunner(env={"COLUMNS": "200"})


def test_eager_bytes_of_a_llama_layer_by_hand():
    # h 4096, q 4096, kv 1024 (GQA), f 14336: two norms (36 - 4 B), SwiGLU (10 - 6 B per f), rotary on q and k
    # (20 - 4 B), repeat_kv's copies of K and V to the query width and the output's contiguous copy (4 B).
    expected = 2 * 32 * 4096 + 4 * 14336 + 16 * (4096 + 1024) + 4 * ((4096 + 1024) + 4096)
    assert expected == 438_272
    assert float(_eager_extra_bytes_per_token(LLAMA8B, 1, 0)) == expected
    assert float(_eager_extra_bytes_per_token(LLAMA8B, 8, 1)) == expected / 8  # sequence-parallel norms shard too


def _step(engine: str, compiled: bool, **fixed) -> float:
    job = TrainingJob(model=LLAMA8B, seq_len=8192, global_batch=16, engine=engine, compiled=compiled)
    knobs = {"tp": [1], "pp": [1], "dp": [8], "cp": [1], "vpp": [1], "mbs": [2], "zero": [3], "recompute": [1],
             "offload": [0]} | fixed
    result = search(job, quick_cluster("h100-sxm", 8), knobs)
    return float(result.estimates.step_time_s[result.ranked[0]])


def test_eager_is_slower_than_compiled_and_compiled_prices_the_fused_kernels():
    eager, compiled = _step("torchtitan", False), _step("torchtitan", True)
    assert 1.10 < eager / compiled < 1.25
    # Megatron's model is fused kernels already: no eager term, whatever the (unused) flag says.
    assert (_step("megatron", False, zero=[1], recompute=[2], mbs=[1])
            == _step("megatron", True, zero=[1], recompute=[2], mbs=[1]))


def test_torchtitans_published_eager_and_compiled_runs():
    """torchtitan's Dec 2024 benchmark (Llama 3.1 8B, 8 and 128 H100 96 GB at 500 W): FSDP eager 5,762 / 5,605
    tokens/s/GPU, with torch.compile 6,667 / 6,514. Fitted by no constant; eager within 5% because its kernels are
    priced (without that term, eager would be predicted as compiled: +15% and +19%). The runs' op-level selective
    checkpointing reruns every other matmul (layer._alternate_matmuls_s): -4.4%, -1.0%, -1.1%, +2.1%."""
    runs = load_reference_runs()
    for run_id, measured in (("tt24_t1_01", 5762), ("tt24_t1_02", 6667), ("tt24_t3_01", 5605), ("tt24_t3_02", 6514)):
        prediction = predict_row(runs[runs.id == run_id].iloc[0])
        assert prediction.measured_tokens_per_s_per_gpu == measured
        assert abs(prediction.error_frac) < 0.05, run_id


def test_compile_goes_from_the_command_line_to_torchtitans_config(tmp_path):
    from paraplan.cli.app import app

    args = ["evaluate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192", "--global-batch",
            "16", "--engine", "torchtitan", "--tp", "1", "--pp", "1", "--mbs", "2", "--zero", "3", "--recompute",
            "selective", "--cost-model", "analytical"]
    steps = {}
    for flag in ("--compile", "--no-compile"):
        out = tmp_path / f"{flag}.json"
        result = runner.invoke(app, [*args, flag, "--json", str(out)])
        assert result.exit_code == 0, result.output
        document = json.loads(out.read_text())["plans"][0]
        assert document["job"]["compiled"] == (flag == "--compile")
        steps[flag] = document["estimate"]["step_time_s"]
    assert steps["--compile"] < steps["--no-compile"]
    engine = args.index("torchtitan")
    refused = runner.invoke(app, [*args[:engine], "megatron", *args[engine + 1:], "--compile"])
    assert refused.exit_code == 2 and "--compile applies to torchtitan" in refused.output


def test_the_torchtitan_export_enables_compile_only_when_the_plan_priced_it():
    compiled = make_export_plan("llama-3.1-8b", engine="torchtitan", dp=8, zero=3, compiled=True)
    eager = make_export_plan("llama-3.1-8b", engine="torchtitan", dp=8, zero=3)
    assert "--compile.enable" in files_of(compiled, "torchtitan")["torchtitan_launch.sh"].text
    assert "--compile" not in files_of(eager, "torchtitan")["torchtitan_launch.sh"].text
    toml = files_of(compiled, "torchtitan", torchtitan_version="0.2")["torchtitan.toml"].text
    assert '[compile]\nenable = true\ncomponents = ["model", "loss"]' in toml
    assert "[compile]" not in files_of(eager, "torchtitan", torchtitan_version="0.2")["torchtitan.toml"].text


@pytest.mark.parametrize("flag", ["--compile"])
def test_plan_with_compile_exports_end_to_end(tmp_path, flag):
    from paraplan.cli.app import app

    result = runner.invoke(app, ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192",
                                 "--global-batch", "16", "--engine", "torchtitan", flag, "--json",
                                 str(tmp_path / "p.json"), "--export", "torchtitan", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "--compile.enable" in (tmp_path / "out" / "torchtitan_launch.sh").read_text()


def test_async_tp_exposes_the_first_chunk_and_what_outlasts_the_gemms():
    table = make_table(tp=[8, 4, 1])
    exposed = _exposed_tp_comm_s(np.array([8.0, 8.0, 8.0]), np.array([10.0, 1.0, 1.0]), table, True)
    # tp 8: 7 of 8 s hidden under 30 s of GEMMs, which the reduce-scatter half of it slows by 20/132 SMs' share;
    # tp 4: 6 s to hide under 3 s of GEMMs; tp 1 has no TP traffic to hide.
    sm = 20 / 132
    np.testing.assert_allclose(exposed, [8 / 8 + sm * 0.5 * 7, 8 / 4 + (6 - 3.0) + sm * 0.5 * 3, 8.0])
    np.testing.assert_allclose(_exposed_tp_comm_s(np.array([8.0] * 3), np.array([10.0] * 3), table, False), 8.0)


def test_torchtitans_published_async_tp_pair():
    """Table 4 of the same benchmark: Llama 3.1 70B on 256 H100, FSDP 32 x TP 8, compile + Float8: 829 tokens/s/GPU,
    876 with AsyncTP. Both within 10% (-8.6%, +3.9%); the predicted gain (20%) is 3.5 times the measured (5.7%):
    the model hides all but the first of tp chunks and charges the reduce-scatter half the SMs it holds; real async
    TP also pays for the smaller, decomposed matmuls."""
    runs = load_reference_runs()
    errors = {run_id: predict_row(runs[runs.id == run_id].iloc[0]).error_frac
              for run_id in ("tt24_t4_01", "tt24_t4_02")}
    assert errors["tt24_t4_01"] == pytest.approx(-0.086, abs=0.01) and errors["tt24_t4_02"] == pytest.approx(0.039,
                                                                                                         abs=0.01)


def test_async_tp_needs_compile_and_reaches_both_torchtitan_configs(tmp_path):
    from paraplan.cli.app import app

    args = ["plan", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "8192", "--global-batch", "64",
            "--engine", "torchtitan", "--tp", "8", "--async-tp"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "--compile" in refused.output
    result = runner.invoke(app, [*args, "--compile", "--json", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p.json").read_text())["plans"][0]["job"]["async_tp"] is True
    plan = make_export_plan("llama-3.1-70b", engine="torchtitan", tp=8, dp=4, sp=True, zero=3, compiled=True,
                            async_tp=True, global_batch=32)
    assert "--compile.enable_async_tensor_parallel" in files_of(plan, "torchtitan")["torchtitan_launch.sh"].text
    toml = files_of(plan, "torchtitan", torchtitan_version="0.2")["torchtitan.toml"].text
    assert "enable_async_tensor_parallel = true" in toml
