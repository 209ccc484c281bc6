"""Engine command lines for one serving process: vLLM, SGLang and TensorRT-LLM.

Each flag was read in the engine's own source at the version in ENGINE_VERSIONS; FLAG_SOURCES names the
file that defines it (tests/test_serving_export.py checks every emitted flag is in that table, and
tests/test_engines_serving.py parses the vLLM and SGLang commands with the engines' own parsers).
Batch limits: the plan's max_batch and max_batched_tokens are one worker's totals. SGLang takes totals
and divides by the attention-DP width itself (sglang/srt/arg_groups/parallel_hook.py,
``chunked_prefill_size // attn_dp_size``); vLLM's max_num_seqs / max_num_batched_tokens and TRT-LLM's
max_batch_size / max_num_tokens hold per DP rank (one engine core, one attention-DP rank), so they get
the total divided by dp_attention.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from paraplan.exporters.serving_pools import pool_node_gpus
from paraplan.planner.serving.pool_shape import ServingPool

ENGINE_VERSIONS = {
    "vllm": "vLLM 0.33.0 (PyPI wheel)",
    "sglang": "SGLang 0.5.23 and sglang-router 0.3.2 (PyPI wheels)",
    "trtllm": "TensorRT-LLM 1.2 line (NVIDIA/TensorRT-LLM main: tensorrt_llm/commands/serve.py, llmapi/llm_args.py)",
}
_V, _S, _R, _T = "vllm/engine/arg_utils.py", "sglang/srt/arg_groups/fields/", "sglang_router/router_args.py", \
    "tensorrt_llm/commands/serve.py"
FLAG_SOURCES: dict[str, dict[str, str]] = {
    "vllm": {flag: _V for flag in (
        "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size", "--data-parallel-size-local",
        "--data-parallel-start-rank", "--data-parallel-address", "--data-parallel-rpc-port",
        "--enable-expert-parallel", "--nnodes", "--node-rank", "--master-addr", "--master-port",
        "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization", "--max-model-len",
        "--kv-cache-dtype", "--quantization", "--kv-transfer-config", "--enforce-eager", "--speculative-config")}
    | {"--host": "vllm/entrypoints/common/cli_args.py", "--port": "vllm/entrypoints/common/cli_args.py",
       "--headless": "vllm/entrypoints/common/cli_args.py"},
    "sglang": {"--model-path": _S + "model.py", "--context-length": _S + "model.py",
               "--quantization": _S + "model.py", "--kv-cache-dtype": _S + "model.py",
               "--tp-size": _S + "parallel.py", "--pp-size": _S + "parallel.py", "--attn-dp-size": _S + "parallel.py",
               "--ep-size": _S + "parallel.py", "--nnodes": _S + "parallel.py", "--node-rank": _S + "parallel.py",
               "--dist-init-addr": _S + "parallel.py", "--mem-fraction-static": _S + "schedule.py",
               "--max-running-requests": _S + "schedule.py", "--chunked-prefill-size": _S + "schedule.py",
               "--host": _S + "serving.py", "--port": _S + "serving.py",
               "--disaggregation-mode": _S + "disagg.py", "--disaggregation-transfer-backend": _S + "disagg.py",
               "--disaggregation-bootstrap-port": _S + "disagg.py", "--disable-decode-cuda-graph": _S + "exec_.py",
               "--speculative-algorithm": _S + "spec.py", "--speculative-draft-model-path": _S + "spec.py",
               "--speculative-num-steps": _S + "spec.py", "--speculative-eagle-topk": _S + "spec.py",
               "--speculative-num-draft-tokens": _S + "spec.py"},
    "sglang_router": {flag: _R for flag in ("--pd-disaggregation", "--prefill", "--decode", "--worker-urls",
                                            "--host", "--port")},
    "trtllm": {flag: _T for flag in ("--host", "--port", "--backend", "--tp_size", "--pp_size", "--max_batch_size",
                                     "--max_num_tokens", "--max_seq_len", "--gpus_per_node",
                                     "--extra_llm_api_options", "-c", "--server_start_timeout")},
}
HTTP_PORT, DIST_PORT, DP_RPC_PORT, NIXL_PORT, BOOTSTRAP_PORT = 8100, 29500, 13345, 5600, 8998
"""Port bases, plus the process's slot on its node. 8000 is left to the router; 29500 is torch's usual
rendezvous port; 13345 vLLM's DP RPC default (vllm/config/parallel.py data_parallel_rpc_port); 5600 vLLM's
NIXL side channel (vllm/envs.py), to which vLLM adds the DP index, so slots are NIXL_STRIDE apart; 8998
SGLang's disaggregation_bootstrap_port default (fields/disagg.py)."""
NIXL_STRIDE = 256  # room for 256 DP ranks of one worker before the next worker's side-channel ports
# weights -> vLLM/SGLang --quantization: only fp8 is an online method both engines apply to a bf16
# checkpoint ("fp8" in vllm/model_executor/layers/quantization/__init__.py and sglang choices.py); the
# other formats come from the checkpoint's own quantization_config, which all three engines read.
_ONLINE_QUANT = {"fp8": "fp8"}
KV_DTYPES = {"vllm": "fp8", "sglang": "fp8_e4m3", "trtllm": "fp8"}  # each engine's name of an FP8 KV cache
TRANSFER = {  # plan kv_transfer.backend -> (vLLM connector, SGLang backend, TRT-LLM cache transceiver backend)
    "nixl": ("NixlConnector", "nixl", "NIXL"), "mooncake": ("MooncakeConnector", "mooncake", "MOONCAKE"),
    "ucx": ("NixlConnector", "nixl", "UCX"),  # vLLM and SGLang reach UCX through NIXL (its default backend)
}

