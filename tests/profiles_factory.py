"""Shared helpers for the profiling tests: where the real vidur profiles are, small stores built from them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paraplan.measurements.ingest import parse_file
from paraplan.measurements.store import ingest_parsed

# The project's shared folder sits beside the checkout (../shared from the repository root).
VIDUR = Path(os.environ.get("PARAPLAN_VIDUR_PROFILES", Path(__file__).parents[2] / "shared" / "data"
                            / "vidur-profiles"))
H100_COMPUTE = VIDUR / "compute" / "h100"
PHI2_H100 = H100_COMPUTE / "microsoft" / "phi-2" / "mlp.csv"
LLAMA70_H100 = H100_COMPUTE / "meta-llama" / "Llama-2-70b-hf" / "mlp.csv"
H100_ALL_REDUCE = VIDUR / "network" / "h100_dgx" / "all_reduce.csv"
A100_ALL_REDUCE = VIDUR / "network" / "a100_dgx" / "all_reduce.csv"


def need_vidur() -> Path:
    """The vidur profiles folder, or skip the test saying where it was looked for."""
    if not PHI2_H100.is_file():
        pytest.skip(f"the real vidur profiles are not at {VIDUR} (set PARAPLAN_VIDUR_PROFILES to their folder)")
    return VIDUR


def store_with(tmp_path: Path, files: list[Path], name: str = "profiles.sqlite") -> Path:
    """A fresh store holding ``files``."""
    store = tmp_path / name
    for path in files:
        ingest_parsed(parse_file(path), store)
    return store


def h100_files() -> list[Path]:
    """Every H100 compute profile plus the H100 DGX all-reduce timings."""
    return sorted(H100_COMPUTE.rglob("mlp.csv")) + [H100_ALL_REDUCE]
