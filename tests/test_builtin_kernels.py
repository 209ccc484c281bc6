"""paraplan's shipped kernel tables (data/measured/kernels/): the store built from them, and the measured cost model
taking them where a user's store has no table."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from paraplan.cost_models.compute import analytical_rates, gemm_time_s
from paraplan.cost_models.learned.provider import compute_rates
from paraplan.errors import InputError
from paraplan.hardware_profiles import load_gpu
from paraplan.measurements import builtin_kernels
from paraplan.measurements.profiler import driver_version_of
from paraplan.measurements.store import count_rows, stored_files

NO_STORE = Path("no-user-store.sqlite")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "paraplan"


def _shipped_rows() -> dict[str, int]:
    return {path.name: len(json.loads(gzip.decompress(path.read_bytes()))["measurements"])
            for path in builtin_kernels.shipped_files()}


def test_the_store_holds_every_shipped_row_once_and_is_built_once(cache: Path) -> None:
    assert _shipped_rows() == {"h100-sxm_pytorch-2.11.0-cu130.json.gz": 2509,
                               "h200-sxm_pytorch-2.11.0-cu130.json.gz": 1964}
    store = builtin_kernels.builtin_store()
    assert store is not None and store.parent == cache and store.name.startswith("builtin-kernels-")
    assert count_rows(store) == 2509 + 1964
    files = stored_files(store)
    assert sorted(files["hardware"]) == ["h100-sxm", "h200-sxm"]
    assert all("driver 580.159.04" in text for text in files["software"])
    built = store.stat().st_mtime_ns
    assert builtin_kernels.builtin_store() == store and store.stat().st_mtime_ns == built  # read, not rebuilt
    assert list(cache.glob("*.partial")) == []


def test_an_unwritable_cache_folder_falls_back_to_the_temporary_folder(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(builtin_kernels.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    store = builtin_kernels.builtin_store()
    assert store is not None and store.parent.parent == tmp_path / "tmp" and count_rows(store) == 4473


def test_measured_prices_h100_and_h200_without_a_user_store(cache: Path) -> None:
    """Before the shipped tables, '--cost-model measured' without a store of one's own was an error on every GPU."""
    for gpu_name in ("h100-sxm", "h200-sxm"):
        gpu = load_gpu(gpu_name)
        rates = compute_rates("measured", gpu, "bf16", "flash", "pytorch", NO_STORE)
        assert f"measured bf16 GEMM table ({gpu_name}, matmul on pytorch 2.11.0+cu130" in rates.source
        assert f"attention: measured causal SDPA table ({gpu_name}, backend flash" in rates.source  # FlashAttention-2
        fused = compute_rates("measured", gpu, "bf16", "fused", "pytorch", NO_STORE)
        assert f"attention: measured causal SDPA table ({gpu_name}, backend cudnn" in fused.source
        # An 8192-cube bf16 GEMM through F.linear: 692 TFLOP/s on the H100, 667 on the H200 (the suite's calibration,
        # a square matmul timed for 2 ms, saw 796-801 on both; the suite's longer runs measured less).
        seconds = float(gemm_time_s(8192.0, 8192.0, 8192.0, rates))
        assert 2 * 8192**3 / seconds == pytest.approx({"h100-sxm": 6.92e14, "h200-sxm": 6.67e14}[gpu_name], rel=0.01)
        plain = analytical_rates(gpu, "bf16", "flash", "pytorch")
        assert dataclasses.replace(rates, gemm_time_fn=None, attention_table_fn=None, memory_time_fn=None,
                                   optimizer_table_fn=None, grouped_gemm_table_fn=None,
                                   source=plain.source) == plain


def test_a_gpu_nothing_measured_is_one_line_naming_both_places(cache: Path) -> None:
    with pytest.raises(InputError, match=r"^no measured bf16 GEMM table for a100-sxm-80gb in no-user-store.sqlite or "
                                         r"paraplan's shipped tables; ingest one"):
        compute_rates("measured", load_gpu("a100-sxm-80gb"), "bf16", "flash", "pytorch", NO_STORE)


def test_without_shipped_files_there_is_no_store(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtin_kernels, "shipped_files", lambda: [])
    assert builtin_kernels.builtin_store() is None
    with pytest.raises(InputError, match="no measured bf16 GEMM table for h100-sxm"):
        compute_rates("measured", load_gpu("h100-sxm"), "bf16", "flash", "pytorch", NO_STORE)


@pytest.mark.parametrize(("line", "version"), [
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder)", "580.159.04"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024", "550.54.15"),
    ("NVRM version: something else entirely", "unknown"),
])
def test_the_driver_version_is_read_from_either_kernel_module_line(line: str, version: str) -> None:
    """The suite wrote 'driver for' on the open kernel module's line (the shipped files were corrected by hand)."""
    assert driver_version_of(line) == version


def test_the_h100_table_prices_what_the_suite_measured(cache: Path) -> None:
    """A grid point of the GEMM table is the measured median itself (the table interpolates in log space)."""
    path = next(p for p in builtin_kernels.shipped_files() if p.name.startswith("h100"))
    rows = [m for m in json.loads(gzip.decompress(path.read_bytes()))["measurements"]
            if m["kind"] == "gemm" and m["params"].get("pass") == "forward"]
    point = next(m for m in rows if (m["params"]["m"], m["params"]["n"], m["params"]["k"]) == (8192, 4096, 4096))
    rates = compute_rates("measured", load_gpu("h100-sxm"), "bf16", "flash", "pytorch", NO_STORE)
    # The table is monotone (each cell lowered to the fastest larger shape), so a grid point is at most its median.
    priced = float(gemm_time_s(8192.0, 4096.0, 4096.0, rates))
    assert priced <= point["time_s"] * (1 + 1e-9) and priced == pytest.approx(point["time_s"], rel=0.05)
    assert np.isfinite(priced)