SPECULATIVE = {  # paraplan method -> (vLLM speculative_config method, SGLang algorithm, TRT-LLM decoding_type)
    "mtp": ("mtp", "NEXTN", "MTP"), "eagle": ("eagle", "EAGLE", "Eagle"), "draft": ("draft_model", "STANDALONE",
                                                                                    "Draft_Target")}
"""vllm/config/speculative.py SpeculativeMethod; sglang fields/spec.py speculative_algorithm builtins;
tensorrt_llm/llmapi/llm_args.py MTPDecodingConfig, EagleDecodingConfig, DraftTargetDecodingConfig."""
EAGLE_HEAD_PLACEHOLDER = "EAGLE_HEAD_PATH"
"""Where the plan names no EAGLE head: the launch file says to replace this word with the head's path or repo."""

Word = str | tuple[str, str]
"""A literal word, or (bash text, Kubernetes text) for a value the launcher fills in (host, model path)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """Where one process runs and what it may refer to."""

    model: Word
    port: int
    slot: int
    node_in_worker: int
    host: Word
    """Host of the process's own node."""
    head: Word | None
    """Host of the worker's first node; None when the worker fits one node."""
    extra_options: Word | None = None
    """TRT-LLM extra options YAML path."""


def expressible(engine: str, pool: dict[str, Any] | ServingPool) -> str | None:
    """None if ``engine`` can run the pool's sharding (a plan pool entry or a ServingPool), else a one-line
    reason. The search applies the same rules vectorized (planner/serving/space.worker_shardings);
    tests/test_serving_search.py checks they agree."""
    def field(key: str) -> int:
        return int(getattr(pool, key) if isinstance(pool, ServingPool) else pool[key])

    tp, dp, ep, pp = field("tp"), field("dp_attention"), field("moe_ep"), field("pp")
    group = tp * dp
    if engine not in ENGINE_VERSIONS:
        return f"unknown engine {engine!r}: paraplan exports vllm, sglang or trtllm"
    if engine == "vllm" and ep not in (1, group):
        return (f"vLLM expert parallel is all-or-nothing (--enable-expert-parallel gives EP = TP x DP): moe_ep must "
                f"be 1 or tp*dp_attention = {group}, got {ep}")
    node = pool.num_node_gpus if isinstance(pool, ServingPool) else pool_node_gpus(pool)
    if engine == "vllm" and dp > 1 and group * pp > node and node % (tp * pp):
        return (f"vLLM places whole data-parallel ranks on a node: tp*pp = {tp * pp} must divide the {node} GPUs "
                "of a node when a worker spans nodes")
    if engine == "trtllm" and dp not in (1, group):
        return (f"TensorRT-LLM attention DP is all-or-nothing (enable_attention_dp makes attention TP 1): "
                f"dp_attention must be 1 or tp*dp_attention = {group}, got {dp} with tp {tp}")
    return None


