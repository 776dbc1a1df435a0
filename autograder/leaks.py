"""Solution lines where a student reads: the one check behind `release` and `release --student`.

A line of a SOLUTION region (normalized, at least MIN_LEAK_CHARS long), or the expression it
assigns or returns, must not stand in text a student reads before writing it. `release` looks in
the student-facing text of the line's own assignment: its sources' docstrings and comments
outside the regions (what the stub keeps), the handout, HINTS.md, the public tests and the
assignment's notebook. `release --student` looks in every file of the built repository
(`autograder.student.find_leaks`). Both compare `normal(line)` the same way: a solution line
found inside a line of text is a leak.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from collections.abc import Iterable, Iterator
from pathlib import Path

from autograder.pyparse import parse_python

MIN_LEAK_CHARS = 24   # as written (spaces collapsed); shorter lines (`return out`, `}`) are in any two programs
# `x = <expr>`, `x += <expr>`, `return <expr>`: the expression alone is a secret too ("returns `a·b + c`")
_EXPRESSION = re.compile(r"^(?:return\s+|[\w.\[\], *]+?\s*(?:[-+*/%|&^]|//|<<|>>)?=(?!=)\s*)(?P<expr>.+?);?$")
_IGNORED = re.compile(r"[\s`*·×]")
_C_COMMENT = re.compile(r"//(.*)$|/\*(.*?)(?:\*/|$)")


def normal(line: str) -> str:
    """`line` as the leak checks compare it: without whitespace, backticks and multiplication
    signs (`*`, `·`, `×`), with the minus sign (−) read as a hyphen, so the same arithmetic
    written as code or as prose compares equal: `min(2 * (p - 1), v * m)` and "min(2(p − 1), v·m)"
    are both `min(2(p-1),vm)`."""
    return _IGNORED.sub("", line).replace("−", "-")


def region_lines(text: str, comment: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, line, inside) for every line of a reference source but the markers;
    inside: the line sits in a SOLUTION region (a `STUB:` line counts as outside: it ships)."""
    inside = False
    for i, line in enumerate(text.splitlines(), 1):
        tag = line.strip()
        if tag.startswith(f"{comment} BEGIN SOLUTION") or tag.startswith(f"{comment} END SOLUTION"):
            inside = tag.startswith(f"{comment} BEGIN")
        else:
            yield i, line, inside and not tag.startswith(f"{comment} STUB:")


def secret_lines(rel: str, text: str, comment: str, given: set[str] = frozenset()) -> dict[str, str]:
    """normal(line) -> 'rel:N: <line>' for each solution line long enough to matter, and the
    expression it assigns or returns, unless a line of `given` (normalized lines of code that
    ship anyway) holds it: the copy back the naive collectives share with the ring, a call of a
    given helper that a stub makes too."""
    found: dict[str, str] = {}
    given_code = "\n".join(given)
    for i, line, inside in region_lines(text, comment):
        code = " ".join(line.split())
        expression = _EXPRESSION.match(code)
        for part in (code, expression and expression["expr"]):
            if inside and part and len(part) >= MIN_LEAK_CHARS and normal(part) not in given_code:
                found.setdefault(normal(part), f"{rel}:{i}: {code}")
    return found


def find_in(lines: Iterable[tuple[str, int, str]], secret: dict[str, str]) -> list[str]:
    """'where:N: <text> [holds solution line source:N: <line>]' for each (where, N, text) line
    that holds a secret line (normalized alike)."""
    if not secret:
        return []
    pattern = re.compile("|".join(re.escape(s) for s in sorted(secret, key=len, reverse=True)))
    leaks = []
    for where, i, line in lines:
        m = pattern.search(normal(line))
        if m:
            leaks.append(f"{where}:{i}: {' '.join(line.split())[:100]} [holds solution line {secret[m.group(0)][:140]}]")
    return leaks


def text_lines(path: Path) -> list[str]:
    """A file's lines as a reader sees them (a notebook's cell sources, not its JSON)."""
    text = path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        cells = json.loads(text)["cells"]
        return [line for c in cells for line in "".join(c["source"]).splitlines()]
    return text.splitlines()


def code_lines(text: str, comment: str) -> set[str]:
    """normal(line) of every line of code outside the SOLUTION regions (not a docstring, not a
    comment line): the code a stub gives anyway, never a secret."""
    words = {i for i, part in (_docstrings(text) if comment == "#" else ())}
    return {normal(line) for i, line, inside in region_lines(text, comment)
            if not inside and i not in words and not line.strip().startswith((comment, "/*", "*"))}


def prose_lines(text: str, comment: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of the docstrings and comments of a source outside its SOLUTION
    regions: what a stub tells the student in words."""
    outside = {i for i, _, inside in region_lines(text, comment) if not inside}
    lines = text.splitlines()
    spans = _python_prose(text) if comment == "#" else _c_prose(lines)
    for i, part in spans:
        if i in outside and not part.strip().startswith(("BEGIN SOLUTION", "END SOLUTION", "STUB:")):
            yield i, part


def _docstrings(text: str) -> Iterator[tuple[int, str]]:
    lines = text.splitlines()
    for node in ast.walk(parse_python(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            for i in range(body[0].lineno, body[0].end_lineno + 1):
                yield i, lines[i - 1]


def _python_prose(text: str) -> Iterator[tuple[int, str]]:
    yield from _docstrings(text)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string[1:]


def _c_prose(lines: list[str]) -> Iterator[tuple[int, str]]:
    in_block = False
    for i, line in enumerate(lines, 1):
        if in_block:
            yield i, line
            in_block = "*/" not in line
            continue
        for m in _C_COMMENT.finditer(line):
            yield i, m.group(1) if m.group(1) is not None else m.group(2)
            in_block = m.group(0).startswith("/*") and not m.group(0).endswith("*/")
