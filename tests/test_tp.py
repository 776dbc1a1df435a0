"""scaletrain.tp on gloo: every layer equals its unsharded self, the GPT equals one process, the bytes
and the saved activations equal their closed forms.

One spawn of 4 ranks (spawning costs seconds); process subgroups of its first 1, 2 and 3 ranks give
the other tensor-parallel sizes. Every rank runs every check of every group it belongs to and
records failures by name; the tests below read one entry each, so a failure names its case.
References are independent of the code under test: the unsharded torch layer or GPT in one process
(scaletrain.tp.verify), `scaletrain.comm.comm_counter` against tp.cost's closed forms, autograd's
saved tensors against tp.activations' formula.
"""

from __future__ import annotations

import datetime
import functools
import traceback
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist

from scaletrain.comm import comm_counter
from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.tp import activations, cost, parallelize, split, verify
from scaletrain.tp.layers import ColumnParallelLinear, RowParallelLinear

WORLD = 4
SIZES = (4, 3, 2, 1)
B, S_ODD = 3, 7        # odd batch and sequence (tensor parallelism: any sequence length)
S_SP = 12              # sequence parallelism needs s divisible by t: 12 for t = 1, 2, 3, 4
CFG = GPTConfig(vocab_size=96, block_size=24, n_layer=2, n_head=12, n_embd=48)  # every size divides 96, 12, 48


def _checks(t: int) -> dict:
    """name -> (function, kwargs) for tensor-parallel size t."""
    found = {}
    for g in (False, True):
        found[f"column gather_output={g} t={t}"] = (verify.check_column, dict(gather_output=g, seq=S_ODD))
    for p in (True, False):
        found[f"row input_is_parallel={p} t={t}"] = (verify.check_row, dict(input_is_parallel=p, seq=S_ODD))
    found[f"embedding t={t}"] = (verify.check_embedding, dict(seq=S_ODD))
    found[f"cross-entropy t={t}"] = (verify.check_cross_entropy, dict(rows=B * S_ODD))
    found[f"cross-entropy never holds the whole logits t={t}"] = (verify.check_logits_never_whole, dict(rows=B * S_ODD))
    found[f"sequence gather/scatter pair t={t}"] = (verify.check_sequence_pair, dict(seq=S_SP))
    for sp in (False, True):
        seq = S_SP if sp else S_ODD
        found[f"MLP sequence_parallel={sp} t={t}"] = (verify.check_mlp, dict(sequence_parallel=sp, seq=seq))
        found[f"attention sequence_parallel={sp} t={t}"] = (verify.check_attention, dict(sequence_parallel=sp, seq=seq))
        found[f"embedding sequence_parallel={sp} t={t}"] = (verify.check_embedding, dict(sequence_parallel=sp, seq=seq))
        found[f"GPT sequence_parallel={sp} t={t}"] = (verify.check_gpt, dict(cfg=CFG, sequence_parallel=sp, seq=seq))
        found[f"layer bytes sequence_parallel={sp} t={t}"] = (_check_layer_bytes, dict(sequence_parallel=sp))
        found[f"GPT step bytes sequence_parallel={sp} t={t}"] = (_check_gpt_bytes, dict(sequence_parallel=sp))
        found[f"block activations sequence_parallel={sp} t={t}"] = (_check_activations, dict(sequence_parallel=sp))
    if t in (2, 4):  # torch's collectives give the same numbers
        found[f"GPT backend=torch t={t}"] = (verify.check_gpt, dict(cfg=CFG, seq=S_ODD, backend="torch"))
        found[f"GPT sequence_parallel backend=torch t={t}"] = (
            verify.check_gpt, dict(cfg=CFG, seq=S_SP, backend="torch", sequence_parallel=True))
        found[f"clear errors t={t}"] = (_check_errors, {})
    return found


def _block_input(group, sequence_parallel: bool, seq: int) -> tuple:
    model = parallelize(GPT(CFG, seed=0), group, sequence_parallel=sequence_parallel)
    x = verify.randn(B, seq, CFG.n_embd, seed=3)
    if sequence_parallel:
        x = split(x, 1, group)
    return model.blocks[0], x.requires_grad_(True)


