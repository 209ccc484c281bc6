"""Stack profiles: what the user's own software stack runs like, learned from a few of their measured runs.

The same layout on the same GPUs ran up to 1.7x faster in one NeMo container than in another (the tables
record no setting that explains it: CUDA-graph scopes, dispatcher backends, fused kernels). No physical model
can know a user's stack; a few measured steps of it can. ``paraplan calibrate RUNS.csv --name NAME`` predicts
each run the way ``validate`` predicts a published one (the stated knobs fixed, the rest chosen by the search),
fits one factor on the whole step, saves it as a named profile, and ``plan``/``evaluate --stack-profile NAME``
apply it; every prediction made with it names it.

The factor is the median over the runs of measured / predicted step time (in logs: a geometric median, so one
odd run moves it little), which is all a handful of runs can support: a per-component profile (compute, EP
all-to-all, pipeline) needs runs that vary those components apart, which three runs of one recipe do not. A
uniform factor scales every configuration alike, so it changes predicted times, not the ranking of plans; the
calibrated prediction of a run is exactly its analytical one times the factor. Each run is also predicted with
the factor of the other runs (leave-one-run-out), the error a user should expect on a job the runs did not
include.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from paraplan.choices import RECOMPUTE_CODES
from paraplan.cost_models.compute import ComputeRates
from paraplan.errors import InputError
from paraplan.files import one_line, parse_user_json, read_user_text, shown
from paraplan.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN
from paraplan.model_specs.hf_config import load_model
from paraplan.model_specs.model_spec import AttentionFlops, ModelSpec
from paraplan.validation.reference import KNOBS, search_row

SCHEMA_VERSION = 1
KIND = "paraplan stack profile"
PROFILES_ENV = "PARAPLAN_STACK_PROFILES"
MAX_RUNS_FILE_BYTES = 1 << 20
"""A runs CSV of 1 MiB holds thousands of runs; anything larger is the wrong file."""
MAX_PROFILE_BYTES = 1 << 20
MAX_RUNS = 1000
MAX_MFU = 1.0
"""A run whose measured throughput implies model FLOPs beyond the GPU's dense peak measured something else."""
FACTOR_RANGE = (0.1, 10.0)
"""A stack 10x faster or slower than the model predicts is a unit slip or the wrong run, not a stack."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
REQUIRED_COLUMNS = ("id", "model", "gpu", "num_gpus", "seq_len", "global_batch", "precision", "engine", "tp", "pp")
MEASURED_COLUMNS = ("measured_tokens_per_s_per_gpu", "measured_step_time_s")
OPTIONAL_TEXT = {"attention": "auto", "cluster": "", "kernels": "", "cp_comm": "", "fp8_recipe": "", "pp_schedule": ""}
POSITIVE_INTEGERS = ("num_gpus", "seq_len", "global_batch", "tp", "pp")
INTEGER_BOUNDS = {"seq_len": MAX_SEQ_LEN, "global_batch": MAX_GLOBAL_BATCH, "mbs": MAX_GLOBAL_BATCH}
"""Largest value of a count column (paraplan.limits); any other count (GPUs, a degree, a stage) is at most MAX_GPUS."""
COUNT_KNOBS = ("zero", "offload", "sp", "ep_overlap", "tp_overlap")
"""Knobs that may be 0: the ZeRO stage, offloaded layers, and the 0/1 switches."""


# -- the runs a user hands over ----------------------------------------------------------------------------------


def read_runs(path: Path) -> pd.DataFrame:
    """The measured runs of a CSV: one per line, the columns of ``data/reference_runs.csv`` (at least
    REQUIRED_COLUMNS and one of MEASURED_COLUMNS; knobs left empty are chosen by the search, as ``validate``
    does for a source that does not state them). InputError naming the line of anything malformed."""
    text = read_user_text(Path(path), MAX_RUNS_FILE_BYTES, "runs file")
    try:
        frame = pd.read_csv(StringIO(text), dtype=str, keep_default_na=False, skip_blank_lines=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise InputError(f"{path}: not a CSV file of runs ({str(exc).splitlines()[0] if str(exc) else exc})") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: line 1: the header lacks column(s) {', '.join(missing)} (and needs one of "
                         f"{' or '.join(MEASURED_COLUMNS)})")
    if not any(c in frame.columns for c in MEASURED_COLUMNS):
        raise InputError(f"{path}: line 1: the header needs a measured column: {' or '.join(MEASURED_COLUMNS)}")
    if frame.empty:
        raise InputError(f"{path}: no runs below the header; add one line per measured run")
    if len(frame) > MAX_RUNS:
        raise InputError(f"{path}: {len(frame):,} runs; a profile is fitted from at most {MAX_RUNS:,}")
    if frame.id.duplicated().any():
        raise InputError(f"{path}: run id {shown(frame.id[frame.id.duplicated()].iloc[0], 40)} appears twice; give "
                         "each run its own id")
    return pd.DataFrame([_run(path, line, row) for line, (_, row) in enumerate(frame.iterrows(), start=2)])


def _number(path: Path, line: int, column: str, cell: str, integer: bool, zero_allowed: bool = False) -> float:
    """A cell as a positive number (or integer), or 0 and up with ``zero_allowed`` (the ZeRO stage, offloaded
    layers, a 0/1 switch); InputError naming the line and column otherwise."""
    try:
        value = int(cell) if integer else float(cell)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise InputError(f"{path}: line {line}: {column} must be {kind}, got {shown(cell, 40)}") from None
    bound = INTEGER_BOUNDS.get(column, MAX_GPUS)
    if integer and value > bound:  # before isfinite, which cannot convert an integer beyond float range
        raise InputError(f"{path}: line {line}: {column} = {shown(cell, 30)} is implausibly large (at most {bound:,})")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed):
        raise InputError(f"{path}: line {line}: {column} must be {'0 or more' if zero_allowed else 'positive'}, "
                         f"got {shown(cell, 40)}")
    return value


def _run(path: Path, line: int, row: pd.Series) -> dict[str, Any]:
    """One CSV row as a reference-run row (the shape ``planner.reference`` predicts)."""
    cells = {k: str(v).strip() for k, v in row.items()}
    run: dict[str, Any] = {"id": cells["id"] or f"line {line}", "source": str(path), "line": line,
                 "model": cells["model"], "gpu": cells["gpu"], "precision": cells["precision"],
                 "engine": cells["engine"], "flops_convention": "", "measured_tflops_per_gpu": np.nan}
    for column in POSITIVE_INTEGERS:
        run[column] = _number(path, line, column, cells[column], integer=True)
    for column, default in OPTIONAL_TEXT.items():
        run[column] = cells.get(column) or default
    for knob in KNOBS:
        cell = cells.get(knob, "")
        if knob in ("tp", "pp"):
            continue
        if cell == "":
            run[knob] = np.nan  # unstated: the search chooses it
        elif knob == "recompute":
            if cell not in RECOMPUTE_CODES:
                raise InputError(f"{path}: line {line}: recompute must be one of {', '.join(RECOMPUTE_CODES)}, "
                                 f"got {shown(cell, 40)}")
            run[knob] = cell
        elif knob in COUNT_KNOBS:
            run[knob] = _number(path, line, knob, cell, integer=True, zero_allowed=True)
        else:
            run[knob] = _number(path, line, knob, cell, integer=True)
    nic = cells.get("nic_gbps_per_gpu", "")
    run["nic_gbps_per_gpu"] = _number(path, line, "nic_gbps_per_gpu", nic, False) if nic else np.nan
    for switch in ("compile", "async_tp"):
        cell = cells.get(switch, "")
        run[switch] = _number(path, line, switch, cell, integer=True, zero_allowed=True) if cell else np.nan
    imbalance = cells.get("expert_imbalance", "")
    run["expert_imbalance"] = _number(path, line, "expert_imbalance", imbalance, False) if imbalance else np.nan
    tokens, step = cells.get("measured_tokens_per_s_per_gpu", ""), cells.get("measured_step_time_s", "")
    if tokens:
        run["measured_tokens_per_s_per_gpu"] = _number(path, line, "measured_tokens_per_s_per_gpu", tokens, False)
    elif step:
        seconds = _number(path, line, "measured_step_time_s", step, False)
        run["measured_tokens_per_s_per_gpu"] = run["global_batch"] * run["seq_len"] / seconds / run["num_gpus"]
    else:
        raise InputError(f"{path}: line {line}: no measurement; fill {' or '.join(MEASURED_COLUMNS)}")
    return run


# -- predicting and fitting --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunPrediction:
    """One measured run beside the analytical model's prediction of it."""

    run_id: str
    model: str
    gpu: str
    engine: str
    num_gpus: int
    measured_tokens_per_s_per_gpu: float
    predicted_tokens_per_s_per_gpu: float

    @property
    def step_ratio(self) -> float:
        """Measured over predicted step time (the same tokens per step: the inverse throughput ratio)."""
        return self.predicted_tokens_per_s_per_gpu / self.measured_tokens_per_s_per_gpu


