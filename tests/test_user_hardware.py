"""User hardware files (--hardware FILE, $PARAPLAN_HARDWARE): the reader, its refusals, and the CLI end to end."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import assert_bad_input
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.errors import InputError
from paraplan.hardware_profiles import builtin_catalog, load_gpu
from paraplan.hardware_profiles.user_file import HARDWARE_ENV, MAX_FILE_BYTES, load_user_catalog, resolve_catalog

runner = CliRunner(env={"COLUMNS": "200", HARDWARE_ENV: ""})

GPU_ENTRY = {
    "display_name": "NVIDIA H20 96GB (site numbers)",
    "vendor": "nvidia",
    "architecture": "hopper",
    "dense_tflops": {"bf16": 148, "fp16": 148, "fp8": 296, "tf32": 74},
    "hbm_gib": 94,
    "hbm_tb_per_s": 4.0,
    "nvlink_gb_per_s": 450,
    "nic_gb_per_s": 50,
    "host_link_gb_per_s": 64,
    "host_memory_gib": 256,
    "sources": {"dense_tflops": "vendor sheet", "hbm": "nvidia-smi", "nvlink": "vendor sheet",
                "nic": "our fabric", "host": "our servers"},
}
CLUSTER_ENTRY = {"gpu": "h20-site", "gpus_per_node": 8, "nvlink_domain_gpus": 8, "nic_gb_per_s_per_gpu": 50,
                 "inter_node_latency_us": 5.0, "intra_domain_latency_us": 2.0}


def hardware_text(gpu: dict | None = None, cluster: dict | None = None, **extra) -> str:
    document = {"gpus": {"h20-site": {**GPU_ENTRY, **(gpu or {})}},
                "clusters": {"site-h20": {**CLUSTER_ENTRY, **(cluster or {})}}, **extra}
    return yaml.safe_dump(document, sort_keys=False)


@pytest.fixture()
def hardware_file(tmp_path: Path) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(hardware_text())
    return path


# -- the reader -------------------------------------------------------------------------------
def test_user_gpu_numbers_are_converted_to_si_once(hardware_file: Path):
    gpu = load_user_catalog(hardware_file).gpu("h20-site")
    assert gpu.hbm_bytes == 94 * 2**30 == 100_931_731_456
    assert gpu.hbm_bytes_per_s == 4.0e12
    assert gpu.peak_flops_per_s == {"bf16": 148e12, "fp16": 148e12, "fp8": 296e12, "tf32": 74e12}
    assert gpu.nvlink_bytes_per_s == 450e9 and gpu.nic_bytes_per_s == 50e9 and gpu.host_link_bytes_per_s == 64e9
    assert gpu.host_memory_bytes == 256 * 2**30
    assert gpu.origin == str(hardware_file)
    # hopper without efficiency_from borrows the fitted H100 SXM constants (efficiency.yaml architecture_bases)
    assert gpu.efficiency_from == "h100-sxm" and gpu.efficiency == load_gpu("h100-sxm").efficiency
    assert gpu.efficiency.gemm_peak_frac["bf16"] == 0.58


def test_user_cluster_uses_the_user_gpu(hardware_file: Path):
    catalog = load_user_catalog(hardware_file)
    cluster = catalog.cluster("site-h20", num_gpus=32)
    assert (cluster.num_nodes, cluster.gpu.name, cluster.nic_bytes_per_s_per_gpu) == (4, "h20-site", 50e9)
    assert catalog.cluster_origins["site-h20"] == str(hardware_file)
    assert catalog.cluster_origins["dgx-h100"] == "built-in"
    assert set(builtin_catalog().gpus) < set(catalog.gpus)  # built-ins stay beside the user's


@pytest.mark.parametrize(("gpu", "expected"), [
    ({"efficiency_from": "a100-sxm-80gb"}, "a100-sxm-80gb"),
    ({"efficiency_from": "defaults"}, "defaults"),
    ({"efficiency_from": "h200-sxm"}, "defaults"),        # h200-sxm has no fitted constants of its own
    ({"architecture": "Hopper"}, "h100-sxm"),             # architecture matched case-insensitively
    ({"architecture": "cdna3"}, "defaults"),              # no built-in base for cdna3
    ({"architecture": "blackwell"}, "b200"),
], ids=["named", "defaults", "named-without-own", "arch-case", "arch-without-base", "blackwell"])
def test_efficiency_borrowing_rule(tmp_path: Path, gpu: dict, expected: str):
    path = tmp_path / "hw.yaml"
    path.write_text(hardware_text(gpu))
    spec = load_user_catalog(path).gpu("h20-site")
    assert spec.efficiency_from == expected
    base = builtin_catalog().gpus["a100-sxm-80gb" if expected == "a100-sxm-80gb" else "h100-sxm"].efficiency
    if expected in ("a100-sxm-80gb", "h100-sxm"):
        assert spec.efficiency == base
    if expected == "defaults":
        assert spec.efficiency.gemm_peak_frac["bf16"] == 0.78  # efficiency.yaml defaults


def test_env_var_is_the_default_and_the_option_wins(hardware_file: Path, tmp_path: Path):
    assert resolve_catalog(None, {HARDWARE_ENV: str(hardware_file)}).user_file == str(hardware_file)
    assert resolve_catalog(None, {HARDWARE_ENV: "  "}) is builtin_catalog()
    other = tmp_path / "other.yaml"
    other.write_text(hardware_text().replace("h20-site", "h20-other"))
    assert "h20-other" in resolve_catalog(other, {HARDWARE_ENV: str(hardware_file)}).gpus
    with pytest.raises(InputError, match=rf"cannot read hardware file .*\(file from \${HARDWARE_ENV}\)"):
        resolve_catalog(None, {HARDWARE_ENV: str(tmp_path / "missing.yaml")})


def _without(key: str) -> dict:
    return {k: v for k, v in GPU_ENTRY.items() if k != key}


# Each bad file: (text, needles the single error line must contain besides the file name).
BAD_FILES = {
    "unknown-key": (hardware_text({"hbm_gb": 80}), ["gpus.h20-site", "unknown key(s) hbm_gb"]),
    "missing-key": (yaml.safe_dump({"gpus": {"h20-site": _without("hbm_tb_per_s")}}),
                    ["gpus.h20-site", "missing key(s) hbm_tb_per_s"]),
    "missing-source": (hardware_text({"sources": {"hbm": "x"}}), ["sources", "missing key(s)"]),
    "missing-bf16": (hardware_text({"dense_tflops": {"fp16": 148}}), ["dense_tflops", "missing key(s) bf16"]),
    "negative": (hardware_text({"hbm_gib": -80}), ["gpus.h20-site.hbm_gib", "expected a positive number"]),
    "zero": (hardware_text({"nvlink_gb_per_s": 0}), ["nvlink_gb_per_s", "expected a positive number"]),
    "absurd-hbm": (hardware_text({"hbm_gib": 80_000}), ["hbm_gib", "implausibly large"]),
    "absurd-flops": (hardware_text({"dense_tflops": {"bf16": 1e9, "fp16": 148}}), ["dense_tflops.bf16", "implausibly"]),
    "infinite": (hardware_text().replace("hbm_tb_per_s: 4.0", "hbm_tb_per_s: .inf"), ["hbm_tb_per_s", "positive"]),
    "huge-int": (hardware_text().replace("hbm_gib: 94", "hbm_gib: " + "9" * 400), ["hbm_gib", "positive number"]),
    "string-number": (hardware_text({"hbm_gib": "80 GB"}), ["hbm_gib", "expected a positive number", "80 GB"]),
    "bool-number": (hardware_text({"hbm_gib": True}), ["hbm_gib", "expected a positive number"]),
    "date-number": (hardware_text().replace("hbm_gib: 94", "hbm_gib: 2024-01-01"), ["hbm_gib", "positive number"]),
    "bad-date": (hardware_text().replace("hbm_gib: 94", "hbm_gib: 2024-13-45"), ["malformed YAML"]),
    "number-as-name": (hardware_text({"display_name": 123}), ["display_name", "expected a non-empty text"]),
    "entry-not-mapping": (yaml.safe_dump({"gpus": {"h20-site": [1, 2]}}), ["gpus.h20-site", "expected a mapping"]),
    "shadows-builtin-gpu": (hardware_text().replace("h20-site", "h100-sxm"), ["'h100-sxm' is a built-in GPU",
                                                                            "distinct name"]),
    "shadows-builtin-cluster": (hardware_text().replace("site-h20", "dgx-h100"), ["'dgx-h100' is a built-in cluster"]),
    "gpu-and-cluster-same-name": (hardware_text().replace("site-h20", "h20-site"), ["names both a GPU and a cluster"]),
    "key-twice": ("gpus:\n  h20-site: {}\n  h20-site: {}\n", ["malformed YAML", "given twice"]),
    "malformed-yaml": ("gpus:\n  h20-site: [unclosed\n", ["malformed YAML at line"]),
    "top-level-list": ("- h100-sxm\n", ["expected a mapping at the top level"]),
    "empty": ("", ["expected a mapping at the top level"]),
    "no-entries": ("gpus: {}\n", ["holds no entries"]),
    "unknown-top-key": (hardware_text() + "gpu: x\n", ["unknown key(s) gpu"]),
    "schema-version": (hardware_text(schema_version=2), ["schema_version", "expected 1"]),
    "bad-name": (hardware_text().replace("h20-site:", "my gpu:", 1), ["'my gpu' is not a usable name"]),
    "unknown-efficiency-base": (hardware_text({"efficiency_from": "h100"}),
                                ["efficiency_from", "'h100' is not a built-in GPU"]),
    "cluster-unknown-gpu": (hardware_text(cluster={"gpu": "h21"}), ["clusters.site-h20.gpu", "unknown GPU 'h21'"]),
    "cluster-domain": (hardware_text(cluster={"nvlink_domain_gpus": 12}), ["site-h20", "whole nodes"]),
    "cluster-latency": (hardware_text(cluster={"inter_node_latency_us": 1e9}),
                        ["inter_node_latency_us", "implausibly"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_hardware_file_is_one_line_exit_2(tmp_path: Path, case: str):
    text, needles = BAD_FILES[case]
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    assert_bad_input(runner.invoke(app, ["hardware", "list", "--hardware", str(path)]), str(path), *needles)


def test_non_utf8_huge_and_missing_files_are_refused(tmp_path: Path):
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes(hardware_text().replace("(site numbers)", "(für uns)").encode("latin-1"))
    assert_bad_input(runner.invoke(app, ["hardware", "list", "--hardware", str(latin)]), str(latin), "not UTF-8",
                     "0xfc")
    huge = tmp_path / "huge.yaml"
    huge.write_text(hardware_text() + "#" * MAX_FILE_BYTES)
    assert_bad_input(runner.invoke(app, ["hardware", "list", "--hardware", str(huge)]), str(huge), "too large")
    missing = tmp_path / "nope.yaml"
    assert_bad_input(runner.invoke(app, ["hardware", "list", "--hardware", str(missing)]), "cannot read hardware "
                     f"file {missing}")


# -- fuzz: the reader loads or raises InputError, nothing else ---------------------------------
_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.floats()
            | st.text(max_size=12) | st.sampled_from(list(GPU_ENTRY) + ["h100-sxm", "defaults", "gpus", "bf16"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=8) | st.integers() | st.sampled_from(list(GPU_ENTRY)),
                                         inner, max_size=5), max_leaves=20)


def _load_text(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "hw.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_user_catalog(path)
        except InputError:
            pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(GPU_ENTRY) + ["efficiency_from", "extra"]), value=_VALUES,
       drop=st.booleans(), cluster_key=st.sampled_from(sorted(CLUSTER_ENTRY) + ["oversubscription"]),
       cluster_value=_VALUES)
def test_fuzz_mutated_entries_load_or_raise_input_error(key, value, drop, cluster_key, cluster_value):
    gpu = dict(GPU_ENTRY)
    if drop:
        gpu.pop(key, None)
    else:
        gpu[key] = value
    cluster = {**CLUSTER_ENTRY, cluster_key: cluster_value}
    _load_text(yaml.safe_dump({"gpus": {"h20-site": gpu}, "clusters": {"site-h20": cluster}}))


@settings(max_examples=150, deadline=None)
@given(document=st.dictionaries(st.sampled_from(["gpus", "clusters", "schema_version", "x"]) | st.text(max_size=6),
                                _VALUES, max_size=4))
def test_fuzz_random_documents_load_or_raise_input_error(document):
    _load_text(yaml.safe_dump(document))


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=200))
def test_fuzz_random_text_loads_or_raises_input_error(text):
    _load_text(text)


# -- the CLI end to end -----------------------------------------------------------------------
JOB = ["llama-3.1-8b", "--seq-len", "4096", "--global-batch", "32"]


def test_plan_evaluate_export_and_place_with_a_user_gpu(hardware_file: Path, tmp_path: Path):
    plan_json = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", *JOB, "--gpu", "h20-site", "--gpus", "16", "--hardware", str(hardware_file),
                                 "--tp", "1,2", "--pp", "1", "--top", "2", "--json", str(plan_json)])
    assert result.exit_code == 0, result.output
    assert f"GPU h20-site: user hardware file {hardware_file}, h100-sxm's efficiency constants" in result.stdout
    document = json.loads(plan_json.read_text())
    best = document["plans"][0]
    assert best["cluster"]["gpu"] == "h20-site" and best["cluster"]["num_gpus"] == 16
    assert best["provenance"]["hardware"] == {"gpu": "h20-site", "origin": str(hardware_file),
                                              "efficiency_from": "h100-sxm"}

    # evaluate the same layout on the user's cluster type: same GPU, same provenance
    config = best["config"]
    eval_json = tmp_path / "eval.json"
    result = runner.invoke(app, ["evaluate", *JOB, "--cluster", "site-h20", "--nodes", "2", "--hardware",
                                 str(hardware_file), "--tp", str(config["tp"]), "--pp", "1", "--mbs",
                                 str(config["mbs"]), "--zero", str(config["zero"]), "--recompute",
                                 config["recompute"], "--sp", "on" if config["sp"] else "off", "--json",
                                 str(eval_json)])
    assert result.exit_code == 0, result.output
    assert "user hardware file" in result.stdout
    evaluated = json.loads(eval_json.read_text())["plans"][0]
    assert evaluated["cluster"]["name"] == "site-h20"
    assert evaluated["provenance"]["hardware"]["origin"] == str(hardware_file)

    # export re-reads only the plan: no hardware file needed
    out = tmp_path / "launch"
    result = runner.invoke(app, ["export", str(plan_json), "--format", "megatron", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert any(out.iterdir())

    # place prices the plan on the user's cluster: it needs the file, and says so without it
    result = runner.invoke(app, ["place", str(plan_json), "--cluster", "site-h20", "--nodes", "2",
                                 "--time-limit", "2"])
    assert_bad_input(result, "user hardware file", f"--hardware {hardware_file}", HARDWARE_ENV)
    result = runner.invoke(app, ["place", str(plan_json), "--cluster", "site-h20", "--nodes", "2",
                                 "--time-limit", "2", "--hardware", str(hardware_file)])
    assert result.exit_code == 0, result.output
    assert "step time: default order" in result.stdout


def test_env_var_feeds_plan_and_hardware_show(hardware_file: Path, tmp_path: Path):
    env = {HARDWARE_ENV: str(hardware_file)}
    result = runner.invoke(app, ["hardware", "show", "h20-site"], env=env)
    assert result.exit_code == 0, result.output
    assert f"user entry from {hardware_file}" in result.stdout
    assert "bf16 148" in result.stdout
    assert "h100-sxm's" in result.stdout and "borrowed" in result.stdout  # the efficiency row's source (wrapped)
    result = runner.invoke(app, ["evaluate", *JOB, "--gpu", "h20-site", "--gpus", "8", "--tp", "8", "--pp", "1"],
                           env=env)
    assert result.exit_code == 0, result.output
    assert "user hardware file" in result.stdout
    # the same command without the file (and without the variable) does not know the GPU
    assert_bad_input(runner.invoke(app, ["evaluate", *JOB, "--gpu", "h20-site", "--gpus", "8", "--tp", "8",
                                         "--pp", "1"]), "unknown GPU 'h20-site'", "--hardware")


def test_hardware_list_marks_user_entries(hardware_file: Path):
    result = runner.invoke(app, ["hardware", "list", "--hardware", str(hardware_file)])
    assert result.exit_code == 0, result.output
    gpu_rows = [line for line in result.stdout.splitlines() if "h20-site" in line]
    assert any(f"user: {hardware_file}" in line and "148" in line for line in gpu_rows)
    assert any("site-h20" in line and f"user: {hardware_file}" in line for line in result.stdout.splitlines())
    h100 = next(line for line in result.stdout.splitlines() if line.strip("│ ").startswith("h100-sxm "))
    assert "built-in" in h100
    result = runner.invoke(app, ["hardware", "show", "site-h20", "--hardware", str(hardware_file)])
    assert result.exit_code == 0, result.output
    assert f"user entry from {hardware_file}" in result.stdout


def test_documented_example_file_loads(tmp_path: Path):
    doc = (Path(__file__).resolve().parents[1] / "docs" / "hardware.md").read_text()
    section = doc.split("## Your own hardware", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "site.yaml"
    path.write_text(example)
    catalog = load_user_catalog(path)
    gpu = catalog.gpu("h100-sxm-site")
    assert gpu.hbm_bytes == 80 * 2**30 and gpu.nic_bytes_per_s == 25e9 and gpu.efficiency_from == "h100-sxm"
    assert catalog.cluster("site-h100", num_nodes=4).num_gpus == 32
