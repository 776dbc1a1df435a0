"""Module 8 (scaletrain.compression): PowerSGD and 1-bit compression with error feedback, LAMB.

Distributed checks run in one spawn at p = 2 (gloo), every check inside it; the references are
independent: a direct low-rank computation with torch.linalg.qr on all ranks' gathered inputs,
torch's own powerSGD_hook (torch.distributed.algorithms.ddp_comm_hooks) for bytes and result, the
closed-form byte counts, and LAMB written out as a formula.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from scaletrain.comm import comm_counter
from scaletrain.compression import (LAMB, OneBitEF, PowerSGD, compressed_data_parallel, onebit_bytes,
                                    orthogonalize, pack_signs, powersgd_payloads, unpack_signs)
from scaletrain.launch import spawn

SHAPES = [torch.Size((16, 12)), torch.Size((7,)), torch.Size((20, 10))]
N = sum(math.prod(s) for s in SHAPES)


def _ring_bytes(numel: int, p: int) -> int:
    return 2 * (p - 1) * math.ceil(numel / p) * 4


def _gather(x: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return out


def _orth_qr(a: torch.Tensor) -> torch.Tensor:
    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


def _check_direct(rank: int, p: int) -> dict:
    """PowerSGD's output and new error = a direct low-rank computation plus error feedback."""
    r = 2
    gen = torch.Generator().manual_seed(100 + rank)
    g, e = torch.randn(N, generator=gen), 0.1 * torch.randn(N, generator=gen)
    hook = PowerSGD(rank=r)
    hook.errors[0] = e.clone()
    qgen = torch.Generator().manual_seed(7)
    q0 = {0: torch.randn(12, r, generator=qgen), 2: torch.randn(10, r, generator=qgen)}
    hook.q_memory[0] = [q0[0].clone(), q0[2].clone()]
    with comm_counter() as c:
        out = hook.reduce(0, g.clone(), SHAPES)
    xs = _gather(g + e)
    ref = torch.empty(N)
    o = 0
    for k, shape in enumerate(SHAPES):
        numel = math.prod(shape)
        parts = [x[o:o + numel] for x in xs]
        if k in q0:
            ms = [t.view(shape[0], -1) for t in parts]
            p_hat = _orth_qr(sum(m @ q0[k] for m in ms))
            q_bar = sum(m.t() @ p_hat for m in ms) / p
            ref[o:o + numel] = (p_hat @ q_bar.t()).reshape(-1)
        else:
            ref[o:o + numel] = sum(parts) / p
        o += numel
    payloads = powersgd_payloads(SHAPES, r)
    return dict(out_err=(out - ref).abs().max().item(),
                e_err=(hook.errors[0] - (g + e - ref)).abs().max().item(),
                payloads=payloads, expected_payloads=[7, (16 + 20) * r, (12 + 10) * r],
                bytes=c.bytes_sent, expected_bytes=sum(_ring_bytes(n, p) for n in payloads))


def _track(hook, steps: int, rank: int) -> dict:
    """Σ_t (compressed_t − true mean_t) and the error memory's norm over `steps` steps."""
    gen = torch.Generator().manual_seed(1000 + rank)
    drift = torch.linspace(-1, 1, N)  # a consistent direction that sign/low-rank compression bias
    acc_diff, acc_mean, e_norms = torch.zeros(N), torch.zeros(N), []
    for t in range(steps):
        g = drift + torch.randn(N, generator=gen)
        mean = g.clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        out = hook.reduce(0, g, SHAPES)
        acc_diff += out - mean
        acc_mean += mean
        if hook.error_feedback:
            e_norms.append(hook.errors[0].norm().item())
    res = dict(bias=acc_diff.norm().item() / acc_mean.norm().item(), e_norms=e_norms)
    if hook.error_feedback:  # telescoping: Σ(out − mean) = −mean_w e_w,T
        e_mean = hook.errors[0].clone()
        dist.all_reduce(e_mean)
        res["telescope_err"] = (acc_diff + e_mean / dist.get_world_size()).abs().max().item()
    return res


class _FakeBucket:
    """The part of dist.GradBucket that torch's powerSGD_hook uses."""

    def __init__(self, flat: torch.Tensor, shapes):
        self._flat, self._shapes = flat, shapes

    def buffer(self):
        return self._flat

    def gradients(self):
        out, o = [], 0
        for s in self._shapes:
            out.append(self._flat[o:o + math.prod(s)].view(s))
            o += math.prod(s)
        return out

    def index(self):
        return 0

    def is_last(self):
        return True


