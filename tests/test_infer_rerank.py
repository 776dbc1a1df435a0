"""Retrieve and re-rank (scaletrain.infer.rerank, kernels/retrieve_rerank_triton.py) against torch.topk
and a stable descending sort on hidden-style random rows (ties, -inf, every k <= groups <= V), on
LightSeq's worked example, and the elements re-ranked counted against V per row. The Triton kernel
runs on CPU through the interpreter, in a worker started with TRITON_INTERPRET=1, is compiled for
sm_80 without a GPU (the real pipeline, which rejects code the interpreter accepts), and runs on CUDA
where there is one (gpu marker)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from scaletrain.infer import beam_topk, candidates, retrieve_rerank, rough_threshold
from scaletrain.infer.rerank import group_ids
from scaletrain.ops.toolchain.isolated import IsolatedWorker

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton package is not installed (Linux x86-64 only)")

# LightSeq lecture, "Retrieve": beam size 2, vocabulary 8, two groups of four per beam
LIGHTSEQ = torch.tensor([[2, 4, 2, 4, 3, 5, 1, 2],
                         [1, 3, 7, 4, 1, 5, 8, 6]], dtype=torch.float32)


def hidden_cases(n: int = 60, seed: int = 1234, max_rows: int = 5, max_V: int = 70, max_k: int = 70):
    """(x, k, groups): rows 1-max_rows, V 1-max_V, 1 <= k <= min(V, max_k), k <= groups <= V; a third of them tie-heavy (few
    distinct values), some with -inf entries (masked logits), the rest continuous."""
    g = torch.Generator().manual_seed(seed)
    for case in range(n):
        rows = int(torch.randint(1, max_rows + 1, (1,), generator=g))
        V = int(torch.randint(1, max_V + 1, (1,), generator=g))
        k = int(torch.randint(1, min(V, max_k) + 1, (1,), generator=g))
        groups = k if case % 2 else int(torch.randint(k, V + 1, (1,), generator=g))
        if case % 3 == 0:
            x = torch.randint(0, 4, (rows, V), generator=g).float()
        else:
            x = torch.randn(rows, V, generator=g)
        if case % 5 == 0:
            x[torch.rand(rows, V, generator=g) < 0.3] = float("-inf")
        yield x, k, groups


def check_topk(values, indices, x, k, what):
    """Values as torch.topk's; indices those of a stable descending sort (ties: lowest index first)."""
    ref = x.sort(dim=1, descending=True, stable=True)
    assert torch.equal(values, torch.topk(x, k, dim=1).values), f"{what}: values differ from torch.topk"
    assert torch.equal(indices, ref.indices[:, :k]), f"{what}: indices differ from the stable sort's"


def test_lightseq_worked_example():
    assert group_ids(8, 2).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert rough_threshold(LIGHTSEQ, 2).tolist() == [4.0, 7.0]  # min of the group maxima (4,5) and (7,8)
    mask = candidates(LIGHTSEQ, 2)
    assert mask.nonzero().tolist() == [[0, 1], [0, 3], [0, 5], [1, 2], [1, 6]]  # "re-rank only on five logits"
    values, indices = retrieve_rerank(LIGHTSEQ, 2)
    assert values.tolist() == [[5, 4], [8, 7]] and indices.tolist() == [[5, 1], [6, 2]]
    values, flat = beam_topk(LIGHTSEQ, 2)  # across both beams: 8 (beam 1, token 6), 7 (beam 1, token 2)
    assert values.tolist() == [8, 7] and flat.tolist() == [14, 10]


def test_equals_torch_topk_on_hidden_inputs():
    for i, (x, k, groups) in enumerate(hidden_cases()):
        check_topk(*retrieve_rerank(x, k, groups=groups), x, k, f"case {i}: V={x.shape[1]} k={k} groups={groups}")


def test_beam_topk_equals_topk_over_all_beams():
    for i, (x, k, groups) in enumerate(hidden_cases(seed=99)):
        k = min(k * x.shape[0], x.numel())  # survivors may exceed one beam's V
        values, flat = beam_topk(x, k)
        check_topk(values[None], flat[None], x.flatten()[None], k, f"case {i}: beams={x.shape[0]} k={k}")


