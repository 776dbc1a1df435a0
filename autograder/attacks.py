"""Source text of the attacks on the grader itself that the suites plant (issue 13's catalogue).

The static check forbids `importlib`, `__import__` and the like by name, so the planted code
reaches them in ways it cannot see; only the trusted split (autograder/untrusted.py) leaves
them nothing to earn. Each suite splices these lines into a function body of its own.
"""

from __future__ import annotations

# `__import__` without writing its name: `__builtins__` is a module or a dict, depending on how
# the student's module was loaded
IMPORTER = ("(getattr(__builtins__, '__imp' + 'ort__') if hasattr(__builtins__, '__imp' + 'ort__') "
            "else __builtins__['__imp' + 'ort__'])")


def report_forger(check_names) -> str:
    """Lines of a function body (4-space indent) that define `forge()`: append a 'passed' line
    for each check to every .jsonl report it can open under /tmp. The caller decides when to call
    it (and whether to register it with atexit, which the first line imports)."""
    writes = "".join(f"                            f.write(json.dumps({{'name': {name!r}, 'outcome': 'passed', "
                     "'reason': '', 'duration': 0.1}) + '\\n')\n" for name in check_names)
    return ("    import os, json, atexit\n"
            "    def forge():\n"
            "        for top, _, names in os.walk('/tmp'):\n"
            "            for n in names:\n"
            "                if n.endswith('.jsonl'):\n"
            "                    try:\n"
            "                        with open(os.path.join(top, n), 'a') as f:\n"
            f"{writes}"
            "                    except OSError:\n"
            "                        pass\n")
