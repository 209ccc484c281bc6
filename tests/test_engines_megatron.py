"""Megatron-core 0.16.1 accepts (and rejects) what the Megatron-LM export emits.

The wheel ships megatron/core only, not Megatron-LM's argparse (megatron/training/arguments.py),
so the emitted command line is read back here with FLAGS, a table of exactly the flags the
exporter may emit, each with the destination and type arguments.py gives it (NVIDIA/Megatron-LM,
core_v0.16 era). An emitted flag outside the table fails the test. The values then go through
what Megatron does with them: the checks of ``validate_args`` that TransformerConfig does not
repeat (cited below), ``core_transformer_config_from_args``' translation into
``TransformerConfig`` / ``MLATransformerConfig`` (whose ``__post_init__`` validates), the
DDP and optimizer configs, ``RankGenerator`` and the micro-batch calculator.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
import subprocess
from typing import Any
from unittest import mock

import pytest
from export_factory import captured_argv, engine_module, files_of, make_export_plan

from paraplan.exporters.megatron import megatron_program
from paraplan.exporters.plan_input import ExportPlan
from paraplan.planner.layout import axis_groups, expert_map

pytestmark = pytest.mark.engines
engine_module("megatron.core")

import torch  # noqa: E402 - after engine_module's importorskip
import torch.nn.functional as F  # noqa: E402 - after engine_module's importorskip
from megatron.core.distributed import DistributedDataParallelConfig  # noqa: E402 - after engine_module's importorskip
from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator  # noqa: E402 - after engine_module's importorskip
from megatron.core.optimizer import OptimizerConfig  # noqa: E402 - after engine_module's importorskip
from megatron.core.parallel_state import RankGenerator  # noqa: E402 - after engine_module's importorskip
from megatron.core.transformer import MLATransformerConfig, TransformerConfig  # noqa: E402 - after engine_module's importorskip
from megatron.core.transformer.enums import AttnBackend, LayerType  # noqa: E402 - after engine_module's importorskip

TRUE, FALSE, NARGS = "store_true", "store_false", "nargs+"


def _moe_freq(text: str) -> int | list[int]:
    """arguments.py moe_freq_type: an int, or a list expression of digits , [ ] ( ) + * only."""
    if "[" not in text:
        return int(text)
    if re.search(r"[^,\d\[\]\(\)\+\*]", text):
        raise ValueError(f"Invalid pattern: {text}")
    return eval(text)


def _choice(*choices: str):
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"invalid choice {text!r} (choose from {choices})")
        return text
    return parse


# flag -> (dest, type or store action), as megatron/training/arguments.py declares them.
FLAGS: dict[str, tuple[str, Any]] = {
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", int),
    "--pipeline-model-parallel-size": ("pipeline_model_parallel_size", int),
    "--context-parallel-size": ("context_parallel_size", int),
    "--cp-comm-type": ("cp_comm_type", NARGS, _choice("p2p", "a2a", "all_gather", "a2a+p2p")),
    "--hierarchical-context-parallel-sizes": ("hierarchical_context_parallel_sizes", NARGS, int),
    "--overlap-moe-expert-parallel-comm": ("overlap_moe_expert_parallel_comm", TRUE),
    "--moe-expert-capacity-factor": ("moe_expert_capacity_factor", float),
    "--moe-pad-expert-input-to-capacity": ("moe_pad_expert_input_to_capacity", TRUE),
    "--expert-model-parallel-size": ("expert_model_parallel_size", int),
    "--expert-tensor-parallel-size": ("expert_tensor_parallel_size", int),
    "--num-layers-per-virtual-pipeline-stage": ("num_layers_per_virtual_pipeline_stage", int),
    "--decoder-first-pipeline-num-layers": ("decoder_first_pipeline_num_layers", int),
    "--decoder-last-pipeline-num-layers": ("decoder_last_pipeline_num_layers", int),
    "--account-for-embedding-in-pipeline-split": ("account_for_embedding_in_pipeline_split", TRUE),
    "--account-for-loss-in-pipeline-split": ("account_for_loss_in_pipeline_split", TRUE),
    "--pipeline-model-parallel-layout": ("pipeline_model_parallel_layout", str),
    "--sequence-parallel": ("sequence_parallel", TRUE),
    "--tp-comm-overlap": ("tp_comm_overlap", TRUE),
    "--use-distributed-optimizer": ("use_distributed_optimizer", TRUE),
    "--overlap-grad-reduce": ("overlap_grad_reduce", TRUE),
    "--overlap-param-gather": ("overlap_param_gather", TRUE),
    "--use-megatron-fsdp": ("use_megatron_fsdp", TRUE),
    "--data-parallel-sharding-strategy": ("data_parallel_sharding_strategy",
                                          _choice("no_shard", "optim", "optim_grads", "optim_grads_params")),
    "--no-gradient-accumulation-fusion": ("gradient_accumulation_fusion", FALSE),
    "--ckpt-format": ("ckpt_format", _choice("torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor")),
    "--num-layers": ("num_layers", int), "--hidden-size": ("hidden_size", int),
    "--ffn-hidden-size": ("ffn_hidden_size", int), "--num-attention-heads": ("num_attention_heads", int),
    "--kv-channels": ("kv_channels", int), "--group-query-attention": ("group_query_attention", TRUE),
    "--num-query-groups": ("num_query_groups", int), "--seq-length": ("seq_length", int),
    "--max-position-embeddings": ("max_position_embeddings", int),
    "--position-embedding-type": ("position_embedding_type",
                                  _choice("learned_absolute", "rope", "mrope", "relative", "none")),
    "--normalization": ("normalization", _choice("LayerNorm", "RMSNorm")),
    "--swiglu": ("swiglu", TRUE),
    "--untie-embeddings-and-output-weights": ("untie_embeddings_and_output_weights", TRUE),
    "--disable-bias-linear": ("add_bias_linear", FALSE), "--add-qkv-bias": ("add_qkv_bias", TRUE),
    "--qk-layernorm": ("qk_layernorm", TRUE), "--attention-dropout": ("attention_dropout", float),
    "--hidden-dropout": ("hidden_dropout", float),
    "--num-experts": ("num_experts", int), "--moe-router-topk": ("moe_router_topk", int),
    "--moe-ffn-hidden-size": ("moe_ffn_hidden_size", int),
    "--moe-shared-expert-intermediate-size": ("moe_shared_expert_intermediate_size", int),
    "--moe-layer-freq": ("moe_layer_freq", _moe_freq),
    "--moe-token-dispatcher-type": ("moe_token_dispatcher_type", _choice("allgather", "alltoall", "flex")),
    "--moe-flex-dispatcher-backend": ("moe_flex_dispatcher_backend", _choice("deepep", "hybridep")),
    "--moe-router-num-groups": ("moe_router_num_groups", int),
    "--moe-router-group-topk": ("moe_router_group_topk", int),
    "--moe-grouped-gemm": ("moe_grouped_gemm", TRUE),
    # TransformerConfig.use_transformer_engine_op_fuser as ArgumentGroupFactory spells it in arguments.py from
    # Megatron-LM core_r0.18 (d0b3b77, cd4afff: Megatron-Bridge v0.5.0 / v0.6.0); megatron-core 0.16.1's
    # TransformerConfig has no such field, so transformer_config() leaves it out here.
    "--use-transformer-engine-op-fuser": ("use_transformer_engine_op_fuser", TRUE),
    "--multi-latent-attention": ("multi_latent_attention", TRUE), "--q-lora-rank": ("q_lora_rank", int),
    "--kv-lora-rank": ("kv_lora_rank", int), "--qk-head-dim": ("qk_head_dim", int),
    "--qk-pos-emb-head-dim": ("qk_pos_emb_head_dim", int), "--v-head-dim": ("v_head_dim", int),
    "--mtp-num-layers": ("mtp_num_layers", int),
    "--micro-batch-size": ("micro_batch_size", int), "--global-batch-size": ("global_batch_size", int),
    "--recompute-granularity": ("recompute_granularity", _choice("full", "selective")),
    "--recompute-method": ("recompute_method", _choice("uniform", "block")),
    "--recompute-num-layers": ("recompute_num_layers", int),
    "--recompute-modules": ("recompute_modules", "nargs*", str),
    "--cpu-offloading-num-layers": ("cpu_offloading_num_layers", int),
    "--bf16": ("bf16", TRUE), "--grad-reduce-in-bf16": ("grad_reduce_in_bf16", TRUE),
    "--fp8-format": ("fp8", _choice("e4m3", "hybrid")),
    "--fp8-recipe": ("fp8_recipe", _choice("tensorwise", "delayed", "mxfp8", "blockwise", "custom")),
    "--fp8-param-gather": ("fp8_param_gather", TRUE), "--fp4-format": ("fp4", _choice("e2m1")),
    "--fp4-recipe": ("fp4_recipe", _choice("nvfp4", "custom")), "--fp4-param-gather": ("fp4_param", TRUE),
    "--attention-backend": ("attention_backend", lambda text: AttnBackend[text]),
    "--mock-data": ("mock_data", TRUE), "--tokenizer-type": ("tokenizer_type", _choice("NullTokenizer")),
    "--vocab-size": ("vocab_size", int), "--make-vocab-size-divisible-by": ("make_vocab_size_divisible_by", int),
    "--split": ("split", str), "--train-iters": ("train_iters", int), "--lr": ("lr", float),
    "--min-lr": ("min_lr", float), "--lr-decay-style": ("lr_decay_style", _choice("constant", "linear", "cosine")),
    "--lr-warmup-iters": ("lr_warmup_iters", int), "--weight-decay": ("weight_decay", float),
    "--clip-grad": ("clip_grad", float), "--log-interval": ("log_interval", int),
}


def parse_megatron_args(argv: list[str]) -> dict[str, Any]:
    """argv -> {dest: value} as argparse would; ValueError for an unknown flag or a bad value."""
    args: dict[str, Any] = {}
    position = 0
    while position < len(argv):
        flag = argv[position]
        if flag not in FLAGS:
            raise ValueError(f"unrecognized arguments: {flag}")
        dest, kind, *element = FLAGS[flag]
        if kind in (NARGS, "nargs*"):  # nargs='+' / '*': every word up to the next flag
            end = next((i for i in range(position + 1, len(argv)) if argv[i].startswith("--")), len(argv))
            if end == position + 1 and kind == NARGS:
                raise ValueError(f"{flag}: expected at least one argument")
            args[dest] = [element[0](word) for word in argv[position + 1:end]]
            position = end
            continue
        args[dest] = True if kind == TRUE else False if kind == FALSE else kind(argv[position + 1])
        position += 1 if kind in (TRUE, FALSE) else 2
    return args


def virtual_stages(a: dict[str, Any]) -> int | None:
    """validate_args' virtual-pipeline size and its divisibility asserts (arguments.py)."""
    pp = a["pipeline_model_parallel_size"]
    if "pipeline_model_parallel_layout" in a:  # the layout string fixes the chunks; '|' separates them
        chunks_per_rank = (a["pipeline_model_parallel_layout"].count("|") + 1) // pp
        return chunks_per_rank if chunks_per_rank > 1 else None
    layers = a["num_layers"] + a.get("account_for_embedding_in_pipeline_split", False) \
        + a.get("account_for_loss_in_pipeline_split", False)
    per_chunk = a.get("num_layers_per_virtual_pipeline_stage")
    if per_chunk is None:
        if "decoder_first_pipeline_num_layers" not in a:
            assert layers % pp == 0, "Number of layers should be divisible by the pipeline-model-parallel size"
        return None
    assert "decoder_first_pipeline_num_layers" not in a, "please use --num-virtual-stages-per-pipeline-rank"
    assert layers % pp == 0, "number of layers of the model must be divisible pipeline model parallel size"
    assert layers // pp % per_chunk == 0, "number of layers per pipeline stage must be divisible ..."
    assert pp > 2, "When interleaved schedule is used and p2p communication overlap is disabled, pp > 2"
    return layers // pp // per_chunk if layers // pp // per_chunk > 1 else None


