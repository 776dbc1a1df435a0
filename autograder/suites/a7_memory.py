"""Assignment a7: memory techniques (`assignments/a7_memory/`): the dynamic loss scale's update rule,
the checkpoint Function, and Rotor's dynamic program.

Every group is *trusted* (`Group.trusted`): this process never imports the submission. The probes
(`autograder.probes.a7_memory`) run the student's code in the sandboxed worker and send back raw
outputs; everything that decides a verdict is computed here:

- 7.1: the scale and clean-step counter after every step against `torch.amp.GradScaler("cpu")`
  run on the same hidden overflow pattern (an independent reference: torch's own kernel, float32
  rounding included); and a real fp16 run (`scaletrain.precision.MixedPrecision` driven by the
  student's scaler, initial scale 2^20, an inf planted at one step) against the same run with the
  reference scaler: the skipped steps, the scales and every parameter after every step. A scale
  that never backs off keeps overflowing and never trains.
- 7.2: output, parameter and input gradients, and the caller's next random numbers, bitwise against
  plain backpropagation of the same block under the same seed (hidden GPT blocks, MLPs, a function
  of two tensors and a float; with and without dropout); the technique, granted only beside those
  values (`Check.needs`): after the forward, no storage the block made is alive (weak references
  to the storages of every tensor an aten op made during the forward, taken by the probe's own
  dispatch mode: a saved-tensor hook nested inside the student's code hides nothing from them), and
  the block ran once without grad and once more, with grad, in the backward.
- 7.3: the plan for hidden chains and budgets, rebuilt here from nested tuples, validated and
  simulated with the reference `scaletrain.checkpointing.schedule`: its peak must fit the budget
  and its time equal the reference planner's optimum (which the repository's tests check against a
  brute force over every plan); an impossible budget must raise ValueError.

torch.utils.checkpoint and torch.amp are forbidden in the student's files (statically; the former
is also trapped at run time by the probe).
"""

from __future__ import annotations

import random
import textwrap

from autograder import checks
from autograder.attacks import IMPORTER, report_forger
from autograder.manifest import REPO, Check, Group, Manifest, Planted, Task
from autograder.suites import paired

LS, CF, RP = "loss_scaler.py", "checkpoint_function.py", "rotor_planner.py"
SRC = {LS: "lib/scaletrain/precision/scaler.py", CF: "lib/scaletrain/checkpointing/function.py",
       RP: "lib/scaletrain/checkpointing/planner.py"}
PROBE = "autograder.probes.a7_memory:"
NO_TRICKS = ("importlib", "__import__", "exec", "eval", "builtins", "inspect", "sys")

C_SCALE = "scale trajectory equals torch.amp.GradScaler's on hidden overflow patterns"
C_ODD = "float32 rounding of odd factors and growth past float32's range, as GradScaler"
C_SKIP = "fp16 training skips exactly the overflowed steps and backs off until it fits"
C_CK_PLAIN = "checkpoint: gradients equal plain backpropagation (several inputs, a float argument)"
C_CK_RNG = "checkpoint with dropout: gradients equal plain backpropagation (RNG state restored)"
C_CK_MEM = "checkpoint keeps only its inputs after the forward and recomputes once in backward"
C_DP_FIT = "planner: every plan is complete and within its budget (hidden chains, roomy and tight budgets)"
C_DP_OPT = "planner: the plan is as fast as the optimum within the budget (hidden chains)"
C_DP_NONE = "planner: a budget below the lowest possible peak raises ValueError"

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


