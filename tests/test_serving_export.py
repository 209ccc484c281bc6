"""Serving launch files: exact engine commands, flags from the checked table, YAML shapes, safe writes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from serving_factory import LLAMA, captured, deepseek_disagg, dense_pp, document, llama_agg, pool, write

from paraplan.errors import InputError
from paraplan.exporters.serving import SERVING_FORMATS, export_serving, expressible, serving_files
from paraplan.exporters.serving_engines import FLAG_SOURCES

HOSTS3 = "n0 n1 n2"


def files(doc: dict, fmt: str) -> dict[str, str]:
    return {f.name: f.text for f in serving_files(doc, 0, fmt)}


def run(tmp_path, doc: dict, engine: str, node: int, hosts: str) -> list[str]:
    folder = write(tmp_path / engine, serving_files(doc, 0, engine)) if not (tmp_path / engine).exists() \
        else tmp_path / engine
    return [" ".join(argv) for argv in captured(folder, node, hosts)]


VLLM_TAIL = "--max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 --max-model-len 2048"
SGL_TAIL = "--mem-fraction-static 0.9 --max-running-requests 256 --chunked-prefill-size 8192 --context-length 2048"


def test_llama_agg_commands(tmp_path):
    model = "meta-llama/Llama-3.1-70B"
    assert run(tmp_path, llama_agg("vllm"), "vllm", 0, "h0") == [
        f"vllm serve {model} --host 0.0.0.0 --port {port} --tensor-parallel-size 4 --pipeline-parallel-size 1 "
        + VLLM_TAIL for port in (8100, 8101)]
    assert run(tmp_path, llama_agg("sglang"), "sglang", 0, "h0") == [
        *[f"python -m sglang.launch_server --model-path {model} --host 0.0.0.0 --port {port} --tp-size 4 --pp-size 1 "
          + SGL_TAIL for port in (8100, 8101)],
        "python -m sglang_router.launch_router --host 0.0.0.0 --port 8000 --worker-urls http://h0:8100 http://h0:8101"]
    folder = tmp_path / "trt"
    write(folder, serving_files(llama_agg("trtllm"), 0, "trtllm"))
    assert [" ".join(a) for a in captured(folder, 0, "h0")] == [
        f"trtllm-serve {model} --host 0.0.0.0 --port {port} --backend pytorch --tp_size 4 --pp_size 1 "
        f"--max_batch_size 256 --max_num_tokens 8192 --max_seq_len 2048 --extra_llm_api_options "
        f"{folder}/extra-llm-api-options.yaml" for port in (8100, 8101)]
    # two workers of 4 GPUs share the node: each sees its own half
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 vllm" in files(llama_agg("vllm"), "vllm")["serve.sh"]
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7 vllm" in files(llama_agg("vllm"), "vllm")["serve.sh"]


DS = "deepseek-ai/DeepSeek-R1"
NIXL_P = '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
NIXL_D = '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'


def test_deepseek_disagg_vllm(tmp_path):
    doc = deepseek_disagg("vllm")
    prefill = (f"vllm serve {DS} --host 0.0.0.0 --port 8100 --tensor-parallel-size 8 --pipeline-parallel-size 1 "
               "--enable-expert-parallel --max-num-seqs 256 --max-num-batched-tokens 16384 "
               "--gpu-memory-utilization 0.9 "
               f"--max-model-len 2048 --kv-cache-dtype fp8 --kv-transfer-config {NIXL_P}")
    # decode: 16 DP ranks, 8 per node; 1024 sequences and 8192 tokens per worker = 64 and 512 per DP rank
    decode = (f"vllm serve {DS} --host 0.0.0.0 --port 8100 --tensor-parallel-size 1 --pipeline-parallel-size 1 "
              "--data-parallel-size 16 --data-parallel-size-local 8 --data-parallel-address n1 "
              "--data-parallel-rpc-port 13345{start} --enable-expert-parallel --max-num-seqs 64 "
              "--max-num-batched-tokens 512 --gpu-memory-utilization 0.9 --max-model-len 2048 --kv-cache-dtype fp8 "
              "--kv-transfer-config ") + NIXL_D
    assert run(tmp_path, doc, "vllm", 0, HOSTS3) == [prefill]
    assert run(tmp_path, doc, "vllm", 1, HOSTS3) == [decode.replace("{start}", "")]
    assert run(tmp_path, doc, "vllm", 2, HOSTS3) == [
        decode.replace("{start}", " --data-parallel-start-rank 8 --headless")]
    text = files(doc, "vllm")["serve.sh"]
    assert 'VLLM_NIXL_SIDE_CHANNEL_HOST="${HOSTS[2]}" VLLM_NIXL_SIDE_CHANNEL_PORT=5600 vllm' in text


def test_deepseek_disagg_sglang(tmp_path):
    doc = deepseek_disagg("sglang")
    common = "--mem-fraction-static 0.9 --max-running-requests {b} --chunked-prefill-size {t} --context-length 2048 " \
             "--kv-cache-dtype fp8_e4m3 --disaggregation-mode {role} --disaggregation-transfer-backend nixl"
    prefill = (f"python -m sglang.launch_server --model-path {DS} --host 0.0.0.0 --port 8100 --tp-size 8 --pp-size 1 "
               "--ep-size 8 " + common.format(b=256, t=16384, role="prefill") + " --disaggregation-bootstrap-port 8998")
    decode = (f"python -m sglang.launch_server --model-path {DS} --host 0.0.0.0 --port 8100 --tp-size 16 --pp-size 1 "
              "--attn-dp-size 16 --ep-size 16 --nnodes 2 --node-rank {r} --dist-init-addr n1:29500 "
              + common.format(b=1024, t=8192, role="decode"))
    router = ("python -m sglang_router.launch_router --host 0.0.0.0 --port 8000 --pd-disaggregation "
              "--prefill http://n0:8100 8998 --decode http://n1:8100")
    assert run(tmp_path, doc, "sglang", 0, HOSTS3) == [prefill, router]
    assert run(tmp_path, doc, "sglang", 1, HOSTS3) == [decode.format(r=0)]
    assert run(tmp_path, doc, "sglang", 2, HOSTS3) == [decode.format(r=1)]


def test_deepseek_disagg_trtllm(tmp_path):
    doc = deepseek_disagg("trtllm")
    folder = write(tmp_path / "trt", serving_files(doc, 0, "trtllm"))
    node0 = captured(folder, 0, HOSTS3)
    assert [" ".join(a) for a in node0 if a[1] != "disaggregated"] == [
        (f"trtllm-serve {DS} --host 0.0.0.0 --port 8100 --backend pytorch --tp_size 8 --pp_size 1 --max_batch_size 256 "
         "--max_num_tokens 16384 --max_seq_len 2048 "
         f"--extra_llm_api_options {folder}/extra-llm-api-options-prefill.yaml")]
    front = next(a for a in node0 if a[1] == "disaggregated")
    assert front[2] == "-c" and front[4:] == ["--server_start_timeout", "3600"]
    config = yaml.safe_load(Path(front[3]).read_text())  # the node hosts stand in for paraplan-node-N
    assert config["context_servers"]["urls"] == ["n0:8100"] and config["generation_servers"]["urls"] == ["n1:8100"]
    assert [" ".join(a) for a in captured(folder, 1, HOSTS3)] == [
        (f"mpirun -n 16 --host n1:8,n2:8 trtllm-llmapi-launch trtllm-serve {DS} --host 0.0.0.0 --port 8100 --backend "
        "pytorch --tp_size 16 --pp_size 1 --max_batch_size 64 --max_num_tokens 512 --max_seq_len 2048 "
        "--gpus_per_node 8 "
        f"--extra_llm_api_options {folder}/extra-llm-api-options-decode.yaml")]
    assert captured(folder, 2, HOSTS3) == []  # node 2 joins the decode worker through mpirun
    decode = yaml.safe_load((folder / "extra-llm-api-options-decode.yaml").read_text())
    assert decode == {"enable_attention_dp": True, "moe_expert_parallel_size": 16, "moe_tensor_parallel_size": 1,
                      "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": 0.9},
                      "cuda_graph_config": {"enable_padding": True, "max_batch_size": 64},
                      "cache_transceiver_config": {"backend": "NIXL", "max_tokens_in_buffer": 2048}}
    prefill = yaml.safe_load((folder / "extra-llm-api-options-prefill.yaml").read_text())
    assert prefill["enable_attention_dp"] is False and prefill["disable_overlap_scheduler"] is True
    assert (prefill["moe_expert_parallel_size"], prefill["moe_tensor_parallel_size"]) == (8, 1)


def test_dense_pipeline_two_nodes(tmp_path):
    head = "--host 0.0.0.0 --port 8100"
    vllm = (f"vllm serve {LLAMA['hf_repo']} {head} --tensor-parallel-size 8 --pipeline-parallel-size 2 --nnodes 2 "
            "--node-rank {r} --master-addr a --master-port 29500{headless} " + VLLM_TAIL)
    assert run(tmp_path, dense_pp("vllm"), "vllm", 0, "a b") == [vllm.format(r=0, headless="")]
    assert run(tmp_path, dense_pp("vllm"), "vllm", 1, "a b") == [vllm.format(r=1, headless=" --headless")]
    sgl = (f"python -m sglang.launch_server --model-path {LLAMA['hf_repo']} {head} --tp-size 8 --pp-size 2 --nnodes 2 "
           "--node-rank {r} --dist-init-addr a:29500 " + SGL_TAIL)
    assert run(tmp_path, dense_pp("sglang"), "sglang", 1, "a b") == [sgl.format(r=1)]
    trt = run(tmp_path, dense_pp("trtllm"), "trtllm", 0, "a b")
    assert len(trt) == 1 and trt[0].startswith("mpirun -n 16 --host a:8,b:8 trtllm-llmapi-launch trtllm-serve ")
    assert " --tp_size 8 --pp_size 2 " in trt[0]


def _flags(words: list[str]) -> list[str]:
    return [w for w in words if w.startswith("-") and not w.lstrip("-").isdigit()]


@pytest.mark.parametrize("make", [llama_agg, deepseek_disagg, dense_pp])
@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_every_emitted_flag_is_in_the_checked_table(tmp_path, make, engine):
    folder = write(tmp_path, serving_files(make(engine), 0, engine))
    for node in range(3 if make is deepseek_disagg else 2 if make is dense_pp else 1):
        for argv in captured(folder, node, HOSTS3 if make is deepseek_disagg else "a b" if make is dense_pp else "a"):
            if argv[0] == "mpirun":
                argv = argv[argv.index("trtllm-llmapi-launch") + 1:]
            table = FLAG_SOURCES["sglang_router" if "sglang_router.launch_router" in argv else engine]
            unknown = [flag for flag in _flags(argv[1:]) if flag not in table and flag != "-m"]
            assert unknown == [], (engine, argv)


def test_expressible_reasons():
    assert expressible("sglang", pool("decode", 1, 4, dp=2, ep=4)) is None
    assert "moe_ep must be 1 or tp*dp_attention = 8, got 4" in expressible("vllm", pool("decode", 1, 4, dp=2, ep=4))
    assert expressible("vllm", pool("decode", 1, 4, dp=2, ep=8)) is None
    assert "dp_attention must be 1 or tp*dp_attention = 8, got 2" in expressible("trtllm", pool("d", 1, 4, dp=2, ep=8))
    assert expressible("trtllm", pool("d", 1, 1, dp=8, ep=2)) is None  # TRT-LLM splits experts any way: moe_tp 4
    assert "tp*pp = 3 must divide the 8 GPUs" in expressible("vllm", pool("d", 1, 3, dp=8, ep=24))
    doc = document("vllm", "agg", [pool("aggregated", 1, 4, dp=2, ep=4)], LLAMA)
    with pytest.raises(InputError, match="cannot be exported: vLLM expert parallel is all-or-nothing"):
        serving_files(doc, 0, "vllm")


def test_k8s_deployments_and_services():
    text = files(llama_agg("trtllm"), "k8s")["k8s.yaml"]
    assert text.startswith("# Generated by paraplan")
    deployment, service, config = yaml.safe_load_all(text)
    assert deployment["spec"]["replicas"] == 2
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert container["args"][container["args"].index("--tp_size") + 1] == "4"
    assert container["args"][-1] == "/etc/paraplan/extra-llm-api-options.yaml"
    assert service["spec"]["clusterIP"] == "None" and config["data"].keys() == {"extra-llm-api-options.yaml"}
    with pytest.raises(InputError, match="decode workers span 2 nodes"):
        serving_files(deepseek_disagg("sglang"), 0, "k8s")


def test_all_has_no_collisions_and_headers():
    names = files(llama_agg("trtllm"), "all")
    assert list(names) == ["serving-plan.json", "serve.sh", "extra-llm-api-options.yaml", "k8s.yaml"]
    assert json.loads(names["serving-plan.json"]) == llama_agg("trtllm")
    for name, text in names.items():
        if name != "serving-plan.json":
            assert "Predicted: TTFT 250.0 ms, TPOT 20.0 ms, output_tokens_per_s 5120" in text
            assert "Flags checked against TensorRT-LLM 1.2 line" in text
    disagg = files(deepseek_disagg("trtllm"), "all")
    assert "k8s.yaml" not in disagg and "k8s.yaml not written" in disagg["serve.sh"]
    assert "disagg-config.yaml" in disagg


@pytest.mark.parametrize("make", [llama_agg, deepseek_disagg, dense_pp])
@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_serve_sh_passes_bash_n(tmp_path, make, engine):
    folder = write(tmp_path, serving_files(make(engine), 0, engine))
    subprocess.run(["bash", "-n", str(folder / "serve.sh")], check=True)


def test_formats_and_mismatch():
    with pytest.raises(InputError, match="one of " + ", ".join(SERVING_FORMATS)):
        serving_files(llama_agg("vllm"), 0, "docker")
    with pytest.raises(InputError, match="--export sglang needs a deployment for sglang; this one is for vllm"):
        serving_files(llama_agg("vllm"), 0, "sglang")
    with pytest.raises(InputError, match="plan index 1 is out of range"):
        serving_files(llama_agg("vllm"), 1, "json")


def test_writes_are_transactional(tmp_path):
    out = tmp_path / "out"
    written = export_serving(llama_agg("trtllm"), 0, "all", out, force=False)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)
    assert all(p.parent == out for p in written)
    (out / "serve.sh").write_text("mine")
    (out / "serving-plan.json").unlink()
    with pytest.raises(InputError, match="already holds serve.sh"):
        export_serving(llama_agg("trtllm"), 0, "all", out, force=False)
    assert (out / "serve.sh").read_text() == "mine" and not (out / "serving-plan.json").exists()
    export_serving(llama_agg("trtllm"), 0, "all", out, force=True)
    assert (out / "serve.sh").read_text().startswith("#!/usr/bin/env bash")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left beside or inside
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("fmt", ["vllm", "k8s"])
def test_a_local_model_folder_is_the_default_model(fmt: str):
    """A plan of a local checkpoint (model.path: the folder holding config.json and the weights) launches that
    folder itself, not its parent."""
    doc = document("vllm", "agg", [pool("aggregated", 2, 4)], {"name": "site-llama", "hf_repo": None,
                                                                  "path": "/ckpt/site-llama"})
    written = files(doc, fmt)
    if fmt == "vllm":
        assert "MODEL=${MODEL:-/ckpt/site-llama}\n" in written["serve.sh"]
    else:
        commands = [c["args"] for d in yaml.safe_load_all(written["k8s.yaml"]) if d["kind"] == "Deployment"
                    for c in d["spec"]["template"]["spec"]["containers"]]
        assert commands and all("/ckpt/site-llama" in args and "/ckpt" not in args for args in commands)


def with_engine_options(doc: dict, *, cuda_graphs: bool = True, method: str | None = None, tokens: int = 3,
                        draft: str | None = None) -> dict:
    """``doc`` with the plan's engine_options (issue 32 item 4): CUDA graphs and speculative decoding."""
    spec = None if method is None else {"method": method, "num_tokens": tokens, "acceptance_frac": 0.7,
                                        "draft_model": draft, "expected_tokens_per_step": 2.533}
    doc["plans"][0]["engine_options"] = {"cuda_graphs": cuda_graphs, "speculative": spec}
    return doc


