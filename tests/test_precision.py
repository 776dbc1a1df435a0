"""scaletrain.precision against torch's own: GradScaler's scale trajectory, plain fp32 training,
torch.amp autocast, and fp16's closed-form thresholds."""

import copy
import random

import pytest
import torch

from scaletrain.models import GPT, MLP, GPTConfig, make_batch
from scaletrain.precision import DynamicLossScaler, MixedPrecision, cast_report, half_backward_report, to_float32

SMALL = GPTConfig(vocab_size=61, block_size=12, n_layer=1, n_head=3, n_embd=24)


def _trajectories(overflows, **kw):
    """Run our scaler and torch.amp.GradScaler("cpu") on the same gradients: scale after each step
    and whether the parameter moved, for both."""
    ours, theirs = DynamicLossScaler(**kw), torch.amp.GradScaler("cpu", **kw)
    p_ours, p_theirs = torch.nn.Parameter(torch.ones(5)), torch.nn.Parameter(torch.ones(5))
    opt_ours, opt_theirs = torch.optim.SGD([p_ours], lr=0.5), torch.optim.SGD([p_theirs], lr=0.5)
    got, want = [], []
    for step, bad in enumerate(overflows):
        g = torch.linspace(-1, 1, 5) * (step + 1)
        if bad:
            g[step % 5] = random.Random(step).choice([float("inf"), float("-inf"), float("nan")])
        theirs.scale(torch.ones(()))                  # GradScaler allocates its scale lazily here
        p_theirs.grad = g * theirs.get_scale()
        before = p_theirs.detach().clone()
        theirs.step(opt_theirs)
        theirs.update()
        want.append((theirs.get_scale(), not torch.equal(before, p_theirs.detach())))

        p_ours.grad = g * ours.scale
        before = p_ours.detach().clone()
        found = ours.unscale_([p_ours.grad])
        if not found:
            opt_ours.step()
        ours.update(found)
        got.append((ours.scale, not torch.equal(before, p_ours.detach())))
    return got, want


@pytest.mark.parametrize("kw", [
    dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=3),
    dict(init_scale=1000.0, growth_factor=1.5, backoff_factor=0.3, growth_interval=2),   # products round to float32
    dict(init_scale=3e38, growth_factor=2.0, backoff_factor=0.5, growth_interval=1),     # growth would overflow float32
    dict(init_scale=1.0, growth_factor=7.0, backoff_factor=0.125, growth_interval=5),
])
def test_scale_trajectory_equals_grad_scaler(kw):
    for trial in range(4):
        rng = random.Random(trial)
        overflows = [rng.random() < 0.3 for _ in range(40)]
        got, want = _trajectories(overflows, **kw)
        assert got == want, f"{kw}, overflow pattern {overflows}"


def test_scale_backs_off_and_grows_in_closed_form():
    s = DynamicLossScaler(init_scale=2.0**16, growth_interval=4)
    s.update(True)
    assert s.scale == 2.0**15 and s.growth_tracker == 0
    for _ in range(4):
        s.update(False)
    assert s.scale == 2.0**16 and s.growth_tracker == 0
    assert to_float32(0.1) == torch.tensor(0.1, dtype=torch.float32).item()


def test_unscale_divides_every_gradient_and_checks_all_of_them():
    s = DynamicLossScaler(init_scale=8.0)
    a, b = torch.tensor([8.0, -16.0]), torch.tensor([4.0])
    assert not s.unscale_([a, None, b])
    assert torch.equal(a, torch.tensor([1.0, -2.0])) and torch.equal(b, torch.tensor([0.5]))
    for bad in (float("inf"), float("nan")):
        assert s.unscale_([torch.ones(3), torch.tensor([1.0, bad])]), f"{bad} in the last gradient must be found"


def test_bad_scaler_settings_raise():
    for kw in (dict(init_scale=0.0), dict(init_scale=float("inf")), dict(growth_factor=1.0),
               dict(backoff_factor=1.0), dict(growth_interval=0), dict(growth_interval=2.5)):
        with pytest.raises(ValueError, match="DynamicLossScaler"):
            DynamicLossScaler(**kw)


def test_disabled_scaler_is_the_bf16_path():
    s = DynamicLossScaler(init_scale=2.0**16, enabled=False)
    assert s.scale == 1.0
    s.update(True)
    assert s.scale == 1.0
    loss = torch.tensor(3.0, dtype=torch.bfloat16)
    assert s.scale_loss(loss) is loss


def test_fp32_master_path_equals_plain_torch_training():
    """dtype=float32 turns mixed precision off: the wrapper must then be exactly torch's loop."""
    base = GPT(SMALL, seed=3)
    mp = MixedPrecision(copy.deepcopy(base), torch.optim.AdamW, dtype=torch.float32, lr=1e-2)
    ref = copy.deepcopy(base)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(3):
        idx, tgt = make_batch(SMALL, 3, seed=step, seq_len=11)
        mp.backward(mp.model(idx, tgt)[1])
        assert mp.step()
        ref(idx, tgt)[1].backward()
        opt.step()
        opt.zero_grad()
    for p, q in zip(mp.model.parameters(), ref.parameters()):
        assert torch.equal(p, q)


