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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraplan.errors import InputError

if TYPE_CHECKING:
    from paraplan.hardware_profiles import Catalog, ClusterSpec
    from paraplan.model_specs.model_spec import ModelSpec
    from paraplan.planner.serving.problem import MeasuredTables
    from paraplan.planner.serving.space import ServingChoices

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
    notes: tuple[str, ...] = ()
    """What the caller should be told (an engine the store holds no tables for, priced analytically)."""


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


def _pins(engine_versions: Mapping[str, str] | None, engines: Sequence[str]) -> dict[str, str]:
    """The engine versions the user pinned, each for an engine the search considers."""
    pins = dict(engine_versions or {})
    for engine, version in pins.items():
        if engine not in engines:
            raise InputError(f"--engine-version {engine}={version}: {engine} is not searched (--engine "
                             f"{','.join(engines)})")
        if not isinstance(version, str) or not version.strip():
            raise InputError(f"--engine-version {engine}: give a version, e.g. {engine}=0.24.0")
    return pins


def _store_of(store: str | Path | None) -> Path:
    """``store`` or the default store; InputError where there is no such file."""
    from paraplan.measurements.store_location import default_store_path

    path = Path(store) if store is not None else default_store_path()
    if not path.is_file():
        raise InputError(f"--store {path}: no such profile store; make one with 'paraplan ingest aiconfigurator WHEEL "
                         f"--hardware GPU --store {path}', or use --cost-model analytical")
    return path


def _gpu_tables(path: Path, cluster: ClusterSpec, model: ModelSpec, choices: ServingChoices, pins: dict[str, str]
                ) -> tuple[list[tuple[tuple[str, str, str], Any]], tuple[str, ...]]:
    """Each (engine, KV dtype) setup's tables on ``cluster``'s GPU and the notes on engines without any; InputError
    where the GPU has none at all or a pinned version is not stored."""
    from paraplan.cost_models.serving import weight_precision
    from paraplan.cost_models.serving_kernel_source import deployment_tables, table_modes
    from paraplan.planner.serving.problem import quant_modes

    gpu, (gemm, experts) = cluster.gpu.name, quant_modes(model, choices.precision)
    found, notes = [], []
    for engine in choices.engines:
        for kv in choices.kv_dtypes:
            attention_16bit = weight_precision(model, gemm, experts, kv).attention_bytes == 2.0
            dense, attention, moe = table_modes(model, gemm, experts, attention_16bit)
            found.append(((gpu, engine, kv), deployment_tables(
                path, gpu, engine=engine, version=pins.get(engine, ""), model=model, dense_mode=dense,
                attention_mode=attention, moe_mode=moe, kv_dtype=kv)))
        mine = [t for (_, e, _), t in found if e == engine and t is not None]
        if not mine:
            notes.append(f"the store {path} holds no {engine} tables for {gpu}: {engine} is priced analytically there")
        elif engine in pins and not any(pins[engine] in t.versions for t in mine):
            stored = ", ".join(sorted({v for t in mine for v in t.versions}))
            raise InputError(f"--engine-version {engine}={pins[engine]}: the store {path} holds no {engine} "
                             f"{pins[engine]} tables for {gpu} (it has {stored})")
    if all(t is None for _, t in found):
        raise InputError(f"the store {path} holds no aiconfigurator serving tables for {gpu}; ingest them ('paraplan "
                         f"ingest aiconfigurator WHEEL --hardware {gpu} --store {path}') or use --cost-model "
                         "analytical")
    return found, tuple(notes)


