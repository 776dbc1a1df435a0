"""a0's verdicts: the student's estimators (called in the sandboxed worker) against the reference
`scaletrain.memory` and against bytes measured in a real CPU step."""

from __future__ import annotations

import contextlib
import random

from autograder import checks
from autograder.suites import sized
from scaletrain.testing import assert_close

from .inputs import TRIALS, param_shape, random_shape, small_gpts, tiny_configs, trials, zero_case
from .names import (C_ACT, C_ACT_CKPT, C_ACT_TP, C_BPP_FP32, C_BPP_MIXED, C_FLOPS, C_FLOPS_RECOMPUTE, C_GPT1,
                    C_MFU, C_NUMEL, C_PARAMS, C_STATE, C_TINY, C_TINY_CKPT, C_TINY_MEASURED, C_TINY_MEASURED_CKPT,
                    C_ZERO, C_ZERO_EVEN, C_ZERO_PAPER)

RTOL = 1e-9  # the answers are integers; the floats (MFU) differ by the order of operations only


def _reference():
    from scaletrain import memory
    return memory


def _call(fn, *args, **kwargs):
    """(result, 'fn(args)') so a failure names the exact hidden configuration."""
    shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    return fn(*args, **kwargs), f"{fn.__name__}({shown})"


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
    with ctx.check(C_PARAMS):
        public = [dict(vocab_size=256, block_size=64, n_layer=2, hidden=64, tied_embeddings=True),  # GPTConfig()
                  dict(vocab_size=40512, block_size=512, n_layer=12, hidden=768, tied_embeddings=False)]
        for kw in trials(1, public, param_shape):
            got, call = _call(mem.gpt_num_params, **kw)
            assert_close(got, ref.gpt_num_params(**kw), rtol=0, what=call)
    for name, precision in ((C_BPP_FP32, "fp32"), (C_BPP_MIXED, "mixed")):
        with ctx.check(name):
            for optimizer in ref.OPTIMIZERS:
                got, call = _call(mem.bytes_per_param, precision=precision, optimizer=optimizer)
                want = ref.bytes_per_param(precision=precision, optimizer=optimizer)
                assert tuple(got) == want, f"{call} = {got}, expected (param, grad, optimizer) bytes {want}"
    with ctx.check(C_GPT1):
        g = ref.GPT1
        shape = dict(seq_len=g["block_size"], hidden=g["hidden"], n_layer=g["n_layer"], n_head=g["n_head"])
        got, call = _call(mem.activation_bytes, batch_size=1, **shape)
        assert_close(got, 349_175_808, rtol=RTOL, what=call)
        for kw in (dict(batch_size=64), dict(batch_size=1, checkpointing=True)):  # the public test's others
            got, call = _call(mem.activation_bytes, **shape, **kw)
            assert_close(got, ref.activation_bytes(**shape, **kw), rtol=RTOL, what=call)
    for name, salt, tps, ckpt in ((C_ACT, 3, (1,), False), (C_ACT_TP, 9, (2, 3, 4, 8), False),
                                  (C_ACT_CKPT, 4, (1, 1, 2, 3, 4, 8), True)):
        with ctx.check(name):
            for seed in checks.trial_seeds(TRIALS, salt=salt):
                rng = random.Random(seed)
                kw = dict(random_shape(rng, tps=tps), bytes_per_element=rng.choice([2, 4]), checkpointing=ckpt)
                got, call = _call(mem.activation_bytes, **kw)
                assert_close(got, ref.activation_bytes(**kw), rtol=RTOL, what=call)
    with ctx.check(C_ZERO_PAPER):
        paper = ctx.remote("memory", probe="autograder.probes.a0_memory:zero_memory_with_bytes_per_param")
        for stage, gb in enumerate([120.0, 31.4, 16.6, 1.9]):
            got, call = _call(paper.zero_memory_per_rank, 7_500_000_000, 64, stage, precision="mixed",
                              optimizer="adam", bytes_per_param=(2, 2, 12))  # the paper's 16 B/param
            total = _breakdown(ref, got, call).total
            assert round(total / 1e9, 1) == gb, f"{call}.total = {total / 1e9:.2f} GB, the paper says {gb} GB"
    public = {C_ZERO_EVEN: [], C_ZERO: [dict(num_params=10, world_size=3, stage=3)]}  # 10 on 3: ceil 4
    for name, salt, even in ((C_ZERO_EVEN, 10, True), (C_ZERO, 5, False)):
        with ctx.check(name), _students_bytes_per_param(ref, mem):
            for kw in trials(salt, public[name], lambda rng: zero_case(rng, even=even)):
                want = ref.zero_memory_per_rank(**kw)
                got, call = _call(mem.zero_memory_per_rank, **kw)
                got = _breakdown(ref, got, call)
                for field in ("params", "grads", "optimizer"):  # a ceil(Ψ/N) slip shows at small Ψ
                    assert_close(getattr(got, field), getattr(want, field), rtol=RTOL, what=f"{call}.{field}")


