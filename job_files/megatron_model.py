"""A ModelSpec from Megatron-LM's model arguments (``--num-layers --hidden-size ... --swiglu``).

The arguments become a Hugging Face style config dict (``num_hidden_layers``, ``intermediate_size``,
``num_key_value_heads`` ...) fed to ``cost_models.hf_config.model_from_config`` with model_type llama
(mixtral for MoE, deepseek_v3 for MLA); what Megatron states explicitly and a Hugging Face family fixes
(normalization, gated MLP, biases, positions, tied embeddings, MoE layer pattern) is then set from the
arguments. Megatron's own defaults apply to what is left out (``megatron/training/arguments.py``):
LayerNorm, learned absolute positions, biases on, tied embeddings, dropout 0.1, FFN 4h (SwiGLU: 8h/3
rounded down to a multiple of 64), KV channels h/heads, vocabulary padded to a multiple of
``make_vocab_size_divisible_by`` x TP.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from paraplan.errors import InputError
from paraplan.files import one_line, shown
from paraplan.job_files.megatron_values import Args
from paraplan.limits import MAX_HEADS, MAX_LAYERS, MAX_WIDTH
from paraplan.model_specs.hf_config import load_model, model_from_config, preset_names
from paraplan.model_specs.model_spec import ModelSpec

_MAX_FREQ_CHARS = 100_000
"""Characters of a --moe-layer-freq list read: a 10,000-layer list of ``1,`` fits in 20,000."""
GPT2_BPE_VOCAB = 50257
"""Megatron's GPT2BPETokenizer: GPT-2's 50,257-token vocabulary (vocab.json), padded as any other."""


def megatron_model(args: Args, name: str) -> ModelSpec:
    """The transformer ``args`` (Megatron's arguments) describe; InputError when a shape argument is missing."""
    for required in ("num_layers", "hidden_size", "num_attention_heads"):
        if not args.has(required):
            raise InputError(f"{args.facts.path}: no {args.spell(required)}; the file states no model shape (give "
                             "MODEL as a preset or a config.json)")
    for required in ("num_layers", "hidden_size", "num_attention_heads"):
        _check_size(args, required, MAX_HEADS if required == "num_attention_heads" else
                    MAX_LAYERS if required == "num_layers" else MAX_WIDTH)
    hidden, heads = args.given_int("hidden_size"), args.given_int("num_attention_heads")
    gated = args.flag("swiglu")
    ffn = args.int("ffn_hidden_size") or (int(4 * hidden * 2 / 3 / 64) * 64 if gated else 4 * hidden)
    kv_heads = args.int("num_query_groups") if args.flag("group_query_attention") else heads
    moe = args.int("num_experts") or 0
    mla = args.flag("multi_latent_attention")
    config: dict[str, Any] = {
        "model_type": "deepseek_v3" if mla else "mixtral" if moe else "llama",
        "num_hidden_layers": args.int("num_layers"), "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads or heads, "intermediate_size": ffn, "vocab_size": vocab_size(args),
        "head_dim": args.int("kv_channels") or hidden // heads,
        "max_position_embeddings": args.int("max_position_embeddings") or args.int("seq_length") or 2048}
    if moe:
        config.update(num_local_experts=moe, n_routed_experts=moe, num_experts_per_tok=args.int("moe_router_topk") or 2,
                      moe_intermediate_size=args.int("moe_ffn_hidden_size") or ffn)
    if mla:
        config.update(q_lora_rank=args.int("q_lora_rank"), kv_lora_rank=args.int("kv_lora_rank") or 512,
                      qk_nope_head_dim=args.int("qk_head_dim") or 128,
                      qk_rope_head_dim=args.int("qk_pos_emb_head_dim") or 64, v_head_dim=args.int("v_head_dim") or 128)
    spec = model_from_config(config, name)
    return _as_stated(spec, args, moe)


def _check_size(args: Args, name: str, maximum: int) -> None:
    """InputError unless the shape argument ``name`` is an integer from 1 to ``maximum`` (0 heads or layers
    divides by zero later; a 1,000-digit one sizes nothing)."""
    value = args.given_int(name)
    if not 1 <= value <= maximum:
        raise InputError(f"{args.where(name)}: {args.spell(name)} expects an integer from 1 to {maximum:,}, "
                         f"got {shown(value)}")


def vocab_size(args: Args) -> int:
    """The vocabulary Megatron builds: the padded size a log reports, else --vocab-size (or GPT-2 BPE's) padded
    to a multiple of make_vocab_size_divisible_by x tp, as megatron/training/tokenizer _vocab_size_with_padding."""
    if args.has("padded_vocab_size"):
        return args.given_int("padded_vocab_size")
    size = args.int("vocab_size")
    if size is None and (args.text("tokenizer_type") or "") == "GPT2BPETokenizer":
        size = GPT2_BPE_VOCAB
        args.facts.note(f"vocabulary: GPT2BPETokenizer's {GPT2_BPE_VOCAB} tokens ({args.where('tokenizer_type')})")
    if size is None:
        raise InputError(f"{args.facts.path}: no {args.spell('vocab_size')} (and no tokenizer with a known "
                         "vocabulary); add it, or give MODEL as a preset or a config.json")
    multiple = (args.int("make_vocab_size_divisible_by") or 128) * (args.int("tensor_model_parallel_size") or 1)
    return -(-size // multiple) * multiple


def _as_stated(spec: ModelSpec, args: Args, moe: int) -> ModelSpec:
    """Fields Megatron's flags decide, over the Hugging Face family's defaults."""
    bias = not args.flag("disable_bias_linear") if args.has("disable_bias_linear") else args.flag(
        "add_bias_linear", default=True)
    position = args.text("position_embedding_type") or "learned_absolute"
    norm = (args.text("normalization") or "LayerNorm").lower()
    # Megatron's --hidden-dropout and --attention-dropout default to 0.1.
    dropout = any((args.given_number(key) if args.has(key) else 0.1) > 0
                  for key in ("hidden_dropout", "attention_dropout"))
    fields: dict[str, Any] = {"gated_mlp": args.flag("swiglu"), "norm": "rmsnorm" if norm == "rmsnorm" else "layernorm",
              "norm_bias": norm != "rmsnorm", "linear_bias": bias, "out_bias": None,
              "qkv_bias": bias or args.flag("add_qkv_bias"), "qk_norm": args.flag("qk_layernorm"),
              "position": "rope" if position in ("rope", "yarn", "mrope") else "learned",
              "tied_embeddings": not args.flag("untie_embeddings_and_output_weights"), "dropout": dropout,
              "mtp_layers": args.int("mtp_num_layers") or 0}
    if moe:
        fields.update(moe_layers=moe_layers(args, spec.num_layers),
                      shared_expert_ffn_size=args.int("moe_shared_expert_intermediate_size") or 0,
                      expert_groups=args.int("moe_router_num_groups") or 0,
                      groups_per_token=args.int("moe_router_group_topk") or 0)
    try:
        return dataclasses.replace(spec, **fields)
    except ValueError as exc:
        raise InputError(f"{args.facts.path}: {exc}") from None


def moe_layers(args: Args, num_layers: int) -> tuple[int, ...]:
    """--moe-layer-freq: an integer N (every N-th layer) or a list expression like ``([0]*3+[1]*58)``."""
    text = (args.text("moe_layer_freq") or "1").strip()
    if re.fullmatch(r"[0-9]{1,18}", text) and int(text) > 0:
        step = int(text)
        return tuple(i for i in range(num_layers) if i % step == 0)
    flags: list[int] = []
    for part in re.findall(r"\[([^\]]*)\](?:\s*\*\s*([0-9]{1,18}))?", text[:_MAX_FREQ_CHARS]):
        items = [int(x) for x in re.findall(r"[0-9]{1,18}", part[0])]
        repeat = int(part[1] or 1)
        if len(flags) + len(items) * repeat > num_layers:  # never build a list longer than the model
            flags += [0] * (num_layers + 1 - len(flags))
            break
        flags += items * repeat
    if len(flags) != num_layers:
        raise InputError(f"{args.where('moe_layer_freq')}: {args.spell('moe_layer_freq')} {one_line(text, 60)} gives "
                         f"{len(flags) if len(flags) <= num_layers else 'more'} "
                         f"layers, not {num_layers}; write an integer or a list of {num_layers} 0/1 flags")
    return tuple(i for i, flag in enumerate(flags) if flag)


def matching_preset(spec: ModelSpec) -> str | None:
    """The shipped preset with exactly this architecture (model_type aside, and max_positions aside unless the
    positions are learned), or None."""
    for name in preset_names():
        preset = _plain_out_bias(load_model(name))
        ignore: dict[str, Any] = {"name": name, "model_type": preset.model_type}
        if spec.position != "learned":
            ignore["max_positions"] = preset.max_positions
        if dataclasses.replace(_plain_out_bias(spec), **ignore) == preset:
            return name
    return None


def _plain_out_bias(spec: ModelSpec) -> ModelSpec:
    """out_bias None where it equals linear_bias (Hugging Face families spell it out, Megatron ties them)."""
    return dataclasses.replace(spec, out_bias=None) if spec.has_out_bias == spec.linear_bias else spec