def validate_args(a: dict[str, Any], world_size: int) -> int:
    """The validate_args checks TransformerConfig does not repeat; returns the data-parallel size."""
    model = a["tensor_model_parallel_size"] * a["pipeline_model_parallel_size"] * a["context_parallel_size"]
    assert world_size % model == 0, f"world size ({world_size}) is not divisible by total_model_size ({model})"
    if a["context_parallel_size"] > 1:
        assert a["seq_length"] % (2 * a["context_parallel_size"]) == 0, "seq-length % (2 * cp)"
    assert a["max_position_embeddings"] >= a["seq_length"]
    if a.get("cp_comm_type") == ["a2a+p2p"]:
        sizes = a.get("hierarchical_context_parallel_sizes")
        assert sizes is not None and math.prod(sizes) == a["context_parallel_size"], \
            "hierarchical_context_parallel_sizes must multiply to context_parallel_size"
    if a.get("expert_model_parallel_size", 1) > 1:
        assert a["num_experts"] % a["expert_model_parallel_size"] == 0, "experts % expert model parallel size"
    if a.get("recompute_granularity") == "selective":
        assert "recompute_method" not in a, "recompute method is not yet supported for selective recomputing"
    if a.get("overlap_param_gather"):
        assert a.get("use_distributed_optimizer") or a.get("use_megatron_fsdp")
        assert a.get("overlap_grad_reduce"), "Must use --overlap-param-gather with --overlap-grad-reduce"
    if a.get("use_megatron_fsdp"):
        assert a.get("ckpt_format") == "fsdp_dtensor", "Megatron FSDP only supports fsdp_dtensor checkpoint format"
    if a.get("fp8_param_gather"):
        assert a.get("use_distributed_optimizer") or a.get("use_megatron_fsdp")
    return world_size // model


