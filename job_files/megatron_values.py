"""Megatron-LM's arguments by argparse dest name, as read from a launch script, a log or a Megatron-Bridge YAML:
each value as text (True for a bare flag, a list for several words) with the line it was written on.

The reader of the job (megatron_args.py) and of the model shape (megatron_model.py) both take an :class:`Args`.
"""

from __future__ import annotations

import ast
import builtins
import re
from typing import Any

from paraplan.errors import InputError
from paraplan.files import shown
from paraplan.job_files.imported import Facts

_MAX_INT_CHARS = 40
"""Longest text read as an integer argument: ``1e18`` or 19 digits with room for spaces and a sign."""
_UNSET = ("None", "none", "null", "")


class Args:
    """Megatron arguments by dest name: the value as text (True for a bare flag, a list for several words)
    and the line it was written on."""

    def __init__(self, values: dict[str, tuple[str | bool | list[str], int | None]], facts: Facts,
                 dashed: bool) -> None:
        self.values, self.facts, self.dashed = values, facts, dashed

    def spell(self, name: str) -> str:
        """The name as the file writes it."""
        return "--" + name.replace("_", "-") if self.dashed else name

    def where(self, name: str) -> str:
        """``file:line`` of argument ``name`` (the file alone when it is not given)."""
        return self.facts.at(self.values[name][1]) if name in self.values else self.facts.path

    def has(self, name: str) -> bool:
        """Whether ``name`` is given with a value (not unset, not None or null, not a false flag)."""
        value = self.values.get(name, (None,))[0]
        return value is not None and value is not False and value not in _UNSET

    def text(self, name: str) -> str | None:
        """The value as text (a list joined by spaces, a log's one-element list unwrapped), or None when unset."""
        if not self.has(name):
            return None
        value = self.values[name][0]
        if isinstance(value, list):
            return " ".join(value)
        if value is True:
            return "True"
        listed = re.fullmatch(r"\[\s*'?([^',\]]*)'?.*\]", str(value))  # a log's ['p2p']
        return listed.group(1) if listed else str(value)

    def int(self, name: str) -> int | None:
        """The value as a non-negative integer, or None when unset; InputError for anything else."""
        text = self.text(name)
        if text is None:
            return None
        value = None
        if len(text.strip()) <= _MAX_INT_CHARS:  # literal_eval of a long nested text is slow or overflows the stack
            try:
                value = ast.literal_eval(text.strip())
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                value = None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(f"{self.where(name)}: {self.spell(name)} expects a non-negative integer, "
                             f"got {shown(text)}")
        return value

    def given_int(self, name: str) -> builtins.int:  # builtins: the method int() shadows the type here
        """:meth:`int` of an argument the caller has checked with :meth:`has`, so never None."""
        value = self.int(name)
        if value is None:  # a caller's defect (has() was not asked first), not the file's
            raise ValueError(f"{name} is not given; ask has() first")
        return value

    def given_number(self, name: str) -> float:
        """:meth:`number` of an argument the caller has checked with :meth:`has`, so never None."""
        value = self.number(name)
        if value is None:  # a caller's defect (has() was not asked first), not the file's
            raise ValueError(f"{name} is not given; ask has() first")
        return value

    def number(self, name: str) -> float | None:
        """The value as a float, or None when unset; InputError when it is not a number."""
        text = self.text(name)
        if text is None:
            return None
        try:
            return float(text)
        except ValueError:
            raise InputError(f"{self.where(name)}: {self.spell(name)} expects a number, got {shown(text)}") from None

    def flag(self, name: str, default: bool = False) -> bool:
        """Whether a switch is on (given bare, or as true, 1 or yes); ``default`` when unset."""
        if name not in self.values or self.values[name][0] in _UNSET:
            return default
        value = self.values[name][0]
        return value is True or str(value).lower() in ("true", "1", "yes")

    def put(self, key: str, name: str, value: Any) -> None:
        """Record ``value`` for ``key`` as read from argument ``name``."""
        self.facts.put(key, value, self.where(name))
