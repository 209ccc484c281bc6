"""Whether the efficiency fractions a job reads were fitted to its GPU, borrowed from a sibling, assumed, or
efficiency.yaml's defaults: recorded by the loader per precision and attention kernel, carried by the cost model's
label, the plan JSON (provenance.efficiency_calibration) and a note beside the plan table."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cost_models.compute import analytical_rates
from paraplan.errors import InputError
from paraplan.hardware_profiles import builtin_catalog, catalog, load_gpu
from paraplan.hardware_profiles.user_file import HARDWARE_ENV, load_user_catalog

runner = CliRunner(env={"COLUMNS": "200", HARDWARE_ENV: ""})
JOB = ["--gpus", "8", "--seq-len", "4096", "--global-batch", "64", "--top", "2"]


def _origins(gpu: str, precision: str, attention: str, stack: str = "transformer_engine") -> tuple[str, str]:
    calibration = load_gpu(gpu).calibration(precision, attention, stack)
    return calibration.gemm, calibration.attention


# -- the loader -------------------------------------------------------------------------------------------------
def test_h100_bf16_and_its_attention_are_fitted():
    assert _origins("h100-sxm", "bf16", "flash", "pytorch") == ("fitted", "fitted")
    assert _origins("h100-sxm", "fp8", "fused") == ("fitted", "fitted")
    assert _origins("h100-sxm", "fp8", "flash", "pytorch") == ("fitted", "fitted")  # the PyTorch-stack fp8 override
    assert _origins("h100-sxm", "fp16", "fused") == ("assumed", "fitted")  # the bf16 value, no fp16 run fitted
    assert load_gpu("h100-sxm").calibration("bf16", "flash", "pytorch").status == "calibrated"


def test_b200_fp8_is_fitted_and_bf16_is_the_default():
    assert _origins("b200", "fp8", "fused") == ("fitted", "fitted")
    assert _origins("b200", "bf16", "fused") == ("default", "fitted")
    assert _origins("b200", "bf16", "flash") == ("default", "assumed")  # set to the fused value, not fitted
    assert load_gpu("b200").calibration("bf16", "fused", "transformer_engine").status == "partly calibrated"


@pytest.mark.parametrize("gpu", ["h200-sxm", "b300", "mi300x", "mi325x"])
def test_gpus_without_an_entry_are_uncalibrated(gpu):
    calibration = load_gpu(gpu).calibration("bf16", "flash", "pytorch")
    assert (calibration.gemm, calibration.attention, calibration.status) == ("default", "default", "uncalibrated")


@pytest.mark.parametrize("gpu, base", [("h800-sxm", "h100-sxm"), ("h100-sxm-96gb", "h100-sxm"),
                                       ("h100-nvl", "h100-sxm"), ("gh200-96gb", "h100-sxm"), ("h20", "h100-sxm"),
                                       ("a100-sxm-40gb", "a100-sxm-80gb")])
def test_same_silicon_entries_are_borrowed_not_fitted(gpu, base):
    assert _origins(gpu, "bf16", "flash", "pytorch") == (f"borrowed:{base}", f"borrowed:{base}")
    # The origin is not part of the constants: validation groups GPUs reading the same ones (cross_source.chip_entry
    # compares them with the source text left out).
    own, lender = (dataclasses.replace(load_gpu(name).efficiency, source="") for name in (gpu, base))
    assert own == lender and own.fraction_origin != lender.fraction_origin


def test_unfused_attention_reads_the_bf16_gemm_fraction():
    assert _origins("b200", "fp8", "unfused") == ("fitted", "default")
    assert _origins("h100-sxm", "fp8", "unfused") == ("fitted", "fitted")


def test_a_borrowed_entry_must_hold_its_lenders_values_and_assumed_must_name_its_own():
    table = catalog._efficiencies()
    h100 = table["h100-sxm"]
    changed = dataclasses.replace(h100, gemm_peak_frac={**h100.gemm_peak_frac, "bf16": 0.61})
    with pytest.raises(InputError, match=r"efficiency.yaml:x: gemm_peak_frac.bf16 differs from h100-sxm's"):
        catalog._origins("x", {"borrowed_from": "h100-sxm", "gemm_peak_frac": {"bf16": 0.61}}, changed, table)
    with pytest.raises(InputError, match=r"borrowed_from: 'h2000' is not a GPU entry above it"):
        catalog._origins("x", {"borrowed_from": "h2000"}, h100, table)
    with pytest.raises(InputError, match=r"efficiency.yaml:x.assumed: expected a list of fractions the entry sets"):
        catalog._origins("x", {"gemm_peak_frac": {"bf16": 0.6}, "assumed": ["attention_peak_frac.flash"]}, h100, table)


# -- user GPUs --------------------------------------------------------------------------------------------------
def _user_gpu(tmp_path: Path, **changes: object):
    entry = {"display_name": "site GPU", "vendor": "nvidia", "architecture": "hopper",
             "dense_tflops": {"bf16": 900, "fp16": 900, "fp8": 1800}, "hbm_gib": 141, "hbm_tb_per_s": 4.8,
             "nvlink_gb_per_s": 450, "nic_gb_per_s": 50, "host_link_gb_per_s": 64, "host_memory_gib": 256,
             "sources": {"dense_tflops": "sheet", "hbm": "sheet", "nvlink": "sheet", "nic": "sheet", "host": "sheet"},
             **changes}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"gpus": {"site-gpu": entry}}))
    return path, load_user_catalog(path).gpu("site-gpu")


@pytest.mark.parametrize("changes, expected", [
    ({}, "borrowed:h100-sxm"),                                  # hopper: h100-sxm's fits
    ({"efficiency_from": "h800-sxm"}, "borrowed:h100-sxm"),     # a borrower's borrowed fit keeps its lender
    ({"efficiency_from": "defaults"}, "default"),
    ({"efficiency_from": "h200-sxm"}, "default"),               # a built-in GPU without an entry
    ({"architecture": "quantum"}, "default"),                   # an architecture efficiency.yaml does not know
])
def test_user_gpus_say_whose_fractions_they_read(tmp_path: Path, changes, expected):
    _, gpu = _user_gpu(tmp_path, **changes)
    calibration = gpu.calibration("bf16", "flash", "pytorch")
    assert (calibration.gemm, calibration.attention) == (expected, expected)


def test_an_unknown_architecture_user_gpu_plans_as_uncalibrated(tmp_path: Path):
    path, _ = _user_gpu(tmp_path, architecture="quantum")
    result = runner.invoke(app, ["plan", "llama-3.1-8b", "--hardware", str(path), "--gpu", "site-gpu", *JOB,
                                 "--json", "-"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)["plans"][0]["provenance"]["efficiency_calibration"]
    assert found == {"gpu": "site-gpu", "status": "uncalibrated", "precision": "bf16", "gemm": "default",
                     "attention_kernel": "fused", "attention": "default"}


# -- what plans say ---------------------------------------------------------------------------------------------
def test_the_cost_model_label_says_whether_the_gpu_is_calibrated():
    assert analytical_rates(load_gpu("h200-sxm"), "bf16", "flash", "pytorch").source.endswith(
        "flash attention: uncalibrated (bf16 GEMM and flash attention fractions: defaults))")
    assert analytical_rates(load_gpu("h100-sxm"), "bf16", "fused").source.endswith(
        "calibrated (bf16 GEMM and fused attention fractions: fitted))")
    assert "bf16 GEMM fraction: default; fused attention: fitted" in analytical_rates(load_gpu("b200"), "bf16").source


def test_an_h200_plan_says_uncalibrated_in_json_and_in_the_table():
    args = ["plan", "llama-3.1-8b", "--gpu", "h200-sxm", *JOB]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    text = " ".join(table.stdout.replace("│", " ").split())  # the cost model line wraps inside the panel
    assert ("fused attention: uncalibrated (bf16 GEMM and fused attention fractions: defaults); defaulted fractions x "
            "the median distributed-run factor fitted on other GPUs)") in text  # cost model, 8 GPUs: the full factor
    assert ("note: h200-sxm: uncalibrated (bf16 GEMM and fused attention fractions: defaults): step times rest on "
            "efficiency.yaml's defaults") in text
    document = json.loads(runner.invoke(app, [*args, "--json", "-"]).stdout)
    for plan in document["plans"]:
        assert plan["provenance"]["efficiency_calibration"] == {
            "gpu": "h200-sxm", "status": "uncalibrated", "precision": "bf16", "gemm": "default",
            "attention_kernel": "fused", "attention": "default"}
        assert "uncalibrated" in plan["provenance"]["cost_model"]


def test_an_h100_plan_says_fitted_and_prints_no_note():
    args = ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", *JOB, "--engine", "torchtitan"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "note:" not in table.stdout
    found = json.loads(runner.invoke(app, [*args, "--json", "-"]).stdout)["plans"][0]["provenance"]
    assert found["efficiency_calibration"]["status"] == "calibrated"
    assert (found["efficiency_calibration"]["gemm"], found["efficiency_calibration"]["attention"]) == ("fitted",
                                                                                                        "fitted")


def test_a_b200_fp8_evaluation_is_fitted_and_bf16_partly():
    base = ["evaluate", "llama-3.1-8b", "--gpu", "b200", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64",
            "--tp", "1", "--pp", "1", "--json", "-"]
    fp8 = json.loads(runner.invoke(app, [*base, "--precision", "fp8"]).stdout)["plans"][0]["provenance"]
    bf16 = json.loads(runner.invoke(app, base).stdout)["plans"][0]["provenance"]
    assert fp8["efficiency_calibration"]["gemm"] == "fitted" and fp8["efficiency_calibration"]["status"] == "calibrated"
    assert (bf16["efficiency_calibration"]["gemm"], bf16["efficiency_calibration"]["status"]) == ("default",
                                                                                                  "partly calibrated")


def test_every_builtin_gpu_has_a_calibration_for_every_kernel():
    for gpu in builtin_catalog().gpus.values():
        for kernel in ("fused", "flash", "unfused"):
            calibration = gpu.calibration("bf16", kernel, "pytorch")
            for origin in (calibration.gemm, calibration.attention):
                assert origin in ("fitted", "assumed", "default") or origin.startswith("borrowed:"), (gpu.name, origin)
