"""Words of a shell script: lexing (quotes, ``$(...)``, ``${...}``, comments, line numbers) and expansion
(variables, arrays, defaults, ``$((...))`` arithmetic) for shell.py."""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass

from paraplan.errors import InputError


@dataclass(frozen=True, slots=True)
class Word:
    """One expanded shell word and the line (1-based) it was written on."""

    text: str
    line: int


# -- lexing: raw words as (kind, text) segments -----------------------------------------------------------
Seg = tuple[str, str]  # kind: "lit" (unquoted), "sq" (single quotes), "dq" (double quotes)


@dataclass(slots=True)
class RawWord:
    """A word as written, before expansion: its quoted and unquoted segments and its line (1-based)."""

    segs: list[Seg]
    line: int


SEPARATORS = {"\n", ";"}
MAX_EXPANDED_CHARS = 16 * 1024 * 1024
"""Characters a script's expansions may make in all: a launch script's make a few thousand."""
MAX_ARITH_CHARS = 1_000
"""Longest ``$((...))`` evaluated (after its names are expanded); a longer one is kept as written."""


def lex(text: str, origin: str) -> tuple[list[RawWord | str], list[Word]]:
    r"""Raw words, separators (``"\n"``, ``";"``, ``"("``, ``")"``, ``"&&"``, ``"||"``, ``"|"``) and comments."""
    tokens: list[RawWord | str] = []
    comments: list[Word] = []
    i, line, n = 0, 1, len(text)
    while i < n:
        char = text[i]
        if char == "\\" and text[i + 1:i + 2] == "\n":
            i, line = i + 2, line + 1
        elif char in " \t\r":
            i += 1
        elif char == "\n":
            tokens.append("\n")
            i, line = i + 1, line + 1
        elif char == "#":
            end = text.find("\n", i)
            end = n if end < 0 else end
            comments.append(Word(text[i + 1:end].strip(), line))
            i = end
        elif text.startswith(("&&", "||"), i):
            tokens.append(text[i:i + 2])
            i += 2
        elif char in ";()|&":
            tokens.append(char if char != "&" else ";")
            i += 1
        else:
            raw, i, line = _lex_word(text, i, line, origin)
            tokens.append(raw)
    return tokens, comments


def _lex_word(text: str, i: int, line: int, origin: str) -> tuple[RawWord, int, int]:
    start_line, segs, n = line, [], len(text)
    while i < n and (text[i] not in " \t\r\n;|&()" or (text[i] == "&" and text[i - 1] in "<>")):
        char = text[i]
        if char == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                i, line = i + 2, line + 1
                break
            segs.append(("sq", text[i + 1]))
            i += 2
        elif char in "'\"":
            end = _closing_quote(text, i, origin, line)
            body = text[i + 1:end]
            segs.append(("sq" if char == "'" else "dq", body))
            line += body.count("\n")
            i = end + 1
        elif char == "$" and text[i + 1:i + 2] in ("(", "{"):
            end = _closing_bracket(text, i + 1, origin, line)
            segs.append(("lit", text[i:end + 1]))
            line += text[i:end + 1].count("\n")
            i = end + 1
        else:
            segs.append(("lit", char))
            i += 1
    return RawWord(segs=_merged(segs), line=start_line), i, line


