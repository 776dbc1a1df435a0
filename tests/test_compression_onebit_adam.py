"""1-bit Adam (scaletrain.compression.onebit_adam) at p = 3 (n not divisible by p: padding):
the compressed allreduce against the formula written out on all ranks' gathered inputs, its exact
bytes, the telescoping of its two error memories, and the optimizer's two stages."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from scaletrain.comm import comm_counter
from scaletrain.compression import CompressedAllreduceState, OneBitAdam, compressed_allreduce, compressed_allreduce_bytes
from scaletrain.launch import spawn

pytestmark = pytest.mark.slow
N = 1001


def _gather(x):
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x.contiguous())
    return out


def _sign_compress(v: torch.Tensor) -> torch.Tensor:
    if v.numel() == 0:
        return v.clone()
    return v.abs().mean() * torch.where(v >= 0, 1.0, -1.0)


def _checks(rank: int, p: int) -> dict:
    res = {}
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(N, generator=gen)
    st = CompressedAllreduceState()
    with comm_counter() as c:
        out = compressed_allreduce(x.clone(), st)
    xs, cn = _gather(x), math.ceil(N / p)
    ref = torch.empty(N)
    for j in range(p):  # the formula: server j averages every worker's 1-bit chunk j, compresses again
        lo, hi = j * cn, min(N, (j + 1) * cn)
        z = sum(_sign_compress(xw[lo:hi]) for xw in xs) / p
        ref[lo:hi] = _sign_compress(z)
    res["first"] = dict(err=(out - ref).abs().max().item(), bytes=c.bytes_sent,
                        expected=compressed_allreduce_bytes(N, p), fp32=2 * (p - 1) * 4 * cn)
    # many steps: Σ(out − mean) = −(mean worker error + server error), chunk by chunk
    st, acc = CompressedAllreduceState(), torch.zeros(N)
    drift = torch.linspace(-1, 1, N)
    norms = []
    for t in range(150):
        g = drift + torch.randn(N, generator=gen)
        mean = g.clone()
        dist.all_reduce(mean)
        out = compressed_allreduce(g, st)
        acc += out - mean / p
        norms.append(st.worker_error.norm().item() + st.server_error.norm().item())
    ew = st.worker_error.clone()
    dist.all_reduce(ew)
    es = torch.cat(_gather(st.server_error))
    res["telescope"] = (acc + (ew / p + es)[:N]).abs().max().item()
    res["norms"] = norms
    res["agree"] = max((o - out).abs().max().item() for o in _gather(out))
    # the optimizer: warm-up = Adam without bias correction on the mean gradient; then v frozen
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    ref_params = [q.detach().clone() for q in model.parameters()]
    m_ref = [torch.zeros_like(q) for q in ref_params]
    v_ref = [torch.zeros_like(q) for q in ref_params]
    opt = OneBitAdam(model.parameters(), lr=0.01, betas=(0.9, 0.99), eps=1e-8, warmup_steps=3)
    warm_err, agree, v_frozen = 0.0, 0.0, True
    for t in range(1, 8):
        xb = torch.randn(4, 6, generator=gen)
        model.zero_grad()
        model(xb).square().mean().backward()
        grads = [q.grad.clone() for q in model.parameters()]
        v_before = [opt.state[q]["exp_avg_sq"].clone() for q in model.parameters()] if t > 1 else None
        opt.step()
        if t <= 3:
            for i, g in enumerate(grads):
                gm = g.clone()
                dist.all_reduce(gm)
                gm /= p
                m_ref[i] = 0.9 * m_ref[i] + 0.1 * gm
                v_ref[i] = 0.99 * v_ref[i] + 0.01 * gm * gm
                ref_params[i] = ref_params[i] - 0.01 * m_ref[i] / (v_ref[i].sqrt() + 1e-8)
            warm_err = max(warm_err, max((q.detach() - r).abs().max().item()
                                         for q, r in zip(model.parameters(), ref_params)))
        else:
            v_frozen &= all(torch.equal(opt.state[q]["exp_avg_sq"], vb) for q, vb in zip(model.parameters(), v_before))
        flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
        agree = max(agree, max((f - flat).abs().max().item() for f in _gather(flat)))
    res.update(warm_err=warm_err, params_agree=agree, v_frozen=v_frozen)
    res.update(_bias_corrected(gen, p))
    return res


def _bias_corrected(gen, p: int) -> dict:
    """bias_correction=True: the warm-up is torch's own Adam on the mean gradient; afterwards the step
    is m/(1−β₁^t) over √(v_Tw/(1−β₂^Tw)), v̂ frozen at what Adam used at step T_w."""
    torch.manual_seed(1)
    model = nn.Linear(6, 3)
    twin = nn.Linear(6, 3)
    twin.load_state_dict(model.state_dict())
    opt = OneBitAdam(model.parameters(), lr=0.01, betas=(0.9, 0.99), eps=1e-8, warmup_steps=3, bias_correction=True)
    ref = torch.optim.Adam(twin.parameters(), lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    warm_err, after_err = 0.0, 0.0
    for t in range(1, 6):
        xb = torch.randn(4, 6, generator=gen)
        for m in (model, twin):
            m.zero_grad()
            m(xb).square().mean().backward()
        for q in twin.parameters():  # torch's Adam steps on the mean gradient
            dist.all_reduce(q.grad)
            q.grad /= p
        before = [q.detach().clone() for q in model.parameters()]
        opt.step()
        if t <= 3:
            ref.step()
            warm_err = max(warm_err, max((a.detach() - b.detach()).abs().max().item()
                                         for a, b in zip(model.parameters(), twin.parameters())))
        else:  # the update from the optimizer's own state: m̂ over the frozen v̂
            for q, b in zip(model.parameters(), before):
                st = opt.state[q]
                step = st["exp_avg"] / (1 - 0.9 ** t) / ((st["exp_avg_sq"] / (1 - 0.99 ** 3)).sqrt() + 1e-8)
                after_err = max(after_err, (b - 0.01 * step - q.detach()).abs().max().item())
    return dict(bc_warm_err=warm_err, bc_after_err=after_err)


@pytest.fixture(scope="module")
def results():
    return spawn(_checks, 3, timeout_s=180)


def test_compressed_allreduce_equals_formula_and_sends_its_bytes(results):
    for res in results:
        f = res["first"]
        assert f["err"] < 1e-5, f
        assert f["bytes"] == f["expected"] == 2 * 2 * 4 * (math.ceil(334 / 32) + 1)
        assert f["fp32"] / f["bytes"] > 20  # ≈ 32× fewer than the fp32 ring at this size


def test_compressed_allreduce_error_compensation_telescopes_and_stays_bounded(results):
    for res in results:
        assert res["telescope"] < 1e-3, res["telescope"]
        n = res["norms"]
        assert max(n[len(n) // 2:]) < 2 * max(n[: len(n) // 2])
        assert res["agree"] == 0.0


def test_onebit_adam_warmup_is_adam_then_variance_frozen(results):
    for res in results:
        assert res["warm_err"] < 1e-6, res["warm_err"]
        assert res["v_frozen"]
        assert res["params_agree"] == 0.0


def test_onebit_adam_bias_corrected_warmup_is_torch_adam_then_its_frozen_v_hat(results):
    for res in results:
        assert res["bc_warm_err"] < 1e-6, res["bc_warm_err"]
        assert res["bc_after_err"] < 1e-6, res["bc_after_err"]