def _check_torch(rank: int, p: int, r: int) -> dict:
    """Payloads (and so ring bytes) and the result of our hook vs torch's powerSGD_hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ph

    state = ph.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                             use_error_feedback=True, warm_start=True, random_seed=0)
    gen = torch.Generator().manual_seed(50 + rank)
    grads = [torch.randn(N, generator=gen) for _ in range(4)]
    for t in range(2):  # torch's two vanilla iterations
        ph.powerSGD_hook(state, _FakeBucket(grads[t].clone(), SHAPES)).wait()
    logged: list[int] = []
    real = dist.all_reduce

    def logging_all_reduce(tensor, *a, **kw):
        if tensor.numel():
            logged.append(tensor.numel())
        return real(tensor, *a, **kw)

    dist.all_reduce = logging_all_reduce
    try:
        ph.powerSGD_hook(state, _FakeBucket(grads[2].clone(), SHAPES)).wait()
    finally:
        dist.all_reduce = real
    ours = PowerSGD(rank=r)
    sent: list[int] = []

    def counted(t):
        from scaletrain.comm import ring_allreduce
        sent.append(t.numel())
        ring_allreduce(t, op="sum")

    ours.allreduce = counted
    # the same state as torch's after its first compressed step: error memory and warm Q
    ours.errors[0] = state.error_dict[0].clone()
    qs, o = [], 0
    for s in SHAPES:
        n, m = s[0], math.prod(s) // s[0]
        rr = min(n, m, r)
        if len(s) > 1 and (n + m) * rr * state.min_compression_rate < n * m:
            qs.append(state.q_memory_dict[0][o:o + m * rr].view(m, rr).clone())
            o += m * rr
    ours.q_memory[0] = qs
    ours.steps[0] = 1
    with comm_counter() as c:
        mine = ours.reduce(0, grads[3].clone(), SHAPES)
    theirs = ph.powerSGD_hook(state, _FakeBucket(grads[3].clone(), SHAPES)).wait()
    return dict(torch_payloads=logged, our_payloads=sent, bytes=c.bytes_sent,
                torch_ring_bytes=sum(_ring_bytes(n, p) for n in logged),
                result_err=(mine - theirs).abs().max().item() / theirs.abs().max().item(),
                error_err=(ours.errors[0] - state.error_dict[0]).abs().max().item())


def _check_onebit(rank: int, p: int) -> dict:
    gen = torch.Generator().manual_seed(300 + rank)
    res = {}
    for chunk in (None, 100):
        x = torch.randn(N, generator=gen)
        hook = OneBitEF(chunk_numel=chunk)
        with comm_counter() as c:
            out = hook.reduce(0, x.clone())
        xs = _gather(x)
        ref = torch.zeros(N)
        for xw in xs:  # the formula: mean over ranks of scale_chunk · sign
            k = 1 if chunk is None else math.ceil(N / chunk)
            size = math.ceil(N / k)
            for j in range(k):
                seg = xw[j * size:(j + 1) * size]
                ref[j * size:(j + 1) * size] += seg.abs().mean() * torch.where(seg >= 0, 1.0, -1.0)
        ref /= p
        res[chunk] = dict(bytes=c.bytes_sent, expected=onebit_bytes(N, p, chunk),
                          out_err=(out - ref).abs().max().item())
    return res


def _check_data_parallel(rank: int, p: int) -> dict:
    """compressed_data_parallel: gradients agree across ranks; a rank that compresses nothing
    gives DataParallel's exact mean."""
    from scaletrain.dp import DataParallel

    res = {}
    torch.manual_seed(0)
    x = torch.randn(8, 24, generator=torch.Generator().manual_seed(rank))
    base = DataParallel(nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 4)), bucket_cap_mb=None,
                        allreduce="torch")
    base(x).square().sum().backward()
    base.finish_gradient_synchronization()
    for name, hook in (("powersgd_full", PowerSGD(rank=64)), ("powersgd_r1", PowerSGD(rank=1)),
                       ("onebit", OneBitEF())):
        torch.manual_seed(0)
        model = compressed_data_parallel(nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 4)), hook,
                                         bucket_cap_mb=0.002)
        for a, b in zip(model.parameters(), base.parameters()):
            a.data.copy_(b.data)
        model(x).square().sum().backward()
        model.finish_gradient_synchronization()
        flat = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
        gathered = _gather(flat)
        ref = torch.cat([q.grad.reshape(-1) for q in base.parameters()])
        res[name] = dict(agree=max((g - flat).abs().max().item() for g in gathered),
                         vs_mean=((flat - ref).norm() / ref.norm()).item(), buckets=len(model.buckets))
        model.close()
    base.close()
    return res


def _all_checks(rank: int, p: int) -> dict:
    return dict(
        direct=_check_direct(rank, p),
        torch_r1=_check_torch(rank, p, 1), torch_r4=_check_torch(rank, p, 4),
        onebit=_check_onebit(rank, p),
        psgd_ef=_track(PowerSGD(rank=1), 200, rank), psgd_noef=_track(PowerSGD(rank=1, error_feedback=False), 200, rank),
        sign_ef=_track(OneBitEF(), 200, rank), sign_noef=_track(OneBitEF(error_feedback=False), 200, rank),
        dp=_check_data_parallel(rank, p),
    )


@pytest.fixture(scope="module")
def results():
    return spawn(_all_checks, 2, timeout_s=180)


