"""paraplan as a library for serving: ``paraplan.serve(...)`` runs ``paraplan serve``'s search and returns its plans
and its schema-checked JSON document. Bad input raises ``paraplan.InputError`` with the CLI's one-line message.

    import paraplan
    result = paraplan.serve("llama-3.1-70b", gpu="h100-sxm", gpus=16, isl=1024, osl=1024, rate=4.0,
                            ttft_ms=1000, tpot_ms=30, percentile=90)
    best = result.plans[0]
    best.estimate["ttft_s"]["p90"], best.estimate["tokens_per_s_per_gpu"]
    result.document                      # what `paraplan serve --json` writes
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraplan.errors import InputError

if TYPE_CHECKING:
    from paraplan.hardware_profiles import Catalog

SERVING_AXES = ("tp", "pp", "ep", "dp_attention", "batch", "chunk")


@dataclass(frozen=True, slots=True)
class ServeResult:
    """The ranked serving plans of one search, its Pareto front, counts and JSON document."""

    plans: list
    """planner.serving.plan.ServingPlan, best first."""
    pareto: list[dict]
    considered: int
    feasible: int
    document: dict[str, Any]
    problem: Any
    """The planner.serving.rank.ServingProblem that was searched."""


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, (str, int, float)):
        return [value]
    return list(value)


def serving_clusters(gpu: str | Sequence[str] | None, gpus: int | Sequence[int] | None, cluster: str | None = None,
                     nodes: int | None = None, gpus_per_node: int | None = None,
                     catalog: Catalog | None = None) -> tuple:
    """One cluster per GPU type: ``gpu`` names with one count each in ``gpus``, or one ``cluster`` (a built-in
    name or a cluster YAML file, sized by ``nodes`` or ``gpus``), names looked up in ``catalog`` (None: the
    built-in one)."""
    from paraplan.hardware_profiles import quick_cluster
    from paraplan.request import ClusterSource, build_cluster

    names, counts = _as_list(gpu), _as_list(gpus)
    if names and not counts:
        raise InputError("--gpu needs --gpus N (the GPUs available of that type)")
    if not names and cluster is None:
        raise InputError("give --gpu NAME --gpus N (comma lists for several GPU types) or --cluster NAME|FILE")
    if cluster is not None or len(names) <= 1:
        if len(counts) > 1:
            raise InputError(f"--gpus lists {len(counts)} counts: give one for one GPU type or cluster")
        source = ClusterSource(cluster=cluster, nodes=nodes, gpu=names[0] if names else None,
                               gpus=counts[0] if counts else None,
                               gpus_per_node=8 if gpus_per_node is None and names else gpus_per_node)
        return (build_cluster(source, catalog),)
    if not names or len(counts) != len(names):
        raise InputError(f"--gpu lists {len(names)} GPU type(s): give --gpus with one count each (e.g. --gpus "
                         f"{','.join(['8'] * max(len(names), 1))})")
    if len(set(names)) != len(names):
        raise InputError(f"--gpu {','.join(names)[:60]}: each GPU type once")
    return tuple(quick_cluster(name, int(n), 8 if gpus_per_node is None else gpus_per_node, catalog=catalog)
                 for name, n in zip(names, counts))


def _prices(price: float | Sequence[float] | None, types: int) -> tuple[float | None, ...]:
    values = _as_list(price)
    if not values:
        return ()
    if len(values) not in (1, types) or any(not (isinstance(v, (int, float)) and 0 <= v < 1e6) for v in values):
        raise InputError(f"--price-per-gpu-hour: non-negative USD, one value or one per --gpu type ({types})")
    return tuple(float(v) for v in (values * types if len(values) == 1 else values))


def engine_knobs(model: Any, memory_fraction: float | None = None, cuda_graphs: bool = True,
                 speculative: str | None = None, spec_tokens: int | None = None,
                 acceptance: float | None = None) -> Any:
    """The ``EngineKnobs`` of ``serve``'s engine settings for ``model`` (a ModelSpec): ``speculative`` is mtp,
    eagle[:MODEL] or draft:MODEL, with ``spec_tokens`` N and per-token ``acceptance`` A (both required with it)."""
    from paraplan.cost_models.serving import EngineKnobs, Speculation, check_speculation

    if isinstance(memory_fraction, bool) or not isinstance(memory_fraction, int | float | None):
        raise InputError(f"--memory-fraction must be a number in (0, 1], got {memory_fraction!r}")
    if speculative is None:
        if spec_tokens is not None or acceptance is not None:
            raise InputError("--spec-tokens and --acceptance go with --speculative mtp|eagle[:MODEL]|draft:MODEL")
        return EngineKnobs(memory_frac=memory_fraction, cuda_graphs=cuda_graphs)
    method, _, draft_name = speculative.partition(":")
    if not ((method == "mtp" and not draft_name) or method == "eagle" or (method == "draft" and draft_name)):
        raise InputError(f"--speculative {speculative[:60]!r}: give mtp, eagle, eagle:MODEL or draft:MODEL")
    if spec_tokens is None or acceptance is None:
        raise InputError("--speculative needs --spec-tokens N (draft tokens per step) and --acceptance A "
                         "(per-token acceptance in [0, 1))")
    if isinstance(acceptance, bool) or not isinstance(acceptance, int | float):
        raise InputError(f"--acceptance must be a number in [0, 1), got {acceptance!r}")
    draft = _draft_spec(draft_name) if method == "draft" else None
    spec = Speculation(method=method, num_tokens=spec_tokens, acceptance_frac=float(acceptance),  # type: ignore[arg-type]
                       draft_model=draft[0] if draft else (draft_name or None), draft=draft[1] if draft else None)
    check_speculation(model, spec)
    return EngineKnobs(memory_frac=memory_fraction, cuda_graphs=cuda_graphs, speculation=spec)


def _draft_spec(name: str) -> tuple[str, Any]:
    """(what the engine loads, ModelSpec) of a draft model given as a preset, config path or cached repo id."""
    from paraplan.model_specs.served import served_model

    draft = served_model(name)
    return draft.hf_repo or draft.path or name, draft.spec


def serve(model: str, *, isl: int, osl: int, gpu: str | Sequence[str] | None = None,
          gpus: int | Sequence[int] | None = None, cluster: str | None = None, nodes: int | None = None,
          gpus_per_node: int | None = None, concurrency: int | None = None, rate: float | None = None,
          arrival: str = "poisson", isl_cv: float = 0.0, osl_cv: float = 0.0, ttft_ms: float | None = None,
          tpot_ms: float | None = None, percentile: int = 50, engines: Sequence[str] | None = None,
          precision: str = "auto", kv_dtypes: Sequence[str] | None = None, modes: Sequence[str] | None = None,
          objective: str = "throughput", price_per_gpu_hour: float | Sequence[float] | None = None, top: int = 5,
          hardware: str | Path | None = None, memory_fraction: float | None = None, cuda_graphs: bool = True,
          speculative: str | None = None, spec_tokens: int | None = None, acceptance: float | None = None,
          **fixed: int | Sequence[int]) -> ServeResult:
    """The best ``top`` serving deployments of ``model`` (an axis in ``fixed``: tp, pp, ep, dp_attention, batch,
    chunk, an int or a list, constrains the search). ``hardware`` is a user hardware file whose GPUs and clusters
    join the built-in catalog (default ``$PARAPLAN_HARDWARE``, as for ``paraplan.plan``). Engine settings, priced
    and exported: ``memory_fraction`` (vLLM gpu_memory_utilization, SGLang mem_fraction_static, TRT-LLM
    free_gpu_memory_fraction, each under its own rule; default each engine's), ``cuda_graphs`` and
    ``speculative`` (mtp, eagle[:MODEL] or draft:MODEL) with ``spec_tokens`` and ``acceptance``."""
    from paraplan.cost_models.serving import ENGINES
    from paraplan.hardware_profiles.user_file import resolve_catalog
    from paraplan.model_specs.served import served_model
    from paraplan.planner.serving.plan import serving_document_of
    from paraplan.planner.serving.problem import ServingProblem
    from paraplan.planner.serving.queueing import parse_arrival
    from paraplan.planner.serving.rank import search_serving
    from paraplan.planner.serving.space import KV_DTYPES, MODES, ServingChoices, ServingWorkload

    unknown = sorted(set(fixed) - set(SERVING_AXES))
    if unknown:
        raise InputError(f"unknown serving axis {unknown[0]!r}: choose from {', '.join(SERVING_AXES)}")
    if top < 1:
        raise InputError(f"--top expects a positive integer, got {top}")
    if rate is not None and not rate > 0:
        raise InputError(f"--rate must be a positive number of requests per second, got {rate}")
    arrivals = parse_arrival(arrival, rate) if rate is not None or arrival != "poisson" else None
    workload = ServingWorkload(isl=isl, osl=osl, isl_cv=isl_cv, osl_cv=osl_cv, concurrency=concurrency,
                               arrivals=arrivals, ttft_target_s=None if ttft_ms is None else ttft_ms / 1e3,
                               tpot_target_s=None if tpot_ms is None else tpot_ms / 1e3, percentile=percentile)
    choices = ServingChoices(engines=tuple(engines or ENGINES), precision=precision,
                             kv_dtypes=tuple(kv_dtypes or KV_DTYPES), modes=tuple(modes or MODES),
                             fixed={axis: tuple(int(v) for v in _as_list(values)) for axis, values in fixed.items()},
                             objective=objective)
    catalog = resolve_catalog(None if hardware is None else Path(hardware))
    clusters = serving_clusters(gpu, gpus, cluster, nodes, gpus_per_node, catalog)
    served = served_model(model)
    knobs = engine_knobs(served.spec, memory_fraction, cuda_graphs, speculative, spec_tokens, acceptance)
    problem = ServingProblem(model=served.spec, clusters=clusters, workload=workload,
                             choices=choices, prices_usd_per_gpu_hour=_prices(price_per_gpu_hour, len(clusters)),
                             knobs=knobs)
    result = search_serving(problem, top)
    return ServeResult(plans=result.plans, pareto=result.pareto, considered=result.considered,
                       feasible=result.feasible, document=serving_document_of(served, problem, result),
                       problem=problem)
