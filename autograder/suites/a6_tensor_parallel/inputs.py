"""a6's hidden inputs (this side only): per check, the jobs the probe runs on the ranks (shapes, weights,
batches drawn from the grading seed), and the 3D grid's layouts."""

from __future__ import annotations

import random

from .names import (C_CE_BWD, C_CE_FWD, C_CE_MEM, C_CE_STABLE, C_COL_BWD, C_COL_FWD, C_FG_BWD, C_FG_BYTES, C_FG_FWD,
                    C_GPT, C_GPT_BYTES, C_LAST, C_MESH_BUILD, C_MLP, C_QKV, C_ROW_BWD, C_ROW_FWD, C_SP_BYTES, C_SP_GPT,
                    C_SP_LIN, C_SP_LIN_SAVED, C_SP_MEM, C_SP_PAIR_BWD, C_SP_PAIR_FWD, PG_TIMEOUT_S, SIZES, WORLD)

CFG = dict(vocab_size=78, block_size=12, n_layer=2, n_head=6, n_embd=30)  # 78, 6 and 30 divide by 2 and 3
PUBLIC_CFG = dict(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=16)  # the public test's GPT, t = 2


def _randn(gen, *shape, scale: float = 1.0):
    import torch
    return torch.randn(*shape, generator=gen) * scale


