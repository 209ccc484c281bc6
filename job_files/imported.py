"""What a job file says: one frozen ImportedJob, each value with the ``file:line`` it came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from paraplan.errors import InputError
from paraplan.files import shown
from paraplan.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_LAYERS, MAX_SEQ_LEN
from paraplan.model_specs.model_spec import ModelSpec

FORMATS: dict[str, str] = {
    "megatron-script": "Megatron-LM launch script (torchrun ... pretrain_gpt.py --tensor-model-parallel-size ...)",
    "megatron-log": "Megatron-LM training log (its '---- arguments ----' block)",
    "megatron-bridge": "Megatron-Bridge / NeMo ConfigContainer YAML (model.tensor_model_parallel_size, train.*)",
    "torchtitan-toml": "torchtitan 0.2 job TOML ([parallelism] tensor_parallel_degree, [training] seq_len)",
    "torchtitan-args": "torchtitan 0.3 launch (--module/--config and --parallelism.* overrides)",
    "deepspeed-json": "DeepSpeed ds_config.json (train_batch_size, zero_optimization.stage)",
    "deepspeed-script": "DeepSpeed launch (deepspeed --num_nodes N --num_gpus G train.py --deepspeed_config ...)",
}
"""Every format a job file may be in, with what identifies it."""

LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "cp_comm", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp", "offload",
               "pp_schedule", "tp_overlap", "ep_overlap")
"""The parallel layout, named as ParallelConfig's fields."""
JOB_KEYS = ("attention", "dispatcher", "capacity_factor", "compiled", "async_tp", "fused_expert_mlp")
"""TrainingJob choices beyond model, sequence, batch and precision."""
REQUIRED = ("model", "gpu", "num_gpus", "seq_len", "global_batch")
"""What a prediction needs from the file or the command line."""
DEFAULT = "engine default"
COUNT_BOUNDS = {
    **dict.fromkeys(("num_gpus", "num_nodes", "tp", "pp", "dp", "cp", "ep", "etp", "vpp"), (1, MAX_GPUS)),
    "gpus_per_node": (1, MAX_GPUS_PER_NODE), "global_batch": (1, MAX_GLOBAL_BATCH), "mbs": (1, MAX_GLOBAL_BATCH),
    "seq_len": (1, MAX_SEQ_LEN), "zero": (0, 3), "offload": (0, MAX_LAYERS),
}
"""The range of every count a job file states (paraplan.limits gives the reasons): a 0 would divide by zero, a
50-digit data-parallel degree would fill the message."""
"""Source of a value the engine assumes when the file leaves it out."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportedJob:
    """A training job as a launch script, log or config file states it."""

    path: str
    """The file read."""
    format: str
    """One of FORMATS."""
    engine: str
    """megatron, deepspeed or torchtitan."""
    model: str | None = None
    """A preset name or a config.json path the file names (None when it states the architecture instead)."""
    model_spec: ModelSpec | None = None
    """The architecture built from the file's own model arguments (None when it names a model)."""
    model_problem: str | None = None
    """Why the file's model arguments do not make a model (say, no vocabulary size), when they do not."""
    gpu: str | None = None
    """GPU name (launch files rarely say; paraplan's own exports do, in their header)."""
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    num_gpus: int | None = None
    """World size: GPUs the job runs on."""
    seq_len: int | None = None
    """Tokens per sequence."""
    global_batch: int | None = None
    """Sequences per optimizer step."""
    local_batch: int | None = None
    """Sequences per data-parallel rank per step, where the file sets no global batch and its world size is
    not known yet (global = local x data-parallel, as torchtitan's -1 and Megatron's default make it)."""
    precision: str | None = None
    """bf16, fp8 or fp4 (GEMM precision)."""
    fp8_recipe: str | None = None
    """fp8 scaling recipe (cost_models.fp8_recipes.FP8_RECIPES), with precision fp8."""
    job: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    """JOB_KEYS the file sets."""
    layout: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    """LAYOUT_KEYS the file sets (or its engine assumes): ints, names and booleans as ParallelConfig takes them."""
    sources: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    """Where each value came from: ``file:line``, or DEFAULT."""
    notes: tuple[str, ...] = ()
    """What was read but is priced differently or not at all (one sentence each)."""

    @property
    def missing(self) -> tuple[str, ...]:
        """REQUIRED values the file does not give."""
        have = {"model": self.model is not None or self.model_spec is not None, "gpu": self.gpu is not None,
                "num_gpus": self.num_gpus is not None, "seq_len": self.seq_len is not None,
                "global_batch": self.global_batch is not None or self.local_batch is not None}
        return tuple(name for name in REQUIRED if not have[name])

    def describe(self) -> dict[str, Any]:
        """Plain values for JSON: what was read and from where."""
        model = self.model if self.model is not None else (self.model_spec.name if self.model_spec else None)
        return {"file": self.path, "format": self.format, "engine": self.engine, "model": model, "gpu": self.gpu,
                "num_nodes": self.num_nodes, "gpus_per_node": self.gpus_per_node, "num_gpus": self.num_gpus,
                "seq_len": self.seq_len, "global_batch": self.global_batch, "local_batch": self.local_batch,
                "precision": self.precision,
                "fp8_recipe": self.fp8_recipe, "job": dict(self.job), "layout": dict(self.layout),
                "sources": dict(self.sources), "missing": list(self.missing), "notes": list(self.notes)}


