"""One request path: the ``plan``, ``evaluate`` and ``serve`` commands and ``paraplan.plan/evaluate/serve`` build the
same request and give the same document; library errors name parameters, the CLI the flags that set them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_cli_place import MIXED  # two A100 and two H100 nodes: a topology of two GPU types
from typer.testing import CliRunner

import paraplan
from paraplan.api import evaluate_request, plan_request
from paraplan.cli.app import app
from paraplan.errors import InputError, ParameterError
from paraplan.request import ClusterSource, PlanRequest, axis_codes, build_cluster, make_request, run_options

runner = CliRunner(env={"COLUMNS": "200"})


def _cli_json(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "out.json"
    result = runner.invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def _without_solver_times(value: Any) -> Any:
    """A document less the solvers' wall times (the one thing two identical placements do not share)."""
    if isinstance(value, dict):
        return {k: _without_solver_times(v) for k, v in value.items() if k != "wall_s"}
    if isinstance(value, list):
        return [_without_solver_times(v) for v in value]
    return value


def test_plan_with_a_run_price_and_fixed_axes_gives_the_cli_document(tmp_path: Path):
    cli = _cli_json(tmp_path, "plan", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "32", "--seq-len", "4096",
                    "--global-batch", "256", "--ep", "2,4", "--recompute", "selective,full", "--sp", "both",
                    "--objective", "cost", "--top", "3", "--tokens", "1e11", "--price-per-gpu-hour", "2.5",
                    "--checkpoint", "sync", "--cost-model", "analytical", "--headroom", "0.05")
    api = paraplan.plan("mixtral-8x7b", gpu="h100-sxm", gpus=32, seq_len=4096, global_batch=256, ep=[2, 4],
                        recompute=["selective", "full"], sp=[False, True], objective="cost", top=3,
                        run=run_options(tokens=1e11, checkpoint="sync"), price_per_gpu_hour=2.5,
                        cost_model="analytical", memory_headroom_frac=0.05)
    assert api.document == cli
    assert [d["run"]["inputs"]["sources"]["price"] for d in cli["plans"]] == ["--price-per-gpu-hour"] * 3
    assert all(d["config"]["ep"] in (2, 4) and d["config"]["recompute"] in ("selective", "full") for d in cli["plans"])


def test_plan_on_a_topology_file_places_like_the_cli(tmp_path: Path):
    topology = tmp_path / "mixed.yaml"
    topology.write_text(MIXED)
    cli = _cli_json(tmp_path, "plan", "llama-3.1-8b", "--cluster", str(topology), "--seq-len", "4096",
                    "--global-batch", "128", "--tp", "8", "--pp", "2", "--vpp", "1", "--top", "1")
    api = paraplan.plan("llama-3.1-8b", cluster=str(topology), seq_len=4096, global_batch=128, tp=8, pp=2, vpp=1,
                        top=1)
    assert _without_solver_times(api.document) == _without_solver_times(cli)
    assert api.placement is not None and api.placement.rows[0].stage_types  # a typed pipeline, as the CLI's
    assert sum(api.documents[0]["placement"]["mixed_gpus"]["stage_layers"]) == 32


def test_evaluate_request_gives_the_cli_document(tmp_path: Path):
    cli = _cli_json(tmp_path, "evaluate", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "8192",
                    "--global-batch", "128", "--tp", "4", "--pp", "4", "--vpp", "5", "--sp", "on", "--zero", "1",
                    "--steps", "1000", "--restart-s", "300")
    request = make_request("llama-3.1-70b", gpu="h100-sxm", gpus=64, seq_len=8192, global_batch=128, tp=4, pp=4,
                           vpp=5, sp=True, zero=1, run=run_options(steps=1000, restart_s=300))
    evaluation = evaluate_request(request)
    assert evaluation.document == cli
    assert evaluation.plan.config.dp == 4 and evaluation.run is not None and evaluation.run.num_steps == 1000


def test_serve_gives_the_cli_document(tmp_path: Path):
    cli = _cli_json(tmp_path, "serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--isl", "512", "--osl",
                    "256", "--rate", "2", "--percentile", "90", "--ttft-ms", "500", "--tpot-ms", "40", "--engine",
                    "vllm", "--top", "2")
    api = paraplan.serve("llama-3.1-8b", gpu="h100-sxm", gpus=8, isl=512, osl=256, rate=2.0, percentile=90,
                         ttft_ms=500, tpot_ms=40, engines=["vllm"], top=2)
    assert api.document == cli