MANIFEST = Manifest(
    assignment="a7", folder="a7_memory", title="Memory techniques: loss scaling, checkpointing, Rotor's planner",
    files={LS: SRC[LS], CF: SRC[CF], RP: SRC[RP]},
    tasks=(
        Task("7.1", "Dynamic loss scaling: the update rule", file=LS, functions=("update",)),
        Task("7.2", "The checkpoint Function: forward, recomputing backward, RNG restored", file=CF,
             functions=("forward", "backward")),
        Task("7.3", "Checkpoints under a memory budget (a design decision)", file=RP, functions=("plan_rotor",)),
    ),
    forbidden={LS: ("torch.amp", "torch.cuda.amp", "scaletrain.precision.scaler", *NO_TRICKS),
               CF: ("torch.utils.checkpoint", "torch.distributed.algorithms._checkpoint",
                    "scaletrain.checkpointing.function", "scaletrain.memory_measure.CheckpointedBlock", *NO_TRICKS),
               RP: ("scaletrain.checkpointing.planner", "scaletrain.checkpointing.plan_rotor", *NO_TRICKS)},
    groups=(
        Group("scaler", "autograder.suites.a7_memory:group_scaler", timeout_s=90, trusted=True, checks=(
            Check("7.1", C_SCALE, 4), Check("7.1", C_ODD, 2), Check("7.1", C_SKIP, 3),
        )),
        Group("checkpoint", "autograder.suites.a7_memory:group_checkpoint", timeout_s=90, trusted=True, checks=(
            Check("7.2", C_CK_PLAIN, 3), Check("7.2", C_CK_RNG, 4),
            Check("7.2", C_CK_MEM, 3, needs=(C_CK_PLAIN, C_CK_RNG)),
        )),
        Group("planner", "autograder.suites.a7_memory:group_planner", timeout_s=120, trusted=True, checks=(
            Check("7.3", C_DP_FIT, 4), Check("7.3", C_DP_OPT, 5), Check("7.3", C_DP_NONE, 3),
        )),
    ),
    planted=(
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
                groups=("scaler",), timeout_s=25, expect={C_SCALE: "timeout", C_ODD: "timeout", C_SKIP: "timeout"}),
        *_attacks(),
        Planted("recomputes without restoring the RNG state (dropout masks differ)", CF,
                ("            if ctx.preserve_rng_state:\n                torch.set_rng_state(ctx.cpu_rng)\n",
                 "            if False:\n                torch.set_rng_state(ctx.cpu_rng)\n"),
                groups=("checkpoint",), expect={C_CK_RNG: "failed", C_CK_PLAIN: "passed", C_CK_MEM: "failed"}),
        Planted("keeps the tape: runs the function with grad and never recomputes", CF,
                ("    if not torch.is_grad_enabled():\n        return fn(*args)\n",
                 "    if True:  # right gradients, none of the memory saved\n        return fn(*args)\n"),
                groups=("checkpoint",), expect={C_CK_MEM: "failed", C_CK_PLAIN: "passed", C_CK_RNG: "passed"}),
        Planted("keeps the whole tape under a nested saved_tensors_hooks; the counted calls are staged", CF,
                ((_CLASS, _HIDE_TAPE + _CLASS), (_FORWARD, _FORWARD_KEEPS), (_RECOMPUTE, _RECOMPUTE_STAGED)),
                groups=("checkpoint",), expect={C_CK_MEM: "failed", C_CK_PLAIN: "passed", C_CK_RNG: "passed"}),
        Planted("imports torch.utils.checkpoint", CF,
                ("import torch\n", "import torch\nfrom torch.utils.checkpoint import checkpoint as _torch_checkpoint\n"),
                expect={C_CK_PLAIN: "flagged", C_CK_RNG: "flagged", C_CK_MEM: "flagged", C_SCALE: "passed",
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
    ),
)

TRIALS = 8
# the public tests' cases (assignments/a7_memory/tests/): each runs here too (issue 27)
PUBLIC_SCALER = (dict(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3),
                 [bool(b) for b in (0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0)])
PUBLIC_BLOCK = ({"kind": "block", "config": dict(n_embd=12, n_head=3, dropout=0.3)}, [(2, 7, 12)])
PUBLIC_CHAIN = dict(input_bytes=(3, 5, 5, 5, 2), tape_bytes=(8, 20, 20, 20, 9),
                    saves_input=(True, True, True, True, False), forward_s=(1, 3, 3, 3, 1), backward_s=(2, 6, 6, 6, 1))


# ---------------------------------------------------------------- task 7.1

def _grad_scaler_trajectory(settings: dict, overflows: list[bool]) -> list[tuple[float, int]]:
    """torch.amp.GradScaler("cpu")'s scale and clean-step counter after each step of the pattern."""
    import torch

    scaler = torch.amp.GradScaler("cpu", **settings)
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=0.1)
    out = []
    for bad in overflows:
        scaler.scale(torch.ones(()))                        # GradScaler allocates its scale lazily here
        p.grad = torch.tensor([1.0, float("inf") if bad else 2.0, 3.0])
        scaler.step(opt)
        scaler.update()
        out.append((scaler.get_scale(), int(scaler.state_dict()["_growth_tracker"])))
    return out


