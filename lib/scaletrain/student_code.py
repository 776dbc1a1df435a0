"""In the student repository, a graded library module *is* the student's assignment file.

`python -m autograder release --student` replaces each library module whose assignment is
released but not yet solved (e.g. `scaletrain/dp/bucket.py` while a3 is open) by a two-line
module calling `run_student_file`. Everything that imports the library then runs the student's
code: the notebooks' demos, a later file of the same assignment (a3's `dp_data_parallel.py`
imports `scaletrain.dp.bucket`), and a later assignment built on an earlier one. Nothing of the
reference is left to import.

The student file is executed in the library module's own namespace (not aliased to the
top-level module `dp_bucket` the tests import) so that import cycles resolve exactly as they do
for the reference: `scaletrain/dp/__init__.py` may import `scaletrain.dp.data_parallel` while the
student's `dp_data_parallel.py` is itself being imported.
"""

from __future__ import annotations

import os
from pathlib import Path

SUBMISSION_ENV = "AUTOGRADER_SUBMISSION"  # the same variable as autograder.checks: one submission folder
REPO = Path(__file__).resolve().parents[2]


def student_file(folder: str, filename: str) -> Path:
    """The student's copy of `filename`: in $AUTOGRADER_SUBMISSION when that folder holds it (public
    tests run on a submission outside the repository), else in assignments/<folder>/."""
    override = os.environ.get(SUBMISSION_ENV)
    if override and (Path(override) / filename).is_file():
        return Path(override).resolve() / filename
    path = REPO / "assignments" / folder / filename
    if not path.is_file():
        raise ImportError(f"{path} is missing: this library module runs your assignments/{folder}/{filename}; "
                          f"restore it from the stub (git checkout -- assignments/{folder}/{filename})")
    return path


def run_student_file(namespace: dict, folder: str, filename: str) -> None:
    """Execute the student's file in `namespace` (a module's globals). Tracebacks name the
    student's file and line, because the code is compiled under that path."""
    path = student_file(folder, filename)
    namespace["__file__"] = str(path)
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - the student's own code


# ---------------------------------------------------------------- the notebooks' implementation switch

# stem of a student file -> (the library module it replaces, its assignment folder); the same pairs
# as the assignments' manifests (tests/test_notebook_impl.py checks they agree)
STUDENT_MODULES = {
    "memory": ("scaletrain.memory", "a0_memory"),
    "ring": ("scaletrain.comm.ring", "a2_collectives"),
    "dp_bucket": ("scaletrain.dp.bucket", "a3_data_parallel"),
    "dp_data_parallel": ("scaletrain.dp.data_parallel", "a3_data_parallel"),
    "pp_schedules": ("scaletrain.pipeline.schedules", "a4_pipeline"),
    "pp_validate": ("scaletrain.pipeline.validate", "a4_pipeline"),
    "pp_executor": ("scaletrain.pipeline.executor", "a4_pipeline"),
    "zero_engine": ("scaletrain.zero.engine", "a5_zero"),
    "tp_operators": ("scaletrain.tp.operators", "a6_tensor_parallel"),
    "tp_layers": ("scaletrain.tp.layers", "a6_tensor_parallel"),
    "tp_cross_entropy": ("scaletrain.tp.cross_entropy", "a6_tensor_parallel"),
    "tp_sequence": ("scaletrain.tp.sequence", "a6_tensor_parallel"),
    "loss_scaler": ("scaletrain.precision.scaler", "a7_memory"),
    "checkpoint_function": ("scaletrain.checkpointing.function", "a7_memory"),
    "rotor_planner": ("scaletrain.checkpointing.planner", "a7_memory"),
    "powersgd": ("scaletrain.compression.powersgd", "a8_compression"),
    "onebit": ("scaletrain.compression.onebit", "a8_compression"),
    "lamb": ("scaletrain.compression.lamb", "a8_compression"),
    "plan_memory": ("scaletrain.plan.memory", "a9_planning"),
    "plan_time": ("scaletrain.plan.time_model", "a9_planning"),
    "plan_search": ("scaletrain.plan.layouts", "a9_planning"),
}
IMPL_ENV = "SCALETRAIN_STUDENT_FILES"  # JSON {library module: student file}; inherited by spawned ranks


def _chosen() -> dict[str, str]:
    raw = os.environ.get(IMPL_ENV, "")
    if raw != _chosen.raw:
        import json
        _chosen.raw, _chosen.files = raw, (json.loads(raw) if raw else {})
    return _chosen.files


