"""NVIDIA aiconfigurator's per-op performance database (Apache-2.0): the parquet tables its wheel ships
(``aiconfigurator-core``: ``aiconfigurator_core/systems/data/<system>/<op>/<engine>/<version>/<table>.parquet``)
and its collector writes from a user's own GPUs in the same layout.

A PATH is the wheel (read as a zip, never extracted), a ``systems/data`` folder, one ``<system>`` folder (or any
folder below it) or one parquet table in that layout. Each table is one file of the store (keyed by the SHA-256 of
its bytes): :class:`TableRows`, the column form ``ingest`` writes without an object per row, whose ``parsed_file`` is
the same rows as a :class:`ParsedFile` of Measurements. The ``<system>`` folder names the GPU (``SYSTEMS``); the
rows' ``framework`` and ``version`` columns name the stack. Tables paraplan does not read yet (MLA's BMMs, module and
wide-EP tables, Mamba, GDN, KDA, encoder, DeepEP, ...) and systems the catalog lacks are left out, each folder with a
note. The per-folder ``collection_meta.yaml`` is not read: the rows carry what it says.

What each table's columns mean and the records they become: measurements/ingest/aiconfigurator_tables.py.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from paraplan.errors import InputError
from paraplan.files import listed, one_line, read_user_bytes, shown
from paraplan.measurements.ingest.aiconfigurator_tables import READ_KINDS, TABLES, ParsedTable, parse_table
from paraplan.measurements.ingest.hardware_names import check_hardware
from paraplan.measurements.ingest.records import MAX_INGEST_BYTES, ParsedFile, sha256_hex

KIND = "aiconfigurator"
SYSTEMS: dict[str, tuple[str, int]] = {
    "h100_sxm": ("h100-sxm", 8), "h100_pcie": ("h100-pcie", 8), "h200_sxm": ("h200-sxm", 8), "b200_sxm": ("b200", 8),
    "b300_sxm": ("b300", 8), "gb200": ("gb200", 72), "gb300": ("gb300", 72), "a100_sxm": ("a100-sxm-80gb", 8),
    "l40s": ("l40s", 8),
}
"""aiconfigurator system -> (paraplan catalog GPU, GPUs in one NVLink domain). Its a100_sxm is the 80 GB part
(systems/a100_sxm.yaml mem_capacity 80 GiB); GB200/GB300 join 72 GPUs in one NVLink domain (clusters.yaml
gb200-nvl72 nvlink_domain_gpus; aiconfigurator's gb200.yaml num_gpus_per_rack 72 over NVLink), the others 8 per node
(the L40S's over PCIe, which gpus.yaml gives as its GPU-to-GPU link). A collective over at most that many GPUs is
``intra``. Systems not listed (a30, l4, b60, rtx_pro_6000_server, a100_pcie) have no catalog GPU: left out."""
MAX_TABLE_BYTES = 256 << 20
"""One parquet table: the largest the 0.12.0 wheel ships is 2 MB (260,756 rows); 256 MiB is a hundred times that."""
MAX_ARCHIVE_MEMBERS = 200_000
"""Members of a wheel: aiconfigurator-core 0.12.0 holds about 2,000."""
MAX_FOLDER_ENTRIES = 500_000
"""Files and folders walked below a folder PATH: a systems/data folder holds about 2,500; more is the wrong folder."""
_LAYOUT = re.compile(r"(?:^|/)systems/data/([^/]+)/([^/]+)/([^/]+)/([^/]+)/([^/]+)\.parquet$")
_VERSION = re.compile(r"^Version:\s*([0-9A-Za-z.+!_-]{1,40})\s*$", re.MULTILINE)
_DIST_INFO = re.compile(r"^aiconfigurator_core-([0-9A-Za-z.+!_]{1,40})\.dist-info$")


@dataclass(frozen=True, slots=True, kw_only=True)
class TableRef:
    """One parquet table in aiconfigurator's layout, found but not read yet."""

    shown: str
    """The table as messages and the store name it: its path, or ``WHEEL!member`` inside a wheel."""
    folder: tuple[str, str, str, str]
    """Its ``(system, op, engine, version)`` folders."""
    table: str
    """The file name without ``.parquet`` (``gemm_perf``)."""
    hardware: str
    """The catalog GPU its system maps to."""
    domain_gpus: int
    """GPUs sharing one NVLink domain on that system."""
    num_bytes: int
    """Its size in bytes (a wheel member's uncompressed size), checked before it is read."""
    read: Callable[[], bytes]
    """Its bytes, read through the guarded reader (a zip member: at most MAX_TABLE_BYTES decompressed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Database:
    """The tables of one PATH that paraplan reads, and what it left out."""

    tables: tuple[TableRef, ...]
    """The tables to read, in path order."""
    notes: tuple[str, ...]
    """One line per folder left out (or per filter), for the user."""
    core_version: str | None
    """The aiconfigurator-core version, when the wheel or a dist-info folder beside the package says."""

    def tables_read(self) -> Iterator[TableRows]:
        """Each table read in turn, in column form, parsed when the store asks for its rows (one table in memory at
        a time); InputError on a malformed one."""
        for ref in self.tables:
            yield TableRows(ref, self.core_version)


class TableRows:
    """One table in column form: read and hashed when made, parsed and checked the first time its rows, software or
    row count are asked for (the store asks only for a table whose hash it lacks, so re-ingesting parses nothing).
    The store writes it without an object per row (``columns``); ``parsed_file`` gives the same rows as
    Measurements."""

    def __init__(self, ref: TableRef, core_version: str | None) -> None:
        self._ref, self._core_version, self._data = ref, core_version, ref.read()
        self._parsed: ParsedTable | None = None
        self.path, self.kind, self.hardware = ref.shown, KIND, ref.hardware
        self.sha256 = sha256_hex(self._data)

    def _rows(self) -> ParsedTable:
        if self._parsed is None:
            ref = self._ref
            self._parsed = parse_table(ref.shown, ref.table, ref.folder, ref.domain_gpus, self._data,
                                       self._core_version)
        return self._parsed

    @property
    def software(self) -> str:
        """aiconfigurator-core's version, the stacks and the devices the rows name."""
        return self._rows().software

    @property
    def num_rows(self) -> int:
        """Rows in the table."""
        return len(self._rows().seconds)

    def columns(self) -> tuple[Iterator[int], Iterator[str], list[str], Iterator[str], list[float], list[str]]:
        """The store's per-row columns: line (1-based row), kind, name, model (none), time_s, params as JSON text
        with sorted keys (exactly ``json.dumps(params, sort_keys=True)``)."""
        import itertools

        rows = self._rows()
        return (itertools.count(1), itertools.repeat(rows.measurement_kind), rows.names.column(),
                itertools.repeat(""), rows.seconds, rows.json_params())

    def parsed_file(self) -> ParsedFile:
        """The same rows as a ParsedFile of Measurements (an object per row: for tests and small tables)."""
        rows = self._rows()
        return ParsedFile(path=self.path, sha256=self.sha256, kind=self.kind, hardware=self.hardware,
                          software=rows.software, measurements=rows.records())


def open_database(path: Path, hardware: str | None = None, kinds: tuple[str, ...] | None = None) -> Database:
    """The tables under ``path`` (a wheel, a folder in aiconfigurator's layout or one parquet table) that paraplan
    reads, of ``hardware`` only and of measurement ``kinds`` only when given; InputError when none is left."""
    path = Path(path)
    wanted = check_hardware(hardware, path) if hardware is not None else None
    if kinds is not None and (not kinds or (unknown := [k for k in kinds if k not in READ_KINDS])):
        got = shown(unknown[0], 40) if kinds else "nothing"
        raise InputError(f"--op expects a comma list of {', '.join(READ_KINDS)}, got {got}")
    if not path.exists():
        raise InputError(f"cannot read {path}: no such file or folder")
    if path.is_dir():
        found, version = _folder_tables(path), _folder_version(path)
    elif path.suffix.lower() in (".whl", ".zip"):
        found, version = _wheel_tables(path)
    else:
        found, version = [_file_table(path)], None
    tables, notes = _select(found, wanted, kinds)
    if not tables:
        what = f" of {wanted}" if wanted else ""
        detail = f"; {notes[0]}" if notes else ""
        raise InputError(one_line(f"{path}: no aiconfigurator tables{what} that paraplan reads (expected "
                                  f"systems/data/<system>/<op>/<engine>/<version>/<table>.parquet){detail}"))
    if too_large := next((t for t in tables if t.num_bytes > MAX_TABLE_BYTES), None):
        raise InputError(f"{too_large.shown}: {too_large.num_bytes:,} bytes is too large for an aiconfigurator "
                         f"table (at most {MAX_TABLE_BYTES:,}); is this the right file?")
    _parquet_reader_present()
    return Database(tables=tuple(tables), notes=tuple(notes), core_version=version)


Found = tuple[tuple[str, str, str, str, str], str, int, Callable[[], bytes]]
"""A parquet file in the layout: ((system, op, engine, version, table), shown name, size in bytes, reader)."""


def _select(found: list[Found], hardware: str | None,
            kinds: tuple[str, ...] | None) -> tuple[list[TableRef], list[str]]:
    """The tables to read and the notes on the rest: unknown systems, tables not read yet, filtered out."""
    tables: list[TableRef] = []
    unknown_systems: dict[str, int] = defaultdict(int)
    not_read: dict[str, set[str]] = defaultdict(set)
    filtered = 0
    for (system, op, engine, version, table), name, size, read in sorted(found, key=lambda f: f[0]):
        if system not in SYSTEMS:
            unknown_systems[system] += 1
        elif table not in TABLES:
            not_read[f"{system}/{op}"].add(table)
        elif (hardware and SYSTEMS[system][0] != hardware) or (kinds and TABLES[table] not in kinds):
            filtered += 1
        else:
            gpu, domain = SYSTEMS[system]
            tables.append(TableRef(shown=name, folder=(system, op, engine, version), table=table, hardware=gpu,
                                   domain_gpus=domain, num_bytes=size, read=read))
    notes = [f"left out {system}/: no GPU in paraplan's catalog for aiconfigurator's {system!r} ({count} tables)"
             for system, count in sorted(unknown_systems.items())]
    notes += [one_line(f"left out {folder}: {len(names)} tables paraplan does not read yet ({listed(sorted(names))})")
              for folder, names in sorted(not_read.items())]
    if filtered:
        notes.append(f"left out {filtered} tables of other GPUs or kinds (--hardware, --op)")
    return tables, notes


def _wheel_tables(path: Path) -> tuple[list[Found], str | None]:
    """The layout's parquet members of a wheel (a zip read in memory, never extracted) and the wheel's version."""
    data = read_user_bytes(path, MAX_INGEST_BYTES, "aiconfigurator wheel")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
        raise InputError(one_line(f"{path}: not a readable wheel (zip) file: {exc}")) from None
    if len(members) > MAX_ARCHIVE_MEMBERS:
        raise InputError(f"{path}: {len(members):,} members is too many for an aiconfigurator wheel (at most "
                         f"{MAX_ARCHIVE_MEMBERS:,}); is this the right file?")
    found: list[Found] = []
    version = None
    for info in members:
        layout = _LAYOUT.search(info.filename)
        if layout:
            parts = layout.groups()
            found.append(((parts[0], parts[1], parts[2], parts[3], parts[4]), f"{path}!{info.filename}",
                          info.file_size, _member_reader(archive, info, f"{path}!{info.filename}")))
        elif info.filename.endswith(".dist-info/METADATA") and info.file_size <= 1 << 20:
            version = _metadata_version(_member_reader(archive, info, f"{path}!{info.filename}")()) or version
    return found, version


def _member_reader(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> Callable[[], bytes]:
    """A reader of one zip member that decompresses at most MAX_TABLE_BYTES (whatever its header claims)."""
    def read() -> bytes:
        if info.file_size > MAX_TABLE_BYTES:
            raise InputError(f"{name}: {info.file_size:,} bytes uncompressed is too large for an aiconfigurator "
                             f"table (at most {MAX_TABLE_BYTES:,})")
        try:
            with archive.open(info) as handle:
                data = handle.read(MAX_TABLE_BYTES + 1)
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError, RuntimeError,
                ValueError) as exc:
            raise InputError(one_line(f"{name}: cannot read this wheel member ({exc})")) from None
        if len(data) > MAX_TABLE_BYTES:
            raise InputError(f"{name}: more than {MAX_TABLE_BYTES:,} bytes uncompressed is too large for an "
                             "aiconfigurator table")
        return data
    return read


def _metadata_version(data: bytes) -> str | None:
    found = _VERSION.search(data[:65536].decode("utf-8", "replace"))
    return found.group(1) if found else None


def _folder_tables(root: Path) -> list[Found]:
    """Every parquet file below ``root`` (links not followed), named by its last five path parts."""
    found: list[Found] = []
    entries = 0
    for folder, subfolders, names in os.walk(root):
        entries += len(subfolders) + len(names)
        if entries > MAX_FOLDER_ENTRIES:
            raise InputError(f"{root}: more than {MAX_FOLDER_ENTRIES:,} files and folders below it; pass the "
                             "systems/data folder of aiconfigurator (or one GPU folder in it)")
        found += [_file_table(Path(folder, name)) for name in names if name.endswith(".parquet")]
    return found


def _file_table(path: Path) -> Found:
    """One parquet file, placed by its path's last five parts (``<system>/<op>/<engine>/<version>/<table>``)."""
    parts = (*(("",) * 4), *path.resolve().parts[-5:])[-5:]
    stem = parts[4].removesuffix(".parquet")
    size = path.stat().st_size if path.is_file() else 0
    return (parts[0], parts[1], parts[2], parts[3], stem), str(path), size, \
        lambda: read_user_bytes(path, MAX_TABLE_BYTES, "aiconfigurator table")


def _folder_version(root: Path) -> str | None:
    """The aiconfigurator-core version of an installed package's data folder: the dist-info folder beside it."""
    for parent in root.resolve().parents:
        if parent.name == "aiconfigurator_core":
            try:
                names = [entry.name for entry in os.scandir(parent.parent)][:10_000]
            except OSError:
                return None
            return next((m.group(1) for name in sorted(names) if (m := _DIST_INFO.match(name))), None)
    return None


def _parquet_reader_present() -> None:
    """InputError, before anything is read, when pyarrow (the optional extra) is not installed."""
    try:
        import pyarrow.parquet  # noqa: F401  (imported here only: an optional extra)
    except ImportError:
        raise InputError("reading aiconfigurator's parquet tables needs pyarrow: pip install "
                         "'paraplan[aiconfigurator]'") from None
