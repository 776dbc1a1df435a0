"""Release: markers become stubs and solutions; the committed copies are never stale."""

import pytest

from autograder.manifest import Manifest, Task, all_manifests
from autograder.release import HINTS_FILE, ReleaseError, outputs, release, render, text_leaks
from autograder.static_check import check_source

SOURCE = '''\
import torch


def double(x):
    """Spec stays in the stub."""
    # BEGIN SOLUTION
    y = x * 2
    return y
    # END SOLUTION


def shape_of(x):
    # BEGIN SOLUTION
    # STUB: return None  # TODO: return x's shape
    return x.shape
    # END SOLUTION
'''


def msg(func):
    return f"a9 task 1: implement `{func}`"


def test_stub_replaces_regions_and_keeps_the_spec():
    stub = render(SOURCE, source="lib/x.py", comment="#", stub=True, message=msg)
    # the stub is the file a student edits (in the student repository lib/x.py is a shim running it)
    assert stub.startswith("# The file to fill in (handout: README.md here). Staff: generated from lib/x.py by "
                           "`python -m autograder release`; edit the source.")
    assert "Edit that file, not this one" not in stub
    assert '"""Spec stays in the stub."""' in stub
    assert "    raise NotImplementedError('a9 task 1: implement `double`')\n" in stub
    assert "    return None  # TODO: return x's shape\n" in stub
    assert "x * 2" not in stub and "x.shape" not in stub and "SOLUTION" not in stub
    compile(stub, "stub.py", "exec")


def test_solution_drops_only_the_markers():
    solution = render(SOURCE, source="lib/x.py", comment="#", stub=False, message=msg)
    assert "y = x * 2" in solution and "return x.shape" in solution
    assert "SOLUTION" not in solution and "STUB" not in solution
    namespace = {}
    exec(compile(solution, "solution.py", "exec"), namespace)
    assert namespace["double"](21) == 42


def test_cuda_markers_use_slashes():
    cu = "__global__ void k(float* x) {\n  // BEGIN SOLUTION\n  x[0] = 1;\n  // END SOLUTION\n}\n"
    stub = render(cu, source="kernels/k.cu", comment="//", stub=True, message=msg)
    assert "// TODO: a9 task 1: implement `k`" in stub and "x[0] = 1" not in stub


@pytest.mark.parametrize("bad, why", [
    ("# BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n# END SOLUTION\n", "without BEGIN"),
    ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "inside another"),
])
def test_unbalanced_markers_name_the_line(bad, why):
    with pytest.raises(ReleaseError, match=why):
        render(bad, source="lib/x.py", comment="#", stub=True, message=msg)


def test_relative_imports_are_refused(tmp_path, monkeypatch):
    src = tmp_path / "x.py"
    src.write_text("from .y import z\n")
    m = Manifest(assignment="a9", folder="a9_x", title="x", files={"x.py": str(src)},
                 tasks=(Task("1", "x", file="x.py"),), groups=())
    with pytest.raises(ReleaseError, match="absolute imports"):
        outputs(m)


def test_committed_stubs_and_solutions_are_up_to_date():
    assert release(check=True) == [], "run `python -m autograder release`"


LEAKY = '''\
def bytes_sent(p, chunk_numel, itemsize):
    """What one rank sends: 2·(p - 1)·chunk_numel·itemsize, the ring's bound."""
    # the ring sends 2 * (p - 1) * chunk_numel * itemsize in all
    # BEGIN SOLUTION
    total = 2 * (p - 1) * chunk_numel * itemsize
    return total
    # END SOLUTION


def messages(p):
    """`p - 1` steps per half: the count the grader checks."""
    # BEGIN SOLUTION
    steps_per_half_of_the_ring = p - 1
    return 2 * steps_per_half_of_the_ring
    # END SOLUTION
'''


def test_a_solution_line_in_a_docstring_or_comment_is_a_leak_with_file_and_line(tmp_path):
    src = tmp_path / "x.py"
    src.write_text(LEAKY)
    m = Manifest(assignment="a9", folder="a9_x", title="x", files={"x.py": str(src)},
                 tasks=(Task("1", "x", file="x.py"),), groups=())
    leaks = text_leaks({"a9": m})
    # the expression of line 5, written as prose in the docstring (line 2) and as code in a comment
    # (line 3); line 13's expression is too short to matter, the name alone gives nothing away
    assert [leak.split(" [")[0].split(": ")[0] for leak in leaks] == [f"{src}:2", f"{src}:3"]
    assert all(leak.endswith(f"[holds solution line {src}:5: total = 2 * (p - 1) * chunk_numel * itemsize]")
               for leak in leaks)


def test_every_assignment_has_hints_the_handout_links_and_the_student_repository_ships():
    from autograder import student
    shipped = student.file_map(student.make_plan(None, ""))
    for m in all_manifests().values():
        hints = m.stub_dir() / HINTS_FILE
        assert hints.is_file(), f"{m.assignment}: no {HINTS_FILE}"
        assert f"({HINTS_FILE})" in (m.stub_dir() / "README.md").read_text(), f"{m.assignment}: the handout does not link {HINTS_FILE}"
        assert f"assignments/{m.folder}/{HINTS_FILE}" in shipped, f"{m.assignment}: {HINTS_FILE} is not in the student repository"
        for task in m.tasks:
            assert f"**{task.id} " in hints.read_text(), f"{m.assignment}: {HINTS_FILE} has no paragraph for task {task.id}"


def test_static_check_resolves_aliases():
    src = ("import torch.distributed as dist\nfrom torch.distributed import all_reduce as ar\n"
           "def f(t):\n    dist.isend(t, 1)\n    dist.all_reduce(t)\n    ar(t)\n")
    found = check_source(src, "ring.py", ("torch.distributed.all_reduce",))
    assert [f.line for f in found] == [2, 5, 6] and all(f.kind == "forbidden" for f in found)
    assert check_source(src, "ring.py", ("torch.distributed.broadcast",)) == []
