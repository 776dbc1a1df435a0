"""No import circle in the grader or the library (issue 33): every `import` and `from ... import`,
at module level or inside a function, read from the source, is an arrow between the project's
modules; a strongly connected set of more than one module is a circle."""

import ast
from pathlib import Path

from autograder.manifest import REPO

PACKAGES = {"autograder": REPO / "autograder", "scaletrain": REPO / "lib" / "scaletrain"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root.parent).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _arrows(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project's modules it imports (a package's own parents excluded: importing
    `a.b.c` runs `a/__init__` by definition, not by design)."""
    arrows = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        arrows[name] = {t for t in map(lambda t: _owner(t, modules), targets)
                        if t and t != name and not name.startswith(t + ".")}
    return arrows


def _owner(target: str, modules) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in arrows[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in arrows:
        if v not in index:
            visit(v)
    return found


def test_the_detector_finds_a_planted_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_the_grader_or_the_library():
    assert _circles(_arrows(_modules())) == []
