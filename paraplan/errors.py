"""The one exception type for bad user input.

Every layer raises :class:`InputError` with a sentence that says what is wrong and what would be
right; the CLI prints that sentence on one line and exits with code 2. :class:`InternalError` is a
defect paraplan caught in its own output (a plan it wrote fails its own schema): the CLI says so, asks
for a report and exits with INTERNAL_ERROR_EXIT_CODE. Anything else escaping to the CLI is a bug too
(Python's traceback, exit code 1).
"""

INTERNAL_ERROR_EXIT_CODE = 70
"""EX_SOFTWARE of BSD's sysexits.h: an internal software error, told apart from bad input (2)."""
REPORT_REQUEST = "please report it to the paraplan maintainers with the command you ran and the files it read"


class InputError(ValueError):
    """Bad input from the user: an unknown name, a malformed file, an impossible request."""


class InternalError(Exception):
    """A defect of paraplan itself, found by a check of its own output; never the user's input."""
