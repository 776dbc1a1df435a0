"""Assignment a0: memory and FLOPs estimation (`assignments/a0_memory/memory.py`).

Every estimator is compared with the reference `scaletrain.memory` on hidden random
configurations (seeded trials, relative error ≤ 1e-9: the answers are exact integers), with the
seed's and the ZeRO paper's worked numbers, and with bytes measured in a real CPU step
(`scaletrain.memory_measure`). A worked number or a measurement at a fixed configuration can be
answered from a table: each of those checks is granted only when the function's checks on hidden
configurations passed in the same run (`Check.needs`, `grade.with_values`).

Every group is *trusted* (`Group.trusted`): the suite runs in a process that never imports the
submission; `ctx.remote("memory")` calls the student's functions in the sandboxed worker and
gets numbers back, and the reference, the expected values and the verdicts stay here. Each task
is graded on its own: the expected per-rank ZeRO bytes are computed by the reference with the
*student's* bytes_per_param answers (a wrong task 0.2 costs task 0.2 only), and the ZeRO paper's
table is checked with the paper's own 16 B/param handed to the student's function.
"""

from __future__ import annotations

import contextlib
import random

from autograder import checks
from autograder.attacks import function_attacks
from autograder.manifest import REPO, Check, Group, Manifest, Planted, Task
from autograder.suites import sized
from scaletrain.testing import assert_close