def _check_layer_bytes(group, *, sequence_parallel: bool) -> None:
    """One block's forward + backward sends the bytes of 4 allreduces of b·s·h (seminar eq. 5), or of
    their all-gather + reduce-scatter halves and the two re-gathers under sequence parallelism; the
    forward alone is the same under both."""
    t = dist.get_world_size(group)
    block, x = _block_input(group, sequence_parallel, S_SP)
    with comm_counter() as fwd:
        y = block(x)
    with comm_counter() as bwd:
        y.backward(torch.ones_like(y))
    kw = dict(batch_size=B, seq_len=S_SP, hidden=CFG.n_embd, t=t, sequence_parallel=sequence_parallel)
    for phase, got in (("forward", fwd.bytes_sent), ("backward", bwd.bytes_sent)):
        want = cost.layer_bytes(**kw, forward=phase == "forward", backward=phase == "backward")
        assert got == want, f"one block's {phase} sent {got} bytes, the closed form says {want}"
    n = B * S_SP * CFG.n_embd
    assert fwd.bytes_sent == 2 * cost.allreduce_bytes(n, t), "forward: the bytes of two allreduces of b·s·h"
    assert cost.layer_bytes(**{**kw, "sequence_parallel": False}) == round(8 * n * 4 * (t - 1) / t), "equation 5"


def _check_gpt_bytes(group, *, sequence_parallel: bool) -> None:
    t = dist.get_world_size(group)
    seq = S_SP
    model = parallelize(GPT(CFG, seed=0), group, sequence_parallel=sequence_parallel)
    x, y = make_batch(CFG, B, seed=1, seq_len=seq)
    with comm_counter() as fwd:
        loss = model(x, y)[1]
    with comm_counter() as bwd:
        loss.backward()
    kw = dict(batch_size=B, seq_len=seq, hidden=CFG.n_embd, n_layer=CFG.n_layer, t=t,
              sequence_parallel=sequence_parallel)
    for phase, got in (("forward", fwd.bytes_sent), ("backward", bwd.bytes_sent)):
        want = cost.gpt_step_bytes(**kw, forward=phase == "forward", backward=phase == "backward")
        assert got == want, f"the {phase} sent {got} bytes, the closed form says {want}"
    assert fwd.bytes_sent + bwd.bytes_sent == cost.gpt_step_bytes(**kw)


def _check_activations(group, *, sequence_parallel: bool) -> None:
    t = dist.get_world_size(group)
    for seq in ((S_SP,) if sequence_parallel else (S_ODD, S_SP)):
        block, x = _block_input(group, sequence_parallel, seq)
        got = activations.measure_block_activations(block, x)
        want = activations.block_activation_bytes(batch_size=B, seq_len=seq, hidden=CFG.n_embd, n_head=CFG.n_head,
                                                  tp=t, sequence_parallel=sequence_parallel)
        assert got == want, f"s={seq}: one block saved {got} bytes, the formula says {want}"


def _check_errors(group) -> None:
    t = dist.get_world_size(group)
    cases = [(lambda: ColumnParallelLinear(8, 4 * t + 1, tp_group=group), "out_features"),
             (lambda: RowParallelLinear(4 * t + 1, 8, tp_group=group), "in_features"),
             (lambda: parallelize(GPT(GPTConfig(n_head=t + 1, n_embd=4 * (t + 1))), group), "n_head"),
             (lambda: parallelize(GPT(GPTConfig(vocab_size=4 * t + 1, n_head=t, n_embd=4 * t)), group), "vocab_size"),
             (lambda: parallelize(GPT(CFG), group, sequence_parallel=True)(*make_batch(CFG, 2, seq_len=t + 1)),
              "sequence length")]
    for make, word in cases:
        with pytest.raises(ValueError, match=word) as info:
            make()
        assert f"t={t}" in str(info.value), str(info.value)


