"""The profile store: idempotent ingestion, all-or-nothing files, tags on every row, clear errors."""

from __future__ import annotations

import sqlite3

import pytest
from profiles_factory import H100_ALL_REDUCE, PHI2_H100, need_vidur

from paraplan.errors import InputError
from paraplan.measurements import store as store_module
from paraplan.measurements.ingest import parse_file
from paraplan.measurements.store import (
    count_rows,
    default_store_path,
    ingest_parsed,
    load_measurements,
    summarize,
)


def test_second_ingest_adds_nothing(tmp_path):
    need_vidur()
    store = tmp_path / "p.sqlite"
    first = ingest_parsed(parse_file(PHI2_H100), store)
    rows = count_rows(store)
    assert first.rows_added == rows > 0 and not first.already_present
    again = ingest_parsed(parse_file(PHI2_H100), store)
    assert again.already_present and again.rows_added == 0 and count_rows(store) == rows


def test_every_row_tagged(tmp_path):
    need_vidur()
    store = tmp_path / "p.sqlite"
    parsed = parse_file(H100_ALL_REDUCE)
    ingest_parsed(parsed, store)
    frame = load_measurements(store)
    assert set(frame["hardware"]) == {"h100-sxm"}
    assert set(frame["file_sha256"]) == {parsed.sha256}
    assert frame["software"].str.contains("vidur").all()
    assert len(frame) == 2982 and frame["time_s"].min() > 0
    assert summarize(store).loc[0, "rows"] == 2982


def test_killed_ingestion_leaves_store_unchanged(tmp_path, monkeypatch):
    need_vidur()
    store = tmp_path / "p.sqlite"
    ingest_parsed(parse_file(H100_ALL_REDUCE), store)
    before = count_rows(store)
    calls = {"n": 0}
    real_row = store_module._row

    def dies_mid_file(parsed, item):
        calls["n"] += 1
        if calls["n"] == 500:
            raise KeyboardInterrupt  # as if the process were interrupted half-way through the file
        return real_row(parsed, item)

    monkeypatch.setattr(store_module, "_row", dies_mid_file)
    with pytest.raises(KeyboardInterrupt):
        ingest_parsed(parse_file(PHI2_H100), store)
    assert calls["n"] == 500
    assert count_rows(store) == before
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT COUNT(*) FROM files").fetchone()[0] == 1
    monkeypatch.undo()
    assert ingest_parsed(parse_file(PHI2_H100), store).rows_added > 0  # and it can be ingested afterwards


def test_missing_store_is_input_error(tmp_path):
    with pytest.raises(InputError, match="no profile store at .*nope.sqlite.*paraplan ingest"):
        load_measurements(tmp_path / "nope.sqlite")
    assert count_rows(tmp_path / "nope.sqlite") == 0


def test_default_path(monkeypatch, tmp_path):
    monkeypatch.delenv("PARAPLAN_STORE", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_store_path() == tmp_path / "paraplan" / "profiles.sqlite"
    monkeypatch.setenv("PARAPLAN_STORE", str(tmp_path / "x.sqlite"))
    assert default_store_path() == tmp_path / "x.sqlite"


def test_a_foreign_database_is_refused_and_left_untouched(tmp_path):
    need_vidur()
    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER)")
    before = foreign.read_bytes()
    with pytest.raises(InputError, match="not one paraplan wrote .*accounts"):
        load_measurements(foreign)
    with pytest.raises(InputError, match="not one paraplan wrote .*accounts"):
        ingest_parsed(parse_file(H100_ALL_REDUCE), foreign)
    assert foreign.read_bytes() == before  # neither reading nor the refused ingest added paraplan's tables