class Facts:
    """Collects what a reader finds, then checks it once and freezes it into an ImportedJob."""

    def __init__(self, path: str, fmt: str, engine: str) -> None:
        self.path, self.format, self.engine = path, fmt, engine
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.notes: list[str] = []

    def at(self, line: int | None) -> str:
        """``file:line`` (or just the file when the line is unknown)."""
        return f"{self.path}:{line}" if line else self.path

    def put(self, key: str, value: Any, where: str) -> None:
        """Record ``key`` (a field of ImportedJob, a LAYOUT_KEYS or JOB_KEYS name) unless already set; a count
        outside its plausible range (COUNT_BOUNDS) is refused here, before any arithmetic divides by it."""
        if value is None or key in self.values:
            return
        if key in COUNT_BOUNDS and isinstance(value, int) and not isinstance(value, bool):
            low, high = COUNT_BOUNDS[key]
            if not low <= value <= high:
                raise InputError(f"{where}: {key} = {shown(value)} is out of range (from {low} to {high:,})")
        self.values[key] = value
        self.sources[key] = where

    def default(self, key: str, value: Any) -> None:
        """An engine default for a value the file leaves out."""
        self.put(key, value, DEFAULT)

    def note(self, text: str) -> None:
        """Add ``text`` to the notes shown with the import (once)."""
        if text not in self.notes:
            self.notes.append(text)

    def build(self) -> ImportedJob:
        """The ImportedJob, after the cross-checks a file can fail on its own."""
        v = self.values
        self.derive_world()
        self._check_world()
        self._check_batch()
        if v.get("zero", 0) > 0 and v.get("dp", 0) * v.get("cp", 1) == 1:
            # One data-parallel rank: nothing to shard, and the search refuses the duplicate row.
            self.note(f"ZeRO / distributed optimizer ({self.sources['zero']}) over one data-parallel rank is priced "
                      "as none")
            v["zero"], self.sources["zero"] = 0, f"{self.sources['zero']} (one data-parallel rank)"
        spec = v.get("model_spec")
        return ImportedJob(
            path=self.path, format=self.format, engine=self.engine, model=v.get("model"), model_spec=spec,
            model_problem=v.get("model_problem"),
            gpu=v.get("gpu"), num_nodes=v.get("num_nodes"), gpus_per_node=v.get("gpus_per_node"),
            num_gpus=v.get("num_gpus"), seq_len=v.get("seq_len"), global_batch=v.get("global_batch"),
            local_batch=v.get("local_batch") if "global_batch" not in v else None,
            precision=v.get("precision"), fp8_recipe=v.get("fp8_recipe"),
            job=MappingProxyType({k: v[k] for k in JOB_KEYS if k in v}),
            layout=MappingProxyType({k: v[k] for k in LAYOUT_KEYS if k in v}),
            sources=MappingProxyType(dict(self.sources)), notes=tuple(self.notes))

    def derive_world(self) -> None:
        """World size from nodes x GPUs per node (or nodes from the other two), once the launcher is read."""
        v = self.values
        if "num_gpus" not in v and "num_nodes" in v and "gpus_per_node" in v:
            self.put("num_gpus", v["num_nodes"] * v["gpus_per_node"],
                     f"{self.sources['num_nodes']} (nodes x GPUs per node)")
        if "num_nodes" not in v and "num_gpus" in v and "gpus_per_node" in v and \
                v["num_gpus"] % v["gpus_per_node"] == 0:
            self.put("num_nodes", v["num_gpus"] // v["gpus_per_node"], self.sources["num_gpus"])

    def _check_world(self) -> None:
        v = self.values
        if {"num_gpus", "num_nodes", "gpus_per_node"} <= v.keys() and \
                v["num_nodes"] * v["gpus_per_node"] != v["num_gpus"]:
            raise InputError(f"{self.sources['num_gpus']}: world size {v['num_gpus']} is not {v['num_nodes']} nodes x "
                             f"{v['gpus_per_node']} GPUs ({self.sources['num_nodes']}); make them agree")
        shape = v.get("tp", 1) * v.get("pp", 1) * v.get("cp", 1)
        if "num_gpus" in v and "dp" in v and shape * v["dp"] != v["num_gpus"]:
            raise InputError(f"{self.sources['dp']}: tp·pp·cp·dp = {shape}·{v['dp']} = {shape * v['dp']} does not "
                             f"match the world size {v['num_gpus']} ({self.sources['num_gpus']}); fix one of them")
        if "num_gpus" in v and v["num_gpus"] % shape:
            where = next((self.sources[k] for k in ("tp", "pp", "cp") if self.sources.get(k, DEFAULT) != DEFAULT),
                         self.path)
            raise InputError(f"{where}: tp·pp·cp = {shape} does not divide the world size {v['num_gpus']} "
                             f"({self.sources['num_gpus']}); choose degrees whose product divides it")
        if "num_gpus" in v and "dp" not in v:
            self.put("dp", v["num_gpus"] // shape, f"world size / (tp·pp·cp) ({self.sources['num_gpus']})")

    def _check_batch(self) -> None:
        v = self.values
        if {"global_batch", "mbs", "dp"} <= v.keys() and v["global_batch"] % (v["mbs"] * v["dp"]):
            raise InputError(f"{self.sources['global_batch']}: global batch {v['global_batch']} is not a multiple of "
                             f"micro-batch {v['mbs']} x data-parallel {v['dp']}; fix the batch sizes")
