"""Public tests fail as precisely as the grader: the task, the configuration, the student's value
and the expected one. A bare `assert a == b` prints two numbers and nothing else, so none is
allowed in assignments/*/tests; `scaletrain.testing.expect_equal` (or an assert with a message)
says the rest. Every public test is named and marked by a task of its assignment."""

import ast
import re

import pytest

from autograder.manifest import REPO, all_manifests
from scaletrain.testing import expect_equal

PUBLIC = sorted((REPO / "assignments").glob("*/tests/*.py"))
_TASK_MARK = re.compile(r"task(\d+[a-z]?)_(\d+)$")


def bare_compares(source: str) -> list[int]:
    """Lines of the asserts whose test is a bare comparison and that carry no message."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Assert) and node.msg is None and isinstance(node.test, ast.Compare)]


def task_marks(func: ast.FunctionDef) -> list[str]:
    """The task ids ("9.1") of a test function's `@pytest.mark.taskN_M` decorators."""
    names = [ast.unparse(d).rsplit(".", 1)[-1] for d in func.decorator_list]
    return [f"{m[1]}.{m[2]}" for m in map(_TASK_MARK.match, names) if m]


def test_the_check_finds_a_bare_compare_and_lets_a_message_or_a_helper_through():
    source = ("def test_x():\n    assert f(3) == 10\n    assert f(4) == 11, 'f(4)'\n"
              "    expect_equal(f(5), 12, what='f(5)')\n    assert ok\n")
    assert bare_compares(source) == [2]


def test_expect_equal_names_the_call_both_values_and_the_first_difference():
    with pytest.raises(AssertionError, match=r"^in_flight\(pp=4\): got 11, expected 10$"):
        expect_equal(11, 10, what="in_flight(pp=4)")
    with pytest.raises(AssertionError, match=r"first difference at index 1: got 'B0', expected 'F1'"):
        expect_equal(["F0", "B0"], ["F0", "F1"], what="rank 0")
    expect_equal([1, 2], [1, 2], what="same")


@pytest.mark.parametrize("path", PUBLIC, ids=lambda p: p.relative_to(REPO / "assignments").as_posix())
def test_no_public_test_fails_with_a_bare_compare(path):
    lines = bare_compares(path.read_text())
    assert not lines, (f"{path.relative_to(REPO)}: bare `assert a == b` on line(s) {lines}: use "
                       f"scaletrain.testing.expect_equal(got, want, what=<call and configuration>) or add a message")


@pytest.mark.parametrize("m", list(all_manifests().values()), ids=lambda m: m.assignment)
def test_every_public_test_is_named_and_marked_by_a_task_of_its_assignment(m):
    tasks = {t.id for t in m.tasks}
    for path in sorted((m.stub_dir() / "tests").glob("test_*.py")):
        for func in ast.parse(path.read_text()).body:
            if not (isinstance(func, ast.FunctionDef) and func.name.startswith("test_")):
                continue
            where = f"{path.relative_to(REPO)}::{func.name}"
            marks = task_marks(func)
            assert marks and set(marks) <= tasks, f"{where}: marked {marks}, tasks of {m.assignment} are {sorted(tasks)}"
            assert func.name.startswith(f"test_task{marks[0].replace('.', '_')}_"), \
                f"{where}: the name must start with its first task marker, test_task{marks[0].replace('.', '_')}_"


def test_the_public_summary_promises_only_the_checks_an_assignment_has():
    """`grade`'s last line in a student repository: a6 has no speed checks, a2 has (issue: a6's
    summary promised "speed and anti-cheat checks")."""
    from autograder.manifest import get_manifest
    from autograder.public import hidden_suite

    a6, a2 = hidden_suite(get_manifest("a6")), hidden_suite(get_manifest("a2"))
    assert "speed" not in a6 and "anti-cheat" in a6, f"a6's summary: {a6!r}"
    assert "speed" in a2, f"a2's summary: {a2!r}"
