"""paraplan's own kernel tables, shipped with it: a profile store built once from ``data/measured/kernels/``.

Each shipped file is one run of ``paraplan profile --suite training`` (paraplan's JSON profile, gzipped) on one
GPU and software stack: its measured GEMM, causal SDPA, grouped-GEMM, element-wise and optimizer times, with the
versions in its ``software`` field (``data/measured/kernels/README.md`` lists them). ``--cost-model measured`` prices
with a user's own store first and takes these where the user's store has no table for the GPU, so a user without a
GPU of their own still gets kernel times measured on the stack named, not fitted fractions.

The store is built from the files on first use (about a second) under the user's cache folder, named by a digest of
the files, so a new paraplan version with new files builds a new one and an old one is never read for new data.
It is written to a private temporary name and renamed into place: two processes building at once each finish
their own and one rename wins; a half-written store is never read.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from importlib import resources
from pathlib import Path

from paraplan.errors import InputError
from paraplan.measurements.ingest.hardware_names import check_hardware
from paraplan.measurements.ingest.paraplan_format import parse_paraplan_json
from paraplan.measurements.ingest.records import ParsedFile, sha256_hex

KERNELS_PACKAGE = "paraplan.data"
KERNELS_FOLDER = ("measured", "kernels")
"""The shipped suite files: ``data/measured/kernels/`` of the package data."""
BUILTIN_PREFIX = "builtin-kernels-"


def shipped_files() -> list[Path]:
    """The shipped suite files, in name order (none when the package data is absent)."""
    folder = Path(str(resources.files(KERNELS_PACKAGE))).joinpath(*KERNELS_FOLDER)
    return sorted(folder.glob("*.json.gz")) if folder.is_dir() else []


def _digest(files: list[Path]) -> str:
    """A digest of the shipped files' names and bytes: the built store's name."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/paraplan`` (``~/.cache/paraplan`` by default)."""
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home) / "paraplan"


def parse_shipped(path: Path) -> ParsedFile:
    """One shipped suite file parsed as ``paraplan ingest`` parses a JSON profile."""
    data = gzip.decompress(path.read_bytes())
    parsed = parse_paraplan_json(path, data.decode("utf-8"))
    if parsed.hardware is None:
        raise ValueError(f"shipped kernel file {path.name} names no hardware")
    return ParsedFile(path=f"paraplan data/measured/kernels/{path.name}", sha256=sha256_hex(data),
                      kind="paraplan-json", hardware=check_hardware(parsed.hardware, path), software=parsed.software,
                      measurements=tuple(parsed.measurements))


def builtin_store() -> Path | None:
    """The store holding the shipped kernel tables, built on first use; None when nothing is shipped or no folder
    can hold it (the user's cache folder, else the system's temporary folder)."""
    files = shipped_files()
    if not files:
        return None
    name = f"{BUILTIN_PREFIX}{_digest(files)}.sqlite"
    for folder in (cache_dir(), Path(tempfile.gettempdir()) / f"paraplan-{os.getuid()}"):
        store = folder / name
        if store.is_file():
            return store
        try:
            return _build(store, files)
        except (OSError, InputError):  # a folder that cannot be written: the next one
            continue
    return None


def _build(store: Path, files: list[Path]) -> Path:
    """Ingest ``files`` into a private temporary store beside ``store``, then rename it into place."""
    from paraplan.measurements.store import ingest_all  # pandas and SQLite: only when a store is built

    store.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=store.stem + ".", suffix=".partial", dir=store.parent)
    os.close(handle)
    os.unlink(partial)  # ingest_all creates the store itself
    try:
        ingest_all((parse_shipped(path) for path in files), Path(partial))
        os.replace(partial, store)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return store
