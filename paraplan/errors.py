"""The exceptions the CLI turns into messages: bad user input, and paraplan's own defects.

Every layer raises :class:`InputError` with a sentence that says what is wrong and what would be
right; the CLI prints that sentence on one line and exits with code 2. :class:`InternalError` is a
defect paraplan caught in its own output (a plan it wrote fails its own schema): the CLI says so, asks
for a report and exits with INTERNAL_ERROR_EXIT_CODE; any other exception reaching the CLI is a defect
too and is reported the same way, after its traceback.
"""

INTERNAL_ERROR_EXIT_CODE = 70
"""EX_SOFTWARE of BSD's sysexits.h: an internal software error, told apart from bad input (2)."""
REPORT_REQUEST = "please report it to the paraplan maintainers with the command you ran and the files it read"


class InputError(ValueError):
    """Bad input from the user: an unknown name, a malformed file, an impossible request."""


class InternalError(Exception):
    """A defect of paraplan itself, found by a check of its own output; never the user's input."""