def _compare_trajectory(got, want, settings: dict, overflows: list[bool]) -> None:
    for step, (g, w) in enumerate(paired(got, want, f"DynamicLossScaler({settings}): (scale, tracker) per step")):
        if tuple(g) != tuple(w):
            pattern = "".join("x" if b else "." for b in overflows[:step + 1])
            raise AssertionError(f"DynamicLossScaler({settings}), overflows {pattern} (x = inf/NaN): after step "
                                 f"{step} (scale, growth_tracker) = {tuple(g)}, GradScaler has {tuple(w)}")


def _scaler_trials(salt: int, odd: bool):
    if not odd:
        yield PUBLIC_SCALER
    for seed in checks.trial_seeds(TRIALS, salt=salt):
        rng = random.Random(seed)
        if odd:
            settings = dict(init_scale=rng.choice([1000.0, 3.0e38, 12345.678, 1e-3]),
                            growth_factor=rng.choice([1.5, 3.0, 1.1, 7.0]), backoff_factor=rng.choice([0.3, 0.7, 0.9]),
                            growth_interval=rng.randint(1, 3))
        else:
            settings = dict(init_scale=2.0 ** rng.randint(0, 24), growth_factor=2.0,
                            backoff_factor=rng.choice([0.5, 0.25]), growth_interval=rng.randint(1, 6))
        overflows = [rng.random() < rng.choice([0.1, 0.3, 0.5]) for _ in range(rng.randint(25, 60))]
        yield settings, overflows


FP16_CONFIG = dict(vocab_size=31, block_size=8, n_layer=1, n_head=2, n_embd=8)
FP16_SETTINGS = dict(init_scale=2.0**20, growth_interval=3)


def _reference_fp16(steps: int, poison: list[int], seed: int) -> dict:
    import torch

    from scaletrain.models import GPT, GPTConfig
    from scaletrain.precision.master import MixedPrecision, train_with_overflows

    torch.set_num_threads(1)   # the probe too: the same summation order, bitwise the same parameters
    cfg = GPTConfig(**FP16_CONFIG)
    mp = MixedPrecision(GPT(cfg, seed=seed), torch.optim.SGD, dtype=torch.float16, lr=0.05, scaler=FP16_SETTINGS)
    return train_with_overflows(mp, cfg, steps=steps, poison=poison, seed=seed)


def _start_worker(ctx) -> None:
    """Start the worker before this side runs torch's optimizers: importing torch._dynamo sets
    TORCHINDUCTOR_CACHE_DIR to this group's folder, which a later worker would inherit and could not
    write (its `import torch._dynamo`, by any optimizer, then fails)."""
    ctx.untrusted().start()


