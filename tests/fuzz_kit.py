"""What the input fuzzing shares (tests/test_fuzz_inputs.py and bench/fuzz.py): every parser of a file a user
hands over, a valid seed file for each, and the mutations that turn seeds into hostile inputs.

A parser is called on a path, in-process; the only exception it may raise is InputError, with one line of at
most MAX_MESSAGE_CHARS characters. Seeds are real files in miniature: a shipped clusters.yaml entry, a plan the
planner writes, the sample ingest files the ingest tests use.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from paraplan.errors import InputError
from paraplan.files import MAX_MESSAGE_CHARS


@dataclass(frozen=True)
class Parser:
    """One user-file parser: where its file lies in the work folder, how to call it, its seed and format."""

    name: str
    file_name: str
    """Path of the input inside the work folder (some parsers read the folder or the file name)."""
    call: Callable[[Path], object]
    fmt: str
    """json, yaml, csv, text or sqlite: which structure-aware mutations apply."""
    seed: Callable[[], bytes]


def message_problem(exc: InputError) -> str | None:
    """What is wrong with an InputError's message (several lines, too long, empty), or None."""
    text = str(exc)
    if not text.strip():
        return "empty message"
    if "\n" in text or "\r" in text:
        return "message of several lines"
    if len(text) > MAX_MESSAGE_CHARS:
        return f"message of {len(text)} characters"
    return None


# -- seeds ------------------------------------------------------------------------------------------------------
@cache
def _catalog_yaml(name: str) -> dict[str, Any]:
    return yaml.safe_load(resources.files("paraplan.hardware_profiles").joinpath(name).read_text())


@cache
def _hardware_seed() -> bytes:
    gpu = dict(_catalog_yaml("gpus.yaml")["gpus"]["h100-sxm"], efficiency_from="h100-sxm")
    cluster = dict(_catalog_yaml("clusters.yaml")["clusters"]["dgx-h100"], gpu="h100-site")
    return yaml.safe_dump({"schema_version": 1, "gpus": {"h100-site": gpu}, "clusters": {"site-h100": cluster}},
                          sort_keys=False).encode()


@cache
def _cluster_seed() -> bytes:
    entry = dict(_catalog_yaml("clusters.yaml")["clusters"]["dgx-h100"], num_nodes=4)
    return yaml.safe_dump(entry, sort_keys=False).encode()


TOPOLOGY = b"""inter_node_latency_us: 5.0
intra_domain_latency_us: 2.0
leaves:
  - {oversubscription: 1.0}
  - {oversubscription: 4.0}
node_groups:
  - {gpu: h100-sxm, num_nodes: 2, gpus_per_node: 8, nic_gb_per_s_per_gpu: 50, leaf: 0, hosts: [a, b]}
  - {gpu: a100-sxm-80gb, num_nodes: 2, gpus_per_node: 8, nic_gb_per_s_per_gpu: 25, leaf: 1}
"""
MATRIX = b"src,dst,bus_gb_per_s\na,b,40.5\nb,a,41\nc,a,12\n"
ROUTING = b"layer,expert,next_expert,tokens\n0,0,,1834\n0,1,,912\n1,0,,700\n1,1,,2046\n0,0,1,301\n0,1,0,88\n"
RANKS = "\n".join(f"#  Rank  {r} Group  0 Pid  6110{r} on gpu-node-1 device  {r} [0x18] NVIDIA H200" for r in range(8))
NCCL_TEXT = f"""# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20
# Using devices
{RANKS}
NCCL version 2.19.3+cuda12.2
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum      -1    21.05    0.05    0.09      0    20.91    0.05    0.09      0
  8589934592    2147483648     float     sum      -1    31533  272.41  476.72      0    31441  273.20  478.11      0
# Avg bus bandwidth    : 477.416
# Collective test concluded: all_reduce_perf
""".encode()
NCCL_JSON = json.dumps({"version": "2.13.9", "nccl_version": "2.21.5", "config": {
    "ngpus": 2, "devices": [{"host": "n1", "name": "NVIDIA H100 80GB HBM3"}, {"host": "n1", "name": "NVIDIA H100"}]},
    "results": [{"size": 8, "out_of_place": {"time": 10.5}}, {"size": 1048576, "out_of_place": {"time": 40.1}}],
    "args": "all_reduce_perf -b 8 -e 1M"}).encode()
