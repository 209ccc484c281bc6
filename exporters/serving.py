"""Launch files for one deployment of a serving plan: vLLM, SGLang, TensorRT-LLM, Kubernetes and JSON.

``serving_files(document, plan_index, fmt)`` builds the files of a format from the serving-plan
document (already schema-checked by the caller); ``export_serving`` writes them transactionally with
exporters/writer.py. An engine format must match the deployment's engine, as a training plan's must.
``all`` is json + the engine's files + k8s (k8s left out, with the reason in the header, when a
worker spans nodes). Every file but the JSON starts with a header comment: the deployment, its
predicted latency and throughput, and the engine version its flags were checked against.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from paraplan.choices import SERVING_ENGINES
from paraplan.errors import InputError
from paraplan.exporters.program import OutputFile, already_built, comment_block
from paraplan.exporters.serving_engines import (
    EAGLE_HEAD_PLACEHOLDER,
    ENGINE_VERSIONS,
    engine_options,
    expressible,
    trtllm_options,
)
from paraplan.exporters.serving_launch import Deployment, k8s_manifest, serve_script, share, trtllm_disagg_config
from paraplan.exporters.serving_pools import place, pool_labels, read_pool
from paraplan.exporters.writer import check_destination, write_files
from paraplan.planner.serving.pool_shape import ServingPool
from paraplan.version import __version__

SERVING_FORMATS = (*SERVING_ENGINES, "k8s", "json", "all")
PLAN_FILE = "serving-plan.json"
MAX_EXPORT_GPUS = 65_536
"""Largest deployment exported from a plan file: serve.sh holds a branch per node (8,192 nodes of 8 GPUs); a file
claiming more is refused rather than written as megabytes of shell."""
_MODES = {"agg": ("aggregated",), "disagg": ("prefill", "decode")}  # the pool roles each mode needs, in order
__all__ = ["SERVING_FORMATS", "export_serving", "expressible", "serving_files"]


def _deployment(document: dict[str, Any], plan_index: int) -> Deployment:
    plans = document.get("plans") or []
    if not 0 <= plan_index < len(plans):
        raise InputError(f"plan index {plan_index} is out of range: this serving plan holds {len(plans)} "
                         f"deployment(s), 0 to {len(plans) - 1}")
    entry, where = plans[plan_index], f"plans[{plan_index}]"
    if entry.get("engine") not in SERVING_ENGINES or entry.get("mode") not in _MODES:
        raise InputError(f"{where}: engine must be one of {', '.join(SERVING_ENGINES)} and mode agg or disagg, got "
                         f"{entry.get('engine')!r} / {entry.get('mode')!r}")
    pools = [read_pool(pool, f"{where}.pools[{i}]") for i, pool in enumerate(entry.get("pools") or [])]
    roles = tuple(pool.role for pool in pools)
    if roles != _MODES[entry["mode"]] and not (entry["mode"] == "agg" and roles and set(roles) == {"aggregated"}):
        need = "one or more aggregated pools" if entry["mode"] == "agg" else "pools prefill, decode in that order"
        raise InputError(f"{where}: a {entry['mode']} deployment needs {need}, got {', '.join(roles) or 'none'}")
    _check_traffic(pools, where)
    if entry["mode"] == "disagg" and not isinstance(entry.get("kv_transfer"), dict):
        raise InputError(f"{where}: a disagg deployment needs kv_transfer (backend nixl, mooncake or ucx)")
    for pool in pools:
        reason = expressible(entry["engine"], pool)
        if reason:
            raise InputError(f"{where} cannot be exported: {reason}")
    model = document.get("model") or {}
    # model.path is the folder holding config.json, which engines load (weights beside it): launch it, not its parent
    name = model.get("hf_repo") or model.get("path") or model.get("name")
    # one aggregated pool keeps the plain name; otherwise each pool's label (role, or role-i when several) names it
    options = ({"aggregated": "extra-llm-api-options.yaml"} if roles == ("aggregated",) else
               {label: f"extra-llm-api-options-{label}.yaml" for label in pool_labels(pools)})
    return Deployment(entry=entry, pools=pools, model=str(name or "MODEL"), processes=tuple(place(pools)),
                      options_files=options if entry["engine"] == "trtllm" else {})


def _check_traffic(pools: list[ServingPool], where: str) -> None:
    """traffic_frac is all or nothing over the pools of a role, and sums to 1 there (the planner rounds: 1e-3)."""
    for role in dict.fromkeys(pool.role for pool in pools):
        fracs = [pool.traffic_frac for pool in pools if pool.role == role]
        if fracs.count(None) not in (0, len(fracs)):
            raise InputError(f"{where}: traffic_frac is given for some {role} pools but not all")
        total = sum(f for f in fracs if f is not None)
        if fracs[0] is not None and abs(total - 1) > 1e-3:
            raise InputError(f"{where}: the {role} pools' traffic_frac must sum to 1, got {total:g}")


def _ms(estimate: dict[str, Any], key: str, percentile: Any) -> str:
    """A latency of the estimate: one number, or the planner's statistics (the targets' percentile and the mean)."""
    value = estimate.get(key)
    if isinstance(value, dict):
        at, mean = value.get(f"p{percentile}"), value.get("mean")
        if isinstance(at, int | float) and isinstance(mean, int | float):
            return f"p{percentile} {at * 1e3:.1f} ms (mean {mean * 1e3:.1f} ms)"
    return f"{value * 1e3:.1f} ms" if isinstance(value, int | float) else "n/a"


def header(document: dict[str, Any], dep: Deployment) -> list[str]:
    """What the deployment is and predicts, for the top of every launch file."""
    e, w = dep.entry, document.get("workload", {})
    quant, estimate = e["quantization"], e.get("estimate") or {}
    load = f"rate {w['rate_per_s']:g}/s" if w.get("rate_per_s") else f"concurrency {w.get('concurrency')}"
    rates = ", ".join(f"{key} {value:.4g}" for key, value in estimate.items()
                      if key.endswith("_per_s") and isinstance(value, int | float)) or "throughput n/a"
    transfer = f", KV transfer {e['kv_transfer']['backend']} over {e['kv_transfer']['link']}" if e.get("kv_transfer") \
        else ""
    gpus = {gpu: sum(p.num_workers * p.gpus_per_worker for p in dep.pools if p.gpu == gpu) for gpu in dep.gpu_types}
    mixed = f" ({' + '.join(f'{n} {gpu}' for gpu, n in gpus.items())})" if len(gpus) > 1 else ""
    lines = [(f"Generated by paraplan {__version__} from serving plan rank {e.get('rank')}: "
             f"{document.get('model', {}).get('name')}, ISL {w.get('isl')} / OSL {w.get('osl')} tokens, {load}."),
             (f"{e['engine']} {e['mode']} on {e['num_gpus']} GPUs{mixed}; weights {quant['weights']}, experts "
             f"{quant['experts']}, KV cache {quant['kv_cache_dtype']}{transfer}.")]
    lines += [f"{label}: {p.num_workers} worker(s) x {p.gpus_per_worker} {p.gpu}: tp {p.tp} pp {p.pp} dp_attention "
              f"{p.dp_attention} moe_ep {p.moe_ep} moe_tp {p.moe_tp}; max_batch {p.max_batch}, max_batched_tokens "
              f"{p.max_batched_tokens}, memory_frac {p.memory_frac:g}, max_model_len {p.max_model_len}"
              + (f"; {share(p)}" if p.traffic_frac is not None and label != p.role else "")  # several share the role
              for label, p in zip(dep.labels, dep.pools, strict=True)]
    at = w.get("percentile")
    lines += [(f"Predicted: TTFT {_ms(estimate, 'ttft_s', at)}, TPOT {_ms(estimate, 'tpot_s', at)}, {rates}; meets "
               f"targets: {e.get('meets_targets')}."), f"Flags checked against {ENGINE_VERSIONS[dep.engine]}."]
    if quant["weights"] not in ("bf16", "fp8") or quant["experts"] != quant["weights"]:
        lines.append(f"Weights {quant['weights']} / experts {quant['experts']}: load a checkpoint quantized so; the "
                     "engine reads its quantization_config (no flag selects it).")
    return lines + _options_lines(e)


def _options_lines(entry: dict[str, Any]) -> list[str]:
    """The header lines of the plan's engine options (none at the defaults)."""
    graphs, spec = engine_options(entry)
    lines = [] if graphs else ["CUDA graphs off: decode kernels launch eagerly (priced at their host launch cost)."]
    if spec is not None:
        lines.append(f"Speculative decoding: {spec['method']}, {spec['num_tokens']} draft tokens per step, acceptance "
                     f"{spec['acceptance_frac']:g} per token: {spec['expected_tokens_per_step']:.3g} tokens per step "
                     "(priced).")
        if spec["method"] == "eagle" and not spec.get("draft_model"):
            lines.append(f"Replace {EAGLE_HEAD_PLACEHOLDER} with the EAGLE head's path or repo id.")
    return lines


