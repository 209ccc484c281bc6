"""``paraplan ingest``, ``profiles list|show``, ``learn`` and ``profile``: parse, call the library, render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer

from paraplan.cli import render
from paraplan.cost_models.learned.provider import COST_MODELS
from paraplan.errors import InputError
from paraplan.measurements.ingest import FORMATS
from paraplan.measurements.store_location import default_store_path

if TYPE_CHECKING:
    import pandas as pd

    from paraplan.measurements.profiler import ProfileSettings
    from paraplan.model_specs.model_spec import ModelSpec

StoreOpt = Annotated[Path | None, typer.Option(
    "--store", help="Profile store (SQLite). Default: $PARAPLAN_STORE or $XDG_DATA_HOME/paraplan/profiles.sqlite.")]
HardwareOpt = Annotated[str | None, typer.Option(help="GPU catalog name (see 'paraplan hardware list').")]
CostModelOpt = Annotated[str, typer.Option(
    "--cost-model", help=f"{', '.join(COST_MODELS)}: auto uses a learned model where 'paraplan learn' saved one "
                         "for the GPU (store: --store, $PARAPLAN_STORE or the default).")]


def store_path(store: Path | None) -> Path:
    """``--store`` or the default."""
    return store if store is not None else default_store_path()


def ingest(
    files: Annotated[list[Path], typer.Argument(help="Profile files: nccl-tests, torch traces, Megatron logs, ...")],
    kind: Annotated[str, typer.Option(help=f"auto or one of {', '.join(FORMATS)}.")] = "auto",
    hardware: HardwareOpt = None, store: StoreOpt = None,
) -> None:
    """Add measurements to the profile store: every file parsed first, then one transaction per file."""
    from paraplan.cli import render_profiles
    from paraplan.measurements.ingest import parse_file
    from paraplan.measurements.store import ingest_parsed

    target = store_path(store)
    parsed = [parse_file(path, kind, hardware) for path in files]
    results = [ingest_parsed(item, target) for item in parsed]
    render_profiles.ingest_results(render.make_console(), results, target)


ProfilesJsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write machine-readable JSON to this file "
                                                                     "('-': to standard output, the table to stderr).")]
ProfilesForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing --json file.")]


def profiles_list(store: StoreOpt = None, json_path: ProfilesJsonOpt = None, force: ProfilesForceOpt = False) -> None:
    """What the store holds, per hardware and kind of measurement."""
    render.prepare_json(json_path, force)
    from paraplan.cli import render_profiles
    from paraplan.measurements.store import summarize

    target = store_path(store)
    summary = summarize(target)
    render_profiles.store_summary(render.make_console(), summary, f"profile store {target}")
    if json_path is not None:
        render.write_json(json_path, {"schema_version": 1, "store": str(target),
                                      "measurements": _plain_records(summary)}, force)


def _plain_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A summary frame as JSON-ready rows (numpy integers as ints, missing text as null)."""
    return json.loads(frame.to_json(orient="records"))


def profiles_show(hardware: Annotated[str, typer.Argument(help="GPU catalog name.")], store: StoreOpt = None) -> None:
    """The files and measurements stored for one hardware."""
    from paraplan.cli import render_profiles
    from paraplan.measurements.store import stored_files, summarize

    target = store_path(store)
    summary = summarize(target)
    if hardware not in set(summary["hardware"]):
        have = ", ".join(sorted(set(summary["hardware"]))) or "nothing"
        raise InputError(f"the store {target} has no measurements for {hardware!r} (it has: {have})")
    render_profiles.hardware_detail(render.make_console(), hardware, summary[summary["hardware"] == hardware],
                                    stored_files(target, hardware))


def learn(hardware: HardwareOpt = None, store: StoreOpt = None) -> None:
    """Fit learned cost models from the store and report their held-out error against the analytical model."""
    from paraplan.cli import render_profiles
    from paraplan.cost_models.learned.learn import learn as learn_models

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


class DeviceDefaults(TypedDict):
    """One device's profiling defaults: the shape flags as their text would be typed, then repeat counts."""

    tokens: str
    tp: str
    seq_len: str
    copy_mib: str
    repeats: int
    warmup: int


# Defaults per device. A GPU runs the shapes of real micro-batches; a CPU runs bf16 GEMMs at about
# 0.37 GFLOP/s (measured on this project's 2-core machine: 64x4096x3584 in 5 s), so its defaults are the
# smallest shapes that still exercise every code path: about a minute in all on that machine.
DEVICE_DEFAULTS: dict[str, DeviceDefaults] = {
    "cuda": {"tokens": "512,2048,8192", "tp": "1,2,4,8", "seq_len": "1024,4096,8192", "copy_mib": "64,1024",
             "repeats": 10, "warmup": 3},
    "cpu": {"tokens": "16", "tp": "8", "seq_len": "256", "copy_mib": "16", "repeats": 3, "warmup": 1},
}


