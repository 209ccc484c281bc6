"""The transformer being trained: shapes, exact parameter counts and model FLOPs per token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

NormKind = Literal["rmsnorm", "layernorm"]
PositionKind = Literal["rope", "learned", "alibi"]
AttentionFlops = Literal["full", "causal"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A dense decoder-only transformer. Counts are plain integers; no units beyond counts."""

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
        return width * (2 if self.norm_bias else 1)

    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer, with their biases and QK norms."""
        h = self.hidden_size
        weights = h * (self.q_width + 2 * self.kv_width) + self.q_width * h
        biases = (self.q_width + 2 * self.kv_width) * self.qkv_bias + h * self.has_out_bias
        qk_norms = 2 * self.head_dim if self.qk_norm else 0
        return weights + biases + qk_norms

    def mlp_params(self) -> int:
        """MLP matrices of one layer with their biases."""
        h, f = self.hidden_size, self.ffn_size
        up_width = f * (self.mlp_matrices - 1)
        return self.mlp_matrices * h * f + (up_width + h) * self.linear_bias

    def layer_params(self) -> int:
        """Everything in one decoder layer: attention, MLP and its two norms."""
        return self.attention_params() + self.mlp_params() + 2 * self._norm_params(self.hidden_size)

    def layer_param_tensors(self) -> int:
        """Parameter tensors of one layer as Megatron-style modules hold them (fused QKV, fused gate+up):
        weight matrices, bias vectors, norm weights/biases. GPT-3 shapes: 4 + 4 + 4 = 12."""
        matrices = 4
        biases = int(self.qkv_bias) + int(self.has_out_bias) + 2 * int(self.linear_bias)
        norms = 2 * (2 if self.norm_bias else 1) + (2 if self.qk_norm else 0)
        return matrices + biases + norms

    def largest_layer_tensor_params(self) -> int:
        """Parameters of the largest weight matrix in a layer (fused QKV, fused gate+up, or down)."""
        h, f = self.hidden_size, self.ffn_size
        return max(h * (self.q_width + 2 * self.kv_width), self.q_width * h, (self.mlp_matrices - 1) * f * h, f * h)

    def embedding_params(self) -> int:
        """Input token embedding plus a learned position table when the model has one."""
        positions = self.max_positions * self.hidden_size if self.position == "learned" else 0
        return self.vocab_size * self.hidden_size + positions

    def output_params(self) -> int:
        """Final norm plus the output projection (zero extra when tied to the embedding)."""
        projection = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return self._norm_params(self.hidden_size) + projection

    def total_params(self) -> int:
        """Exact parameter count of the model."""
        return self.embedding_params() + self.num_layers * self.layer_params() + self.output_params()

    # -- FLOPs --------------------------------------------------------------------------------
    def layer_gemm_flops_per_token(self) -> int:
        """Forward FLOPs of one layer's weight GEMMs per token: 2 x (weights in Q, K, V, O and MLP)."""
        h = self.hidden_size
        attention = h * (self.q_width + 2 * self.kv_width) + self.q_width * h
        return 2 * (attention + self.mlp_matrices * h * self.ffn_size)

    def attention_core_flops_per_token(self, seq_len: int, convention: AttentionFlops = "full") -> float:
        """Forward FLOPs of QKᵀ and AV per token per layer: 4·s·(a·d_head); causal halves it."""
        full = 4.0 * seq_len * self.q_width
        return full / 2 if convention == "causal" else full

    def logits_flops_per_token(self) -> int:
        """Forward FLOPs of the output projection per token: 2·h·V."""
        return 2 * self.hidden_size * self.vocab_size

    def model_flops_per_token(self, seq_len: int, convention: AttentionFlops = "full") -> float:
        """Training FLOPs per token (forward + backward = 3 x forward), no recomputation.

        With ``full`` attention this is the PaLM/MFU convention; for GPT shapes it equals
        72·l·h²·(1 + s/6h + V/12lh) per token, i.e. Narayanan et al. Eq. 3 without the recompute pass.
        """
        per_layer = self.layer_gemm_flops_per_token() + self.attention_core_flops_per_token(seq_len, convention)
        return 3.0 * (self.num_layers * per_layer + self.logits_flops_per_token())
