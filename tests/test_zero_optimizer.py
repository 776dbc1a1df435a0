"""ZeRO's optimizer face is torch's (issue 19, item 7): LR schedulers, closures, set_to_none, torch's
state_dict shape, building from parameters, add_param_group; and building it leaves .grad alone.

References: one process with a plain torch optimizer on the mean of the ranks' micro-batch
gradients (`scaletrain.zero.verify`), and that optimizer's own `state_dict()`. One spawn of 2 gloo
ranks runs every check and records failures by name; the tests below read one entry each.
"""

from __future__ import annotations

import functools
import traceback

import pytest
import torch
import torch.distributed as dist

from scaletrain.launch import spawn
from scaletrain.zero import ZeRO, verify

WORLD = 2
STAGES = (0, 1, 2, 3)


def _warmup_decay(step: int) -> float:
    """An LR schedule that changes every step: linear warm-up over 2 steps, then halving."""
    return (step + 1) / 2 if step < 2 else 0.5 ** (step - 1)


def _zero(model, case: verify.Case, **options) -> ZeRO:
    cls, kwargs = verify.OPTIMIZER_SETUPS[case.optimizer]
    return ZeRO(model, optimizer_class=cls, stage=case.stage, param_groups=verify.param_groups(case.model, model),
                bucket_cap_mb=case.bucket_cap_mb, **{**kwargs, **options})


def _check_scheduler(stage: int, model: str) -> None:
    """LambdaLR over ZeRO changes the lr every step; parameters and state equal one process."""
    case = verify.Case(model=model, optimizer="adamw", stage=stage, steps=4)
    engine = _zero(verify.make_model(model, case.seed), case)
    scheduler = torch.optim.lr_scheduler.LambdaLR(engine, _warmup_decay)
    verify.train_steps(engine, case, None, range(case.steps), scheduler=scheduler)
    ref_model, ref_opt = verify.run_reference(case, WORLD, lr_lambda=_warmup_decay)
    assert [g["lr"] for g in engine.param_groups] == [g["lr"] for g in ref_opt.param_groups]
    verify.compare(engine, ref_model, ref_opt, rtol=verify.RTOL["adamw"], label=f"LambdaLR stage {stage}")


def _check_closure(stage: int) -> None:
    """`step(closure)` runs the closure (zero_grad, forward, backward) and returns its loss."""
    case = verify.Case(model="gpt", optimizer="sgd_momentum", stage=stage)
    model = verify.make_model(case.model, case.seed)
    engine = _zero(model, case)
    for step in range(case.steps):
        def closure(step=step):
            engine.zero_grad()
            loss = verify.micro_batch_loss(model, seed=case.seed, step=step, rank=dist.get_rank())
            loss.backward()
            return loss

        loss = engine.step(closure)
        assert isinstance(loss, torch.Tensor) and loss.dim() == 0, f"step(closure) returned {loss!r}"
    verify.compare(engine, *verify.run_reference(case, WORLD), rtol=verify.RTOL["sgd_momentum"],
                   label=f"step(closure) stage {stage}")


def _check_grads_as_torch(stage: int) -> None:
    """Building leaves .grad as it is; zero_grad() sets every gradient to None, and
    zero_grad(set_to_none=False) zeroes them in place (as torch's optimizers do)."""
    case = verify.Case(model="mlp", optimizer="sgd_momentum", stage=stage)
    model = verify.make_model(case.model, case.seed)
    _zero(model, case)
    assert all(p.grad is None for p in model.parameters()), "building ZeRO gave parameters a .grad"
    model = verify.make_model(case.model, case.seed)
    verify.micro_batch_loss(model, seed=0, step=0, rank=0).backward()
    before = [p.grad.clone() for p in model.parameters()]
    engine = _zero(model, case)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), before)), "building ZeRO changed .grad"
    engine.zero_grad()
    verify.micro_batch_loss(model, seed=0, step=0, rank=dist.get_rank()).backward()
    engine.step()
    engine.zero_grad()
    assert all(p.grad is None for p in model.parameters()), "zero_grad() left a .grad"
    assert all(u.shard.grad is None for u in engine.units), "zero_grad() left a gradient shard"
    verify.micro_batch_loss(model, seed=0, step=1, rank=dist.get_rank()).backward()
    engine.step()
    engine.zero_grad(set_to_none=False)
    grads = [g for p in model.parameters() for g in (p.grad,) if g is not None]
    grads += [u.shard.grad for u in engine.units if u.shard.grad is not None]
    assert all(not g.any() for g in grads), "zero_grad(set_to_none=False) left a nonzero gradient"