def test_a_request_is_frozen_and_states_its_axes_as_codes():
    request = make_request("llama-3.1-8b", gpu="h100-sxm", gpus=8, seq_len=4096, global_batch=64, tp=[8, 2],
                           recompute="full", sp=[True, False], cp_comm="a2a")
    assert isinstance(request, PlanRequest)
    assert dict(request.fixed) == {"tp": (2, 8), "recompute": (2,), "sp": (0, 1), "cp_comm": (1,)}
    with pytest.raises(AttributeError):
        request.top = 3  # type: ignore[misc]
    assert axis_codes("pp_schedule", ["dualpipev", "1f1b"]) == (0, 1)


@pytest.mark.parametrize(("call", "library", "flag_args", "cli"), [
    (lambda: run_options(tokens=0.5), "tokens expects a number >= 1", ["--tokens", "0.5"],
     "--tokens expects a number >= 1"),
    (lambda: run_options(steps=10, tokens=1e9), "give tokens or steps, not both", ["--steps", "10", "--tokens", "1e9"],
     "give --tokens or --steps, not both"),
    (lambda: run_options(restart_s=60), "restart_s describes the whole run: add a budget, tokens N",
     ["--restart-s", "60"], "--restart-s describes the whole run: add a budget, --tokens N"),
    (lambda: make_request("llama-3.1-8b", gpu="h100-sxm", gpus=8, seq_len=4096, global_batch=64, top=0),
     "top expects a positive integer, got 0", ["--top", "0"], "--top expects a positive integer, got 0"),
    (lambda: paraplan.plan("llama-3.1-8b", gpu="h100-sxm", gpus=8, seq_len=4096, global_batch=64, compiled=True),
     "compiled applies to torchtitan's eager PyTorch model; megatron's model already runs fused kernels (drop "
     "compiled or use engine torchtitan)", ["--compile"],
     "--compile applies to torchtitan's eager PyTorch model; megatron's model already runs fused kernels (drop "
     "--compile or use --engine torchtitan)"),
    (lambda: paraplan.plan("llama-3.1-8b", gpu="h100-sxm", gpus=8, seq_len=4096, global_batch=64,
                           expert_imbalance=1.2), "expert_imbalance apply to MoE models; llama-3.1-8b is dense",
     ["--expert-imbalance", "1.2"], "--expert-imbalance apply to MoE models"),
])
def test_library_errors_name_parameters_and_the_cli_names_flags(call, library, flag_args, cli):
    with pytest.raises(ParameterError) as caught:
        call()
    assert library in str(caught.value)
    base = ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64"]
    result = runner.invoke(app, [*base, *flag_args])
    assert result.exit_code == 2 and f"error: {cli}" in result.stderr, result.output


def test_cluster_source_errors_in_both_spellings():
    with pytest.raises(ParameterError) as caught:
        build_cluster(ClusterSource(cluster="dgx-h100", nodes=1, gpus_per_node=4))
    assert str(caught.value) == "gpus_per_node goes with gpu; a cluster fixes its own node size"
    assert caught.value.spelled(lambda p: "--" + p.replace("_", "-")) == \
        "--gpus-per-node goes with --gpu; a --cluster fixes its own node size"
    assert build_cluster(ClusterSource(cluster="dgx-h100", nodes=2)).num_gpus == 16


def test_a_parameter_error_formats_user_text_once():
    """A value holding braces is shown as given, never read as a template."""
    error = ParameterError("{tokens} expects a number, got {value}", value="{steps}")
    assert str(error) == "tokens expects a number, got {steps}"
    assert isinstance(error, InputError)


def test_the_api_reads_a_user_hardware_file(tmp_path: Path):
    hardware = tmp_path / "hw.yaml"
    hardware.write_text("clusters:\n  my-pod: {gpu: h100-sxm, gpus_per_node: 8, nvlink_domain_gpus: 8, "
                        "nic_gb_per_s_per_gpu: 50, inter_node_latency_us: 5.0, intra_domain_latency_us: 2.0}\n")
    result = plan_request(make_request("llama-3.1-8b", cluster="my-pod", nodes=2, hardware=hardware, seq_len=4096,
                                       global_batch=64, top=1))
    assert result.cluster.num_gpus == 16 and result.cluster.name.startswith("my-pod")
