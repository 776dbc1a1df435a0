"""Static anti-cheat: parse a student file and find forbidden imports and calls.

A forbidden name is dotted (`torch.distributed.all_reduce`). The check resolves import aliases
(`import torch.distributed as dist` makes `dist.all_reduce` mean `torch.distributed.all_reduce`,
`from torch.distributed import all_reduce as ar` makes `ar` mean it) and flags any import or
attribute chain that equals a forbidden name or lies under one. It is a tripwire, not a proof:
the run-time guards in `checks` catch what static analysis cannot (getattr tricks).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from autograder.pyparse import parse_python


@dataclass(frozen=True)
class Finding:
    kind: str      # "syntax" or "forbidden"
    line: int
    message: str


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _matches(name: str, forbidden: tuple[str, ...]) -> str | None:
    for f in forbidden:
        if name == f or name.startswith(f + "."):
            return f
    return None


def check_source(text: str, filename: str, forbidden: tuple[str, ...]) -> list[Finding]:
    """Findings for one file's text: a syntax error, or each use of a forbidden name."""
    if Path(filename).suffix != ".py":
        return _check_text(text, forbidden)
    try:
        tree = parse_python(text, filename)
    except SyntaxError as exc:
        return [Finding("syntax", exc.lineno or 0, f"syntax error at line {exc.lineno}: {exc.msg}")]
    aliases: dict[str, str] = {}
    findings: list[Finding] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                # `import a.b` binds `a`; `import a.b as x` binds `x` to `a.b`
                bound = a.asname or a.name.split(".")[0]
                aliases[bound] = a.name if a.asname else bound
                hit = _matches(a.name, forbidden)
                if hit:
                    findings.append(Finding("forbidden", node.lineno, f"imports forbidden `{hit}`"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                aliases[a.asname or a.name] = full
                hit = _matches(full, forbidden) or _matches(node.module, forbidden)
                if hit:
                    findings.append(Finding("forbidden", node.lineno, f"imports forbidden `{hit}`"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)) and not isinstance(getattr(node, "ctx", None), ast.Store):
            name = _dotted(node)
            if name is None:
                continue
            head, _, rest = name.partition(".")
            resolved = ".".join(filter(None, [aliases.get(head, head), rest]))
            hit = _matches(resolved, forbidden)
            if hit:
                findings.append(Finding("forbidden", node.lineno, f"uses forbidden `{hit}`"))
    return _dedupe(findings)


def _check_text(text: str, forbidden: tuple[str, ...]) -> list[Finding]:
    """Non-Python files (CUDA C++): a plain search for the forbidden identifiers."""
    findings = []
    for lineno, line in enumerate(text.splitlines(), 1):
        code = line.split("//")[0]
        for f in forbidden:
            if f in code:
                findings.append(Finding("forbidden", lineno, f"uses forbidden `{f}`"))
    return findings


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in sorted(findings, key=lambda f: f.line):
        if (f.line, f.message) not in seen:
            seen.add((f.line, f.message))
            out.append(f)
    return out
