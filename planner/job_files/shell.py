"""Just enough bash to read a launch script: words, variables, arrays, ``if`` branches and comments.

Launch scripts set variables (``TP=8``, ``WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))``), collect flags in
arrays (``GPT_ARGS=( ... )``, ``ARGS+=( ... )``) and expand them on one command line
(``torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${GPT_ARGS[@]}``), the way Megatron-LM's ``examples/``
and paraplan's own exports write them. This module runs none of it: it expands what it can, keeps the
text of what it cannot (``$1``, ``$(hostname)``) and records the line each word was written on.

``if`` tests of the forms ``[[ "$A" == "b" ]]``, ``!=``, ``-z`` and ``-n`` joined by ``||`` / ``&&`` are
evaluated; any other test takes the first branch (noted). Loops and functions are read as straight-line
text.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

from paraplan.errors import InputError


@dataclass(frozen=True, slots=True)
class Word:
    """One expanded shell word and the line (1-based) it was written on."""

    text: str
    line: int


@dataclass(slots=True)
class Script:
    """What a script leaves behind: its commands (expanded), variables and comments."""

    commands: list[list[Word]] = field(default_factory=list)
    variables: dict[str, str | list[Word]] = field(default_factory=dict)
    comments: list[Word] = field(default_factory=list)
    """Every ``#`` comment, without the ``#``, with its line (``#SBATCH`` directives included)."""
    notes: list[str] = field(default_factory=list)


# -- lexing: raw words as (kind, text) segments -----------------------------------------------------------
_Seg = tuple[str, str]  # kind: "lit" (unquoted), "sq" (single quotes), "dq" (double quotes)


@dataclass(slots=True)
class _Raw:
    segs: list[_Seg]
    line: int


_SEPARATORS = {"\n", ";"}


def _lex(text: str, origin: str) -> tuple[list[_Raw | str], list[Word]]:
    """Raw words, separators (``"\\n"``, ``";"``, ``"("``, ``")"``, ``"&&"``, ``"||"``, ``"|"``) and comments."""
    tokens: list[_Raw | str] = []
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


def _lex_word(text: str, i: int, line: int, origin: str) -> tuple[_Raw, int, int]:
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
    return _Raw(segs=_merged(segs), line=start_line), i, line


def _merged(segs: list[_Seg]) -> list[_Seg]:
    """Adjacent unquoted pieces as one segment, so ``$NAME`` expands as a whole."""
    out: list[_Seg] = []
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
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PARAM = re.compile(r"\$(?:\{(?P<braced>[^}]*)\}|(?P<plain>" + _NAME + r"|[0-9@*#?$!]))")


