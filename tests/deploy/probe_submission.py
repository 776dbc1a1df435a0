"""What a submission can see and do where the grader runs it, appended to a graded file.

At import (in whatever process runs the student's code) it looks for what it must not have: root,
the grading seed in any environment it can read, the hidden suite, the reference or package.json,
the report path on a command line, write access to the results or the venv, a root process it can
signal; it tries to kill its keeper. It then fails with all of that on one line, which the grader copies into every check's
reason, so the deployment test reads the findings from results.json.
"""

import os


def _readable(path):
    """True if the file's content can be read (an empty /dev/null bound over it does not count)."""
    try:
        with open(path, "rb") as f:
            return len(f.read(1)) == 1
    except OSError:
        return False


def _writable(folder):
    try:
        probe = os.path.join(folder, ".probe")
        with open(probe, "w") as f:
            f.write("x")
        os.remove(probe)
        return True
    except OSError:
        return False


def _procs():
    return [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]


def _seen_in_proc(name, needle):
    """How many processes' /proc/<pid>/<name> this process can read and find `needle` in."""
    seen = 0
    for pid in _procs():
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                seen += needle in f.read()
        except OSError:
            pass
    return seen


def _root_owned(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.split()[1] == "0" for line in f if line.startswith("Uid:"))
    except OSError:
        return False


def _signalable_root():
    """Root processes this one may signal (signal 0 asks the kernel without sending anything)."""
    count = 0
    for pid in _procs():
        if _root_owned(pid):
            try:
                os.kill(int(pid), 0)
                count += 1
            except OSError:
                pass
    return count


def _killed_parent():
    """1 if this process could SIGKILL the process that started it (its keeper): it must not."""
    try:
        os.kill(os.getppid(), 9)
        return 1
    except OSError:
        return 0


def _findings():
    source = "/autograder/source"
    return {
        "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
        "seed_env": int("AUTOGRADER_SEED" in os.environ),
        "seed_in_proc_environ": _seen_in_proc("environ", b"AUTOGRADER_SEED"),
        "report_in_proc_cmdline": _seen_in_proc("cmdline", b"report.jsonl"),
        "read_package_json": int(_readable(f"{source}/package.json")),
        "read_suite": int(_readable(f"{source}/autograder/suites/__init__.py")),  # in every package
        "read_reference": int(_readable(f"{source}/lib/scaletrain/dp/bucket.py")),
        "write_results": int(_writable("/autograder/results")),
        "write_venv": int(_writable("/autograder/venv/bin")),
        "write_source": int(_writable(source)),
        "signal_root": _signalable_root(),
        "killed_parent": _killed_parent(),
    }


raise AssertionError("PROBE " + " ".join(f"{k}={v}" for k, v in _findings().items()))
