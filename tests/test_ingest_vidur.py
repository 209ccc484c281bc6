"""vidur-profiles parser: values read by eye from the real files, broken files, and fuzzing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles_factory import A100_ALL_REDUCE, H100_ALL_REDUCE, LLAMA70_H100, PHI2_H100, need_vidur

from paraplan.errors import InputError
from paraplan.measurements.ingest import parse_file
from paraplan.measurements.ingest.vidur import parse_vidur


def _first(parsed, name):
    return next(m for m in parsed.measurements if m.name == name)


def test_phi2_first_row_gemms():
    need_vidur()
    parsed = parse_file(PHI2_H100)
    assert parsed.kind == "vidur" and parsed.hardware == "h100-sxm"
    assert parsed.measurements[0].model == "microsoft/phi-2"
    qkv = _first(parsed, "attn_pre_proj")  # line 2: 32 heads of 80, 32 KV heads, 4096 tokens, tp 1
    assert qkv.line == 2 and qkv.params == {"m": 4096.0, "n": 7680.0, "k": 2560.0, "dtype": "fp16"}
    assert qkv.time_s == pytest.approx(0.209e-3)
    up = _first(parsed, "mlp_up_proj")  # not gated: N = ffn
    assert (up.params["n"], up.params["k"], up.time_s) == (10240.0, 2560.0, pytest.approx(0.295e-3))
    down = _first(parsed, "mlp_down_proj")
    assert (down.params["n"], down.params["k"], down.time_s) == (2560.0, 10240.0, pytest.approx(0.3345e-3))


def test_llama70b_gated_gqa_shapes():
    need_vidur()
    parsed = parse_file(LLAMA70_H100)
    qkv = _first(parsed, "attn_pre_proj")  # (64 + 2·8) heads of 128
    assert (qkv.params["n"], qkv.params["k"], qkv.time_s) == (10240.0, 8192.0, pytest.approx(0.9825e-3))
    up = _first(parsed, "mlp_up_proj")  # gated: 2 · 28672
    assert (up.params["n"], up.time_s) == (57344.0, pytest.approx(5.6685e-3))
    down = _first(parsed, "mlp_down_proj")
    assert (down.params["k"], down.time_s) == (28672.0, pytest.approx(2.647e-3))


def test_network_rows():
    need_vidur()
    h100 = parse_file(H100_ALL_REDUCE)
    first = h100.measurements[0]
    assert (first.kind, first.name, first.line) == ("collective", "all_reduce", 2)
    assert first.params["size_bytes"] == 2048 and first.params["group_size"] == 8
    assert first.params["domain"] == "intra" and first.time_s == pytest.approx(0.037e-3)
    a100 = parse_file(A100_ALL_REDUCE)
    assert a100.hardware == "a100-sxm-80gb"
    two_nodes = a100.measurements[0]  # 2 workers, 1 per node: crosses the network
    assert two_nodes.params["domain"] == "inter" and two_nodes.time_s == pytest.approx(0.043e-3)


def _copy(tmp_path: Path, source: Path, text: str) -> Path:
    target = tmp_path / "compute" / "h100" / "org" / "model" / source.name
    target.parent.mkdir(parents=True)
    target.write_text(text)
    return target


def test_truncated_row_names_its_line(tmp_path):
    need_vidur()
    lines = PHI2_H100.read_text().splitlines()
    broken = _copy(tmp_path, PHI2_H100, "\n".join(lines[:5] + [lines[5][:40]]))
    with pytest.raises(InputError, match=r"line 6: has \d+ fields, the header has 53"):
        parse_file(broken)


def test_wrong_columns_and_bad_values(tmp_path):
    need_vidur()
    lines = PHI2_H100.read_text().splitlines()
    renamed = _copy(tmp_path, PHI2_H100, "\n".join([lines[0].replace("num_tokens", "tokens"), *lines[1:4]]))
    with pytest.raises(InputError, match="line 1: the header lacks column.*num_tokens"):
        parse_file(renamed, kind="vidur")
    negative = lines[2].replace("False,4096,1", "False,-4096,1")
    assert negative != lines[2]
    with pytest.raises(InputError, match="line 3: num_tokens must be a positive"):
        parse_vidur(Path("x/mlp.csv"), "\n".join([lines[0], lines[1], negative]))


def test_binary_garbage(tmp_path):
    garbage = tmp_path / "mlp.csv"
    garbage.write_bytes(b"time_stats.emb.min\n\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(InputError, match="line 2 is not UTF-8"):
        parse_file(garbage)


def test_unknown_hardware_and_kind(tmp_path):
    need_vidur()
    with pytest.raises(InputError, match="unknown hardware 'h900'"):
        parse_file(PHI2_H100, hardware="h900")
    with pytest.raises(InputError, match="unknown --kind 'vidurr'"):
        parse_file(PHI2_H100, kind="vidurr")
    plain = _copy(tmp_path, PHI2_H100, PHI2_H100.read_text())
    moved = plain.rename(tmp_path / "mlp.csv")
    with pytest.raises(InputError, match="does not say which GPU.*--hardware"):
        parse_file(moved)


_HEADER = None


def _header() -> str:
    global _HEADER
    if _HEADER is None:
        _HEADER = PHI2_H100.read_text().split("\n", 1)[0] if PHI2_H100.is_file() else "time_stats.x.median,num_tokens"
    return _HEADER


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.text(alphabet=st.sampled_from(list("0123456789.,-eE\nTrueFalsnan x")), max_size=400))
def test_fuzz_vidur_rows_raise_only_input_error(body):
    try:
        parse_vidur(Path("compute/h100/o/m/mlp.csv"), _header() + "\n" + body)
    except InputError:
        pass


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=300))
def test_fuzz_any_text_raises_only_input_error(text):
    try:
        parse_vidur(Path("network/h100_dgx/all_reduce.csv"), text)
    except InputError:
        pass
