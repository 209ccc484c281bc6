"""Serving launch files for pools on different GPU types: a mixed aggregated fleet behind one router, and
prefill and decode on different GPUs. Exact commands, unique names, node placement by GPU type."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest
import yaml
from serving_factory import DSR1, LLAMA, captured, document, llama_agg, pool, write

from paraplan.errors import InputError
from paraplan.exporters.serving import serving_files
from paraplan.exporters.serving_engines import FLAG_SOURCES

MODEL = LLAMA["hf_repo"]
HOSTS = "a b c"  # nodes 0-1 hold the six 2-GPU h100 workers, node 2 the four 1-GPU h200 workers


def mixed_agg(engine: str, traffic: tuple[float, float] | None = (0.4, 0.6)) -> dict:
    """6 workers of tp 2 on h100-sxm and 4 workers of tp 1 on h200-sxm behind one endpoint."""
    pools = [pool("aggregated", 6, 2, gpu="h100-sxm"), pool("aggregated", 4, 1, gpu="h200-sxm")]
    for entry, frac in zip(pools, traffic or (), strict=False):
        entry["traffic_frac"] = frac
    return document(engine, "agg", pools, LLAMA)


def cross_disagg(engine: str) -> dict:
    """Prefill on one 8-GPU h100-sxm node (tp 8), decode on two 4-GPU gb200 nodes (2 workers of tp 4)."""
    pools = [pool("prefill", 1, 8, ep=8, tokens=16384, gpu="h100-sxm"),
             pool("decode", 2, 4, ep=4, batch=512, gpu="gb200")]
    return document(engine, "disagg", pools, DSR1, kv_transfer={"backend": "nixl", "link": "rdma"},
                    quant=("fp8_block", "fp8_block", "fp8"))


def files(doc: dict, fmt: str) -> dict[str, str]:
    return {f.name: f.text for f in serving_files(doc, 0, fmt)}


def commands(tmp_path, doc: dict, engine: str, node: int, hosts: str = HOSTS) -> list[str]:
    folder = tmp_path / engine
    if not folder.exists():
        write(folder, serving_files(doc, 0, engine))
    return [" ".join(argv) for argv in captured(folder, node, hosts)]


VLLM_TAIL = "--max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 --max-model-len 2048"
SGL_TAIL = "--mem-fraction-static 0.9 --max-running-requests 256 --chunked-prefill-size 8192 --context-length 2048"
TRT_TAIL = "--max_batch_size 256 --max_num_tokens 8192 --max_seq_len 2048 --extra_llm_api_options"


def test_mixed_agg_vllm(tmp_path):
    doc = mixed_agg("vllm")
    h100 = (f"vllm serve {MODEL} --host 0.0.0.0 --port {{}} --tensor-parallel-size 2 "
            f"--pipeline-parallel-size 1 {VLLM_TAIL}")
    h200 = (f"vllm serve {MODEL} --host 0.0.0.0 --port {{}} --tensor-parallel-size 1 "
            f"--pipeline-parallel-size 1 {VLLM_TAIL}")
    assert commands(tmp_path, doc, "vllm", 0) == [h100.format(port) for port in (8100, 8101, 8102, 8103)]
    assert commands(tmp_path, doc, "vllm", 1) == [h100.format(port) for port in (8100, 8101)]
    assert commands(tmp_path, doc, "vllm", 2) == [h200.format(port) for port in (8100, 8101, 8102, 8103)]
    text = files(doc, "vllm")["serve.sh"]
    assert ("    # aggregated-1 API servers: node 2 port 8100, node 2 port 8101, "
            "node 2 port 8102, node 2 port 8103\n") in text
    assert "    # aggregated-1 (4 x h200-sxm): 60% of requests (15% per worker)\n" in text
    assert "CUDA_VISIBLE_DEVICES=3 vllm" in text and "CUDA_VISIBLE_DEVICES=6,7 vllm" in text


def test_mixed_agg_sglang_router_states_the_split(tmp_path):
    doc = mixed_agg("sglang")
    urls = " ".join([*(f"http://a:{p}" for p in (8100, 8101, 8102, 8103)), "http://b:8100", "http://b:8101",
                     *(f"http://c:{p}" for p in (8100, 8101, 8102, 8103))])
    node0 = commands(tmp_path, doc, "sglang", 0)
    assert node0[-1] == f"python -m sglang_router.launch_router --host 0.0.0.0 --port 8000 --worker-urls {urls}"
    assert node0[0] == (f"python -m sglang.launch_server --model-path {MODEL} --host 0.0.0.0 --port 8100 --tp-size 2 "
                        f"--pp-size 1 {SGL_TAIL}")
    assert commands(tmp_path, doc, "sglang", 2)[3] == (
        f"python -m sglang.launch_server --model-path {MODEL} --host 0.0.0.0 --port 8103 --tp-size 1 --pp-size 1 "
        f"{SGL_TAIL}")
    text = files(doc, "sglang")["serve.sh"]
    assert "sglang-router 0.3.2 takes no per-worker weights" in text
    assert "    # aggregated-0 (6 x h100-sxm): 40% of requests (6.67% per worker)\n" in text
    assert "; 40% of requests (6.67% per worker)\n# aggregated-1: 4 worker(s) x 1 h200-sxm" in text  # header
    assert "of requests" not in files(mixed_agg("sglang", traffic=None), "sglang")["serve.sh"]


def test_mixed_agg_trtllm_options_per_pool(tmp_path):
    doc = mixed_agg("trtllm")
    names = list(files(doc, "all"))
    assert names == ["serving-plan.json", "serve.sh", "extra-llm-api-options-aggregated-0.yaml",
                     "extra-llm-api-options-aggregated-1.yaml", "k8s.yaml"]
    folder = tmp_path / "trtllm"
    assert commands(tmp_path, doc, "trtllm", 1) == [
        f"trtllm-serve {MODEL} --host 0.0.0.0 --port {port} --backend pytorch --tp_size 2 --pp_size 1 {TRT_TAIL} "
        f"{folder}/extra-llm-api-options-aggregated-0.yaml" for port in (8100, 8101)]
    assert commands(tmp_path, doc, "trtllm", 2)[0] == (
        f"trtllm-serve {MODEL} --host 0.0.0.0 --port 8100 --backend pytorch --tp_size 1 --pp_size 1 {TRT_TAIL} "
        f"{folder}/extra-llm-api-options-aggregated-1.yaml")
    h200 = yaml.safe_load((folder / "extra-llm-api-options-aggregated-1.yaml").read_text())
    assert (h200["moe_tensor_parallel_size"], h200["kv_cache_config"]["free_gpu_memory_fraction"]) == (1, 0.9)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_mixed_agg_names_do_not_collide(engine):
    out = files(mixed_agg(engine), "all")
    text = out["serve.sh"]
    logs = [word for line in text.splitlines() for word in line.split() if word.startswith('"$LOG_DIR"/')]
    assert len(logs) == 10 + (engine == "sglang") and len(set(logs)) == len(logs)
    assert '"$LOG_DIR"/aggregated-1-3-0.log' in logs
    objects = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out["k8s.yaml"])]
    assert [n for n, c in Counter(objects).items() if c > 1] == []
    assert ("Deployment", "llama-3-1-70b-serve-aggregated-0") in objects
    assert ("Service", "llama-3-1-70b-serve-aggregated-1") in objects


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_mixed_agg_nodes_by_gpu_type(engine):
    out = files(mixed_agg(engine), "all")
    text = out["serve.sh"]
    assert "# Each node must be of its GPU type: h100-sxm: nodes 0-1; h200-sxm: node 2.\n" in text
    assert "  0)  # node 0: h100-sxm\n" in text and "  1)  # node 1: h100-sxm\n" in text
    assert "  2)  # node 2: h200-sxm\n" in text
    deployments = [d for d in yaml.safe_load_all(out["k8s.yaml"]) if d["kind"] == "Deployment"]
    assert [(d["spec"]["replicas"], d["spec"]["template"]["spec"]["nodeSelector"]) for d in deployments] == [
        (6, {"paraplan.dev/gpu": "h100-sxm"}), (4, {"paraplan.dev/gpu": "h200-sxm"})]
    limits = [d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] for d in deployments]
    assert limits == [{"nvidia.com/gpu": 2}, {"nvidia.com/gpu": 1}]
    assert "# Pools run on different GPU types" in out["k8s.yaml"]
    assert "kubectl label node NODE paraplan.dev/gpu=h200-sxm" in out["k8s.yaml"]


def test_one_gpu_type_keeps_plain_output():
    out = files(llama_agg("sglang"), "all")
    assert "nodeSelector" not in out["k8s.yaml"] and "# node 0" not in out["serve.sh"]
    assert "GPU type" not in out["serve.sh"]


@pytest.mark.parametrize("make", [mixed_agg, cross_disagg])
@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_mixed_serve_sh_passes_bash_n_and_flags_are_checked(tmp_path, make, engine):
    folder = write(tmp_path, serving_files(make(engine), 0, engine))
    subprocess.run(["bash", "-n", str(folder / "serve.sh")], check=True)
    for node in range(3):
        for argv in captured(folder, node, HOSTS):
            table = FLAG_SOURCES["sglang_router" if "sglang_router.launch_router" in argv else engine]
            unknown = [w for w in argv[1:] if w.startswith("--") and w not in table]
            assert unknown == [], (engine, argv)


def test_cross_type_disagg_sglang(tmp_path):
    doc = cross_disagg("sglang")
    ds = DSR1["hf_repo"]
    common = ("--mem-fraction-static 0.9 --max-running-requests {b} --chunked-prefill-size {t} --context-length 2048 "
              "--kv-cache-dtype fp8_e4m3 --disaggregation-mode {role} --disaggregation-transfer-backend nixl")
    prefill = (f"python -m sglang.launch_server --model-path {ds} --host 0.0.0.0 --port 8100 --tp-size 8 --pp-size 1 "
               "--ep-size 8 " + common.format(b=256, t=16384, role="prefill") + " --disaggregation-bootstrap-port 8998")
    decode = (f"python -m sglang.launch_server --model-path {ds} --host 0.0.0.0 --port 8100 --tp-size 4 --pp-size 1 "
              "--ep-size 4 " + common.format(b=512, t=8192, role="decode"))
    router = ("python -m sglang_router.launch_router --host 0.0.0.0 --port 8000 --pd-disaggregation "
              "--prefill http://a:8100 8998 --decode http://b:8100 --decode http://c:8100")
    assert commands(tmp_path, doc, "sglang", 0) == [prefill, router]
    assert commands(tmp_path, doc, "sglang", 1) == [decode] == commands(tmp_path, doc, "sglang", 2)
    out = files(doc, "all")
    assert "# Each node must be of its GPU type: h100-sxm: node 0; gb200: nodes 1-2.\n" in out["serve.sh"]
    assert "  1)  # node 1: gb200\n" in out["serve.sh"]
    assert "CUDA_VISIBLE_DEVICES" not in out["serve.sh"]  # each decode worker fills a 4-GPU gb200 node
    selectors = [d["spec"]["template"]["spec"]["nodeSelector"] for d in yaml.safe_load_all(out["k8s.yaml"])
                 if d["kind"] == "Deployment"]
    assert selectors == [{"paraplan.dev/gpu": "h100-sxm"}, {"paraplan.dev/gpu": "gb200"}]


def test_cross_type_disagg_trtllm(tmp_path):
    doc = cross_disagg("trtllm")
    out = files(doc, "all")
    assert list(out) == ["serving-plan.json", "serve.sh", "extra-llm-api-options-prefill.yaml",
                         "extra-llm-api-options-decode.yaml", "disagg-config.yaml", "k8s.yaml"]
    config = yaml.safe_load(out["disagg-config.yaml"])
    assert config["context_servers"] == {"num_instances": 1, "urls": ["paraplan-node-0:8100"],
                                         "tensor_parallel_size": 8, "pipeline_parallel_size": 1}
    assert config["generation_servers"]["urls"] == ["paraplan-node-1:8100", "paraplan-node-2:8100"]
    folder = tmp_path / "trtllm"
    assert commands(tmp_path, doc, "trtllm", 2) == [
        (f"trtllm-serve {DSR1['hf_repo']} --host 0.0.0.0 --port 8100 --backend pytorch --tp_size 4 --pp_size 1 "
         f"--max_batch_size 512 --max_num_tokens 8192 --max_seq_len 2048 --extra_llm_api_options "
         f"{folder}/extra-llm-api-options-decode.yaml")]


def test_pool_roles_and_traffic_are_checked():
    with pytest.raises(InputError, match="needs one or more aggregated pools, got aggregated, decode"):
        serving_files(document("vllm", "agg", [pool("aggregated", 1, 8), pool("decode", 1, 8)], LLAMA), 0, "vllm")
    with pytest.raises(InputError, match="needs pools prefill, decode in that order, got decode, prefill"):
        doc = document("vllm", "disagg", [pool("decode", 1, 8), pool("prefill", 1, 8)], LLAMA,
                       kv_transfer={"backend": "nixl", "link": "rdma"})
        serving_files(doc, 0, "vllm")
    with pytest.raises(InputError, match="traffic_frac must sum to 1, got 0.9"):
        serving_files(mixed_agg("vllm", traffic=(0.4, 0.5)), 0, "vllm")
    with pytest.raises(InputError, match="traffic_frac is given for some aggregated pools but not all"):
        serving_files(mixed_agg("vllm", traffic=(1.0,)), 0, "vllm")
    with pytest.raises(InputError, match=r"pools\[1\].traffic_frac must be a fraction in \[0, 1\], got 1.5"):
        serving_files(mixed_agg("vllm", traffic=(0.5, 1.5)), 0, "vllm")


def test_whole_role_traffic_is_accepted_and_not_repeated():
    doc = cross_disagg("sglang")  # the planner writes traffic_frac 1 for a pool that is the whole of its role
    for entry in doc["plans"][0]["pools"]:
        entry["traffic_frac"] = 1.0
    assert "of requests" not in files(doc, "sglang")["serve.sh"]
    one = llama_agg("vllm")
    one["plans"][0]["pools"][0]["traffic_frac"] = 1.0
    assert "of requests" not in files(one, "vllm")["serve.sh"]