F = "memory.py"
SRC = "lib/scaletrain/memory.py"
C_PARAMS = "parameter count equals the reference on hidden configurations"
C_BPP = "bytes per parameter for every precision and optimizer"
C_ACT = "activation bytes on hidden configurations (tensor parallel, fp32)"
C_ACT_CKPT = "activation bytes with full checkpointing"
C_GPT1 = "the seed's GPT-1 activations: 349,175,808 B per sequence"
C_ZERO = "ZeRO per-rank bytes on hidden configurations (uneven shards)"
C_TINY = "tiny-GPT activations equal the reference on hidden configurations"
_RETURN = "    return embeddings + n_layer * per_layer + 2 * h + head"


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself, each in place of task 0.1's answer (issue 13's catalogue).
    The static check forbids importlib, sys, inspect, builtins..., so each reaches for what it
    wants the way the static check cannot see; the trusted split must leave it nothing to earn."""
    attacks = function_attacks(
        checks=[C_PARAMS], module="scaletrain.memory", source=str(REPO / SRC),
        call="gpt_num_params(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, hidden=hidden, "
             "tied_embeddings=tied_embeddings)")
    return tuple(Planted(name, F, (_RETURN, body), groups=("formulas",), expect={C_PARAMS: outcome})
                 for name, (body, outcome) in attacks.items())


MANIFEST = Manifest(
    assignment="a0", folder="a0_memory", title="Memory and FLOPs of training",
    files={F: SRC},
    tasks=(
        Task("0.1", "Parameter count of a GPT", file=F, functions=("gpt_num_params",)),
        Task("0.2", "Bytes per parameter: weights, gradients, optimizer state", file=F, functions=("bytes_per_param",)),
        Task("0.3", "Activation memory (Korthikanti et al.)", file=F, functions=("activation_bytes",)),
        Task("0.4", "ZeRO stages 0-3 per-rank memory", file=F, functions=("zero_memory_per_rank",)),
        Task("0.5", "Training FLOPs and MFU", file=F, functions=("training_flops", "mfu")),
        Task("0.6", "Predict the measured activations of the tiny GPT", file=F,
             functions=("tiny_gpt_activation_bytes",)),
    ),
    # the estimators are arithmetic: no torch, no copying the reference, no import tricks
    forbidden={F: ("scaletrain", "torch", "importlib", "__import__", "exec", "eval", "sys", "gc",
                   "inspect", "builtins")},
    groups=(
        Group("formulas", "autograder.suites.a0_memory:group_formulas", timeout_s=60, trusted=True, checks=(
            Check("0.1", C_PARAMS, 10),
            Check("0.2", C_BPP, 10),
            Check("0.3", C_GPT1, 5, needs=(C_ACT, C_ACT_CKPT)),
            Check("0.3", C_ACT, 10),
            Check("0.3", C_ACT_CKPT, 5),
            Check("0.4", "the ZeRO paper's table: 120 / 31.4 / 16.6 / 1.9 GB", 5, needs=(C_ZERO,)),
            Check("0.4", C_ZERO, 15),
        )),
        Group("flops", "autograder.suites.a0_memory:group_flops", timeout_s=15, trusted=True, checks=(
            Check("0.5", "training FLOPs 6ND and 8ND", 5),
            Check("0.5", "MFU", 5),
        )),
        Group("measured", "autograder.suites.a0_memory:group_measured", timeout_s=120, trusted=True, checks=(
            Check("0.1", "parameter count equals the numel of real GPTs", 5, needs=(C_PARAMS,)),
            Check("0.2", "model-state bytes equal those measured in a real step", 5, needs=(C_BPP,)),
            Check("0.6", C_TINY, 10),
            Check("0.6", "tiny-GPT activations match the bytes measured in a real step", 10, needs=(C_TINY,)),
        )),
    ),
    planted=(
        Planted("task 0.3 left unimplemented", F,
                ("    per_layer = s * b * h * (4 * e + 2)", "    raise NotImplementedError('a0 task 0.3')\n    per_layer = s * b * h * (4 * e + 2)"),
                groups=("formulas",),
                expect={"activation bytes on hidden configurations (tensor parallel, fp32)": "failed",
                        "the seed's GPT-1 activations: 349,175,808 B per sequence": "failed",
                        "parameter count equals the reference on hidden configurations": "passed",
                        "ZeRO per-rank bytes on hidden configurations (uneven shards)": "passed"}),
        Planted("mixed precision forgets the fp32 master copy (K = 8, not 12)", F,
                ("return 2, 2, 4 + moments", "return 2, 2, moments"), groups=("formulas",),
                expect={"bytes per parameter for every precision and optimizer": "failed",
                        "the ZeRO paper's table: 120 / 31.4 / 16.6 / 1.9 GB": "passed",
                        "ZeRO per-rank bytes on hidden configurations (uneven shards)": "passed",
                        "activation bytes with full checkpointing": "passed"}),
        # issue 27: a boundary the public tests exercise (10 parameters on 3 ranks) costs hidden marks too
        Planted("ZeRO shard rounded down (floor(Ψ/N), not ceil)", F,
                ("shard = -(-num_params // world_size)", "shard = num_params // world_size"), groups=("formulas",),
                expect={"ZeRO per-rank bytes on hidden configurations (uneven shards)": "failed",
                        "the ZeRO paper's table: 120 / 31.4 / 16.6 / 1.9 GB": "failed"}),
        # issue 28: a worked example answered from a table, no model behind it
        Planted("activation_bytes returns the seed's GPT-1 numbers (per sequence, checkpointed) for any shape", F,
                ("    s, b, h, L, a, t, e = seq_len, batch_size, hidden, n_layer, n_head, tp, bytes_per_element\n",
                 "    return (38_535_168 if checkpointing else 349_175_808) * batch_size\n"),
                groups=("formulas",), expect={C_GPT1: "failed", C_ACT: "failed", C_ACT_CKPT: "failed"}),
        Planted("infinite loop", F, ("return (8 if recompute else 6) * num_params * num_tokens", "while True: pass"),
                groups=("flops",), expect={"training FLOPs 6ND and 8ND": "timeout", "MFU": "timeout"}),
        Planted("os._exit in mfu", F, ("return 6 * num_params * tokens_per_second / peak_flops_per_second",
                                       "import os; os._exit(3)"),
                groups=("flops",), expect={"training FLOPs 6ND and 8ND": "passed", "MFU": "error"}),
        Planted("exits the process with a success code at import", F,
                ("from dataclasses import dataclass, replace", "import os; os._exit(0)"), groups=("flops",),
                expect={"training FLOPs 6ND and 8ND": "error", "MFU": "error"}),
        *_attacks(),
        Planted("syntax error", F, ("def mfu(*,", "def mfu(*,,"),
                expect={"training FLOPs 6ND and 8ND": "error", "parameter count equals the numel of real GPTs": "error"}),
        Planted("copies the reference", F, ("from dataclasses import dataclass, replace",
                                            "from dataclasses import dataclass, replace\nfrom scaletrain import memory as _ref"),
                expect={"parameter count equals the reference on hidden configurations": "flagged",
                        "tiny-GPT activations match the bytes measured in a real step": "flagged"}),
    ),
)

TRIALS = 25
RTOL = 1e-9  # the answers are integers; the floats (MFU) differ by the order of operations only


def _reference():
    from scaletrain import memory
    return memory


def _call(fn, *args, **kwargs):
    """(result, 'fn(args)') so a failure names the exact hidden configuration."""
    shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    return fn(*args, **kwargs), f"{fn.__name__}({shown})"


def _trials(salt: int, public: list[dict], draw) -> list[dict]:
    """The public tests' keyword arguments (assignments/a0_memory/tests/; issue 27: a hidden suite
    runs every public case), then TRIALS hidden draws `draw(rng)`."""
    return public + [draw(random.Random(seed)) for seed in checks.trial_seeds(TRIALS, salt=salt)]


def _param_shape(rng: random.Random) -> dict:
    return dict(vocab_size=rng.randint(50, 260_000), block_size=rng.randint(8, 32_768), n_layer=rng.randint(1, 128),
                hidden=rng.randint(1, 200) * 64 + rng.choice([0, 8, 24]), tied_embeddings=rng.random() < 0.5)


def _zero_case(rng: random.Random) -> dict:
    psi = rng.choice([rng.randint(1, 999), rng.randint(10**6, 10**12)])
    return dict(num_params=psi, world_size=rng.choice([1, 2, 3, 7, 8, 64, 1000, 1024]), stage=rng.randint(0, 3),
                precision=rng.choice(_reference().PRECISIONS), optimizer=rng.choice(_reference().OPTIMIZERS))


def _random_shape(rng: random.Random, *, tp: bool = False) -> dict:
    """A transformer shape with irregular sizes: odd head counts, h not a power of two."""
    t = rng.choice([1, 2, 3, 4, 8]) if tp else 1
    n_head = t * rng.randint(1, 12)
    return dict(seq_len=rng.randint(7, 4099), batch_size=rng.randint(1, 48),
                hidden=n_head * rng.choice([8, 24, 64, 80, 128]), n_layer=rng.randint(1, 80),
                n_head=n_head, tp=t)


@contextlib.contextmanager
def _students_bytes_per_param(ref, mem):
    """The reference computing with the student's bytes_per_param answers (asked of the worker),
    so the expected ZeRO bytes follow from task 0.2 as the student wrote it."""
    original = ref.bytes_per_param
    ref.bytes_per_param = lambda **kw: tuple(sized(mem.bytes_per_param(**kw), 3, f"bytes_per_param({kw})"))
    try:
        yield
    finally:
        ref.bytes_per_param = original


def _breakdown(ref, got, call: str):
    """The reference's MemoryBreakdown rebuilt from the fields the student's returned (its `total`
    is then the reference's property, not code of the student's)."""
    if not (isinstance(got, dict) and got.get("__dataclass__") == "MemoryBreakdown"):
        raise AssertionError(f"{call} must return a MemoryBreakdown, got {got!r:.80}")
    return ref.MemoryBreakdown(**got["fields"])


def group_formulas(ctx):
    mem, ref = ctx.remote("memory"), _reference()
    with ctx.check("parameter count equals the reference on hidden configurations"):
        public = [dict(vocab_size=256, block_size=64, n_layer=2, hidden=64, tied_embeddings=True),  # GPTConfig()
                  dict(vocab_size=40512, block_size=512, n_layer=12, hidden=768, tied_embeddings=False)]
        for kw in _trials(1, public, _param_shape):
            got, call = _call(mem.gpt_num_params, **kw)
            assert_close(got, ref.gpt_num_params(**kw), rtol=0, what=call)
    with ctx.check("bytes per parameter for every precision and optimizer"):
        for precision in ref.PRECISIONS:
            for optimizer in ref.OPTIMIZERS:
                got, call = _call(mem.bytes_per_param, precision=precision, optimizer=optimizer)
                want = ref.bytes_per_param(precision=precision, optimizer=optimizer)
                assert tuple(got) == want, f"{call} = {got}, expected (param, grad, optimizer) bytes {want}"
    with ctx.check("the seed's GPT-1 activations: 349,175,808 B per sequence"):
        g = ref.GPT1
        shape = dict(seq_len=g["block_size"], hidden=g["hidden"], n_layer=g["n_layer"], n_head=g["n_head"])
        got, call = _call(mem.activation_bytes, batch_size=1, **shape)
        assert_close(got, 349_175_808, rtol=RTOL, what=call)
        for kw in (dict(batch_size=64), dict(batch_size=1, checkpointing=True)):  # the public test's others
            got, call = _call(mem.activation_bytes, **shape, **kw)
            assert_close(got, ref.activation_bytes(**shape, **kw), rtol=RTOL, what=call)
    with ctx.check("activation bytes on hidden configurations (tensor parallel, fp32)"):
        for seed in checks.trial_seeds(TRIALS, salt=3):
            rng = random.Random(seed)
            kw = dict(_random_shape(rng, tp=True), bytes_per_element=rng.choice([2, 4]))
            got, call = _call(mem.activation_bytes, **kw)
            assert_close(got, ref.activation_bytes(**kw), rtol=RTOL, what=call)
    with ctx.check("activation bytes with full checkpointing"):
        for seed in checks.trial_seeds(TRIALS, salt=4):
            rng = random.Random(seed)
            kw = dict(_random_shape(rng, tp=rng.random() < 0.5), bytes_per_element=rng.choice([2, 4]),
                      checkpointing=True)
            got, call = _call(mem.activation_bytes, **kw)
            assert_close(got, ref.activation_bytes(**kw), rtol=RTOL, what=call)
    with ctx.check("the ZeRO paper's table: 120 / 31.4 / 16.6 / 1.9 GB"):
        paper = ctx.remote("memory", probe="autograder.probes.a0_memory:zero_memory_with_bytes_per_param")
        for stage, gb in enumerate([120.0, 31.4, 16.6, 1.9]):
            got, call = _call(paper.zero_memory_per_rank, 7_500_000_000, 64, stage, precision="mixed",
                              optimizer="adam", bytes_per_param=(2, 2, 12))  # the paper's 16 B/param
            total = _breakdown(ref, got, call).total
            assert round(total / 1e9, 1) == gb, f"{call}.total = {total / 1e9:.2f} GB, the paper says {gb} GB"
    with ctx.check("ZeRO per-rank bytes on hidden configurations (uneven shards)"), _students_bytes_per_param(ref, mem):
        for kw in _trials(5, [dict(num_params=10, world_size=3, stage=3)], _zero_case):  # 10 on 3: ceil 4
            want = ref.zero_memory_per_rank(**kw)
            got, call = _call(mem.zero_memory_per_rank, **kw)
            got = _breakdown(ref, got, call)
            for field in ("params", "grads", "optimizer"):  # a ceil(Ψ/N) slip shows at small Ψ
                assert_close(getattr(got, field), getattr(want, field), rtol=RTOL, what=f"{call}.{field}")


def group_flops(ctx):
    mem, ref = ctx.remote("memory"), _reference()
    with ctx.check("training FLOPs 6ND and 8ND"):
        public = [dict(num_params=10**9, num_tokens=10**6, recompute=r) for r in (False, True)]
        for kw in _trials(6, public, lambda rng: dict(num_params=rng.randint(10**5, 10**12),
                                                      num_tokens=rng.randint(10**3, 10**13),
                                                      recompute=rng.random() < 0.5)):
            got, call = _call(mem.training_flops, **kw)
            assert_close(got, ref.training_flops(**kw), rtol=RTOL, what=call)
    with ctx.check("MFU"):
        public = [dict(num_params=10**9, tokens_per_second=1e5, peak_flops_per_second=1e15)]
        for kw in _trials(7, public, lambda rng: dict(num_params=rng.randint(10**6, 10**11),
                                                      tokens_per_second=rng.uniform(1e2, 1e6),
                                                      peak_flops_per_second=rng.uniform(1e13, 2e15))):
            got, call = _call(mem.mfu, **kw)
            assert_close(got, ref.mfu(**kw), rtol=RTOL, what=call)


def _tiny_configs():
    """(config, batch, sequence): small GPTs that build and run in well under a second each,
    irregular heads, V ≠ h; then the public tests' default GPT at batch 4 (issue 27)."""
    from scaletrain.models import GPTConfig
    return [(GPTConfig(vocab_size=83, block_size=24, n_layer=3, n_embd=36, n_head=3), 3, 21),
            (GPTConfig(vocab_size=300, block_size=16, n_layer=2, n_embd=40, n_head=5), 2, 16),
            (GPTConfig(), 4, GPTConfig().block_size)]


