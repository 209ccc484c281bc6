"""Step-level calibration from Megatron-LM runs: prediction of a logged run, leave-one-run-out, application."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cost_models.learned.learn import learn
from paraplan.cost_models.learned.megatron_runs import predict_step_s
from paraplan.cost_models.learned.provider import compute_rates
from paraplan.cost_models.learned.step_calibration import evaluate_step_calibration
from paraplan.errors import InputError
from paraplan.hardware_profiles import load_gpu, quick_cluster
from paraplan.model_specs.hf_config import model_from_config
from paraplan.planner.job import TrainingJob
from paraplan.planner.search import search

# A Llama-2-7B-shaped run on 8 H100s (arguments as Megatron prints them).
ARGS = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "world_size": 8, "micro_batch_size": 1,
        "global_batch_size": 64, "seq_length": 4096, "num_layers": 32, "hidden_size": 4096,
        "ffn_hidden_size": 11008, "num_attention_heads": 32, "num_query_groups": 32, "padded_vocab_size": 32000,
        "swiglu": "True", "use_distributed_optimizer": "True", "sequence_parallel": "True",
        "recompute_granularity": "None"}


def _log(args: dict, step_ms: list[float]) -> str:
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {key} {'.' * (48 - len(key))} {value}" for key, value in args.items()]
    lines += ["-------------------- end of arguments ---------------------"]
    lines += [f" [2024-04-06 02:59:{i:02d}] iteration {10 * i:8d}/     100 | consumed samples: {640 * i:12d} | "
              f"elapsed time per iteration (ms): {ms:.1f} | global batch size:    64 |"
              for i, ms in enumerate(step_ms, 1)]
    return "\n".join(lines) + "\n"


def test_prediction_matches_the_planner():
    hf = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
          "intermediate_size": 11008, "num_hidden_layers": 32, "vocab_size": 32000, "max_position_embeddings": 4096}
    job = TrainingJob(model=model_from_config(hf, "megatron-run"), seq_len=4096, global_batch=64)
    fixed = {"tp": [2], "pp": [1], "dp": [4], "cp": [1], "vpp": [1], "mbs": [1], "zero": [1], "recompute": [0],
             "sp": [1], "offload": [0], "tp_overlap": [0]}
    result = search(job, quick_cluster("h100-sxm", 8), fixed)
    assert len(result.table) == 1
    assert predict_step_s(ARGS, "h100-sxm") == pytest.approx(float(result.estimates.step_time_s[0]), rel=1e-12)


def test_leave_one_run_out_numbers():
    measured, predicted = np.array([1.2, 1.25, 1.5]), np.array([1.0, 1.0, 1.0])
    score = evaluate_step_calibration("h100-sxm", measured, predicted)
    # The median of two log ratios is their mean: each held-out run gets the geometric mean of the others.
    factors = np.sqrt([1.25 * 1.5, 1.2 * 1.5, 1.2 * 1.25])
    expected = np.abs(factors / measured - 1).mean()
    assert score.learned_mape_frac == pytest.approx(expected)
    assert score.analytical_mape_frac == pytest.approx(np.mean(np.abs(1 / measured - 1)))  # 1/6, 1/5, 1/3


def test_learned_calibration_applies_to_evaluate(tmp_path, monkeypatch):
    store = tmp_path / "runs.sqlite"
    monkeypatch.setenv("PARAPLAN_STORE", str(store))
    logs = []
    for i, (ratio, batch) in enumerate(((1.2, 64), (1.25, 128), (1.3, 256))):
        args = {**ARGS, "global_batch_size": batch}
        step = 1e3 * predict_step_s(args, "h100-sxm") * ratio
        path = tmp_path / f"run{i}.log"
        path.write_text(_log(args, [10 * step, step, step * 1.001, step * 0.999]))  # first logged step: start-up
        logs.append(str(path))
    runner = CliRunner(env={"COLUMNS": "200"})
    assert runner.invoke(app, ["ingest", *logs, "--hardware", "h100-sxm"]).exit_code == 0
    (target,) = learn(store)["h100-sxm"]
    assert target.meta.target == "step" and target.meta.num_rows == 3
    score = target.scores[0]
    assert score.learned_mape_frac < 0.05 < score.analytical_mape_frac  # 20-30% slower than predicted, learned
    rates = compute_rates("auto", load_gpu("h100-sxm"), "bf16", "fused", "transformer_engine", store)
    assert rates.step_time_factor == pytest.approx(1.25, rel=2e-3)
    assert "learned step calibration on 3 runs" in rates.source
    evaluate = ["evaluate", "llama-2-7b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch",
                "64", "--tp", "2", "--pp", "1", "--sp", "on", "--zero", "1", "--json"]
    runner.invoke(app, [*evaluate, str(tmp_path / "auto.json")])
    runner.invoke(app, [*evaluate, str(tmp_path / "plain.json"), "--cost-model", "analytical"])
    auto = json.loads((tmp_path / "auto.json").read_text())["plans"][0]
    plain = json.loads((tmp_path / "plain.json").read_text())["plans"][0]
    assert auto["estimate"]["step_time_s"] == pytest.approx(plain["estimate"]["step_time_s"] * rates.step_time_factor)
    assert auto["estimate"]["mfu"] == pytest.approx(plain["estimate"]["mfu"] / rates.step_time_factor)
    assert "step time x 1.2" in auto["provenance"]["cost_model"]


def test_moe_runs_are_refused_with_a_reason():
    with pytest.raises(InputError, match="MoE Megatron runs are not mapped"):
        predict_step_s({**ARGS, "num_experts": 8}, "h100-sxm")