def _names(fmt: str, dep: Deployment, k8s_ok: bool) -> list[str]:
    engine_files = ["serve.sh", *dep.options_files.values()]
    if dep.engine == "trtllm" and dep.entry["mode"] == "disagg":
        engine_files.append("disagg-config.yaml")
    per_format = {"json": [PLAN_FILE], "k8s": ["k8s.yaml"], dep.engine: engine_files}
    chosen = ["json", dep.engine] + (["k8s"] if k8s_ok else []) if fmt == "all" else [fmt]
    return [name for part in chosen for name in per_format[part]]


def _check_format(fmt: str, engine: str) -> None:
    if fmt not in SERVING_FORMATS:
        raise InputError(f"--export expects one of {', '.join(SERVING_FORMATS)}, got {fmt!r}")
    if fmt in SERVING_ENGINES and fmt != engine:
        raise InputError(f"--export {fmt} needs a deployment for {fmt}; this one is for {engine} (export "
                         f"--export {engine}, or choose a {fmt} deployment of the plan)")


def serving_files(document: dict[str, Any], plan_index: int, fmt: str) -> list[OutputFile]:
    """Every file of ``fmt`` for deployment ``plan_index`` of a serving-plan document."""
    if fmt not in SERVING_FORMATS:
        _check_format(fmt, "")
    dep = _deployment(document, plan_index)
    _check_format(fmt, dep.engine)
    lines = header(document, dep)
    k8s_ok = all(pool.nodes_per_worker == 1 for pool in dep.pools)
    if fmt == "all" and not k8s_ok:
        lines = lines + ["k8s.yaml not written: a worker spans several nodes (a Deployment pod holds one node)."]
    options = [_options_file(dep, label, name, lines) for label, name in dep.options_files.items()]
    name = re.sub(r"[^a-z0-9]+", "-", str(document.get("model", {}).get("name", "model")).rsplit("/", 1)[-1].lower())
    builders: dict[str, Callable[[], OutputFile]] = {
        PLAN_FILE: lambda: OutputFile(name=PLAN_FILE, text=json.dumps(document, indent=2) + "\n"),
        "serve.sh": lambda: serve_script(dep, lines),
        "k8s.yaml": lambda: k8s_manifest(dep, (name.strip("-")[:40] or "model") + "-serve", lines, options),
        "disagg-config.yaml": lambda: trtllm_disagg_config(dep, lines),
        **{f.name: already_built(f) for f in options},
    }
    return [builders[file_name]() for file_name in _names(fmt, dep, k8s_ok)]


