"""a12's hidden inputs, drawn from the grading seed; each list starts with the public tests' own cases
(assignments/a12_inference/tests/; a hidden suite runs every public case). Models are tiny GPTs whose
weights are drawn here with a spread large enough that no two beams tie."""

from __future__ import annotations

import random

PUBLIC_GPT = dict(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=8)
PUBLIC_CUTS = [0, 5, 6, 9, 10, 11, 12]  # prefill 5, one token, a chunk of 3, then one at a time
PUBLIC_BEAM = dict(vocab_size=3, block_size=8, n_layer=2, n_head=2, n_embd=8)
PUBLIC_PROMPT = [1, 2]
# LightSeq lecture, "Retrieve": beam size 2, vocabulary 8, two groups of four per beam
LIGHTSEQ = [[2, 4, 2, 4, 3, 5, 1, 2], [1, 3, 7, 4, 1, 5, 8, 6]]
PUBLIC_W = [[0.5, -1.0, 0.25, 2.0, -0.75, 0.0, 1.5, -2.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
            [-3.0, 1.0, 0.0, 0.5, -0.5, 2.5, -1.5, 1.25], [0.0, 0.0, 0.0, 0.0, 0.01, -0.02, 0.03, -0.04]]


def _t():
    import torch
    return torch


def _gen(seed: int):
    return _t().Generator().manual_seed(seed)


def weights(cfg: dict, seed: int, dtype: str, std: float = 0.5) -> dict:
    """A GPT's state dict: the course's init, then linear and embedding weights redrawn at `std`
    (the init's 0.02 makes every next-token distribution nearly uniform: beams tie, and a model's
    loss hardly notices what its weights are)."""
    torch = _t()
    from scaletrain.models import GPT, GPTConfig

    model, gen = GPT(GPTConfig(**cfg), seed=seed), _gen(seed)
    state = {}
    for name, p in model.state_dict().items():
        redraw = p.dim() == 2 or name.endswith("bias")
        state[name] = (torch.randn(p.shape, generator=gen, dtype=torch.float64) * std if redraw
                       else p.double()).to(getattr(torch, dtype))
    return state


def _model_job(name: str, cfg: dict, seed: int, dtype: str = "float64") -> dict:
    return {"name": name, "cfg": cfg, "dtype": dtype, "weights": weights(cfg, seed, dtype)}


def _cuts(rng, length: int) -> list[int]:
    """Prefill 1-5 positions, then single tokens with one chunk of 3 somewhere."""
    cuts = [0, rng.randint(1, 5)]
    chunk_at = rng.randint(cuts[-1] + 1, length - 4)
    while cuts[-1] < length:
        cuts.append(cuts[-1] + (3 if cuts[-1] == chunk_at else 1))
    return cuts


def _reorder(job: dict, rng, gen) -> dict:
    """A reorder of >= 3 rows by random parents (repeats and drops) after a random prefix, one token after."""
    torch = _t()
    rows, at, V = max(job["idx"].shape[0], 3), rng.randint(3, job["idx"].shape[1] - 1), job["cfg"]["vocab_size"]
    job.update(ridx=torch.randint(0, V, (rows, at), generator=gen),
               parents=torch.randint(0, rows, (rows,), generator=gen), next=torch.randint(0, V, (rows,), generator=gen))
    return job


def decode_jobs(seed: int) -> list[dict]:
    """Cached decodings (the public one first), each with a reorder of rows by random parents."""
    torch, rng, gen = _t(), random.Random(seed), _gen(seed)
    public = _model_job("public V=11 L=2 a=2 h=8", PUBLIC_GPT, 0)
    public.update(idx=torch.randint(0, 11, (2, 12), generator=_gen(0)), cuts=PUBLIC_CUTS,
                  ridx=torch.randint(0, 11, (3, 4), generator=_gen(1)), parents=torch.tensor([2, 0, 0]),
                  next=torch.tensor([5, 6, 7]))
    jobs = [public]
    for i in range(3):
        a = rng.choice((1, 2, 3))
        cfg = dict(vocab_size=rng.choice((13, 17, 23)), block_size=24, n_layer=rng.randint(1, 3), n_head=a,
                   n_embd=a * rng.choice((4, 6)))
        b, length = rng.randint(1, 3), rng.randint(16, 22)
        job = _model_job(f"V={cfg['vocab_size']} L={cfg['n_layer']} a={a} h={cfg['n_embd']} b={b}", cfg, seed + i,
                         "float32" if i == 0 else "float64")
        job.update(idx=torch.randint(0, cfg["vocab_size"], (b, length), generator=gen), cuts=_cuts(rng, length))
        jobs.append(job)
    return [public] + [_reorder(job, rng, gen) for job in jobs[1:]]


def beam_jobs(seed: int) -> tuple[list[dict], list[dict]]:
    """(exhaustive, pruned): k >= V^(n-1), where beam search is exact; k < V^(n-1), where it prunes."""
    torch, rng = _t(), random.Random(seed + 1)
    public = _model_job("public V=3 n=3 k=9", PUBLIC_BEAM, 0)
    public.update(prompt=torch.tensor(PUBLIC_PROMPT), k=9, steps=3)
    exact = [public]
    for i, (V, steps) in enumerate(((3, 3), (2, 4), (4, 3))):
        cfg = dict(vocab_size=V, block_size=12, n_layer=rng.randint(1, 2), n_head=2, n_embd=8)
        s0 = rng.randint(1, 4)
        job = _model_job(f"V={V} n={steps} k={V ** (steps - 1)} s0={s0}", cfg, seed + 10 + i)
        job.update(prompt=torch.randint(0, V, (s0,), generator=_gen(seed + i)), k=V ** (steps - 1), steps=steps)
        exact.append(job)
    pruned = []
    for i in range(3):
        V, k, steps, s0 = rng.randint(5, 9), rng.randint(2, 4), rng.randint(3, 5), rng.randint(1, 4)
        cfg = dict(vocab_size=V, block_size=12, n_layer=2, n_head=2, n_embd=8)
        job = _model_job(f"V={V} n={steps} k={k} s0={s0}", cfg, seed + 20 + i)
        job.update(prompt=torch.randint(0, V, (s0,), generator=_gen(seed + 30 + i)), k=k, steps=steps)
        pruned.append(job)
    return exact, pruned


def rerank_jobs(seed: int) -> tuple[list[dict], list[dict], list[dict]]:
    """(rows, beams, counted): retrieve_rerank on tie-heavy, -inf and edge rows; beam_topk over beams;
    both on continuous logits wide enough that the candidates are a small part of a row."""
    torch, rng, gen = _t(), random.Random(seed + 2), _gen(seed + 2)
    lightseq = torch.tensor(LIGHTSEQ, dtype=torch.float32)
    rows = [{"name": "public LightSeq example k=2", "fn": "rows", "x": lightseq, "k": 2, "groups": None}]
    for case in range(12):
        r, V = rng.randint(1, 5), rng.randint(1, 40)
        k = V if case == 0 else rng.randint(1, V)
        groups = None if case % 2 else rng.randint(k, V)
        x = torch.randint(0, 4, (r, V), generator=gen).float() if case % 3 == 0 else torch.randn(r, V, generator=gen)
        if case % 4 == 1:
            x[torch.rand(r, V, generator=gen) < 0.4] = float("-inf")
        rows.append({"name": f"rows={r} V={V} k={k} groups={groups} case {case}", "fn": "rows", "x": x, "k": k,
                     "groups": groups})
    beams = [{"name": "public LightSeq example across beams k=2", "fn": "beams", "x": lightseq, "k": 2,
              "groups": None}]
    for case in range(6):
        k, V = rng.randint(1, 5), rng.randint(1, 30)
        x = torch.randint(0, 3, (k, V), generator=gen).double() if case % 2 else torch.randn(k, V, generator=gen)
        if case == 4:
            x[1:] = float("-inf")  # the first step of a beam search: one live beam
        beams.append({"name": f"beams={k} V={V} case {case}", "fn": "beams", "x": x, "k": k, "groups": None})
    counted = [{"name": f"{fn} rows={r} V={V} k={k}", "fn": fn, "x": torch.randn(r, V, generator=gen), "k": k,
                "groups": None}
               for fn, r, V, k in (("rows", 4, 128, 2), ("rows", 3, 160, 4), ("beams", 3, 96, 3), ("beams", 4, 128, 4))]
    return rows, beams, counted


def _spread_rows(gen, out: int, cols: int, dtype):
    """Rows whose magnitudes differ by up to 1000x, so one scale for all would be far too coarse."""
    torch = _t()
    return (torch.randn(out, cols, generator=gen, dtype=torch.float64)
            * 10 ** (torch.rand(out, 1, generator=gen, dtype=torch.float64) * 3 - 2)).to(dtype)


def quant_jobs(seed: int) -> tuple[list[dict], list[dict]]:
    """(8-bit, edges): groups inside a row, a row, several rows, per channel and per tensor, symmetric
    and asymmetric; then 4 bits and groups that are all zero, of one sign, or constant."""
    torch, rng, gen = _t(), random.Random(seed + 3), _gen(seed + 3)
    public_w = torch.tensor(PUBLIC_W)
    eight = [{"name": f"public 4x8 group_size={g} symmetric={s}", "w": public_w,
              "spec": dict(bits=8, symmetric=s, granularity="group", group_size=g)}
             for g in (8, 16) for s in (True, False)]
    for i in range(6):
        out, cols = rng.choice((6, 8, 12)), rng.choice((16, 24, 32))
        size = (cols // 2, cols, 2 * cols)[i % 3]
        spec = dict(bits=8, symmetric=i % 2 == 0, granularity="group", group_size=size)
        eight.append({"name": f"{out}x{cols} {spec}", "w": _spread_rows(gen, out, cols, rng.choice(
            (torch.float32, torch.float64))), "spec": spec})
    for gran, sym in (("channel", False), ("tensor", True)):
        eight.append({"name": f"8x16 {gran} symmetric={sym}", "w": _spread_rows(gen, 8, 16, torch.float32),
                      "spec": dict(bits=8, symmetric=sym, granularity=gran)})
    edge_w = _spread_rows(gen, 6, 8, torch.float64)
    edge_w[1] = 0.0
    edge_w[2] = edge_w[2].abs() + 0.5  # one sign only: an asymmetric grid that must not reach 0 from both sides
    edge_w[3] = -edge_w[3].abs() - 0.25
    edge_w[4] = 1.75  # constant
    edges = [{"name": f"edge groups (zero, positive, negative, constant) bits={b} symmetric={s}", "w": edge_w,
              "spec": dict(bits=b, symmetric=s, granularity="group", group_size=8)}
             for b in (8, 4) for s in (True, False)]
    for s in (True, False):
        edges.append({"name": f"4 bits 8x24 group_size=12 symmetric={s}", "w": _spread_rows(gen, 8, 24, torch.float32),
                      "spec": dict(bits=4, symmetric=s, granularity="group", group_size=12)})
    return eight, edges


QUANT_GPT = dict(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_embd=32)


def quant_model_jobs(seed: int) -> list[dict]:
    """A GPT whose loss depends on its weights (std 0.2; at the course's init every weight could be
    0 and the loss would hardly move), int8 in groups of 16."""
    torch, gen = _t(), _gen(seed + 4)
    idx = torch.randint(0, 32, (4, 16), generator=gen)
    return [{"name": "GPT V=32 L=2 h=32, int8 symmetric groups of 16", "cfg": QUANT_GPT, "dtype": "float32",
             "weights": weights(QUANT_GPT, seed, "float32", std=0.2), "idx": idx, "targets": idx.roll(-1, dims=1),
             "spec": dict(bits=8, symmetric=True, granularity="group", group_size=16)}]
