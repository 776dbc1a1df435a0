"""a7's planted submissions: wrong answers, cheats of each technique and attacks on the grader,
each with the outcomes the selftest expects."""

import textwrap

from autograder.attacks import IMPORTER, report_forger
from autograder.manifest import REPO, Planted

from .names import (CF, C_CK_HELD, C_CK_ONCE, C_CK_PLAIN, C_CK_RNG, C_DP_FIT, C_DP_NONE, C_DP_OPT, C_ODD, C_SCALE, C_SKIP,
                    LS, RP, SRC)


_UPDATE = ("        if found_inf:\n"
           "            self.scale = to_float32(self.scale * self.backoff_factor)\n")


# issue 28: the tape kept, hidden from the grader's saved-tensor hook by one nested inside the
# forward, the block reached past whatever counts its calls (module pre-hooks cleared meanwhile), and
# the calls the check counts staged: one without grad in forward, one with grad in backward
_CLASS = "class CheckpointFunction(torch.autograd.Function):\n"
_HIDE_TAPE = """import contextlib
import types


def _reach(fn):
    found, todo = [], [fn]
    while todo:
        f = todo.pop()
        found.append(f)
        todo += [c.cell_contents for c in getattr(f, '__closure__', None) or ()
                 if callable(c.cell_contents) and not any(c.cell_contents is x for x in found)]
    return found


def _bare(fn):
    return [f for f in _reach(fn) if isinstance(f, types.FunctionType)][-1]


@contextlib.contextmanager
def _unhooked(fn):
    modules = [m for m in _reach(fn) if isinstance(m, torch.nn.Module)]
    saved = [dict(m._forward_pre_hooks) for m in modules]
    for m in modules:
        m._forward_pre_hooks.clear()
    try:
        yield
    finally:
        for m, hooks in zip(modules, saved):
            m._forward_pre_hooks.update(hooks)


"""
_FORWARD = "        with torch.no_grad():\n            return fn(*args)\n"
_FORWARD_KEEPS = (
    "        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t), \\\n"
    "                _unhooked(fn):\n"
    "            leaves = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a\n"
    "                      for a in args]\n"
    "            ctx.kept = (leaves, _bare(fn)(*leaves))\n"
    "        with torch.no_grad(), torch.random.fork_rng():\n"
    "            torch.set_rng_state(ctx.cpu_rng)\n"
    "            fn(*args)\n"
    "        return ctx.kept[1].detach()\n")
