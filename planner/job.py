"""The training job and one parallel configuration."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from paraplan.choices import (
    CP_COMM_CODES,
    PIPELINE_SCHEDULE_CODES,
    PRECISIONS,
    RECOMPUTE_CODES,
    CpComm,
    Engine,
    PipelineSchedule,
    Precision,
    Recompute,
)
from paraplan.cost_models.fp8_recipes import FP8_RECIPES
from paraplan.cost_models.table import ConfigTable, Workload
from paraplan.errors import InputError
from paraplan.limits import MAX_GLOBAL_BATCH, MAX_SEQ_LEN
from paraplan.measurements.routing import RoutingStats
from paraplan.model_specs.model_spec import AttentionFlops, ModelSpec
from paraplan.planner.engines import EngineRules, engine_rules, recipe_for


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingJob:
    """What to train and how: model, sequence, batch, precision, engine."""

    model: ModelSpec
    """The transformer."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    precision: Precision = "bf16"
    """GEMM precision: bf16, fp8 or fp4."""
    fp8_recipe: str = "tensorwise"
    """How fp8 GEMM inputs are scaled (cost_models.fp8_recipes.FP8_RECIPES); only with precision fp8."""
    engine: Engine = "megatron"
    """Target engine: megatron, deepspeed or torchtitan."""
    attention: str = "auto"
    """Attention kernel: fused, flash or unfused; auto = the engine's default."""
    flops_convention: AttentionFlops = "full"
    """Attention FLOPs counted in MFU: full (PaLM / Megatron convention) or causal."""
    memory_headroom_frac: float = 0.0
    """Keep this fraction of HBM free on top of the model's reserve."""
    expert_imbalance: float | None = None
    """MoE: busiest expert-parallel rank's routed tokens over the mean (1 = force-balanced routing);
    None = a balanced router's sampling noise, or the routing statistics when given."""
    routing: RoutingStats | None = None
    """MoE: measured tokens per expert per layer (cost_models.routing), which set the imbalance."""
    capacity_factor: float | None = None
    """MoE token dropping: each expert takes at most this many times its balanced share of tokens and is
    padded up to it (Megatron --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity);
    None = dropless."""
    dispatcher: str = "auto"
    """MoE token dispatcher: alltoall (every routed copy sent to its expert's GPU) or deepep (one copy per
    destination node over the network, forwarded inside the node; fp8 dispatch with fp8 GEMMs); auto = the
    engine's default."""
    compiled: bool = False
    """torchtitan: the model runs under torch.compile (fused elementwise kernels, less allocator
    fragmentation)."""
    async_tp: bool = False
    """torchtitan: asynchronous tensor parallelism (torch's micro-pipelined all-gather/matmul and
    matmul/reduce-scatter, applied by torch.compile): TP collectives run under the GEMMs they feed."""
    compiled_loss: bool = False
    """torchtitan 0.2+: torch.compile also compiles the loss (``compile.components = ["model", "loss"]``,
    the default), fusing the fp32 upcast into the cross-entropy kernel: the loss keeps
    FUSED_LOSS_BYTES_PER_LOGIT (the H100 probe: 16.7 GiB less at 2 x 8192 tokens of a 128k vocabulary).
    torchtitan's 2024 benchmarks compiled the transformer blocks only."""
    fused_expert_mlp: bool = False
    """MoE: the routed experts' MLP runs fused (Megatron ``use_transformer_engine_op_fuser``: Transformer Engine's
    CuTe DSL grouped MLP, NeMo's MXFP8 GB200/GB300 recipes from 26.06); it matters for experts with biases or a
    clamped GLU (GPT-OSS), whose eager ops are priced otherwise (cost_models/moe_eager.py)."""
    fused_kernels: bool = False
    """A PyTorch model whose loss and memory-bound ops run as fused kernels (llm-foundry: flash-attn's
    in-place cross entropy, ``fused_crossentropy``, and low-precision LayerNorm): the loss keeps
    FUSED_LOSS_BYTES_PER_LOGIT and the allocator fragments like a fused-kernel stack."""

    def __post_init__(self) -> None:
        for label, most in (("seq_len", MAX_SEQ_LEN), ("global_batch", MAX_GLOBAL_BATCH)):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{label.replace('_', '-')} must be a positive integer, got {value!r}")
            if value > most:
                raise ValueError(f"{label.replace('_', '-')} {value:,} is implausibly large (at most {most:,})")
        if self.model.unpriced_features:  # counted but not priced (linear attention, a DSA indexer): refuse
            raise InputError(self.model.unpriced_reason())
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ValueError(f"fp8 recipe must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        if self.fp8_recipe != "tensorwise" and self.precision != "fp8":
            raise ValueError(f"an fp8 recipe ({self.fp8_recipe}) needs --precision fp8, not {self.precision}")
        if self.flops_convention not in ("full", "causal"):
            raise ValueError(f"flops convention must be full or causal, got {self.flops_convention!r}")
        if not 0 <= self.memory_headroom_frac < 1:
            raise ValueError(f"memory headroom must be a fraction in [0, 1), got {self.memory_headroom_frac}")
        if self.expert_imbalance is not None and not self.expert_imbalance >= 1.0:
            raise ValueError(f"expert imbalance is the busiest rank's load over the mean and must be >= 1, "
                             f"got {self.expert_imbalance}")
        if self.capacity_factor is not None and not (self.model.is_moe and 0 < self.capacity_factor < 1e6):
            raise ValueError(f"capacity factor applies to MoE models and must be a positive number (1.0 = each "
                             f"expert takes its balanced share), got {self.capacity_factor} for {self.model.name}")
        if self.routing is not None and self.routing.num_experts != self.model.num_experts:
            raise ValueError(f"routing statistics cover {self.routing.num_experts} experts but {self.model.name} "
                             f"has {self.model.num_experts}")
        rules = engine_rules(self.engine)
        if self.dispatcher != "auto" and self.dispatcher not in rules.dispatchers:
            raise ValueError(f"dispatcher {self.dispatcher!r} is not available with engine {self.engine} "
                             f"(choose auto or one of {', '.join(rules.dispatchers)})")
        if self.async_tp and (self.engine != "torchtitan" or not self.compiled):
            raise ValueError("async tensor parallelism is torchtitan's, and torchtitan applies it only under "
                             "torch.compile (add --compile, or drop --async-tp)")
        if self.fp8_recipe not in rules.fp8_recipes:
            raise ValueError(f"fp8 recipe {self.fp8_recipe!r} is not available with engine {self.engine} "
                             f"(choose one of {', '.join(rules.fp8_recipes)})")
        if self.attention != "auto" and self.attention not in rules.attention_kernels:
            raise ValueError(f"attention {self.attention!r} is not available with engine {self.engine} "
                             f"(choose auto or one of {', '.join(rules.attention_kernels)})")

    @property
    def token_dispatcher(self) -> str:
        """The MoE dispatcher the job runs (auto resolved to the engine's default)."""
        return engine_rules(self.engine).dispatchers[0] if self.dispatcher == "auto" else self.dispatcher

    @property
    def attention_kernel(self) -> str:
        """The attention implementation the job runs (auto resolved to the engine's default)."""
        return engine_rules(self.engine).attention_kernels[0] if self.attention == "auto" else self.attention

    @property
    def trained_mtp_layers(self) -> int:
        """The model's multi-token-prediction modules where the engine trains them (EngineRules.trains_mtp), else 0."""
        return self.model.mtp_layers if engine_rules(self.engine).trains_mtp else 0

    def workload(self) -> Workload:
        """The cost model's view of the job."""
        return Workload(seq_len=self.seq_len, global_batch=self.global_batch, precision=self.precision,
                        fp8_recipe=self.fp8_recipe,
                        recipe=recipe_for(engine_rules(self.engine), self.precision),
                        attention=self.attention_kernel, kernel_stack=engine_rules(self.engine).kernel_stack,
                        recompute_stops_early=engine_rules(self.engine).recompute_stops_early,
                        flops_convention=self.flops_convention, expert_imbalance=self.expert_imbalance,
                        routing=self.routing, capacity_factor=self.capacity_factor,
                        dispatcher=self.token_dispatcher, async_tp=self.async_tp,
                        fused_expert_mlp=self.fused_expert_mlp,
                        cp_gather_overlaps_local=engine_rules(self.engine).cp_gather_overlaps_local,
                        pipeline_split=engine_rules(self.engine).pipeline_split,
                        mtp_layers=self.trained_mtp_layers,
                        **_memory_behaviour(engine_rules(self.engine), self.compiled, self.fused_kernels,
                                           self.compiled_loss))


# A fused in-place cross entropy keeps the bf16 logits (2 B) and writes their gradient into the same
# buffer; the bf16 gradient the output layer's backward reads is that buffer, plus 2 B of slack for the
# fp32 row statistics and the copy the engine casts for the output GEMM: 4 B per logit element.
FUSED_LOSS_BYTES_PER_LOGIT = 4.0


def _memory_behaviour(rules: EngineRules, compiled: bool, fused_kernels: bool,
                      compiled_loss: bool = False) -> dict[str, Any]:
    """The engine's memory behaviour as the cost model's workload fields."""
    eager = rules.eager_pytorch_model and not fused_kernels
    allocator = ("compiled" if compiled else "eager") if eager else "fused_kernels"
    loss = FUSED_LOSS_BYTES_PER_LOGIT if fused_kernels or (compiled_loss and eager) else rules.loss_bytes_per_logit
    return {"selective_saves": rules.selective_saves, "loss_bytes_per_logit": loss,
            "frees_grads_between_steps": rules.frees_grads_between_steps,
            "saves_gathered_gemm_inputs": rules.saves_gathered_gemm_inputs,
            "fsdp_root_stays_gathered": rules.fsdp_root_stays_gathered,
            "pipeline_fsdp_unsharded": rules.pipeline_fsdp_unsharded, "allocator": allocator}


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """One way to split the work (rank order tp-cp-dp-pp, TP innermost)."""

    tp: int
    """Tensor parallel."""
    pp: int
    """Pipeline parallel."""
    dp: int
    """Data parallel."""
    cp: int = 1
    """Context parallel."""
    cp_comm: CpComm = "p2p"
    """How context parallelism moves K and V: p2p (ring), a2a (Ulysses), allgather or a2a+p2p."""
    ep: int = 1
    """Expert parallel (1 for dense models)."""
    etp: int = 1
    """Expert tensor parallel (1 for dense models)."""
    vpp: int = 1
    """Virtual pipeline stages per rank."""
    mbs: int = 1
    """Micro-batch size, sequences."""
    zero: int = 0
    """ZeRO stage (Megatron: 1 = distributed optimizer, 3 = Megatron-FSDP)."""
    recompute: Recompute = "none"
    """none, selective, full or modules (paraplan.choices.Recompute)."""
    sp: bool = False
    """Sequence parallel."""
    ep_overlap: bool = False
    """Expert all-to-alls hidden under another micro-batch's compute (combined 1F1B)."""
    offload: int = 0
    """Layers whose saved activations live in host memory (Megatron --cpu-offloading-num-layers)."""
    pp_schedule: PipelineSchedule = "1f1b"
    """Pipeline schedule: 1f1b (interleaved when vpp > 1), dualpipev or dualpipe (cost_models/schedules.py)."""
    tp_overlap: bool = False
    """TP collectives pipelined under their GEMMs (Megatron --tp-comm-overlap)."""

    def __post_init__(self) -> None:
        for label in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        if isinstance(self.offload, bool) or not isinstance(self.offload, int) or self.offload < 0:
            raise ValueError(f"offload must be a non-negative number of layers, got {self.offload!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.cp_comm not in CP_COMM_CODES:
            raise ValueError(f"cp_comm must be one of {', '.join(CP_COMM_CODES)}, got {self.cp_comm!r}")
        if self.recompute not in RECOMPUTE_CODES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_CODES)}, got {self.recompute!r}")
        if self.pp_schedule not in PIPELINE_SCHEDULE_CODES:
            raise ValueError(f"pp_schedule must be one of {', '.join(PIPELINE_SCHEDULE_CODES)}, "
                             f"got {self.pp_schedule!r}")

    @property
    def num_gpus(self) -> int:
        """GPUs the configuration occupies."""
        return self.tp * self.pp * self.dp * self.cp

    def as_dict(self) -> dict[str, Any]:
        """Plain fields, for JSON."""
        return asdict(self)


def configs_to_table(configs: list[ParallelConfig]) -> ConfigTable:
    """Stack configurations into the cost model's column table."""
    return ConfigTable.from_columns(
        tp=[c.tp for c in configs], pp=[c.pp for c in configs], dp=[c.dp for c in configs],
        cp=[c.cp for c in configs], cp_comm=[CP_COMM_CODES[c.cp_comm] if c.cp > 1 else 0 for c in configs],
        ep=[c.ep for c in configs], etp=[c.etp for c in configs],
        vpp=[c.vpp for c in configs], mbs=[c.mbs for c in configs],
        zero=[c.zero for c in configs], recompute=[RECOMPUTE_CODES[c.recompute] for c in configs],
        sp=[int(c.sp) for c in configs], ep_overlap=[int(c.ep_overlap) for c in configs],
        offload=[c.offload for c in configs], pp_schedule=[PIPELINE_SCHEDULE_CODES[c.pp_schedule] for c in configs],
        tp_overlap=[int(c.tp_overlap) for c in configs],
    )