def transformer_config(a: dict[str, Any]) -> TransformerConfig:
    """core_transformer_config_from_args: the dataclass fields by name plus its translations."""
    cls = MLATransformerConfig if a.get("multi_latent_attention") else TransformerConfig
    kw = {f.name: a[f.name] for f in dataclasses.fields(cls) if f.name in a}
    add_bias = a.get("add_bias_linear", True)
    kw.update(
        expert_tensor_parallel_size=a.get("expert_tensor_parallel_size", a["tensor_model_parallel_size"]),
        virtual_pipeline_model_parallel_size=virtual_stages(a), num_moe_experts=a.get("num_experts"),
        num_layers_in_first_pipeline_stage=a.get("decoder_first_pipeline_num_layers"),
        num_layers_in_last_pipeline_stage=a.get("decoder_last_pipeline_num_layers"),
        num_query_groups=a["num_query_groups"] if a.get("group_query_attention") else None,
        add_qkv_bias=True if add_bias else a.get("add_qkv_bias", False), add_bias_linear=add_bias,
        pipeline_dtype=torch.bfloat16 if a.get("bf16") else torch.float32,
        params_dtype=torch.bfloat16 if a.get("bf16") else torch.float32,
        fp8_param=a.get("fp8_param_gather", False), cpu_offloading=a.get("cpu_offloading_num_layers", 0) > 0,
        # bias_swiglu_fusion defaults on; validate_args turns bias_gelu_fusion off without linear biases.
        bias_activation_fusion=True if a.get("swiglu") else add_bias,
        # arguments.py keeps a one-element --cp-comm-type list as its single string (all layers alike).
        cp_comm_type=a["cp_comm_type"][0] if len(a.get("cp_comm_type", [])) == 1 else a.get("cp_comm_type"),
    )
    if a.get("swiglu"):
        kw.update(activation_func=F.silu, gated_linear_unit=True)
    return cls(**kw)


