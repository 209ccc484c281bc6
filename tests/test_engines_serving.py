"""vLLM 0.33.0, SGLang 0.5.23 and sglang-router 0.3.2 parse the commands serve.sh starts, into the plan's sharding.

Their argument parsers import on CPU (vLLM with VLLM_TARGET_DEVICE=cpu), but the packages are not in the
validate extra (vLLM and SGLang pull CUDA builds of torch): .ci/run installs them with ``pip install --no-deps
--target DIR`` and names DIR in PARAPLAN_SERVING_ENGINES; without them these tests skip. TensorRT-LLM has
no CPU wheel; its flags are checked against FLAG_SOURCES in test_serving_export.py.
"""

from __future__ import annotations

import os

import pytest
from export_factory import serving_engine_module
from serving_factory import captured, deepseek_disagg, dense_pp, llama_agg, write

from paraplan.exporters.serving import serving_files

pytestmark = pytest.mark.engines


def _commands(tmp_path, doc: dict, engine: str, nodes: int) -> list[list[str]]:
    folder = write(tmp_path, serving_files(doc, 0, engine))
    hosts = " ".join(f"n{i}" for i in range(nodes))
    return [argv for node in range(nodes) for argv in captured(folder, node, hosts)]


@pytest.mark.parametrize(("make", "nodes"), [(llama_agg, 1), (deepseek_disagg, 3), (dense_pp, 2)])
def test_sglang_parses_to_the_plan_sharding(tmp_path, make, nodes):
    serving_engine_module("sglang.srt.server_args")
    serving_engine_module("sglang_router.launch_router")
    from sglang.srt.runtime_context import derive_parallel_widths
    from sglang.srt.server_args import prepare_server_args
    from sglang_router.launch_router import parse_router_args

    doc = make("sglang")
    pools = {p["role"]: p for p in doc["plans"][0]["pools"]}
    for argv in _commands(tmp_path, doc, "sglang", nodes):
        if argv[2] == "sglang_router.launch_router":
            router = parse_router_args(argv[3:])
            assert router.port == 8000 and (router.pd_disaggregation or len(router.worker_urls) == 2)
            continue
        args = prepare_server_args(argv[3:])
        plan = pools[args.disaggregation_mode if args.disaggregation_mode != "null" else "aggregated"]
        widths = derive_parallel_widths(tp_size=args.tp_size, attn_cp_size=1, attn_dp_size=args.attn_dp_size,
                                        moe_ep_size=args.ep_size, moe_dp_size=1, dcp_size=1, dcp_enabled=False)
        assert (widths["attn_tp_size"], widths["attn_dp_size"], widths["moe_ep_size"], widths["moe_tp_size"]) == \
            (plan["tp"], plan["dp_attention"], plan["moe_ep"], plan["moe_tp"])
        assert (args.pp_size, args.max_running_requests, args.chunked_prefill_size, args.mem_fraction_static) == \
            (plan["pp"], plan["max_batch"], plan["max_batched_tokens"], plan["memory_frac"])


@pytest.mark.parametrize(("make", "nodes"), [(llama_agg, 1), (deepseek_disagg, 3), (dense_pp, 2)])
def test_vllm_parses_to_the_plan_sharding(tmp_path, make, nodes):
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the parser's defaults probe the platform
    serving_engine_module("vllm.entrypoints.common.cli_args")
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    doc = make("vllm")
    pools = doc["plans"][0]["pools"]
    parser = make_arg_parser(FlexibleArgumentParser())
    for argv in _commands(tmp_path, doc, "vllm", nodes):
        args = parser.parse_args(argv[2:])
        role = {"kv_producer": "prefill", "kv_consumer": "decode"}.get(
            getattr(args.kv_transfer_config, "kv_role", None), "aggregated")
        plan = next(p for p in pools if p["role"] == role)
        dp = args.data_parallel_size
        assert (args.tensor_parallel_size, args.pipeline_parallel_size, dp) == (plan["tp"], plan["pp"],
                                                                                plan["dp_attention"])
        # vLLM's MoE: EP = TP x DP with --enable-expert-parallel, else TP x DP as MoE TP
        assert (args.tensor_parallel_size * dp if args.enable_expert_parallel else 1) == plan["moe_ep"]
        assert args.max_num_seqs * dp == plan["max_batch"] and args.gpu_memory_utilization == plan["memory_frac"]
        assert args.model_tag == doc["model"]["hf_repo"]


def _with_options(doc: dict, method: str, draft: str | None) -> dict:
    """``doc`` with memory fraction 0.75, CUDA graphs off and ``method`` speculative decoding of 2 draft tokens
    (issue 32 item 4)."""
    for pool in doc["plans"][0]["pools"]:
        pool["memory_frac"] = 0.75
    doc["plans"][0]["engine_options"] = {"cuda_graphs": False, "speculative": {
        "method": method, "num_tokens": 2, "acceptance_frac": 0.7, "draft_model": draft,
        "expected_tokens_per_step": 2.19}}
    return doc


@pytest.mark.parametrize(("method", "draft"), [("mtp", None), ("eagle", "org/eagle-head"), ("draft", "org/small")])
def test_vllm_parses_the_engine_options(tmp_path, method, draft):
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    serving_engine_module("vllm.entrypoints.common.cli_args")
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    for argv in _commands(tmp_path, _with_options(llama_agg("vllm"), method, draft), "vllm", 1):
        args = parser.parse_args(argv[2:])
        assert args.enforce_eager is True and args.gpu_memory_utilization == 0.75
        expected = {"method": {"mtp": "mtp", "eagle": "eagle", "draft": "draft_model"}[method],
                    "num_speculative_tokens": 2, **({"model": draft} if draft else {})}
        assert args.speculative_config == expected


@pytest.mark.parametrize(("method", "draft"), [("mtp", None), ("eagle", "org/eagle-head"), ("draft", "org/small")])
def test_sglang_parses_the_engine_options(tmp_path, method, draft):
    serving_engine_module("sglang.srt.server_args")
    from sglang.srt.server_args import prepare_server_args

    for argv in _commands(tmp_path, _with_options(llama_agg("sglang"), method, draft), "sglang", 1):
        if argv[2] == "sglang_router.launch_router":
            continue
        args = prepare_server_args(argv[3:])
        assert args.disable_decode_cuda_graph is True and args.mem_fraction_static == 0.75
        assert (args.speculative_algorithm, args.speculative_num_steps, args.speculative_eagle_topk,
                args.speculative_num_draft_tokens, args.speculative_draft_model_path) == \
            ({"mtp": "NEXTN", "eagle": "EAGLE", "draft": "STANDALONE"}[method], 2, 1, 3, draft)
