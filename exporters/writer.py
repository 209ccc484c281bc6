"""Write an export's files into one folder: nothing outside it, nothing overwritten without force,
nothing half-written.

All files are first written into a fresh temporary folder (inside the output folder, or next to it
when the output folder does not exist yet), then moved into place: a new output folder appears with
one rename; into an existing one each file moves with os.replace, which replaces a file (or a
symlink, never its target) atomically. Any error before the moves leaves the output untouched.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from paraplan.errors import InputError
from paraplan.exporters.program import OutputFile

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_destination(out_dir: Path, names: list[str], force: bool) -> None:
    """InputError unless every name can be written into ``out_dir``; checked before any long computation."""
    bad = [name for name in names if not _SAFE_NAME.fullmatch(name)]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"export file names must be distinct plain names, got {names}")  # a bug, not user input
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"-o {out_dir} is not a folder")
    if not out_dir.exists():
        if not out_dir.parent.is_dir():
            raise InputError(f"cannot create {out_dir}: folder {out_dir.parent} does not exist")
        return
    targets = [out_dir / name for name in names]
    folders = [str(t) for t in targets if t.is_dir() and not t.is_symlink()]
    if folders:
        raise InputError(f"{folders[0]} is a folder; remove it or choose another -o folder")
    existing = [t.name for t in targets if t.exists() or t.is_symlink()]
    if existing and not force:
        raise InputError(f"{out_dir} already holds {', '.join(existing)}; pass --force to overwrite or choose another "
                         "-o folder")


def write_files(out_dir: Path, files: list[OutputFile], force: bool) -> list[Path]:
    """Write ``files`` into ``out_dir`` transactionally; returns the written paths."""
    check_destination(out_dir, [f.name for f in files], force)
    existed = out_dir.exists()
    staging = Path(tempfile.mkdtemp(prefix=".paraplan-export-", dir=out_dir if existed else out_dir.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        for f in files:
            path = staging / f.name
            path.write_text(f.text, encoding="utf-8")
            os.chmod(path, (0o777 if f.executable else 0o666) & ~umask)
        if not existed:
            os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes 0700; give the folder mkdir's mode
            os.rename(staging, out_dir)
        else:
            for f in files:
                os.replace(staging / f.name, out_dir / f.name)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return [out_dir / f.name for f in files]
