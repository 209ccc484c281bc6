"""Where the profile store lives by default: a path only, so that commands which merely look for learned
models (plan, evaluate) need not import the store's pandas and SQLite code."""

from __future__ import annotations

import os
from pathlib import Path

STORE_ENV = "PARAPLAN_STORE"
"""Environment variable naming the store file."""


def default_store_path() -> Path:
    """``$PARAPLAN_STORE``, else ``$XDG_DATA_HOME/paraplan/profiles.sqlite`` (``~/.local/share`` by default)."""
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV])
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "paraplan" / "profiles.sqlite"