def implied_mfu(tokens_per_s_per_gpu: float, model: ModelSpec, seq_len: int, convention: AttentionFlops,
                peak_flops_per_s: float) -> float:
    """The model FLOP utilisation a measured throughput implies, as the planner computes MFU (model FLOPs per
    token x tokens/s per GPU over the dense peak at the run's precision); NaN for a model without a FLOPs formula."""
    return model.model_flops_per_token(seq_len, convention) * tokens_per_s_per_gpu / peak_flops_per_s


def predict_runs(runs: pd.DataFrame) -> list[RunPrediction]:
    """Each run predicted through the search with its stated knobs fixed; InputError naming a run the
    planner cannot price (an unknown model or GPU, a layout that breaks a rule or does not fit) or one whose
    measured throughput implies more than 100% MFU (more model FLOP/s than the GPU's dense peak)."""
    out = []
    for _, row in runs.iterrows():
        where = f"{row['source']}: line {row['line']} (run {row['id']})"
        try:
            load_model(row["model"])
            job, cluster, result, _ = search_row(row)
            mfu = implied_mfu(float(row["measured_tokens_per_s_per_gpu"]), job.model, job.seq_len,
                              job.flops_convention, cluster.gpu.peak(job.precision))
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
        except ValueError as exc:
            raise InputError(f"{where}: {exc}") from None
        if mfu > MAX_MFU:
            raise InputError(f"{Path(row['source']).name}: line {row['line']} (run {one_line(str(row['id']), 40)}): "
                             f"its measured tokens/s per GPU imply {mfu:.0%} model FLOP utilisation, over 100% of "
                             f"the {cluster.gpu.name} dense {job.precision} peak; check the throughput column (per "
                             "GPU, per second), the gpu and the precision")
        if len(result.ranked) == 0:
            reason = max(result.rejected, key=lambda name: result.rejected[name]) if result.rejected \
                else "it does not fit in memory"
            raise InputError(f"{where}: paraplan finds no feasible plan for this run ({reason}); check its knobs")
        best = int(result.ranked[0])
        out.append(RunPrediction(str(row["id"]), row["model"], row["gpu"], row["engine"], int(row["num_gpus"]),
                                 float(row["measured_tokens_per_s_per_gpu"]),
                                 float(result.estimates.tokens_per_s_per_gpu[best])))
    return out


