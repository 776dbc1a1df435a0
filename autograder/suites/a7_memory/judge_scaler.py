"""a7 task 7.1's verdicts: the student's scale trajectory against torch.amp.GradScaler on the same
overflow patterns, and a real fp16 run against the same run with the reference scaler."""

from __future__ import annotations

from autograder import checks
from autograder.suites import paired

from .inputs import FP16_CONFIG, FP16_SETTINGS, _scaler_trials
from .names import C_ODD, C_SCALE, C_SKIP, PROBE


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


def _reference_fp16(steps: int, poison: list[int], seed: int) -> dict:
    import torch

    from scaletrain.models import GPT, GPTConfig
    from scaletrain.precision.master import MixedPrecision, train_with_overflows

    torch.set_num_threads(1)   # the probe too: the same summation order, bitwise the same parameters
    cfg = GPTConfig(**FP16_CONFIG)
    mp = MixedPrecision(GPT(cfg, seed=seed), torch.optim.SGD, dtype=torch.float16, lr=0.05, scaler=FP16_SETTINGS)
    return train_with_overflows(mp, cfg, steps=steps, poison=poison, seed=seed)


def start_worker(ctx) -> None:
    """Start the worker before this side runs torch's optimizers: importing torch._dynamo sets
    TORCHINDUCTOR_CACHE_DIR to this group's folder, which a later worker would inherit and could not
    write (its `import torch._dynamo`, by any optimizer, then fails)."""
    ctx.untrusted().start()


def group_scaler(ctx):
    start_worker(ctx)
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