def vllm_command(pool: ServingPool, deployment: dict[str, Any], at: Slot) -> tuple[list[Word], dict[str, Word]]:
    """``vllm serve`` for one process, and the environment it needs."""
    argv: list[Word] = ["vllm", "serve", at.model, "--host", "0.0.0.0", "--port", str(at.port),
                        "--tensor-parallel-size", str(pool.tp), "--pipeline-parallel-size", str(pool.pp)]
    if pool.dp_attention > 1:
        argv += ["--data-parallel-size", str(pool.dp_attention)]
        if at.head is not None:
            local = pool.num_node_gpus // (pool.tp * pool.pp)
            argv += ["--data-parallel-size-local", str(local), "--data-parallel-address", at.head,
                     "--data-parallel-rpc-port", str(DP_RPC_PORT + at.slot)]
            if at.node_in_worker:
                argv += ["--data-parallel-start-rank", str(at.node_in_worker * local)]
    elif at.head is not None:
        argv += ["--nnodes", str(pool.nodes_per_worker), "--node-rank", str(at.node_in_worker),
                 "--master-addr", at.head, "--master-port", str(DIST_PORT + at.slot)]
    if at.node_in_worker:
        argv += ["--headless"]  # ranks beyond the first node run engine cores only (no API server)
    if pool.moe_ep > 1:
        argv += ["--enable-expert-parallel"]
    argv += ["--max-num-seqs", str(pool.max_batch_per_rank),
             "--max-num-batched-tokens", str(pool.max_batched_tokens_per_rank),
             "--gpu-memory-utilization", f"{pool.memory_frac:g}", "--max-model-len", str(pool.max_model_len)]
    argv += _quant_flags("vllm", deployment) + _vllm_options(deployment)
    env: dict[str, Word] = {}
    if pool.role != "aggregated":
        connector = TRANSFER[deployment["kv_transfer"]["backend"]][0]
        role = "kv_producer" if pool.role == "prefill" else "kv_consumer"  # kv_both is deprecated for NIXL
        argv += ["--kv-transfer-config", json.dumps({"kv_connector": connector, "kv_role": role},
                                                    separators=(",", ":"))]
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = at.host  # decode workers reach the prefill worker's side channel here
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(NIXL_PORT + NIXL_STRIDE * at.slot)
    return argv, env