def _check_from_parameters(stage: int) -> None:
    """Stages 0-2 built from the parameters (torch's param-group dicts), as torch's optimizers
    are: the parameters equal one process, and `state_dict()` is the plain optimizer's."""
    case = verify.Case(model="groups", optimizer="adamw", stage=stage)
    model = verify.make_model(case.model, case.seed)
    cls, kwargs = verify.OPTIMIZER_SETUPS[case.optimizer]
    engine = ZeRO(verify.param_groups(case.model, model), optimizer_class=cls, stage=stage,
                  bucket_cap_mb=case.bucket_cap_mb, **kwargs)
    for step in range(case.steps):
        engine.zero_grad()
        verify.micro_batch_loss(model, seed=case.seed, step=step, rank=dist.get_rank()).backward()
        engine.step()
    ref_model, ref_opt = verify.run_reference(case, WORLD)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        verify.assert_close(p.detach(), q.detach(), rtol=verify.RTOL["adamw"], what=f"parameter {name}")
    _assert_state_dicts_close(engine.state_dict(), ref_opt.state_dict(), rtol=verify.RTOL["adamw"])


def _check_state_dict_round_trip() -> None:
    """torch-shaped state_dict across stages and into a plain optimizer: stage 2 for K steps,
    saved; a plain AdamW and a stage 3 engine load it; the engine trains K more steps and equals
    one process that trained 2K steps."""
    k = 3
    case = verify.Case(model="gpt", optimizer="adamw", stage=2, steps=k)
    first = verify.run_zero(case)
    saved = first.state_dict()
    ref_model, ref_opt = verify.run_reference(case, WORLD)
    _assert_state_dicts_close(saved, ref_opt.state_dict(), rtol=verify.RTOL["adamw"])
    plain = torch.optim.AdamW(ref_model.parameters(), **verify.OPTIMIZER_SETUPS["adamw"][1])
    plain.load_state_dict(saved)
    _assert_state_dicts_close(plain.state_dict(), saved, rtol=0.0)
    model = verify.make_model(case.model, seed=99)  # other weights: they come from the first run
    model.load_state_dict(first.model.state_dict())  # stage 2: every rank holds the parameters whole
    resumed = verify.Case(model=case.model, optimizer="adamw", stage=3, steps=2 * k)
    engine = _zero(model, resumed, lr=0.5)  # the lr, too, comes from the state dict
    engine.load_state_dict(saved)
    verify.train_steps(engine, resumed, None, range(k, 2 * k))
    ref_model, ref_opt = verify.run_reference(resumed, WORLD)
    verify.compare(engine, ref_model, ref_opt, rtol=verify.RTOL["adamw"], label="resumed from state_dict")