def test_retrieval_keeps_at_least_k_and_few_more_on_logits():
    for x, k, groups in hidden_cases():
        kept = candidates(x, k, groups).sum(1)
        assert (kept >= k).all() and (kept <= x.shape[1]).all()
    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(0))  # beams 4, V 5000
    kept = int(candidates(logits, 4).sum())
    assert kept < 4 * 5000 / 100, f"{kept} re-ranked of k·V = 20000: the retrieval should prune"


def test_rejects_k_above_groups():
    with pytest.raises(ValueError, match="k <= groups <= V"):
        retrieve_rerank(torch.zeros(2, 8), 3, groups=2)


def triton_cases() -> int:
    """Run in the interpreter worker: hidden cases and the worked example through the kernel (smaller
    than the torch tests', k up to 8 as beams are: the interpreter spends ~5 ms per pass of the
    kernel's k-loops)."""
    from scaletrain.infer import retrieve_rerank_triton

    cases = [(LIGHTSEQ, 2, 2), *hidden_cases(n=24, seed=77, max_rows=3, max_V=50, max_k=8)]
    for i, (x, k, groups) in enumerate(cases):
        values, indices, counts = retrieve_rerank_triton(x, k, groups=groups)
        check_topk(values, indices, x, k, f"triton case {i}: V={x.shape[1]} k={k} groups={groups}")
        assert torch.equal(counts.long(), candidates(x, k, groups).sum(1)), f"triton case {i}: candidate count"
    return len(cases)


@needs_triton
def test_triton_kernel_through_the_interpreter():
    with IsolatedWorker({"TRITON_INTERPRET": "1"}, timeout_s=240) as worker:
        assert worker.run(triton_cases) == 25


def compile_for_sm80() -> int:
    """Run in a worker without the interpreter: the real pipeline (Triton IR -> PTX -> cubin by ptxas),
    which rejects Python the interpreter accepts. Returns the kernel's shared-memory bytes."""
    import os

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module
    kernel = load_kernel_module(KERNELS_DIR / "retrieve_rerank_triton.py").retrieve_rerank_kernel
    signature = dict(x_ptr="*fp32", cval_ptr="*fp32", cidx_ptr="*i64", val_ptr="*fp32", idx_ptr="*i64",
                     count_ptr="*i32", V="i32", K="i32", G="i32", BLOCK_V="constexpr", BLOCK_G="constexpr")
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=dict(BLOCK_V=1024, BLOCK_G=8)),
                              target=GPUTarget("cuda", 80, 32))
    return compiled.metadata.shared


@needs_triton
def test_triton_kernel_compiles_for_sm80():
    with IsolatedWorker({"TRITON_INTERPRET": "0"}, timeout_s=300) as worker:
        assert worker.run(compile_for_sm80) >= 0


@pytest.mark.gpu
def test_triton_kernel_on_cuda():
    from scaletrain.infer import retrieve_rerank_triton

    for i, (x, k, groups) in enumerate([*hidden_cases(n=40, seed=5, max_k=16), (torch.randn(8, 4096), 8, 8)]):
        x = x.cuda()
        values, indices, counts = retrieve_rerank_triton(x, k, groups=groups)
        check_topk(values, indices, x, k, f"cuda case {i}: V={x.shape[1]} k={k} groups={groups}")
        assert torch.equal(counts.long(), candidates(x, k, groups).sum(1)), f"cuda case {i}: candidate count"


@pytest.mark.parametrize("x", [torch.randint(0, 9, (2, 12)), torch.tensor([[1.0, float("nan"), 3.0, 0.0]])],
                         ids=["int", "nan"])
def test_rejects_scores_without_an_order(x):
    """NaN has no place in a descending order (torch.topk puts it first); integers can't hold -inf padding."""
    with pytest.raises(ValueError, match="floating-point scores without NaN"):
        retrieve_rerank(x, 2, groups=2)
