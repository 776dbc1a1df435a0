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
    for each check to every .jsonl report it can open under /tmp (six levels deep, hidden
    folders such as a .venv skipped: a grader's reports lie a few levels down, and a full walk of
    a busy machine's /tmp outlasts a group's time limit). The caller decides when to call
    it (and whether to register it with atexit, which the first line imports)."""
    writes = "".join(f"                            f.write(json.dumps({{'name': {name!r}, 'outcome': 'passed', "
                     "'reason': '', 'duration': 0.1}) + '\\n')\n" for name in check_names)
    return ("    import os, json, atexit\n"
            "    def forge():\n"
            "        for top, dirs, names in os.walk('/tmp'):\n"
            "            dirs[:] = [d for d in dirs if not d.startswith('.') and top.count('/') < 6]\n"
            "            for n in names:\n"
            "                if n.endswith('.jsonl'):\n"
            "                    try:\n"
            "                        with open(os.path.join(top, n), 'a') as f:\n"
            f"{writes}"
            "                    except OSError:\n"
            "                        pass\n")


def function_attacks(*, checks, module: str, source: str, call: str, keys=("want", "expected", "ref"),
                     wrong: str = "    return -1") -> dict[str, tuple[str, str]]:
    """name -> (function body, the outcome it must get) of the catalogue's attacks, each in place
    of the body of a function whose honest answer is the reference's `call` (e.g.
    "gpt_num_params(hidden=hidden)"): forged report lines (and at exit), a patched `classify`, the
    expected value read out of the caller's frames, the reference module `module` imported by a
    name built at run time, and the reference file `source` read from the grader's disk. Each
    answers `wrong` when it finds nothing; the trusted split leaves nothing to find, and nothing
    of the reference to import (the grading build's module runs the submission itself: the call
    recurses) or to read (`error`)."""
    name, args = call.split("(", 1)
    cut = len(module) - 3
    return {
        "forges 'passed' lines in every report it can find (and at exit)": (
            report_forger(checks) + "    forge(); atexit.register(forge)\n" + wrong, "failed"),
        "patches the grader's classify through sys.modules": (
            f"    ctx = {IMPORTER}('autograder.context', fromlist=['x'])\n"
            "    ctx.classify = lambda exc, submission: ('passed', '')\n" + wrong, "failed"),
        "reads the expected value out of the caller's frames": (
            "    try:\n        raise ZeroDivisionError\n    except ZeroDivisionError as e:\n"
            "        frame = e.__traceback__.tb_frame\n"
            "    while frame is not None:\n"
            f"        for key in {tuple(keys)!r}:\n"
            "            if isinstance(frame.f_locals.get(key), int):\n"
            "                return frame.f_locals[key]\n"
            "        frame = frame.f_back\n" + wrong, "failed"),
        "imports the reference by a name built at run time": (
            f"    ref = {IMPORTER}({module[:cut]!r} + {module[cut:]!r}, fromlist=['x'])\n"
            f"    return ref.{call}", "error"),
        "reads the reference from the grader's disk": (
            f"    code = open({source!r}).read()\n"
            "    scope = {'__name__': 'stolen'}\n"
            f"    {IMPORTER}('builtins').exec(code, scope)\n"
            f"    return scope[{name!r}]({args}", "error"),
    }


def kernel_attacks(*, file: str, kernel: str, anchor: str, result_line: str, result: str, zero: str,
                   checks, source: str) -> dict[str, tuple[tuple[tuple[str, str], ...], str]]:
    """name -> (replacements in `file`, the outcome it must get) of the catalogue's attacks on a
    Triton kernel file (a1, a1b). Each sits beside a kernel that writes zeros (`result_line`, the
    line computing `result`, becomes `result = zero`), so only the attack itself could earn a pass.
    Run when the file is imported (the code goes just before `anchor`, the first line after the
    kernels): forged report lines (and at exit), a patched `classify`, the reference kernel `kernel`
    loaded by a name built at run time and from `source` on the grader's disk, a process that kills
    itself, Triton's launch path patched so that no kernel runs. The grader takes only the file's
    @triton.jit functions (autograder/probes/triton_kernels.py), so none of these runs: each is the
    zero kernel's `failed`. Inside the kernel: the expected value read out of the caller's frames
    (a kernel may not touch `__traceback__`: `failed`)."""
    indent = result_line[:len(result_line) - len(result_line.lstrip())]
    zeros = (result_line, f"{indent}{result} = {zero}\n")

    def at_import(code: str) -> tuple[str, str]:
        return anchor, f"\n\n{code}\n{anchor}"

    stolen = (f"_ref = {IMPORTER}('scaletrain.ops.back' + 'ends', fromlist=['x'])\n"
              f"{kernel} = _ref.load_kernel_module({{path}}, name='stolen').{kernel}").format
    frames = (f"{indent}try:\n{indent}    raise ZeroDivisionError\n{indent}except ZeroDivisionError as e:\n"
              f"{indent}    frame = e.__traceback__.tb_frame\n"
              f"{indent}found = None\n"
              f"{indent}while frame is not None and found is None:\n"
              f"{indent}    found = next((v for k, v in frame.f_locals.items() if k in ('expected', 'want')), None)\n"
              f"{indent}    frame = frame.f_back\n"
              f"{indent}{result} = {zero} if found is None else found\n")
    forger = "def _forge_now():\n" + report_forger(checks) + "    forge(); atexit.register(forge)\n\n\n_forge_now()"
    launch = (f"type({kernel}).__getitem__ = lambda self, grid: (lambda *args, **kwargs: None)\n"
              f"{IMPORTER}('triton').runtime.jit.JITFunction.__getitem__ = type({kernel}).__getitem__")
    return {
        "forges 'passed' lines in every report it can find (and at exit)": ((zeros, at_import(forger)), "failed"),
        "patches the grader's classify through sys.modules": (
            (zeros, at_import(f"{IMPORTER}('autograder.context', fromlist=['x']).classify = "
                              "lambda exc, submission: ('passed', '')")), "failed"),
        "reads the expected value out of the caller's frames": (((result_line, frames),), "failed"),
        "imports the reference kernels by a name built at run time": (
            (zeros, at_import(stolen(path=f"_ref.KERNELS_DIR / {file!r}"))), "failed"),
        "loads the reference kernels from the grader's disk": ((zeros, at_import(stolen(path=repr(source)))), "failed"),
        "kills its own process": ((zeros, at_import(f"{IMPORTER}('os')._exit(3)")), "failed"),
        "patches Triton's launch path at import": ((zeros, at_import(launch)), "failed"),
    }
