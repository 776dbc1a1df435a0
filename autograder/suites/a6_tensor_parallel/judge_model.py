"""a6's verdicts on the vocabulary-parallel loss (6.3), the sequence-gather linear (6.4) and the whole
GPT with and without sequence parallelism (6.2, 6.4): values, bytes and memory against the formulas."""

from __future__ import annotations

from .judge_layers import close, sent
from .names import C_CE_BWD, C_CE_FWD, C_CE_MEM, C_CE_STABLE, C_GPT, C_GPT_BYTES, C_SP_BYTES, C_SP_GPT, C_SP_LIN_SAVED


def judge_loss(job, out, ref, r, check):
    t, (rows, vocab) = job["t"], job["full"].shape
    at = f"cross-entropy (N={rows}, V={vocab}, t={t}), rank {r}"
    if check == C_CE_MEM:
        if out["largest"] > rows * vocab // t:
            raise AssertionError(f"{at}: a tensor of {out['largest']} elements was made; this rank's logits have "
                                 f"{rows * vocab // t} and the whole logits {rows * vocab}: reduce the max, the "
                                 "target logit and the sum of exponentials instead of gathering the logits")
        limit = 4 * rows * vocab // t + 16 * rows
        if out["saved"] > limit:
            raise AssertionError(f"{at}: saved {out['saved']} B for backward, at most {limit} (this rank's softmax "
                                 "slice and per-row indices)")
        return
    if check == C_CE_STABLE:
        at += f", logits up to {float(job['full'].abs().max()):.0f}"
    if check in (C_CE_FWD, C_CE_STABLE):
        close(out["loss"], ref["loss"].reshape(1), f"{at}: loss")
    if check in (C_CE_BWD, C_CE_STABLE):
        if out.get("skipped"):
            raise AssertionError(f"{at}: {out['skipped']}")
        k = vocab // t
        close(out["grad"], ref["grad"].narrow(-1, r * k, k), f"{at}: gradient of this rank's logits")


def judge_gather_linear(job, out, ref, r, check):
    from scaletrain.tp.cost import gather_bytes
    t, seq = job["t"], job["seq"]
    at = f"sequence-gather linear (s={seq}, t={t}), rank {r}"
    d_out = job["full"][0].shape[0]
    k, c = seq // t, d_out // t
    shard_bytes = job["x"][r].numel() * 4
    if check == C_SP_LIN_SAVED:
        if out["saved"] > shard_bytes:
            raise AssertionError(f"{at}: saved {out['saved']} B for backward, at most {shard_bytes} (the (b, s/t, h) "
                                 "shard; the gathered input is t times that): save the shard, all-gather it again in "
                                 "backward")
        return
    close(out["y"], ref["y"].narrow(-1, r * c, c), f"{at}: output (the whole sequence, this rank's columns)")
    if out.get("skipped"):
        raise AssertionError(f"{at}: {out['skipped']}")
    close(out["x_grad"], ref["x_grad"].narrow(1, r * k, k), f"{at}: gradient of this rank's sequence shard")
    close(out["weight_grad"], ref["weight_grad"].narrow(0, r * c, c), f"{at}: weight gradient")
    close(out["bias_grad"], ref["bias_grad"].narrow(0, r * c, c), f"{at}: bias gradient")
    sent(out["sent_forward"], gather_bytes(job["x"][r].numel() * t, t), f"{at}, forward", "one all-gather")


def judge_gpt(job, out, ref, r, check):
    from scaletrain.tp import activations, cost
    from scaletrain.tp.gpt import gpt_shard

    t, sp, cfg = job["t"], job["sp"], job["cfg"]
    at = f"GPT (t={t}, sequence_parallel={sp}), rank {r}"
    b, s = job["idx"].shape
    if check in (C_GPT, C_SP_GPT):
        close(out["loss"], ref["loss"].reshape(1), f"{at}: loss")
        v = cfg["vocab_size"] // t
        close(out["logits"], ref["logits"].narrow(-1, r * v, v), f"{at}: this rank's logits")
        grads = out["grads"]
        for name, full in ref["grads"].items():
            if name not in grads:
                raise AssertionError(f"{at}: no gradient named {name}")
            close(grads[name], gpt_shard(name, full, rank=r, world_size=t), f"{at}: gradient of {name}")
    elif check in (C_GPT_BYTES, C_SP_BYTES):
        kw = dict(batch_size=b, seq_len=s, hidden=cfg["n_embd"], n_layer=cfg["n_layer"], t=t, sequence_parallel=sp)
        for phase in ("forward", "backward"):
            want = cost.gpt_step_bytes(**kw, forward=phase == "forward", backward=phase == "backward")
            sent(out[f"sent_{phase}"], want, f"{at}, {phase}",
                   "per layer the conjugates of 2 all-gathers and 2 reduce-scatters of b·s·h, and 2 re-gathers "
                   "in the backward" if sp else "per layer 2 allreduces of b·s·h each way (equation 5)")
    else:
        want = cfg["n_layer"] * activations.block_activation_bytes(
            batch_size=b, seq_len=s, hidden=cfg["n_embd"], n_head=cfg["n_head"], tp=t, sequence_parallel=sp)
        if out["blocks_saved"] != want:
            split = ("every activation split t ways" if sp
                     else "LayerNorm and projection inputs whole, the rest split t ways")
            raise AssertionError(f"{at}: the blocks saved {out['blocks_saved']} B for backward, the formula "
                                 f"{want} B ({split})")
