"""Work bounded by the size of what a user hands over (issue 20): no input of a few kilobytes may
take super-linear time or unbounded memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_bad_input
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, MAX_TOPOLOGY_NODES
from paraplan.measurements.ingest.megatron_log import fields_of, parse_megatron_log


def test_megatron_fields_split_like_megatron_prints_them():
    line = (" consumed samples: 512 | elapsed time per iteration (ms): 1234.5 | learning rate: 3.0E-04 | "
            "loss scale: 1.0 |")
    assert fields_of(line) == {"consumed samples": "512", "elapsed time per iteration (ms)": "1234.5",
                               "learning rate": "3.0E-04", "loss scale": "1.0"}
    assert fields_of(" no colon here | key: | : value |") == {}


def test_a_line_of_spaces_parses_in_linear_time():
    # 100,000 spaces: the nested lazy pattern this replaced needed ~4.6 s for 400 and grew cubically, so
    # this line would not finish; the split reads it at once.
    spaces = " " * 100_000
    text = f" iteration        1/      10 | elapsed time per iteration (ms): 1000.0 |{spaces}x\n"
    parsed = parse_megatron_log(Path("log.txt"), text)
    assert [m.time_s for m in parsed.measurements] == [1.0]
    assert fields_of(spaces + ":" + spaces) == {}


@pytest.mark.parametrize("count", [1, 1000])
def test_memory_line_with_padding(count):
    text = f"[Rank 0] (after 10 iterations) memory (MB) | allocated: 100.0 |{' ' * count}| max allocated: 200.0\n"
    parsed = parse_megatron_log(Path("log.txt"), text)
    assert parsed.measurements[0].params == {"allocated_bytes": 100 * 2**20, "max_allocated_bytes": 200 * 2**20}


# -- sizes a user controls: refused with one line before any work --------------------------------------
JOB = ["--seq-len", "4096", "--global-batch", "8"]


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("args, needle", [
    (["--gpu", "h100-sxm", "--gpus", str(10**9), *JOB], f"at most {MAX_GPUS}"),
    (["--gpu", "h100-sxm", "--gpus", "8", "--gpus-per-node", "100000", *JOB], "at most 1024"),
    (["--cluster", "dgx-h100", "--nodes", str(10**8), *JOB], f"at most {MAX_GPUS // 8}"),
    (["--gpu", "h100-sxm", "--gpus", "8", "--seq-len", str(10**11), "--global-batch", "8"], f"at most {MAX_SEQ_LEN:,}"),
    (["--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch", str(10**12)],
     f"at most {MAX_GLOBAL_BATCH:,}"),
])
def test_huge_cluster_and_job_sizes_are_refused(args, needle):
    assert_bad_input(_run("plan", "llama-3.1-8b", *args), needle)


def test_huge_layer_count_in_config_json_is_refused(tmp_path):
    config = json.loads(Path(__file__).parent.parent.joinpath("data/models/llama-3.1-8b/config.json").read_text())
    config["num_hidden_layers"] = 10**10
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert_bad_input(_run("models", "show", str(path)), "num_hidden_layers", f"at most {MAX_LAYERS:,}")


def test_huge_ngpus_in_nccl_tests_json_is_refused(tmp_path):
    path = tmp_path / "n.json"
    path.write_text(json.dumps({"config": {"ngpus": 10**8}, "results": []}))  # 61 bytes that asked for 10^8 dicts
    result = _run("ingest", str(path), "--kind", "nccl-tests-json", "--hardware", "h100-sxm",
                  "--store", str(tmp_path / "s.db"))
    assert_bad_input(result, "config.ngpus", f"at most {MAX_GPUS:,}")


def test_topology_file_with_a_billion_nodes_is_refused(tmp_path):
    from paraplan.errors import InputError
    from paraplan.hardware_profiles.topology_file import load_topology

    path = tmp_path / "topo.yaml"
    path.write_text("inter_node_latency_us: 5.0\nintra_domain_latency_us: 2.0\n"
                    "node_groups:\n  - {gpu: h100-sxm, num_nodes: 1000000000, gpus_per_node: 8, "
                    "nic_gb_per_s_per_gpu: 50}\n")
    with pytest.raises(InputError, match=f"num_nodes.*at most {MAX_TOPOLOGY_NODES}"):
        load_topology(str(path))


def test_a_gpu_count_with_many_divisors_builds_only_dividing_shapes():
    # 720,720 GPUs (240 divisors): the full tp x pp x cp product has 240^3 = 13.8 million shapes; only the
    # ordered triples whose product divides the count are built, prod C(e+3, 3) over the prime exponents e of
    # 2^4·3^2·5·7·11·13 = 35·10·4^4 = 89,600; the rest are counted.
    from paraplan.planner.space import _dividing_shape_grid, divisors

    n = 720_720
    values = {"tp": divisors(n), "pp": divisors(n), "cp": divisors(n), "cp_comm": [0], "ep": [1], "etp": [1]}
    grid, total = _dividing_shape_grid(values, n)
    assert len(divisors(n)) == 240 and total == 240**3
    assert len(grid) == 35 * 10 * 4**4
    assert all(n % (tp * pp * cp) == 0 for tp, pp, cp, *_ in grid)


# -- messages name the rule that removed the user's constraint ---------------------------------------
@pytest.mark.parametrize("model, flags, rule", [
    ("mixtral-8x7b", ["--ep", "3"], "ep does not divide the routed experts"),
    ("mixtral-8x7b", ["--vpp", "7"], "cannot split the layers over pp·vpp chunks"),
    ("mixtral-8x7b", ["--mbs", "3"], "global batch not divisible by dp·mbs"),
    ("mixtral-8x7b", ["--offload", "20", "--pp", "2"], "activation offload needs pp = 1"),
    ("llama-3.1-8b", ["--attention", "unfused", "--cp", "2"], "cp > 1 needs a flash-family attention kernel"),
    ("llama-3.1-8b", ["--global-batch", "2", "--tp", "1", "--pp", "1", "--cp", "1"], "global batch not divisible"),
])
def test_no_plan_message_names_the_rule_that_removed_the_constraint(model, flags, rule):
    args = ["plan", model, "--gpu", "h100-sxm", "--gpus", "16", "--seq-len", "4096"]
    if "--global-batch" not in flags:
        args += ["--global-batch", "64"]
    line = assert_bad_input(_run(*args, *flags), rule)
    assert rule in line.split("; most candidates")[0]  # named as the rule the last candidates fell to


def test_a_plan_failing_its_own_schema_is_an_internal_error_not_bad_input(monkeypatch, tmp_path):
    from paraplan.errors import INTERNAL_ERROR_EXIT_CODE
    from paraplan.planner import plan as plan_module

    real = plan_module.plan_schema()
    broken = {**real, "required": [*real["required"], "a_field_no_plan_has"]}
    monkeypatch.setattr(plan_module, "plan_schema", lambda: broken)
    result = _run("plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", *JOB, "--json", str(tmp_path / "p.json"))
    assert result.exit_code == INTERNAL_ERROR_EXIT_CODE == 70
    assert "internal error (a paraplan defect, not your input)" in result.stderr
    assert "please report it" in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "p.json").exists()  # nothing half-written


def test_the_plan_header_says_how_many_gpus_the_nodes_are():
    # gb200-nvl72 nodes are 4-GPU trays: --nodes 8 is 32 GPUs, and the header says so.
    result = _run("plan", "llama-3.1-8b", "--cluster", "gb200-nvl72", "--nodes", "8", *JOB, "--top", "1")
    assert result.exit_code == 0, result.output
    assert "8 nodes x 4 = 32 x gb200" in " ".join(result.stdout.split())


# -- GPU names as nvidia-smi and torch print them ----------------------------------------------------
@pytest.mark.parametrize("device, name", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
    ("NVIDIA H200", "h200-sxm"), ("NVIDIA GB200", "gb200"), ("NVIDIA B200", "b200"), ("NVIDIA H800", "h800-sxm"),
    ("NVIDIA H20", "h20"), ("NVIDIA GH200 96GB HBM3", "gh200-96gb"), ("NVIDIA L40S", "l40s"),
    ("AMD Instinct MI300X", "mi300x"), ("AMD Instinct MI325X", "mi325x"),
])
def test_driver_product_names_resolve_to_catalog_gpus(device, name):
    from paraplan.hardware_profiles import load_gpu

    assert load_gpu(device).name == name


def test_ambiguous_and_absent_products_are_refused_by_name():
    line = assert_bad_input(_run("plan", "llama-3.1-8b", "--gpu", "NVIDIA H100", "--gpus", "8", *JOB),
                            "could be any of h100-sxm, h100-sxm-96gb, h100-pcie, h100-nvl")
    assert "NVIDIA H100" in line
    assert_bad_input(_run("plan", "llama-3.1-8b", "--gpu", "NVIDIA A100 80GB PCIe", "--gpus", "8", *JOB),
                     "a product the catalog does not hold", "--hardware")


@pytest.mark.parametrize("command", ["plan", "evaluate"])
def test_help_lists_every_recompute_kind_and_the_store(command):
    from paraplan.choices import RECOMPUTE_CODES

    text = " ".join(_run(command, "--help").stdout.split())
    for kind in RECOMPUTE_CODES:
        assert kind in text
    assert "--store" in text


def test_a_megatron_log_trimmed_with_grep_is_read_as_a_megatron_log(tmp_path):
    from paraplan.measurements.ingest.detect import detect_kind

    lines = [f" [2024-06-01 12:00:{i:02d}] iteration       {i}/     100 | consumed samples: {512 * i} | "
             f"elapsed time per iteration (ms): 1234.5 | learning rate: 3.0E-04 | global batch size:   512 |"
             for i in range(1, 4)]
    text = "\n".join(lines).lstrip() + "\n"  # `grep iteration log | sed 's/^ *//'`: starts with '['
    assert text.startswith("[")
    assert detect_kind(tmp_path / "trimmed.log", text) == "megatron-log"
    path = tmp_path / "trimmed.log"
    path.write_text(text)
    result = _run("ingest", str(path), "--hardware", "h100-sxm", "--store", str(tmp_path / "s.db"))
    assert result.exit_code == 0, result.output
    assert detect_kind(tmp_path / "p.json", '[{"kind": "gemm"}]') == "paraplan-json"  # JSON stays JSON


def test_tables_keep_the_end_of_long_paths(tmp_path):
    # Two files whose paths differ only at their end, longer than the 80-column console: both ends shown.
    deep = tmp_path / ("a_rather_long_directory_name_" * 4)
    deep.mkdir()
    line = " iteration        1/      10 | elapsed time per iteration (ms): 1000.0 |\n"
    for name in ("run_alpha.log", "run_omega.log"):
        (deep / name).write_text(line.replace("1000.0", "1000.0" if name == "run_alpha.log" else "2000.0"))
    result = _run("ingest", str(deep / "run_alpha.log"), str(deep / "run_omega.log"), "--hardware", "h100-sxm",
                  "--store", str(tmp_path / "s.db"))
    assert result.exit_code == 0, result.output
    joined = "".join(result.stdout.split())
    assert "run_alpha.log" in joined and "run_omega.log" in joined and "…" not in result.stdout


def test_hardware_show_and_ingest_take_driver_product_names(tmp_path):
    shown = _run("hardware", "show", "NVIDIA H100 80GB HBM3")
    assert shown.exit_code == 0 and shown.stdout.startswith("h100-sxm")
    from paraplan.measurements.ingest.hardware_names import check_hardware

    assert check_hardware("NVIDIA H100 80GB HBM3", "file.json") == "h100-sxm"
    with pytest.raises(Exception, match="unknown hardware"):
        check_hardware("NVIDIA H100", "file.json")  # ambiguous: not silently one of four


# -- numbers in a topology file: finite and in a sane range, refused by key ---------------------------------
_TOPOLOGY = """\
inter_node_latency_us: {inter}
intra_domain_latency_us: 2.0
leaves: [{{oversubscription: 1.0}}, {{oversubscription: {over}}}]
node_groups:
  - {{gpu: h100-sxm, num_nodes: 2, gpus_per_node: 8, nic_gb_per_s_per_gpu: {nic}, leaf: 0}}
  - {{gpu: h100-sxm, num_nodes: 2, gpus_per_node: 8, nic_gb_per_s_per_gpu: 50, leaf: 1}}
