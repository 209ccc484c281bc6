"""The one reader of text files a user hands over by path: bounded in size, UTF-8, read errors as InputError.

Each caller names what the file is (``"hardware file"``, ``"runs file"``) and its own size bound (a few
MiB at most: every such file is hand-written or small), so a wrong path or a binary file is one clear line.
"""

from __future__ import annotations

from pathlib import Path

from paraplan.errors import InputError


def read_user_text(path: Path, max_bytes: int, what: str) -> str:
    """The text of ``path``; InputError when it cannot be read, exceeds ``max_bytes`` or is not UTF-8 (naming
    the line and byte of the first undecodable one)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise InputError(f"{path}: {size:,} bytes is too large for a {what} (at most {max_bytes:,}); is this "
                             "the right file?")
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line} is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}); "
                         "save the file as UTF-8") from None
