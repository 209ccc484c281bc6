"""paraplan's own H100 probe priced from paraplan's shipped kernel tables (issue 31's first target).

The probe is torchtitan 0.2.2 steps on one H100 with PyTorch 2.11 (data/measured/torchtitan_memory_h100.csv, and the
same grid run again with each step split into its parts: torchtitan_step_split_h100.csv). The tables are paraplan's
training suite on an H100 with the same PyTorch (data/measured/kernels/). Nothing here is fitted to the probe: the
tables are isolated kernels, the steps whole training steps; the shipped store is built in a private cache folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from paraplan.validation.memory_probe import load_probe_rows, load_step_split_rows, predict_probe_step_s, probe_estimate

NO_STORE = Path("no-user-store.sqlite")
"""No user store: ``--cost-model measured`` prices from the shipped tables alone."""


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))


def _ran(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["error"] != "oom"]


def test_probe_step_time_target() -> None:
    """Issue 31: median <= 10%, no row beyond 25%. bench/kernel_tables_accuracy.py --store none.sqlite prints the
    rows: analytical (fitted fractions) median 39.0%, max 55.1%; shipped tables 9.2%, max 14.0% (9.7%, 14.7% before
    memory-bound kernels and the optimizer step read their tables; the probe's attention is the cuDNN rows, as
    torchtitan 0.2.2 runs it)."""
    rows = _ran(load_probe_rows())
    errors = np.array([predict_probe_step_s(r, "measured", NO_STORE) / float(r["step_s"]) - 1.0
                       for _, r in rows.iterrows()])
    assert len(errors) == 14
    assert np.median(np.abs(errors)) <= 0.10 and np.max(np.abs(errors)) <= 0.25
    assert np.median(np.abs(errors)) == pytest.approx(0.093, abs=0.01)
    assert np.max(np.abs(errors)) == pytest.approx(0.140, abs=0.01)


def test_the_rerun_repeats_the_shipped_step_times() -> None:
    """The split run (2026-11-27) measured the same configurations as the first (2026-11-24) within 8%: the steps'
    noise is well under the errors judged above. Same rows ran out of memory in both."""
    first, again = load_probe_rows(), load_step_split_rows()
    keys = ["shape", "seq", "batch", "ac", "compile"]
    both = first.astype({"compile": str}).merge(again.astype({"compile": str}), on=keys, suffixes=("_1", "_2"))
    assert len(both) == 18 and (both["error_1"] == both["error_2"]).all()
    ran = both[both["error_1"] != "oom"]
    change = ran["step_s_2"].astype(float) / ran["step_s_1"].astype(float) - 1.0
    assert np.max(np.abs(change)) < 0.08 and np.median(np.abs(change)) < 0.02


def test_the_parts_of_each_step() -> None:
    """The optimizer term against the measured clip_s + opt_s. Priced from the shipped fused AdamW table (estimate.
    optimizer_step_s: the measured 28-byte step scaled to clipping's 12 bytes; FSDP2 writes no 16-bit copy): 0.2-2.3%
    short on the 1B and 3B models, the 8B slice, whose embedding and output layers are a third of its parameters,
    13.1% short. The analytical 42 bytes a parameter at 0.8 of HBM gave -1.6..+0.5% and -12.5%
    (test_step_parts.py prices it by hand). The forward plus backward against compute_s: median within 12%."""
    rows = _ran(load_step_split_rows())
    parts = [(probe_estimate(r, "measured", NO_STORE), r) for _, r in rows.iterrows()]
    optimizer = np.array([float(e.optimizer_s[0]) / (r["opt_s"] + r["clip_s"]) - 1.0 for e, r in parts])
    compute = np.array([float(e.compute_s[0]) / (r["fwd_s"] + r["bwd_s"]) - 1.0 for e, r in parts])
    small = (rows["shape"] != "llama3-8b-8l").to_numpy()
    assert np.max(np.abs(optimizer[small])) < 0.025 and np.all(optimizer < 0.0)
    assert optimizer[~small][0] == pytest.approx(-0.131, abs=0.01)
    assert np.median(np.abs(compute)) < 0.12 and np.max(np.abs(compute)) < 0.20
    # The step is its compute and its optimizer alone on one GPU (no communication, no bubble).
    assert all(float(e.step_time_s[0]) == pytest.approx(float(e.compute_s[0] + e.optimizer_s[0]), rel=1e-9)
               for e, _ in parts)