def measured_tables(cost_model: str, store: str | Path | None, engine_versions: Mapping[str, str] | None,
                    model: ModelSpec, clusters: Sequence[ClusterSpec], choices: ServingChoices
                    ) -> tuple[MeasuredTables | None, tuple[str, ...]]:
    """The engine tables that price the search's setups (``measured``: each GPU must have some), and the notes.
    ``auto`` and ``analytical`` price analytically: serving has no learned models, and measured tables are not
    part of ``auto`` (as for training: cost_models/learned/provider.py)."""
    from paraplan.cost_models.learned.provider import COST_MODELS

    if cost_model not in COST_MODELS:
        raise InputError(f"--cost-model expects {', '.join(COST_MODELS)}, got {cost_model!r}")
    if cost_model == "learned":
        raise InputError("--cost-model learned: serve has no learned models; use measured (engine kernel tables "
                         "from --store) or analytical")
    pins = _pins(engine_versions, choices.engines)
    if cost_model != "measured":
        if pins:
            raise InputError("--engine-version picks the measured tables' version: add --cost-model measured")
        return None, ((f"--store {store} is read only with --cost-model measured; {cost_model} prices serving "
                       "analytically",) if store is not None else ())
    from paraplan.planner.serving.problem import MeasuredTables

    path = _store_of(store)
    by_setup: list[tuple[tuple[str, str, str], Any]] = []
    notes: list[str] = []
    for cluster in clusters:
        found, said = _gpu_tables(path, cluster, model, choices, pins)
        by_setup += found
        notes += said
    return MeasuredTables(store=str(path), by_setup=tuple(by_setup)), tuple(notes)


def serve(model: str, *, isl: int, osl: int, gpu: str | Sequence[str] | None = None,
          gpus: int | Sequence[int] | None = None, cluster: str | None = None, nodes: int | None = None,
          gpus_per_node: int | None = None, concurrency: int | None = None, rate: float | None = None,
          arrival: str = "poisson", isl_cv: float = 0.0, osl_cv: float = 0.0, ttft_ms: float | None = None,
          tpot_ms: float | None = None, percentile: int = 50, engines: Sequence[str] | None = None,
          precision: str = "auto", kv_dtypes: Sequence[str] | None = None, modes: Sequence[str] | None = None,
          objective: str = "throughput", price_per_gpu_hour: float | Sequence[float] | None = None, top: int = 5,
          hardware: str | Path | None = None, memory_fraction: float | None = None, cuda_graphs: bool = True,
          speculative: str | None = None, spec_tokens: int | None = None, acceptance: float | None = None,
          cost_model: str = "auto", store: str | Path | None = None,
          engine_versions: Mapping[str, str] | None = None, **fixed: int | Sequence[int]) -> ServeResult:
    """The best ``top`` serving deployments of ``model`` (an axis in ``fixed``: tp, pp, ep, dp_attention, batch,
    chunk, an int or a list, constrains the search). ``hardware`` is a user hardware file whose GPUs and clusters
    join the built-in catalog (default ``$PARAPLAN_HARDWARE``, as for ``paraplan.plan``). Engine settings, priced
    and exported: ``memory_fraction`` (vLLM gpu_memory_utilization, SGLang mem_fraction_static, TRT-LLM
    free_gpu_memory_fraction, each under its own rule; default each engine's), ``cuda_graphs`` and
    ``speculative`` (mtp, eagle[:MODEL] or draft:MODEL) with ``spec_tokens`` and ``acceptance``. ``cost_model``
    ``measured`` prices each engine's deployments from the ``store``'s aiconfigurator tables of that engine on the
    GPU (the newest stored version, or ``engine_versions[engine]``) where they cover a term (``measured_tables``)."""
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
    measured, notes = measured_tables(cost_model, store, engine_versions, served.spec, clusters, choices)
    problem = ServingProblem(model=served.spec, clusters=clusters, workload=workload,
                             choices=choices, prices_usd_per_gpu_hour=_prices(price_per_gpu_hour, len(clusters)),
                             knobs=knobs, measured=measured)
    result = search_serving(problem, top)
    return ServeResult(plans=result.plans, pareto=result.pareto, considered=result.considered,
                       feasible=result.feasible, document=serving_document_of(served, problem, result),
                       problem=problem, notes=notes)
