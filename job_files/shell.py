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

import re
from dataclasses import dataclass, field
from typing import TypeAlias

from paraplan.errors import InputError
from paraplan.job_files.shell_words import NAME, SEPARATORS, Expander, RawWord, Seg, Word, lex

__all__ = ["Script", "Word", "read_script"]


@dataclass(slots=True)
class Script:
    """What a script leaves behind: its commands (expanded), variables and comments."""

    commands: list[list[Word]] = field(default_factory=list)
    variables: dict[str, str | list[Word]] = field(default_factory=dict)
    comments: list[Word] = field(default_factory=list)
    """Every ``#`` comment, without the ``#``, with its line (``#SBATCH`` directives included)."""
    notes: list[str] = field(default_factory=list)


# -- statements ---------------------------------------------------------------------------------------------
Token: TypeAlias = RawWord | str | tuple[str, list[RawWord]]
"""A token of a statement: a raw word, a separator or operator, or an array body ``("array", raw words)``."""
_ASSIGN = re.compile(rf"^({NAME})(\+?)=(.*)$", re.DOTALL)
_CONTROL = {"if", "then", "else", "elif", "fi", "do", "done", "for", "while", "until", "case", "esac", "{", "}"}
MAX_SCRIPT_CHARS = 256 * 1024
"""A launch script is a few kilobytes (Megatron-LM's examples: 2-6 KB); 256 KiB of the slowest kind reads in
under a second."""
_DECLARE = {"export", "local", "declare", "readonly", "typeset"}


def read_script(text: str, origin: str) -> Script:
    """Run the assignments of ``text`` in order (in the branches its tests take) and expand its commands."""
    if len(text) > MAX_SCRIPT_CHARS:
        raise InputError(f"{origin}: {len(text):,} characters is too long for a launch script (at most "
                         f"{MAX_SCRIPT_CHARS:,}); is this the right file?")
    tokens, comments = lex(text, origin)
    script = Script(comments=comments)
    expander = Expander(script.variables, origin)
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


def _statement(tokens: list[RawWord | str], i: int) -> tuple[list[Token], int]:
    """Tokens up to the next separator; ``NAME=(`` arrays run to their ``)`` across lines."""
    out: list[Token] = []
    while i < len(tokens):
        token = tokens[i]
        if isinstance(token, str) and token in SEPARATORS | {"&&", "||", "|"} and not (
                token in ("&&", "||") and out and _literal(out[0]) in ("if", "elif", "while")):
            return out, i + 1
        if token == "(" and out and isinstance(out[-1], RawWord) and _literal(out[-1]).endswith("="):
            close = i + 1
            while close < len(tokens) and tokens[close] != ")":
                close += 1
            out.append(("array", [t for t in tokens[i + 1:close] if isinstance(t, RawWord)]))
            i = close + 1
            continue
        out.append(token)
        i += 1
    return out, i


def _literal(token: object) -> str:
    """The text of a raw word or separator as written (quotes dropped, nothing expanded); "" for an array."""
    if isinstance(token, RawWord):
        return "".join(text for kind, text in token.segs)
    return token if isinstance(token, str) else ""


def _control(head: str, statement: list[Token], branches: list[list[bool]], expander: Expander, script: Script,
             origin: str) -> list[Token] | None:
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


def _test(tokens: list[Token], expander: Expander, script: Script) -> bool:
    words: list[str] = []
    for token in tokens:  # `||` and `&&` stay as words; an empty "$X" stays as an empty word
        words += ([w.text for w in expander.words(token)] or [""]) if isinstance(token, RawWord) else [str(token)]
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
    numeric = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-gt": int.__gt__, "-le": int.__le__,
               "-ge": int.__ge__}
    if len(words) == 3 and words[1] in numeric:
        if not all(re.fullmatch(r"-?[0-9]+", w) for w in (words[0], words[2])):
            raise ValueError("not integers")
        return numeric[words[1]](int(words[0]), int(words[2]))
    if len(words) == 3 and words[1] in ("==", "=", "!="):
        if "$" in words[0] + words[2]:
            raise ValueError("unknown variable")
        return (words[0] == words[2]) == (words[1] != "!=")
    raise ValueError("unsupported test")


def _run(statement: list[Token], script: Script, expander: Expander, origin: str) -> None:
    """One simple command: leading assignments change variables; the rest is a command."""
    tokens = list(statement)
    while tokens and _literal(tokens[0]) in _DECLARE:
        tokens = [t for t in tokens[1:] if not (isinstance(t, RawWord) and _literal(t).startswith("-"))]
        if all(isinstance(t, tuple) or _ASSIGN.match(_literal(t)) for t in tokens):
            break
    while tokens and isinstance(tokens[0], RawWord) and _ASSIGN.match(_literal(tokens[0])):
        tokens = _assign(tokens, script, expander)
    words = _without_redirections([w for token in tokens if isinstance(token, RawWord)
                                   for w in expander.words(token)])
    if words and words[0].text not in _CONTROL:
        script.commands.append(words)


_REDIRECT = re.compile(r"^[0-9]*(>>?|<)(&[0-9]+)?(.*)$")


def _without_redirections(words: list[Word]) -> list[Word]:
    """Drop ``> log``, ``2>&1``, ``>>out.txt``: they are the shell's, not the program's."""
    out: list[Word] = []
    skip = False
    for word in words:
        match = _REDIRECT.match(word.text)
        if skip:
            skip = False
        elif match:
            skip = not match.group(2) and not match.group(3)
        else:
            out.append(word)
    return out


def _assign(tokens: list[Token], script: Script, expander: Expander) -> list[Token]:
    """Run the assignment ``tokens`` start with (``NAME=value``, ``NAME+=value``, ``NAME=( ... )``); the rest."""
    raw = tokens[0]
    assigned = re.match(rf"^({NAME})(\+?)=", _literal(raw))
    # _run calls this only on a raw word _ASSIGN matches, which this pattern matches too.
    assert isinstance(raw, RawWord) and assigned is not None
    name, append = assigned.groups()
    if len(tokens) > 1 and isinstance(tokens[1], tuple):  # NAME=( ... )
        elements = [w for element in tokens[1][1] for w in expander.words(element)]
        old = script.variables.get(name, []) if append else []
        old = old if isinstance(old, list) else [Word(old, raw.line)]
        old.extend(elements)  # in place: a script of 50,000 `A+=(...)` lines is not copied 50,000 times
        script.variables[name] = old
        return tokens[2:]
    value_raw = RawWord(segs=_strip_name(raw.segs, len(name) + len(append) + 1), line=raw.line)
    value = " ".join(w.text for w in expander.words(value_raw)) if value_raw.segs else ""
    if append:
        value = (expander.scalar(name) or "") + value
        expander.spend(len(value))  # the copy is made again on each append
    script.variables[name] = value
    return tokens[1:]


def _strip_name(segs: list[Seg], count: int) -> list[Seg]:
    """The segments after the first ``count`` characters (the ``NAME=`` part, always unquoted)."""
    out: list[Seg] = []
    skip = count
    for kind, text in segs:
        if skip >= len(text):
            skip -= len(text)
            continue
        out.append((kind, text[skip:]))
        skip = 0
    return out
