"""Megatron-LM (``pretrain_gpt.py``): the arguments a plan implies.

Every flag is spelled as ``megatron/training/arguments.py`` defines it in Megatron-LM core_v0.16
(the release megatron-core 0.16.1 ships; the main branch keeps these names). Values the plan does not
decide (data, tokenizer, learning rate) sit in separate, clearly marked groups.
"""

from __future__ import annotations

import itertools

from paraplan.choices import MEGATRON_CP_COMM_TYPES
from paraplan.cost_models.context_parallel import hierarchical_inner_size
from paraplan.errors import InputError
from paraplan.exporters.plan_input import ExportPlan
from paraplan.exporters.program import Arg, ArgGroup, Program
from paraplan.model_specs.model_spec import ModelSpec

_RECOMPUTE: dict[str, tuple[Arg, ...]] = {
    "none": (),
    # Default --recompute-modules is core_attn: Korthikanti et al.'s selective recompute.
    "selective": (("--recompute-granularity", "selective"),),
    # Every layer, one layer per checkpoint: what the cost model prices as "full".
    "full": (("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", "1")),
}
_NORM = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
_POSITION = {"rope": "rope", "learned": "learned_absolute"}
# Megatron-Bridge's fp8 and fp4 performance recipes: hybrid E4M3/E5M2 with per-tensor current scaling unless the
# plan names another --fp8-recipe, NVFP4 with its default recipe; gradients reduced in bf16
# (cost_models/recipes.py MEGATRON_LOW_PRECISION).
_LOW_PRECISION: dict[str, tuple[Arg, ...]] = {
    "bf16": (),
    "fp8": (("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise")),
    "fp4": (("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")),
}
_PARAM_GATHER = {"fp8": "--fp8-param-gather", "fp4": "--fp4-param-gather"}


def megatron_program(plan: ExportPlan) -> Program:
    """The pretrain_gpt.py invocation of ``plan``."""
    if plan.engine != "megatron":
        raise InputError(f"the plan was made for {plan.engine}, not megatron: its predictions and rules are that "
                         "engine's; re-plan with --engine megatron to export Megatron-LM arguments")
    model = plan.model
    if model.position == "alibi":
        raise InputError(f"Megatron-LM has no ALiBi position embedding, which model {model.name} uses")
    if plan.fused_expert_mlp and plan.config.etp > 1:
        # TEGroupedMLP._is_fused_impl_supported: no tensor parallelism inside the experts (its expt_tp group).
        raise InputError(f"the plan fuses the expert MLP at etp = {plan.config.etp}; Megatron's fused grouped MLP "
                         "runs expert tensor parallelism 1 only: re-plan with --fused-expert-mlp (which keeps etp 1)")
    groups = (
        ArgGroup(name="PARALLEL_ARGS", comment="Parallel layout (from the plan)", args=parallel_args(plan)),
        ArgGroup(name="MODEL_ARGS", comment=f"Model shape of {model.name} (from the plan)",
                 args=model_args(model, plan.seq_len) + moe_args(model, plan) + mla_args(model)),
        ArgGroup(name="BATCH_ARGS", comment="Batch and memory (from the plan)",
                 args=batch_args(plan) + recompute_args(plan) + offload_args(plan)),
        ArgGroup(name="PRECISION_ARGS", comment=f"{plan.precision} GEMMs, {plan.attention} attention (from the plan)",
                 args=precision_args(plan)),
        ArgGroup(name="DATA_ARGS", comment="Data and tokenizer: NOT from the plan; mock data until you set yours",
                 args=data_args(model, plan.config.tp)),
        ArgGroup(name="TRAINING_ARGS", comment="Schedule and optimizer: NOT from the plan; set your own",
                 args=(("--train-iters", "1000"), ("--lr", "3.0e-4"), ("--min-lr", "3.0e-5"),
                       ("--lr-decay-style", "cosine"), ("--lr-warmup-iters", "100"), ("--weight-decay", "0.1"),
                       ("--clip-grad", "1.0"), ("--log-interval", "10"))),
    )
    return Program(engine="megatron", entry=("pretrain_gpt.py",),
                   entry_comment="Megatron-LM's GPT pretraining script (run from a Megatron-LM checkout, or set "
                                 "TRAIN_SCRIPT)",
                   groups=groups, env=environment(plan), notes=unexpressed(model))


