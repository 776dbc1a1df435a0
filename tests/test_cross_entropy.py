"""The fused cross-entropy criterion (scaletrain.ops.cross_entropy) against
torch.nn.functional.cross_entropy in float64: value and dlogits, label smoothing, ignore_index,
irregular vocabularies; the "torch" backend here, the Triton kernels through the interpreter
(with a chunk smaller than the vocabulary, so the online log-sum-exp crosses chunks); GPU runs
marked `gpu`.  The sm_80 builds (Triton and nvcc) are in test_attention_triton.py, one compiler
process for all of module 1b."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from scaletrain.ops import cross_entropy
from scaletrain.ops.backends import KERNELS_DIR
from scaletrain.ops.toolchain.isolated import IsolatedWorker
from scaletrain.testing import TOLERANCE, assert_close
from launches import RecordedLaunches  # tests/ is on sys.path

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton package is not installed (Linux x86-64 only)")
CASES = [((3, 7), 1000, 0.1, torch.float32), ((5,), 17, 0.0, torch.float16), ((2, 3), 129, 0.2, torch.bfloat16)]


def check_case(shape, vocab, eps, dtype, backend, device="cpu", seed=0, scale=3.0):
    torch.manual_seed(seed)
    x = (torch.randn(*shape, vocab, device=device) * scale).to(dtype).requires_grad_()
    target = torch.randint(0, vocab, shape, device=device)
    target.view(-1)[1] = -100  # an ignored row
    x_before = x.detach().clone()
    loss = cross_entropy(x, target, label_smoothing=eps, backend=backend)
    loss.backward()
    ref = x.detach().double().requires_grad_()
    expected = F.cross_entropy(ref.flatten(0, -2), target.flatten(), label_smoothing=eps)
    expected.backward()
    tol = TOLERANCE[dtype]
    assert torch.equal(x.detach(), x_before), "the logits were modified"
    assert_close(loss, expected, rtol=tol, what=f"loss {shape} V={vocab} eps={eps} {dtype}")
    assert_close(x.grad, ref.grad, rtol=4 * tol, what="dlogits")
    assert (x.grad.reshape(-1, vocab)[1] == 0).all(), "an ignored row must get no gradient"


def kernel_chunks_case():
    """The kernels with 64-wide chunks over V = 1000 and logits near 1e4 (a running max is needed)."""
    from scaletrain.ops.backends import load_kernel_module
    kernels = load_kernel_module(KERNELS_DIR / "cross_entropy_triton.py")
    torch.manual_seed(4)
    x = torch.randn(5, 1000) * 4000
    target = torch.randint(0, 1000, (5,))
    loss, lse = kernels.cross_entropy_fwd(x, target, 0.1, -100, block_v=64)
    expected = F.cross_entropy(x.double(), target, label_smoothing=0.1, reduction="none")
    assert_close(loss, expected, what="per-row loss, chunked")
    assert_close(lse, torch.logsumexp(x.double(), 1), what="L")
    dx = kernels.cross_entropy_bwd(x, target, lse, torch.ones(5), 0.1, -100, block_v=64)
    ref = x.double().requires_grad_()
    F.cross_entropy(ref, target, label_smoothing=0.1, reduction="sum").backward()
    assert_close(dx, ref.grad, rtol=1e-3, what="dlogits, chunked")  # L ~ 1e4 rounded to fp32: exp(x - L) ~1e-4 off


@pytest.mark.parametrize("shape,vocab,eps,dtype", CASES)
def test_torch_backend(shape, vocab, eps, dtype):
    check_case(shape, vocab, eps, dtype, "torch")


def test_clear_errors():
    x = torch.randn(4, 10)
    with pytest.raises(TypeError, match="int64"):
        cross_entropy(x, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="target shape"):
        cross_entropy(x, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        cross_entropy(x, torch.tensor([0, 1, 2, 10]))
    with pytest.raises(ValueError, match="label_smoothing"):
        cross_entropy(x, torch.zeros(4, dtype=torch.int64), label_smoothing=1.5)
    with pytest.raises(ValueError, match="backend 'cuda' needs CUDA tensors"):
        cross_entropy(x, torch.zeros(4, dtype=torch.int64), backend="cuda")


def test_only_the_log_sum_exp_is_saved():
    x = torch.randn(64, 1000, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        cross_entropy(x, torch.randint(0, 1000, (64,)), backend="torch")
    fresh = [t for t in saved if t.data_ptr() != x.data_ptr() and t.dtype.is_floating_point]
    assert sum(t.numel() for t in fresh) <= 2 * 64  # L (and nothing of size rows x V)


def chunk_variants_case():
    """bench cross_entropy --variants: each variant caps the chunk (seen at the launch, the warps
    following), gives the default launch's loss and gradient, and leaves the rule in place after."""
    from scaletrain.ops.backends import load_kernel_module
    from scaletrain.ops.cross_entropy import cross_entropy
    from scaletrain.ops.launch_variants import chunk_variants
    kernels = load_kernel_module(KERNELS_DIR / "cross_entropy_triton.py")
    rule, real = kernels._block_v, kernels.cross_entropy_fwd_kernel
    torch.manual_seed(5)
    x, y = (torch.randn(6, 9000) * 3).requires_grad_(), torch.randint(0, 9000, (6,))
    results = {}

    def run(label):
        x.grad = None
        loss = cross_entropy(x, y, backend="triton")
        loss.backward()
        results[label] = (loss.detach(), x.grad.clone())
    try:
        kernels.cross_entropy_fwd_kernel = recorded = RecordedLaunches(real)
        run("default")
        for label, variant in chunk_variants(lambda: run("variant")).items():
            variant()
            assert_close(results["variant"][0], results["default"][0], rtol=1e-6, what=f"{label}: loss")
            assert_close(results["variant"][1], results["default"][1], rtol=1e-6, what=f"{label}: dlogits")
    finally:
        kernels.cross_entropy_fwd_kernel = real
    seen = [(kwargs["BLOCK_V"], kwargs["num_warps"]) for _, kwargs in recorded.seen]
    assert seen == [(16384, 32), (4096, 8), (8192, 16)]  # 9000 logits: the interpreter's rule takes the row
    assert kernels._block_v is rule


@pytest.fixture(scope="module")
def interp():
    with IsolatedWorker({"TRITON_INTERPRET": "1"}, timeout_s=240) as worker:
        yield worker.run


@needs_triton
def test_triton_kernels_through_the_interpreter(interp):
    for case in CASES:
        interp(check_case, *case, "triton")
    interp(kernel_chunks_case)
    interp(chunk_variants_case)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("shape,vocab,eps,dtype", CASES + [((4, 256), 50257, 0.1, torch.bfloat16)])
def test_gpu(backend, shape, vocab, eps, dtype):
    check_case(shape, vocab, eps, dtype, backend, device="cuda")
