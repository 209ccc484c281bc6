"""What each training engine can run: its rules as one capability table, not scattered ifs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from paraplan.choices import CpComm, Engine, PipelineSchedule, Precision, Recompute
from paraplan.cost_models.pipeline_splits import PipelineSplit
from paraplan.cost_models.recipes import (
    DEEPSPEED_MIXED,
    FSDP2_MIXED,
    MEGATRON_LOW_PRECISION,
    MEGATRON_MIXED,
    StateRecipe,
)
from paraplan.errors import InputError

SelectiveSaves = Literal["attention_core", "alternate_matmuls"]

# Loss working sets, bytes per logit element at the loss's peak:
# - Megatron's vocab-parallel cross entropy casts the bf16 logits to an fp32 buffer, turns it into the
#   softmax in place and keeps it for backward, where the gradient is written into the same buffer and
#   cast back to bf16 for the output layer: 4 (fp32 softmax) + 2 (bf16 gradient) = 6.
# - PyTorch's F.cross_entropy on ``logits.float()`` (torchtitan, Hugging Face models under DeepSpeed) keeps
#   the fp32 log-softmax (4); its backward allocates the fp32 gradient of that output (4) and the fp32
#   gradient of its input (4) while the saved output is alive: 12.
MEGATRON_LOSS_BYTES_PER_LOGIT = 6.0
KORTHIKANTI_LOSS_BYTES_PER_LOGIT = 4.0
EAGER_LOSS_BYTES_PER_LOGIT = 12.0


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineRules:
    """One engine's parallelism support and memory recipe."""

    name: Engine
    recipe: StateRecipe
    """How the engine stores and communicates model states in bf16 training."""
    low_precision_recipe: StateRecipe
    """The same when GEMMs run in fp8 or fp4."""
    zero_stages: tuple[int, ...]
    """ZeRO stages the engine offers (Megatron: 1 = distributed optimizer, 3 = Megatron-FSDP)."""
    max_zero_with_pp: int
    """Highest ZeRO stage that composes with pipeline parallelism."""
    supports_cp: bool
    """Context parallelism."""
    cp_comm_types: tuple[CpComm, ...]
    """How its context parallelism can move K and V (context_parallel.CP_COMM_CODES names)."""
    cp_gather_overlaps_local: bool
    """Its all-gather variant runs under the local chunk's attention (PyTorch) rather than blocking."""
    supports_interleaved: bool
    """Interleaved (virtual-stage) pipeline schedule."""
    sp_modes_with_tp: tuple[int, ...]
    """Sequence-parallel settings allowed when tp > 1 (torchtitan always shards norms: only 1)."""
    recompute_modes: tuple[Recompute, ...]
    """Activation recomputation modes."""
    pipeline_split: PipelineSplit
    """How the engine itself cuts the layers into pipeline chunks (cost_models.pipeline_splits): Megatron's
    even / edge-accounted / explicit-edge split, torchtitan's weighted split, DeepSpeed's uniform partition."""
    empty_edge_chunks: bool
    """The first or last chunk may hold the embedding or the loss alone, no decoder layer."""
    interleaved_needs_pp_multiple: bool
    """Interleaving requires the micro-batch count to be a multiple of pp."""
    attention_kernels: tuple[str, ...]
    """Attention implementations the engine can run; the first is its default."""
    kernel_stack: str
    """Where its GEMM modules come from: transformer_engine or pytorch (efficiency.yaml)."""
    activation_offload: bool
    """Saved activations of some layers can live in host memory (pp = 1, no recompute)."""
    recompute_stops_early: bool
    """Full recompute uses PyTorch's non-reentrant checkpoint, which stops at the last saved tensor."""
    expert_ranks_from: tuple[str, ...]
    """Axes whose ranks the expert groups are carved from: ep·etp must divide their product."""
    etp_choices: Literal["divisors_of_tp", "one_or_tp", "one"]
    """Expert tensor-parallel degrees the engine offers."""
    ep_overlap: bool
    """Expert all-to-alls can run under another micro-batch's compute (needs ep > 1, no full recompute,
    and virtual stages when pp > 1)."""
    dispatchers: tuple[str, ...]
    """MoE token dispatchers (cost_models.moe.DISPATCHERS) the engine can launch; the first is its default."""
    tp_comm_overlap: bool
    """TP collectives can be pipelined under their GEMMs (Megatron --tp-comm-overlap: tp > 1, sequence parallel)."""
    fp8_recipes: tuple[str, ...]
    """fp8 scaling recipes (cost_models.fp8_recipes.FP8_RECIPES) it can run; the first is its default."""
    pipeline_schedules: tuple[PipelineSchedule, ...]
    """Pipeline schedules (cost_models.table.PIPELINE_SCHEDULE_CODES) it runs; 1f1b covers the interleaved one."""
    selective_saves: SelectiveSaves
    """What ``selective`` recompute keeps: Megatron drops the attention core's tensors (Korthikanti et al.
    2022); torchtitan's op-level SAC keeps every other matmul output and the attention output."""
    loss_bytes_per_logit: float
    """Bytes per logit element (per token per vocabulary entry on one TP rank) the loss holds at its peak."""
    frees_grads_between_steps: bool
    """Gradients are freed after each optimizer step, so they are absent at the first micro-batch's
    activation peak. torchtitan calls zero_grad(set_to_none=True), yet its measured peaks hold them: from 8
    to 128 FSDP ranks (Llama 3.1 8B, same local batch) the reserved peak falls by 15.4 GiB, what 16 B of
    states per parameter predict (14.0 GiB x the allocator's 1.1), not 12 B (10.5 GiB x 1.1)."""
    saves_gathered_gemm_inputs: bool
    """With sequence parallelism, each GEMM keeps its all-gathered (whole-sequence) input for the weight
    gradient (DTensor's SequenceParallel + ColwiseParallel in torchtitan), instead of its sequence shard
    gathered again in backward (Megatron-core)."""
    eager_pytorch_model: bool
    """The model's elementwise ops run as eager PyTorch kernels unless torch.compile fuses them (torchtitan);
    else fused kernels with few temporaries (Megatron with Transformer Engine, Megatron-DeepSpeed)."""
    fsdp_root_stays_gathered: bool
    """With sharded weights, the root module (embedding, final norm, output layer) stays gathered from
    its forward through its backward (FSDP2 never reshards the root after forward)."""
    pipeline_fsdp_unsharded: bool
    """Under a pipeline schedule, sharded weights stay gathered for the whole step and gradients accumulate
    unsharded, in the reduce dtype, until the last micro-batch: torch.distributed.pipelining's
    ``backward_maybe_with_nosync`` runs every backward but the last with FSDP2's
    ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)``."""
    source: str
    """Where these rules come from."""
    shards_over_cp: bool = False
    """With cp > 1 the engine always shards parameters over the context-parallel ranks (torchtitan applies FSDP2 over
    dp_shard x cp), so ZeRO 0 with cp > 1 is a layout it does not run."""
    trains_mtp: bool = False
    """It trains a model's multi-token-prediction modules (Megatron-core's MultiTokenPredictionBlock,
    --mtp-num-layers, which the Megatron export sets from the model); torchtitan's and Hugging Face's DeepSeek-V3
    have no MTP module, so they train the main model alone."""