def group_flops(ctx):
    mem, ref = ctx.remote("memory"), _reference()
    for name, salt, recompute in ((C_FLOPS, 6, False), (C_FLOPS_RECOMPUTE, 11, True)):
        with ctx.check(name):
            public = [dict(num_params=10**9, num_tokens=10**6, recompute=recompute)]
            for kw in trials(salt, public, lambda rng: dict(num_params=rng.randint(10**5, 10**12),
                                                            num_tokens=rng.randint(10**3, 10**13),
                                                            recompute=recompute)):
                got, call = _call(mem.training_flops, **kw)
                assert_close(got, ref.training_flops(**kw), rtol=RTOL, what=call)
    with ctx.check(C_MFU):
        public = [dict(num_params=10**9, tokens_per_second=1e5, peak_flops_per_second=1e15)]
        for kw in trials(7, public, lambda rng: dict(num_params=rng.randint(10**6, 10**11),
                                                      tokens_per_second=rng.uniform(1e2, 1e6),
                                                      peak_flops_per_second=rng.uniform(1e13, 2e15))):
            got, call = _call(mem.mfu, **kw)
            assert_close(got, ref.mfu(**kw), rtol=RTOL, what=call)



def group_measured(ctx):
    import torch
    from scaletrain.memory_measure import measure_training_step
    from scaletrain.models import GPT

    torch.set_num_threads(1)
    mem, ref = ctx.remote("memory"), _reference()
    with ctx.check(C_NUMEL):
        for cfg, _, _ in tiny_configs():
            model = GPT(cfg)
            shape = dict(vocab_size=cfg.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer, hidden=cfg.n_embd)
            got, call = _call(mem.gpt_num_params, **shape)
            assert_close(got, sum(p.numel() for p in model.parameters()), rtol=0, what=call)
            model.lm_head.weight = torch.nn.Parameter(model.wte.weight.detach().clone())
            got, call = _call(mem.gpt_num_params, **shape, tied_embeddings=False)
            assert_close(got, sum(p.numel() for p in model.parameters()), rtol=0, what=f"{call} (untied head)")
    with ctx.check(C_STATE):
        cfg = tiny_configs()[0][0]
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
    for name, salt, ckpt in ((C_TINY, 8, False), (C_TINY_CKPT, 12, True)):
        with ctx.check(name):
            for seed in checks.trial_seeds(TRIALS, salt=salt):
                rng = random.Random(seed)
                shape = random_shape(rng)
                del shape["tp"]
                kw = dict(shape, vocab_size=rng.randint(2, 70_000), checkpointing=ckpt)
                got, call = _call(mem.tiny_gpt_activation_bytes, **kw)
                assert_close(got, ref.tiny_gpt_activation_bytes(**kw), rtol=RTOL, what=call)
    # the design is the student's: whatever tensors they counted, real steps of seeded GPTs decide
    for name, ckpt in ((C_TINY_MEASURED, False), (C_TINY_MEASURED_CKPT, True)):
        with ctx.check(name):
            for cfg, b, s in tiny_configs() + small_gpts(salt=13):
                got, call = _call(mem.tiny_gpt_activation_bytes, batch_size=b, seq_len=s, hidden=cfg.n_embd,
                                  n_layer=cfg.n_layer, n_head=cfg.n_head, vocab_size=cfg.vocab_size,
                                  checkpointing=ckpt)
                m = measure_training_step(GPT(cfg), batch_size=b, seq_len=s, checkpointing=ckpt)
                assert_close(got, m.activations_peak, rtol=0.01, what=call + " vs measured")