def _rank_main(rank: int, world_size: int) -> dict[str, str | None]:
    timeout = datetime.timedelta(seconds=120)
    groups = {size: (None if size == world_size else dist.new_group(list(range(size)), timeout=timeout))
              for size in SIZES}
    results: dict[str, str | None] = {}
    for size in SIZES:
        if rank >= size:
            continue
        for name, (fn, kwargs) in _checks(size).items():
            try:
                fn(groups[size], **kwargs)
                results[name] = None
            except AssertionError as exc:
                results[name] = str(exc) or traceback.format_exc(limit=3)
            except Exception:  # noqa: BLE001 - keep the other checks running
                results[name] = traceback.format_exc(limit=5)
    return results


@functools.lru_cache(maxsize=None)
def _results() -> dict[str, str | None]:
    merged: dict[str, str | None] = {}
    for per_rank in spawn(_rank_main, WORLD, timeout_s=300):
        for name, error in per_rank.items():
            if merged.get(name) is None:
                merged[name] = error
    return merged


@pytest.mark.parametrize("name", [n for t in SIZES for n in _checks(t)])
def test_tp_distributed(name: str) -> None:
    results = _results()
    assert name in results, f"check {name!r} did not run"
    assert results[name] is None, results[name]


@pytest.mark.parametrize("name", [n for n, (fn, _) in _checks(1).items() if fn.__module__ == verify.__name__])
def test_verify_runs_at_t_1_without_a_process_group(name: str) -> None:
    """The layers work in one process without torch.distributed (t = 1); their checks do too."""
    assert not dist.is_initialized()
    check, kwargs = _checks(1)[name]
    check(None, **kwargs)


def test_a_failed_verify_check_raises_without_a_process_group() -> None:
    def broken() -> None:
        raise AssertionError("the output differs")

    with pytest.raises(AssertionError, match="the output differs"):
        verify._agreed(None, broken)


def test_block_formula_is_korthikanti_adapted() -> None:
    """The CPU block formula at t = 1 is one layer of memory.tiny_gpt_activation_bytes; TP minus TP+SP
    is the replicated part times (1 - 1/t), whose 16-bit form is the paper's 10·s·b·h."""
    from scaletrain import memory
    kw = dict(batch_size=3, seq_len=12, hidden=48)
    for t in (1, 2, 4):
        tp_only = activations.block_activation_bytes(**kw, n_head=12, tp=t)
        with_sp = activations.block_activation_bytes(**kw, n_head=12, tp=t, sequence_parallel=True)
        assert tp_only - with_sp == activations.replicated_block_bytes(**kw) * (t - 1) // t
    s, b, h, L, a = 512, 8, 768, 12, 12
    for t in (1, 2, 3, 4, 6):
        tp_k = memory.activation_bytes(seq_len=s, batch_size=b, hidden=h, n_layer=L, n_head=a, tp=t)
        sp_k = memory.sequence_parallel_activation_bytes(seq_len=s, batch_size=b, hidden=h, n_layer=L, n_head=a, tp=t)
        assert tp_k == s * b * h * L * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))
        assert sp_k == s * b * h * L * (Fraction(34, t) + Fraction(5 * a * s, h * t))
        assert tp_k - sp_k == 10 * s * b * h * L * (t - 1) // t


def test_the_plan_is_what_parallelize_did() -> None:
    """scaletrain.tp.plan drives parallelize and gpt_shard: every parameter of a converted GPT carries
    (as `mark_sharded` recorded it) the split the plan gives its name, and the modules are the plan's."""
    from scaletrain.tp.plan import GPT_PLAN, param_split, style_of
    model = parallelize(GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=16), seed=0))
    for name, p in model.named_parameters():
        marked = (p.tp_dim, p.tp_parts) if hasattr(p, "tp_dim") else None
        assert marked == param_split(name), f"{name}: marked {marked}, the plan says {param_split(name)}"
    kinds = {"vocab": "VocabParallelEmbedding", "heads": "ParallelSelfAttention", "colwise": "ColumnParallelLinear",
             "rowwise": "RowParallelLinear"}
    for path, module in model.named_modules():
        style = style_of(path, GPT_PLAN)
        if style in kinds:
            assert type(module).__name__ == kinds[style], f"{path}: {type(module).__name__}, the plan says {style}"
    assert model.lm_head.weight is model.wte.weight, "the head's weight is no longer tied to the embedding's"
    assert param_split("blocks.7.attn.qkv.bias") == (0, 3) and param_split("ln_f.weight") is None
