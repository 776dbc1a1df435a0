"""Notebook 08's helpers: what one training step of each method sends, priced by module 2's α–β
model at any link bandwidth, against the compute that compression adds.

A message of b bytes costs α + b·β (scaletrain.comm.cost_model). Per step and per bucket, on p
ranks (the busiest rank's critical path, the byte counts of the methods' module docs):

    adam (DP)      one ring allreduce of n elements          2(p−1) messages, 2(p−1)·⌈n/p⌉·4 bytes
    powersgd r     ring allreduces of [uncompressed, P's, Q's] (powersgd_payloads), each as above
    1-bit (EF)     one ring all-gather of ⌈n/32⌉ + k words  (p−1) messages, (p−1)·4·(⌈n/32⌉ + k) bytes
                   (k scales)
    1-bit Adam     compressed_allreduce of all N parameters  2(p−1) messages, compressed_allreduce_bytes

Compression pays on a link of bandwidth B when the transfer time it saves, T_DP(B) − T_method(B),
exceeds the compute it adds (measured: the step-time difference to DataParallel in the same run,
where the loopback transfer itself is nearly free). The seminar notes §1.2.8.2: PowerSGD "is a
great tool to use if all-reduce communication is the bottleneck".

`feedback_bias` trains the tiny GPT of the benchmark twice per compressor, with and without error
feedback, on the same seeds and batches, and follows the telescoping sum of onebit.py's doc:
‖Σ_t (out_t − mean_w g_w,t)‖, the part of the true gradients that has not arrived yet. The exact
mean is computed beside the hook with gloo's own allreduce (not counted, not used for training).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.distributed as dist

from scaletrain.comm.cost_model import AlphaBeta
from scaletrain.compression.onebit_adam import compressed_allreduce_bytes
from scaletrain.compression.powersgd import powersgd_payloads

__all__ = ["model_buckets", "step_messages", "transfer_seconds", "feedback_bias"]


def model_buckets(cfg, cap_mb: float = 25.0) -> list[list[tuple[int, ...]]]:
    """Parameter shapes per DataParallel bucket (torch DDP's 25 MB default) of `GPT(cfg)`, built on
    the meta device: a 1.5B-parameter layout without its memory."""
    from scaletrain.dp.bucket import assign_buckets
    from scaletrain.models import GPT

    with torch.device("meta"):
        params = list(GPT(cfg, seed=0).parameters())
    return [[tuple(params[i].shape) for i in bucket] for bucket in assign_buckets(params, int(cap_mb * 2**20))]


def _ring(numel: int, p: int) -> tuple[int, int]:
    return 2 * (p - 1), 2 * (p - 1) * math.ceil(numel / p) * 4


def step_messages(method: str, bucket_shapes: Sequence[Sequence[tuple[int, ...]]], p: int) -> list[tuple[int, int]]:
    """(messages, bytes) on the busiest rank's path for each collective of one step of `method`
    (a name of scaletrain.compression.benchmark) on buckets of these parameter shapes."""
    sizes = [sum(math.prod(s) for s in shapes) for shapes in bucket_shapes]
    if method == "adam (DP)":
        return [_ring(n, p) for n in sizes]
    if method.startswith("powersgd r="):
        rank = int(method.split("=")[1].split(",")[0])
        return [_ring(k, p) for shapes in bucket_shapes for k in powersgd_payloads(shapes, rank)]
    if method.startswith("1-bit Adam"):
        return [(2 * (p - 1), compressed_allreduce_bytes(sum(sizes), p))]
    if method.startswith("1-bit"):  # "1-bit EF": one scale per bucket; "1-bit EF, 64/scale": one per 64 elements
        per_scale = int(method.split("/scale")[0].rsplit(" ", 1)[1]) if "/scale" in method else None
        return [(p - 1, (p - 1) * 4 * (math.ceil(n / 32) + (math.ceil(n / per_scale) if per_scale else 1)))
                for n in sizes]
    raise ValueError(f"unknown method {method!r}")


def transfer_seconds(method: str, bucket_shapes, p: int, model: AlphaBeta) -> float:
    """α–β time of one step's collectives of `method`, one after another."""
    return sum(m * model.alpha_s + b * model.beta_s_per_byte for m, b in step_messages(method, bucket_shapes, p))


class _Tracked:
    """A compression hook that also accumulates Σ_t (its output − the exact mean) per bucket."""

    def __init__(self, hook):
        self.hook, self.drift = hook, {}

    def reduce(self, index: int, flat: torch.Tensor, shapes) -> torch.Tensor:
        out = self.hook.reduce(index, flat, shapes)
        exact = flat.detach().clone()
        dist.all_reduce(exact)
        self.drift[index] = self.drift.get(index, 0) + (out - exact / dist.get_world_size())
        return out


def _feedback_rank(rank: int, p: int, steps: int, methods: tuple[str, ...]) -> dict[str, Any]:
    from scaletrain.compression import benchmark
    from scaletrain.compression.hook import compressed_data_parallel
    from scaletrain.models import GPT
    from scaletrain.data import corpus

    tokens, out = corpus(), {}
    for method in methods:
        hook = _Tracked(benchmark.HOOKS[method](steps))
        model = compressed_data_parallel(GPT(benchmark.CFG, seed=0), hook, bucket_cap_mb=benchmark.CAP_MB)
        opt = torch.optim.Adam(model.parameters(), lr=benchmark.LR)
        losses, drift = [], []
        for step in range(steps):
            x, y = benchmark.batch(tokens, step, rank, p)
            loss = model(x, y)[1]
            loss.backward()
            model.finish_gradient_synchronization()
            opt.step()
            opt.zero_grad(set_to_none=True)
            both = loss.detach().reshape(1)
            dist.all_reduce(both)
            losses.append(both.item() / p)
            drift.append(math.sqrt(sum(float(d.pow(2).sum()) for d in hook.drift.values())))
        model.close()
        out[method] = {"losses": losses, "drift": drift}
    return out


def feedback_bias(world_size: int = 2, *, steps: int = 20,
                  methods: tuple[str, ...] = ("powersgd r=1", "powersgd r=1, no EF", "1-bit EF, 64/scale",
                                              "1-bit, 64/scale, no EF")):
    """{method: {"losses": [...], "drift": [‖Σ_{s≤t}(out_s − exact mean_s)‖ for each step t]}} (rank 0's;
    the output is identical on every rank, so is the drift up to the exact mean's rounding)."""
    from scaletrain.launch import spawn

    return spawn(_feedback_rank, world_size, steps, tuple(methods), timeout_s=120 + 8 * steps * len(methods))[0]