def group_measured(ctx):
    import torch
    from scaletrain.memory_measure import measure_training_step
    from scaletrain.models import GPT

    torch.set_num_threads(1)
    mem, ref = ctx.remote("memory"), _reference()
    with ctx.check("parameter count equals the numel of real GPTs"):
        for cfg, _, _ in _tiny_configs():
            model = GPT(cfg)
            shape = dict(vocab_size=cfg.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer, hidden=cfg.n_embd)
            got, call = _call(mem.gpt_num_params, **shape)
            assert_close(got, sum(p.numel() for p in model.parameters()), rtol=0, what=call)
            model.lm_head.weight = torch.nn.Parameter(model.wte.weight.detach().clone())
            got, call = _call(mem.gpt_num_params, **shape, tied_embeddings=False)
            assert_close(got, sum(p.numel() for p in model.parameters()), rtol=0, what=f"{call} (untied head)")
    with ctx.check("model-state bytes equal those measured in a real step"):
        cfg = _tiny_configs()[0][0]
        n = sum(p.numel() for p in GPT(cfg).parameters())
        for optimizer in ref.OPTIMIZERS:
            p, g, k = sized(mem.bytes_per_param(precision="fp32", optimizer=optimizer), 3,  # first: a stub fails fast
                            f"bytes_per_param(precision='fp32', optimizer={optimizer!r})")
            measured = measure_training_step(GPT(cfg), batch_size=2, optimizer=optimizer)
            steps = 4 * measured.num_param_tensors if optimizer.startswith("adam") else 0  # Adam's `step` scalars
            for what, per_param, counted in (("params", p, measured.params), ("grads", g, measured.grads),
                                             ("optimizer state", k, measured.optimizer - steps)):
                assert per_param * n == counted, (f"bytes_per_param(precision='fp32', optimizer={optimizer!r}): "
                                                  f"{what} {per_param} B/param × {n} params = {per_param * n:,} B, "
                                                  f"measured {counted:,} B")
    with ctx.check("tiny-GPT activations equal the reference on hidden configurations"):
        for seed in checks.trial_seeds(TRIALS, salt=8):
            rng = random.Random(seed)
            shape = _random_shape(rng)
            del shape["tp"]
            kw = dict(shape, vocab_size=rng.randint(2, 70_000), checkpointing=rng.random() < 0.5)
            got, call = _call(mem.tiny_gpt_activation_bytes, **kw)
            assert_close(got, ref.tiny_gpt_activation_bytes(**kw), rtol=RTOL, what=call)
    with ctx.check("tiny-GPT activations match the bytes measured in a real step"):
        for cfg, b, s in _tiny_configs():
            for ckpt in (False, True):
                got, call = _call(mem.tiny_gpt_activation_bytes, batch_size=b, seq_len=s, hidden=cfg.n_embd,
                                  n_layer=cfg.n_layer, n_head=cfg.n_head, vocab_size=cfg.vocab_size,
                                  checkpointing=ckpt)
                m = measure_training_step(GPT(cfg), batch_size=b, seq_len=s, checkpointing=ckpt)
                assert_close(got, m.activations_peak, rtol=0.01, what=call + " vs measured")
