"""The flags of ``plan`` and ``evaluate``: their typer declarations, their parsing, and the PlanRequest they make.

The flags' text becomes Python values here (``--tp 4,8`` is ``[4, 8]``, ``--sp both`` is ``[False, True]``) and the
request is built by ``paraplan.request.make_request``, the same call ``paraplan.plan(...)`` makes. A library error
names a parameter; ``flag_of`` spells it as the flag the user typed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from paraplan.choices import NAMED_AXES, SWITCH_AXES
from paraplan.errors import InputError
from paraplan.files import shown
from paraplan.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS

if TYPE_CHECKING:  # annotations only: the library loads when a command runs
    from paraplan.request import FileLayout, PlanRequest

_CLUSTER, _JOB, _CONFIG = "Cluster", "Job", "Parallel configuration"
ModelArg = Annotated[str, typer.Argument(help="Preset name (see 'paraplan models list') or a config.json path.")]
JobModelArg = Annotated[str | None, typer.Argument(
    help="Preset name (see 'paraplan models list') or a config.json path; optional with --from or --config.")]
ClusterOpt = Annotated[str | None, typer.Option(help="Built-in cluster name or a cluster YAML file.",
                                                rich_help_panel=_CLUSTER)]
NodesOpt = Annotated[int | None, typer.Option(help="Nodes of the --cluster.", rich_help_panel=_CLUSTER)]
GpuOpt = Annotated[str | None, typer.Option(help="GPU name for a quick cluster (with --gpus).",
                                            rich_help_panel=_CLUSTER)]
GpusOpt = Annotated[int | None, typer.Option(help="Total GPUs (quick cluster, or to size --cluster).",
                                             rich_help_panel=_CLUSTER)]
PerNodeOpt = Annotated[int | None, typer.Option(help="GPUs per node with --gpu (default 8).",
                                                rich_help_panel=_CLUSTER)]
HardwareFileOpt = Annotated[Path | None, typer.Option(
    "--hardware", help="Your own hardware file (gpus: and clusters: in the catalog's schema) beside the built-in "
                       "catalog; default $PARAPLAN_HARDWARE. See docs/hardware.md.",
    rich_help_panel=_CLUSTER)]
SeqLenOpt = Annotated[int | None, typer.Option(help="Tokens per sequence.", rich_help_panel=_JOB)]
BatchOpt = Annotated[int | None, typer.Option(help="Sequences per optimizer step.", rich_help_panel=_JOB)]
FromOpt = Annotated[Path | None, typer.Option(
    "--from", help="Read model, cluster, batch, precision and layout from a job file: a Megatron-LM launch script or "
                   "log, Megatron-Bridge/NeMo YAML, torchtitan TOML or launch script, DeepSpeed ds_config.json or "
                   "launch script. Flags given here override it.", rich_help_panel="Job file")]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", help="A YAML file of this command's options (seq-len: 4096, gpu: h100-sxm, tp: 8, from: train.sh); "
                     "flags given here override it.", rich_help_panel="Job file")]
EngineOpt = Annotated[str, typer.Option(help="megatron, deepspeed or torchtitan.", rich_help_panel=_JOB)]
PrecisionOpt = Annotated[str, typer.Option(help="GEMM precision: bf16, fp8 or fp4.", rich_help_panel=_JOB)]
AttentionOpt = Annotated[str, typer.Option(
    help="Attention kernel: auto (engine default), fused (cuDNN via Transformer Engine), flash (FlashAttention-2), "
         "unfused.", rich_help_panel=_JOB)]
Fp8RecipeOpt = Annotated[str, typer.Option(
    "--fp8-recipe", help="How fp8 GEMM inputs are scaled: tensorwise (per tensor, current scaling), delayed, rowwise "
                         "(torchao), blockwise (1x128/128x128 tiles) or mxfp8 (Blackwell); with --precision fp8.",
    rich_help_panel="Job")]
DispatcherOpt = Annotated[str, typer.Option(
    help="MoE token dispatcher: auto (engine default), alltoall (each routed copy to its expert's GPU), deepep "
         "(DeepEP: once per destination node, fp8 dispatch with fp8 GEMMs; Megatron's flex dispatcher).",
    rich_help_panel=_JOB)]
CompileOpt = Annotated[bool, typer.Option(
    "--compile/--no-compile", help="torchtitan: the model runs under torch.compile (its memory-bound ops fused; "
    "exported as compile.enable). torchtitan's own default, and paraplan's, is eager.", rich_help_panel=_JOB)]
AsyncTPOpt = Annotated[bool, typer.Option(
    "--async-tp", help="torchtitan with --compile: async tensor parallelism, TP collectives under the matmuls "
    "(exported as compile.enable_async_tensor_parallel).", rich_help_panel=_JOB)]
FusedExpertMlpOpt = Annotated[bool, typer.Option(
    "--fused-expert-mlp", help="MoE, Megatron: the routed experts' MLP runs fused (use_transformer_engine_op_fuser, "
    "Transformer Engine's CuTe DSL grouped MLP); otherwise the eager clamp and expert-bias ops of models that have "
    "them (GPT-OSS) are priced.", rich_help_panel=_JOB)]
HeadroomOpt = Annotated[float, typer.Option(
    help="Fraction of GPU memory to keep free (0-1), on top of paraplan's own fit margin (0.2%, "
         "cost_models/device_memory.py): taken from what the driver exposes less that margin. The plan table and "
         "--json state both.",
    rich_help_panel=_JOB)]
ConventionOpt = Annotated[str, typer.Option(help="Attention FLOPs counted in MFU: full or causal.",
                                            rich_help_panel=_JOB)]
ImbalanceOpt = Annotated[float | None, typer.Option(
    help="MoE: busiest expert-parallel rank's tokens over the mean (1 = force-balanced); default: a balanced "
         "router's sampling noise.", rich_help_panel=_JOB)]
RoutingOpt = Annotated[Path | None, typer.Option(
    help="MoE: routing statistics CSV (layer,expert,next_expert,tokens) that set the imbalance per ep.",
    rich_help_panel=_JOB)]
CapacityOpt = Annotated[float | None, typer.Option(
    help="MoE token dropping: expert capacity as a multiple of the balanced share, padded to it (Megatron "
         "--moe-expert-capacity-factor); default dropless.", rich_help_panel=_JOB)]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write machine-readable JSON to this file "
                                                             "('-': to standard output, the tables to stderr).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing --json file (and exported files).")]
ExportOpt = Annotated[str | None, typer.Option("--export", help="Also write launch configs of the top plan: "
                                               "megatron, deepspeed, torchtitan, slurm, k8s, json or all.")]
ExportOutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Folder for --export.")]
ObjectiveOpt = Annotated[str, typer.Option(help="throughput, cost or memory.")]
TopOpt = Annotated[int, typer.Option(help="How many plans to show.")]
PlaceOpt = Annotated[bool, typer.Option("--place", help="Refine the top plans: host order and layers per stage "
                                        "(automatic on a mixed-GPU topology file).")]
ReportOpt = Annotated[Path | None, typer.Option("--report", help="Also write an HTML report of the plans (figures: "
                                                "pipeline timeline, memory, step time) as DIR/report.html.")]

CP_COMM_HELP = ("How context parallelism moves K and V: p2p (ring), a2a (Ulysses), allgather, a2a+p2p "
                "(all-to-all inside an NVLink domain, ring across); comma list.")
SCHEDULE_HELP = ("Pipeline schedule: 1f1b (interleaved with vpp > 1) or dualpipev (torchtitan's DualPipeV: "
                 "vpp 2, rank 0 holds both model edges); comma list.")
TP_OVERLAP_HELP = ("Megatron --tp-comm-overlap: TP collectives pipelined under their GEMMs (tp > 1, sequence "
                   "parallel):")


def axis_option(text: str) -> Any:
    """The typer option of a parallel-configuration flag (annotated ``str | None``): one value or a comma list."""
    return typer.Option(help=text, rich_help_panel=_CONFIG)


# -- flag text -> Python values ---------------------------------------------------------------------------------
_SWITCHES: dict[str, list[bool]] = {"on": [True], "off": [False], "both": [False, True]}
_FLAGS = {"model": "MODEL", "compiled": "--compile", "memory_headroom_frac": "--headroom",
          "tp_overlap": "--tp-comm-overlap", "store": "--store"}
"""Parameters whose flag is not ``--`` and the parameter with ``-`` for ``_``."""


def flag_of(parameter: str) -> str:
    """The flag that sets ``parameter`` of paraplan.request (``seq_len`` is ``--seq-len``)."""
    return _FLAGS.get(parameter, "--" + parameter.replace("_", "-"))


def parse_ints(flag: str, text: str, minimum: int = 1, maximum: int | None = None,
               max_values: int | None = None) -> list[int]:
    """``"8"`` or ``"4,8"`` as sorted unique ints within bounds (at most ``max_values`` of them); InputError
    naming the flag otherwise."""
    parts = [part.strip() for part in text.split(",")]
    if max_values is not None and len(parts) > max_values:
        raise InputError(f"--{flag} takes at most {max_values} values, got {len(parts):,}: search those that "
                         "matter, or leave it out to let the search choose")
    # at most 18 digits: int() of a longer run is slow past 4,300 digits and no bound here reaches 10^18
    ok = all(re.fullmatch(r"[0-9]{1,18}", part) for part in parts)
    values = sorted({int(part) for part in parts}) if ok else []
    if not ok or values[0] < minimum or (maximum is not None and values[-1] > maximum):
        span = f"integers from {minimum} to {maximum:,}" if maximum is not None else f"integers >= {minimum}"
        example = "8 or 4,8" if minimum > 0 else f"{minimum} or {minimum},{minimum + 1}"
        raise InputError(f"--{flag} expects one value or a comma list of {span} (e.g. {example}), got {shown(text)}")
    return values


def parse_names(flag: str, text: str, known: dict[str, Any]) -> list[Any]:
    """A comma list of names from ``known``, each as ``known`` maps it (a list maps to several values)."""
    parts = [part.strip() for part in text.split(",")]
    unknown = [part for part in parts if part not in known]
    if unknown:
        raise InputError(f"--{flag} expects {', '.join(known)} (or a comma list of them), got {shown(text)}")
    values: list[Any] = []
    for part in parts:
        mapped = known[part]
        values += mapped if isinstance(mapped, list) else [mapped]
    return list(dict.fromkeys(values))


def axis_values(**flags: str | None) -> dict[str, list[Any]]:
    """The axes the config flags fix, as Python values (paraplan.request.axis_codes takes them)."""
    fixed: dict[str, list[Any]] = {}
    for axis, text in flags.items():
        if text is None:
            continue
        if axis in NAMED_AXES:
            fixed[axis] = parse_names(flag_of(axis)[2:], text, {name: name for name in NAMED_AXES[axis]})
        elif axis in SWITCH_AXES:
            fixed[axis] = parse_names(flag_of(axis)[2:], text, _SWITCHES)
        else:
            fixed[axis] = parse_ints(axis, text, *_AXIS_BOUNDS.get(axis, (1, MAX_GPUS)), max_values=MAX_AXIS_VALUES)
    return fixed


MAX_AXIS_VALUES = 32
"""Values of one integer axis in a comma list: the search multiplies the lists (ep x etp x the shapes), so 64 values
of each on a million GPUs took half a minute; useful lists have a handful."""
_AXIS_BOUNDS = {"zero": (0, 3), "offload": (0, MAX_LAYERS), "vpp": (1, MAX_LAYERS), "mbs": (1, MAX_GLOBAL_BATCH)}
"""Each integer axis's range (the parallel degrees: 1 to MAX_GPUS), so no degree overflows the search's int64
products (three degrees of 2^20 multiply to 2^60) and a 1,000-digit one is refused where it is read."""

MAX_FLAG_INT = 2**63
"""An integer flag (or --config value) past int64 sizes nothing, each size has its own far lower bound, and echoing a
1,000-digit one in that bound's message would fill a screen."""