def group_scaler(ctx):
    _start_worker(ctx)
    def trajectory(settings, overflows):
        return ctx.untrusted().call(PROBE + "scale_trajectory", "loss_scaler", settings, overflows)

    with ctx.check(C_SCALE):
        for settings, overflows in _scaler_trials(salt=1, odd=False):
            want = _grad_scaler_trajectory(settings, overflows)
            _compare_trajectory(trajectory(settings, overflows), want, settings, overflows)
    with ctx.check(C_ODD):
        for settings, overflows in _scaler_trials(salt=2, odd=True):
            want = _grad_scaler_trajectory(settings, overflows)
            _compare_trajectory(trajectory(settings, overflows), want, settings, overflows)
    with ctx.check(C_SKIP):
        import torch

        seed, steps = checks.trial_seeds(1, salt=3)[0] % 1000, 10
        poison = [7]
        want = _reference_fp16(steps, poison, seed)
        got = ctx.untrusted().call(PROBE + "train_fp16", "loss_scaler", FP16_CONFIG, FP16_SETTINGS, steps, poison, seed)
        assert want["skipped"][:1] == [0] and poison[0] in want["skipped"], f"suite bug: {want['skipped']}"
        assert got["skipped"] == want["skipped"], (
            f"fp16 training from scale 2^20 with an inf planted at step {poison[0]}: skipped steps {got['skipped']}, "
            f"expected {want['skipped']} (each overflow skips its step and backs the scale off)")
        assert got["scales"] == want["scales"], f"scales after each step {got['scales']}, expected {want['scales']}"
        for step, (g, w) in enumerate(paired(got["params"], want["params"], "fp16 training: parameters per step")):
            for i, (a, b) in enumerate(paired(g, w, f"fp16 training: parameters after step {step}")):
                if not (isinstance(a, torch.Tensor) and torch.equal(a, b)):
                    raise AssertionError(f"fp16 training: parameter {i} after step {step} differs from the run with "
                                         "the reference scaler (an overflowed step applied, or a step wrongly skipped)")


# ---------------------------------------------------------------- task 7.2

def _block_specs(rng: random.Random, dropout: bool) -> list[tuple[dict, list[tuple[int, ...]]]]:
    """(spec, input shapes): a GPT block with odd sizes, an MLP, a function of two tensors and a float."""
    p = (lambda lo, hi: rng.uniform(lo, hi)) if dropout else (lambda lo, hi: 0.0)
    heads = rng.choice([1, 3])
    width = heads * rng.choice([4, 5, 6])
    b, s = rng.randint(1, 3), rng.randint(3, 11)
    return [({"kind": "block", "config": dict(n_embd=width, n_head=heads, block_size=16, dropout=p(0.2, 0.5))},
             [(b, s, width)]),
            ({"kind": "mlp", "sizes": [rng.randint(3, 9), rng.randint(10, 20), rng.randint(2, 7)], "dropout": p(0.2, 0.5)},
             [(rng.randint(2, 9), 0)]),
            ({"kind": "two_inputs", "width": rng.randint(3, 8), "dropout": p(0.3, 0.6)}, [(rng.randint(2, 6), 0)] * 2)]


