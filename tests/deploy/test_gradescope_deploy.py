"""The Gradescope package as Gradescope deploys it (issue 27): unzipped at the real /autograder (a
tmpfs in a private mount namespace), installed by its own setup.sh in a fresh venv, and graded
through its own run_autograder, as root: once without CAP_SYS_ADMIN, as Docker runs a container by
default (the grader can make no mount namespace; the files' permissions alone keep the secrets),
once with every capability. Nothing here points the package at this checkout's venv.

Submissions: the reference (full marks), the stub (zero), a planted bucket off-by-one (loses the
cap check), and a probe that reports its uid and what it can read, write and signal (it must be an
unprivileged account that sees no seed, suite, reference or report). Run by `make deploy-test`
(CI calls it); the measured setup time, venv size and grading times are printed.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.gradescope import build_package
from autograder.manifest import REPO, get_manifest

HERE = Path(__file__).resolve().parent
SEED = 31337
ASSIGNMENT = "a3"
OFF_BY_ONE = "a bucket closed when a parameter exactly fills the cap (>= for >)"
# PyTorch's CPU index, which setup.sh names, is not reachable from this machine: pip's registries
# here serve the same torch 2.13.0+cpu wheel; without retries the unreachable index costs ~0.1 s
PASSED_ENV = ("PIP_FIND_LINKS", "PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK",
              "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0 or shutil.which("unshare") is None,
                       reason="installs at /autograder in a private mount namespace: needs root, Linux, unshare"),
]


def _submissions(folder: Path) -> Path:
    m = get_manifest(ASSIGNMENT)
    solution = {name: (m.solution_dir() / name).read_text() for name in m.files}
    plant = next(p for p in m.planted if p.name == OFF_BY_ONE)
    cases = {
        "reference": solution,
        "stub": {name: (m.stub_dir() / name).read_text() for name in m.files},
        "off_by_one": {**solution, plant.file: plant.apply(solution[plant.file])},
        "probe": {**solution, plant.file: solution[plant.file] + "\n" + (HERE / "probe_submission.py").read_text()},
    }
    for case, files in cases.items():
        (folder / case).mkdir(parents=True)
        for name, text in files.items():
            (folder / case / name).write_text(text)
    return folder


def _gradescope_env() -> dict[str, str]:
    """A root shell's environment on a fresh image: no venv, no PYTHONPATH, the system's python3."""
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    return dict(env, PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", HOME="/root",
                LANG="C.UTF-8", PIP_RETRIES="0")


# Gradescope runs its image in a container: Docker's default drops CAP_SYS_ADMIN, so the grader can
# make no mount namespace and the files' permissions alone keep the secrets (sandbox.jail); a
# privileged container keeps it. run_autograder runs under each (setup.sh as root, as Gradescope does).
PRIVILEGES = {"docker": "setpriv --bounding-set=-sys_admin --inh-caps=-sys_admin", "privileged": ""}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    """(the package, the submissions folder)"""
    work = tmp_path_factory.mktemp("inputs")
    return build_package(get_manifest(ASSIGNMENT), work / "a3_autograder.zip", seed=SEED), _submissions(work / "submissions")


@pytest.fixture(scope="module", params=list(PRIVILEGES))
def deployed(request, inputs, tmp_path_factory):
    (package, subs), out = inputs, tmp_path_factory.mktemp(f"deploy-{request.param}") / "out"
    out.mkdir()
    made = not Path("/autograder").exists()
    if made:
        Path("/autograder").mkdir()  # the mount point; the tmpfs on it lives in the namespace only
    try:
        proc = subprocess.run(["unshare", "-m", "bash", str(HERE / "deploy_gradescope.sh"), str(package), str(subs),
                               str(out)], env=dict(_gradescope_env(), RUN_PREFIX=PRIVILEGES[request.param]),
                              capture_output=True, text=True, timeout=1800)
    finally:
        if made:
            Path("/autograder").rmdir()
    setup_log = (out / "setup.log").read_text()[-3000:] if (out / "setup.log").exists() else ""
    assert proc.returncode == 0, f"deploy failed:\n{proc.stderr[-3000:]}\nsetup.log:\n{setup_log}"
    setup = json.loads((out / "setup.json").read_text())
    graded = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if p.stem != "setup"}
    times = {p.stem: int(p.read_text()) / 1000 for p in out.glob("*.ms")}
    print(f"\n{request.param}: setup.sh {setup['setup_ms'] / 1000:.0f} s, venv {setup['venv_mib']} MiB; grading: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(times.items())))
    return graded, out


@pytest.fixture(scope="module")
def regraded(inputs, tmp_path_factory) -> dict[str, dict]:
    package, subs = inputs
    return _regrade(package, subs, tmp_path_factory.mktemp("regrade") / "out")


def _regrade(package: Path, subs: Path, out: Path) -> dict[str, dict]:
    """The instructor's class regrade of the same submissions on the package's inputs (this checkout)."""
    proc = subprocess.run([sys.executable, "-m", "autograder", "regrade", ASSIGNMENT, "--package", str(package),
                           "--submissions", str(subs), "--out", str(out), "--device", "cpu"],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/results.json")}


def _outcomes(payload: dict) -> dict[str, str]:
    return {t["extra_data"]["check"]: t["extra_data"]["outcome"] for t in payload["tests"]}


def _log(out: Path, name: str) -> str:
    return (out / f"{name}.log").read_text()[-2000:]


def test_nothing_of_the_course_is_installed_as_a_package(deployed):
    graded, out = deployed
    assert "imports scaletrain from" not in _log(out, "reference"), _log(out, "reference")
    assert not graded["reference"]["extra_data"]["harness_error"]


def test_reference_gets_full_marks_and_the_packages_seed(deployed):
    graded, out = deployed
    ref = graded["reference"]
    assert ref["score"] == ref["max_score"] == get_manifest(ASSIGNMENT).max_score, \
        (_log(out, "reference"), [t for t in ref["tests"] if t["status"] != "passed"])
    assert ref["extra_data"]["seed"] == SEED
    assert "groups run as nobody" in ref["extra_data"]["sandbox"], ref["extra_data"]["sandbox"]


def test_stub_gets_zero(deployed):
    graded, _ = deployed
    assert graded["stub"]["score"] == 0
    assert set(_outcomes(graded["stub"]).values()) == {"failed"}


def test_bucket_off_by_one_loses_the_cap_check(deployed):
    graded, _ = deployed
    plant = next(p for p in get_manifest(ASSIGNMENT).planted if p.name == OFF_BY_ONE)
    got = _outcomes(graded["off_by_one"])
    assert {check: got[check] for check in plant.expect} == plant.expect
    assert graded["off_by_one"]["score"] < graded["reference"]["score"]


def test_the_students_code_runs_unprivileged_and_sees_no_secret(deployed):
    graded, out = deployed
    reasons = [t["output"] for t in graded["probe"]["tests"] if "PROBE" in t["output"]]
    assert reasons, f"the probe never ran: {_log(out, 'probe')}"
    found = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", reasons[0].split("PROBE", 1)[1])}
    print(f"\nprobe: {found}")
    assert found["uid"] != 0 and found["euid"] != 0, found
    secrets = ("seed_env", "seed_in_proc_environ", "report_in_proc_cmdline", "read_package_json", "read_suite",
               "read_reference", "write_results", "write_venv", "write_source", "signal_root", "killed_parent")
    assert {k: found[k] for k in secrets} == dict.fromkeys(secrets, 0)
    assert graded["probe"]["score"] == 0


def test_regrade_on_the_package_gives_gradescopes_scores(deployed, regraded):
    """`regrade --package` grades on the package's seed: check for check, the scores Gradescope's
    run_autograder gave the same submissions."""
    graded, _ = deployed
    assert set(regraded) == set(graded)
    for name, payload in graded.items():
        scores = {t["extra_data"]["check"]: t["score"] for t in payload["tests"]}
        again = {t["extra_data"]["check"]: t["score"] for t in regraded[name]["tests"]}
        assert again == scores, name
        assert regraded[name]["extra_data"]["seed"] == SEED
