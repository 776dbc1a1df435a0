"""The notebooks' implementation switch (`scaletrain.student_code.implementation`): "reference", or a
submission folder whose file then runs as the library module, here and in the ranks `spawn` starts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scaletrain import student_code
from scaletrain.student_code import REPO, STUDENT_KERNELS, STUDENT_MODULES, _resolve

PY = textwrap.dedent("""
    if __name__ == "__main__":
        from scaletrain.student_code import implementation, module_file
        ring = implementation("ring", {folder!r})   # before anything imports scaletrain.comm
        import scaletrain.comm
        from scaletrain.launch import spawn
        assert ring is sys.modules["scaletrain.comm.ring"]
        assert scaletrain.comm.ring_allreduce is ring.ring_allreduce   # the package's names are the student's
        print("FILE", ring.__file__)
        print("RANKS", spawn(module_file, 2, "scaletrain.comm.ring", timeout_s=60))
        try:
            implementation("ring", "reference")
        except RuntimeError as err:
            print("SWITCH", err)
""")


def test_table_matches_the_manifests():
    """The generated table (`release` writes lib/scaletrain/student_files.py) is the manifests' now."""
    from autograder.manifest import all_manifests
    lib_files, triton_files = {}, {}
    for m in all_manifests().values():
        for stem, src in m.files.items():
            if src.startswith("lib/") and src.endswith(".py"):
                lib_files[Path(stem).stem] = (src[len("lib/"):-len(".py")].replace("/", "."), m.folder)
            elif src.startswith("kernels/") and src.endswith("_triton.py"):
                triton_files[Path(stem).stem] = m.folder
    assert STUDENT_MODULES == lib_files and STUDENT_KERNELS == triton_files
    for stem in ("ring", "dp_bucket", "dp_data_parallel", "pp_schedules", "pp_validate", "pp_executor",
                 "zero_engine"):
        assert stem in STUDENT_MODULES


def test_resolve(tmp_path):
    assert _resolve("ring", "reference") is None
    assert _resolve("ring", "student") == REPO / "assignments" / "a2_collectives" / "ring.py"
    a5 = REPO / "solutions" / "a5_zero"
    assert _resolve("zero_engine", str(a5)) == a5 / "zero_engine.py"
    with pytest.raises(FileNotFoundError, match="ring.py"):
        _resolve("ring", str(tmp_path))
    with pytest.raises(ValueError, match="not a student file"):
        _resolve("launch", "reference")


def test_a_folder_runs_as_the_library_module_in_every_rank():
    folder = REPO / "solutions" / "a2_collectives"
    out = subprocess.run([sys.executable, "-c", "import sys\n" + PY.format(folder=str(folder))],
                         capture_output=True, text=True, timeout=240, cwd=REPO / "notebooks")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("implementation ("), lines  # the one printed line
    assert "solutions/a2_collectives/ring.py" in lines[0]
    expected = str(folder / "ring.py")
    assert f"FILE {expected}" in lines
    assert f"RANKS {[expected, expected]}" in lines
    assert any(line.startswith("SWITCH scaletrain.comm.ring is already imported") for line in lines)


def test_reference_leaves_the_library_alone(monkeypatch):
    from scaletrain.student_code import IMPL_ENV, implementation
    monkeypatch.delenv(IMPL_ENV, raising=False)
    ring = implementation("ring", "reference", announce=False)
    assert Path(ring.__file__).resolve() == REPO / "lib" / "scaletrain" / "comm" / "ring.py"
    assert IMPL_ENV not in __import__("os").environ


def test_a_kernel_file_runs_the_chosen_copy(monkeypatch):
    """`implementation("softmax_triton", folder)`: scaletrain.ops loads the folder's kernel file.
    The choice lives in this process's environment: set here through monkeypatch so that it is
    undone after the test (it would redirect every later test's kernels and ranks)."""
    monkeypatch.setenv(student_code.IMPL_ENV, "")
    folder = REPO / "solutions" / "a1_kernels"
    chosen = student_code.implementation("softmax_triton", str(folder), announce=False)
    assert chosen == folder / "softmax_triton.py"
    assert student_code.kernel_file(REPO / "kernels" / "softmax_triton.py") == chosen
    assert student_code.kernel_file(REPO / "kernels" / "layer_norm_triton.py") == REPO / "kernels" / "layer_norm_triton.py"
    # what the ops load follows the choice both ways (the loader remembers paths per choice)
    from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module
    assert Path(load_kernel_module(KERNELS_DIR / "softmax_triton.py").__file__) == chosen
    monkeypatch.setenv(student_code.IMPL_ENV, "")
    assert Path(load_kernel_module(KERNELS_DIR / "softmax_triton.py").__file__) == REPO / "kernels" / "softmax_triton.py"


def test_needs_skips_a_demo_of_an_open_assignment_on_reference_only(monkeypatch, tmp_path, capsys):
    """In a student repository (its release record) a demo of the open assignment with IMPL =
    "reference" has no code to run: it says which task to implement first and skips."""
    assert student_code.needs("3.1", "reference")  # the course repository: every reference is here
    record = tmp_path / "student_release.json"
    record.write_text('{"open": {"a3": "a3_data_parallel"}, "unreleased": {"a4": "a4_pipeline"}}')
    monkeypatch.setattr(student_code, "RELEASE_RECORD", record)
    assert not student_code.needs("3.1-3.3", "reference")
    assert "implement tasks 3.1-3.3 first (set IMPL = 'student'" in capsys.readouterr().out
    assert student_code.needs("3.2", "student") and student_code.needs("2.1", "reference")
    assert not student_code.needs("4.1", "student")
    assert "not released yet" in capsys.readouterr().out


def test_the_finder_imports_nothing_while_it_looks(tmp_path):
    """With a choice in the environment (as every rank of a notebook inherits it), a process whose
    finder is installed imports modules it has not loaded yet: the finder's own lookup must not
    import (it once imported json inside, and recursed on that import until RecursionError)."""
    import subprocess
    import sys
    env = dict(__import__("os").environ, **{student_code.IMPL_ENV: '{"kernels/x.py": "/nowhere/x.py"}'})
    code = ("import sys; sys.modules.pop('json', None)\n"
            "import scaletrain.student_code as s; s.install_finder()\n"
            "import decimal, fractions; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