def _options_file(dep: Deployment, label: str, name: str, lines: list[str]) -> OutputFile:
    pool = dep.pools[dep.labels.index(label)]
    body = yaml.safe_dump(trtllm_options(pool, dep.entry), sort_keys=False, default_flow_style=False)
    return OutputFile(name=name, text=comment_block(lines + [(f"trtllm-serve --extra_llm_api_options {name} ({label} "
                                                             "workers)")]) + "\n" + body)


def serving_plan_index(document: dict[str, Any], rank: int | None, origin: str) -> int:
    """A serving plan file checked against its schema, and the index of the plan ranked ``rank`` (None: the best)."""
    from paraplan.files import one_line
    from paraplan.planner.json_schema import schema_errors
    from paraplan.planner.serving.plan import serving_schema

    problems = schema_errors(document, serving_schema())
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(f"{origin} does not match the serving plan schema: {one_line(problems[0], 160)}{more}")
    ranks = [plan["rank"] for plan in document["plans"]]
    if not ranks:
        raise InputError(f"{origin}: the file holds no serving plans")
    wanted = min(ranks) if rank is None else rank
    if wanted not in ranks:
        raise InputError(f"{origin} holds plans ranked {min(ranks)} to {max(ranks)}, not {rank}")
    index = ranks.index(wanted)
    gpus = sum(p["workers"] * p["gpus_per_worker"] for p in document["plans"][index]["pools"])
    if gpus > MAX_EXPORT_GPUS:
        raise InputError(f"{origin} plan ranked {wanted} uses {gpus} GPUs; launch files are written for at most "
                         f"{MAX_EXPORT_GPUS:,} (a serve.sh branch per node)")
    return index


def read_serving_plan(path: Path, rank: int | None = None) -> tuple[dict[str, Any], int]:
    """A serving plan file ('paraplan serve --json') through the guarded reader and its schema, and the index of
    the plan ranked ``rank`` (None: the best)."""
    from paraplan.exporters.plan_input import is_serving_document, read_plan_document

    document = read_plan_document(path)
    if not is_serving_document(document):
        raise InputError(f"{path} is not a serving plan file (write one with 'paraplan serve ... --json {path}')")
    return document, serving_plan_index(document, rank, str(path))


def export_serving(document: dict[str, Any], plan_index: int, fmt: str, out_dir: Path, force: bool) -> list[Path]:
    """Write the files of ``fmt`` into ``out_dir`` (nothing outside it; existing files only with ``force``)."""
    files = serving_files(document, plan_index, fmt)
    check_destination(out_dir, [f.name for f in files], force)
    return write_files(out_dir, files, force)
