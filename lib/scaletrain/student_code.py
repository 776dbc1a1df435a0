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

import json
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
    "zero_stage3": ("scaletrain.zero.stage3", "a5_zero"),
    "tp_operators": ("scaletrain.tp.operators", "a6_tensor_parallel"),
    "tp_layers": ("scaletrain.tp.layers", "a6_tensor_parallel"),
    "tp_cross_entropy": ("scaletrain.tp.cross_entropy", "a6_tensor_parallel"),
    "tp_sequence": ("scaletrain.tp.sequence", "a6_tensor_parallel"),
    "tp_mesh": ("scaletrain.mesh", "a6_tensor_parallel"),
    "loss_scaler": ("scaletrain.precision.scaler", "a7_memory"),
    "checkpoint_function": ("scaletrain.checkpointing.function", "a7_memory"),
    "rotor_planner": ("scaletrain.checkpointing.planner", "a7_memory"),
    "powersgd": ("scaletrain.compression.powersgd", "a8_compression"),
    "onebit": ("scaletrain.compression.onebit", "a8_compression"),
    "lamb": ("scaletrain.compression.lamb", "a8_compression"),
    "plan_memory": ("scaletrain.plan.memory", "a9_planning"),
    "plan_time": ("scaletrain.plan.time_model", "a9_planning"),
    "plan_search": ("scaletrain.plan.layouts", "a9_planning"),
    "moe_router": ("scaletrain.moe.router", "a10_moe"),
    "moe_losses": ("scaletrain.moe.losses", "a10_moe"),
    "moe_capacity": ("scaletrain.moe.capacity", "a10_moe"),
    "moe_dispatch": ("scaletrain.moe.dropless", "a10_moe"),
    "moe_all_to_all": ("scaletrain.moe.all_to_all", "a10_moe"),
}
# Triton kernel files, which scaletrain.ops loads by path from kernels/ (`kernel_file`), not imports:
# stem -> assignment folder (tests/test_notebook_impl.py checks these against the manifests too)
STUDENT_KERNELS = {
    "softmax_triton": "a1_kernels",
    "layer_norm_triton": "a1_kernels",
    "attention_triton": "a1b_attention",
    "cross_entropy_triton": "a1b_attention",
}
IMPL_ENV = "SCALETRAIN_STUDENT_FILES"  # JSON {library module: student file}; inherited by spawned ranks


def _chosen() -> dict[str, str]:
    """The choices in $SCALETRAIN_STUDENT_FILES. It runs inside an import (the finder below), so it
    imports nothing itself: `json` is loaded with this module, or the finder would recurse on it."""
    raw = os.environ.get(IMPL_ENV, "")
    if raw != _chosen.raw:
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
    folder = _folder(stem)
    if impl == "reference":
        return None
    if impl == "student":
        return student_file(folder, f"{stem}.py")
    path = Path(impl).expanduser().resolve() / f"{stem}.py"
    if not path.is_file():
        raise FileNotFoundError(f"IMPL = {impl!r}: {path} is missing (a submission folder holds {stem}.py, "
                                f"like assignments/{folder}/)")
    return path


def _folder(stem: str) -> str:
    """The assignment folder of a student file's stem; ValueError for anything else."""
    if stem in STUDENT_MODULES:
        return STUDENT_MODULES[stem][1]
    if stem in STUDENT_KERNELS:
        return STUDENT_KERNELS[stem]
    raise ValueError(f"{stem!r} is not a student file; known: {', '.join([*STUDENT_MODULES, *STUDENT_KERNELS])}")


def _key(stem: str) -> str:
    """Where a choice is recorded in $SCALETRAIN_STUDENT_FILES: the library module's name, or
    "kernels/<stem>.py" for a kernel file (no module name can look like that)."""
    return STUDENT_MODULES[stem][0] if stem in STUDENT_MODULES else f"kernels/{stem}.py"


def kernel_file(path: Path | str) -> Path:
    """The kernel file scaletrain.ops loads for `path` (kernels/<name>.py): the student's copy
    where a notebook chose one (`implementation("softmax_triton", "student")`), else `path`."""
    path = Path(path)
    chosen = _chosen().get(f"kernels/{path.name}")
    return Path(chosen) if chosen and path.parent.resolve() == REPO / "kernels" else path


def for_ranks(stem: str, impl: str) -> Path | None:
    """Ranks started from now on import `stem`'s library module from the file `impl` names (this
    process keeps the module it has: a benchmark that already imported the library can still time
    a student's file); returns that file, or None for the library's own."""
    file = _resolve(stem, impl)
    if file is not None:
        os.environ[IMPL_ENV] = json.dumps({**_chosen(), _key(stem): str(file)})
    return file


