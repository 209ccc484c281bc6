"""``paraplan profile --suite training``: a training kernel suite in named parts, resumable part by part.

A run starts a :class:`SuiteSession` (PyTorch imported, the device picked, its GEMM and copy rates calibrated for
the estimates), then runs parts (``profile_grids.PARTS``) one at a time; after each, the caller writes the whole
document atomically, so a run killed inside a part leaves the file as the previous part left it. ``--resume FILE``
reads that document back (``read_suite_document``) and runs only the parts it lacks. Under ``torchrun`` every rank
runs the parts asked for (the collectives part needs them all) and rank 0 writes.

The document is paraplan's JSON profile (``paraplan ingest`` reads it) with three more top-level keys ingest
ignores: ``suite`` (``training``), ``stack`` and ``parts``: per part done, its grid, rows, estimated and measured
seconds, and what it skipped (an SDPA backend the device lacks, ``torch.compile`` failing, ...) with the reason.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from paraplan.errors import InputError
from paraplan.files import decode_user_text, parse_user_json, read_user_bytes, shown
from paraplan.measurements.ingest.hardware_names import CPU, catalog_name
from paraplan.measurements.ingest.paraplan_format import FORMAT_NAME, FORMAT_VERSION, parse_paraplan_json
from paraplan.measurements.ingest.records import MAX_INGEST_BYTES
from paraplan.measurements.profile_grids import (
    COMPILE_S,
    PARTS,
    PartName,
    SuiteRates,
    TrainingGrid,
    grid_for,
    part_estimated_seconds,
)
from paraplan.measurements.profile_kernels import (
    Bench,
    attention_rows,
    elementwise_rows,
    gemm_rows,
    grouped_rows,
    optimizer_rows,
)
from paraplan.measurements.profiler import (
    ProfileSettings,
    Row,
    calibration_flops_per_s,
    collective_rows,
    import_torch,
    median_seconds,
    pick_device,
    software_description,
    stack_name,
)
from paraplan.model_specs.model_spec import ModelSpec

SUITE = "training"
CALIBRATION_SIDES = (256, 512, 1024, 2048, 4096, 8192)
"""Square bf16 GEMMs tried in turn for the FLOP rate, up to the first that runs for CALIBRATION_RUN_S: a small
GEMM leaves a GPU idle and would make every estimate hours too long; on a CPU the first already takes 0.1 s."""
CALIBRATION_RUN_S = 2e-3
COPY_CALIBRATION_BYTES = {"cuda": 256 * 2**20, "cpu": 16 * 2**20}
"""Copy buffer for the bandwidth: large enough to stream from HBM (or DRAM), not from cache."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteSession:
    """One process's run of the suite: the device and what it is, the grid and the calibrated rates."""

    torch: ModuleType
    """The imported ``torch``."""
    device: str
    """``cuda`` or ``cpu``."""
    device_name: str
    """What the device calls itself (``cpu`` on CPU)."""
    hardware: str | None
    """GPU catalog name (``h100-sxm``), ``cpu``, or None for a GPU the catalog lacks (``ingest --hardware`` then
    names it)."""
    software: str
    """Versions of torch, CUDA, cuDNN, NCCL and the driver."""
    stack: str
    """``pytorch <version>``: every row's ``stack`` param."""
    grid: TrainingGrid
    """What each part measures."""
    rates: SuiteRates
    """Calibrated rates for the estimates."""
    rank: int
    """This process's rank under torchrun (0 alone); only rank 0 writes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PartResult:
    """What one part measured."""

    part: PartName
    """Which part."""
    rows: list[Row]
    """The measurements."""
    skipped: list[dict[str, Any]]
    """``{"what", "reason", "points"}`` of everything left out."""
    seconds: float
    """Wall-clock seconds the part took."""
    complete: bool
    """False where the part cannot run in this launch at all (collectives in one process): it is not recorded as
    done, so a later resume under torchrun runs it."""


def start_session(spec: ModelSpec, device: str, quick: bool, warmup: int | None = None,
                  repeats: int | None = None) -> SuiteSession:
    """Import PyTorch, pick the device (under torchrun: the local rank's GPU), build the grid (the quick one on
    CPU or when ``quick``) and calibrate the rates."""
    torch = import_torch()
    used = pick_device(torch, device)
    if used == "cuda" and "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    name = torch.cuda.get_device_name() if used == "cuda" else CPU
    hardware = catalog_name(name) if used == "cuda" else CPU
    try:
        grid = grid_for(spec, quick or used == "cpu", warmup, repeats)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return SuiteSession(torch=torch, device=used, device_name=name, hardware=hardware,
                        software=software_description(torch, used), stack=stack_name(torch), grid=grid,
                        rates=calibrate(torch, used), rank=int(os.environ.get("RANK", "0")))


def calibrate(torch: ModuleType, device: str) -> SuiteRates:
    """The device's bf16 GEMM FLOP rate (rising square GEMMs, see CALIBRATION_SIDES) and copy bandwidth."""
    flops_per_s = 0.0
    for side in CALIBRATION_SIDES:
        flops_per_s = calibration_flops_per_s(device, (side, side, side))
        if 2.0 * side**3 / flops_per_s >= CALIBRATION_RUN_S:
            break
    size = COPY_CALIBRATION_BYTES[device]
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = median_seconds(torch, device, lambda: dst.copy_(src), 1, 3)
    return SuiteRates(flops_per_s=flops_per_s, bytes_per_s=2.0 * size / seconds, compile_s=COMPILE_S[device])


