"""The one exception type for bad user input.

Every layer raises :class:`InputError` with a sentence that says what is wrong and what would be
right; the CLI prints that sentence on one line and exits with code 2. Anything else escaping to
the CLI is a bug (exit code 1).
"""


class InputError(ValueError):
    """Bad input from the user: an unknown name, a malformed file, an impossible request."""