ENGINES: dict[str, EngineRules] = {
    "megatron": EngineRules(
        name="megatron", recipe=MEGATRON_MIXED, low_precision_recipe=MEGATRON_LOW_PRECISION, zero_stages=(0, 1, 3),
        max_zero_with_pp=1,
        supports_cp=True, cp_comm_types=("p2p", "a2a", "allgather", "a2a+p2p"), cp_gather_overlaps_local=False,
        supports_interleaved=True, sp_modes_with_tp=(0, 1),
        recompute_modes=("none", "selective", "full", "modules"), pipeline_split="megatron", empty_edge_chunks=True,
        interleaved_needs_pp_multiple=True, attention_kernels=("fused", "flash", "unfused"),
        kernel_stack="transformer_engine", activation_offload=True, recompute_stops_early=False,
        expert_ranks_from=("tp", "dp", "cp"), etp_choices="divisors_of_tp", ep_overlap=True,
        dispatchers=("alltoall", "deepep"), pipeline_schedules=("1f1b",),
        fp8_recipes=("tensorwise", "delayed", "blockwise", "mxfp8"), tp_comm_overlap=True,
        selective_saves="attention_core", loss_bytes_per_logit=MEGATRON_LOSS_BYTES_PER_LOGIT,
        frees_grads_between_steps=False, saves_gathered_gemm_inputs=False, eager_pytorch_model=False,
        fsdp_root_stays_gathered=False, pipeline_fsdp_unsharded=False, trains_mtp=True,
        source=(
            "Megatron-LM core_v0.16 arguments: --use-distributed-optimizer, --use-megatron-fsdp, "
            "--cp-comm-type p2p|a2a|allgather|a2a+p2p with --hierarchical-context-parallel-sizes (Transformer "
            "Engine's all_gather CP blocks before attention), "
            "--sequence-parallel needs TP > 1, --num-layers-per-virtual-pipeline-stage, "
            "--account-for-embedding/loss-in-pipeline-split, --decoder-first/last-pipeline-num-layers, "
            "--recompute-granularity, --recompute-modules, --overlap-moe-expert-parallel-comm (combined 1F1B: "
            "ep > 1, no full recompute, virtual stages when pp > 1), "
            "--attention-backend fused|flash|unfused (auto picks Transformer Engine's cuDNN fused attention), "
            "--cpu-offloading-num-layers (Transformer Engine activation offload; Megatron-core refuses it "
            "with pp > 1 or with recompute, and needs at least one layer left on the GPU), "
            "--expert-model-parallel-size / --expert-tensor-parallel-size (MoE parallel folding: expert groups "
            "etp-ep-edp are carved from the tp·dp·cp ranks of a stage; MoE with TP needs --sequence-parallel), "
            "--moe-token-dispatcher-type alltoall|flex with --moe-flex-dispatcher-backend deepep (DeepEP's "
            "node-deduplicated dispatch), --moe-router-num-groups / --moe-router-group-topk (group-limited routing), "
            "--fp8-recipe tensorwise|delayed|blockwise|mxfp8 (Transformer Engine's scaling recipes), "
            "--tp-comm-overlap (Transformer Engine userbuffers; needs --sequence-parallel)"
        ),
    ),
    "deepspeed": EngineRules(
        name="deepspeed", recipe=DEEPSPEED_MIXED, low_precision_recipe=DEEPSPEED_MIXED, zero_stages=(0, 1, 2, 3),
        max_zero_with_pp=1,
        supports_cp=False, cp_comm_types=(), cp_gather_overlaps_local=False, supports_interleaved=False,
        sp_modes_with_tp=(0,),
        recompute_modes=("none", "full"), pipeline_split="deepspeed_uniform", empty_edge_chunks=True,
        interleaved_needs_pp_multiple=False,
        attention_kernels=("flash", "unfused"), kernel_stack="pytorch", activation_offload=False,
        recompute_stops_early=False, expert_ranks_from=("dp",), etp_choices="one", ep_overlap=False,
        dispatchers=("alltoall",), pipeline_schedules=("1f1b",), fp8_recipes=("tensorwise",),
        tp_comm_overlap=False,
        # Korthikanti et al.'s 4·s·b·V/t (the fp32 softmax alone), paraplan's figure before issue 15: the 2021
        # ZeRO-3 runs (Narayanan et al. Table 2, 529.6B at mbs 4 on 640 GPUs) ran within 2% of capacity and
        # Megatron's 6 B would call them out of memory; no DeepSpeed memory measurement settles it.
        selective_saves="attention_core", loss_bytes_per_logit=KORTHIKANTI_LOSS_BYTES_PER_LOGIT,
        frees_grads_between_steps=False, saves_gathered_gemm_inputs=False, eager_pytorch_model=False,
        fsdp_root_stays_gathered=False, pipeline_fsdp_unsharded=False,
        source=("DeepSpeed (ZeRO-3 costed as its 2021 releases ran it, see recipes.DEEPSPEED_MIXED): PipelineEngine "
                "supports ZeRO-1 only; activation checkpointing is per layer (full); "
                "deepspeed.checkpointing is reentrant and reruns the whole layer; attention is the model's own "
                "(flash-attn 2 / SDPA, or the unfused reference path); DeepSpeed-MoE forms expert-parallel groups "
                "inside data parallel (ep_size divides dp); PipelineModule(partition_method='uniform') cuts the layer "
                "specs with runtime/utils.partition_uniform (0.19.8); a stage may hold the embedding spec alone"),
    ),
    "torchtitan": EngineRules(
        name="torchtitan", recipe=FSDP2_MIXED, low_precision_recipe=FSDP2_MIXED, zero_stages=(0, 2, 3),
        max_zero_with_pp=3,
        supports_cp=True, cp_comm_types=("allgather",), cp_gather_overlaps_local=True, supports_interleaved=True,
        sp_modes_with_tp=(1,),
        recompute_modes=("none", "selective", "full"), pipeline_split="torchtitan", empty_edge_chunks=True,
        interleaved_needs_pp_multiple=False, attention_kernels=("fused", "flash"),
        kernel_stack="pytorch", activation_offload=False, recompute_stops_early=True,
        expert_ranks_from=("dp", "cp"), etp_choices="one_or_tp", ep_overlap=False,
        dispatchers=("alltoall", "deepep"),
        pipeline_schedules=("1f1b", "dualpipev"), fp8_recipes=("tensorwise", "rowwise"), tp_comm_overlap=False,
        selective_saves="alternate_matmuls", loss_bytes_per_logit=EAGER_LOSS_BYTES_PER_LOGIT,
        frees_grads_between_steps=True, saves_gathered_gemm_inputs=True, eager_pytorch_model=True,
        fsdp_root_stays_gathered=True, pipeline_fsdp_unsharded=True, shards_over_cp=True,
        source=(
            "torchtitan 0.3: scaled_dot_product_attention (cuDNN first: 0.2.2 and 0.3.0 run sdpa_kernel("
            "[CUDNN_ATTENTION, FLASH_ATTENTION, MATH], set_priority=True); flash where cuDNN cannot), "
            "FSDP2 (reshard_after_forward = ZeRO-3, never = ZeRO-2), DDP replicate, "
            "TP with SequenceParallel norms, Interleaved1F1B and DualPipeV (pipeline_parallel_schedule; V-style "
            "stages, two per rank; 0.3.0 runs torch's ScheduleDualPipeV without the expert-parallel overlap hooks "
            "0.2.2 had), quantize.linear.float8 recipe_name tensorwise|rowwise (torchao), "
            "context_parallel through PyTorch's ring attention "
            "(its default rotate method all-gathers K and V asynchronously under the local chunk's attention), "
            "activation_checkpoint mode none/selective/full through torch.utils.checkpoint with "
            "(selective_ac_option 'op': its policy saves the outputs of every other aten.mm and of SDPA) "
            "use_reentrant=False (early stop on: recomputation ends at the last tensor backward needs), "
            "expert_parallel_degree borrowed from dp_shard·cp and expert_tensor_parallel_degree 1 or tp, "
            "parallelism.expert_parallel_comm_backend standard|deepep (DeepEP's normal dispatch and combine kernels, "
            "torchtitan/distributed/deepep; NeMo Automodel's FSDP2 + DeepEP stack; the bf16 hidden states travel as "
            "they are, torchao casts to fp8 inside the expert GEMMs), "
            "pipeline stages from _generate_llm_fqn_per_model_part with pipeline_parallel_first/last_stage_less_layers "
            "(a weight equal to the layers per stage leaves the embedding or the output alone on its stage)"
        ),
    ),
}


def recipe_for(rules: EngineRules, precision: Precision) -> StateRecipe:
    """The engine's state recipe for a GEMM precision."""
    return rules.low_precision_recipe if precision in ("fp8", "fp4") else rules.recipe


def engine_rules(name: str) -> EngineRules:
    """The rules of engine ``name``."""
    if name not in ENGINES:
        raise InputError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})")
    return ENGINES[name]