def predict_megatron_logs(paths: list[Path], hardware: str | None) -> list[RunPrediction]:
    """Each Megatron-LM log as one run: the median iteration time after the first (which includes start-up)
    against paraplan's prediction from the log's own arguments block (dense runs; the GPU is not in the log,
    ``hardware`` names it)."""
    from paraplan.cost_models.learned.megatron_runs import predict_step_s
    from paraplan.measurements.ingest import parse_file

    if paths and hardware is None:
        raise InputError("a Megatron log does not say which GPU it ran on; pass --hardware NAME")
    out = []
    for path in paths:
        parsed = parse_file(Path(path), "megatron-log", hardware)
        steps = sorted((m for m in parsed.measurements if m.kind == "step"), key=lambda m: m.params["iteration"])
        if len(steps) < 2:
            raise InputError(f"{path}: {len(steps)} logged iteration(s); a run needs at least two (the first "
                             "includes start-up and is dropped)")
        config = steps[0].params
        try:
            predicted_s = predict_step_s(config, parsed.hardware)
        except InputError as exc:
            raise InputError(f"{path}: {exc}") from None
        measured_s = float(np.median([m.time_s for m in steps[1:]]))
        world = int(config["world_size"])
        tokens_per_gpu = float(config["global_batch_size"]) * float(config["seq_length"]) / world
        out.append(RunPrediction(Path(path).name, "megatron-run", parsed.hardware, "megatron", world,
                                 tokens_per_gpu / measured_s, tokens_per_gpu / predicted_s))
    return out


def fit_factor(step_ratios: ArrayLike) -> float:
    """The step-time factor: exp of the median log of measured / predicted step time."""
    ratios = np.asarray(step_ratios, dtype=float)
    return float(np.exp(np.median(np.log(ratios))))


def leave_one_out_errors(predictions: list[RunPrediction]) -> np.ndarray:
    """Each run's throughput error when predicted with the factor fitted on the other runs (+ = predicted fast)."""
    ratios = np.array([p.step_ratio for p in predictions])
    return np.array([ratios[i] / fit_factor(np.delete(ratios, i)) - 1.0 for i in range(len(ratios))])


