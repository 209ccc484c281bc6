"""Parsers of nccl-tests, Megatron logs, torch traces, paraplan's own files and routing statistics.

Sample lines are the real ones quoted in the project's ecosystem research (nccl-tests 8xH200 README
row, Megatron-LM issue #756, a torch 2.13 CPU trace); expected values are read off them by eye.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import InputError
from paraplan.measurements.ingest import parse_file
from paraplan.measurements.ingest.detect import detect_kind

RANKS = "\n".join(f"#  Rank  {r} Group  0 Pid  6110{r} on gpu-node-1 device  {r} [0x18] NVIDIA H200"
                  for r in range(8))
NCCL_TEXT = f"""# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 \
agg iters: 1 validation: 1 graph: 0
#
# Using devices
{RANKS}
NCCL version 2.19.3+cuda12.2
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
  8589934592    2147483648     float     sum      -1    31533  272.41  476.72      0    31441  273.20  478.11      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 477.416
"""
MEGATRON = """------------------------ arguments ------------------------
  tensor_model_parallel_size ...................... 2
  global_batch_size ............................... 128
-------------------- end of arguments ---------------------
 [2024-04-06 02:59:36] iteration       43/     100 | consumed samples:         5504 | elapsed time per iteration (ms): \
5444.9 | throughput per GPU (TFLOP/s/GPU): 239.8 | learning rate: 8.600000E-06 | global batch size:   128 | lm loss: \
1.825991E+00 | load_balancing_loss: 1.019746E+00 | loss scale: 1.0 | grad norm: 1.426 | num zeros: 0.0 | number of \
skipped iterations:   0 | number of nan iterations:   0 |
[Rank 0] (after 10 iterations) memory (MB) | allocated: 24761.02978515625 | max allocated: 65203.93359375 | \
reserved: 64438.0 | max reserved: 74306.0
"""
TRACE = {"schemaVersion": 1, "displayTimeUnit": "ms", "traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 17372, "tid": 17372, "ts": 4455317459366.012,
     "dur": 13510.287, "args": {"External id": 2, "Input Dims": [[64, 256], [256, 256], [256]]}},
    {"ph": "X", "cat": "user_annotation", "name": "train_step", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0},
    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "args": {"Total Allocated": 65536}}]}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_nccl_text(tmp_path):
    parsed = parse_file(_write(tmp_path, "all_reduce_perf.txt", NCCL_TEXT))
    assert (parsed.kind, parsed.hardware) == ("nccl-tests", "h200-sxm")
    assert "NCCL version 2.19.3+cuda12.2" in parsed.software
    (row,) = parsed.measurements
    assert (row.name, row.line, row.time_s) == ("all_reduce", 17, pytest.approx(31533e-6))
    assert row.params["size_bytes"] == 8589934592 and row.params["group_size"] == 8
    assert row.params["domain"] == "intra"


def test_nccl_text_two_hosts_and_broken_rows(tmp_path):
    two_hosts = NCCL_TEXT.replace("on gpu-node-1 device  4", "on gpu-node-2 device  4")
    (row,) = parse_file(_write(tmp_path, "all_reduce_perf.log", two_hosts)).measurements
    assert row.params["domain"] == "inter"
    truncated = NCCL_TEXT.replace("31441  273.20  478.11      0", "31441")
    with pytest.raises(InputError, match=r"line 17: has 10 columns, the header names 13"):
        parse_file(_write(tmp_path, "all_reduce_perf.txt", truncated))
    with pytest.raises(InputError, match="cannot tell which collective"):
        parse_file(_write(tmp_path, "bench.txt", NCCL_TEXT))


def test_nccl_json(tmp_path):
    document = {"version": "2.17.1", "nccl_version": "2.27.5", "args": "all_gather_perf -b 8 -e 1G -J out.json",
                "config": {"devices": [{"rank": r, "host": "n1", "name": "NVIDIA H100 80GB HBM3"} for r in range(4)]},
                "results": [{"size": 1048576, "count": 262144, "type": "float", "redop": "none", "root": -1,
                             "out_of_place": {"time": 25.5, "alg_bw": 41.1, "bus_bw": 30.8, "nwrong": 0}}]}
    parsed = parse_file(_write(tmp_path, "out.json", json.dumps(document)))
    assert (parsed.kind, parsed.hardware) == ("nccl-tests-json", "h100-sxm")
    (row,) = parsed.measurements
    assert (row.name, row.time_s, row.params["group_size"]) == ("all_gather", pytest.approx(25.5e-6), 4)
    del document["results"][0]["out_of_place"]
    with pytest.raises(InputError, match="line 1: results entry needs an out_of_place"):
        parse_file(_write(tmp_path, "out2.json", json.dumps(document)))


def test_megatron_log(tmp_path):
    parsed = parse_file(_write(tmp_path, "train.log", MEGATRON), hardware="h100-sxm")
    step, memory = parsed.measurements
    assert (step.kind, step.line, step.time_s) == ("step", 5, pytest.approx(5.4449))
    assert step.params["model_flops_per_s_per_gpu"] == pytest.approx(239.8e12)
    assert step.params["tensor_model_parallel_size"] == 2 and step.params["global_batch"] == 128
    assert memory.params["max_allocated_bytes"] == pytest.approx(65203.93359375 * 2**20)
    with pytest.raises(InputError, match="does not say which GPU.*--hardware"):
        parse_file(_write(tmp_path, "train2.log", MEGATRON))
    broken = MEGATRON.replace("(ms): \\\n5444.9", "(ms): fast")
    broken = MEGATRON.replace("5444.9 |", "n/a |")
    with pytest.raises(InputError, match="line 5: elapsed time per iteration \\(ms\\) must be a number"):
        parse_file(_write(tmp_path, "train3.log", broken), hardware="h100-sxm")


def test_torch_trace_cpu(tmp_path):
    parsed = parse_file(_write(tmp_path, "rank0.pt.trace.json", json.dumps(TRACE)))
    assert (parsed.kind, parsed.hardware) == ("torch-trace", "cpu")
    gemm = next(m for m in parsed.measurements if m.kind == "gemm")
    assert (gemm.name, gemm.time_s) == ("aten::linear", pytest.approx(13510.287e-6))
    assert (gemm.params["m"], gemm.params["n"], gemm.params["k"]) == (64, 256, 256)


def test_torch_trace_gpu_kernels_map_to_ops(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 30,
         "args": {"External id": 7, "Input Dims": [[4096, 8192], [8192, 1024]]}},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 5, "dur": 412.5,
         "args": {"External id": 7, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "ts": 9, "dur": 88.0,
         "args": {"External id": 9, "In msg nelems": 1048576, "dtype": "BFloat16", "Group size": 8}}]
    trace = {"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": events}
    parsed = parse_file(_write(tmp_path, "gpu.json", json.dumps(trace)))
    gemm, gather = parsed.measurements
    assert parsed.hardware == "h100-sxm"
    assert (gemm.kind, gemm.params["m"], gemm.params["n"], gemm.params["k"]) == ("gemm", 4096, 1024, 8192)
    assert gemm.time_s == pytest.approx(412.5e-6)
    assert (gather.name, gather.params["size_bytes"], gather.params["group_size"]) == ("all_gather", 2**21, 8)


def test_paraplan_csv_and_json(tmp_path):
    csv_text = "# hardware=a100-sxm-80gb\n# software=torch 2.13.0\nkind,name,model,time_s,m,n,k,dtype\n" \
               "gemm,matmul,,0.00125,4096,4096,4096,bf16\n"
    parsed = parse_file(_write(tmp_path, "p.csv", csv_text))
    (row,) = parsed.measurements
    assert (parsed.kind, parsed.hardware, parsed.software, row.line) == ("paraplan-csv", "a100-sxm-80gb",
                                                                        "torch 2.13.0", 4)
    assert row.params == {"m": 4096.0, "n": 4096.0, "k": 4096.0, "dtype": "bf16"}
    with pytest.raises(InputError, match="line 4: time_s must be a finite"):
        parse_file(_write(tmp_path, "q.csv", csv_text.replace("0.00125", "-1")))
    document = {"format": "paraplan-profile", "version": 1, "hardware": "cpu", "software": "torch",
                "measurements": [{"kind": "memory", "name": "copy", "time_s": 0.5, "params": {"bytes": 1e9}}]}
    assert parse_file(_write(tmp_path, "p.json", json.dumps(document))).measurements[0].params == {"bytes": 1e9}


def test_routing(tmp_path):
    text = "layer,expert,next_expert,tokens\n0,0,,1834\n0,1,,912\n1,0,,1500\n1,1,,1246\n0,0,1,301\n"
    parsed = parse_file(_write(tmp_path, "routing.csv", text))
    assert (parsed.kind, parsed.hardware) == ("routing", "any")
    loads = {(m.params["layer"], m.params["expert"]): m.params["tokens"] for m in parsed.measurements
             if m.name == "load"}
    assert loads == {(0, 0): 1834, (0, 1): 912, (1, 0): 1500, (1, 1): 1246}
    (pair,) = [m for m in parsed.measurements if m.name == "coactivation"]
    assert (pair.params["expert"], pair.params["next_expert"], pair.params["tokens"]) == (0, 1, 301)
    with pytest.raises(InputError, match="line 3 has 3 fields"):
        parse_file(_write(tmp_path, "r2.csv", text.replace("0,1,,912", "0,1,912")))


def test_detect_and_unknown(tmp_path):
    assert detect_kind(Path("x"), NCCL_TEXT) == "nccl-tests"
    assert detect_kind(Path("x"), MEGATRON) == "megatron-log"
    assert detect_kind(Path("x"), json.dumps(TRACE)) == "torch-trace"
    with pytest.raises(InputError, match="cannot tell the format; pass --kind"):
        parse_file(_write(tmp_path, "notes.txt", "hello\n"))
    garbage = tmp_path / "g.bin"
    garbage.write_bytes(bytes(range(256)))
    with pytest.raises(InputError, match="line 2 is not UTF-8"):
        parse_file(garbage)


SAMPLES = {"nccl-tests": NCCL_TEXT, "megatron-log": MEGATRON, "torch-trace": json.dumps(TRACE),
           "nccl-tests-json": '{"results": [{"size": 8, "out_of_place": {"time": 1}}], "config": {"ngpus": 2}}',
           "paraplan-csv": "kind,name,model,time_s,m\ngemm,mm,,1e-3,8\n",
           "paraplan-json": '{"format": "paraplan-profile", "version": 1, "measurements": []}',
           "routing": "layer,expert,next_expert,tokens\n0,0,,5\n"}


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_fuzz_mutated_samples_raise_only_input_error(kind, tmp_path):
    sample = SAMPLES[kind]

    @settings(max_examples=60, deadline=None)
    @given(cut=st.integers(0, len(sample)), insert=st.text(max_size=12), drop=st.integers(0, 30))
    def mutate(cut, insert, drop):
        path = tmp_path / "all_reduce_perf.txt"
        path.write_text(sample[:cut] + insert + sample[cut + drop:])
        try:
            parse_file(path, kind=kind, hardware="h100-sxm")
        except InputError:
            pass

    mutate()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "cat", "ph", "dur", "args", "External id", "Input Dims", "size", "time",
                         "out_of_place", "devices", "ngpus", "In msg nelems", "Group size", "dtype", "kind",
                         "time_s", "params", "deviceProperties", "host"]), inner, max_size=6),
    max_leaves=25)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(JSON_VALUES, max_size=5), devices=JSON_VALUES, results=JSON_VALUES, config=JSON_VALUES)
def test_fuzz_json_structures_raise_only_input_error(tmp_path_factory, events, devices, results, config):
    folder = tmp_path_factory.mktemp("fuzz")
    documents = {
        "torch-trace": {"traceEvents": [{"ph": "X", "cat": "kernel", **e} if isinstance(e, dict) else e
                                        for e in events], "deviceProperties": devices},
        "nccl-tests-json": {"results": results, "config": config, "args": "all_reduce_perf"},
        "paraplan-json": {"format": "paraplan-profile", "version": 1, "measurements": events, "hardware": "cpu"},
    }
    for kind, document in documents.items():
        path = folder / f"{kind}.json"
        path.write_text(json.dumps(document))
        try:
            parse_file(path, kind=kind, hardware="h100-sxm")
        except InputError:
            pass