def test_engine_options_in_each_engines_words(tmp_path):
    eager_mtp = {"cuda_graphs": False, "method": "mtp", "tokens": 2}
    vllm = run(tmp_path, with_engine_options(llama_agg("vllm"), **eager_mtp), "vllm", 0, "h0")[0]
    assert vllm.endswith(VLLM_TAIL + " --enforce-eager --speculative-config "
                         '{"method":"mtp","num_speculative_tokens":2}')
    sgl = run(tmp_path, with_engine_options(llama_agg("sglang"), **eager_mtp), "sglang", 0, "h0")[0]
    assert sgl.endswith(SGL_TAIL + " --disable-decode-cuda-graph --speculative-algorithm NEXTN "
                        "--speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3")
    trt = yaml.safe_load(files(with_engine_options(llama_agg("trtllm"), **eager_mtp), "trtllm")
                         ["extra-llm-api-options.yaml"])
    assert trt["cuda_graph_config"] is None and trt["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
    assert trt["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 2}
    draft = with_engine_options(document("trtllm", "agg", [pool("aggregated", 2, 4, frac=0.6)], LLAMA), method="draft",
                                draft="meta-llama/Llama-3.2-1B")
    assert yaml.safe_load(files(draft, "trtllm")["extra-llm-api-options.yaml"])["kv_cache_config"][
        "free_gpu_memory_fraction"] == 0.6
    assert yaml.safe_load(files(draft, "trtllm")["extra-llm-api-options.yaml"])["speculative_config"] == {
        "decoding_type": "Draft_Target", "max_draft_len": 3, "speculative_model": "meta-llama/Llama-3.2-1B"}
    vllm_draft = run(tmp_path / "d", with_engine_options(llama_agg("vllm"), method="draft", draft="m/d"), "vllm", 0,
                     "h0")[0]
    assert vllm_draft.endswith(
        ' --speculative-config {"method":"draft_model","num_speculative_tokens":3,"model":"m/d"}')
    # an EAGLE head the plan leaves open: a placeholder word, and the header says to replace it
    eagle = files(with_engine_options(llama_agg("sglang"), method="eagle"), "sglang")["serve.sh"]
    assert "--speculative-draft-model-path EAGLE_HEAD_PATH" in eagle
    assert "# Replace EAGLE_HEAD_PATH with the EAGLE head's path or repo id." in eagle
    assert "Speculative decoding: eagle, 3 draft tokens per step, acceptance 0.7 per token" in eagle


def test_default_engine_options_write_nothing_new(tmp_path):
    plain = files(llama_agg("vllm"), "vllm")["serve.sh"]
    assert files(with_engine_options(llama_agg("vllm")), "vllm")["serve.sh"] == plain
    assert "--enforce-eager" not in plain and "--speculative-config" not in plain


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("method", ["mtp", "eagle", "draft"])
def test_engine_option_flags_are_in_the_checked_table(tmp_path, engine, method):
    doc = with_engine_options(deepseek_disagg(engine), cuda_graphs=False, method=method,
                              draft=None if method == "mtp" else "m/d")
    folder = write(tmp_path, serving_files(doc, 0, engine))
    for node in range(3):
        for argv in captured(folder, node, HOSTS3):
            if argv[0] == "mpirun":
                argv = argv[argv.index("trtllm-llmapi-launch") + 1:]
            table = FLAG_SOURCES["sglang_router" if "sglang_router.launch_router" in argv else engine]
            assert [flag for flag in _flags(argv[1:]) if flag not in table and flag != "-m"] == [], (engine, argv)