@dataclass(frozen=True)
class StackProfile:
    """A named step-time factor and the runs it was fitted on."""

    name: str
    step_time_factor: float
    runs: list[RunPrediction]

    @property
    def analytical_errors(self) -> np.ndarray:
        """Each run's error without the profile."""
        return np.array([p.step_ratio - 1.0 for p in self.runs])

    @property
    def calibrated_errors(self) -> np.ndarray:
        """Each run's error with this profile (in sample)."""
        return np.array([p.step_ratio / self.step_time_factor - 1.0 for p in self.runs])

    @property
    def held_out_errors(self) -> np.ndarray | None:
        """Leave-one-run-out errors; None with one run (it cannot be held out from itself)."""
        return leave_one_out_errors(self.runs) if len(self.runs) > 1 else None

    def describe(self) -> str:
        """How a prediction made with it says so."""
        held = self.held_out_errors
        quality = (f"leave-one-run-out median error {100 * float(np.median(np.abs(held))):.1f}%" if held is not None
                   else "one run: no held-out error")
        where = ", ".join(sorted({f"{p.gpu}/{p.engine}" for p in self.runs}))
        return (f"stack profile {self.name}: step time x {self.step_time_factor:.3f} (fitted on {len(self.runs)} "
                f"measured run{'s' if len(self.runs) > 1 else ''} on {where}; {quality})")


def fit_profile(name: str, predictions: list[RunPrediction]) -> StackProfile:
    """The profile of ``predictions``; InputError when the factor is beyond any plausible stack."""
    check_name(name)
    factor = fit_factor([p.step_ratio for p in predictions])
    low, high = FACTOR_RANGE
    if not low <= factor <= high:
        raise InputError(f"the runs measure steps {factor:.2f}x the predicted ones, beyond any stack ({low}-{high}x); "
                         "check the measured column's units (tokens/s per GPU, or seconds per step)")
    return StackProfile(name, factor, predictions)


# -- saving, loading, applying -----------------------------------------------------------------------------------
def check_name(name: str) -> None:
    """InputError unless ``name`` is a plain profile name (it becomes a file name)."""
    if not NAME_PATTERN.fullmatch(name):
        raise InputError(f"stack profile name {shown(name, 80)}: use 1-64 letters, digits, '.', '_' or '-', starting "
                         "with a letter or digit")


def profiles_dir() -> Path:
    """``$PARAPLAN_STACK_PROFILES``, else ``$XDG_DATA_HOME/paraplan/stack_profiles``."""
    if os.environ.get(PROFILES_ENV):
        return Path(os.environ[PROFILES_ENV])
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "paraplan" / "stack_profiles"


def profile_path(name_or_path: str) -> Path:
    """A profile file: ``name_or_path`` itself when it names a .json file, else NAME.json in ``profiles_dir()``."""
    if name_or_path.endswith(".json"):
        return Path(name_or_path)
    check_name(name_or_path)
    return profiles_dir() / f"{name_or_path}.json"


def profile_document(profile: StackProfile) -> dict[str, Any]:
    """The JSON a profile is saved as."""
    def summary(errors: np.ndarray | None) -> dict[str, float] | None:
        if errors is None:
            return None
        return {"median_abs_error_frac": float(np.median(np.abs(errors))),
                "max_abs_error_frac": float(np.abs(errors).max())}

    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "name": profile.name,
            "step_time_factor": profile.step_time_factor,
            "fitted_against": "paraplan's analytical model (hardware_profiles/efficiency.yaml)",
            "runs": [{"id": p.run_id, "model": p.model, "gpu": p.gpu, "engine": p.engine, "num_gpus": p.num_gpus,
                      "measured_tokens_per_s_per_gpu": p.measured_tokens_per_s_per_gpu,
                      "predicted_tokens_per_s_per_gpu": p.predicted_tokens_per_s_per_gpu} for p in profile.runs],
            "analytical_error": summary(profile.analytical_errors),
            "leave_one_run_out_error": summary(profile.held_out_errors)}