def _check_add_param_group() -> None:
    """A group added after building (torch's fine-tuning pattern) trains as in a plain optimizer;
    bucket_cap_mb=None gives one flat unit per group."""
    case = verify.Case(model="mlp", optimizer="sgd_momentum", stage=1)
    model, ref = verify.make_model(case.model, case.seed), verify.make_model(case.model, case.seed)
    cls, kwargs = verify.OPTIMIZER_SETUPS[case.optimizer]
    engine = ZeRO(list(model[0].parameters()), optimizer_class=cls, stage=1, bucket_cap_mb=None, **kwargs)
    engine.add_param_group({"params": list(model[2].parameters()), "lr": 0.02})
    plain = cls(list(ref[0].parameters()), **kwargs)
    plain.add_param_group({"params": list(ref[2].parameters()), "lr": 0.02})
    assert len(engine.units) == 2 and [u.group_index for u in engine.units] == [0, 1]
    for step in range(case.steps):
        engine.zero_grad()
        verify.micro_batch_loss(model, seed=case.seed, step=step, rank=dist.get_rank()).backward()
        engine.step()
        plain.zero_grad()
        sum(verify.micro_batch_loss(ref, seed=case.seed, step=step, rank=r) for r in range(WORLD)).div(WORLD).backward()
        plain.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        verify.assert_close(p.detach(), q.detach(), rtol=verify.RTOL["sgd_momentum"], what=f"parameter {name}")
    _assert_state_dicts_close(engine.state_dict(), plain.state_dict(), rtol=verify.RTOL["sgd_momentum"])


def _assert_state_dicts_close(got: dict, want: dict, *, rtol: float) -> None:
    """Two optimizer state_dicts in torch's shape: the same groups (options and parameter
    numbers), the same state keys, tensors equal up to `rtol` (scale-aware)."""
    assert got["param_groups"] == want["param_groups"], (got["param_groups"], want["param_groups"])
    assert sorted(got["state"]) == sorted(want["state"]), (sorted(got["state"]), sorted(want["state"]))
    for index, state in want["state"].items():
        assert sorted(got["state"][index]) == sorted(state), (index, sorted(got["state"][index]), sorted(state))
        for key, value in state.items():
            verify.assert_close(got["state"][index][key], value, rtol=rtol, atol=0.0 if rtol == 0 else 1e-7,
                                what=f"state {key} of parameter {index}")


CHECKS = {
    **{f"LambdaLR stage {s} {m}": functools.partial(_check_scheduler, s, m)
       for s in STAGES for m in (("gpt", "groups") if s == 3 else ("groups",))},
    **{f"step(closure) stage {s}": functools.partial(_check_closure, s) for s in (1, 3)},
    **{f".grad as torch leaves it stage {s}": functools.partial(_check_grads_as_torch, s) for s in STAGES},
    **{f"built from parameters stage {s}": functools.partial(_check_from_parameters, s) for s in (0, 1, 2)},
    "torch-shaped state_dict: stage 2 -> plain AdamW and stage 3": _check_state_dict_round_trip,
    "add_param_group, one unit per group": _check_add_param_group,
}


def _rank_main(rank: int, world_size: int) -> dict[str, str | None]:
    results: dict[str, str | None] = {}
    for name, check in CHECKS.items():
        try:
            check()
            results[name] = None
        except AssertionError as exc:
            results[name] = f"rank {rank}: {exc}"
        except Exception:  # noqa: BLE001 - report with the traceback, keep the other checks running
            results[name] = f"rank {rank}: {traceback.format_exc(limit=4)}"
    return results


@functools.lru_cache(maxsize=None)
def _results() -> dict[str, str | None]:
    merged: dict[str, str | None] = {}
    for per_rank in spawn(_rank_main, WORLD, timeout_s=240):
        for name, error in per_rank.items():
            if merged.get(name) is None:
                merged[name] = error
    return merged


@pytest.mark.parametrize("name", list(CHECKS))
def test_zero_as_a_torch_optimizer(name: str) -> None:
    results = _results()
    assert name in results, f"check {name!r} did not run"
    assert results[name] is None, results[name]


def test_stage_3_needs_the_model_and_positional_options_are_refused() -> None:
    model = verify.make_model("mlp", 0)
    with pytest.raises(TypeError, match="stage 3 .* pass the model"):
        ZeRO(model.parameters(), optimizer_class=torch.optim.SGD, stage=3, lr=0.1)
    with pytest.raises(TypeError, match="positional"):
        ZeRO(model, torch.optim.SGD, 1)  # keyword-only after the model, as DataParallel
