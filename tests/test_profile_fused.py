"""The GPT on the course's fused kernels (issue 35 item 2): the same step as the GPT it copies (loss and
every gradient, the one-process reference being the model itself), the tied embedding still tied, and
on a CPU the fused row left out with its reason rather than timed through the Triton interpreter."""

from __future__ import annotations

import pytest
import torch

from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.profile.fused import FusedGPT, fused_unavailable
from scaletrain.profile.variants import FUSED, compare_variants

CFG = GPTConfig(vocab_size=64, block_size=20, n_layer=2, n_head=2, n_embd=24)


def _same_step(model, fused, batch, rtol, atol):
    loss, fused_loss = model(*batch)[1], fused(*batch)[1]
    torch.testing.assert_close(fused_loss, loss, rtol=rtol, atol=atol)
    loss.backward()
    fused_loss.backward()
    for (name, p), q in zip(model.named_parameters(), fused.model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol, msg=name)


def test_the_fused_model_computes_the_same_step_as_the_gpt():
    model = GPT(CFG, seed=0)
    fused = FusedGPT(model, "torch")  # the same ops module by module; the kernels are tested in test_ops_*
    assert fused.model.lm_head.weight is fused.model.wte.weight
    assert fused.model.wte.weight is not model.wte.weight  # a copy: the eager model is left alone
    _same_step(model, fused, make_batch(CFG, 3, seed=1), rtol=1e-5, atol=1e-6)


def test_on_a_cpu_the_fused_row_is_not_measured():
    assert "not measured on CPU" in fused_unavailable("cpu") and "interpreter" in fused_unavailable("cpu")
    with pytest.raises(ValueError, match="dropout=0"):
        FusedGPT(GPT(GPTConfig(dropout=0.1)))


@pytest.mark.gpu
def test_gpu_the_fused_row_runs_the_same_step_beside_eager():
    cfg = GPTConfig(vocab_size=256, block_size=128, n_layer=2, n_head=4, n_embd=128)
    model = GPT(cfg, seed=0).cuda()
    batch = tuple(t.cuda() for t in make_batch(cfg, 4, seed=1))
    _same_step(model, FusedGPT(model), batch, rtol=1e-3, atol=1e-4)  # triton kernels, fp32
    rows, left_out = compare_variants(model, batch, device="cuda", rounds=2, warmup=1, compile=False)
    assert FUSED not in left_out and any(r["variant"] == FUSED for r in rows)


def test_the_fused_models_calls_are_operations_of_the_profile():
    """Each call of scaletrain.ops is a `scaletrain::<op>` range (ops/labels.py): on a GPU its Triton
    kernels have no aten op above them, and without the range their time had no operation to go to.
    Here the torch backend: the ranges are the outermost ops, their own aten ops inside them are not
    counted again, and the categories are the seeds' (attention, normalization)."""
    from scaletrain.profile import profile_steps, training_step

    model = FusedGPT(GPT(CFG, seed=0), backend="torch")
    step = training_step(model, make_batch(CFG, 2, seed=1), torch.optim.AdamW(model.parameters(), lr=1e-3))
    prof = profile_steps(step, steps=1, warmup=1)
    forward = [o for o in prof.ops if o.phase == "forward"]
    labelled = {o.name: o.category for o in forward if o.name.startswith("scaletrain::")}
    assert labelled == {"scaletrain::attention": "attention", "scaletrain::layer_norm": "normalization",
                        "scaletrain::cross_entropy": "other"}
    counts = {name: sum(o.name == name for o in forward) for name in labelled}
    assert counts == {"scaletrain::attention": CFG.n_layer, "scaletrain::layer_norm": 2 * CFG.n_layer + 1,
                      "scaletrain::cross_entropy": 1}
    # the composed softmax inside the torch backend's attention is not an outer op of its own
    assert not any(o.name == "aten::_softmax" for o in forward)
    # with no profiler recording, a call opens no range (a record_function is ~16 us a call)
    from torch.profiler import record_function

    from scaletrain.ops.labels import labelled
    assert not isinstance(labelled("softmax"), record_function)


def test_the_cli_refuses_the_fused_model_without_a_gpu(capsys):
    from scaletrain.profile.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["--device", "cpu", "--quick", "--model", "fused"])
    assert stop.value.code == 2
    assert "--model fused on cpu: not measured on CPU" in capsys.readouterr().err
