"""The capstone: `scaletrain.train` on 4 ranks in every 3D layout equals one process.

One spawn of 4 ranks trains 5 steps in each layout (dp, pp, tp) of the issue, plus tensor and
sequence parallelism with a pipeline; each rank returns its losses and its slices of the parameters.
The reference is one process on the whole batch of each step (`scaletrain.train.reference`), with
the same optimizer. Tolerances: losses within 1e-5 relative; with SGD (lr 0.5) every parameter
within 2e-5 of its tensor's largest entry. AdamW is checked on the losses only: it divides by √v,
so the key bias, whose gradient is zero in exact arithmetic (softmax ignores a constant added to
every key score), moves by up to lr per step on fp32 rounding noise, differently in every layout.
"""

from __future__ import annotations

import functools

import pytest

from scaletrain.launch import spawn
from scaletrain.testing import assert_close
from scaletrain.tp.gpt import gpt_shard
from scaletrain.train import TrainConfig, reference, train_rank

LAYOUTS = [(2, 1, 2, False), (1, 2, 2, False), (2, 2, 1, False), (4, 1, 1, False), (1, 1, 4, False),
           (1, 2, 2, True)]


def _cfg(dp, pp, tp, sp, optimizer="sgd") -> TrainConfig:
    return TrainConfig(dp=dp, pp=pp, tp=tp, sequence_parallel=sp, steps=5, optimizer=optimizer,
                       lr=0.5 if optimizer == "sgd" else 3e-3)


def _rank(rank: int, world_size: int) -> dict:
    out = {layout: train_rank(rank, world_size, _cfg(*layout), log=False) for layout in LAYOUTS}
    out["adamw"] = train_rank(rank, world_size, _cfg(1, 2, 2, False, "adamw"), log=False)
    return out


@functools.lru_cache(maxsize=None)
def _runs() -> list[dict]:
    return spawn(_rank, 4, timeout_s=300)


@functools.lru_cache(maxsize=None)
def _reference(dp: int, optimizer: str = "sgd") -> dict:
    return reference(_cfg(dp, 1, 1, False, optimizer))  # the layout matters only through the batch


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda v: "dp{}-pp{}-tp{}{}".format(*v[:3], "-sp" if v[3] else ""))
def test_layout_trains_like_one_process(layout):
    dp, pp, tp, sp = layout
    ref = _reference(dp)
    seen = set()
    for rank, runs in enumerate(_runs()):
        got = runs[layout]
        for step, (a, e) in enumerate(zip(got["losses"], ref["losses"])):
            assert abs(a - e) <= 1e-5 * abs(e), f"rank {rank}, step {step + 1}: loss {a}, one process {e}"
        for name, p in got["params"].items():
            want = gpt_shard(name, ref["params"][name], rank=got["coords"]["tp"], world_size=tp)
            assert_close(p, want, rtol=2e-5, what=f"rank {rank} {got['coords']}: {name} after 5 steps")
            seen.add(name)
    assert seen == set(ref["params"]), f"parameters no rank holds: {sorted(set(ref['params']) - seen)}"


def test_adamw_losses_match_one_process():
    ref = _reference(1, "adamw")["losses"]
    for rank, runs in enumerate(_runs()):
        for step, (a, e) in enumerate(zip(runs["adamw"]["losses"], ref)):
            assert abs(a - e) <= 1e-5 * abs(e), f"rank {rank}, step {step + 1}: loss {a}, one process {e}"