_chosen.raw, _chosen.files = "", {}


class _StudentFinder:
    """Imports a library module chosen in $SCALETRAIN_STUDENT_FILES from the student's file, under the
    library module's own name (as the student repository's shims do): everything that imports the
    library, in this process and in the ranks `spawn` starts, runs the student's code."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        file = _chosen().get(name)
        if file is None:
            return None
        import importlib.util
        return importlib.util.spec_from_file_location(name, file)


def install_finder() -> None:
    import sys
    if not any(isinstance(f, _StudentFinder) or f is _StudentFinder for f in sys.meta_path):
        sys.meta_path.insert(0, _StudentFinder)


def _resolve(stem: str, impl: str) -> Path | None:
    """The student file that `impl` names for `stem`, or None for the library's own module."""
    if stem not in STUDENT_MODULES:
        raise ValueError(f"{stem!r} is not a student file; known: {', '.join(STUDENT_MODULES)}")
    if impl == "reference":
        return None
    folder = STUDENT_MODULES[stem][1]
    if impl == "student":
        return student_file(folder, f"{stem}.py")
    path = Path(impl).expanduser().resolve() / f"{stem}.py"
    if not path.is_file():
        raise FileNotFoundError(f"IMPL = {impl!r}: {path} is missing (a submission folder holds {stem}.py, "
                                f"like assignments/{folder}/)")
    return path


def for_ranks(stem: str, impl: str) -> Path | None:
    """Ranks started from now on import `stem`'s library module from the file `impl` names (this
    process keeps the module it has: a benchmark that already imported the library can still time
    a student's file); returns that file, or None for the library's own."""
    file = _resolve(stem, impl)
    if file is not None:
        import json
        os.environ[IMPL_ENV] = json.dumps({**_chosen(), STUDENT_MODULES[stem][0]: str(file)})
    return file


def implementation(stems, impl: str = "reference", *, announce: bool = True):
    """The notebooks' switch: which code the demos run for the student files `stems` ("ring", or a
    tuple such as ("dp_bucket", "dp_data_parallel")).

    `impl` is "reference" (the library as it is), "student" (your files in assignments/<folder>/,
    or in $AUTOGRADER_SUBMISSION), or a path to a submission folder holding the files. With a
    student file, the library module (e.g. `scaletrain.comm.ring`) is imported *from that file*, here
    and in every rank started afterwards, so the demos' own imports run it. Call it in a notebook's
    first cell, before anything imports the library modules (else: restart the kernel). Prints one
    line saying which implementation runs; returns the module (a tuple of modules for a tuple)."""
    import importlib
    import sys
    single = isinstance(stems, str)
    stems = (stems,) if single else tuple(stems)
    chosen = dict(_chosen())
    files = {stem: _resolve(stem, impl) for stem in stems}
    for stem, file in files.items():
        name = STUDENT_MODULES[stem][0]
        loaded = sys.modules.get(name)
        wanted = str(file) if file else None
        if loaded is not None and chosen.get(name) != wanted:
            raise RuntimeError(f"{name} is already imported from {getattr(loaded, '__file__', '?')}: choose the "
                               f"implementation in the notebook's first cell, then restart the kernel")
        if file is None:
            chosen.pop(name, None)
        else:
            chosen[name] = wanted
    import json
    os.environ[IMPL_ENV] = json.dumps(chosen)
    if not chosen:
        del os.environ[IMPL_ENV]
    install_finder()
    modules = tuple(importlib.import_module(STUDENT_MODULES[stem][0]) for stem in stems)
    if announce:
        print(describe(modules, impl))
    return modules[0] if single else modules


def describe(modules, impl: str) -> str:
    """One line: which file each module runs."""
    parts = []
    for module in modules:
        file = Path(module.__file__).resolve()
        where = file.relative_to(REPO) if file.is_relative_to(REPO) else file
        parts.append(f"{module.__name__} from {where}")
    kind = ("the reference library" if all(Path(m.__file__).resolve().is_relative_to(REPO / "lib") for m in modules)
            and impl == "reference" else "student code")
    return f"implementation ({impl!r}): {kind}: " + ", ".join(parts)


def module_file(rank: int, world_size: int, name: str) -> str:
    """Where a rank imports the library module `name` from (`spawn(module_file, p, name)`): the
    check that the ranks of a demo run the chosen implementation."""
    import importlib
    return importlib.import_module(name).__file__
