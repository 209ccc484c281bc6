"""``paraplan ingest``, ``profiles list|show``, ``learn`` and ``profile``: parse, call the library, render."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli import render, render_profiles
from paraplan.cost_models.compute import ComputeRates
from paraplan.cost_models.hf_config import load_model
from paraplan.cost_models.ingest import FORMATS, parse_file
from paraplan.cost_models.learned.learn import learn as learn_models
from paraplan.cost_models.learned.provider import COST_MODELS, compute_rates, learned_cluster
from paraplan.cost_models.profiler import ProfileSettings, model_gemm_shapes, run_profile
from paraplan.cost_models.store import default_store_path, ingest_parsed, stored_files, summarize
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.planner.job import TrainingJob

StoreOpt = Annotated[Path | None, typer.Option(
    "--store", help="Profile store (SQLite). Default: $PARAPLAN_STORE or $XDG_DATA_HOME/paraplan/profiles.sqlite.")]
HardwareOpt = Annotated[str | None, typer.Option(help="GPU catalog name (see 'paraplan hardware list').")]
CostModelOpt = Annotated[str, typer.Option(
    "--cost-model", help=f"{', '.join(COST_MODELS)}: auto uses a learned model where 'paraplan learn' saved one "
                         "for the GPU (store: --store, $PARAPLAN_STORE or the default).")]


def store_path(store: Path | None) -> Path:
    """``--store`` or the default."""
    return store if store is not None else default_store_path()


def rates_for(cost_model: str, cluster: ClusterSpec, job: TrainingJob, store: Path | None = None) -> ComputeRates:
    """The compute rates ``plan`` and ``evaluate`` should cost with (learned ones from ``store``)."""
    work = job.workload()
    return compute_rates(cost_model, cluster.gpu, work.precision, work.attention, work.kernel_stack,
                         store_path(store))


def cluster_for(cost_model: str, cluster: ClusterSpec, store: Path | None = None) -> ClusterSpec:
    """The cluster ``plan`` and ``evaluate`` should cost with: its learned collective models attached."""
    return learned_cluster(cost_model, cluster, store_path(store))


def ingest(
    files: Annotated[list[Path], typer.Argument(help="Profile files: nccl-tests, torch traces, Megatron logs, ...")],
    kind: Annotated[str, typer.Option(help=f"auto or one of {', '.join(FORMATS)}.")] = "auto",
    hardware: HardwareOpt = None, store: StoreOpt = None,
) -> None:
    """Add measurements to the profile store: every file parsed first, then one transaction per file."""
    target = store_path(store)
    parsed = [parse_file(path, kind, hardware) for path in files]
    results = [ingest_parsed(item, target) for item in parsed]
    render_profiles.ingest_results(render.make_console(), results, target)


def profiles_list(store: StoreOpt = None) -> None:
    """What the store holds, per hardware and kind of measurement."""
    target = store_path(store)
    render_profiles.store_summary(render.make_console(), summarize(target), f"profile store {target}")


def profiles_show(hardware: Annotated[str, typer.Argument(help="GPU catalog name.")], store: StoreOpt = None) -> None:
    """The files and measurements stored for one hardware."""
    target = store_path(store)
    summary = summarize(target)
    if hardware not in set(summary["hardware"]):
        have = ", ".join(sorted(set(summary["hardware"]))) or "nothing"
        raise InputError(f"the store {target} has no measurements for {hardware!r} (it has: {have})")
    render_profiles.hardware_detail(render.make_console(), hardware, summary[summary["hardware"] == hardware],
                                    stored_files(target, hardware))


def learn(hardware: HardwareOpt = None, store: StoreOpt = None) -> None:
    """Fit learned cost models from the store and report their held-out error against the analytical model."""
    target = store_path(store)
    with render.working(render.make_console(stderr=True), "fitting and scoring held out"):
        learned = learn_models(target, hardware)
    render_profiles.learn_report(render.make_console(), learned)


# Collective message sizes: 1 KiB to 1 GiB in steps of 4x, the span nccl-tests sweeps by default
# (-b 8 -e 1G in its README) without its smallest, latency-only sizes.
COLLECTIVE_BYTES = tuple(2**p for p in range(10, 31, 2))


def _ints(flag: str, text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise InputError(f"--{flag} expects a comma list of positive integers (e.g. 512,4096), got {text!r}")
    return tuple(sorted({int(part) for part in parts}))


def profile(
    model: Annotated[str, typer.Option(help="Preset or config.json whose layer GEMMs to time.")] = "llama-3.1-8b",
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON profile to write (then: paraplan ingest).")] = Path(
        "paraplan-profile.json"),
    device: Annotated[str, typer.Option(help="auto (GPU when present), cuda or cpu.")] = "auto",
    tokens: Annotated[str, typer.Option(help="GEMM M (tokens per micro-batch), comma list.")] = "512,2048,8192",
    tp: Annotated[str, typer.Option(help="Tensor-parallel degrees splitting N or K, comma list.")] = "1,2,4,8",
    seq_len: Annotated[str, typer.Option(help="Attention sequence lengths, comma list.")] = "1024,4096,8192",
    copy_mib: Annotated[str, typer.Option(help="Memory-copy buffer sizes in MiB, comma list.")] = "64,1024",
    repeats: Annotated[int, typer.Option(help="Timed runs per point (median kept).")] = 10,
    warmup: Annotated[int, typer.Option(help="Untimed runs first.")] = 3,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out.")] = False,
) -> None:
    """Run GEMM, attention, memory (and, under torchrun, NCCL) microbenchmarks; write a profile to ingest."""
    render.check_writable(out, force)
    spec = load_model(model)
    tps = _ints("tp", tp)
    try:
        settings = ProfileSettings(
            gemm_shapes=model_gemm_shapes(spec, _ints("tokens", tokens), tps),
            attention_shapes=tuple((1, spec.num_heads // t, s, spec.head_dim) for s in _ints("seq-len", seq_len)
                                   for t in tps if spec.num_heads % t == 0),
            copy_bytes=tuple(m * 2**20 for m in _ints("copy-mib", copy_mib)),
            collective_bytes=COLLECTIVE_BYTES, repeats=repeats, warmup=warmup, device=device)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    with render.working(render.make_console(stderr=True), f"timing {len(settings.gemm_shapes)} GEMM shapes"):
        document = run_profile(settings)
    render.write_json(out, document, force)
    render_profiles.profile_written(render.make_console(), document, out)
