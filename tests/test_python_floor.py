"""The Python the course needs is the one its pins need, and every installer says so before pip fails.

numpy 2.4 and matplotlib 3.11 require Python >= 3.11 (their wheels' Requires-Python); Ubuntu 22.04,
a Gradescope image, has 3.10. pyproject's requires-python states the floor the pins set; `make setup`
(this repository's and the student repository's) refuses an older interpreter with the fix; the
Gradescope setup.sh finds or installs a newer one (tests/test_gradescope.py).
"""

import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from autograder.manifest import REPO

MAKEFILES = [REPO / "Makefile", REPO / "autograder" / "templates" / "student" / "Makefile"]


def _floor(spec: str) -> tuple[int, ...]:
    found = re.search(r">=\s*([0-9.]+)", spec or "")
    return tuple(int(x) for x in found.group(1).split(".")) if found else (0,)


def _installed(name: str) -> str | None:
    """The installed version without its local label (torch's `+cpu`), or None."""
    try:
        return metadata.version(name).split("+")[0]
    except metadata.PackageNotFoundError:
        return None


def test_requires_python_is_the_floor_the_pinned_packages_set():
    text = (REPO / "pyproject.toml").read_text()
    declared = _floor(re.search(r'requires-python = "([^"]+)"', text).group(1))
    pins = dict(re.findall(r'"([A-Za-z0-9_-]+)==([^"; ]+)', text))
    elsewhere = {name: _installed(name) for name, version in pins.items() if _installed(name) != version}
    if elsewhere:  # e.g. the GPU machine's own torch 2.11: its metadata says nothing of the pins'
        pytest.skip(f"not the pinned stack (installed here: {elsewhere}); `make setup` installs it")
    needed = {name: _floor(metadata.metadata(name)["Requires-Python"]) for name in pins}
    assert declared == max(needed.values()), (declared, needed)


@pytest.mark.parametrize("makefile", MAKEFILES, ids=["course", "student"])
def test_make_setup_refuses_an_older_python_with_the_fix(makefile, tmp_path):
    shutil.copy(makefile, tmp_path / "Makefile")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    old = tmp_path / "python3.10"
    old.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n[ "$1" = -c ] && exit 1\nexit 0\n')
    old.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # not `make test`'s
    proc = subprocess.run(["make", "--no-print-directory", "setup", f"PYTHON={old}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "older than Python 3.11" in proc.stderr and "PYTHON=python3.12" in proc.stderr
    assert "-m venv" not in (tmp_path / "calls").read_text() and not Path(tmp_path / ".venv").exists()
