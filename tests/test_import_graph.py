"""No import circle in the grader or the library, and no arrow running back up the library's floors
(issue 33): every `import` and `from ... import`, at module level or inside a function, read from
the source, is an arrow between the project's modules; a strongly connected set of more than one
module is a circle; an arrow from a room of the library to a room on a higher floor (`FLOORS`) runs
back up."""

import ast
from pathlib import Path

from autograder.manifest import REPO

PACKAGES = {"autograder": REPO / "autograder", "scaletrain": REPO / "lib" / "scaletrain"}

# The library's layering (DESIGN.md): a room (a subpackage or a top-level module, with its
# benchmark.py and demo.py) imports only rooms on its own floor or below. A new room needs a row.
FLOORS = {
    # 0, the ground: spawning ranks, timing, the models, memory arithmetic, comparisons, the corpus
    "scaletrain": 0, "scaletrain.launch": 0, "scaletrain.bench": 0, "scaletrain.models": 0,
    "scaletrain.memory": 0, "scaletrain.memory_measure": 0, "scaletrain.testing": 0, "scaletrain.data": 0,
    "scaletrain.student_code": 0, "scaletrain.student_files": 0, "scaletrain.bench_cli": 0,
    "scaletrain.bench_gpu": 0,
    # 1: collectives, kernels, pipeline schedules, mixed precision
    "scaletrain.comm": 1, "scaletrain.ops": 1, "scaletrain.pipeline": 1, "scaletrain.precision": 1,
    # 2: data and tensor parallelism (on comm), offloading (on precision), inference (on the models and ops)
    "scaletrain.dp": 2, "scaletrain.tp": 2, "scaletrain.offload": 2, "scaletrain.infer": 2,
    # 3: ZeRO (on dp), gradient compression (on dp), activation checkpointing (on offload)
    "scaletrain.zero": 3, "scaletrain.compression": 3, "scaletrain.checkpointing": 3,
    # 4: the rank grid, experts, the planner, profiling a step (on ops' traffic model; may compare checkpointing)
    "scaletrain.mesh": 4, "scaletrain.moe": 4, "scaletrain.plan": 4, "scaletrain.profile": 4,
    # 5: the capstone, composing all of it
    "scaletrain.train": 5,
}


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


def _room(module: str) -> str | None:
    """The row of FLOORS that holds `module`; the package's own `__init__` is not a room of the others."""
    while module not in FLOORS and module.count(".") > 1:
        module = module.rpartition(".")[0]
    return module if module in FLOORS else None


def _upward(arrows: dict[str, set[str]]) -> list[str]:
    """Arrows from a library module to a room on a higher floor, or to the grader (a module without a
    floor is test_every_library_module_has_a_floor's to report)."""
    floor = lambda module: FLOORS.get(_room(module), -1)  # noqa: E731
    found = []
    for source, targets in sorted(arrows.items()):
        if not source.startswith("scaletrain"):
            continue
        for target in sorted(targets):
            if target.startswith("autograder") or floor(target) > floor(source) >= 0:
                found.append(f"{source} -> {target}")
    return found


def test_every_library_module_has_a_floor():
    assert _room("scaletrain.tp.demo") == "scaletrain.tp" and _room("scaletrain.new_room") is None
    assert [m for m in _modules() if m.startswith("scaletrain") and _room(m) is None] == []


def test_the_detector_finds_an_arrow_running_up():
    arrows = {"scaletrain.tp.demo": {"scaletrain.train.loop", "scaletrain.comm.ring"},
              "scaletrain.train.loop": {"scaletrain.tp.gpt"}, "scaletrain.data": {"autograder.checks"}}
    assert _upward(arrows) == ["scaletrain.data -> autograder.checks", "scaletrain.tp.demo -> scaletrain.train.loop"]


def test_no_arrow_runs_back_up_the_library():
    assert _upward(_arrows(_modules())) == []


def test_the_detector_finds_a_planted_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_the_grader_or_the_library():
    assert _circles(_arrows(_modules())) == []
