"""The profile store: measurements in SQLite, one transaction per ingested file or per ``ingest`` command.

Idempotent: a file is keyed by the SHA-256 of its bytes, and a file already present adds nothing.
Every row carries the hardware, the software versions and the source file's hash. ``ingest_parsed`` writes one
file in one transaction: its parse error happens before the transaction opens, and an error inside it rolls the
whole file back. ``ingest_all`` (the ``ingest`` command) writes every file of the command in ONE transaction,
parsing lazily inside it (an aiconfigurator database holds millions of rows: one table in memory at a time), and a
parse or write error in any file rolls all of them back. Either way a failed or killed ingestion leaves the store
as it was.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any, Protocol, cast

import pandas as pd

from paraplan.errors import InputError
from paraplan.files import one_line, parse_user_json
from paraplan.measurements.ingest.records import Measurement, ParsedFile
from paraplan.measurements.store_location import STORE_ENV, default_store_path  # noqa: F401  (re-exported)

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
  sha256 TEXT PRIMARY KEY, path TEXT NOT NULL, kind TEXT NOT NULL, hardware TEXT NOT NULL,
  software TEXT NOT NULL, num_rows INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS measurements (
  file_sha256 TEXT NOT NULL REFERENCES files(sha256), line INTEGER NOT NULL, kind TEXT NOT NULL,
  name TEXT NOT NULL, model TEXT NOT NULL, hardware TEXT NOT NULL, software TEXT NOT NULL,
  time_s REAL NOT NULL, params TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS by_hardware ON measurements(hardware, kind);
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestResult:
    """What one file did to the store."""

    path: str
    """The file as given."""
    kind: str
    """The format that parsed it."""
    hardware: str
    """Whose measurements they are."""
    rows_added: int
    """Rows written; 0 when the same bytes were ingested before."""
    already_present: bool
    """True when the file's hash was already in the store."""


def _foreign(path: Path, exc: BaseException) -> InputError:
    """The one message for a store file paraplan did not write (another database, a damaged or foreign file)."""
    return InputError(f"the profile store {path} is not one paraplan wrote ({one_line(str(exc), 80)}); pass another "
                      "--store PATH or move it away")


def _read_sql(store: Path, query: str, params: tuple[object, ...] = ()) -> pd.DataFrame:
    """``pd.read_sql_query`` on the store; InputError when its tables are not the ones paraplan writes."""
    conn = _connect(store, create=False)
    try:
        return pd.read_sql_query(query, conn, params=params)
    except (sqlite3.Error, pd.errors.DatabaseError, UnicodeDecodeError) as exc:  # a damaged file's text
        raise _foreign(store, exc) from None
    finally:
        conn.close()


def _params(store: Path, text: object) -> dict[str, Any]:
    if not isinstance(text, str):
        raise _foreign(store, TypeError("a params cell is not JSON text"))
    return cast(dict[str, Any], parse_user_json(text, f"{store}: measurement params"))  # top=dict: an object


STORE_TABLES = frozenset({"files", "measurements"})
"""The tables paraplan writes; a store file holding other tables is someone else's database."""


def _connect(path: Path, create: bool) -> sqlite3.Connection:
    """A connection to the store: read-only unless ``create`` (ingest), and never one that adds paraplan's tables
    to a database paraplan did not write."""
    exists = Path(path).is_file()
    if not create and not exists:
        raise InputError(f"no profile store at {path}; run 'paraplan ingest FILE...' first or pass --store PATH")
    try:
        if not exists:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        mode = "rwc" if create else "ro"
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode={mode}", uri=True, isolation_level=None)
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and not STORE_TABLES <= tables:
            conn.close()
            raise _foreign(path, ValueError(f"its tables are {', '.join(sorted(tables)[:4])}"))
        if create:
            conn.executescript(SCHEMA)
    except (OSError, sqlite3.Error, UnicodeDecodeError) as exc:
        raise InputError(one_line(f"cannot open the profile store {path}: {exc}")) from None
    return conn


def _row(parsed: ParsedFile, item: Measurement) -> tuple[str, int, str, str, str, str, str, float, str]:
    return (parsed.sha256, item.line, item.kind, item.name, item.model, parsed.hardware, parsed.software,
            item.time_s, json.dumps(item.params, sort_keys=True))


def ingest_parsed(parsed: ParsedFile, store: Path) -> IngestResult:
    """Write ``parsed`` in one transaction unless its hash is already stored."""
    conn = _connect(store, create=True)
    try:
        return _ingest(conn, parsed)
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise _foreign(store, exc) from None
    finally:
        conn.close()


def _ingest(conn: sqlite3.Connection, parsed: ParsedFile) -> IngestResult:
    return _in_transaction(conn, lambda: [_insert(conn, parsed)])[0]