def checked_config(plan: ExportPlan, argv: list[str]) -> tuple[dict[str, Any], TransformerConfig, int]:
    """Parse, validate and build everything Megatron builds from the emitted arguments.

    Transformer Engine does not install without CUDA; TransformerConfig's MoE + fp8 check asks for
    TE >= 1.11, so it is told a TE of that age is present, as it is on any GPU image that runs fp8.
    """
    a = parse_megatron_args(argv)
    dp = validate_args(a, plan.num_gpus)
    with mock.patch("megatron.core.transformer.transformer_config.is_te_min_version", lambda *_, **__: True):
        config = transformer_config(a)
    DistributedDataParallelConfig(use_distributed_optimizer=a.get("use_distributed_optimizer", False),
                                  overlap_grad_reduce=a.get("overlap_grad_reduce", False),
                                  overlap_param_gather=a.get("overlap_param_gather", False),
                                  use_megatron_fsdp=a.get("use_megatron_fsdp", False),
                                  data_parallel_sharding_strategy=a.get("data_parallel_sharding_strategy", "no_shard"))
    OptimizerConfig(optimizer="adam", lr=a["lr"], min_lr=a["min_lr"], weight_decay=a["weight_decay"],
                    clip_grad=a["clip_grad"], bf16=a.get("bf16", False),
                    use_distributed_optimizer=a.get("use_distributed_optimizer", False))
    return a, config, dp


