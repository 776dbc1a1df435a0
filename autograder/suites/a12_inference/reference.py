"""a12's references, independent of the student's code and of scaletrain.infer: the model's own full
forward (no cache), exhaustive search over every continuation, a beam search that reruns the whole
prefix of every beam each step, and the quantization bounds read off the weights."""

from __future__ import annotations

import itertools


def model(job):
    """The course's GPT with the job's weights, in the job's dtype."""
    import torch
    from scaletrain.models import GPT, GPTConfig

    net = GPT(GPTConfig(**job["cfg"])).to(getattr(torch, job["dtype"])).eval()
    net.load_state_dict(job["weights"])
    return net


def next_logits(net, idx):
    """Logits (b, V) of the token after each row of idx (b, s), by the full forward."""
    import torch
    with torch.no_grad():
        return net(idx)[0][:, -1]


def full_logits(job):
    """The uncached forward's logits at every position of job["idx"], and after the reordered rows."""
    import torch
    net = model(job)
    with torch.no_grad():
        logits = net(job["idx"])[0]
    reordered = torch.cat([job["ridx"][job["parents"]], job["next"][:, None]], dim=1)
    return logits, next_logits(net, reordered)


def exhaustive(job):
    """(sequences (k, n), scores (k,)): the k most likely of all V^n continuations of the prompt."""
    import torch
    net, V, n, prompt = model(job), job["cfg"]["vocab_size"], job["steps"], job["prompt"]
    seqs = torch.tensor(list(itertools.product(range(V), repeat=n)), dtype=torch.long)
    with torch.no_grad():
        logp = net(torch.cat([prompt.expand(len(seqs), -1), seqs], dim=1))[0].log_softmax(-1)
    scores = logp[:, prompt.numel() - 1:-1].gather(-1, seqs[..., None]).squeeze(-1).sum(1)
    order = scores.sort(descending=True).indices[:job["k"]]
    return seqs[order], scores[order]


def beam_uncached(job):
    """Beam search by definition: each step, the k best of every live beam's V extensions, each
    beam's next-token distribution from the full forward of its whole sequence."""
    import torch
    net, k, prompt = model(job), job["k"], job["prompt"]
    beams = [([], 0.0)]
    for _ in range(job["steps"]):
        idx = torch.stack([torch.cat([prompt, torch.tensor(seq, dtype=torch.long)]) for seq, _ in beams])
        logp = next_logits(net, idx).log_softmax(-1)
        grown = [(seq + [t], score + float(logp[i, t])) for i, (seq, score) in enumerate(beams)
                 for t in range(logp.shape[1])]
        beams = sorted(grown, key=lambda b: -b[1])[:k]
    return torch.tensor([seq for seq, _ in beams]), torch.tensor([s for _, s in beams], dtype=torch.float64)


def scored(job, seqs):
    """Σ log p of each row of seqs (k, n) after the prompt, by the full forward."""
    import torch
    net, prompt = model(job), job["prompt"]
    with torch.no_grad():
        logp = net(torch.cat([prompt.expand(len(seqs), -1), seqs], dim=1))[0].log_softmax(-1)
    return logp[:, prompt.numel() - 1:-1].gather(-1, seqs[..., None]).squeeze(-1).sum(1)


def quant_bounds(job, group_size: int):
    """Per group (groups,), float64: the calibrated range [α, β] of min-max calibration (symmetric:
    ±max|w|; asymmetric: widened to hold 0) and the number of steps of the grid, qmax - qmin."""
    import torch
    spec, w = job["spec"], job["w"].double().reshape(-1, group_size)
    half = 2 ** (spec["bits"] - 1)
    if spec.get("symmetric", True):
        beta = w.abs().amax(1)
        return -beta, beta, 2 * (half - 1), (-(half - 1), half - 1)
    alpha, beta = w.amin(1).clamp(max=0.0), w.amax(1).clamp(min=0.0)
    return alpha, beta, 2 * half - 1, (-half, half - 1)


def group_size(job) -> int:
    """Elements per group of the job's spec (QuantSpec's granularity on an (out, in) weight)."""
    spec, w = job["spec"], job["w"]
    return {"tensor": w.numel(), "channel": w.shape[1], "group": spec.get("group_size")}[spec.get("granularity")]


def loss(job) -> float:
    """The fp32 model's loss on the job's batch: the bar the quantized model is held to."""
    import torch
    with torch.no_grad():
        return float(model(job)(job["idx"], job["targets"])[1])