def sglang_command(pool: ServingPool, deployment: dict[str, Any], at: Slot) -> tuple[list[Word], dict[str, Word]]:
    """``python -m sglang.launch_server`` for one process."""
    argv: list[Word] = ["python", "-m", "sglang.launch_server", "--model-path", at.model, "--host", "0.0.0.0",
                        "--port", str(at.port), "--tp-size", str(pool.tp_group), "--pp-size", str(pool.pp)]
    if pool.dp_attention > 1:
        argv += ["--attn-dp-size", str(pool.dp_attention)]  # replaces --dp-size N --enable-dp-attention
    if pool.moe_ep > 1:
        argv += ["--ep-size", str(pool.moe_ep)]  # MoE TP is what is left: tp_size // ep_size
    if at.head is not None:
        argv += ["--nnodes", str(pool.nodes_per_worker), "--node-rank", str(at.node_in_worker),
                 "--dist-init-addr", _join(at.head, f":{DIST_PORT + at.slot}")]
    argv += ["--mem-fraction-static", f"{pool.memory_frac:g}", "--max-running-requests", str(pool.max_batch),
             "--chunked-prefill-size", str(pool.max_batched_tokens), "--context-length", str(pool.max_model_len)]
    argv += _quant_flags("sglang", deployment) + _sglang_options(deployment)
    if pool.role != "aggregated":
        argv += ["--disaggregation-mode", pool.role,
                 "--disaggregation-transfer-backend", TRANSFER[deployment["kv_transfer"]["backend"]][1]]
        if pool.role == "prefill":
            argv += ["--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT + at.slot)]
    return argv, {}


def trtllm_command(pool: ServingPool, at: Slot) -> tuple[list[Word], dict[str, Word]]:
    """``trtllm-serve`` for one worker: sizes and limits on the command line, the rest in its YAML."""
    argv: list[Word] = ["trtllm-serve", at.model, "--host", "0.0.0.0", "--port", str(at.port), "--backend",
                        "pytorch", "--tp_size", str(pool.tp_group), "--pp_size", str(pool.pp),
                        "--max_batch_size", str(pool.max_batch_per_rank),
                        "--max_num_tokens", str(pool.max_batched_tokens_per_rank),
                        "--max_seq_len", str(pool.max_model_len)]
    if pool.nodes_per_worker > 1:
        argv += ["--gpus_per_node", str(pool.num_node_gpus)]
    assert at.extra_options is not None
    return argv + ["--extra_llm_api_options", at.extra_options], {}


def trtllm_options(pool: ServingPool, deployment: dict[str, Any]) -> dict[str, Any]:
    """The extra LLM API options YAML of a pool (llmapi/llm_args.py TorchLlmArgs fields)."""
    kv = deployment["quantization"]["kv_cache_dtype"]
    options: dict[str, Any] = {
        "enable_attention_dp": pool.dp_attention > 1,
        "moe_expert_parallel_size": pool.moe_ep, "moe_tensor_parallel_size": pool.moe_tp,
        "kv_cache_config": {"dtype": KV_DTYPES["trtllm"] if kv == "fp8" else "auto",
                            "free_gpu_memory_fraction": pool.memory_frac},
        # CUDA graphs for every decode batch up to the per-rank limit; padding rounds a batch up to a captured size.
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": pool.max_batch_per_rank},
    }
    _trtllm_engine_options(options, deployment)
    if pool.role != "aggregated":
        options["cache_transceiver_config"] = {"backend": TRANSFER[deployment["kv_transfer"]["backend"]][2],
                                               "max_tokens_in_buffer": pool.max_model_len}
    if pool.role == "prefill":
        options["disable_overlap_scheduler"] = True  # context servers run without it in TRT-LLM's disagg examples
    return options


def engine_options(deployment: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """(CUDA graphs on, speculative decoding or None) of a plan entry; absent ``engine_options``: the defaults."""
    options = deployment.get("engine_options") or {}
    return bool(options.get("cuda_graphs", True)), options.get("speculative")


def _draft_path(spec: dict[str, Any]) -> str:
    """The draft model or EAGLE head the engine loads (a placeholder word for an EAGLE head the plan leaves open)."""
    return str(spec.get("draft_model") or EAGLE_HEAD_PLACEHOLDER)


def _vllm_options(deployment: dict[str, Any]) -> list[Word]:
    """The --enforce-eager and --speculative-config flags of vLLM (vllm/config/speculative.py fields)."""
    graphs, spec = engine_options(deployment)
    flags: list[Word] = [] if graphs else ["--enforce-eager"]
    if spec is not None:
        config: dict[str, Any] = {"method": SPECULATIVE[spec["method"]][0],
                                  "num_speculative_tokens": int(spec["num_tokens"])}
        if spec["method"] != "mtp":
            config["model"] = _draft_path(spec)
        flags += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return flags


def _sglang_options(deployment: dict[str, Any]) -> list[Word]:
    """SGLang's --disable-decode-cuda-graph (the 0.5.23 spelling; --disable-cuda-graph is deprecated) and its
    speculative flags: N steps of top-1 drafts, N + 1 tokens verified."""
    graphs, spec = engine_options(deployment)
    flags: list[Word] = [] if graphs else ["--disable-decode-cuda-graph"]
    if spec is not None:
        n = int(spec["num_tokens"])
        flags += ["--speculative-algorithm", SPECULATIVE[spec["method"]][1]]
        if spec["method"] != "mtp":
            flags += ["--speculative-draft-model-path", _draft_path(spec)]
        flags += ["--speculative-num-steps", str(n), "--speculative-eagle-topk", "1",
                  "--speculative-num-draft-tokens", str(n + 1)]
    return flags


def _trtllm_engine_options(options: dict[str, Any], deployment: dict[str, Any]) -> None:
    """TRT-LLM's ``cuda_graph_config: null`` (no CUDA graphs) and ``speculative_config`` into ``options``."""
    graphs, spec = engine_options(deployment)
    if not graphs:
        options["cuda_graph_config"] = None
    if spec is None:
        return
    n = int(spec["num_tokens"])
    kind = SPECULATIVE[spec["method"]][2]
    options["speculative_config"] = {"decoding_type": kind, "num_nextn_predict_layers": n} if kind == "MTP" else \
        {"decoding_type": kind, "max_draft_len": n, "speculative_model": _draft_path(spec)}


def _quant_flags(engine: str, deployment: dict[str, Any]) -> list[Word]:
    quant = deployment["quantization"]
    flags: list[Word] = []
    if quant["weights"] in _ONLINE_QUANT:
        flags += ["--quantization", _ONLINE_QUANT[quant["weights"]]]
    if quant["kv_cache_dtype"] == "fp8":
        flags += ["--kv-cache-dtype", KV_DTYPES[engine]]
    return flags


def _join(word: Word, suffix: str) -> Word:
    """``word`` followed by a literal suffix (host:port)."""
    if isinstance(word, str):
        return word + suffix
    return (word[0] + suffix, word[1] + suffix)