"""


@pytest.mark.parametrize("values, key", [
    ({"inter": "1.0e+300"}, "inter_node_latency_us"),
    ({"over": "1.0e+300"}, "leaves[1].oversubscription"),
    ({"nic": "1.0e-300"}, "node_groups[0].nic_gb_per_s_per_gpu"),
    ({"nic": ".inf"}, "node_groups[0].nic_gb_per_s_per_gpu"),
])
@pytest.mark.parametrize("command", ["place", "plan"])
def test_topology_numbers_out_of_range_are_refused_in_one_line(tmp_path, values, key, command):
    from export_factory import make_plan_document, write_plan_file

    topology = tmp_path / "topo.yaml"
    topology.write_text(_TOPOLOGY.format(**{"inter": "5.0", "over": "4.0", "nic": "50", **values}))
    if command == "place":
        plan = write_plan_file(tmp_path / "plan.json", make_plan_document(tp=8, dp=2, pp=2, global_batch=64))
        result = _run("place", str(plan), "--cluster", str(topology), "--time-limit", "2")
    else:
        result = _run("plan", "llama-3.1-8b", "--cluster", str(topology), *JOB, "--top", "1")
    line = assert_bad_input(result, key)
    assert len(line) <= 300


def test_a_bandwidth_matrix_of_a_vanishing_link_is_refused_in_one_line(tmp_path):
    from export_factory import make_plan_document, write_plan_file

    topology = tmp_path / "topo.yaml"
    topology.write_text(_TOPOLOGY.format(inter="5.0", over="4.0", nic="50"))
    matrix = tmp_path / "bw.csv"
    matrix.write_text("src,dst,bus_gb_per_s\nnode0,node1,1e-300\n")
    plan = write_plan_file(tmp_path / "plan.json", make_plan_document(tp=8, dp=2, pp=2, global_batch=64))
    result = _run("place", str(plan), "--cluster", str(topology), "--bandwidth-matrix", str(matrix))
    line = assert_bad_input(result, "bw.csv: line 2: bus_gb_per_s")
    assert len(line) <= 300


def test_a_cluster_file_of_a_vanishing_nic_is_refused_by_placement_in_one_line(tmp_path):
    # Cluster files bound their numbers from above only: a 1e-300 GB/s NIC prices every link at infinite time,
    # which rank placement once turned into integers (OverflowError, exit 70).
    from export_factory import make_plan_document, write_plan_file

    cluster = tmp_path / "slow.yaml"
    cluster.write_text("gpu: h100-sxm\ngpus_per_node: 8\nnvlink_domain_gpus: 8\nnic_gb_per_s_per_gpu: 1.0e-300\n"
                       "inter_node_latency_us: 5.0\nintra_domain_latency_us: 2.0\n")
    plan = write_plan_file(tmp_path / "plan.json", make_plan_document(tp=8, dp=2, pp=2, global_batch=64))
    result = _run("place", str(plan), "--cluster", str(cluster), "--nodes", "4", "--time-limit", "2")
    line = assert_bad_input(result, "communication at", "check the bandwidths")
    assert len(line) <= 300
