"""The training job and one parallel configuration."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from paraplan.cost_models.model_spec import AttentionFlops, ModelSpec
from paraplan.cost_models.table import RECOMPUTE_CODES, ConfigTable, Workload
from paraplan.planner.engines import engine_rules, recipe_for

PRECISIONS = ("bf16", "fp8", "fp4")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingJob:
    """What to train and how: model, sequence, batch, precision, engine."""

    model: ModelSpec
    """The transformer."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    precision: str = "bf16"
    """GEMM precision: bf16, fp8 or fp4."""
    engine: str = "megatron"
    """Target engine: megatron, deepspeed or torchtitan."""
    attention: str = "auto"
    """Attention kernel: fused, flash or unfused; auto = the engine's default."""
    flops_convention: AttentionFlops = "full"
    """Attention FLOPs counted in MFU: full (PaLM / Megatron convention) or causal."""
    memory_headroom_frac: float = 0.0
    """Keep this fraction of HBM free on top of the model's reserve."""

    def __post_init__(self) -> None:
        for label in ("seq_len", "global_batch"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{label.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.flops_convention not in ("full", "causal"):
            raise ValueError(f"flops convention must be full or causal, got {self.flops_convention!r}")
        if not 0 <= self.memory_headroom_frac < 1:
            raise ValueError(f"memory headroom must be a fraction in [0, 1), got {self.memory_headroom_frac}")
        rules = engine_rules(self.engine)
        if self.attention != "auto" and self.attention not in rules.attention_kernels:
            raise ValueError(f"attention {self.attention!r} is not available with engine {self.engine} "
                             f"(choose auto or one of {', '.join(rules.attention_kernels)})")

    @property
    def attention_kernel(self) -> str:
        """The attention implementation the job runs (auto resolved to the engine's default)."""
        return engine_rules(self.engine).attention_kernels[0] if self.attention == "auto" else self.attention

    def workload(self) -> Workload:
        """The cost model's view of the job."""
        return Workload(seq_len=self.seq_len, global_batch=self.global_batch, precision=self.precision,
                        recipe=recipe_for(engine_rules(self.engine), self.precision),
                        attention=self.attention_kernel, kernel_stack=engine_rules(self.engine).kernel_stack,
                        recompute_stops_early=engine_rules(self.engine).recompute_stops_early,
                        flops_convention=self.flops_convention)


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
    recompute: str = "none"
    """none, selective or full."""
    sp: bool = False
    """Sequence parallel."""
    offload: int = 0
    """Layers whose saved activations live in host memory (Megatron --cpu-offloading-num-layers)."""

    def __post_init__(self) -> None:
        for label in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        if isinstance(self.offload, bool) or not isinstance(self.offload, int) or self.offload < 0:
            raise ValueError(f"offload must be a non-negative number of layers, got {self.offload!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE_CODES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_CODES)}, got {self.recompute!r}")

    @property
    def num_gpus(self) -> int:
        """GPUs the configuration occupies."""
        return self.tp * self.pp * self.dp * self.cp

    def as_dict(self) -> dict:
        """Plain fields, for JSON."""
        return asdict(self)


def configs_to_table(configs: list[ParallelConfig]) -> ConfigTable:
    """Stack configurations into the cost model's column table."""
    return ConfigTable.from_columns(
        tp=[c.tp for c in configs], pp=[c.pp for c in configs], dp=[c.dp for c in configs],
        cp=[c.cp for c in configs], ep=[c.ep for c in configs], etp=[c.etp for c in configs],
        vpp=[c.vpp for c in configs], mbs=[c.mbs for c in configs],
        zero=[c.zero for c in configs], recompute=[RECOMPUTE_CODES[c.recompute] for c in configs],
        sp=[int(c.sp) for c in configs], offload=[c.offload for c in configs],
    )