PLANS = {
    "llama70b-tp8-pp4-vpp5-cp2-sp-zero1-full": {
        "model": "llama-3.1-70b", "tp": 8, "pp": 4, "vpp": 5, "cp": 2, "dp": 2, "sp": True, "zero": 1,
        "recompute": "full", "global_batch": 64, "seq_len": 8192},
    # NeMo's Llama 3 70B H100 recipe: TP 4 with userbuffers TP communication overlap.
    "llama70b-tp4-pp4-tp-comm-overlap": {"model": "llama-3.1-70b", "tp": 4, "pp": 4, "vpp": 5, "dp": 2, "sp": True,
                                         "zero": 1, "tp_overlap": True, "global_batch": 64, "seq_len": 8192},
    "llama8b-fsdp-tp2-offload": {"model": "llama-3.1-8b", "tp": 2, "dp": 8, "sp": True, "zero": 3, "offload": 12,
                                 "mbs": 2},
    "llama8b-fp8-selective": {"model": "llama-3.1-8b", "tp": 4, "dp": 4, "zero": 1, "recompute": "selective",
                              "precision": "fp8"},
    "gpt3-175b-tp8-pp8-bias-dropout": {"model": "gpt3-175b", "tp": 8, "pp": 8, "dp": 2, "sp": True, "zero": 1,
                                       "global_batch": 64, "seq_len": 2048, "recompute": "selective"},
    "mixtral-ep4-tp2-fp8": {"model": "mixtral-8x7b", "tp": 2, "dp": 4, "ep": 4, "sp": True, "zero": 1,
                            "precision": "fp8"},
    "qwen3-30b-a3b-ep8-qknorm": {"model": "qwen3-30b-a3b", "tp": 2, "pp": 2, "dp": 4, "ep": 8, "sp": True, "zero": 1},
    # Megatron-Bridge's cutedsl_fused_grouped_mlp recipes: the experts' MLP under Transformer Engine's op fuser.
    "qwen3-30b-a3b-ep8-fused-experts": {"model": "qwen3-30b-a3b", "dp": 8, "ep": 8, "zero": 1,
                                        "fused_expert_mlp": True},
    "deepseek-v3-mla-pp3-uneven": {"model": "deepseek-v3", "pp": 3, "dp": 8, "ep": 8, "zero": 1, "global_batch": 48},
    "deepseek-v3-mla-pp3-vpp3-edges": {"model": "deepseek-v3", "pp": 3, "vpp": 3, "dp": 8, "ep": 8, "zero": 1,
                                       "global_batch": 48, "recompute": "full"},
    "deepseek-v3-pp4-vpp4-layout": {"model": "deepseek-v3", "pp": 4, "vpp": 4, "dp": 8, "ep": 8, "zero": 1,
                                    "global_batch": 64},
    "llama8b-fp4-fsdp": {"model": "llama-3.1-8b", "tp": 1, "dp": 8, "zero": 3, "precision": "fp4"},
    "qwen2-style-qkv-bias": {"model": "llama-3.1-8b", "shape": {"qkv_bias": True}, "tp": 4, "dp": 2, "sp": True},
    "llama70b-tp8-cp4-ulysses": {"model": "llama-3.1-70b", "tp": 2, "cp": 4, "dp": 2, "sp": True, "zero": 1,
                                 "cp_comm": "a2a", "seq_len": 32768, "global_batch": 8},
    "llama8b-cp16-a2a+p2p": {"model": "llama-3.1-8b", "cp": 16, "zero": 1, "cp_comm": "a2a+p2p", "seq_len": 65536,
                             "global_batch": 8},
    "llama8b-tp2-cp4-allgather": {"model": "llama-3.1-8b", "tp": 2, "cp": 4, "sp": True, "cp_comm": "allgather",
                                  "seq_len": 32768, "global_batch": 8},
    "mixtral-ep8-capacity-1.25": {"model": "mixtral-8x7b", "dp": 8, "ep": 8, "zero": 1, "capacity_factor": 1.25},
    "deepseek-v3-pp4-vpp4-modules-recompute": {"model": "deepseek-v3", "pp": 4, "vpp": 4, "dp": 8, "ep": 8, "zero": 1,
                                               "global_batch": 64, "recompute": "modules", "precision": "fp8"},
    "llama8b-modules-recompute": {"model": "llama-3.1-8b", "tp": 2, "dp": 4, "sp": True, "zero": 1,
                                  "recompute": "modules"},
    # What 'paraplan plan llama-3.1-405b --gpus 16384' picks: 126 + 2 over 128 chunks, both edge chunks empty.
    "llama405b-pp16-vpp8-empty-edges": {"model": "llama-3.1-405b", "tp": 8, "pp": 16, "vpp": 8, "dp": 1,
                                        "sp": True, "zero": 1, "global_batch": 32, "seq_len": 8192},
    # DeepSeek-V3's 61 layers over pp 16 x vpp 2: 32 chunks of 2, the last holds MTP and the loss alone.
    "deepseek-v3-pp16-vpp2-loss-only": {"model": "deepseek-v3", "pp": 16, "vpp": 2, "dp": 8, "ep": 8, "zero": 1,
                                        "global_batch": 128},
    # A typed pipeline on mixed GPUs: middle stages of different sizes, written as a layout string.
    "llama8b-pp4-typed-split": {"model": "llama-3.1-8b", "pp": 4, "dp": 2, "split": [7, 9, 10, 6]},
    "deepseek-v3-pp4-vpp4-ep-overlap": {"model": "deepseek-v3", "pp": 4, "vpp": 4, "dp": 8, "ep": 8, "zero": 1,
                                        "global_batch": 64, "ep_overlap": True},
    # DeepSeek-V3's recipe: node-limited routing (8 groups, 4 per token) dispatched by DeepEP.
    "deepseek-v3-ep16-deepep": {"model": "deepseek-v3", "pp": 4, "dp": 16, "ep": 16, "zero": 1,
                                "global_batch": 64, "precision": "fp8", "dispatcher": "deepep"},
}


