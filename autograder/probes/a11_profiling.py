"""a11's probe: the student's categoriser, op costs, step tables and PLD run on the inputs the trusted
side sends; raw outputs come back.

Each function takes a list of jobs and returns one answer per job.  Profiles arrive as plain data
and are handed to the student's functions as objects with the attributes of trace.py's StepProfile
and OpRecord (a kernel's `cost` with `flops` and `bytes`); the GPTs of PLD are the course's
`scaletrain.models.GPT`, built here from the seed the trusted side sent.  Nothing here knows an
expected value: labels, references and verdicts are in autograder/suites/a11_profiling/.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from autograder.checks import forbid_aten, student_module
from autograder.wire import short

STEMS = ("profile_categories", "profile_cost", "profile_tables", "profile_pld")
PRODUCTS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "_scaled_mm")  # aten ops op_cost must not run


def _shown(value):
    """A str, number, bool or None as it is; anything else as its type and repr (the wire carries data only)."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else \
        short(f"{type(value).__name__}: {value!r}", 200)


def load(_jobs: list) -> bool:
    """Import the student's files (an import error becomes every check's outcome)."""
    for stem in STEMS:
        student_module(stem)
    return True


def categorise(names: list) -> list:
    fn = student_module("profile_categories").categorise
    return [_shown(fn(name)) for name in names]


def costs(jobs: list) -> list:
    """[flops, bytes] of each op_cost, None where it returned None, a text where it returned neither.
    A product run inside op_cost is `Flagged`: the price comes from the shapes, not from torch's
    FlopCounterMode counting a matmul run on meta tensors, however that mode was reached."""
    fn = student_module("profile_cost").op_cost
    out = []
    for job in jobs:
        with forbid_aten(*PRODUCTS):
            cost = fn(job["name"], [list(s) for s in job["shapes"]], list(job["dtypes"]), ())
        if cost is None or not (hasattr(cost, "flops") and hasattr(cost, "bytes")):
            out.append(_shown(cost))
        else:
            out.append([_shown(cost.flops), _shown(cost.bytes)])
    return out


def _profile(data: dict) -> SimpleNamespace:
    ops = [SimpleNamespace(**op, cost=None, shapes=()) for op in data["ops"]]
    kernels = [SimpleNamespace(**{k: v for k, v in op.items() if k not in ("flops", "bytes")}, shapes=(),
                               cost=SimpleNamespace(flops=op["flops"], bytes=op["bytes"])) for op in data["kernels"]]
    return SimpleNamespace(ops=ops, kernels=kernels, phase_seconds=dict(data["phase_seconds"]), steps=data["steps"],
                           device="cpu", trace_path=None, peak_memory=None, by_step=[dict(d) for d in data["by_step"]])


def breakdown(profiles: list) -> list:
    """category_seconds of each profile as [phase, category, seconds] rows."""
    fn = student_module("profile_tables").category_seconds
    out = []
    for data in profiles:
        got = fn(_profile(data))
        out.append([[*map(_shown, key), _shown(v)] if isinstance(key, tuple) else [_shown(key), _shown(v)]
                    for key, v in got.items()] if isinstance(got, dict) else _shown(got))
    return out


def mfu(profiles: list) -> list:
    fn = student_module("profile_tables").step_mfu
    out = []
    for data in profiles:
        machine = SimpleNamespace(**data["machine"], device="cpu")
        machine.ridge = machine.peak_flops / machine.bandwidth
        got = fn(_profile(data), machine, num_params=data["num_params"], tokens=data["tokens"])
        out.append({str(k): _shown(v) for k, v in got.items()} if isinstance(got, dict) else _shown(got))
    return out


def schedule(jobs: list) -> list:
    """θ(t) at each t of the job, and p(t) for the job's number of layers."""
    m = student_module("profile_pld")
    out = []
    for job in jobs:
        kw = dict(theta_bar=job["theta_bar"], gamma=job["gamma"])
        out.append({"theta": [_shown(m.theta(t, **kw)) for t in job["ts"]],
                    "keep": [[_shown(p) for p in m.keep_probabilities(t, job["num_layers"], **kw)]
                             for t in job["ts"]]})
    return out