def test_orthogonalize_matches_qr():
    a = torch.randn(30, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(orthogonalize(a.clone(), eps=0.0), _orth_qr(a))


def test_pack_unpack_signs_roundtrip():
    x = torch.randn(101, generator=torch.Generator().manual_seed(1))
    x[5] = 0.0
    words = pack_signs(x)
    assert words.dtype == torch.int32 and words.numel() == 4
    assert torch.equal(unpack_signs(words, 101), torch.where(x >= 0, 1.0, -1.0))


@pytest.mark.slow
def test_powersgd_equals_direct_low_rank_plus_error_feedback(results):
    for res in results:
        d = res["direct"]
        assert d["out_err"] < 1e-5, d
        assert d["e_err"] < 1e-5, d
        assert d["payloads"] == d["expected_payloads"]
        assert d["bytes"] == d["expected_bytes"]


@pytest.mark.slow
@pytest.mark.parametrize("r", [1, 4])
def test_powersgd_sends_torch_hooks_payloads_and_matches_its_result(results, r):
    for res in results:
        t = res[f"torch_r{r}"]
        assert t["our_payloads"] == t["torch_payloads"], t
        assert t["bytes"] == t["torch_ring_bytes"], t
        assert t["result_err"] < 1e-4, t
        assert t["error_err"] < 1e-4, t


def _check_torch_both_ranks(rank: int, p: int) -> dict:
    return {r: _check_torch(rank, p, r) for r in (1, 4)}


@pytest.mark.slow
def test_powersgd_matches_torch_hook_on_three_ranks():
    """The same comparison on 3 ranks: payloads that p does not divide, a mean over an odd count
    (the benchmark trains at p = 4, where the gap to Adam is larger than at p = 2: not a p-dependent
    slip of ours, this test says)."""
    for res in spawn(_check_torch_both_ranks, 3, timeout_s=120):
        for r, t in res.items():
            assert t["our_payloads"] == t["torch_payloads"] and t["bytes"] == t["torch_ring_bytes"], (r, t)
            assert t["result_err"] < 1e-4 and t["error_err"] < 1e-4, (r, t)


@pytest.mark.slow
def test_onebit_sends_exact_formula_bytes_and_mean_of_signs(results):
    for res in results:
        for chunk, o in res["onebit"].items():
            assert o["bytes"] == o["expected"], (chunk, o)
            assert o["out_err"] < 1e-5, (chunk, o)
    assert onebit_bytes(1024, 2) == 4 * (32 + 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["psgd", "sign"])
def test_error_feedback_bounded_and_mean_tracked(results, name):
    for res in results:
        ef, noef = res[f"{name}_ef"], res[f"{name}_noef"]
        assert ef["telescope_err"] < 1e-3, ef["telescope_err"]
        e = ef["e_norms"]
        assert max(e[len(e) // 2:]) < 2 * max(e[: len(e) // 2]), "error memory keeps growing"
        assert ef["bias"] < 0.05, ef["bias"]
        assert noef["bias"] > 4 * ef["bias"], (noef["bias"], ef["bias"])


@pytest.mark.slow
def test_compressed_data_parallel(results):
    for res in results:
        for name, d in res["dp"].items():
            assert d["agree"] == 0.0, (name, d)
            assert d["buckets"] > 1
        assert res["dp"]["powersgd_full"]["vs_mean"] < 1e-5
        assert 0 < res["dp"]["powersgd_r1"]["vs_mean"] < 1.5


def _lamb_reference(params, grads_per_step, lr, betas, eps, wd):
    xs = [p.clone() for p in params]
    ms = [torch.zeros_like(p) for p in params]
    vs = [torch.zeros_like(p) for p in params]
    out = []
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            ms[i] = betas[0] * ms[i] + (1 - betas[0]) * g
            vs[i] = betas[1] * vs[i] + (1 - betas[1]) * g * g
            u = (ms[i] / (1 - betas[0] ** t)) / ((vs[i] / (1 - betas[1] ** t)).sqrt() + eps) + wd * xs[i]
            wn, un = xs[i].norm(), u.norm()
            trust = wn / un if wn > 0 and un > 0 else 1.0
            xs[i] = xs[i] - lr * trust * u
        out.append([x.clone() for x in xs])
    return out


def test_lamb_equals_reference_formula_step_by_step():
    gen = torch.Generator().manual_seed(3)
    init = [torch.randn(5, 4, generator=gen, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)]
    grads = [[torch.randn(5, 4, generator=gen, dtype=torch.float64), torch.randn(4, generator=gen, dtype=torch.float64)]
             for _ in range(6)]
    params = [nn.Parameter(x.clone()) for x in init]
    opt = LAMB(params, lr=0.05, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)
    ref = _lamb_reference(init, grads, 0.05, (0.9, 0.99), 1e-6, 0.01)
    for step, gs in enumerate(grads):
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()
        for p, r in zip(params, ref[step]):
            torch.testing.assert_close(p.detach(), r, rtol=1e-12, atol=1e-12)
    assert opt.state[params[1]]["step"] == 6