class _Expander:
    def __init__(self, variables: dict[str, str | list[Word]]) -> None:
        self.variables = variables

    def scalar(self, name: str) -> str | None:
        value = self.variables.get(name)
        if isinstance(value, list):
            return value[0].text if value else ""
        return value

    def param(self, body: str, original: str) -> str | list[Word]:
        """``${body}``: NAME, NAME[@], NAME:-default, NAME:=default, NAME:?msg, NAME-default."""
        array = re.fullmatch(rf"({_NAME})\[[@*]\]", body)
        if array:
            value = self.variables.get(array.group(1), [])
            return value if isinstance(value, list) else [Word(w, 0) for w in value.split()]
        match = re.fullmatch(rf"({_NAME}|[0-9]+)(:?[-=?+])?(.*)", body, re.DOTALL)
        if not match:
            return original
        name, op, rest = match.groups()
        value = self.scalar(name)
        if op in (":-", ":=", "-", "="):
            unset = value is None or (op.startswith(":") and value == "")
            return self.text(_unquote(rest)) if unset else value
        if op == ":+":
            return self.text(_unquote(rest)) if value else ""
        return original if value is None else value

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
                value = self.param(match.group("braced") or match.group("plain"), match.group(0)) \
                    if match.group("braced") is not None else self._plain(match.group("plain"), match.group(0))
                out.append(" ".join(w.text for w in value) if isinstance(value, list) else value)
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
        expanded = re.sub(rf"\$?\{{?({_NAME})\}}?", lambda m: self.scalar(m.group(1)) or "0", expression)
        try:
            return str(_arith(ast.parse(expanded.strip(), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
            return original

    def words(self, raw: _Raw) -> list[Word]:
        """A raw word after expansion: unquoted parts split on whitespace, ``"${A[@]}"`` one word per element;
        the elements of an expanded array keep the lines they were written on."""
        whole = re.fullmatch(rf"\$\{{({_NAME})\[[@*]\]\}}", raw.segs[0][1]) if len(raw.segs) == 1 else None
        if whole and raw.segs[0][0] != "sq":
            elements = self.param(f"{whole.group(1)}[@]", raw.segs[0][1])
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
                array = re.fullmatch(rf"\$\{{({_NAME})\[@\]\}}", text)
                if array:
                    elements = self.param(f"{array.group(1)}[@]", text)
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


# -- statements ---------------------------------------------------------------------------------------------
_ASSIGN = re.compile(rf"^({_NAME})(\+?)=(.*)$", re.DOTALL)
_CONTROL = {"if", "then", "else", "elif", "fi", "do", "done", "for", "while", "until", "case", "esac", "{", "}"}
_DECLARE = {"export", "local", "declare", "readonly", "typeset"}


def read_script(text: str, origin: str) -> Script:
    """Run the assignments of ``text`` in order (in the branches its tests take) and expand its commands."""
    tokens, comments = _lex(text, origin)
    script = Script(comments=comments)
    expander = _Expander(script.variables)
    branches: list[list[bool]] = []  # per open `if`: [taking this branch, a branch was taken]
    i = 0
    while i < len(tokens):
        statement, i = _statement(tokens, i)
        if not statement:
            continue
        head = _literal(statement[0])
        if head in ("if", "elif", "then", "else", "fi"):
            rest = _control(head, statement, branches, expander, script, origin)
            if rest is None:
                continue
            statement = rest
        if not all(taken for taken, _ in branches):
            continue
        _run(statement, script, expander, origin)
    return script


def _statement(tokens: list, i: int) -> tuple[list, int]:
    """Tokens up to the next separator; ``NAME=(`` arrays run to their ``)`` across lines."""
    out: list = []
    while i < len(tokens):
        token = tokens[i]
        if isinstance(token, str) and token in _SEPARATORS | {"&&", "||", "|"} and not (
                token in ("&&", "||") and out and _literal(out[0]) in ("if", "elif", "while")):
            return out, i + 1
        if token == "(" and out and isinstance(out[-1], _Raw) and _literal(out[-1]).endswith("="):
            close = i + 1
            while close < len(tokens) and tokens[close] != ")":
                close += 1
            out.append(("array", [t for t in tokens[i + 1:close] if isinstance(t, _Raw)]))
            i = close + 1
            continue
        out.append(token)
        i += 1
    return out, i


def _literal(token) -> str:
    if isinstance(token, _Raw):
        return "".join(text for kind, text in token.segs)
    return token if isinstance(token, str) else ""


def _control(head: str, statement: list, branches: list[list[bool]], expander: _Expander, script: Script,
             origin: str) -> list | None:
    """Track ``if`` branches; returns what follows ``then`` / ``else`` on the same statement, if anything."""
    if head == "if":
        taken = _test(statement[1:], expander, script)
        branches.append([taken, taken])
        return None
    if not branches:
        raise InputError(f"{origin}: '{head}' without an 'if'; is this a complete shell script?")
    if head == "elif":
        taken = not branches[-1][1] and _test(statement[1:], expander, script)
        branches[-1] = [taken, branches[-1][1] or taken]
        return None
    if head == "else":
        branches[-1] = [not branches[-1][1], True]
    elif head == "fi":
        branches.pop()
        return None
    return statement[1:] or None


def _test(tokens: list, expander: _Expander, script: Script) -> bool:
    words: list[str] = []
    for token in tokens:  # `||` and `&&` stay as words; an empty "$X" stays as an empty word
        words += ([w.text for w in expander.words(token)] or [""]) if isinstance(token, _Raw) else [token]
    words = [w for w in words if w not in ("[[", "]]", "[", "]")]
    try:
        return _or(words)
    except ValueError:
        script.notes.append(f"a shell test ({' '.join(words)[:60]}) was not evaluated; its first branch was read")
        return True


def _or(words: list[str]) -> bool:
    if "||" in words:
        k = words.index("||")
        return _and(words[:k]) or _or(words[k + 1:])
    return _and(words)


def _and(words: list[str]) -> bool:
    if "&&" in words:
        k = words.index("&&")
        return _one(words[:k]) and _and(words[k + 1:])
    return _one(words)


def _one(words: list[str]) -> bool:
    if len(words) == 2 and words[0] in ("-z", "-n"):
        if "$" in words[1]:
            raise ValueError("unknown variable")
        return (words[1] == "") == (words[0] == "-z")
    if len(words) == 3 and words[1] in ("==", "=", "!="):
        if "$" in words[0] + words[2]:
            raise ValueError("unknown variable")
        return (words[0] == words[2]) == (words[1] != "!=")
    raise ValueError("unsupported test")


def _run(statement: list, script: Script, expander: _Expander, origin: str) -> None:
    """One simple command: leading assignments change variables; the rest is a command."""
    tokens = list(statement)
    while tokens and _literal(tokens[0]) in _DECLARE:
        tokens = [t for t in tokens[1:] if not (isinstance(t, _Raw) and _literal(t).startswith("-"))]
        if all(isinstance(t, tuple) or _ASSIGN.match(_literal(t)) for t in tokens):
            break
    while tokens and isinstance(tokens[0], _Raw) and _ASSIGN.match(_literal(tokens[0])):
        tokens = _assign(tokens, script, expander)
    words = _without_redirections([w for token in tokens if isinstance(token, _Raw) for w in expander.words(token)])
    if words and words[0].text not in _CONTROL:
        script.commands.append(words)


_REDIRECT = re.compile(r"^[0-9]*(>>?|<)(&[0-9]+)?(.*)$")


def _without_redirections(words: list[Word]) -> list[Word]:
    """Drop ``> log``, ``2>&1``, ``>>out.txt``: they are the shell's, not the program's."""
    out, skip = [], False
    for word in words:
        match = _REDIRECT.match(word.text)
        if skip:
            skip = False
        elif match:
            skip = not match.group(2) and not match.group(3)
        else:
            out.append(word)
    return out


def _assign(tokens: list, script: Script, expander: _Expander) -> list:
    raw = tokens[0]
    name_part = _literal(raw)
    name, append = re.match(rf"^({_NAME})(\+?)=", name_part).groups()
    if len(tokens) > 1 and isinstance(tokens[1], tuple):  # NAME=( ... )
        elements = [w for element in tokens[1][1] for w in expander.words(element)]
        old = script.variables.get(name, []) if append else []
        old = old if isinstance(old, list) else [Word(old, raw.line)]
        script.variables[name] = old + elements
        return tokens[2:]
    value_raw = _Raw(segs=_strip_name(raw.segs, len(name) + len(append) + 1), line=raw.line)
    value = " ".join(w.text for w in expander.words(value_raw)) if value_raw.segs else ""
    if append:
        value = (expander.scalar(name) or "") + value
    script.variables[name] = value
    return tokens[1:]


def _strip_name(segs: list[_Seg], count: int) -> list[_Seg]:
    """The segments after the first ``count`` characters (the ``NAME=`` part, always unquoted)."""
    out, skip = [], count
    for kind, text in segs:
        if skip >= len(text):
            skip -= len(text)
            continue
        out.append((kind, text[skip:]))
        skip = 0
    return out
