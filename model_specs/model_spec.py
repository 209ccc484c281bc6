"""The transformer being trained: shapes, exact parameter counts and model FLOPs per token.

Dense and Mixture-of-Experts decoders. An MoE layer replaces the MLP with a router, ``num_experts``
routed experts (each a small MLP of width ``expert_ffn_size``, ``experts_per_token`` of them active
per token) and optionally an always-on shared-expert MLP; ``moe_layers`` lists which layers are MoE
(DeepSeek's ``first_k_dense_replace``, Qwen's ``decoder_sparse_step`` / ``mlp_only_layers``).
Multi-head latent attention (MLA, DeepSeek-V2/V3) replaces Q/K/V with low-rank projections.

Features whose parameters are counted exactly but whose time and memory the cost model does not price
(linear-attention / Gated DeltaNet layers, a sparse-attention indexer) are listed in
``unpriced_features``; the planner refuses such a model with that list instead of pricing it wrongly.
Their shapes ride along in ``mixers`` (:class:`MixerShapes`) for the serving model, which prices them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from paraplan.arrays import Column

LAYER_WEIGHT_MATRICES = 4
"""Weight matrices of a decoder layer as Megatron-style modules fuse them: QKV, output projection,
(gate+)up, down."""

NormKind = Literal["rmsnorm", "layernorm"]
PositionKind = Literal["rope", "learned", "alibi"]
AttentionFlops = Literal["full", "causal"]
QKNormWidth = Literal["head", "full"]
WindowKind = Literal["sliding", "chunked"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightFormat:
    """How a checkpoint stores its weights (its ``quantization_config`` or ``hf_quant_config.json``).
    Serving reads it for weight bytes; training ignores it: parameter counts stay the logical counts."""

    method: str
    """The quantizer that wrote it: fp8, mxfp4, compressed-tensors, modelopt, ..."""
    weight_format: str
    """Weight element format: float8_e4m3fn, mxfp4, nvfp4, int4, ..."""
    bits: float
    """Bits per quantized weight element, scales excluded (8, 4, ...)."""
    block_size: tuple[int, ...] = ()
    """Elements sharing one scale: (128, 128) for DeepSeek's fp8 blocks, (32,) for a group of 32; () = per tensor
    or channel, or not stated by the config (bitsandbytes)."""
    unquantized_modules: tuple[str, ...] = ()
    """Module names or patterns kept in the checkpoint's higher precision (as the config lists them)."""

    def to_json(self) -> dict[str, object]:
        """Plain JSON (lists for tuples), as a plan file stores it."""
        return {"method": self.method, "weight_format": self.weight_format, "bits": self.bits,
                "block_size": list(self.block_size), "unquantized_modules": list(self.unquantized_modules)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WeightFormat:
        """The inverse of :meth:`to_json` (TypeError on unknown or missing keys)."""
        return cls(**{**data, "block_size": tuple(data.get("block_size", ())),
                      "unquantized_modules": tuple(data.get("unquantized_modules", ()))})


CONV_STATE_BYTES = 2.0
"""The short-convolution state is kept in the activation dtype (bf16)."""
DELTA_RULE_FLOPS_PER_STATE_ELEMENT = 6.0
"""Chunked gated delta rule per token and value head: state update (2·d_k·d_v), output from the state
(2·d_k·d_v) and the intra-chunk attention and correction terms (about 2·d_k·d_v at chunk 64)."""
INDEX_KEY_SCALE_BYTES = 4.0
"""One fp32 scale per fp8 indexer key (DeepSeek-V3.2's indexer cache: 128 fp8 values + a 4-B scale)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MixerShapes:
    """Shapes of the linear-attention and sparse-attention-indexer mixers (all 0 when the model has none)."""

    linear_key_heads: int = 0
    """Gated DeltaNet query/key heads."""
    linear_value_heads: int = 0
    """Gated DeltaNet value heads (one recurrent state each)."""
    linear_key_dim: int = 0
    """Width of one Gated DeltaNet key head (d_k)."""
    linear_value_dim: int = 0
    """Width of one Gated DeltaNet value head (d_v)."""
    linear_conv_kernel: int = 0
    """Short-convolution kernel length."""
    state_bytes: float = 4.0
    """Bytes per recurrent-state element (``mamba_ssm_dtype``)."""
    index_heads: int = 0
    """Sparse-attention indexer heads."""
    index_head_dim: int = 0
    """Width of one indexer head (and of the cached indexer key)."""
    index_topk: int = 0
    """Keys each query attends to after the indexer's selection."""

    def linear_state_bytes(self, tp: Column) -> np.ndarray:
        """Recurrent and convolution state of one sequence in one linear-attention layer on one GPU (heads
        split over tp)."""
        tp = np.asarray(tp, dtype=float)
        recurrent = self.linear_value_heads * self.linear_key_dim * self.linear_value_dim * self.state_bytes
        channels = 2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim
        conv = channels * max(self.linear_conv_kernel - 1, 0) * CONV_STATE_BYTES
        return (recurrent + conv) / tp

    def linear_prefill_flops_per_token(self, tp: Column) -> np.ndarray:
        """Delta-rule FLOPs per prompt token per linear-attention layer on one GPU."""
        return DELTA_RULE_FLOPS_PER_STATE_ELEMENT * self.linear_value_heads * self.linear_key_dim \
            * self.linear_value_dim / np.asarray(tp, dtype=float)

    @property
    def index_key_bytes(self) -> float:
        """Indexer-cache bytes per token per layer (fp8 key and its scale)."""
        return self.index_head_dim + INDEX_KEY_SCALE_BYTES if self.index_topk else 0.0

    @property
    def index_flops_per_key(self) -> float:
        """Indexer FLOPs per (query, key) pair: a dot product per indexer head."""
        return 2.0 * self.index_heads * self.index_head_dim


NO_MIXERS = MixerShapes()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, dense or MoE. Counts are plain integers; no units beyond counts."""

    name: str
    """Preset name or the config file it came from."""
    model_type: str
    """Hugging Face ``model_type`` it was read from."""
    num_layers: int
    """Decoder layers."""
    hidden_size: int
    """Residual stream width h."""
    num_heads: int
    """Query heads a."""
    num_kv_heads: int
    """Key/value heads (GQA groups); equal to num_heads for multi-head attention."""
    head_dim: int
    """Width of one attention head (may differ from hidden_size / num_heads, as in Qwen3)."""
    ffn_size: int
    """MLP inner width f."""
    vocab_size: int
    """Vocabulary V."""
    gated_mlp: bool
    """SwiGLU-style MLP with three matrices (gate, up, down) instead of two."""
    tied_embeddings: bool
    """Output projection shares the input embedding matrix."""
    norm: NormKind
    """Normalisation layer kind."""
    norm_bias: bool
    """LayerNorm carries a bias vector."""
    qkv_bias: bool
    """Q, K, V projections carry biases."""
    linear_bias: bool
    """MLP matrices carry biases (and the attention output projection, unless ``out_bias`` says otherwise)."""
    qk_norm: bool
    """Per-head RMSNorm on queries and keys (Qwen3)."""
    position: PositionKind
    """Position encoding; ``learned`` adds a max_positions x h table."""
    max_positions: int
    """Maximum sequence length the config declares."""
    parallel_attn_mlp: bool = False
    """Attention and MLP read the same input (GPT-NeoX); one norm per branch either way."""
    dropout: bool = False
    """Training applies dropout after attention and MLP (stores 1-byte masks)."""
    out_bias: bool | None = None
    """Attention output projection carries a bias; None = same as ``linear_bias``."""
    # -- Mixture of Experts (all zero for a dense model) -----------------------------------------
    num_experts: int = 0
    """Routed experts per MoE layer."""
    experts_per_token: int = 0
    """Routed experts each token visits (top-k)."""
    expert_ffn_size: int = 0
    """Inner width of one routed expert's MLP."""
    shared_expert_ffn_size: int = 0
    """Inner width of the always-on shared-expert MLP of an MoE layer (all shared experts together)."""
    shared_expert_gate: bool = False
    """A sigmoid gate (h -> 1) scales the shared expert's output (Qwen2-MoE)."""
    router_bias: bool = False
    """The router carries a per-expert bias (GPT-OSS bias; DeepSeek-V3's e_score_correction_bias)."""
    expert_bias: bool = False
    """Expert MLP matrices carry biases (GPT-OSS)."""
    expert_glu_clamp: bool = False
    """The experts' GLU clamps its two inputs before the activation (GPT-OSS ``swiglu_limit``)."""
    moe_layers: tuple[int, ...] = ()
    """Indices (0-based) of the MoE layers; every other layer has a dense MLP of ``ffn_size``."""
    expert_groups: int = 0
    """Group-limited routing (DeepSeek-V2/V3 ``n_group``): the experts form this many equal groups, in
    expert order; 0 = no groups."""
    groups_per_token: int = 0
    """Groups each token's experts may come from (``topk_group``): with groups aligned to nodes this is
    DeepSeek-V3's node-limited routing (each token to at most M nodes); 0 = no limit."""
    # -- Multi-head latent attention (kv_lora_rank > 0) -------------------------------------------
    q_lora_rank: int = 0
    """Rank of the query down-projection; 0 projects queries directly from the hidden state."""
    kv_lora_rank: int = 0
    """Rank of the joint key/value latent; > 0 means MLA."""
    qk_rope_head_dim: int = 0
    """Per-head query/key width carrying rotary position (the key part shared by all heads)."""
    qk_nope_head_dim: int = 0
    """Per-head query/key width without position."""
    v_head_dim: int = 0
    """Per-head value width."""
    # -- other ---------------------------------------------------------------------------------
    mtp_layers: int = 0
    """Multi-token-prediction modules after the main stack (DeepSeek-V3); each adds one layer."""
    sliding_window: int = 0
    """Attention window of the sliding-window layers (0 = none)."""
    sliding_layers: int = 0
    """How many layers attend within ``sliding_window`` only."""
    attention_sinks: bool = False
    """One learned sink logit per head (GPT-OSS)."""
    # -- family traits config.json does not state (model_families.py) -------------------------
    norm_weight: bool = True
    """Norms carry a scale vector (OLMo's LayerNorm has neither scale nor bias)."""
    norms_per_layer: int = 2
    """Norms over the residual width in one decoder layer: 2 (pre-attention, pre-MLP), 4 with Gemma 2/3's
    and GLM-4's post-norms, 1 where attention and MLP share one input norm (Cohere, GPT-J, Falcon-7B)."""
    post_norm_only: bool = False
    """The two norms of a layer follow attention and the MLP (OLMo 2/3, FlexOlmo, EXAONE 4) rather than
    precede them; the same parameters and element-wise bytes, a different graph for an exporter to state."""
    qk_norm_width: QKNormWidth = "head"
    """With ``qk_norm``: one head_dim-wide norm shared by all heads (Qwen3, Gemma 3), or one weight per
    channel of all query and key heads (OLMo 2, MiniMax-M2, Cohere's per-head LayerNorm)."""
    qk_norm_bias: bool = False
    """The query/key norms carry biases (Phi's LayerNorm)."""
    embedding_norm: bool = False
    """A norm right after the token embedding (BLOOM's word_embeddings_layernorm)."""
    final_norm: bool = True
    """A norm before the output projection."""
    output_bias: bool = False
    """The output projection carries a bias (Phi, GPT-J)."""
    position_offset: int = 0
    """Learned-position rows beyond max_positions (OPT keeps 2)."""
    attention_output_gate: bool = False
    """The query projection also emits a sigmoid gate on the attention output (Qwen3-Next), doubling its width."""
    window_kind: WindowKind = "sliding"
    """What bounds attention in the ``sliding_layers``: a sliding window, or Llama 4's chunks (each query
    sees at most ``sliding_window`` keys: priced as a sliding window, an upper bound)."""
    linear_attention_layers: int = 0
    """Layers whose token mixer is linear attention / a state-space block instead of softmax attention."""
    linear_attention_params: int = 0
    """Parameters of one such linear-attention mixer (replacing ``attention_params`` in those layers)."""
    indexer_params: int = 0
    """Parameters of one layer's sparse-attention indexer (DeepSeek-V3.2, GLM-5), inside its attention."""
    mixers: MixerShapes = NO_MIXERS
    """Shapes of the linear-attention and indexer mixers, which serving prices (``mixers.mixer_shapes`` reads
    them from config.json); training does not, so a plan file's ``model.shape`` leaves them out."""
    unpriced_features: tuple[str, ...] = ()
    """Features counted in the parameters whose time and memory the cost model does not price; planning
    refuses a model that has any."""
    weights: WeightFormat | None = None
    """The checkpoint's weight format when it is quantized; None for 16-bit checkpoints."""

    def __post_init__(self) -> None:
        for label in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_size",
                      "vocab_size", "max_positions"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"model {self.name}: {label} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name}: {self.num_heads} query heads are not a multiple of {self.num_kv_heads} KV heads"
            )
        if self.moe_layers:
            if not (0 < self.experts_per_token <= self.num_experts) or self.expert_ffn_size <= 0:
                raise ValueError(f"model {self.name}: MoE layers need 0 < experts per token <= experts and a "
                                 f"positive expert FFN size, got top-{self.experts_per_token} of "
                                 f"{self.num_experts}, width {self.expert_ffn_size}")
            if self.expert_groups and (self.num_experts % self.expert_groups
                                       or not 1 <= self.groups_per_token <= self.expert_groups):
                raise ValueError(f"model {self.name}: group-limited routing needs the {self.num_experts} experts in "
                                 f"equal groups and 1 <= groups per token <= groups, got {self.expert_groups} "
                                 f"groups, {self.groups_per_token} per token")
            if any(not 0 <= i < self.num_layers for i in self.moe_layers) or len(set(self.moe_layers)) != len(
                    self.moe_layers):
                raise ValueError(f"model {self.name}: MoE layer indices must be distinct and in "
                                 f"0..{self.num_layers - 1}")
        if not 1 <= self.norms_per_layer <= 4 or not 0 <= self.linear_attention_layers <= self.num_layers:
            raise ValueError(f"model {self.name}: norms per layer must be 1-4 and linear-attention layers at most "
                             f"{self.num_layers}, got {self.norms_per_layer} and {self.linear_attention_layers}")
        if self.is_mla and min(self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim) <= 0:
            raise ValueError(f"model {self.name}: MLA needs positive qk_rope_head_dim, qk_nope_head_dim, v_head_dim")

    @property
    def is_moe(self) -> bool:
        """Whether any layer is a Mixture-of-Experts layer."""
        return bool(self.moe_layers)

    @property
    def is_mla(self) -> bool:
        """Whether attention is multi-head latent attention."""
        return self.kv_lora_rank > 0

    def unpriced_reason(self) -> str:
        """One line saying why this model cannot be planned ('' when every feature is priced)."""
        if not self.unpriced_features:
            return ""
        features = "; ".join(self.unpriced_features)[:120]
        label = self.name.rsplit("/", 1)[-1]  # the file, not its folders
        label = label if len(label) <= 100 else label[:97] + "..."
        return f"{label}: parameters counted, but paraplan does not price {features}, so it cannot plan it yet"

    @property
    def num_moe_layers(self) -> int:
        """How many layers are MoE layers."""
        return len(self.moe_layers)

    @property
    def num_dense_layers(self) -> int:
        """How many layers have a dense MLP."""
        return self.num_layers - self.num_moe_layers

    @property
    def has_out_bias(self) -> bool:
        """Whether the attention output projection has a bias vector."""
        return self.linear_bias if self.out_bias is None else self.out_bias

    # -- widths -------------------------------------------------------------------------------
    @property
    def q_width(self) -> int:
        """Width of all query heads together: num_heads x head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of all key (or value) heads together: num_kv_heads x head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices in the MLP: 3 when gated, else 2."""
        return 3 if self.gated_mlp else 2

    # -- parameter counts ---------------------------------------------------------------------
    def _norm_params(self, width: int) -> int:
        return width * (int(self.norm_weight) + int(self.norm_bias))

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query and key: head_dim, or nope + rope parts under MLA."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def value_head_dim(self) -> int:
        """Width of one head's value (and of its slice of the output projection's input)."""
        return self.v_head_dim if self.is_mla else self.head_dim

    def attention_weight_params(self) -> int:
        """Weight-matrix parameters of one layer's attention (what its GEMMs multiply per token)."""
        h, a = self.hidden_size, self.num_heads
        out = a * self.value_head_dim * h
        if not self.is_mla:
            return h * (self.q_width * (1 + self.attention_output_gate) + 2 * self.kv_width) + out
        q_out = a * self.qk_head_dim
        query = h * self.q_lora_rank + self.q_lora_rank * q_out if self.q_lora_rank else h * q_out
        # kv_a_proj_with_mqa: h -> latent + the rope key shared by all heads; kv_b_proj: latent -> K_nope, V.
        key_value = h * (self.kv_lora_rank + self.qk_rope_head_dim) \
            + self.kv_lora_rank * a * (self.qk_nope_head_dim + self.v_head_dim)
        return query + key_value + out

    def mla_up_projection_params(self) -> int:
        """MLA's up projections from the latents to per-head queries, keys and values (0 without MLA):
        what Megatron's mla_up_proj recompute reruns."""
        if not self.is_mla:
            return 0
        a = self.num_heads
        return self.q_lora_rank * a * self.qk_head_dim + self.kv_lora_rank * a * (self.qk_nope_head_dim
                                                                                   + self.v_head_dim)

    def qk_norm_params(self) -> int:
        """The query and key norms of one layer (0 without them)."""
        if not self.qk_norm:
            return 0
        width = 2 * self.head_dim if self.qk_norm_width == "head" else self.q_width + self.kv_width
        return width * (1 + int(self.qk_norm_bias))

    def attention_params(self) -> int:
        """Attention of one layer: projections with their biases, QK norms (or MLA's latent norms), sinks
        and a sparse-attention indexer."""
        h = self.hidden_size
        biases = (self.q_width * (1 + self.attention_output_gate) + 2 * self.kv_width) * self.qkv_bias \
            + h * self.has_out_bias
        latent_norms = self.q_lora_rank + self.kv_lora_rank if self.is_mla else 0
        sinks = self.num_heads if self.attention_sinks else 0
        return self.attention_weight_params() + biases + self.qk_norm_params() + latent_norms + sinks \
            + self.indexer_params

    def mlp_params(self) -> int:
        """MLP matrices of one layer with their biases."""
        h, f = self.hidden_size, self.ffn_size
        up_width = f * (self.mlp_matrices - 1)
        return self.mlp_matrices * h * f + (up_width + h) * self.linear_bias

    def layer_params(self) -> int:
        """Everything in one dense decoder layer: attention, MLP and its norms."""
        return self.attention_params() + self.mlp_params() + self.norms_per_layer * self._norm_params(self.hidden_size)

    def expert_params(self) -> int:
        """One routed expert: its gated (or plain) MLP of width ``expert_ffn_size``, with biases if any."""
        h, f = self.hidden_size, self.expert_ffn_size
        up_width = f * (self.mlp_matrices - 1)
        return self.mlp_matrices * h * f + (up_width + h) * self.expert_bias

    def shared_expert_params(self) -> int:
        """The always-on shared-expert MLP of one MoE layer, with its gate."""
        f = self.shared_expert_ffn_size
        return self.mlp_matrices * self.hidden_size * f + self.hidden_size * self.shared_expert_gate

    def router_params(self) -> int:
        """The router of one MoE layer: h x experts, plus a per-expert bias where the model has one."""
        return (self.hidden_size + self.router_bias) * self.num_experts

    def moe_layer_params(self) -> int:
        """One MoE decoder layer: attention, norms, router, every routed expert and the shared expert."""
        return (self.attention_params() + self.norms_per_layer * self._norm_params(self.hidden_size)
                + self.router_params() + self.num_experts * self.expert_params() + self.shared_expert_params())

    def moe_layer_active_params(self) -> int:
        """Parameters one token touches in an MoE layer: all but the routed experts it does not visit."""
        return self.moe_layer_params() - (self.num_experts - self.experts_per_token) * self.expert_params()

    def routed_params_per_layer_mean(self) -> float:
        """Routed-expert parameters per decoder layer, averaged over all layers (0 for dense models)."""
        return self.num_moe_layers * self.num_experts * self.expert_params() / self.num_layers

    def shared_params_per_layer_mean(self) -> float:
        """Parameters outside the routed experts per decoder layer, averaged over all layers: attention,
        norms and the dense MLP, or the router and shared expert (a dense model's ``layer_params``)."""
        return self.decoder_params() / self.num_layers - self.routed_params_per_layer_mean()

    def decoder_params(self) -> int:
        """All decoder layers of the main stack (linear-attention layers hold their own mixer instead of
        softmax attention)."""
        mixers = self.linear_attention_layers * (self.linear_attention_params - self.attention_params())
        return self.num_dense_layers * self.layer_params() + self.num_moe_layers * self.moe_layer_params() + mixers

    def mtp_params(self) -> int:
        """Multi-token-prediction modules (DeepSeek-V3), sharing the embedding and output head: per module
        two norms on its inputs, the 2h -> h projection, one decoder layer (MoE when the model is) and
        the norm before the shared head."""
        if not self.mtp_layers:
            return 0
        layer = self.moe_layer_params() if self.is_moe else self.layer_params()
        norms = 3 * self._norm_params(self.hidden_size)
        return self.mtp_layers * (norms + 2 * self.hidden_size * self.hidden_size + layer)

    def layer_param_tensors(self) -> int:
        """Parameter tensors of one layer as Megatron-style modules hold them (fused QKV, fused gate+up):
        weight matrices, bias vectors, norm weights/biases. GPT-3 shapes: 4 + 4 + 4 = 12."""
        return LAYER_WEIGHT_MATRICES + self.layer_vector_tensors()

    def layer_vector_tensors(self) -> int:
        """The one-dimensional parameter tensors of a layer: biases and norm weights/biases."""
        biases = int(self.qkv_bias) + int(self.has_out_bias) + 2 * int(self.linear_bias)
        norms = self.norms_per_layer * (int(self.norm_weight) + int(self.norm_bias)) \
            + (2 * (1 + int(self.qk_norm_bias)) if self.qk_norm else 0)
        return biases + norms

    def largest_layer_tensor_params(self) -> int:
        """Parameters of the largest weight matrix in a layer (fused QKV, fused gate+up, or down)."""
        h, f = self.hidden_size, self.ffn_size
        return max(h * (self.q_width + 2 * self.kv_width), self.q_width * h, (self.mlp_matrices - 1) * f * h, f * h)

    def embedding_params(self) -> int:
        """Input token embedding plus a learned position table and an embedding norm when the model has them."""
        h = self.hidden_size
        positions = (self.max_positions + self.position_offset) * h if self.position == "learned" else 0
        return self.vocab_size * h + positions + self.embedding_norm * self._norm_params(h)

    def output_params(self) -> int:
        """Final norm plus the output projection (zero extra when tied to the embedding) and its bias."""
        projection = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return self.final_norm * self._norm_params(self.hidden_size) + projection + self.output_bias * self.vocab_size

    def total_params(self) -> int:
        """Exact parameter count of the main model (MTP modules, which training adds, are separate)."""
        return self.embedding_params() + self.decoder_params() + self.output_params()

    def active_params(self) -> int:
        """Parameters one token touches in the main model, embedding lookup included."""
        unvisited = self.num_moe_layers * (self.num_experts - self.experts_per_token) * self.expert_params()
        return self.total_params() - unvisited

    # -- FLOPs --------------------------------------------------------------------------------
    def layer_gemm_flops_per_token(self) -> int:
        """Forward FLOPs of one dense layer's weight GEMMs per token: 2 x (weights in Q, K, V, O and MLP)."""
        return 2 * (self.attention_weight_params() + self.mlp_matrices * self.hidden_size * self.ffn_size)

    def moe_layer_gemm_flops_per_token(self) -> int:
        """Forward FLOPs of one MoE layer's weight GEMMs per token: attention, router, the top-k routed
        experts and the shared expert (2 FLOPs per weight each)."""
        h = self.hidden_size
        experts = self.experts_per_token * self.mlp_matrices * h * self.expert_ffn_size
        shared = self.mlp_matrices * h * self.shared_expert_ffn_size
        return 2 * (self.attention_weight_params() + h * self.num_experts + experts + shared)

    def attention_span(self, seq_len: int) -> float:
        """Keys each query attends to, averaged over layers (a full sequence, or the sliding window)."""
        window = min(self.sliding_window, seq_len) if self.sliding_window else seq_len
        return (self.sliding_layers * window + (self.num_layers - self.sliding_layers) * seq_len) / self.num_layers

    def attention_core_flops_per_token(self, seq_len: int, convention: AttentionFlops = "full") -> float:
        """Forward FLOPs of QKᵀ and AV per token per layer: 2·s·a·(d_qk + d_v), i.e. 4·s·(a·d_head) for
        standard heads; causal halves it. Sliding-window layers see their window instead of s (layer mean)."""
        full = 2.0 * self.attention_span(seq_len) * self.num_heads * (self.qk_head_dim + self.value_head_dim)
        return full / 2 if convention == "causal" else full

    def logits_flops_per_token(self) -> int:
        """Forward FLOPs of the output projection per token: 2·h·V."""
        return 2 * self.hidden_size * self.vocab_size

    def model_flops_per_token(self, seq_len: int, convention: AttentionFlops = "full") -> float:
        """Training FLOPs per token (forward + backward = 3 x forward), no recomputation.

        With ``full`` attention this is the PaLM/MFU convention; for GPT shapes it equals
        72·l·h²·(1 + s/6h + V/12lh) per token, i.e. Narayanan et al. Eq. 3 without the recompute pass.
        NaN for a model with ``unpriced_features``: its linear-attention recurrences or sparse-attention
        indexer have no FLOPs formula here, and a number without them would look right and be wrong.
        """
        if self.unpriced_features:
            return math.nan
        gemm = self.num_dense_layers * self.layer_gemm_flops_per_token() \
            + self.num_moe_layers * self.moe_layer_gemm_flops_per_token()
        attention = self.num_layers * self.attention_core_flops_per_token(seq_len, convention)
        return 3.0 * (gemm + attention + self.logits_flops_per_token())
