"""What a student runs without the hidden suite: the public checks, and `submit`.

`grade aN` in a student repository runs the assignment's public tests (`assignments/aN_*/tests/`)
on the student's files and prints one row per test, grouped by task: feedback, not the grade.
`submit aN` writes the zip to upload: exactly the files the manifest names plus the written
answers, and refuses a submission in which every task is still the untouched stub.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass
from pathlib import Path

from autograder.checks import SUBMISSION_ENV
from autograder.manifest import Manifest
from autograder.release import ANSWERS_FILE, ANSWER_PROMPT, written_questions

PUBLIC_TIMEOUT_S = 900
_TASK = re.compile(r"test_task(\d+)_(\d+)")


@dataclass(frozen=True)
class PublicResult:
    task: str
    test: str
    outcome: str     # passed | failed | error | not_run | timeout
    reason: str


def run_public(m: Manifest, submission: Path, *, timeout_s: float = PUBLIC_TIMEOUT_S) -> list[PublicResult]:
    """The public tests of `m` on the files in `submission`, in a pytest subprocess with a time limit."""
    tests = m.stub_dir() / "tests"
    if not tests.is_dir():
        raise FileNotFoundError(f"{m.assignment}: no public tests in {tests}")
    with tempfile.TemporaryDirectory(prefix=f"public-{m.assignment}-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra",
               f"--junitxml={xml}", f"--rootdir={m.stub_dir().parents[1]}"]
        env = dict(os.environ, **{SUBMISSION_ENV: str(submission.resolve())})
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return [PublicResult("-", "public tests", "timeout",
                                 f"did not finish within {timeout_s:.0f} s (an infinite loop or a deadlock?)")]
        if not xml.is_file():
            tail = output.decode(errors="replace").strip().splitlines()[-3:]
            return [PublicResult("-", "public tests", "error", " | ".join(tail) or "pytest wrote no report")]
        return _parse_junit(xml)


def _parse_junit(xml: Path) -> list[PublicResult]:
    results = []
    for case in ET.parse(xml).iter("testcase"):
        name = case.get("name", "")
        hit = _TASK.search(name)
        task = f"{hit.group(1)}.{hit.group(2)}" if hit else "-"
        outcome, reason = "passed", ""
        for tag, kind in (("failure", "failed"), ("error", "error"), ("skipped", "not_run")):
            node = case.find(tag)
            if node is not None:
                outcome = kind
                reason = (node.get("message") or node.text or "").strip().splitlines()
                reason = reason[0][:300] if reason else ""
                break
        if outcome == "failed" and "NotImplementedError" in reason:
            reason = "not implemented yet: " + reason.split("NotImplementedError: ", 1)[-1]
        results.append(PublicResult(task, name, outcome, reason))
    return sorted(results, key=lambda r: (tuple(int(x) for x in r.task.split(".")) if r.task != "-" else (99,), r.test))


def public_table(m: Manifest, results: list[PublicResult]) -> str:
    rows = [("task", "public test", "result", "reason")] + [(r.task, r.test, r.outcome, r.reason) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + (f"  {row[3]}" if row[3] else "")
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts = {o: sum(r.outcome == o for r in results) for o in ("passed", "failed", "error", "timeout", "not_run")}
    parts = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    lines.append(f"\n{m.assignment} public checks: {parts}. These are not your grade: the hidden suite "
                 f"({hidden_suite(m)}) grades what you submit.")
    return "\n".join(lines)


_SPEED = re.compile(r"\bspeed\b|\bfaster than\b", re.I)


def hidden_suite(m: Manifest) -> str:
    """What the hidden suite checks, as this assignment's checks say: a summary that promised
    speed checks to a3, which has none, would send students hunting for them."""
    kinds = ["hidden inputs"] + ["speed"] * any(_SPEED.search(c.name) for c in m.checks) \
        + ["anti-cheat"] * bool(m.forbidden)
    text = f"{m.max_score:g} points: " + (", ".join(kinds[:-1]) + " and " if len(kinds) > 1 else "") \
        + kinds[-1] + " checks"
    gpu = sum(c.points for g in m.groups if g.needs_gpu for c in g.checks)
    return text + (f"; {gpu:g} of the points on a GPU" if gpu else "")


# ---------------------------------------------------------------- submit

def stub_markers(m: Manifest) -> dict[str, tuple[str, ...]]:
    """Per file, the lines only the untouched stub has (`raise NotImplementedError(...)`, `#error`)."""
    if m.stub_markers:
        return m.stub_markers
    from autograder.release import outputs

    generated = outputs(m)
    markers = {}
    for name in m.files:
        solution = set(generated[m.solution_dir() / name].splitlines())
        stub = generated[m.stub_dir() / name].splitlines()[1:]  # not the header: a student may keep it
        markers[name] = tuple(dict.fromkeys(line.strip() for line in stub if line.strip() and line not in solution))
    return markers


class SubmitRefused(Exception):
    pass


def submit(m: Manifest, submission: Path, out: Path) -> tuple[Path, list[str]]:
    """Write the upload zip; returns it and the warnings to print (tasks still stubbed, no answers)."""
    missing = [name for name in m.files if not (submission / name).is_file()]
    if missing:
        raise SubmitRefused(f"{m.assignment}: {', '.join(missing)} missing from {submission}")
    untouched, warnings = [], []
    for name, lines in stub_markers(m).items():
        text = (submission / name).read_text(errors="replace")
        left = [line for line in lines if line in text]
        if lines and len(left) == len(lines):
            untouched.append(name)
        elif left:
            warnings.append(f"{name}: {len(left)} of {len(lines)} stub lines are still there ({left[0][:80]})")
    if len(untouched) == len(m.files):
        raise SubmitRefused(f"{m.assignment}: nothing implemented yet: every task in {', '.join(untouched)} still "
                            f"raises NotImplementedError (or #error); fill in the stubs first")
    answers = submission / ANSWERS_FILE
    if not answers.is_file():
        answers = m.stub_dir() / ANSWERS_FILE
    files = [submission / name for name in m.files]
    if answers.is_file():
        files.append(answers)
        warnings += _answer_warnings(m, answers.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in files:
            z.write(path, arcname=path.name)
    return out, warnings


def _answer_warnings(m: Manifest, text: str) -> list[str]:
    """Questions of the handout missing from the answers file (deleted, or renumbered), and
    questions with no answer: either way the staff would grade a blank."""
    warnings = []
    handout = m.stub_dir() / "README.md"
    asked = len(written_questions(handout.read_text())) if handout.is_file() else 0
    present = {int(n) for n in re.findall(r"^## Question (\d+)\s*$", text, flags=re.M)}
    missing = [str(i) for i in range(1, asked + 1) if i not in present]
    if missing:
        warnings.append(f"{ANSWERS_FILE}: question(s) {', '.join(missing)} of the handout's {asked} are missing "
                        f"(restore each as \"## Question N\" with your answer under it)")
    if _unanswered(text):
        warnings.append(f"{ANSWERS_FILE}: {_unanswered(text)} question(s) have no answer yet")
    return warnings


def _unanswered(text: str) -> int:
    """Questions whose answer prompt is followed by nothing before the next question."""
    blocks = text.split(ANSWER_PROMPT)[1:]
    return sum(not block.split("\n## Question")[0].strip() for block in blocks)