class FileRows(Protocol):
    """A parsed file in the store's column form, for a parser of millions of rows (aiconfigurator's database): the
    files-table fields and per-row columns, written without an object per row."""

    @property
    def path(self) -> str:
        """The file as given (as ParsedFile's)."""

    @property
    def sha256(self) -> str:
        """Hex digest of the file's bytes."""

    @property
    def kind(self) -> str:
        """The format that parsed it."""

    @property
    def hardware(self) -> str:
        """GPU catalog name."""

    @property
    def software(self) -> str:
        """Versions recorded with the data."""

    @property
    def num_rows(self) -> int:
        """Rows ``columns`` yields."""

    def columns(self) -> tuple[Iterable[int], Iterable[str], Iterable[str], Iterable[str], Iterable[float],
                               Iterable[str]]:
        """Per row: line, kind, name, model, time_s, params as JSON text with sorted keys."""
        ...


def _insert(conn: sqlite3.Connection, parsed: ParsedFile | FileRows) -> IngestResult:
    """Write ``parsed`` inside the open transaction unless its hash is stored (by an earlier command or file)."""
    if conn.execute("SELECT 1 FROM files WHERE sha256 = ?", (parsed.sha256,)).fetchone():
        return IngestResult(path=parsed.path, kind=parsed.kind, hardware=parsed.hardware, rows_added=0,
                            already_present=True)
    rows: Iterable[tuple[Any, ...]]
    if isinstance(parsed, ParsedFile):
        count, rows = len(parsed.measurements), (_row(parsed, item) for item in parsed.measurements)
    else:  # column form: the constant columns repeat and every row is zipped in C
        line, kind, name, model, time_s, params = parsed.columns()
        count, rows = parsed.num_rows, zip(repeat(parsed.sha256), line, kind, name, model, repeat(parsed.hardware),
                                           repeat(parsed.software), time_s, params)
    conn.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?)", (parsed.sha256, parsed.path, parsed.kind,
                 parsed.hardware, parsed.software, count))
    conn.executemany("INSERT INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return IngestResult(path=parsed.path, kind=parsed.kind, hardware=parsed.hardware, rows_added=count,
                        already_present=False)


def _in_transaction(conn: sqlite3.Connection, work: Callable[[], list[IngestResult]]) -> list[IngestResult]:
    """``work()`` inside one write transaction: committed when it returns, rolled back when anything escapes."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        results = work()
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return results


def ingest_all(parsed: Iterable[ParsedFile | FileRows], store: Path) -> list[IngestResult]:
    """Write every file ``parsed`` yields in ONE transaction, all or nothing: an error raised while a later file is
    parsed (the iterable parses lazily) or written rolls back the earlier ones; stored hashes add nothing."""
    conn = _connect(store, create=True)
    try:
        return _in_transaction(conn, lambda: [_insert(conn, item) for item in parsed])
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise _foreign(store, exc) from None
    finally:
        conn.close()


def load_measurements(store: Path, hardware: str | None = None, kind: str | None = None) -> pd.DataFrame:
    """Stored rows (optionally of one hardware and kind) with their params as columns."""
    query = "SELECT * FROM measurements WHERE (? IS NULL OR hardware = ?) AND (? IS NULL OR kind = ?)"
    frame = _read_sql(store, query, (hardware, hardware, kind, kind))
    if "params" not in frame.columns:
        raise _foreign(store, KeyError("the measurements table has no params column"))
    params = pd.DataFrame([_params(store, text) for text in frame.pop("params")], index=frame.index)
    return pd.concat([frame, params], axis=1)


def count_rows(store: Path) -> int:
    """Measurements in the store (0 when there is no store yet)."""
    if not Path(store).is_file():
        return 0
    conn = _connect(store, create=False)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0])
    except (sqlite3.Error, TypeError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise _foreign(store, exc) from None
    finally:
        conn.close()


def summarize(store: Path) -> pd.DataFrame:
    """Per hardware and kind: rows, distinct names, files and software, for ``profiles list``."""
    return _read_sql(store, "SELECT hardware, kind, COUNT(*) AS rows, COUNT(DISTINCT name) AS names, "
                     "COUNT(DISTINCT file_sha256) AS files, GROUP_CONCAT(DISTINCT software) AS software "
                     "FROM measurements GROUP BY hardware, kind ORDER BY hardware, kind")


def stored_files(store: Path, hardware: str | None = None) -> pd.DataFrame:
    """The files table, optionally of one hardware."""
    return _read_sql(store, "SELECT * FROM files WHERE (? IS NULL OR hardware = ?) ORDER BY path", (hardware, hardware))