def plan_named(name: str) -> ExportPlan:
    settings = dict(PLANS[name])
    return make_export_plan(settings.pop("model"), **settings)


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_core_builds_the_emitted_configuration(name):
    plan = plan_named(name)
    program = megatron_program(plan)
    a, config, dp = checked_config(plan, program.argv())
    c, model = plan.config, plan.model
    assert dp == c.dp
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.context_parallel_size,
            config.sequence_parallel) == (c.tp, c.pp, c.cp, c.sp and c.tp > 1)
    assert (config.virtual_pipeline_model_parallel_size or 1) == c.vpp
    if c.cp > 1:  # Transformer Engine's names for the variant the plan priced
        assert config.cp_comm_type == {"allgather": "all_gather"}.get(c.cp_comm, c.cp_comm)
    if c.cp_comm == "a2a+p2p":  # all-to-all inside one 8-GPU NVLink domain, the ring across domains
        assert config.hierarchical_context_parallel_sizes == [8 // c.tp, c.cp * c.tp // 8]
    assert config.overlap_moe_expert_parallel_comm == c.ep_overlap
    assert config.moe_expert_capacity_factor == plan.capacity_factor
    assert config.moe_pad_expert_input_to_capacity == (plan.capacity_factor is not None)
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size, config.num_attention_heads) == (
        model.num_layers, model.hidden_size, model.ffn_size, model.num_heads)
    assert config.gated_linear_unit == model.gated_mlp
    assert (config.add_bias_linear, config.add_qkv_bias) == (model.linear_bias, model.qkv_bias or model.linear_bias)
    assert (config.attention_dropout == 0.0) == (not model.dropout)
    # megatron/training/tokenizer _vocab_size_with_padding rounds up to divisor · tp: the plan's vocabulary
    # stays exact whenever tp divides it (GPT-3's odd 50257 has to be padded).
    multiple = a["make_vocab_size_divisible_by"] * c.tp
    padded = -(-a["vocab_size"] // multiple) * multiple
    assert padded == model.vocab_size if model.vocab_size % c.tp == 0 else padded - model.vocab_size < multiple
    assert config.num_query_groups == (model.num_kv_heads if not model.is_mla else config.num_attention_heads)
    if model.is_moe:
        assert (config.num_moe_experts, config.moe_router_topk, config.expert_model_parallel_size,
                config.expert_tensor_parallel_size) == (model.num_experts, model.experts_per_token, c.ep, c.etp)
        pattern = config.moe_layer_freq
        flags = pattern if isinstance(pattern, list) else [int(i % pattern == 0) for i in range(model.num_layers)]
        assert [i for i, flag in enumerate(flags) if flag] == list(model.moe_layers)
        assert (config.moe_router_num_groups, config.moe_router_group_topk) == (
            (model.expert_groups, model.groups_per_token) if model.expert_groups else (None, None))
        deepep = plan.dispatcher == "deepep" and c.ep > 1
        assert config.moe_token_dispatcher_type == ("flex" if deepep else "alltoall" if c.ep > 1 else "allgather")
        assert not deepep or config.moe_flex_dispatcher_backend == "deepep"
    if model.is_mla:
        assert isinstance(config, MLATransformerConfig)
        assert (config.kv_lora_rank, config.q_lora_rank, config.qk_head_dim, config.qk_pos_emb_head_dim) == (
            model.kv_lora_rank, model.q_lora_rank or None, model.qk_nope_head_dim, model.qk_rope_head_dim)
    assert config.recompute_granularity == {"none": None, "selective": "selective", "full": "full",
                                            "modules": "selective"}[c.recompute]
    if c.recompute == "modules":  # the cheap set the cost model prices, as far as the model has the modules
        expected = ({"layernorm"} | ({"mla_up_proj"} if model.is_mla else set())
                    | ({"moe_act"} if model.is_moe else set()))
        assert set(config.recompute_modules) == expected
    assert (config.cpu_offloading, config.cpu_offloading_num_layers) == (c.offload > 0, c.offload)
    assert config.fp8 == ("hybrid" if plan.precision == "fp8" else None)
    assert config.fp4 == ("e2m1" if plan.precision == "fp4" else None)
    calculator = ConstantNumMicroBatchesCalculator(global_batch_size=a["global_batch_size"],
                                                   micro_batch_size=a["micro_batch_size"], data_parallel_size=dp,
                                                   decrease_batch_size_if_needed=False, rank=0)
    assert calculator.get() == plan.num_microbatches


@pytest.mark.parametrize("name", ["deepseek-v3-mla-pp3-uneven", "deepseek-v3-mla-pp3-vpp3-edges",
                                  "deepseek-v3-pp4-vpp4-layout", "llama405b-pp16-vpp8-empty-edges",
                                  "deepseek-v3-pp16-vpp2-loss-only", "llama8b-pp4-typed-split",
                                  "llama70b-tp8-pp4-vpp5-cp2-sp-zero1-full"])
def test_megatron_splits_layers_as_the_plan_says(name):
    """Megatron-core's own layer count per (pipeline rank, virtual stage) equals the plan's stage_layers."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    plan = plan_named(name)
    _, config, _ = checked_config(plan, megatron_program(plan).argv())
    pp, vpp = plan.config.pp, plan.config.vpp
    layout = config.pipeline_model_parallel_layout  # set when the split needs a layout string
    # An edge chunk without decoder layers is spelled out (E or L alone), as Megatron's recipes write it.
    assert layout is not None or min(plan.stage_layers) > 0
    built = []
    for chunk in range(vpp):
        for stage in range(pp):
            vp_stage = chunk if vpp > 1 else None
            built.append(get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=stage) if layout is None
                         else layout.layout[stage][chunk].count(LayerType.decoder))  # [pp rank][virtual stage]
    assert built == list(plan.stage_layers)


@pytest.mark.parametrize("name", list(PLANS))
def test_rank_generator_forms_the_plans_groups(name):
    plan = plan_named(name)
    c = plan.config
    rows = list(plan.ranks)
    generator = RankGenerator(tp=c.tp, ep=1, dp=c.dp, pp=c.pp, cp=c.cp, order="tp-cp-ep-dp-pp")
    for axis in ("tp", "cp", "dp", "pp"):
        assert sorted(generator.get_ranks(axis)) == axis_groups(rows, axis), axis
    if plan.model.is_moe:
        mapping = expert_map(num_experts=plan.model.num_experts, moe_layers=list(plan.model.moe_layers), ep=c.ep,
                             etp=c.etp, world_size=plan.num_gpus, pp=c.pp)
        experts = RankGenerator(tp=c.etp, ep=c.ep, dp=mapping["expert_dp"], pp=c.pp, cp=1, order="tp-cp-ep-dp-pp")
        assert sorted(experts.get_ranks("ep")) == mapping["ep_groups"]


def test_the_launch_script_passes_exactly_the_program(tmp_path):
    plan = plan_named("deepseek-v3-mla-pp3-uneven")
    files = files_of(plan, "megatron")
    script = tmp_path / "megatron_launch.sh"
    script.write_text(files["megatron_launch.sh"].text)
    argv = captured_argv(script, "torchrun", tmp_path, env={"NODE_RANK": "2", "MASTER_ADDR": "head"})
    assert argv[:10] == ["--nnodes", "3", "--nproc-per-node", "8", "--node-rank", "2", "--master-addr", "head",
                         "--master-port", "29500"]
    assert argv[10] == "pretrain_gpt.py" and argv[11:] == megatron_program(plan).argv()
    checked_config(plan, argv[11:])


# -- the same path rejects wrong values ---------------------------------------------------------
def _argv_with(argv: list[str], flag: str, value: str) -> list[str]:
    changed = list(argv)
    changed[changed.index(flag) + 1] = value
    return changed


def test_megatron_rejects_heads_that_tp_does_not_divide():
    plan = plan_named("llama8b-fp8-selective")
    with pytest.raises(ValueError, match=r"num_attention_heads \(30\) must be a multiple of"):
        checked_config(plan, _argv_with(megatron_program(plan).argv(), "--num-attention-heads", "30"))


def test_megatron_rejects_an_uneven_split_that_does_not_add_up():
    plan = plan_named("deepseek-v3-mla-pp3-uneven")
    argv = _argv_with(megatron_program(plan).argv(), "--decoder-first-pipeline-num-layers", "0")
    with pytest.raises(ValueError, match="num_layers_in_first_pipeline_stage must be larger than 0"):
        checked_config(plan, argv)
    argv = _argv_with(megatron_program(plan).argv(), "--num-layers", "62")  # 62 - 20 - 20 = 22 = 1 middle stage
    _, _config, _ = checked_config(plan, argv)
    with pytest.raises(ValueError, match="divisible"):  # two middle stages cannot share 23 layers
        checked_config(plan_named("deepseek-v3-mla-pp3-uneven"),
                       _argv_with(_argv_with(argv, "--pipeline-model-parallel-size", "4"), "--num-layers", "63"))


def test_megatron_rejects_offload_with_pipeline_parallelism():
    plan = make_export_plan("llama-3.1-8b", tp=2, pp=2, dp=4)
    argv = megatron_program(plan).argv()
    checked_config(plan, argv)
    with pytest.raises(ValueError, match="Pipeline parallelism with CPU offloading"):
        checked_config(plan, [*argv, "--cpu-offloading-num-layers", "4"])


def test_microbatch_calculator_rejects_a_batch_dp_does_not_divide():
    with pytest.raises(AssertionError, match="not divisible by micro batch size"):
        ConstantNumMicroBatchesCalculator(global_batch_size=102, micro_batch_size=1, data_parallel_size=4,
                                          decrease_batch_size_if_needed=False, rank=0)


def test_rank_generator_disagrees_with_a_swapped_layout():
    plan = plan_named("llama70b-tp8-pp4-vpp5-cp2-sp-zero1-full")
    c = plan.config
    swapped = [dict(row, tp=row["cp"], cp=row["tp"]) for row in plan.ranks]  # cp innermost instead of tp
    generator = RankGenerator(tp=c.tp, ep=1, dp=c.dp, pp=c.pp, cp=c.cp, order="tp-cp-ep-dp-pp")
    assert sorted(generator.get_ranks("tp")) != axis_groups(swapped, "tp")


def test_unknown_or_misspelled_flags_fail_the_table():
    with pytest.raises(ValueError, match="unrecognized arguments: --tensor-parallel-size"):
        parse_megatron_args(["--tensor-parallel-size", "2"])
    with pytest.raises(ValueError, match="invalid choice"):
        parse_megatron_args(["--normalization", "rmsnorm"])


def test_every_table_flag_is_emitted_by_some_plan():
    """The table holds no flag the exporter never writes (so it cannot hide stale names)."""
    emitted = {word for name in PLANS for word in megatron_program(plan_named(name)).argv() if word.startswith("--")}
    assert set(FLAGS) - emitted == set()


def test_bash_reads_the_script_as_written(tmp_path):
    script = tmp_path / "m.sh"
    script.write_text(files_of(plan_named("mixtral-ep4-tp2-fp8"), "megatron")["megatron_launch.sh"].text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script.read_text()
    assert shlex.quote("([1]*32)") not in script.read_text()  # every layer of Mixtral is MoE: no pattern
