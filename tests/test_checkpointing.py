"""scaletrain.checkpointing's Function, checkpoint_sequential and selective recomputation, against
plain backpropagation (bitwise, dropout included), torch.utils.checkpoint, and the a·s² closed form."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as torch_ckpt

from scaletrain.checkpointing import checkpoint, checkpoint_sequential, explicit_attention
from scaletrain.memory_measure import track_saved_tensors
from scaletrain.models import GPT, Block, GPTConfig, make_batch

CFG = GPTConfig(vocab_size=37, block_size=24, n_layer=3, n_head=3, n_embd=18, dropout=0.2)


def _grads(module, fn, *inputs, seed=7):
    """Run fn under a fixed RNG seed, backward of its sum: the output, the parameter and input
    gradients, and the next random number drawn afterwards (the caller's RNG stream)."""
    module.zero_grad(set_to_none=True)
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    torch.manual_seed(seed)
    out = fn(*leaves)
    out.pow(2).sum().backward()
    after = torch.rand(1)
    return (out.detach(), [p.grad.clone() for p in module.parameters()],
            [x.grad for x in leaves if x.requires_grad], after)


def _assert_same(got, want):
    out, params, inputs, after = got
    assert torch.equal(out, want[0])
    assert all(torch.equal(a, b) for a, b in zip(params, want[1])), "parameter gradients differ"
    assert all(torch.equal(a, b) for a, b in zip(inputs, want[2])), "input gradients differ"
    assert torch.equal(after, want[3]), "the caller's RNG stream moved (recomputation must run in fork_rng)"


@pytest.mark.parametrize("shape", [(2, 5, 18), (3, 23, 18)])
def test_checkpoint_gradients_equal_plain_backward_with_dropout(shape):
    block = Block(CFG).train()
    x = torch.randn(shape)
    _assert_same(_grads(block, lambda x: checkpoint(block, x), x), _grads(block, block, x))


def test_checkpoint_passes_non_tensor_arguments_and_several_inputs():
    lin = nn.Linear(6, 6)

    def fn(a, scale, b):
        return F.dropout(lin(a) * scale + b, 0.5, training=True)

    a, b = torch.randn(4, 6), torch.randn(4, 6)
    _assert_same(_grads(lin, lambda a, b: checkpoint(fn, a, 3.0, b), a, b), _grads(lin, lambda a, b: fn(a, 3.0, b), a, b))


def test_without_rng_restore_dropout_gradients_differ():
    """Why the RNG state is saved: recomputed with fresh randomness, the masks differ."""
    block = Block(CFG).train()
    x = torch.randn(2, 9, 18)
    plain = _grads(block, block, x)
    fresh = _grads(block, lambda x: checkpoint(block, x, preserve_rng_state=False), x)
    assert torch.equal(fresh[0], plain[0])
    assert not all(torch.equal(a, b) for a, b in zip(fresh[1], plain[1]))


def test_checkpoint_keeps_only_its_inputs_like_torch_reentrant():
    block = Block(CFG).train()
    x = torch.randn(2, 11, 18, requires_grad=True)
    params = list(block.parameters())
    for fn in (lambda: checkpoint(block, x), lambda: torch_ckpt.checkpoint(block, x, use_reentrant=True)):
        with track_saved_tensors(params) as tracker:
            y = fn()
            kept = tracker.bytes
            y.sum().backward()
        assert kept == x.untyped_storage().nbytes(), "after the forward only the input may be kept"
    with track_saved_tensors(params) as tracker:
        block(x).sum()
    assert tracker.bytes > 4 * kept, "the block's own tape is much larger than its input"


def test_parameters_get_gradients_when_no_input_requires_grad():
    """Token ids into an embedding: no input requires grad, the weights still must."""
    emb = nn.Embedding(10, 4)
    ids = torch.tensor([[1, 2, 3], [3, 2, 9]])
    checkpoint(emb, ids).sum().backward()
    got = emb.weight.grad.clone()
    emb.weight.grad = None
    emb(ids).sum().backward()
    assert torch.equal(got, emb.weight.grad)


def test_checkpoint_sequential_equals_torch_in_values_and_saved_bytes():
    torch.manual_seed(0)
    blocks = nn.Sequential(*[Block(CFG) for _ in range(5)]).train()
    x = torch.randn(2, 13, 18)
    params = list(blocks.parameters())

    def run(fn):
        with track_saved_tensors(params) as tracker:
            result = _grads(blocks, fn, x)
        return result, tracker.peak

    ours, ours_peak = run(lambda x: checkpoint_sequential(list(blocks), 2, x))
    theirs, theirs_peak = run(lambda x: torch_ckpt.checkpoint_sequential(blocks, 2, x, use_reentrant=True))
    _assert_same(ours, _grads(blocks, blocks, x))
    _assert_same(theirs, ours)
    assert ours_peak == theirs_peak


def test_bad_input_raises():
    with pytest.raises(TypeError, match="callable"):
        checkpoint(3, torch.ones(1))
    with pytest.raises(ValueError, match="segments"):
        checkpoint_sequential([nn.Identity()] * 3, 4, torch.ones(1))


# ---------------------------------------------------------------- selective recomputation

def test_explicit_attention_core_equals_the_fused_kernel():
    model = GPT(CFG).eval()
    idx, tgt = make_batch(CFG, 2, seq_len=17)
    want = model(idx, tgt)[0]
    with explicit_attention(model):
        got = model(idx, tgt)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not any(type(b.attn).__name__ == "CoreAttention" for b in model.blocks), "restored on exit"


def test_selective_recomputation_gradients_equal_storing_the_core():
    model = GPT(CFG).train()
    idx, tgt = make_batch(CFG, 2, seq_len=19)

    def run(recompute):
        with explicit_attention(model, recompute=recompute):
            return _grads(model, lambda i: model(i, tgt)[1], idx)

    _assert_same(run(True), run(False))


@pytest.mark.parametrize("dropout,per_element", [(0.0, 4), (0.2, 12)])
def test_selective_recomputation_removes_exactly_the_s_squared_bytes(dropout, per_element):
    """Saved bytes f(s) after the forward: storing the core has a quadratic part c·b·a·L·s²
    (second difference f(3s) − 2f(2s) + f(s) = 2·c·b·a·L·s², c = 4 B softmax output, + 4 + 4 B
    dropout mask and output on CPU); with selective recomputation f is linear in s."""
    cfg = GPTConfig(vocab_size=37, block_size=64, n_layer=2, n_head=3, n_embd=18, dropout=dropout)
    model = GPT(cfg).train()
    b, s = 2, 7

    def saved(recompute, seq):
        idx, tgt = make_batch(cfg, b, seq_len=seq)
        with explicit_attention(model, recompute=recompute), track_saved_tensors(list(model.parameters())) as tr:
            model(idx, tgt)
            return tr.bytes

    for recompute, want in ((False, 2 * per_element * b * cfg.n_head * cfg.n_layer * s * s), (True, 0)):
        f = [saved(recompute, k * s) for k in (1, 2, 3)]
        assert f[2] - 2 * f[1] + f[0] == want, (recompute, f)


def test_explicit_attention_rejects_other_models():
    with pytest.raises(TypeError, match="GPT"):
        with explicit_attention(nn.Linear(2, 2)):
            pass