def _inputs(spec: dict, shapes, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    first = {"mlp": lambda: spec["sizes"][0], "two_inputs": lambda: spec["width"]}.get(spec["kind"])
    return [torch.randn(*(shape[:-1] + (first(),) if first else shape), generator=gen) for shape in shapes]


def _reference_checkpoint(spec: dict, inputs, seed: int) -> dict:
    """Plain backpropagation of the same block under the same seeds (no checkpointing)."""
    import torch

    from autograder.probes.a7_memory import build_block

    torch.set_num_threads(1)
    module, fn, _ = build_block(spec, seed)
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    args = (leaves[0], 3.0, leaves[1]) if spec["kind"] == "two_inputs" else tuple(leaves)
    torch.manual_seed(seed + 1)
    out = fn(*args)
    out.pow(2).sum().backward()
    return {"out": out.detach(), "grads": [p.grad for p in module.parameters()], "input_grads": [x.grad for x in leaves],
            "rng_after": torch.rand(4)}


def _equal(got, want, what: str) -> None:
    import torch

    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: got {type(got).__name__}, expected a tensor of shape {tuple(want.shape)}")
    if got.shape != want.shape or not torch.equal(got, want):
        err = "shape " + str(tuple(got.shape)) if got.shape != want.shape else \
            f"max difference {(got - want).abs().max().item():.3g}"
        raise AssertionError(f"{what} differs from plain backpropagation ({err}); it must be bitwise equal")


def _checkpoint_cases(ctx, salt: int, dropout: bool):
    for k, seed in enumerate(checks.trial_seeds(2, salt=salt)):
        rng = random.Random(seed)
        public = [PUBLIC_BLOCK] if dropout and k == 0 else []
        for spec, shapes in _block_specs(rng, dropout) + public:
            inputs = _inputs(spec, shapes, seed)
            want = _reference_checkpoint(spec, inputs, seed % 10_000)
            got = ctx.untrusted().call(PROBE + "checkpoint_run", "checkpoint_function", spec, inputs, seed % 10_000)
            yield f"checkpoint on {spec}", got, want


def _verify_values(label: str, got: dict, want: dict) -> None:
    _equal(got["out"], want["out"], f"{label}: the output")
    for i, (g, w) in enumerate(paired(got["grads"], want["grads"], f"{label}: parameter gradients")):
        _equal(g, w, f"{label}: parameter gradient {i}")
    for i, (g, w) in enumerate(paired(got["input_grads"], want["input_grads"], f"{label}: input gradients")):
        _equal(g, w, f"{label}: the gradient of input {i}")
    _equal(got["rng_after"], want["rng_after"],
           f"{label}: the random numbers drawn after backward (recompute inside torch.random.fork_rng)")


def group_checkpoint(ctx):
    _start_worker(ctx)
    with ctx.check(C_CK_PLAIN):
        for label, got, want in _checkpoint_cases(ctx, salt=4, dropout=False):
            _verify_values(label, got, want)
    runs = []
    with ctx.check(C_CK_RNG):
        for label, got, want in _checkpoint_cases(ctx, salt=5, dropout=True):
            runs.append((label, got, want))
            _verify_values(label, got, want)
    with ctx.check(C_CK_MEM):
        if not runs:   # the dropout check stopped early: the memory check gets its own runs
            runs = list(_checkpoint_cases(ctx, salt=5, dropout=True))
        for label, got, want in runs:
            held = got["held_after_forward"]
            assert held["count"] == 0, (
                f"{label}: after the forward, {held['count']} storage(s) the block made are still alive (op, bytes: "
                f"{[tuple(h) for h in held['first']]}...): the block's own activations must not be kept, "
                "only its inputs")
            assert got["calls"] == [1, 1] and got["grad_enabled"] == [False, True], (
                f"{label}: the block ran {got['calls'][0]} time(s) in forward and {got['calls'][1]} in backward, with "
                f"grad enabled {got['grad_enabled']}; expected once without grad, then once with grad in backward")


# ---------------------------------------------------------------- task 7.3

def _hidden_chain(rng: random.Random, n: int, *, floats: bool):
    from scaletrain.checkpointing.chain import Chain

    big = rng.choice([10, 1000, 10**6])
    return Chain(input_bytes=tuple(rng.randint(1, big) for _ in range(n)),
                 tape_bytes=tuple(rng.randint(0, 3 * big) for _ in range(n)),
                 saves_input=tuple(rng.random() < 0.75 for _ in range(n)),
                 forward_s=tuple(rng.uniform(0.1, 3.0) if floats else rng.randint(1, 9) for _ in range(n)),
                 backward_s=tuple(rng.uniform(0.2, 6.0) if floats else rng.randint(1, 18) for _ in range(n)))


def _fields(chain) -> dict:
    return {"input_bytes": chain.input_bytes, "tape_bytes": chain.tape_bytes, "saves_input": chain.saves_input,
            "forward_s": chain.forward_s, "backward_s": chain.backward_s}


def _planner_cases(salt: int, tight: bool):
    """(chain, budget) pairs: budgets between the lowest peak and plain backpropagation's (tight:
    the lowest peak itself and just above it), so the search itself is exercised."""
    from scaletrain.checkpointing.chain import Chain
    from scaletrain.checkpointing.planner import min_peak, store_all_peak

    cases = []
    for seed in checks.trial_seeds(TRIALS, salt=salt):
        rng = random.Random(seed)
        chain = _hidden_chain(rng, rng.randint(2, 11), floats=rng.random() < 0.4)
        lo, hi = min_peak(chain), store_all_peak(chain)
        picks = [lo, lo + (hi - lo) // 50] if tight else [rng.randint(lo, max(lo, hi - 1)) for _ in range(3)]
        cases += [(chain, budget) for budget in picks]
    chain = Chain(**PUBLIC_CHAIN)  # the public test's: every third budget from the lowest peak up
    lo, hi = min_peak(chain), store_all_peak(chain)
    return cases + [(chain, b) for b in ([lo] if tight else range(lo, hi + 1, 3))]


def _simulated(got):
    """The simulated plan, or the reason there is none, raised in the check that reads it."""
    if isinstance(got, Exception):
        raise got
    return got


def _answer(answer, chain, budget: int, label: str):
    from scaletrain.checkpointing.schedule import from_data, simulate

    if "value_error" in answer:
        raise AssertionError(f"{label}: raised ValueError ({answer['value_error']}) though a plan fits")
    if "malformed" in answer:
        raise AssertionError(f"{label}: returned something that is not a Store/Split plan: {answer['malformed']}")
    try:
        return simulate(from_data(answer["plan"]), chain)
    except (ValueError, TypeError, IndexError) as exc:
        raise AssertionError(f"{label}: the plan is not a valid plan of the chain's stages: {exc}") from None


def group_planner(ctx):
    from scaletrain.checkpointing.planner import min_peak, plan_rotor
    from scaletrain.checkpointing.schedule import simulate

    _start_worker(ctx)

    def ask(cases):
        """[(answer, (chain, budget))]: one answer per case, or the check fails (issue 28)."""
        answers = ctx.untrusted().call(PROBE + "plans", "rotor_planner", [(_fields(c), b) for c, b in cases])
        return paired(answers, cases, "plan_rotor: the plans, one per (chain, budget)")

    roomy, tight = _planner_cases(salt=6, tight=False), _planner_cases(salt=7, tight=True)
    got = {}  # (chain, budget) -> the simulated plan, or the exception that says why there is none
    try:
        answers = ask(roomy + tight)
    except Exception as exc:  # noqa: BLE001 - not implemented, a crash, a timeout: every check's outcome
        answers = [(exc, case) for case in roomy + tight]
    for answer, (chain, budget) in answers:
        try:
            if isinstance(answer, Exception):
                raise answer
            got[chain, budget] = _answer(answer, chain, budget, f"plan_rotor({chain}, budget={budget})")
        except Exception as exc:  # noqa: BLE001 - raised in the checks that read this case
            got[chain, budget] = exc
    with ctx.check(C_DP_FIT):  # every plan, roomy and tight budgets: the property every design keeps
        for chain, budget in roomy + tight:
            sim = _simulated(got[chain, budget])
            assert sim.peak_bytes <= budget, (f"plan_rotor({chain}, budget={budget}): the plan's peak is "
                                              f"{sim.peak_bytes} B, over the budget")
    with ctx.check(C_DP_OPT):
        for chain, budget in roomy:
            label = f"plan_rotor({chain}, budget={budget})"
            sim, best = _simulated(got[chain, budget]), simulate(plan_rotor(chain, budget), chain)
            assert sim.peak_bytes <= budget, f"{label}: the plan's peak is {sim.peak_bytes} B, over the budget"
            assert abs(sim.time_s - best.time_s) <= 1e-9 * best.time_s, (
                f"{label}: the plan takes {sim.time_s:.6g} s, the fastest plan within the budget {best.time_s:.6g} s")
    with ctx.check(C_DP_NONE):
        chains = list(dict.fromkeys(chain for chain, _ in tight))  # each once, the public test's included
        impossible = [(chain, min_peak(chain) - 1) for chain in chains if min_peak(chain) > 0]
        for answer, (chain, budget) in ask(impossible):
            assert "value_error" in answer, (f"plan_rotor({chain}, budget={budget}): no plan fits (the lowest peak is "
                                             f"{budget + 1} B), expected a ValueError, got {answer}")