def test_master_weights_keep_updates_too_small_for_fp16():
    """lr·g = 1e-4 is below half an fp16 ulp of 1.0 (2^-11 ≈ 4.9e-4): a pure fp16 weight never moves,
    the fp32 master accumulates 20 of them (closed form: 1 − 20e-4) and the fp16 copy follows."""
    lin = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    mp = MixedPrecision(lin, torch.optim.SGD, dtype=torch.float16, lr=1e-4, scaler=dict(init_scale=1024.0))
    pure = torch.ones(1, dtype=torch.float16)
    for _ in range(20):
        mp.backward(mp.model.weight.sum())           # dL/dw = 1
        assert mp.step()
        pure -= torch.tensor(1e-4, dtype=torch.float16)
    assert pure.item() == 1.0
    assert mp.master[0].item() == pytest.approx(1 - 20e-4, rel=1e-6)
    assert mp.model.weight.dtype == torch.float16
    assert mp.model.weight.item() == torch.tensor(1 - 20e-4).half().item()


def test_fp16_training_follows_torch_amp_and_skips_overflowed_steps():
    """16-bit model + master vs autocast + GradScaler on the same batches: losses agree to fp16
    accuracy; an inf planted in one step's gradient is skipped by both and backs both scales off."""
    base = GPT(SMALL, seed=1)
    kw = dict(init_scale=2.0**8, growth_interval=3)
    mp = MixedPrecision(copy.deepcopy(base), torch.optim.AdamW, dtype=torch.float16, scaler=kw, lr=3e-3)
    ref = copy.deepcopy(base)
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    gs = torch.amp.GradScaler("cpu", **kw)
    poison = 4
    for step in range(8):
        idx, tgt = make_batch(SMALL, 4, seed=step)
        loss = mp.model(idx, tgt)[1]
        mp.backward(loss)
        if step == poison:
            mp.params[0].grad[0, 0] = float("inf")
        mp.step()
        with torch.autocast("cpu", dtype=torch.float16):
            ref_loss = ref(idx, tgt)[1]
        gs.scale(ref_loss).backward()
        if step == poison:
            next(ref.parameters()).grad[0, 0] = float("inf")
        gs.step(opt)
        gs.update()
        opt.zero_grad()
        assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-2), f"step {step}"
        assert mp.scaler.scale == gs.get_scale(), f"step {step}"
    assert mp.skipped_steps == [poison]


def test_bf16_path_never_scales_and_tracks_autocast():
    base = GPT(SMALL, seed=2)
    mp = MixedPrecision(copy.deepcopy(base), torch.optim.SGD, dtype=torch.bfloat16, lr=0.1)
    assert mp.scaler.scale == 1.0 and not mp.scaler.enabled
    idx, tgt = make_batch(SMALL, 4)
    loss = mp.model(idx, tgt)[1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = copy.deepcopy(base)(idx, tgt)[1]
    assert loss.dtype == torch.bfloat16
    assert loss.item() == pytest.approx(ref.item(), rel=2e-2)
    mp.backward(loss)
    assert mp.step() and mp.master[0].dtype == torch.float32


def test_mixed_precision_rejects_bad_input():
    with pytest.raises(ValueError, match="dtype"):
        MixedPrecision(MLP([2, 2]), torch.optim.SGD, dtype=torch.int8, lr=0.1)
    with pytest.raises(ValueError, match="fp32"):
        MixedPrecision(MLP([2, 2]).half(), torch.optim.SGD, lr=0.1)


def test_cast_report_thresholds_in_closed_form():
    """fp16: 2^-25 rounds to 0, 2^-20 is subnormal, 2^17 overflows; S = 2^12 rescues the first
    two; bf16 loses none of them."""
    v = torch.tensor([2.0**-25, 2.0**-20, 1.0, 2.0**17, 0.0])
    r = cast_report(v, torch.float16)
    assert (r.lost, r.subnormal, r.overflow, r.count) == (0.25, 0.25, 0.25, 4)
    r = cast_report(v[:3], torch.float16, scale=2.0**12)
    assert (r.lost, r.subnormal, r.overflow) == (0.0, 0.0, 0.0)
    r = cast_report(v, torch.bfloat16)
    assert (r.lost, r.subnormal, r.overflow) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="every element is 0"):
        cast_report(torch.zeros(3))
    with pytest.raises(ValueError, match="scale"):
        cast_report(v, scale=-1.0)


def test_real_fp16_backward_loses_gradient_that_scaling_recovers():
    """On the tiny GPT, a plain fp16 backward zeroes some non-zero gradient elements; S = 2^8
    loses fewer and is closer to fp32; S = 2^16 overflows (why the scale must be dynamic)."""
    cfg = GPTConfig(n_layer=2)
    model = GPT(cfg)
    idx, tgt = make_batch(cfg, 8)
    plain = half_backward_report(model, idx, tgt, torch.float16, scale=1.0)
    scaled = half_backward_report(model, idx, tgt, torch.float16, scale=2.0**8)
    huge = half_backward_report(model, idx, tgt, torch.float16, scale=2.0**16)
    assert plain.lost > 0 and scaled.lost < plain.lost
    assert scaled.rel_error < plain.rel_error
    assert huge.nonfinite > 0
    bf16 = half_backward_report(model, idx, tgt, torch.bfloat16)
    assert bf16.nonfinite == 0 and bf16.lost < plain.lost