def _merged(segs: list[Seg]) -> list[Seg]:
    """Adjacent unquoted pieces as one segment, so ``$NAME`` expands as a whole."""
    out: list[Seg] = []
    for kind, text in segs:
        if out and kind == "lit" and out[-1][0] == "lit":
            out[-1] = ("lit", out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def _closing_quote(text: str, i: int, origin: str, line: int) -> int:
    quote, j = text[i], i + 1
    while j < len(text):
        if quote == '"' and text[j] == "\\":
            j += 2
            continue
        if text[j] == quote:
            return j
        j += 1
    raise InputError(f"{origin}:{line}: unterminated {quote} quote; close it (is this a complete shell script?)")


def _closing_bracket(text: str, i: int, origin: str, line: int) -> int:
    pairs = {"(": ")", "{": "}"}
    depth, j, opener = 0, i, text[i]
    while j < len(text):
        if text[j] in "'\"":
            j = _closing_quote(text, j, origin, line)
        elif text[j] == opener:
            depth += 1
        elif text[j] == pairs[opener]:
            depth -= 1
            if depth == 0:
                return j
        j += 1
    raise InputError(f"{origin}:{line}: unbalanced ${opener}...{pairs[opener]}; close it")


# -- expansion ----------------------------------------------------------------------------------------------
NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PARAM = re.compile(r"\$(?:\{(?P<braced>[^}]{0,256})\}|(?P<plain>" + NAME + r"|[0-9@*#?$!]))")
"""``$NAME`` or ``${...}``: a body of at most 256 characters, so that a line of ``${`` never closed is not
scanned to its end from each one (quadratic); a longer body is kept as written."""


class Expander:
    """Expands words against the variables (scalars and arrays) a script has set so far."""

    def __init__(self, variables: dict[str, str | list[Word]], origin: str = "script") -> None:
        self.variables = variables
        self.origin = origin
        self.spent = 0  # characters expanded so far: doubling a variable 40 times would make a terabyte

    def spend(self, count: int) -> None:
        """Count ``count`` more expanded characters; InputError past MAX_EXPANDED_CHARS."""
        self.spent += count
        if self.spent > MAX_EXPANDED_CHARS:
            raise InputError(f"{self.origin}: its variables expand to more than {MAX_EXPANDED_CHARS:,} characters; "
                             "a launch script's expand to a few thousand (is this the right file?)")

    def scalar(self, name: str) -> str | None:
        """``$name``: a scalar's value, an array's first element ("" when empty), None when unset."""
        value = self.variables.get(name)
        if isinstance(value, list):
            return value[0].text if value else ""
        return value

    def param(self, body: str, original: str) -> str | list[Word]:
        """``${body}``: NAME, NAME[@], NAME:-default, NAME:=default, NAME:?msg, NAME-default."""
        array = re.fullmatch(rf"({NAME})\[[@*]\]", body)
        if array:
            return self.array(array.group(1))
        match = re.fullmatch(rf"({NAME}|[0-9]+)(:?[-=?+])?(.*)", body, re.DOTALL)
        if not match:
            return original
        name, op, rest = match.groups()
        value = self.scalar(name)
        if op in (":-", ":=", "-", "="):
            if value is None or (op.startswith(":") and value == ""):
                return self.text(_unquote(rest))
            return value
        if op == ":+":
            return self.text(_unquote(rest)) if value else ""
        return original if value is None else value

    def array(self, name: str) -> list[Word]:
        """``${name[@]}``: an array's elements; a scalar split on whitespace (line 0: not known)."""
        value = self.variables.get(name, [])
        return value if isinstance(value, list) else [Word(w, 0) for w in value.split()]

    def text(self, text: str) -> str:
        """Expand ``$NAME``, ``${...}`` and ``$((...))`` inside a double-quoted string (no splitting)."""
        out, i = [], 0
        while i < len(text):
            if text.startswith("$((", i):
                end = _match_arith(text, i)
                out.append(self.arith(text[i + 3:end - 1], text[i:end + 1]))
                i = end + 1
                continue
            match = _PARAM.match(text, i)
            if match:
                braced = match.group("braced")
                value: str | list[Word]
                if braced == "":  # bash calls ${} a bad substitution; kept as written, it names no setting
                    value = match.group(0)
                else:
                    value = self.param(braced, match.group(0)) if braced is not None \
                        else self._plain(match.group("plain"), match.group(0))
                piece = " ".join(w.text for w in value) if isinstance(value, list) else value
                self.spend(len(piece))
                out.append(piece)
                i = match.end()
                continue
            out.append(text[i])
            i += 1
        return "".join(out)

    def _plain(self, name: str, original: str) -> str:
        if name in ("@", "*"):
            return ""
        value = self.scalar(name)
        return original if value is None else value

    def arith(self, expression: str, original: str) -> str:
        """``$(( ... ))`` over integers: + - * / % and parentheses; names are variables."""
        expanded = re.sub(rf"\$?\{{?({NAME})\}}?", lambda m: self.scalar(m.group(1)) or "0", expression)
        if len(expanded) > MAX_ARITH_CHARS:  # ast.parse of a long nested text overflows the stack
            return original
        try:
            return str(_arith(ast.parse(expanded.strip(), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, TypeError, MemoryError, RecursionError):
            return original

    def words(self, raw: RawWord) -> list[Word]:
        """A raw word after expansion: unquoted parts split on whitespace, ``"${A[@]}"`` one word per element;
        the elements of an expanded array keep the lines they were written on."""
        whole = re.fullmatch(rf"\$\{{({NAME})\[[@*]\]\}}", raw.segs[0][1]) if len(raw.segs) == 1 else None
        if whole and raw.segs[0][0] != "sq":
            elements = self.array(whole.group(1))
            self.spend(sum(len(element.text) + 1 for element in elements))
            if raw.segs[0][0] == "dq":
                return list(elements)
            return [Word(part, element.line or raw.line) for element in elements for part in element.text.split()]
        pieces: list[list[str]] = [[]]  # words under construction; a split starts a new one
        quoted_any = False
        for kind, text in raw.segs:
            if kind == "sq":
                pieces[-1].append(text)
                quoted_any = True
            elif kind == "dq" and text in ("$@", "${@}", "$*"):
                continue  # the script's own arguments: none when it is read
            elif kind == "dq":
                quoted_any = True
                array = re.fullmatch(rf"\$\{{({NAME})\[@\]\}}", text)
                if array:
                    elements = self.array(array.group(1))
                    self.spend(sum(len(element.text) + 1 for element in elements))
                    for index, element in enumerate(elements):
                        if index:
                            pieces.append([])
                        pieces[-1].append(element.text)
                else:
                    pieces[-1].append(self.text(text))
            else:
                expanded = self.text(text) if "$" in text else text
                parts = expanded.split() if "$" in text else [expanded]
                if "$" in text and expanded[:1].isspace():
                    pieces.append([])
                for index, part in enumerate(parts):
                    if index:
                        pieces.append([])
                    pieces[-1].append(part)
                if "$" in text and expanded[-1:].isspace():
                    pieces.append([])
        words = ["".join(p) for p in pieces]
        return [Word(w, raw.line) for w in words if w or quoted_any]


def _unquote(text: str) -> str:
    """A default value as bash reads it: ``"x"`` and ``'x'`` lose their quotes."""
    return re.sub(r"\"([^\"]*)\"|'([^']*)'", lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)


def _match_arith(text: str, i: int) -> int:
    depth, j = 0, i + 1
    while j < len(text):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            return j
        j += 1
    return len(text) - 1


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv, ast.Mod: operator.mod}


def _arith(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand)
    raise ValueError("not integer arithmetic")


