"""Dropout under tensor (and sequence) parallelism, p = 0.1, t = 2 (scaletrain.tp.dropout).

The equivalence tested: with the counter-based mask convention (element i of the whole, unsplit
tensor is kept iff hash(seed, site, call, i) >= p·2³²), the GPT converted at t = 2 gives the same
losses, logits and gradients, call after call, as the same conversion at t = 1 in one process
(`parallelize(GPT(cfg), None)`: plain layers, no collective), and its ranks' masks put together are
that process's masks. Beyond it, the properties Megatron's RNG tracker is there for: replicated
activations (the MLP output after g) get the same mask on every tp rank; split ones (attention
probabilities of split heads; the MLP output's sequence shards under SP) get masks that differ
across ranks as independent draws do, and that a fresh model with the same seed reproduces. The
convention itself is checked without processes: a slice's mask is the whole mask's slice, the kept
fraction is 1 - p, and masks of other calls, sites and neighbouring elements agree only by chance.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn as nn

from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.testing import assert_close
from scaletrain.tp import TensorParallelDropout, allreduce_sequence_parallel_grads, keep_mask, parallelize
from scaletrain.tp.gpt import gpt_shard

P, T, SEED, CALLS = 0.1, 2, 5, 2
CFG = GPTConfig(vocab_size=96, block_size=24, n_layer=2, n_head=4, n_embd=32, dropout=P)
BATCH, SEQ = 3, 12  # SP needs s divisible by t
CHANCE = P * P + (1 - P) * (1 - P)  # two independent masks agree on an element with this probability


def _within_chance(agree: torch.Tensor, what: str, expected: float) -> None:
    """The mean of `agree` (bools) within 5 standard deviations of a Bernoulli(expected) mean."""
    n, mean = agree.numel(), agree.float().mean().item()
    assert abs(mean - expected) <= 5 * math.sqrt(expected * (1 - expected) / n), \
        f"{what}: {mean:.4f} over {n} elements, independent draws give {expected:.4f}"


# ------------------------------------------------------------------ the convention, in one process

@pytest.mark.parametrize("full,dim,t", [((3, 4, 7, 7), 1, 2), ((3, 4, 7, 7), 1, 4), ((3, 12, 5), 1, 3),
                                        ((5, 6), 1, 2)])
def test_a_slice_gets_the_slice_of_the_whole_mask(full, dim, t):
    whole = keep_mask(full, p=P, seed=SEED, site=3, call=1)
    n = full[dim] // t
    for r in range(t):
        shape, start = list(full), [0] * len(full)
        shape[dim], start[dim] = n, r * n
        part = keep_mask(shape, p=P, seed=SEED, site=3, call=1, full_shape=full, start=start)
        assert torch.equal(part, whole.narrow(dim, r * n, n)), f"slice {r} of {t} along dim {dim}"


def test_masks_keep_one_minus_p_and_agree_only_by_chance():
    n = 100_003
    mask = keep_mask((n,), p=P, seed=SEED, site=0, call=0)
    _within_chance(mask, "kept fraction", 1 - P)
    others = {"next call": dict(site=0, call=1), "other site": dict(site=1, call=0),
              "other seed": dict(site=0, call=0, seed=SEED + 1)}
    for what, kw in others.items():
        other = keep_mask((n,), p=P, **{"seed": SEED, **kw})
        _within_chance(mask == other, f"agreement with the {what}", CHANCE)
    _within_chance(mask[1:] == mask[:-1], "agreement of neighbouring elements", CHANCE)
    assert torch.equal(mask, keep_mask((n,), p=P, seed=SEED, site=0, call=0)), "not reproducible"


def test_dropout_is_inverted_and_off_in_eval():
    x = torch.randn(4, 6, 8)
    drop = TensorParallelDropout(P, seed=SEED, site=0)
    want = x * keep_mask(x.shape, p=P, seed=SEED, site=0, call=0) / (1 - P)
    assert_close(drop(x), want, rtol=1e-6, what="training: x·mask/(1 - p)")
    assert drop.calls == 1
    assert torch.equal(drop.eval()(x), x) and drop.calls == 1, "eval mode must be the identity and draw nothing"
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
            TensorParallelDropout(bad, seed=0, site=0)
    with pytest.raises(ValueError, match="does not fit"):
        keep_mask((2, 3), p=P, seed=0, site=0, call=0, full_shape=(2, 4), start=(0, 2))


def test_converted_gpt_without_dropout_drawn_equals_the_plain_gpt():
    """p = 0.1 in eval mode draws nothing: the t = 1 conversion then is the plain model."""
    x, y = make_batch(CFG, BATCH, seed=1, seq_len=SEQ)
    plain, converted = GPT(CFG, seed=0).eval(), parallelize(GPT(CFG, seed=0), None).eval()
    assert_close(converted(x, y)[1], plain(x, y)[1], what="eval loss")


# ------------------------------------------------------------------ t = 2 against one process

def _sites(model: nn.Module) -> dict[int, TensorParallelDropout]:
    return {m.site: m for m in model.modules() if isinstance(m, TensorParallelDropout)}


def _train_calls(model: nn.Module, group=None) -> dict:
    """CALLS forward+backward passes in training mode on one batch: losses, the last call's logits
    and gradients, and each dropout's (kept, known) masks per (site, call), known = input != 0 (an
    exact zero, e.g. a masked-out attention probability, says nothing about the mask)."""
    masks: dict = {}

    def record(module, inputs, output):
        masks[(module.site, module.calls - 1)] = (output != 0, inputs[0] != 0)
    for m in _sites(model).values():
        m.register_forward_hook(record)
    x, y = make_batch(CFG, BATCH, seed=1, seq_len=SEQ)
    losses = []
    for _ in range(CALLS):
        model.zero_grad(set_to_none=True)
        logits, loss = model.train()(x, y)
        loss.backward()
        allreduce_sequence_parallel_grads(model, group)
        losses.append(loss.item())
    return {"losses": losses, "logits": logits.detach(), "masks": masks,
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def _rank(rank: int, world_size: int) -> dict:
    out = {}
    for sp in (False, True):
        out[sp] = _train_calls(parallelize(GPT(CFG, seed=0), None, sequence_parallel=sp, dropout_seed=SEED))
        again = _train_calls(parallelize(GPT(CFG, seed=0), None, sequence_parallel=sp, dropout_seed=SEED))
        out[sp]["reproduced"] = again["masks"]
    return out


@functools.lru_cache(maxsize=None)
def _runs() -> list[dict]:
    return spawn(_rank, T, timeout_s=180)


@functools.lru_cache(maxsize=None)
def _one_process() -> dict:
    return _train_calls(parallelize(GPT(CFG, seed=0), None, dropout_seed=SEED))


def _split_dim(site: int, sp: bool) -> int | None:
    """Attention probabilities (even sites): heads, dim 1; the MLP output: positions under SP, else whole."""
    return 1 if site % 2 == 0 or sp else None


@pytest.mark.slow
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_t2_with_dropout_equals_one_process(sp):
    ref = _one_process()
    for rank, run in enumerate(_runs()):
        got = run[sp]
        for call, (a, e) in enumerate(zip(got["losses"], ref["losses"])):
            assert abs(a - e) <= 2e-5 * abs(e), f"rank {rank}, call {call}: loss {a}, one process {e}"
        vocab = CFG.vocab_size // T
        assert_close(got["logits"], ref["logits"][..., rank * vocab:(rank + 1) * vocab], what=f"rank {rank}: logits")
        for name, g in got["grads"].items():
            want = gpt_shard(name, ref["grads"][name], rank=rank, world_size=T)
            assert_close(g, want, what=f"rank {rank}, call {CALLS - 1}: gradient of {name}")


@pytest.mark.slow
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_rank_masks_put_together_are_one_process_masks(sp):
    ref, runs = _one_process()["masks"], _runs()
    assert set(runs[0][sp]["masks"]) == set(ref) == {(s, c) for s in range(2 * CFG.n_layer) for c in range(CALLS)}
    for (site, call), (kept, known) in ref.items():
        dim = _split_dim(site, sp)
        parts = [run[sp]["masks"][(site, call)] for run in runs]
        if dim is None:
            parts = parts[:1]  # whole on every rank (checked equal below)
        got_kept, got_known = (torch.cat([part[i] for part in parts], dim=dim or 0) for i in (0, 1))
        assert torch.equal(got_known, known), f"site {site} call {call}: different inputs, cannot compare"
        assert torch.equal(got_kept[known], kept[known]), f"site {site} call {call}: masks differ from one process"


@pytest.mark.slow
def test_replicated_activations_get_one_mask_on_every_rank():
    r0, r1 = (run[False]["masks"] for run in _runs())
    for site in range(1, 2 * CFG.n_layer, 2):  # the MLP outputs, after g's allreduce
        for call in range(CALLS):
            (kept0, known0), (kept1, known1) = r0[(site, call)], r1[(site, call)]
            assert torch.equal(known0, known1) and torch.equal(kept0, kept1), f"site {site} call {call}"


@pytest.mark.slow
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_split_activations_get_independent_reproducible_masks(sp):
    runs, agree, dropped = _runs(), [], []
    for site in range(2 * CFG.n_layer):
        if _split_dim(site, sp) is None:
            continue
        for call in range(CALLS):
            (kept0, known0), (kept1, known1) = (run[sp]["masks"][(site, call)] for run in runs)
            both = known0 & known1
            agree.append(kept0[both] == kept1[both])
            dropped.append(~kept0[known0])
            for rank, run in enumerate(runs):
                assert torch.equal(run[sp]["reproduced"][(site, call)][0], run[sp]["masks"][(site, call)][0]), \
                    f"rank {rank} site {site} call {call}: the same seed drew another mask"
    _within_chance(torch.cat(agree), "agreement of rank 0's and rank 1's masks", CHANCE)
    _within_chance(torch.cat(dropped), "dropped fraction", P)