def check_int_range(values: dict[str, Any]) -> None:
    """InputError for the first integer value of at least MAX_FLAG_INT in magnitude, shown cut to a few digits."""
    for name, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_FLAG_INT:
            raise InputError(f"{flag_of(name)} {shown(value)} is out of range (at most {MAX_FLAG_INT - 1:,})")


AXIS_FLAGS = ("tp", "pp", "dp", "cp", "cp_comm", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp", "offload",
              "pp_schedule", "tp_comm_overlap")
"""The configuration flags of plan and evaluate (parameter names of the commands)."""


def request_from_flags(flags: dict[str, Any], compare: FileLayout | None = None,
                       extra_axes: dict[str, list[bool]] | None = None) -> PlanRequest:
    """The PlanRequest of ``plan``'s or ``evaluate``'s parsed flags (their parameters by name)."""
    from paraplan.request import make_request, run_options

    check_int_range(flags)
    run = run_options(flags["tokens"], flags["steps"], flags["price_per_gpu_hour"], flags["failure_rate_per_gpu_hour"],
                      flags["checkpoint_write_gbps"], flags["checkpoint_load_gbps"], flags["checkpoint"],
                      flags["restart_s"])
    axes = axis_values(**{("tp_overlap" if name == "tp_comm_overlap" else name): flags[name] for name in AXIS_FLAGS})
    axes.update(extra_axes or {})  # a job file's axes that have no flag
    return make_request(
        flags["model"], seq_len=flags["seq_len"], global_batch=flags["global_batch"], gpu=flags["gpu"],
        gpus=flags["gpus"], gpus_per_node=flags["gpus_per_node"], cluster=flags["cluster"], nodes=flags["nodes"],
        hardware=flags["hardware"], objective=flags.get("objective", "throughput"), top=flags.get("top", 5),
        place=flags.get("place", False), cost_model=flags["cost_model"], store=flags["store"],
        stack_profile=flags["stack_profile"], price_per_gpu_hour=flags["price_per_gpu_hour"], run=run,
        routing=flags["routing"], compare=compare, precision=flags["precision"], engine=flags["engine"],
        attention=flags["attention"], flops_convention=flags["flops_convention"],
        memory_headroom_frac=flags["headroom"], expert_imbalance=flags["expert_imbalance"],
        capacity_factor=flags["capacity_factor"], dispatcher=flags["dispatcher"], compiled=flags["compile_model"],
        async_tp=flags["async_tp"], fp8_recipe=flags["fp8_recipe"], fused_expert_mlp=flags["fused_expert_mlp"],
        **axes)
