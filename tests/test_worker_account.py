"""Student code never runs as root (issue 28, part 2): graded here as root, with the interpreter
under a folder `nobody` can't enter, the probe submission of tests/deploy/ reports an unprivileged
uid, no seed and no root process it can signal; its try to kill its keeper fails and the verdict
stands (every check failed with the probe's own line, none an error of a dead worker)."""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder.manifest import REPO

PROBE = Path(__file__).resolve().parent / "deploy" / "probe_submission.py"


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root grader switches accounts")
def test_the_probe_runs_unprivileged_and_cannot_signal_its_keeper():
    folder = Path(tempfile.mkdtemp(prefix="probe-a0-"))
    (folder / "memory.py").write_text((REPO / "solutions/a0_memory/memory.py").read_text() + "\n" + PROBE.read_text())
    out = folder / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "AUTOGRADER_SEED"}
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", "a0", "--submission", str(folder),
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    payload = json.loads(out.read_text())
    assert proc.returncode == 1 and payload["score"] == 0, proc.stderr[-2000:]
    reasons = [t["output"] for t in payload["tests"]]
    assert all("PROBE" in r for r in reasons), reasons
    found = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", reasons[0].split("PROBE", 1)[1])}
    assert found["uid"] != 0 and found["euid"] != 0, found
    for key in ("seed_env", "seed_in_proc_environ", "signal_root", "killed_parent"):
        assert found[key] == 0, (key, found)
    assert payload["extra_data"]["sandbox"].startswith("groups run as ") and not payload["extra_data"]["unsafe_no_sandbox"]