def check_parts(text: str) -> tuple[PartName, ...]:
    """A comma list of part names, in suite order; InputError naming the parts for anything else."""
    names = {name.strip() for name in text.split(",")}
    unknown = sorted(names - set(PARTS))
    if unknown:
        raise InputError(f"--part expects one or more of {', '.join(PARTS)} (comma list), got {shown(unknown[0], 40)}")
    return tuple(part for part in PARTS if part in names)


def close_session(session: SuiteSession) -> None:
    """Leave the process group, if one was joined (the collectives part joins torchrun's)."""
    dist = session.torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def estimate(session: SuiteSession, part: PartName) -> float:
    """Estimated seconds of ``part`` in this session."""
    return part_estimated_seconds(part, session.grid, session.rates)


def run_part(session: SuiteSession, part: PartName, progress: Callable[[str], None] | None = None) -> PartResult:
    """Measure one part."""
    grid, began = session.grid, time.monotonic()
    bench = Bench(torch=session.torch, device=session.device, stack=session.stack, warmup=grid.warmup,
                  repeats=grid.repeats, progress=progress)
    if part == "collectives":
        rows, complete = _collectives(session, bench)
    else:
        measure = {"gemm": gemm_rows, "attention": attention_rows, "elementwise": elementwise_rows,
                   "grouped_gemm": grouped_rows, "optimizer": optimizer_rows}[part]
        rows, complete = measure(bench, grid), True
    skipped = [{"what": what, "reason": reason, "points": points} for (what, reason), points in bench.skipped.items()]
    return PartResult(part=part, rows=rows, skipped=skipped, seconds=time.monotonic() - began, complete=complete)


def _collectives(session: SuiteSession, bench: Bench) -> tuple[list[Row], bool]:
    """NCCL (gloo on CPU) collectives over every rank torchrun started; (no rows, incomplete) in one process."""
    dist = session.torch.distributed
    if not dist.is_available():
        bench.skip("collectives", f"torch {session.torch.__version__} was built without torch.distributed")
        return [], False
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) < 2:
            bench.skip("collectives", "one process: run this part under torchrun --nproc-per-node N (N >= 2)")
            return [], False
        dist.init_process_group("nccl" if session.device == "cuda" else "gloo")
    settings = ProfileSettings(gemm_shapes=(), collective_bytes=session.grid.collective_bytes,
                               warmup=bench.warmup, repeats=bench.repeats)
    bench.tick(f"collectives over {dist.get_world_size()} ranks")
    rows = collective_rows(session.torch, session.device, settings)
    return [bench.row(r["kind"], r["name"], r["time_s"], r["params"]) for r in rows], True


def new_document(session: SuiteSession) -> dict[str, Any]:
    """An empty suite document for this session's device."""
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "hardware": session.hardware, "device": session.device,
            "device_name": session.device_name, "software": session.software, "suite": SUITE,
            "stack": session.stack, "parts": {}, "measurements": []}


def with_part(document: dict[str, Any], result: PartResult, grid: TrainingGrid,
              estimated_s: float) -> dict[str, Any]:
    """``document`` with ``result`` appended (a new dict; the rows of earlier parts unchanged)."""
    entry = {"grid": grid.name, "rows": len(result.rows), "estimated_s": round(estimated_s, 3),
             "measured_s": round(result.seconds, 3), "skipped": result.skipped}
    return {**document, "parts": {**document["parts"], result.part: entry},
            "measurements": [*document["measurements"], *result.rows]}


def parts_to_run(document: dict[str, Any],
                 wanted: tuple[PartName, ...] | None) -> tuple[list[PartName], list[PartName]]:
    """(parts to run, parts ``document`` already has) of ``wanted`` (None: every part), in suite order."""
    asked = list(wanted) if wanted is not None else list(PARTS)
    present = [part for part in asked if part in document["parts"]]
    return [part for part in asked if part not in present], present


def read_suite_document(path: Path, session: SuiteSession) -> dict[str, Any]:
    """A training-suite document written earlier on this device and stack, checked row by row as ``ingest`` would
    check it; InputError when it is something else or was measured elsewhere."""
    text = decode_user_text(read_user_bytes(path, MAX_INGEST_BYTES, "profile to resume"), str(path))
    parse_paraplan_json(path, text)  # the format, the version and every row
    document = cast(dict[str, Any], parse_user_json(text, str(path)))  # top=dict: an object
    if document.get("suite") != SUITE or not isinstance(document.get("parts"), dict):
        raise InputError(f"{path} is not a 'paraplan profile --suite training' file (no 'suite' and 'parts'); "
                         "resume needs one, or write a new file with -o")
    unknown = [part for part in document["parts"] if part not in PARTS]
    if unknown:
        raise InputError(f"{path}: unknown part {shown(unknown[0], 40)}; the parts are {', '.join(PARTS)}")
    theirs = (document.get("device_name"), document.get("hardware"), document.get("stack"))
    ours = (session.device_name, session.hardware, session.stack)
    if theirs != ours:
        raise InputError(f"{path} was measured on {shown(theirs[0], 40)} with {shown(theirs[2], 40)}, this run is on "
                         f"{ours[0]} with {ours[2]}; resume on the same machine and stack or write a new file")
    return document
