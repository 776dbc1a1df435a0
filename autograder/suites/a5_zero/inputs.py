"""a5's hidden inputs: the models trained (as specs the probe builds), which (model, optimizer)
each stage trains at N = 1 and 2, and the jobs each check needs; the public tests' runs are among them."""

from __future__ import annotations

from .names import (C_S1_EQ, C_S1_HELD, C_S1_SENT, C_S2_EARLY, C_S2_EQ, C_S2_HELD, C_S2_SENT, C_S3_COMM, C_S3_EQ,
                    C_S3_GATHER, C_S3_HELD, C_UNSHARD, P)


# hidden models, as specs the probe builds (`autograder.probes.a5_zero.build_model`)
MODELS = {
    "h_gpt": {"kind": "gpt", "config": dict(vocab_size=53, block_size=10, n_layer=3, n_head=3, n_embd=15)},
    "h_mlp": {"kind": "mlp", "sizes": [9, 17, 4]},
    "h_tiny": {"kind": "one_weight"},
    "h_groups": {"kind": "mlp", "sizes": [5, 11, 7, 2], "frozen_first": True, "grouped": True},
}
# the public tests' runs (scaletrain.zero.verify's models, `_model`): each runs here too (issue 27)
PUBLIC = (("p_gpt", "sgd_momentum"), ("p_groups", "adamw"), ("p_tiny", "sgd_momentum"))
# (model, optimizer) trained per stage; SGD is in the N = 2 rows that must catch a missing average
GRID = {P: (("h_gpt", "adamw"), ("h_gpt", "sgd_momentum"), ("h_mlp", "sgd_momentum"), ("h_tiny", "adamw"),
            ("h_groups", "sgd_momentum")) + PUBLIC,
        1: (("h_groups", "adamw"), ("h_tiny", "sgd_momentum"))}
BYTES = (("h_gpt", "adamw"), ("h_groups", "sgd_momentum")) + PUBLIC  # memory and bytes audited at N = 2
EARLY = (("h_gpt", "adamw"), ("h_groups", "sgd_momentum"), ("h_gpt", "sgd_momentum"))  # stage 2's backward
GATHERS = ("h_gpt", "p_gpt")  # stage 3's gathers audited
STEPS = 3
BUCKET_CAP_MB = 0.002  # ~500 floats: the GPT gets several buckets at stages 0-2
UNSHARD_M = (1, 2, 5, 7, 1000)  # 1 and 5: the public test's (issue 27)
KIND = {"adamw": "adam", "sgd_momentum": "sgd_momentum"}  # scaletrain.memory's optimizer names


def _options(optimizer: str) -> dict:
    from scaletrain.zero.verify import OPTIMIZER_SETUPS
    return dict(OPTIMIZER_SETUPS[optimizer][1])


def _model(name: str) -> dict:
    """A hidden model's spec, or (p_*) the spec of the public model of scaletrain.zero.verify."""
    if not name.startswith("p_"):
        return MODELS[name]
    from scaletrain.zero.verify import GPT_CFG
    return {"p_gpt": {"kind": "gpt", "config": dict(vocab_size=GPT_CFG.vocab_size, block_size=GPT_CFG.block_size,
                                                    n_layer=GPT_CFG.n_layer, n_head=GPT_CFG.n_head,
                                                    n_embd=GPT_CFG.n_embd)},
            "p_tiny": {"kind": "mlp", "sizes": [1, 1]},                    # verify's MLP([1, 1])
            "p_groups": {"kind": "mlp", "sizes": [6, 9, 10, 3], "frozen_first": True, "grouped": True}}[name]


def _job(model: str, optimizer: str, stage: int, size: int, seed: int) -> dict:
    traced = size == P and ((model, optimizer) in BYTES or (stage == 2 and (model, optimizer) in EARLY))
    return {"name": f"stage {stage}, N={size}, {optimizer}, model {model}", "kind": "train", "model": _model(model),
            "key": model, "optimizer": optimizer, "options": _options(optimizer), "stage": stage, "size": size,
            "seed": seed, "steps": STEPS, "bucket_cap_mb": BUCKET_CAP_MB, "trace": traced}


def _unshard_job(size: int, seed: int) -> dict:
    import torch
    gen = torch.Generator().manual_seed(seed * 7 + size)
    return {"name": f"unshard N={size}", "kind": "unshard", "size": size,
            "buffers": [torch.randn(size * m, generator=gen) for m in UNSHARD_M]}


def _jobs(names: set[str], seed: int) -> dict[str, list[dict]]:
    """The jobs each check needs (the same job may serve several checks), for the checks in `names`."""
    need: dict[str, list[dict]] = {}
    if C_UNSHARD in names:
        need[C_UNSHARD] = [_unshard_job(size, seed) for size in (P, 1)]
    for stage, eq, audits in ((1, C_S1_EQ, (C_S1_HELD, C_S1_SENT)), (2, C_S2_EQ, (C_S2_HELD, C_S2_SENT, C_S2_EARLY)),
                              (3, C_S3_EQ, (C_S3_HELD, C_S3_GATHER, C_S3_COMM))):
        jobs = [_job(model, opt, stage, size, seed) for size in (P, 1) for model, opt in GRID[size]]
        if eq in names:
            need[eq] = jobs
        for name in audits:
            if name in names:
                pick = EARLY if name == C_S2_EARLY else BYTES
                need[name] = [j for j in jobs if j["size"] == P and (j["key"], j["optimizer"]) in pick]
    return need


def _shard_cases(seed: int):
    import torch
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(size * m, generator=gen), rank, size)
            for size, m in ((3, 5), (4, 2), (1, 7), (2, 1), (3, 4)) for rank in range(size)]  # (3, 4): the public's
