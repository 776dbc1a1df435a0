"""The capstone with `--zero S`: ZeRO on the dp group of the 3D mesh trains like one process.

One spawn of 4 ranks runs 3 steps in each case below; every rank returns its losses, its slices of
the parameters and the model-state bytes it holds after the last step. References: one process on
the whole batch with the same optimizer (`scaletrain.train.reference`). Adam(W) is checked on the
losses (its parameters cannot be compared with one process: Adam divides by √v, so an element whose
gradient is rounding noise, such as the key bias, exactly zero in exact arithmetic, moves by up to
lr per step, differently for every order of the sums), and at stage 1, whose sums run in the order
of plain data parallelism (--zero 0), on the parameters of that run. Memory: ZeRO §5's bytes per
rank written out below, at this rank's parameter count taken from one process's GPT sliced as
tensor parallelism slices it.
"""

from __future__ import annotations

import functools
import math

import pytest

from scaletrain.launch import spawn
from scaletrain.testing import assert_close
from scaletrain.tp.gpt import gpt_shard
from scaletrain.train import TrainConfig, main, reference, train_rank, zero_summary

# (dp, pp, tp, sp, zero, optimizer): every stage with tp, sp, and a pipeline (whose tied embedding is
# summed across the first and the last stage, on gradient shards at stages 2-3)
SGD_CASES = [(2, 1, 2, False, 1, "sgd"), (2, 1, 2, False, 2, "sgd"), (2, 1, 2, False, 3, "sgd"),
             (2, 1, 2, True, 3, "sgd"), (2, 2, 1, False, 2, "sgd"), (2, 2, 1, False, 3, "sgd")]
ADAM_CASES = [(2, 1, 2, True, 0, "adamw"), (2, 1, 2, True, 1, "adamw"), (2, 1, 2, True, 3, "adamw"),
              (2, 2, 1, False, 2, "adam")]
STEPS = 3


def _cfg(dp, pp, tp, sp, zero, optimizer) -> TrainConfig:
    return TrainConfig(dp=dp, pp=pp, tp=tp, sequence_parallel=sp, zero=zero, optimizer=optimizer, steps=STEPS,
                       lr=0.5 if optimizer == "sgd" else 3e-3)


def _rank(rank: int, world_size: int) -> dict:
    return {case: train_rank(rank, world_size, _cfg(*case), log=False) for case in SGD_CASES + ADAM_CASES}


@functools.lru_cache(maxsize=None)
def _runs() -> list[dict]:
    return spawn(_rank, 4, timeout_s=300)


@functools.lru_cache(maxsize=None)
def _reference(dp: int, optimizer: str) -> dict:
    return reference(_cfg(dp, 1, 1, False, 0, optimizer))  # the layout matters only through the batch


def _ids(case) -> str:
    dp, pp, tp, sp, zero, optimizer = case
    return f"dp{dp}-pp{pp}-tp{tp}{'-sp' if sp else ''}-zero{zero}-{optimizer}"


def _check_losses(case) -> None:
    ref = _reference(case[0], case[5])["losses"]
    for rank, runs in enumerate(_runs()):
        for step, (a, e) in enumerate(zip(runs[case]["losses"], ref)):
            assert abs(a - e) <= 1e-5 * abs(e), f"{_ids(case)} rank {rank}, step {step + 1}: loss {a}, one process {e}"


@pytest.mark.slow
@pytest.mark.parametrize("case", SGD_CASES, ids=_ids)
def test_zero_trains_like_one_process(case):
    _check_losses(case)
    ref, seen = _reference(case[0], "sgd")["params"], set()
    for rank, runs in enumerate(_runs()):
        got = runs[case]
        for name, p in got["params"].items():
            want = gpt_shard(name, ref[name], rank=got["coords"]["tp"], world_size=case[2])
            assert_close(p, want, rtol=2e-5, what=f"{_ids(case)} rank {rank} {got['coords']}: {name}, step {STEPS}")
            seen.add(name)
    assert seen == set(ref), f"parameters no rank holds: {sorted(set(ref) - seen)}"


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in ADAM_CASES if c[4]], ids=_ids)
def test_zero_adam_losses_match_one_process(case):
    _check_losses(case)


@pytest.mark.slow
def test_zero1_adamw_steps_like_plain_data_parallelism():
    """Stage 1 reduce-scatters the gradients plain data parallelism allreduces, in the same order,
    and steps the same elementwise AdamW on shards: the same parameters."""
    zero1, plain = ADAM_CASES[1], ADAM_CASES[0]
    _check_losses(plain)
    for rank, runs in enumerate(_runs()):
        for name, p in runs[zero1]["params"].items():
            assert_close(p, runs[plain]["params"][name], rtol=2e-5, what=f"{_ids(zero1)} rank {rank}: {name}")


def _formula(stage: int, psi: int, n: int, optimizer: str) -> dict:
    """ZeRO §5 in fp32 (p = g = 4 bytes; K = 8 for Adam's two moments, 0 for plain SGD); a shard
    holds ⌈Ψ'/N⌉ elements of the padded Ψ'."""
    k, shard = (8 if optimizer.startswith("adam") else 0), math.ceil(psi / n)
    return {"params": 4 * (shard if stage >= 3 else psi), "grads": 4 * (shard if stage >= 2 else psi),
            "optimizer": k * shard}


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in SGD_CASES + ADAM_CASES if c[4]], ids=_ids)
def test_each_rank_holds_the_zero_formula(case):
    dp, _, tp, _, zero, optimizer = case
    ref = _reference(dp, case[5])["params"]
    for rank, runs in enumerate(_runs()):
        got, memory = runs[case], runs[case]["memory"]
        psi = sum(gpt_shard(n, ref[n], rank=got["coords"]["tp"], world_size=tp).numel() for n in got["params"])
        assert memory["num_params"] == psi, f"rank {rank}: ZeRO manages {memory['num_params']}, the rank holds {psi}"
        assert psi <= memory["padded_params"] < psi + dp * 64, "padding: under N elements per flat unit, under 64 units"
        want = _formula(zero, memory["padded_params"], dp, optimizer)
        held = {k: memory[k] for k in want}
        assert held == want == memory["expected"], f"{_ids(case)} rank {rank}: held {held}, ZeRO §5 {want}"
    memory = _runs()[0][case]["memory"]
    line, kb = zero_summary(memory, _cfg(*case)), memory["params"] / 1e3
    assert f"ZeRO-{zero} over dp={dp}" in line and f"params {kb:.1f} KB (formula {kb:.1f})" in line, line


def test_zero_options_name_what_is_supported(capsys):
    for bad in (4, -1, True):
        with pytest.raises(ValueError, match=r"--zero must be one of \(0, 1, 2, 3\)"):
            TrainConfig(dp=2, zero=bad)
    with pytest.raises(SystemExit) as info:
        main(["--dp", "2", "--zero", "4"])
    assert info.value.code == 2 and "--zero: invalid choice: 4" in capsys.readouterr().err
    with pytest.raises(ValueError, match="optimizer must be one of"):
        TrainConfig(optimizer="lamb")