def profile(
    model: Annotated[str, typer.Option(help="Preset or config.json whose layer GEMMs to time.")] = "llama-3.1-8b",
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON profile to write (then: paraplan ingest).")] = Path(
        "paraplan-profile.json"),
    device: Annotated[str, typer.Option(help="auto (GPU when present), cuda or cpu.")] = "auto",
    tokens: Annotated[str | None, typer.Option(help="GEMM M (tokens per micro-batch), comma list. Default: "
                                                    "512,2048,8192 on a GPU, 16 on CPU.")] = None,
    tp: Annotated[str | None, typer.Option(help="Tensor-parallel degrees splitting N or K, comma list. Default: "
                                                "1,2,4,8 on a GPU, 8 on CPU.")] = None,
    seq_len: Annotated[str | None, typer.Option(help="Attention sequence lengths, comma list. Default: "
                                                     "1024,4096,8192 on a GPU, 256 on CPU.")] = None,
    copy_mib: Annotated[str | None, typer.Option(help="Memory-copy buffer sizes in MiB, comma list. Default: "
                                                      "64,1024 on a GPU, 16 on CPU.")] = None,
    repeats: Annotated[int | None, typer.Option(help="Timed runs per point (median kept). Default: 10 on a GPU, "
                                                     "3 on CPU.")] = None,
    warmup: Annotated[int | None, typer.Option(help="Untimed runs first. Default: 3 on a GPU, 1 on CPU.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out.")] = False,
) -> None:
    """Run GEMM, attention, memory (and, under torchrun, NCCL) microbenchmarks; write a profile to ingest.
    Prints the estimated run time first and its progress as it goes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from paraplan.cli import render_profiles
    from paraplan.measurements.profiler import calibration_flops_per_s, estimated_seconds, resolve_device, run_profile
    from paraplan.model_specs.hf_config import load_model

    render.check_writable(out, force)
    spec = load_model(model)
    if device not in ("auto", "cuda", "cpu"):
        raise InputError(f"--device must be auto, cuda or cpu, got {device!r}")
    settings = _settings(spec, device, tokens, tp, seq_len, copy_mib, repeats, warmup)
    device_used = resolve_device(device)
    rate = calibration_flops_per_s(device_used, min(settings.gemm_shapes, key=lambda s: s[0] * s[1] * s[2]))
    estimate = estimated_seconds(settings, rate)
    err = render.make_console(stderr=True)
    err.print(f"profiling on {device_used}: {len(settings.gemm_shapes)} GEMM shapes, "
              f"{len(settings.attention_shapes)} attention shapes; estimated run time about "
              f"{render.seconds(estimate)} s (bf16 GEMMs measured at {rate / 1e9:.3g} GFLOP/s)")
    points = len(settings.gemm_shapes) + len(settings.attention_shapes)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("profiling", total=points)
        document = run_profile(settings, lambda label: bar.update(task, advance=1, description=label))
    render.write_json(out, document, force)
    render_profiles.profile_written(render.make_console(), document, out)


def _settings(spec: ModelSpec, device: str, tokens: str | None, tp: str | None, seq_len: str | None,
              copy_mib: str | None, repeats: int | None, warmup: int | None) -> ProfileSettings:
    """The shapes and repeats to profile: the flags given, the device's defaults for the rest."""
    from paraplan.measurements.profiler import ProfileSettings, model_gemm_shapes, resolve_device

    defaults = DEVICE_DEFAULTS[resolve_device(device)]
    tps = _ints("tp", tp or defaults["tp"])
    try:
        return ProfileSettings(
            gemm_shapes=model_gemm_shapes(spec, _ints("tokens", tokens or defaults["tokens"]), tps),
            attention_shapes=tuple((1, spec.num_heads // t, s, spec.head_dim)
                                   for s in _ints("seq-len", seq_len or defaults["seq_len"])
                                   for t in tps if spec.num_heads % t == 0),
            copy_bytes=tuple(m * 2**20 for m in _ints("copy-mib", copy_mib or defaults["copy_mib"])),
            collective_bytes=COLLECTIVE_BYTES, repeats=defaults["repeats"] if repeats is None else repeats,
            warmup=defaults["warmup"] if warmup is None else warmup, device=device)
    except ValueError as exc:
        raise InputError(str(exc)) from None