def implementation(stems, impl: str = "reference", *, announce: bool = True):
    """The notebooks' switch: which code the demos run for the student files `stems` ("ring", or a
    tuple such as ("dp_bucket", "dp_data_parallel"); kernel files too: "softmax_triton").

    `impl` is "reference" (the library as it is), "student" (your files in assignments/<folder>/,
    or in $AUTOGRADER_SUBMISSION), or a path to a submission folder holding the files. With a
    student file, the library module (e.g. `scaletrain.comm.ring`) is imported *from that file*, here
    and in every rank started afterwards, so the demos' own imports run it; a kernel file is what
    scaletrain.ops loads instead of kernels/<stem>.py (`kernel_file`). Call it in a notebook's
    first cell, before anything imports the library modules (else: restart the kernel). Prints one
    line saying which implementation runs; returns the module, or the kernel file's Path (a tuple
    for a tuple)."""
    import importlib
    single = isinstance(stems, str)
    stems = (stems,) if single else tuple(stems)
    chosen = dict(_chosen())
    for stem in stems:
        _choose(chosen, stem, _resolve(stem, impl))
    os.environ[IMPL_ENV] = json.dumps(chosen)
    if not chosen:
        del os.environ[IMPL_ENV]
    install_finder()
    loaded = tuple(importlib.import_module(STUDENT_MODULES[stem][0]) if stem in STUDENT_MODULES
                   else kernel_file(REPO / "kernels" / f"{stem}.py") for stem in stems)
    if announce:
        missing = sorted({_folder(stem) for stem in stems} & set(missing_references().values()))
        print(describe(loaded, impl) if impl != "reference" or not missing else
              f"implementation ('reference'): this repository has no reference of {', '.join(missing)} (yours to "
              f"write): the demos that need it say which task to implement first; IMPL = 'student' runs your files")
    return loaded[0] if single else loaded


def _choose(chosen: dict[str, str], stem: str, file: Path | None) -> None:
    """Record in `chosen` that `stem` runs `file` (None: the library's own); refuse to switch a
    module this process already imported from another file."""
    import sys
    key, wanted = _key(stem), (str(file) if file else None)
    loaded = sys.modules.get(key)
    if loaded is not None and chosen.get(key) != wanted:
        raise RuntimeError(f"{key} is already imported from {getattr(loaded, '__file__', '?')}: choose the "
                           f"implementation in the notebook's first cell, then restart the kernel")
    if file is None:
        chosen.pop(key, None)
    else:
        chosen[key] = wanted


def describe(modules, impl: str) -> str:
    """One line: which file each module (or kernel file) runs."""
    parts, files = [], []
    for module in modules:
        file = Path(module if isinstance(module, Path) else module.__file__).resolve()
        name = f"kernels/{file.name}" if isinstance(module, Path) else module.__name__
        where = file.relative_to(REPO) if file.is_relative_to(REPO) else file
        parts.append(f"{name} from {where}")
        files.append(file)
    library = all(f.is_relative_to(REPO / "lib") or f.is_relative_to(REPO / "kernels") for f in files)
    kind = "the reference library" if library and impl == "reference" else "student code"
    return f"implementation ({impl!r}): {kind}: " + ", ".join(parts)


# ---------------------------------------------------------------- demos of code not written yet

RELEASE_RECORD = Path(__file__).with_name("student_release.json")  # written by `release --student` only


def missing_references(state: str | None = None) -> dict[str, str]:
    """Assignment ("a3") -> its folder, for each assignment whose reference this library lacks, in
    `state` "open" (its modules run the student's files, stubs at first), "unreleased" (stubbed)
    or either (None). A student repository records them; the course repository lacks none."""
    if not RELEASE_RECORD.is_file():
        return {}
    record = json.loads(RELEASE_RECORD.read_text())
    return {a: f for s in ("open", "unreleased") if state in (None, s) for a, f in record[s].items()}


def needs(tasks: str, impl: str = "reference") -> bool:
    """Whether a notebook's demo that runs the code of `tasks` ("3.1", "3.2-3.3", "1b.1") can run:
    True where the library holds that code, or where `impl` chose the student's files (then a
    stub raises, as it should). False in a student repository with IMPL = "reference" while the
    assignment is open: the library module there *is* the untouched stub, so the cell prints what
    to do and skips its demo instead of stopping the lecture at NotImplementedError."""
    assignment = "a" + tasks.split(".")[0]
    label = f"tasks {tasks}" if "-" in tasks or "," in tasks else f"task {tasks}"
    if assignment in missing_references("unreleased"):
        print(f"This demo needs {label} of {assignment}, which is not released yet.")
        return False
    folder = missing_references("open").get(assignment)
    if folder is None or impl != "reference":
        return True
    print(f"This demo needs {label}, yours to write in assignments/{folder}/: implement {label} first "
          f"(set IMPL = 'student' in the first cell, restart the kernel).")
    return False


def module_file(rank: int, world_size: int, name: str) -> str:
    """Where a rank imports the library module `name` from (`spawn(module_file, p, name)`): the
    check that the ranks of a demo run the chosen implementation."""
    import importlib
    return importlib.import_module(name).__file__
