"""a11's references, computed on the trusted side before any student code runs, none of them by
scaletrain.profile: closed forms of each op's FLOPs and bytes from its recorded shapes, the
breakdown and MFU of a profile summed here, the PLD schedule of Zhang & He 2020 (§4) and a
block-by-block forward of the GPT with its gates."""

from __future__ import annotations

import math

from .inputs import DTYPES, PHASES

PER_ELEMENT = (1, 20)  # the FLOPs per element the contract accepts for LayerNorm, softmax and elementwise ops


def _numel(shape) -> int:
    return math.prod(shape) if shape else 0


def itemsize(job: dict) -> int:
    return DTYPES.get(job["dtypes"][0], 4)


def matmul(job: dict) -> tuple[int, int]:
    """(FLOPs, bytes): 2 per multiply-add of (b×)m×k by k×n; every operand read, the b·m·n output written."""
    a, b = job["shapes"][-4:-2] if job["name"] in ("aten::addmm", "aten::baddbmm") else job["shapes"][:2]
    batch = a[0] if len(a) == 3 else 1
    m, k, n = a[-2], a[-1], b[-1]
    operands = sum(_numel(s) for s in job["shapes"])
    return 2 * batch * m * k * n, (operands + batch * m * n) * itemsize(job)


def elementwise(job: dict) -> tuple[int, int]:
    """(output elements, bytes): the tensor inputs read, an output of the largest input's size written."""
    sizes = [_numel(s) for s in job["shapes"] if s]
    return max(sizes), (sum(sizes) + max(sizes)) * itemsize(job)


def norm_bytes(job: dict) -> tuple[int, int, int]:
    """(elements of x, the fewest bytes, the most bytes): the row tensors once (forward x in, y out;
    backward two in, dx out), then optionally each per-row statistic and per-column weight too."""
    x = job["shapes"][0]
    elements, rows, cols = _numel(x), _numel(x) // x[-1], x[-1]
    backward = "backward" in job["name"]
    least = (3 if backward else 2) * elements
    extra = 2 * rows + 4 * cols if "layer_norm" in job["name"] else 0  # mean, rstd; w, b (and dw, db)
    return elements, least * itemsize(job), (least + extra) * itemsize(job)


def breakdown(prof: dict) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for op in prof["ops"]:
        key = (op["phase"], op["category"])
        out[key] = out.get(key, 0.0) + op["seconds"] / prof["steps"]
    return out


def mfu(prof: dict) -> dict[str, float]:
    step = sum(prof["phase_seconds"][p] for p in PHASES) / prof["steps"]
    model = 6 * prof["num_params"] * prof["tokens"]  # Kaplan et al. 2020: 2 forward + 4 backward per parameter
    counted = sum(k["flops"] for k in prof["kernels"]) / prof["steps"]
    peak = prof["machine"]["peak_flops"]
    return {"step ms": step * 1e3, "model GFLOP (6NT)": model / 1e9, "MFU %": 100 * model / step / peak,
            "counted GFLOP": counted / 1e9, "counted / peak %": 100 * counted / step / peak}


def theta(t: int, theta_bar: float, gamma: float) -> float:
    return (1 - theta_bar) * math.exp(-gamma * t) + theta_bar


def gpt(cfg: dict, seed: int):
    from scaletrain.models import GPT, GPTConfig
    return GPT(GPTConfig(**cfg), seed=seed)


def batch(job: dict):
    from scaletrain.models import GPTConfig, make_batch
    return make_batch(GPTConfig(**job["cfg"]), job["batch"], seed=job["batch_seed"])


def pld_logits(job: dict):
    """The GPT of `job` run block by block: a dropped block skipped, a kept one's two residual
    branches divided by its keep probability."""
    import torch
    model = gpt(job["cfg"], job["seed"])
    idx, _ = batch(job)
    with torch.no_grad():
        x = model.wte(idx) + model.wpe(torch.arange(idx.shape[1]))
        for block, keep, p in zip(model.blocks, job["gates"], job["probs"]):
            if keep:
                x = x + block.attn(block.ln1(x)) / p
                x = x + block.mlp(block.ln2(x)) / p
        return model.lm_head(model.ln_f(x))


def shortened_logits(job: dict):
    """With every probability 1: the same GPT with its dropped blocks removed from the model, run as is."""
    import torch
    model = gpt(job["cfg"], job["seed"])
    model.blocks = torch.nn.ModuleList(b for b, keep in zip(model.blocks, job["gates"]) if keep)
    with torch.no_grad():
        return model(batch(job)[0])[0]