_RECOMPUTE = "            with torch.enable_grad():\n                outputs = ctx.fn(*inputs)\n"
_RECOMPUTE_STAGED = ("            with torch.enable_grad():\n                ctx.fn(*inputs)\n"
                     "        inputs, outputs = ctx.kept\n")


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (issue 13's catalogue) in place of task 7.1's rule, which they
    leave undone (the scale never moves): under the trusted split they earn nothing."""
    body = {
        "forges 'passed' lines in every report it can find (and at exit)": (
            textwrap.indent(report_forger([C_SCALE, C_ODD, C_SKIP]), "    ") +
            "        if not getattr(DynamicLossScaler, 'forged', False):   # once: walking /tmp is slow\n"
            "            DynamicLossScaler.forged = True\n"
            "            forge(); atexit.register(forge)\n        return\n", "failed"),
        "patches the grader's classify through sys.modules": (
            f"        ctx = {IMPORTER}('autograder.context', fromlist=['x'])\n"
            "        ctx.classify = lambda exc, submission: ('passed', '')\n        return\n", "failed"),
        "reads the expected trajectory out of the caller's frames": (
            "        try:\n            raise ZeroDivisionError\n        except ZeroDivisionError as e:\n"
            "            frame = e.__traceback__.tb_frame\n"
            "        while frame is not None:\n"
            "            for key in ('want', 'expected', 'ref'):\n"
            "                if isinstance(frame.f_locals.get(key), list):\n"
            "                    self.scale = frame.f_locals[key][0][0]\n"
            "            frame = frame.f_back\n"
            "        return\n", "failed"),
        "imports the reference scaler by a name built at run time": (
            f"        ref = {IMPORTER}('scaletrain.precision.sca' + 'ler', fromlist=['x'])\n"
            "        return ref.DynamicLossScaler.update(self, found_inf)\n", "error"),
        "reads the reference from the grader's disk": (
            f"        code = open({str(REPO / SRC[LS])!r}).read()\n"
            "        scope = {'__name__': 'stolen'}\n"
            f"        {IMPORTER}('builtins').exec(code, scope)\n"
            "        return scope['DynamicLossScaler'].update(self, found_inf)\n", "error"),
    }
    return tuple(Planted(name, LS, (_UPDATE, text + "        if found_inf:\n"
                                    "            self.scale = to_float32(self.scale * self.backoff_factor)\n"),
                         groups=("scaler",), expect={C_SCALE: outcome})
                 for name, (text, outcome) in body.items())


PLANTED = (
    Planted("the scale never backs off (overflowed steps keep overflowing)", LS,
            ("            self.scale = to_float32(self.scale * self.backoff_factor)\n", "            pass\n"),
            groups=("scaler",), expect={C_SCALE: "failed", C_SKIP: "failed"}),
    Planted("the clean-step counter is not reset after a growth", LS,
            ("                self.scale = grown\n            self.growth_tracker = 0\n",
             "                self.scale = grown\n"),
            groups=("scaler",), expect={C_SCALE: "failed", C_ODD: "failed"}),
    # issue 27: the counter's boundary, which the public test exercises (growth_interval = 3)
    Planted("the scale grows one clean step late (> growth_interval for ==)", LS,
            ("        if self.growth_tracker == self.growth_interval:\n",
             "        if self.growth_tracker > self.growth_interval:\n"),
            groups=("scaler",), expect={C_SCALE: "failed", C_ODD: "failed", C_SKIP: "passed"}),
    Planted("growth not rounded to float32 (python float products)", LS,
            ("            grown = to_float32(self.scale * self.growth_factor)\n",
             "            grown = self.scale * self.growth_factor\n"),
            groups=("scaler",), expect={C_SCALE: "passed", C_ODD: "failed", C_SKIP: "passed"}),
    Planted("infinite loop in update", LS, (_UPDATE, "        while True:\n            pass\n" + _UPDATE),
            groups=("scaler",), timeout_s=10, expect={C_SCALE: "timeout", C_ODD: "timeout", C_SKIP: "timeout"}),
    *_attacks(),
    Planted("recomputes without restoring the RNG state (dropout masks differ)", CF,
            ("            if ctx.preserve_rng_state:\n                torch.set_rng_state(ctx.cpu_rng)\n",
             "            if False:\n                torch.set_rng_state(ctx.cpu_rng)\n"),
            groups=("checkpoint",), expect={C_CK_RNG: "failed", C_CK_PLAIN: "passed", C_CK_HELD: "failed",
                                        C_CK_ONCE: "failed"}),
    Planted("keeps the tape: runs the function with grad and never recomputes", CF,
            ("    if not torch.is_grad_enabled():\n        return fn(*args)\n",
             "    if True:  # right gradients, none of the memory saved\n        return fn(*args)\n"),
            groups=("checkpoint",), expect={C_CK_HELD: "failed", C_CK_PLAIN: "passed", C_CK_RNG: "passed"}),
    Planted("keeps the whole tape under a nested saved_tensors_hooks; the counted calls are staged", CF,
            ((_CLASS, _HIDE_TAPE + _CLASS), (_FORWARD, _FORWARD_KEEPS), (_RECOMPUTE, _RECOMPUTE_STAGED)),
            groups=("checkpoint",), expect={C_CK_HELD: "failed", C_CK_ONCE: "passed", C_CK_PLAIN: "passed",
                                            C_CK_RNG: "passed"}),
    Planted("imports torch.utils.checkpoint", CF,
            ("import torch\n", "import torch\nfrom torch.utils.checkpoint import checkpoint as _torch_checkpoint\n"),
            expect={C_CK_PLAIN: "flagged", C_CK_RNG: "flagged", C_CK_HELD: "flagged", C_SCALE: "passed",
                    C_DP_OPT: "passed"}),
    Planted("the process exits in the forward", CF,
            ("        ctx.fn = fn\n", "        import os; os._exit(3)\n"),
            groups=("checkpoint",), expect={C_CK_PLAIN: "error"}),
    Planted("the planner forgets to charge a stored tape to the budget", RP,
            ("            rest = best(s + 1, t, False, m - tape) if s < t else (0.0, None)\n",
             "            rest = best(s + 1, t, False, m) if s < t else (0.0, None)\n"),
            groups=("planner",), expect={C_DP_FIT: "failed", C_DP_OPT: "failed"}),
    Planted("the planner returns √n segments whatever the budget", RP,
            ("    found = best(0, chain.n - 1, False, budget)\n",
             "    return plan_sqrt(chain.n)\n    found = best(0, chain.n - 1, False, budget)\n"),
            groups=("planner",), expect={C_DP_OPT: "failed"}),
    # issue 28: the suite's zip over the answers checked only what came back (here: the first case)
    Planted("the planner empties the probe's list of cases: only the first is answered", RP,
            ('    budget = _check_budget("plan_rotor", budget)\n',
             '    budget = _check_budget("plan_rotor", budget)\n'
             "    try:  # the caller's frame: its list of cases, emptied, ends its loop after this call\n"
             "        raise ZeroDivisionError\n"
             "    except ZeroDivisionError as exc:\n"
             "        caller = exc.__traceback__.tb_frame.f_back\n"
             "    if isinstance(caller.f_locals.get('cases'), list):\n"
             "        caller.f_locals['cases'].clear()\n"),
            groups=("planner",), expect={C_DP_OPT: "failed", C_DP_FIT: "failed"}),
    Planted("the planner keeps the first fitting plan, not the fastest", RP,
            ("        return min(options, key=lambda o: o[0]) if options else None\n",
             "        return options[-1] if options else None\n"),
            groups=("planner",), expect={C_DP_OPT: "failed", C_DP_FIT: "passed", C_DP_NONE: "passed"}),
    # a small slip costs a small share: 3 of 12
    Planted("the planner answers an impossible budget with √n segments instead of ValueError", RP,
            ("    if found is None:\n", "    if found is None:\n        return plan_sqrt(chain.n)\n"),
            groups=("planner",), expect={C_DP_NONE: "failed", C_DP_FIT: "passed", C_DP_OPT: "passed"}),
)
