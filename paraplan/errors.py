"""The exceptions the CLI turns into messages: bad user input, and paraplan's own defects.

Every layer raises :class:`InputError` with a sentence that says what is wrong and what would be
right; the CLI prints that sentence on one line and exits with code 2. :class:`InternalError` is a
defect paraplan caught in its own output (a plan it wrote fails its own schema): the CLI says so, asks
for a report and exits with INTERNAL_ERROR_EXIT_CODE; any other exception reaching the CLI is a defect
too and is reported the same way, after its traceback.
"""

import re
from collections.abc import Callable

INTERNAL_ERROR_EXIT_CODE = 70
"""EX_SOFTWARE of BSD's sysexits.h: an internal software error, told apart from bad input (2)."""
REPORT_REQUEST = "please report it to the paraplan maintainers with the command you ran and the files it read"


MAX_MESSAGE_CHARS = 300
"""Longest InputError line: one terminal line and a half, room for the file, the key, the problem and the fix."""
_LONG_PATH = re.compile(r"(?:/[^/\s:'\"]+){4,}")  # an absolute path of four or more parts


def _shorter_paths(message: str) -> str:
    """``message`` with long absolute paths cut to ``.../parent/name``, first to last, until the line fits: it
    still names the file the user gave, a deep temporary or home folder does not push the fix off the line, and
    a path the fix itself names (often the last) keeps as much as the line allows."""
    for path in _LONG_PATH.findall(message):
        if len(message) <= MAX_MESSAGE_CHARS:
            break
        parent, name = path.rsplit("/", 2)[-2:]
        message = message.replace(path, f".../{parent}/{name}", 1)
    return message


class InputError(ValueError):
    """Bad input from the user: an unknown name, a malformed file, an impossible request. A message longer than
    MAX_MESSAGE_CHARS has its long paths shortened (the rest of the line is what says what to fix)."""

    def __init__(self, message: object = "", *args: object) -> None:
        text = str(message)
        super().__init__(_shorter_paths(text) if len(text) > MAX_MESSAGE_CHARS else text, *args)


class InternalError(Exception):
    """A defect of paraplan itself, found by a check of its own output; never the user's input."""


class ParameterError(InputError):
    """Bad input that names the parameters at fault. ``template`` writes each as ``{parameter}`` and each other value
    as ``{name}`` given in ``values``: the library's message spells a parameter as its Python name (``seq_len``),
    the command line as its flag (``--seq-len``, ``spelled``), so both say what to change in the caller's words."""

    def __init__(self, template: str, **values: object) -> None:
        self.template = template
        self.values = values
        super().__init__(self.spelled(str))

    def spelled(self, spell: Callable[[str], str]) -> str:
        """The message with every parameter written by ``spell`` (its name, or a flag)."""
        return self.template.format_map(_Spelling(self.values, spell))


class _Spelling(dict[str, object]):
    """``str.format_map``'s mapping: the given values, and any other key (a parameter) as ``spell`` writes it."""

    def __init__(self, values: dict[str, object], spell: Callable[[str], str]) -> None:
        super().__init__(values)
        self.spell = spell

    def __missing__(self, key: str) -> str:
        return self.spell(key)