MEGATRON = b"""------------------------ arguments ------------------------
  tensor_model_parallel_size ...................... 2
  global_batch_size ............................... 128
-------------------- end of arguments ---------------------
 [2024-04-06 02:59:36] iteration       43/     100 | consumed samples:         5504 | elapsed time per iteration (ms): \
5444.9 | throughput per GPU (TFLOP/s/GPU): 239.8 | learning rate: 8.600000E-06 | global batch size:   128 | lm loss: \
1.825991E+00 | loss scale: 1.0 | grad norm: 1.426 | number of skipped iterations:   0 |
[Rank 0] (after 10 iterations) memory (MB) | allocated: 24761.02978515625 | max allocated: 65203.93359375 | \
reserved: 64438.0 | max reserved: 74306.0
"""
TRACE = json.dumps({"schemaVersion": 1, "deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}], "traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 1.0, "dur": 135.2,
     "args": {"External id": 2, "Input Dims": [[64, 256], [256, 256], [256]]}},
    {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": 2.0, "dur": 12.5, "args": {"External id": 2}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::scaled_dot_product_attention", "ts": 3.0, "dur": 50.0,
     "args": {"External id": 3, "Input Dims": [[2, 16, 1024, 64], [2, 16, 1024, 64], [2, 16, 1024, 64]]}},
    {"ph": "X", "cat": "kernel", "name": "flash_fwd", "ts": 4.0, "dur": 20.0, "args": {"External id": 3}},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ts": 5.0, "dur": 30.0,
     "args": {"External id": 4, "In msg nelems": 1048576, "dtype": "BFloat16", "Group size": 8}}]}).encode()