def load_profile(name_or_path: str) -> StackProfile:
    """The saved profile; InputError for a missing, oversized, malformed or implausible file."""
    path = profile_path(name_or_path)
    if not path.is_file():
        known = sorted(p.stem for p in profiles_dir().glob("*.json")) if profiles_dir().is_dir() else []
        raise InputError(f"no stack profile {name_or_path!r} ({path} does not exist); make one with 'paraplan "
                         f"calibrate RUNS.csv --name NAME' (saved: {', '.join(known) or 'none'})")
    text = read_user_text(path, MAX_PROFILE_BYTES, "stack profile")
    try:
        document = parse_user_json(text, str(path), top=None)
    except InputError as exc:
        raise InputError(one_line(f"{exc} (not a stack profile: invalid JSON)")) from None
    if not isinstance(document, dict) or document.get("kind") != KIND:
        raise InputError(f"{path}: not a stack profile (no \"kind\": \"{KIND}\"); make one with 'paraplan calibrate'")
    if document.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"{path}: stack profile schema_version {shown(document.get('schema_version'), 30)}; this "
                         f"paraplan reads {SCHEMA_VERSION}")
    factor, runs = document.get("step_time_factor"), document.get("runs")
    low, high = FACTOR_RANGE
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not low <= factor <= high:
        raise InputError(f"{path}: step_time_factor must be a number in {low}-{high}, got {shown(factor, 40)}")
    if not isinstance(runs, list) or not runs:
        raise InputError(f"{path}: runs must be a non-empty list of the runs the profile was fitted on")
    try:
        predictions = [RunPrediction(str(r["id"]), str(r["model"]), str(r["gpu"]), str(r["engine"]),
                                     int(r["num_gpus"]), float(r["measured_tokens_per_s_per_gpu"]),
                                     float(r["predicted_tokens_per_s_per_gpu"])) for r in runs]
    except (TypeError, KeyError, ValueError, OverflowError) as exc:
        raise InputError(f"{path}: a run entry is malformed ({type(exc).__name__}: {one_line(str(exc), 60)}); each "
                         "run needs id, model, gpu, engine, num_gpus and the two throughputs") from None
    if any(not (math.isfinite(p.measured_tokens_per_s_per_gpu) and p.measured_tokens_per_s_per_gpu > 0
                and math.isfinite(p.predicted_tokens_per_s_per_gpu) and p.predicted_tokens_per_s_per_gpu > 0)
           for p in predictions):
        raise InputError(f"{path}: a run's measured or predicted throughput is not a positive number")
    return StackProfile(str(document.get("name", path.stem)), float(factor), predictions)


def with_profile(rates: ComputeRates, profile: StackProfile) -> ComputeRates:
    """``rates`` with the profile's factor on every step; InputError when the rates are not the analytical ones
    the profile was fitted against (a learned model or step calibration would be corrected twice)."""
    if rates.gemm_time_fn is not None or rates.attention_time_fn is not None or rates.step_time_factor != 1.0:
        raise InputError(f"stack profile {profile.name} was fitted against the analytical model, but learned models "
                         f"apply here ({rates.source}); pass --cost-model analytical with --stack-profile")
    return dataclasses.replace(rates, step_time_factor=profile.step_time_factor,
                               source=f"{rates.source}; {profile.describe()}")


def mismatch_note(profile: StackProfile, gpu: str, engine: str) -> str | None:
    """A line to print when the job runs on a GPU or engine none of the profile's runs used."""
    seen = {(p.gpu, p.engine) for p in profile.runs}
    if (gpu, engine) in seen:
        return None
    return (f"note: stack profile {profile.name} was fitted on {', '.join(sorted(f'{g}/{e}' for g, e in seen))}; "
            f"this job runs {gpu}/{engine}, where its factor is an assumption")


# -- how many runs a profile needs -------------------------------------------------------------------------------
def calibrated_rest_errors(step_ratios: ArrayLike, fitted_on: Iterable[int]) -> np.ndarray:
    """Errors of the runs not in ``fitted_on`` (indices) once calibrated with the factor of those in it."""
    ratios = np.asarray(step_ratios, dtype=float)
    chosen = np.zeros(len(ratios), bool)
    chosen[list(fitted_on)] = True
    return ratios[~chosen] / fit_factor(ratios[chosen]) - 1.0


def runs_needed_curve(step_ratios: ArrayLike, n: int, max_subsets: int = 500, seed: int = 0) -> np.ndarray:
    """For every way (or ``max_subsets`` random ways) to pick ``n`` of the runs: the median |error| of the rest
    when calibrated from those ``n``. Empty when fewer than n + 1 runs exist."""
    ratios = np.asarray(step_ratios, dtype=float)
    if len(ratios) <= n:
        return np.array([])
    subsets = list(itertools.combinations(range(len(ratios)), n))
    if len(subsets) > max_subsets:
        rng = np.random.default_rng(seed)
        subsets = [tuple(rng.choice(len(ratios), n, replace=False)) for _ in range(max_subsets)]
    return np.array([np.median(np.abs(calibrated_rest_errors(ratios, s))) for s in subsets])
