"""Checkpointing the MLP (issue 35 item 3): the same loss and gradients as eager, and exactly the fc
and GeLU outputs, 2·b·s·4h fp32 elements per layer, fewer bytes kept after the forward (the closed
form of training-speedup-lecture.md's "recalculating activations"); the paired table's baseline row."""

from __future__ import annotations

import torch

from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.profile.variants import BASELINE, COMPILED, FUSED, checkpoint_mlps, compare_variants, measure_memory

CFG = GPTConfig(vocab_size=64, block_size=20, n_layer=3, n_head=2, n_embd=24)
B = 3


def test_checkpointing_the_mlp_keeps_the_numbers_and_drops_the_fc_and_gelu_outputs():
    model = GPT(CFG, seed=0)
    ckpt = checkpoint_mlps(model)
    batch = make_batch(CFG, B, seed=2)
    eager, saved = measure_memory(model, batch), measure_memory(ckpt, batch)
    assert saved["loss"] == eager["loss"]
    model(*batch)[1].backward()
    ckpt(*batch)[1].backward()
    for (name, p), q in zip(model.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=1e-7, msg=name)
    per_layer = 2 * B * CFG.block_size * 4 * CFG.n_embd * 4  # fc output and GeLU output, fp32
    assert (eager["saved MB"] - saved["saved MB"]) * 1e6 == CFG.n_layer * per_layer
    assert saved["peak saved MB"] < eager["peak saved MB"]


def test_the_variant_table_is_paired_against_eager():
    model = GPT(CFG, seed=0)
    rows, left_out = compare_variants(model, make_batch(CFG, B, seed=2), rounds=3, warmup=1, compile=False)
    assert left_out[COMPILED] == "not asked for (compile=False)" and "not measured on CPU" in left_out[FUSED]
    base = next(r for r in rows if r["variant"] == BASELINE)
    assert base["time / eager"] == 1.0 and base["p20-p80"] == "1.00-1.00"
    assert {r["variant"] for r in rows} == {BASELINE, "checkpointed MLP"}