PARAPLAN_JSON = json.dumps({"format": "paraplan-profile", "version": 1, "hardware": "h100-sxm", "software": "torch",
                            "measurements": [{"kind": "gemm", "name": "matmul", "model": "", "time_s": 1.2e-4,
                                              "params": {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16"}}]}).encode()
PARAPLAN_CSV = b"# hardware=h100-sxm\n# software=torch 2.5\nkind,name,model,time_s,m,n,k,dtype\n" \
               b"gemm,mm,,1e-3,8,16,32,bf16\ngemm,mm,,2e-3,16,16,32,bf16\n"
_VIDUR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "input_layernorm", "add")
VIDUR_COMPUTE = (",".join(("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
                           "num_tensor_parallel_workers", *(f"time_stats.{op}.median" for op in _VIDUR_OPS)))
                 + "\n32,8,4096,14336,True,128,1,0.05,0.02,0.09,0.05,0.004,0.003\n"
                 + "32,8,4096,14336,True,256,2,0.06,0.03,0.1,0.06,0.005,0.004\n").encode()
VIDUR_NETWORK = b"num_workers,size,collective,devices_per_node,time_stats.all_reduce.median\n" \
                b"2,1024,all_reduce,8,0.037\n16,1048576,all_reduce,8,0.043\n"
RUNS = b"id,model,gpu,num_gpus,seq_len,global_batch,precision,engine,tp,pp,mbs,recompute,measured_step_time_s\n" \
       b"r1,llama-3.1-8b,h100-sxm,8,4096,64,bf16,megatron,1,1,1,selective,5.2\n" \
       b"r2,llama-3.1-70b,h100-sxm,64,4096,128,bf16,megatron,8,2,,,11.0\n"
STACK_PROFILE = json.dumps({"schema_version": 1, "kind": "paraplan stack profile", "name": "site",
                            "step_time_factor": 1.2,
                            "runs": [{"id": "r1", "model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "megatron",
                                      "num_gpus": 8, "measured_tokens_per_s_per_gpu": 9000.0,
                                      "predicted_tokens_per_s_per_gpu": 10800.0}],
                            "analytical_error": None, "leave_one_run_out_error": None}).encode()
MEMORY_RUNS = b"id,source,layers,hidden,heads,kv_heads,ffn,seq_len,num_gpus,tp,pp,dp,cp,gbs,measured_memory_gib," \
              b"memory_metric\ntt24-01,torchtitan,32,4096,32,8,14336,8192,8,1,1,8,1,64,71.2,max_reserved\n" \
              b"tt24-02,torchtitan,32,4096,32,8,14336,8192,8,1,1,8,1,64,60.5,max_reserved (compiled)\n"
ARRIVAL_CSV = b"timestamp,input_len,output_len\n0.0,512,128\n0.4,1024,64\n1.5,300,200\n1.6,800,90\n"
ARRIVAL_JSONL = b"".join(json.dumps({"timestamp": t, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]})
                         .encode() + b"\n" for t in (0, 10535, 27482, 27490))


@cache
def _artifact_meta_seed() -> bytes:
    from paraplan.cost_models.learned.artifacts import ArtifactMeta

    meta = ArtifactMeta(target="gemm_bf16", hardware="h100-sxm", dtype="bf16", features=("m", "n", "k"),
                        data_hash="ab" * 32, sklearn_version="1.5.0", num_rows=120,
                        held_out={"median_abs_error_frac": 0.05})
    return json.dumps(asdict(meta), sort_keys=True).encode()


@cache
def _plan_seed() -> bytes:
    import paraplan

    result = paraplan.plan("llama-3.1-8b", gpu="h100-sxm", gpus=16, seq_len=4096, global_batch=64, top=2)
    return json.dumps(paraplan.plan_document(result)).encode()


@cache
def _store_seed() -> bytes:
    from paraplan.measurements.ingest.records import Measurement, ParsedFile
    from paraplan.measurements.store import ingest_parsed

    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder) / "s.sqlite"
        rows = tuple(Measurement(kind="gemm", name="mm", line=i, time_s=1e-4 * i,
                                 params={"m": 64.0 * i, "dtype": "bf16"})
                     for i in range(1, 4))
        ingest_parsed(ParsedFile(path="p.json", sha256="0" * 64, kind="paraplan-json", hardware="h100-sxm",
                                 software="torch", measurements=rows), store)
        return store.read_bytes()


@cache
def _model_config_seed() -> bytes:
    return Path(__file__).parents[1].joinpath("data/models/mixtral-8x7b/config.json").read_bytes()


@cache
def _aiconfigurator_seed() -> bytes:
    """A three-row GEMM table as aiconfigurator's collector writes it (pandas to parquet)."""
    import io

    import pandas as pd

    rows = [{"framework": "VLLM", "version": "0.24.0", "device": "NVIDIA H100 80GB HBM3", "op_name": "gemm",
             "kernel_source": "torch.nn.functional.linear", "gemm_dtype": dtype, "m": m, "n": 4096, "k": 4096,
             "latency": 0.01 * m} for m, dtype in ((1, "bfloat16"), (64, "fp8"), (4096, "bfloat16"))]
    buffer = io.BytesIO()
    pd.DataFrame(rows).to_parquet(buffer, index=False)
    return buffer.getvalue()


def _aiconfigurator_table(path: Path) -> object:
    """The one table of an aiconfigurator database PATH, as the ParsedFile ``ingest`` would store."""
    from paraplan.measurements.ingest import parse_path

    (parsed,) = parse_path(path)
    return parsed


def _ingest(kind: str, hardware: str | None = None) -> Callable[[Path], object]:
    def call(path: Path) -> object:
        from paraplan.measurements.ingest import parse_file

        return parse_file(path, kind=kind, hardware=hardware)
    return call


def _call(module: str, function: str, *args: Any, as_text: bool = False) -> Callable[[Path], object]:
    def call(path: Path) -> object:
        import importlib

        return getattr(importlib.import_module(module), function)(str(path) if as_text else path, *args)
    return call


def _const(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def _cluster_file(path: Path) -> object:
    from paraplan.hardware_profiles.catalog import cluster_from_file

    return cluster_from_file(path)


def _store(path: Path) -> object:
    from paraplan.measurements.store import count_rows, load_measurements, stored_files, summarize

    return count_rows(path), load_measurements(path), summarize(path), stored_files(path)


def _job_file(path: Path) -> object:
    from paraplan.job_files.detect import read_job_file

    return read_job_file(path)


def _job_seed(name: str) -> Callable[[], bytes]:
    return lambda: Path(__file__).parent.joinpath("job_files", name).read_bytes()


def _serving_plan_seed() -> bytes:
    import paraplan

    result = paraplan.serve("llama-3.1-8b", gpu="h100-sxm", gpus=8, isl=512, osl=128, rate=4.0, ttft_ms=800,
                            tpot_ms=30, percentile=90, top=2)
    return json.dumps(result.document).encode()


def _serving_plan_file(path: Path) -> object:
    from paraplan.exporters.serving import read_serving_plan, serving_files

    document, index = read_serving_plan(path)
    return serving_files(document, index, "all")


def _shipped_serving_lines(ids: tuple[str, ...]) -> tuple[str, list[str]]:
    """(header, lines) of the shipped serving rows with these ids."""
    import gzip
    from importlib import resources

    folder = resources.files("paraplan.data") / "serving"
    runs = gzip.decompress((folder / "serving_runs.csv.gz").read_bytes()).decode().splitlines()
    deployments = (folder / "inferencex_deployments.csv").read_text().splitlines()
    return runs[0], [line for line in runs[1:] + deployments[1:] if line.split(",", 1)[0] in ids]


SERVING_IDS = ("2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_disagg_1024x1024_c8_tp8_0_ep8_0_392",
               "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_disagg_1024x1024_c8_tp8_0_ep8_0_742")


def _deployments_seed() -> bytes:
    from importlib import resources

    header = (resources.files("paraplan.data") / "serving" / "inferencex_deployments.csv").read_text().splitlines()[0]
    return "\n".join([header, *_shipped_serving_lines(SERVING_IDS)[1][-2:]]).encode() + b"\n"


def _deployments_file(path: Path) -> object:
    """The published-deployments file of a data folder, read beside two of the shipped measurement rows."""
    from paraplan.validation.serving_runs import load_measurements

    header, lines = _shipped_serving_lines(SERVING_IDS)
    path.parent.joinpath("serving_runs.csv").write_text("\n".join([header, *lines[:2]]) + "\n")
    return load_measurements(path.parent)


TWIN_IDS = ("2026_03_25_qwen3_5_397b_b200_sxm_sglang_fp8_agg_1024x1024_c256_tp4_0_ep1_0_467",
            "qwen3_5_397b_gap_analysis_qwen3_5_397b_gap_analysis_b200_sxm_sglang_fp8_agg_1024x1024_c256_tp4_ep1_22")
"""An InferenceX API row and a gap-analysis row repeating its measurement (``serving_runs.inferencex_twins``)."""


def _measurements_seed() -> bytes:
    header, lines = _shipped_serving_lines(TWIN_IDS)
    return "\n".join([header, *lines[:2]]).encode() + b"\n"


def _measurements_file(path: Path) -> object:
    """A data folder's serving measurements, read as ``validate --serving DIR`` reads them (twins included)."""
    from paraplan.validation.serving_runs import load_measurements

    return load_measurements(path.parent)


def _option_file(path: Path) -> object:
    from paraplan.job_files.config_file import read_option_file

    return read_option_file(path, {"gpu", "gpus", "seq_len", "global_batch", "tp", "pp", "from_file"},
                            {"from": "from_file"})


PARSERS: dict[str, Parser] = {p.name: p for p in [
    Parser("hardware-yaml", "site.yaml", _call("paraplan.hardware_profiles.user_file", "load_user_catalog"), "yaml",
           _hardware_seed),
    Parser("cluster-yaml", "cluster.yaml", _cluster_file, "yaml", _cluster_seed),
    Parser("topology-yaml", "topo.yaml", _call("paraplan.hardware_profiles.topology_file", "load_topology",
                                               as_text=True), "yaml", _const(TOPOLOGY)),
    Parser("bandwidth-csv", "matrix.csv", _call("paraplan.hardware_profiles.topology_file", "read_bandwidth_csv",
                                                ["a", "b", "c"]), "csv", _const(MATRIX)),
    Parser("plan-json", "plan.json", _call("paraplan.exporters.plan_input", "read_plan_file"), "json", _plan_seed),
    Parser("serving-plan-json", "serve.json", _serving_plan_file, "json", _serving_plan_seed),
    Parser("routing-csv", "routing.csv", _call("paraplan.measurements.routing", "read_routing_csv"), "csv",
           _const(ROUTING)),
    Parser("ingest-nccl-text", "all_reduce_perf.txt", _ingest("nccl-tests"), "text", _const(NCCL_TEXT)),
    Parser("ingest-nccl-json", "all_reduce_perf.json", _ingest("nccl-tests-json"), "json", _const(NCCL_JSON)),
    Parser("ingest-torch-trace", "trace.json", _ingest("torch-trace"), "json", _const(TRACE)),
    Parser("ingest-megatron-log", "train.log", _ingest("megatron-log", "h100-sxm"), "text", _const(MEGATRON)),
    Parser("ingest-paraplan-json", "profile.json", _ingest("paraplan-json"), "json", _const(PARAPLAN_JSON)),
    Parser("ingest-paraplan-csv", "profile.csv", _ingest("paraplan-csv"), "csv", _const(PARAPLAN_CSV)),
    Parser("ingest-vidur-compute", "compute/h100/meta-llama/Llama-3-8B/mlp.csv", _ingest("vidur"), "csv",
           _const(VIDUR_COMPUTE)),
    Parser("ingest-vidur-network", "network/h100_dgx/all_reduce.csv", _ingest("vidur"), "csv", _const(VIDUR_NETWORK)),
    Parser("ingest-routing", "routing-stats.csv", _ingest("routing"), "csv", _const(ROUTING)),
    Parser("ingest-auto", "measured.txt", _ingest("auto", "h100-sxm"), "text", _const(MEGATRON)),
    Parser("runs-csv", "runs.csv", _call("paraplan.validation.stack_profile", "read_runs"), "csv", _const(RUNS)),
    Parser("stack-profile", "profile-site.json", _call("paraplan.validation.stack_profile", "load_profile",
                                                       as_text=True), "json", _const(STACK_PROFILE)),
    Parser("serving-deployments-csv", "serving/inferencex_deployments.csv", _deployments_file, "csv",
           _deployments_seed),
    Parser("serving-measurements-csv", "serving/serving_runs.csv", _measurements_file, "csv", _measurements_seed),
    Parser("memory-runs-csv", "memory_runs.csv", _call("paraplan.validation.memory_runs", "load_memory_runs"),
           "csv", _const(MEMORY_RUNS)),
    Parser("profile-store", "profiles.sqlite", _store, "sqlite", _store_seed),
    Parser("learned-meta", "gemm_bf16.json", _call("paraplan.cost_models.learned.artifacts", "load_meta"), "json",
           _artifact_meta_seed),
    Parser("model-config-json", "model/config.json", _call("paraplan.model_specs.hf_config", "load_model",
                                                           as_text=True), "json", _model_config_seed),
    # plan/evaluate --from FILE: each job-file format the detector tells apart, seeded with the test fixtures
    Parser("job-megatron-script", "train.sh", _job_file, "text", _job_seed("megatron_llama3_8b_fp8.sh")),
    Parser("job-megatron-log", "train.log", _job_file, "text", _job_seed("megatron_gpt_1b_tp4.log")),
    Parser("job-bridge-yaml", "config.yaml", _job_file, "yaml", _job_seed("bridge_llama3_8b_fp8_mx.yaml")),
    Parser("job-nemo-yaml", "nemo.yaml", _job_file, "yaml", _job_seed("nemo_llama2_13b.yaml")),
    Parser("job-torchtitan-toml", "job.toml", _job_file, "text", _job_seed("torchtitan_llama3_8b.toml")),
    Parser("job-ds-config", "ds_config.json", _job_file, "json", _job_seed("ds_config_zero2.json")),
    Parser("job-options-yaml", "job.yaml", _option_file, "yaml",
           _const(b"gpu: h100-sxm\ngpus: 16\nseq-len: 8192\nglobal_batch: 64\ntp: 2\nfrom: train.sh\n")),
    # serve --arrival trace:PATH: a CSV and a Mooncake-style JSONL request trace
    Parser("arrival-trace-csv", "trace.csv", _call("paraplan.planner.serving.arrival_trace", "read_trace"), "csv",
           _const(ARRIVAL_CSV)),
    Parser("arrival-trace-jsonl", "trace.jsonl", _call("paraplan.planner.serving.arrival_trace", "read_trace"), "text",
           _const(ARRIVAL_JSONL)),
]}
if importlib.util.find_spec("pyarrow") is not None:  # the optional extra that reads parquet: fuzzed where installed
    PARSERS["ingest-aiconfigurator"] = Parser(
        "ingest-aiconfigurator", "systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet", _aiconfigurator_table,
        "text", _aiconfigurator_seed)  # binary: blind byte mutations, random bytes and hostile texts
NOT_OURS = ("model-config-json",)
"""Parsers another part of the project owns: the bench reports them, the test suite leaves them to their tests."""


# -- mutations --------------------------------------------------------------------------------------------------
HOSTILE_TEXTS = (
    "[" * 100_000, "{\"a\":" * 50_000, "a:\n" + "  - " * 1 + "[" * 50_000,
    # billion laughs: nine levels of ten aliases each, 10^9 values when expanded
    "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)) + "z: *a8\n",
    "a: &x [1, *x]\n", "a: &x {b: *x}\n", "- &x [*x]\n",
    "1" * 5000, "-" + "9" * 400, "1e99999", "NaN", "[Infinity]", "\ufeff{}", "\x00" * 64,
)
NESTED_20: list = []
for _ in range(20):
    NESTED_20 = [NESTED_20]
EDGE_VALUES: tuple[Any, ...] = (
    0, -1, 1, 2**31, 2**63, 10**18, 10**400, -(10**30), 1e308, -1e-320, 0.5, 1e-9, "", " ", "x" * 5000, "NaN", "inf",
    None, True, False, [], {}, [1, 2, 3], {"a": {"b": {"c": [1]}}}, NESTED_20,
    "h100-sxm", "ñ\u202e\U0001f600", "1,2\n3", '"', "\\", "-", "0x10", "1e5", "2024-13-45",
)


def _leaf_paths(value: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(value, dict):
        for key, item in list(value.items())[:50]:
            out += _leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:20]):
            out += _leaf_paths(item, (*path, index))
    return out


def _set(document: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return document


MAX_REPEAT_BYTES = 1_000_000
"""Most bytes one 'item repeated' mutation adds to a document."""


def mutate_structure(document: Any, rng: random.Random) -> Any:
    """One structure-aware change to a parsed JSON/YAML document: a value replaced by an edge value, a key
    dropped or added, an item repeated, a branch nested deeper."""
    document = json.loads(json.dumps(document, default=str))
    path = rng.choice(_leaf_paths(document))
    choice = rng.random()
    if choice < 0.55:
        return _set(document, path, rng.choice(EDGE_VALUES))
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if choice < 0.7 and path and isinstance(parent, dict):
        parent.pop(path[-1], None)
    elif choice < 0.8 and path and isinstance(parent, list):
        # At most ~1 MB more per mutation: a repeated item that holds earlier repeats would otherwise grow the
        # input geometrically (5,000^k items; the generator, not the parser, ran out of 24 GB).
        item_bytes = len(json.dumps(parent[path[-1]], default=str)) + 2
        parent.extend([parent[path[-1]]] * min(rng.choice((2, 100, 5000)), max(1, MAX_REPEAT_BYTES // item_bytes)))
    elif choice < 0.9 and isinstance(parent, dict):
        parent[rng.choice(("extra", "name", "num_nodes", "gpu", "plans", "rank"))] = rng.choice(EDGE_VALUES)
    else:
        value = parent[path[-1]] if path else document
        for _ in range(rng.choice((3, 40, 70))):
            value = [value]
        return _set(document, path, value)
    return document


def mutate_csv(text: str, rng: random.Random) -> str:
    """One cell of a CSV replaced by an edge value, a row repeated, a column added, or a quote opened."""
    lines = text.splitlines() or [""]
    index = rng.randrange(len(lines))
    cells = lines[index].split(",")
    choice = rng.random()
    if choice < 0.6:
        cells[rng.randrange(len(cells))] = str(rng.choice(EDGE_VALUES))
        lines[index] = ",".join(cells)
    elif choice < 0.75:
        lines[index + 1:index + 1] = [lines[index]] * rng.choice((2, 100, 20_000))
    elif choice < 0.85:
        lines[index] += "," + str(rng.choice(EDGE_VALUES))
    else:
        lines[index] = lines[index].replace(",", ',"', 1)
    return "\n".join(lines) + "\n"


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Blind edits: cut, insert random bytes, flip bytes, duplicate a slice."""
    data = bytearray(data)
    for _ in range(rng.choice((1, 2, 8))):
        at = rng.randrange(len(data) + 1)
        choice = rng.random()
        if choice < 0.3:
            del data[at:at + rng.randrange(1, 64)]
        elif choice < 0.6:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
        elif choice < 0.8 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        else:
            data[at:at] = bytes(data[at:at + rng.randrange(1, 200)]) * rng.choice((2, 50))
    return bytes(data)


@cache
def _seed_json(name: str) -> str:
    """The seed's document as JSON text (parsed once; each mutation starts from a fresh copy)."""
    parser = PARSERS[name]
    seed = parser.seed()
    if parser.fmt == "json":
        return seed.decode()
    return json.dumps(yaml.load(seed, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)), default=str)


def _parse_seed(parser: Parser, seed: bytes) -> Any:
    return json.loads(_seed_json(parser.name))


def _dump(parser: Parser, document: Any, rng: random.Random) -> bytes:
    if parser.fmt == "json":
        return json.dumps(document, default=str).encode()
    flow = rng.random() < 0.3
    try:
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter: inputs are made 5x faster
        return yaml.dump(document, Dumper=dumper, default_flow_style=flow, sort_keys=False, width=200).encode()
    except (yaml.YAMLError, RecursionError):
        return json.dumps(document, default=str).encode()  # JSON is YAML too


def make_input(parser: Parser, rng: random.Random) -> bytes:
    """One input for ``parser``: random bytes or text, a hostile classic, or a mutation of its seed."""
    seed = parser.seed()
    choice = rng.random()
    if choice < 0.08:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 400)))
    if choice < 0.14:
        return "".join(chr(rng.choice((rng.randrange(32, 127), rng.randrange(0x110000) & 0xD7FF)))
                       for _ in range(rng.randrange(0, 400))).encode("utf-8", "replace")
    if choice < 0.18:
        return rng.choice(HOSTILE_TEXTS).encode()
    if choice < 0.45 or parser.fmt in ("text", "sqlite"):
        return mutate_bytes(seed, rng)
    if parser.fmt == "csv":
        return mutate_csv(seed.decode(), rng).encode()
    document = _parse_seed(parser, seed)
    for _ in range(rng.choice((1, 1, 2, 4))):
        document = mutate_structure(document, rng)
    return _dump(parser, document, rng)


def store_input(data: bytes, path: Path, rng: random.Random) -> None:
    """Write a profile-store input: mostly a valid SQLite store whose rows were changed through SQL (the
    byte-level changes of ``data`` otherwise mostly give 'file is not a database')."""
    path.write_bytes(_store_seed() if rng.random() < 0.6 else data)
    if rng.random() < 0.6:
        try:
            conn = sqlite3.connect(str(path), isolation_level=None)
            statement = rng.choice((
                "UPDATE measurements SET params = ?", "UPDATE measurements SET time_s = ?",
                "UPDATE measurements SET kind = ?", "DROP TABLE measurements",
                "ALTER TABLE measurements DROP COLUMN params", "INSERT INTO files (sha256) VALUES (?)"))
            value = rng.choice((*EDGE_VALUES[:20], json.dumps(rng.choice(EDGE_VALUES)), "{" * 100, "[1]"))
            conn.execute(statement, (value if isinstance(value, (int, float, str)) and not isinstance(value, bool)
                                     and abs(value if isinstance(value, (int, float)) else 0) < 2**63 else str(value),)
                         if "?" in statement else ())
            conn.close()
        except (sqlite3.Error, ValueError):  # a damaged file: SQLite refuses, or its text is not UTF-8
            pass


def write_input(parser: Parser, data: bytes, folder: Path, rng: random.Random) -> Path:
    """Put ``data`` where ``parser`` reads it (under ``folder``) and return the path."""
    path = folder / parser.file_name
    path.parent.mkdir(parents=True, exist_ok=True)
    if parser.fmt == "sqlite":
        store_input(data, path, rng)
    else:
        path.write_bytes(data)
    return path