def jobs_by_check(seed: int) -> dict[str, list[dict]]:
    """Per check, its jobs (inputs the probe runs on); the same job may serve several checks."""
    import torch
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    b, s = rng.choice((1, 3)), rng.choice((5, 7))
    need: dict[str, list[dict]] = {}
    for t in SIZES:
        n = 6 * rng.randint(1, 4)                                   # a last dimension every t divides
        for op in ("f", "g", "gather", "scatter"):
            full = op in ("f", "scatter")
            xs = [_randn(gen, b, s, n if full or op == "g" else n // t) for _ in range(t)]
            if op in ("f", "scatter"):
                xs = [xs[0]] * t                                     # the same input on every rank
            w_shape = (b, s, n if op in ("f", "g", "gather") else n // t)
            job = {"name": f"{op} t={t}", "kind": "operator", "op": op, "t": t, "x": xs,
                   "w": [_randn(gen, *w_shape) for _ in range(t)]}
            for check in ((C_FG_FWD, C_FG_BWD, C_FG_BYTES) if op in ("f", "g") else (C_LAST,)):
                need.setdefault(check, []).append(job)
        for layer, flags in (("column", (False, True)), ("row", (True, False))):
            for flag in flags:
                parts = 1
                d_in = rng.choice((7, 17)) if layer == "column" else 6 * rng.randint(1, 4)
                d_out = 6 * rng.randint(1, 3) if layer == "column" else rng.choice((5, 13))
                weight, bias = _randn(gen, d_out, d_in, scale=0.3), _randn(gen, d_out)
                x = _randn(gen, b, s, d_in)
                if layer == "row" and flag:
                    xs = [x.narrow(-1, r * d_in // t, d_in // t).contiguous() for r in range(t)]
                else:
                    xs = [x] * t
                w = _randn(gen, b, s, d_out)
                if layer == "column" and not flag:
                    from scaletrain.tp.layers import shard
                    ws = [shard(w, dim=2, rank=r, world_size=t, parts=parts) for r in range(t)]
                else:
                    ws = [w] * t
                job = {"name": f"{layer} flag={flag} t={t}", "kind": "layer", "layer": layer, "flag": flag, "t": t,
                       "parts": parts, "weight": weight, "bias": bias, "x": xs, "w": ws, "x_full": x, "w_full": w}
                for check in ((C_COL_FWD, C_COL_BWD) if layer == "column" else (C_ROW_FWD, C_ROW_BWD)):
                    need.setdefault(check, []).append(job)
        for heads in (t, t * rng.choice((2, 3))):                  # head counts t divides, irregular head sizes
            h = heads * rng.choice((3, 5))
            need.setdefault(C_QKV, []).append(
                {"name": f"attention a={heads} t={t}", "kind": "attention", "t": t, "n_head": heads,
                 "qkv_w": _randn(gen, 3 * h, h, scale=0.3), "qkv_b": _randn(gen, 3 * h),
                 "proj_w": _randn(gen, h, h, scale=0.3), "proj_b": _randn(gen, h),
                 "x": _randn(gen, b, s, h), "w": _randn(gen, b, s, h)})
        h = 6 * rng.randint(1, 2)
        need.setdefault(C_MLP, []).append(
            {"name": f"mlp t={t}", "kind": "mlp", "t": t, "w1": _randn(gen, 4 * h, h, scale=0.3),
             "b1": _randn(gen, 4 * h),
             "w2": _randn(gen, h, 4 * h, scale=0.3), "b2": _randn(gen, h), "x": _randn(gen, b, s, h),
             "w": _randn(gen, b, s, h)})
        rows, vocab = rng.choice((7, 15)), 6 * rng.randint(3, 7)
        logits, targets = _randn(gen, rows, vocab, scale=6.0), torch.randint(0, vocab, (rows,), generator=gen)
        job = {"name": f"loss t={t}", "kind": "loss", "t": t, "targets": targets, "full": logits,
               "logits": [logits.narrow(-1, r * vocab // t, vocab // t).contiguous() for r in range(t)]}
        for check in (C_CE_FWD, C_CE_BWD, C_CE_MEM):
            need.setdefault(check, []).append(job)
        large = _randn(gen, rows, vocab, scale=3000.0)                # exp() of these overflows without a shift
        need.setdefault(C_CE_STABLE, []).append(
            {"name": f"loss large t={t}", "kind": "loss", "t": t, "targets": targets, "full": large,
             "logits": [large.narrow(-1, r * vocab // t, vocab // t).contiguous() for r in range(t)]})
        seq, width = 6 * rng.randint(1, 2), rng.choice((5, 7))
        for op in ("sp_gather", "sp_scatter"):
            shard_in = op == "sp_gather"
            xs = [_randn(gen, b, seq // t if shard_in else seq, width) for _ in range(t)]
            ws = [_randn(gen, b, seq if shard_in else seq // t, width) for _ in range(t)]
            job = {"name": f"{op} t={t}", "kind": "operator", "op": op, "t": t, "x": xs, "w": ws}
            for check in (C_SP_PAIR_FWD, C_SP_PAIR_BWD):
                need.setdefault(check, []).append(job)
        d_in, d_out = rng.choice((5, 9)), 6 * rng.randint(1, 3)
        weight, bias, x = _randn(gen, d_out, d_in, scale=0.3), _randn(gen, d_out), _randn(gen, b, seq, d_in)
        w = _randn(gen, b, seq, d_out)
        job = {"name": f"gather_linear t={t}", "kind": "gather_linear", "t": t, "seq": seq,
             "weight": [weight.narrow(0, r * d_out // t, d_out // t).contiguous() for r in range(t)],
             "bias": [bias.narrow(0, r * d_out // t, d_out // t).contiguous() for r in range(t)],
             "x": [x.narrow(1, r * seq // t, seq // t).contiguous() for r in range(t)],
             "w": [w.narrow(-1, r * d_out // t, d_out // t).contiguous() for r in range(t)],
             "full": (weight, bias, x, w)}
        for check in (C_SP_LIN, C_SP_LIN_SAVED):
            need.setdefault(check, []).append(job)
        for sp in (False, True):
            from scaletrain.models import GPTConfig, make_batch
            length = 12 if sp else s
            idx, tgt = make_batch(GPTConfig(**CFG), b, seed=seed + t, seq_len=length)
            job = {"name": f"gpt t={t} sp={sp}", "kind": "gpt", "t": t, "sp": sp, "cfg": CFG, "seed": seed % 1000,
                   "idx": idx, "targets": tgt}
            for check in ((C_SP_GPT, C_SP_MEM, C_SP_BYTES) if sp else (C_GPT, C_GPT_BYTES, C_SP_MEM)):
                need.setdefault(check, []).append(job)
    _public_gpt_jobs(need, seed)
    for layout in BUILD_LAYOUTS:  # last: a build that deadlocks leaves every job before it judged
        need.setdefault(C_MESH_BUILD, []).append({"name": f"mesh {layout}", "kind": "mesh", "t": WORLD,
                                                  "layout": layout, "timeout_s": PG_TIMEOUT_S})
    return need


BUILD_LAYOUTS = ((2, 1, 2), (1, 2, 2), (2, 2, 1))  # (dp, pp, tp) of the 4 ranks


def grid_layouts(seed: int) -> list[tuple[int, int, int]]:
    """Hidden (dp, pp, tp) layouts for the pure grid (irregular degrees, up to 48 ranks), the builds' last."""
    rng = random.Random(seed + 5)
    hidden = {(3, 1, 2), (1, 5, 3), (2, 3, 4), (1, 1, 1)}
    while len(hidden) < 7:
        hidden.add((rng.randint(1, 4), rng.randint(1, 4), rng.choice((2, 3, 4))))
    return sorted(hidden) + list(BUILD_LAYOUTS)


def _public_gpt_jobs(need: dict, seed: int) -> None:
    """The public test's GPT at t = 2, sequence lengths 7 (TP) and 8 (SP), 3 sequences; values
    checked as for the hidden GPT (issue 27: the hidden suite runs every public case)."""
    from scaletrain.models import GPTConfig, make_batch
    for sp, length in ((False, 7), (True, 8)):
        idx, tgt = make_batch(GPTConfig(**PUBLIC_CFG), 3, seed=seed + 7, seq_len=length)
        job = {"name": f"public gpt t=2 sp={sp}", "kind": "gpt", "t": 2, "sp": sp, "cfg": PUBLIC_CFG,
               "seed": seed % 1000, "idx": idx, "targets": tgt}
        need.setdefault(C_SP_GPT if sp else C_GPT, []).append(job)




def wire_job(job: dict) -> dict:
    """What the probe receives: the inputs, never the parts only this side uses."""
    return {k: v for k, v in job.items() if k not in ("full", "x_full", "w_full")}