def _draw(fn, probs: list, seed: int, draws: int):
    """`draws` calls of sample_gates on a generator seeded `seed`: a (draws, L) uint8 tensor of the
    gates, or the first answer that is not a list of L bools."""
    import torch
    gen, rows = torch.Generator().manual_seed(seed), []
    for _ in range(draws):
        got = fn(list(probs), gen)
        if not isinstance(got, list) or len(got) != len(probs) or not all(isinstance(g, bool) for g in got):
            return short(f"{type(got).__name__}: {got!r}", 200)
        rows.append(got)
    return torch.tensor(rows, dtype=torch.uint8)


def gates(jobs: list) -> list:
    """Per job, {"gates": `draws` draws on a generator seeded with the job's seed, "again": the first
    `again` of them redrawn on a new generator with the same seed}: gates drawn from the generator
    given repeat, gates drawn from torch's global generator or Python's `random` do not."""
    import torch
    torch.set_num_threads(1)  # tiny tensors: two threads on a busy machine wait on each other
    fn = student_module("profile_pld").sample_gates
    return [{"gates": _draw(fn, job["probs"], job["seed"], job["draws"]),
             "again": _draw(fn, job["probs"], job["seed"], job["again"])} for job in jobs]


@contextlib.contextmanager
def _reads(blocks):
    """Yields a list that counts, per block, the aten ops that read one of its parameters (or a view
    of one): the probe's own dispatch mode, below any the student pushes, so a block run under
    no_grad, on detached inputs, or computed and then not used is counted all the same."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    owner = {p.untyped_storage().data_ptr(): i for i, block in enumerate(blocks) for p in block.parameters()}
    counts = [0] * len(blocks)

    class Reads(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):  # else the first dispatch imports torch._dynamo (~2.5 s)
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            read = {owner.get(t.untyped_storage().data_ptr()) for t in tree_leaves((args, kwargs or {}))
                    if isinstance(t, torch.Tensor)}
            for i in read - {None}:
                counts[i] += 1
            return func(*args, **(kwargs or {}))

    with Reads():
        yield counts


def forward(jobs: list) -> list:
    """pld_forward of each job's GPT on its batch: the logits, then after a backward of their sum of
    squares, which blocks' parameters got a gradient, per block how many ops of the forward and
    backward read its parameters, and whether the model still holds its blocks and their values."""
    import torch
    torch.set_num_threads(1)  # tiny GPTs: two threads on a busy machine wait on each other
    fn = student_module("profile_pld").pld_forward
    return [_pld_run(fn, job) for job in jobs]


def _pld_run(fn, job: dict) -> dict:
    import torch
    from scaletrain.models import GPT, GPTConfig, make_batch
    cfg = GPTConfig(**job["cfg"])
    model = GPT(cfg, seed=job["seed"])
    idx, targets = make_batch(cfg, job["batch"], seed=job["batch_seed"])
    blocks, params = list(model.blocks), list(model.parameters())
    values = [p.detach().clone() for p in params]
    with _reads(blocks) as reads:
        logits = fn(model, idx, targets, list(job["gates"]), list(job["probs"]))[0]
        if isinstance(logits, torch.Tensor):
            logits.float().pow(2).mean().backward()
    unchanged = list(model.blocks) == blocks and all(torch.equal(p, v) for p, v in zip(params, values))
    if not isinstance(logits, torch.Tensor):
        return {"logits": _shown(logits), "grads": [], "reads": reads, "unchanged": unchanged}
    return {"logits": logits.detach().clone(), "grads": [_gradient(block) for block in blocks], "reads": reads,
            "unchanged": unchanged}


def _gradient(block) -> bool | None:
    """None: no parameter of the block got a gradient; True: some got a nonzero one; False: only zeros."""
    grads = [p.grad for p in block.parameters() if p.grad is not None]
    return None if not grads else any(bool(g.abs().sum() > 0) for g in grads)
