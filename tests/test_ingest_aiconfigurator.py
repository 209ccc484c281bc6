"""``paraplan ingest`` of NVIDIA aiconfigurator's per-op database (measurements/ingest/aiconfigurator.py).

Small parquet tables are written here in aiconfigurator's layout (``systems/data/<system>/<op>/<engine>/<version>/``)
with hand-derived expected records: milliseconds to seconds, NCCL elements to bytes, a decode step's keys
(``isl + step``), dtype and GPU names. The tests against the real 0.12.0 wheel run when
PARAPLAN_AICONFIGURATOR_WHEEL names it, and fail instead of skipping under PARAPLAN_REQUIRE_AICONFIGURATOR=1 (CI).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sqlite3
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import aiconfigurator_wheel, assert_bad_input
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.errors import InputError
from paraplan.measurements.ingest import aiconfigurator as aic
from paraplan.measurements.ingest import open_path, parse_file, parse_path
from paraplan.measurements.store import count_rows, ingest_all, ingest_parsed, load_measurements

runner = CliRunner(env={"COLUMNS": "250"})
REQUIRED = os.environ.get("PARAPLAN_REQUIRE_AICONFIGURATOR") == "1"
HAVE_PYARROW = importlib.util.find_spec("pyarrow") is not None
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture()
def pyarrow():
    """pyarrow (to write the tables here); skip without it, fail instead under PARAPLAN_REQUIRE_AICONFIGURATOR=1."""
    if not HAVE_PYARROW:
        if REQUIRED:
            pytest.fail("PARAPLAN_REQUIRE_AICONFIGURATOR=1 but pyarrow is not installed (pip install "
                        "'paraplan[aiconfigurator]')")
        pytest.skip("pyarrow is not installed: aiconfigurator's parquet tables need it (pip install "
                    "'paraplan[aiconfigurator]')")
    import pyarrow as pa

    return pa


def table(root: Path, where: str, rows: list[dict]) -> Path:
    """``rows`` written as ``root/systems/data/<where>.parquet`` (pandas, as aiconfigurator writes them)."""
    import pandas as pd

    path = root / "systems" / "data" / f"{where}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def gemm_rows(**change) -> list[dict]:
    base = {"framework": "VLLM", "version": "0.24.0", "device": H100, "op_name": "gemm",
            "kernel_source": "torch.nn.functional.linear", "gemm_dtype": "bfloat16", "m": 32768, "n": 65536,
            "k": 12288, "latency": 60.324}
    return [base, {**base, "gemm_dtype": "fp8", "kernel_source": "CutlassFP8ScaledMMLinearKernel", "m": 1,
                   "latency": 0.0125}, {**base, "gemm_dtype": "nvfp4", "m": 8}, {**base, "gemm_dtype": "float16"},
            {**base, "gemm_dtype": "fp8_block"}, {**base, "gemm_dtype": "W4A16_MXFP4", **change}]


def attention_row(**change) -> dict:
    return {"framework": "TRTLLM", "version": "1.3.0rc20", "device": H100, "op_name": "context_attention",
            "kernel_source": "torch_flow", "batch_size": 4, "isl": 4096, "num_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "window_size": 0, "beam_width": 1, "attn_dtype": "bfloat16", "kv_cache_dtype": "fp8",
            "step": 0, "latency": 2.5, **change}


def nccl_row(**change) -> dict:
    return {"framework": "TRTLLM", "version": "2.29.2", "device": H100, "op_name": "all_gather",
            "kernel_source": "NCCL", "nccl_dtype": "half", "num_gpus": 8, "message_size": 1024, "latency": 0.0055,
            **change}


def moe_row(**change) -> dict:
    return {"framework": "VLLM", "version": "0.24.0", "device": H100, "op_name": "moe",
            "kernel_source": "vllm_fp8moe_triton_tritonexperts", "moe_dtype": "fp8_block", "num_tokens": 64,
            "hidden_size": 7168, "inter_size": 2048, "topk": 8, "num_experts": 256, "moe_tp_size": 1,
            "moe_ep_size": 8, "distribution": "power_law_1.01", "latency": 0.25, **change}


def only(path: Path, **kwargs):
    (parsed,) = parse_path(path, **kwargs)
    return parsed


# -- each table kind, hand-derived --------------------------------------------------------------------------------
def test_gemm_rows_ms_to_s_dtypes_and_stack(tmp_path, pyarrow):
    path = table(tmp_path, "h100_sxm/gemm/vllm/0.24.0/gemm_perf", gemm_rows())
    parsed = only(path)
    assert (parsed.kind, parsed.hardware) == ("aiconfigurator", "h100-sxm")
    assert "vllm 0.24.0" in parsed.software and H100 in parsed.software
    first = parsed.measurements[0]
    assert (first.kind, first.name, first.line) == ("gemm", "torch.nn.functional.linear", 1)
    assert first.time_s == pytest.approx(0.060324, rel=1e-12)
    assert first.params == {"m": 32768, "n": 65536, "k": 12288, "dtype": "bf16", "stack": "vllm 0.24.0"}
    assert [m.params["dtype"] for m in parsed.measurements] == ["bf16", "fp8", "fp4", "fp16", "fp8_block",
                                                                "w4a16_mxfp4"]
    assert parsed.measurements[1].name == "CutlassFP8ScaledMMLinearKernel"
    assert parsed.measurements[1].time_s == pytest.approx(12.5e-6)


def test_context_attention_seq_len_and_prefix(tmp_path, pyarrow):
    rows = [attention_row(), attention_row(step=512, window_size=1024, kv_cache_dtype="bfloat16")]
    parsed = only(table(tmp_path, "h100_sxm/attention/trtllm/1.3.0rc20/context_attention_perf", rows))
    assert [m.params for m in parsed.measurements] == [
        {"pass": "forward", "causal": 1, "batch": 4, "seq_len": 4096, "prefix": 0, "heads": 32, "kv_heads": 8,
         "head_dim": 128, "window": 0, "dtype": "bf16", "kv_dtype": "fp8", "stack": "trtllm 1.3.0rc20"},
        {"pass": "forward", "causal": 1, "batch": 4, "seq_len": 4096, "prefix": 512, "heads": 32, "kv_heads": 8,
         "head_dim": 128, "window": 1024, "dtype": "bf16", "kv_dtype": "bf16", "stack": "trtllm 1.3.0rc20"}]
    assert parsed.measurements[0].kind == "attention" and parsed.measurements[0].time_s == pytest.approx(2.5e-3)


def test_generation_attention_kv_len_is_isl_plus_step(tmp_path, pyarrow):
    # aiconfigurator's decode rows: isl = 1 new token after `step` cached ones -> the step attends to isl + step keys.
    rows = [attention_row(op_name="generation_attention", isl=1, step=1023, batch_size=32, latency=0.0113),
            attention_row(op_name="generation_attention", isl=1, step=1, batch_size=32, latency=0.0112)]
    parsed = only(table(tmp_path, "h100_sxm/attention/trtllm/1.3.0rc20/generation_attention_perf", rows))
    first = parsed.measurements[0]
    assert first.params == {"pass": "decode", "kv_len": 1024, "batch": 32, "heads": 32, "kv_heads": 8,
                            "head_dim": 128, "window": 0, "dtype": "bf16", "kv_dtype": "fp8",
                            "stack": "trtllm 1.3.0rc20"}
    assert parsed.measurements[1].params["kv_len"] == 2 and first.time_s == pytest.approx(11.3e-6)


def test_nccl_elements_to_bytes_names_and_domain(tmp_path, pyarrow):
    rows = [nccl_row(), nccl_row(nccl_dtype="int8", op_name="alltoall"), nccl_row(op_name="all_reduce", num_gpus=16)]
    parsed = only(table(tmp_path, "h100_sxm/comm/nccl/2.27.3/nccl_perf", rows))
    assert [(m.name, m.params["size_bytes"], m.params["dtype"], m.params["domain"]) for m in parsed.measurements] == [
        ("all_gather", 2048, "fp16", "intra"), ("all_to_all", 1024, "int8", "intra"),
        ("all_reduce", 2048, "fp16", "inter")]
    # the version column is the NCCL that ran (the folder says 2.27.3, the framework column a fixed TRTLLM label)
    assert parsed.measurements[0].params == {"size_bytes": 2048, "group_size": 8, "domain": "intra", "dtype": "fp16",
                                             "kernel": "NCCL", "stack": "nccl 2.29.2"}
    assert parsed.measurements[0].time_s == pytest.approx(5.5e-6)


def test_nccl_without_version_columns_and_an_nvl72_domain(tmp_path, pyarrow):
    rows = [{k: v for k, v in nccl_row(num_gpus=16).items() if k not in ("framework", "version", "device")}]
    parsed = only(table(tmp_path, "gb200/comm/nccl/2.23/nccl_perf", rows))
    assert parsed.hardware == "gb200" and "device not recorded" in parsed.software
    assert parsed.measurements[0].params["stack"] == "nccl 2.23"
    assert parsed.measurements[0].params["domain"] == "intra"  # 16 GPUs of one 72-GPU NVLink domain


def test_custom_all_reduce(tmp_path, pyarrow):
    row = {"framework": "vLLM", "version": "0.24.0", "device": H100, "op_name": "all_reduce",
           "kernel_source": "vLLM_custom_graph", "allreduce_dtype": "bfloat16", "num_gpus": 4, "message_size": 4096,
           "latency": 0.0043, "backend": "vllm_graph"}
    parsed = only(table(tmp_path, "h100_sxm/comm/vllm/0.24.0/custom_allreduce_perf", [row]))
    (m,) = parsed.measurements
    assert (m.kind, m.name) == ("collective", "custom_all_reduce")
    assert m.params == {"size_bytes": 8192, "group_size": 4, "domain": "intra", "dtype": "bf16",
                        "kernel": "vLLM_custom_graph", "stack": "vllm 0.24.0"}


def test_moe_table(tmp_path, pyarrow):
    parsed = only(table(tmp_path, "b200_sxm/moe/vllm/0.24.0/moe_perf", [moe_row()]))
    (m,) = parsed.measurements
    assert (parsed.hardware, m.kind, m.name) == ("b200", "moe", "vllm_fp8moe_triton_tritonexperts")
    assert m.params == {"num_tokens": 64, "hidden_size": 7168, "inter_size": 2048, "topk": 8, "num_experts": 256,
                        "moe_tp_size": 1, "moe_ep_size": 8, "dtype": "fp8_block", "distribution": "power_law_1.01",
                        "stack": "vllm 0.24.0"}


# -- a database: GPU names, what is left out, filters ---------------------------------------------------------------
def database(tmp_path: Path) -> Path:
    """A systems/data folder: two GPUs the catalog knows, one it does not, and a table paraplan does not read."""
    table(tmp_path, "h100_sxm/gemm/vllm/0.24.0/gemm_perf", gemm_rows())
    table(tmp_path, "a100_sxm/comm/nccl/2.27.3/nccl_perf", [nccl_row()])
    table(tmp_path, "b60/gemm/vllm/0.20.0/gemm_perf", gemm_rows())
    table(tmp_path, "h100_sxm/mla_bmm/trtllm/1.3.0rc20/mla_bmm_perf", [{"latency": 1.0}])
    (tmp_path / "systems/data/h100_sxm/gemm/vllm/0.24.0/collection_meta.yaml").write_text("schema_version: 1\n")
    return tmp_path / "systems" / "data"


def test_gpu_names_and_notes(tmp_path, pyarrow):
    source = open_path(database(tmp_path))
    assert source.kind == "aiconfigurator" and source.num_files == 2
    assert sorted(f.hardware for f in source.files()) == ["a100-sxm-80gb", "h100-sxm"]
    assert any("b60" in note and "no GPU in paraplan's catalog" in note for note in source.notes)
    assert any("h100_sxm/mla_bmm" in note and "mla_bmm_perf" in note for note in source.notes)


def test_hardware_selects_and_op_filters(tmp_path, pyarrow):
    data = database(tmp_path)
    assert [f.hardware for f in open_path(data, hardware="a100-sxm-80gb").files()] == ["a100-sxm-80gb"]
    assert [f.path.endswith("gemm_perf.parquet") for f in open_path(data, ops=("gemm",)).files()] == [True]
    with pytest.raises(InputError, match="no aiconfigurator tables of b200"):
        open_path(data, hardware="b200")
    with pytest.raises(InputError, match="--op expects a comma list of gemm, attention, collective, moe"):
        open_path(data, ops=("mla",))


def test_cli_ingest_notes_spelling_and_idempotence(tmp_path, pyarrow):
    data, store = database(tmp_path), tmp_path / "s.sqlite"
    first = runner.invoke(app, ["ingest", "aiconfigurator", str(data), "--store", str(store)])
    assert first.exit_code == 0, first.output
    assert "h100-sxm" in first.output and "a100-sxm-80gb" in first.output
    assert "mla_bmm_perf" in first.stderr and "b60" in first.stderr
    assert count_rows(store) == len(gemm_rows()) + 1
    again = runner.invoke(app, ["ingest", "--kind", "aiconfigurator", str(data), "--store", str(store)])
    assert again.exit_code == 0 and again.output.count("already stored") == 2
    assert count_rows(store) == len(gemm_rows()) + 1
    rows = load_measurements(store, "h100-sxm", "gemm")
    assert set(rows["stack"]) == {"vllm 0.24.0"} and rows["m"].max() == 32768


def test_column_form_writes_what_the_measurements_say(tmp_path, pyarrow):
    # The store's fast path (no object per row) writes exactly what ingest_parsed writes from the Measurements.
    table(tmp_path, "h100_sxm/attention/trtllm/1.3.0rc20/context_attention_perf", [attention_row(), attention_row()])
    table(tmp_path, "h100_sxm/comm/nccl/2.29.2/nccl_perf", [nccl_row(), nccl_row(op_name="alltoall")])
    table(tmp_path, "h100_sxm/moe/vllm/0.24.0/moe_perf", [moe_row(), moe_row(num_tokens=1)])
    fast, slow = tmp_path / "fast.sqlite", tmp_path / "slow.sqlite"
    ingest_all(open_path(tmp_path / "systems").files(), fast)
    for parsed in parse_path(tmp_path / "systems"):
        ingest_parsed(parsed, slow)
    query = "SELECT file_sha256, line, kind, name, model, hardware, software, time_s, params FROM measurements"
    written = [sqlite3.connect(path).execute(f"{query} ORDER BY 1, 2").fetchall() for path in (fast, slow)]
    assert written[0] == written[1] and len(written[0]) == 6
    assert all(json.loads(row[8]) for row in written[0])


# -- refusals: one line, exit 2, nothing written ------------------------------------------------------------------
def test_malformed_table_is_one_line_and_writes_nothing(tmp_path, pyarrow):
    data = database(tmp_path)
    table(tmp_path, "h100_sxm/moe/vllm/0.24.0/moe_perf", [moe_row(), moe_row(latency=-1.0)])
    store = tmp_path / "s.sqlite"
    result = runner.invoke(app, ["ingest", str(data), "--store", str(store)])
    assert_bad_input(result, "moe_perf.parquet", "row 2", "column 'latency'", "milliseconds above 0")
    assert count_rows(store) == 0  # not even the good tables before it: one transaction per command


@pytest.mark.parametrize(("change", "needles"), [
    ({"m": 2**30}, ["row 6", "column 'm'", "whole number from 1 to 16,777,216"]),
    ({"k": 1.5}, ["row 6", "column 'k'"]),
    ({"latency": float("nan")}, ["row 6", "column 'latency'"]),
    ({"latency": 2e6}, ["row 6", "column 'latency'"]),
    ({"gemm_dtype": "bf\x0016"}, ["row 6", "column 'gemm_dtype'", "printable text"]),
])
def test_bad_values_name_the_row_and_column(tmp_path, pyarrow, change, needles):
    path = table(tmp_path, "h100_sxm/gemm/vllm/0.24.0/gemm_perf", gemm_rows(**change))
    assert_bad_input(runner.invoke(app, ["ingest", str(path), "--store", str(tmp_path / "s.sqlite")]),
                     "gemm_perf.parquet", *needles)


def test_missing_column_and_unknown_collective(tmp_path, pyarrow):
    rows = [{k: v for k, v in gemm_rows()[0].items() if k != "m"}]
    path = table(tmp_path, "h100_sxm/gemm/vllm/0.24.0/gemm_perf", rows)
    with pytest.raises(InputError, match="column 'm' is missing"):
        parse_path(path)
    nccl = table(tmp_path, "h100_sxm/comm/nccl/2.29.2/nccl_perf", [nccl_row(), nccl_row(op_name="gossip")])
    with pytest.raises(InputError, match="row 2: column 'op_name' is a collective paraplan does not know"):
        parse_path(nccl)
    odd = table(tmp_path, "h100_sxm/comm/nccl/2.27.3/nccl_perf", [nccl_row(nccl_dtype="float64")])
    with pytest.raises(InputError, match="dtype of unknown size 'float64'"):
        parse_path(odd)


def test_not_in_the_layout_and_not_a_table(tmp_path):
    loose = tmp_path / "x.parquet"
    loose.write_bytes(b"PAR1 not really")
    assert_bad_input(runner.invoke(app, ["ingest", str(loose), "--store", str(tmp_path / "s.sqlite")]),
                     "no aiconfigurator tables", "systems/data/<system>/<op>/<engine>/<version>/<table>.parquet")
    with pytest.raises(InputError, match="holds many tables; read it with parse_path"):
        parse_file(loose)
    assert_bad_input(runner.invoke(app, ["ingest", str(tmp_path / "nope.whl")]), "cannot read", "nope.whl")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400))
def test_random_bytes_as_a_table_exit_2_in_one_line(tmp_path, data):
    # Detection by name, then refusal by the reader (or, without pyarrow, by the one line that says to install it).
    path = tmp_path / "systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    assert_bad_input(runner.invoke(app, ["ingest", str(path), "--store", str(tmp_path / "s.sqlite")]),
                     "gemm_perf.parquet" if HAVE_PYARROW else "needs pyarrow")


def wheel(tmp_path: Path, members: dict[str, bytes]) -> Path:
    path = tmp_path / "aiconfigurator_core-0.12.0-cp311-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("aiconfigurator_core-0.12.0.dist-info/METADATA",
                         "Name: aiconfigurator-core\nVersion: 0.12.0\n")
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_a_wheel_is_read_without_extracting(tmp_path, pyarrow):
    member = "aiconfigurator_core/systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    made = table(tmp_path / "made", "h100_sxm/gemm/vllm/0.24.0/gemm_perf", gemm_rows())
    path = wheel(tmp_path, {member: made.read_bytes()})
    parsed = only(path)
    assert parsed.path == f"{path}!{member}" and parsed.software.startswith("aiconfigurator-core 0.12.0; ")
    assert len(parsed.measurements) == len(gemm_rows())
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, "made"]  # nothing extracted


def test_a_too_large_member_is_refused_before_it_is_read(tmp_path, pyarrow, monkeypatch):
    member = "aiconfigurator_core/systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    path = wheel(tmp_path, {member: b"\0" * 5000})  # compresses to a few bytes; its header says 5,000
    monkeypatch.setattr(aic, "MAX_TABLE_BYTES", 4096)
    result = runner.invoke(app, ["ingest", str(path), "--store", str(tmp_path / "s.sqlite")])
    assert_bad_input(result, "gemm_perf.parquet", "5,000 bytes is too large", "at most 4,096")
    reader = aic._member_reader(zipfile.ZipFile(path), zipfile.ZipFile(path).getinfo(member), "m")
    with pytest.raises(InputError, match="too large"):
        reader()


def test_a_zip_that_is_no_wheel(tmp_path):
    broken = tmp_path / "a.whl"
    broken.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    assert_bad_input(runner.invoke(app, ["ingest", str(broken)]), "a.whl", "not a readable wheel")
    empty = wheel(tmp_path, {"README": b"hi"})
    assert_bad_input(runner.invoke(app, ["ingest", str(empty)]), "no aiconfigurator tables")


def test_without_pyarrow_one_line(tmp_path, monkeypatch, pyarrow):
    path = table(tmp_path, "h100_sxm/gemm/vllm/0.24.0/gemm_perf", gemm_rows())
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import pyarrow.parquet now raises ImportError
    assert_bad_input(runner.invoke(app, ["ingest", str(path), "--store", str(tmp_path / "s.sqlite")]),
                     "reading aiconfigurator's parquet tables needs pyarrow: pip install 'paraplan[aiconfigurator]'")


def test_op_is_for_databases_only(tmp_path):
    text = tmp_path / "routing.csv"
    text.write_text("layer,expert,next_expert,tokens\n0,0,,5\n")
    assert_bad_input(runner.invoke(app, ["ingest", str(text), "--op", "gemm"]), "--op selects the tables")


# -- the real wheel -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_wheel() -> Path:
    return aiconfigurator_wheel()


def member_rows(wheel_path: Path, member: str) -> int:
    import pyarrow.parquet as pq

    with zipfile.ZipFile(wheel_path) as archive:
        return pq.ParquetFile(io.BytesIO(archive.read(member))).metadata.num_rows


def test_real_wheel_h100_vllm_gemm_table(real_wheel):
    source = open_path(real_wheel, hardware="h100-sxm", ops=("gemm",))
    tables = {t.path.split("systems/data/")[1]: t for t in source.files()}
    assert sorted(tables) == ["h100_sxm/gemm/sglang/0.5.14/gemm_perf.parquet",
                              "h100_sxm/gemm/sglang/0.5.6.post2/gemm_perf.parquet",
                              "h100_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet",
                              "h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"]
    parsed = tables["h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"].parsed_file()
    assert parsed.software == f"aiconfigurator-core 0.12.0; vllm 0.24.0; {H100}"
    first = parsed.measurements[0]
    assert (first.name, first.params) == ("torch.nn.functional.linear", {
        "m": 32768, "n": 65536, "k": 12288, "dtype": "bf16", "stack": "vllm 0.24.0"})
    assert first.time_s == pytest.approx(0.060324, rel=1e-5)  # 60.324042 ms
    member = "aiconfigurator_core/systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    assert len(parsed.measurements) == member_rows(real_wheel, member) == 107188


def test_real_wheel_h100_tables_store_every_row(real_wheel, tmp_path):
    store = tmp_path / "s.sqlite"
    result = runner.invoke(app, ["ingest", str(real_wheel), "--hardware", "h100-sxm", "--op", "gemm,collective",
                                 "--store", str(store)])
    assert result.exit_code == 0, result.output
    files = sqlite3.connect(store).execute("SELECT path, num_rows FROM files").fetchall()
    assert len(files) >= 10
    for path, rows in files:
        assert rows == member_rows(real_wheel, path.split("!", 1)[1]), path
    assert count_rows(store) == sum(rows for _, rows in files)
    # custom all-reduce tables copied under two engine folders have the same bytes: stored once
    assert "already stored" in result.output