def parallel_args(plan: ExportPlan) -> tuple[Arg, ...]:
    """TP/PP/CP/EP degrees, virtual stages, uneven first/last stages, SP and the data-parallel mode."""
    c = plan.config
    args: list[Arg] = [("--tensor-model-parallel-size", str(c.tp)), ("--pipeline-model-parallel-size", str(c.pp)),
                       ("--context-parallel-size", str(c.cp))]
    args += context_parallel_args(plan)
    if plan.model.is_moe:
        # ETP must be explicit: Megatron defaults it to the dense TP degree, not to 1.
        args += [("--expert-model-parallel-size", str(c.ep)), ("--expert-tensor-parallel-size", str(c.etp))]
    args += pipeline_split_args(plan)
    if c.sp and c.tp > 1:
        args.append(("--sequence-parallel", None))
    if c.tp_overlap:  # userbuffers: TP collectives pipelined under their GEMMs, as the plan priced
        args.append(("--tp-comm-overlap", None))
    return tuple(args + data_parallel_args(plan))


def context_parallel_args(plan: ExportPlan) -> list[Arg]:
    """How CP moves K and V; the hierarchical variant names its NVLink all-to-all group and the ring
    across groups (innermost first, as parallel_state.create_hierarchical_groups takes them)."""
    c = plan.config
    if c.cp == 1:
        return []
    args: list[Arg] = [("--cp-comm-type", MEGATRON_CP_COMM_TYPES[c.cp_comm])]
    if c.cp_comm == "a2a+p2p":
        inner = int(hierarchical_inner_size(plan.model, c.tp, c.cp, plan.domain_gpus))
        args.append(("--hierarchical-context-parallel-sizes", (str(inner), str(c.cp // inner))))
    return args


def pipeline_split_args(plan: ExportPlan) -> list[Arg]:
    """Virtual stages and uneven stages, as stage_layers lays the layers out."""
    c, layers = plan.config, plan.stage_layers
    even = len(set(layers)) == 1
    edge_accounted = len(set(layers[1:-1])) <= 1 and layers[0] == layers[-1] == max(layers) - 1
    args: list[Arg] = []
    unequal_middle = len(set(layers[1:-1])) > 1
    if not even and ((c.vpp > 1 and (not edge_accounted or min(layers) == 0)) or (c.vpp == 1 and unequal_middle)):
        # Explicit edge chunks, an edge chunk with the embedding or the loss alone, or middle stages of
        # different sizes (a typed pipeline on mixed GPUs): the layout string says so literally instead of
        # leaving it to --account-for-*'s arithmetic or the first/last-stage flags.
        return [("--pipeline-model-parallel-layout", layout_string(layers, plan.model.mtp_layers))]
    if not even and c.vpp == 1:
        # One chunk per rank: name the first and last stage explicitly.
        args += [("--decoder-first-pipeline-num-layers", str(layers[0])),
                 ("--decoder-last-pipeline-num-layers", str(layers[-1]))]
    elif not even:
        # With virtual stages only the first and last chunk are short, which Megatron expresses by
        # counting the embedding and the loss as one layer each.
        args += [("--account-for-embedding-in-pipeline-split", None), ("--account-for-loss-in-pipeline-split", None)]
    if c.vpp > 1:
        args.append(("--num-layers-per-virtual-pipeline-stage", str(max(layers))))
    return args


def layout_string(layers: tuple[int, ...], mtp_layers: int) -> str:
    """Megatron's --pipeline-model-parallel-layout: one '|'-separated chunk per virtual stage in model
    order (E embedding, t decoder layer, m MTP layer, L loss); an edge chunk may be E or L alone. Runs of
    equal middle chunks are written (t…t|)*n, which PipelineParallelLayerLayout.parse_str_to_list unrolls
    (its own example: "Ettt|(tt|)*29,m|L")."""
    middle: list[list[int]] = []
    for count in layers[1:-1]:
        if middle and middle[-1][0] == count:
            middle[-1][1] += 1
        else:
            middle.append([count, 1])
    runs = "".join(f"({'t' * count}|)*{repeat}" if repeat > 1 else f"{'t' * count}|" for count, repeat in middle)
    return f"E{'t' * layers[0]}|{runs}{'t' * layers[-1]}{'m' * mtp_layers}L"


def data_parallel_args(plan: ExportPlan) -> list[Arg]:
    """ZeRO stage as Megatron names it, with the overlaps the cost model assumes."""
    c = plan.config
    overlap = c.dp * c.cp > 1  # priced as hidden under backward (grads) and the next forward (params)
    if c.zero == 3:
        fsdp: list[Arg] = [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", "optim_grads_params"),
                           ("--use-distributed-optimizer", None), ("--no-gradient-accumulation-fusion", None),
                           ("--ckpt-format", "fsdp_dtensor")]
        return fsdp + ([("--overlap-grad-reduce", None), ("--overlap-param-gather", None)] if overlap else [])
    args: list[Arg] = [("--use-distributed-optimizer", None)] if c.zero == 1 else []
    if overlap:
        args.append(("--overlap-grad-reduce", None))
        if c.zero == 1:
            args.append(("--overlap-param-gather", None))
    return args


def model_args(model: ModelSpec, seq_len: int) -> tuple[Arg, ...]:
    """Layers, widths, heads (GQA), MLP kind, norm, positions, biases, dropout, sequence length."""
    args: list[Arg] = [("--num-layers", str(model.num_layers)), ("--hidden-size", str(model.hidden_size)),
                       ("--ffn-hidden-size", str(model.ffn_size)),
                       ("--num-attention-heads", str(model.num_heads))]
    if not model.is_mla:
        args.append(("--kv-channels", str(model.head_dim)))
        if model.num_kv_heads != model.num_heads:
            args += [("--group-query-attention", None), ("--num-query-groups", str(model.num_kv_heads))]
    args += [("--seq-length", str(seq_len)), ("--max-position-embeddings", str(max(model.max_positions, seq_len))),
             ("--position-embedding-type", _POSITION[model.position]), ("--normalization", _NORM[model.norm])]
    flags = {"--swiglu": model.gated_mlp, "--untie-embeddings-and-output-weights": not model.tied_embeddings,
             "--disable-bias-linear": not model.linear_bias, "--add-qkv-bias": model.qkv_bias and not model.linear_bias,
             "--qk-layernorm": model.qk_norm}
    args += [(flag, None) for flag, wanted in flags.items() if wanted]
    if not model.dropout:
        args += [("--attention-dropout", "0.0"), ("--hidden-dropout", "0.0")]  # Megatron's default is 0.1
    return tuple(args)


def moe_args(model: ModelSpec, plan: ExportPlan) -> tuple[Arg, ...]:
    """Experts, top-k, expert width, shared expert and which layers are MoE."""
    if not model.is_moe:
        return ()
    args: list[Arg] = [("--num-experts", str(model.num_experts)), ("--moe-router-topk", str(model.experts_per_token)),
                       ("--moe-ffn-hidden-size", str(model.expert_ffn_size))]
    if model.shared_expert_ffn_size:
        args.append(("--moe-shared-expert-intermediate-size", str(model.shared_expert_ffn_size)))
    if model.num_moe_layers != model.num_layers:
        args.append(("--moe-layer-freq", layer_pattern(model.num_layers, model.moe_layers)))
    if model.expert_groups:
        # Group-limited routing as the model was trained (DeepSeek-V3: 8 groups, 4 per token; node-limited
        # when the groups line up with the nodes of the EP group).
        args += [("--moe-router-num-groups", str(model.expert_groups)),
                 ("--moe-router-group-topk", str(model.groups_per_token))]
    # all-to-all dispatch is what Megatron recommends with EP; grouped GEMMs run the local experts. The
    # deepep dispatcher is Megatron's flex dispatcher with the DeepEP backend.
    if plan.config.ep > 1 and plan.dispatcher == "deepep":
        args += [("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", "deepep")]
    else:
        args.append(("--moe-token-dispatcher-type", "alltoall" if plan.config.ep > 1 else "allgather"))
    args.append(("--moe-grouped-gemm", None))
    if plan.capacity_factor is not None:
        # Token dropping as the plan priced it: experts padded to capacity (static shapes, no host sync).
        args += [("--moe-expert-capacity-factor", f"{plan.capacity_factor:g}"),
                 ("--moe-pad-expert-input-to-capacity", None)]
    if plan.config.ep_overlap:
        # Combined 1F1B: one micro-batch's dispatch/combine under another's compute (what the plan priced).
        args.append(("--overlap-moe-expert-parallel-comm", None))
    if plan.fused_expert_mlp:
        # The routed experts as one Transformer Engine op-fuser block (TEGroupedMLP._fused_forward): the
        # TransformerConfig field use_transformer_engine_op_fuser, which arguments.py turns into this flag
        # (ArgumentGroupFactory) from Megatron-LM core_r0.18 on (the commits Megatron-Bridge v0.5.0 / v0.6.0 pin).
        args.append(("--use-transformer-engine-op-fuser", None))
    return tuple(args)


def layer_pattern(num_layers: int, moe_layers: tuple[int, ...]) -> str:
    """Megatron's --moe-layer-freq list expression, run-length coded: ``([0]*3+[1]*58)``."""
    flags = [int(index in moe_layers) for index in range(num_layers)]
    runs = [(flag, len(list(group))) for flag, group in itertools.groupby(flags)]
    return "(" + "+".join(f"[{flag}]*{count}" for flag, count in runs) + ")"


def mla_args(model: ModelSpec) -> tuple[Arg, ...]:
    """Multi-head latent attention ranks and head widths, and multi-token prediction."""
    args: list[Arg] = []
    if model.is_mla:
        args.append(("--multi-latent-attention", None))
        if model.q_lora_rank:
            args.append(("--q-lora-rank", str(model.q_lora_rank)))
        args += [("--kv-lora-rank", str(model.kv_lora_rank)), ("--qk-head-dim", str(model.qk_nope_head_dim)),
                 ("--qk-pos-emb-head-dim", str(model.qk_rope_head_dim)), ("--v-head-dim", str(model.v_head_dim))]
    if model.mtp_layers:
        args.append(("--mtp-num-layers", str(model.mtp_layers)))
    return tuple(args)


def batch_args(plan: ExportPlan) -> tuple[Arg, ...]:
    """Micro-batch and global batch, in sequences."""
    return (("--micro-batch-size", str(plan.config.mbs)), ("--global-batch-size", str(plan.global_batch)))


def recompute_args(plan: ExportPlan) -> tuple[Arg, ...]:
    """Recompute as the plan priced it. ``modules`` is cost_models.table's cheap set (layernorm, mla_up_proj,
    moe_act): selective granularity with exactly the modules the model has, since megatron-core 0.16.1's
    TransformerConfig refuses mla_up_proj without MLA and moe_act without grouped GEMMs (which MoE exports
    always turn on)."""
    if plan.config.recompute != "modules":
        return _RECOMPUTE[plan.config.recompute]
    return (("--recompute-granularity", "selective"), ("--recompute-modules", recompute_modules(plan.model)))


def recompute_modules(model: ModelSpec) -> tuple[str, ...]:
    """Megatron's --recompute-modules names of the ``modules`` set that exist in ``model``."""
    return ("layernorm",) + (("mla_up_proj",) if model.is_mla else ()) + (("moe_act",) if model.is_moe else ())


def offload_args(plan: ExportPlan) -> tuple[Arg, ...]:
    """Activation offload: validate_args turns on cpu_offloading when the layer count is positive."""
    return (("--cpu-offloading-num-layers", str(plan.config.offload)),) if plan.config.offload else ()


def precision_args(plan: ExportPlan) -> tuple[Arg, ...]:
    """bf16 everywhere, fp8/fp4 GEMMs through Transformer Engine, and the attention backend."""
    args: list[Arg] = [("--bf16", None), *_LOW_PRECISION[plan.precision]]
    if plan.precision == "fp8":  # the recipe the plan was priced with (cost_models/fp8_recipes.py)
        args = [(flag, plan.fp8_recipe if flag == "--fp8-recipe" else value) for flag, value in args]
    if plan.precision != "bf16":
        args.append(("--grad-reduce-in-bf16", None))
        if plan.config.zero >= 1:  # fp8/fp4 primary weights need the distributed optimizer or FSDP
            args.append((_PARAM_GATHER[plan.precision], None))
    args.append(("--attention-backend", plan.attention))
    return tuple(args)


def data_args(model: ModelSpec, tp: int) -> tuple[Arg, ...]:
    """Mock data with a null tokenizer of the model's vocabulary, padded no further than TP needs."""
    return (("--mock-data", None), ("--tokenizer-type", "NullTokenizer"), ("--vocab-size", str(model.vocab_size)),
            ("--make-vocab-size-divisible-by", str(vocab_divisor(model.vocab_size, tp))), ("--split", "99,1,0"))


def vocab_divisor(vocab_size: int, tp: int) -> int:
    """The largest power of two <= 128 (Megatron's default) with vocab % (divisor · tp) == 0.

    Megatron pads the vocabulary to a multiple of divisor · tp; this keeps the planned model's exact
    vocabulary whenever TP divides it (128256 with tp = 8 pads to 129024 under the default 128).
    """
    if vocab_size % tp:
        return 128
    divisor = 128
    while (vocab_size // tp) % divisor:
        divisor //= 2
    return divisor


def environment(plan: ExportPlan) -> tuple[tuple[str, str, str], ...]:
    """CUDA_DEVICE_MAX_CONNECTIONS=1 where Megatron's validate_args demands it; NVTE_CUTEDSL_FUSED_GROUPED_MLP=1
    for a fused expert MLP."""
    c = plan.config
    env: list[tuple[str, str, str]] = []
    if (c.tp > 1 or c.cp > 1) and c.zero != 3:
        env.append(("CUDA_DEVICE_MAX_CONNECTIONS", "1",
                    "Megatron asserts it for TP or CP > 1 before Blackwell (keeps TP/CP collectives in launch order)"))
    if plan.fused_expert_mlp:
        env.append(("NVTE_CUTEDSL_FUSED_GROUPED_MLP", "1",
                    "Transformer Engine's CuTe DSL grouped MLP for --use-transformer-engine-op-fuser's GLU "
                    "experts (Megatron-Bridge's cutedsl_fused_grouped_mlp sets it; at the Megatron-LM commit "
                    "Bridge v0.6.0 pins, TEGroupedMLP asserts without it)"))
    return tuple(env)


def unexpressed(model: ModelSpec) -> tuple[str, ...]:
    """Model features these arguments leave at Megatron's defaults."""
    notes = [("rotary base and scaling, norm epsilon and initialisation are not in the plan: Megatron defaults "
             "apply; add --rotary-base / --use-rope-scaling / --norm-epsilon as your checkpoint needs")]
    if model.linear_bias and not model.qkv_bias:
        notes.append("the MLP has biases but Q/K/V do not; Megatron ties QKV biases to --add-bias-linear")
    if model.has_out_bias != model.linear_bias:
        notes.append("the attention output projection's bias differs from the MLP's; Megatron ties them")
    if model.parallel_attn_mlp:
        notes.append("parallel attention + MLP residual (GPT-NeoX) has no Megatron-core flag")
    if model.sliding_layers or model.attention_sinks:
        notes.append("sliding-window layers and attention sinks are not expressed (--window-size, --softmax-type)")
    if model.is_moe and (model.router_bias or model.expert_bias or model.shared_expert_gate):
        notes.append("router/expert biases and the shared-expert gate are not expressed; check the moe-router flags")
    notes += [note for present, note in _family_traits(model) if present]
    return tuple(notes)


def _family_traits(model: ModelSpec) -> tuple[tuple[bool, str], ...]:
    """Traits of newer model families that pretrain_gpt.py's arguments cannot state (their layer specs live in
    model code: NeMo / Megatron-Bridge providers), each with what the launch would build instead."""
    return (
        (model.norms_per_layer > 2, (f"{model.norms_per_layer} norms per layer (post-norms): these arguments "
                                     "build pre-norm layers only; use the family's Megatron-Bridge provider")),
        (model.norms_per_layer == 1, "one norm shared by attention and MLP: these arguments build two"),
        (model.post_norm_only, "norms after attention and the MLP (OLMo 2 style): these arguments build pre-norms"),
        (not model.norm_weight, "non-parametric norms (no scale): Megatron's norms carry a weight"),
        (model.qk_norm and model.qk_norm_width != "head",
         "QK norms over the full query/key width: --qk-layernorm normalises each head"),
        (model.qk_norm_bias, "QK norms with biases are not expressed"),
        (model.embedding_norm, "the norm after the token embedding is not expressed"),
        (not model.final_norm, "the model has no final norm; Megatron adds one"),
        (model.output_bias, "the output projection's bias is not expressed"),
        (model.window_kind == "chunked" and model.sliding_layers > 0,
         "chunked attention (Llama 4) is not expressed; --window-size would slide instead"),
        (model.attention_output_gate, "the gated attention output is not expressed"),
    )
