"""A toy assignment's manifest shared by the results and regrade tests: two tasks, a CPU group of
two checks and a GPU group of one (pytest puts tests/ on sys.path, so tests import it by name)."""

from autograder.manifest import Check, Group, Manifest, Task

TOY = Manifest(
    assignment="a9", folder="a9_toy", title="toy", files={"toy.py": "lib/toy.py"},
    tasks=(Task("9.1", "adds", file="toy.py"), Task("9.2", "fast", file="toy.py")),
    groups=(Group("main", "toy:main", trusted=False, checks=(Check("9.1", "adds", 3), Check("9.1", "multiplies", 2))),
            Group("gpu", "toy:gpu", trusted=False, needs_gpu=True, checks=(Check("9.2", "fast on gpu", 2),))),
)
ADDS, MULTIPLIES, FAST = TOY.checks
