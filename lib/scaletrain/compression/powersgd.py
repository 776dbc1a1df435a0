"""PowerSGD: rank-r gradient compression by one step of power iteration, with error feedback.

Vogels, Karimireddy & Jaggi, 2019, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", Algorithm 1 (compression: one step of subspace iteration per
training step, warm-started from the previous step's Q) and Algorithm 2 (error feedback); seminar
notes §1.2.8.2. Each gradient of a bucket is viewed as a matrix M (n × m: shape[0] × the rest).

What every correct design satisfies, and what the grader checks:
  * the output is identical on every rank and equals, per compressed matrix, the projection of the
    mean over ranks of the compressor's input onto a rank-r subspace found by one power-iteration
    step from the bucket's previous Q (any orthonormal basis of it: the projection does not
    depend on which); tensors that would not shrink (vectors: biases, LayerNorm; or
    n·m ≤ (n+m)·r·min_compression_rate, torch's rule) are averaged exactly;
  * error feedback: the compressor's input is the gradient plus this rank's memory, and after the
    step the mean of the memories over the ranks is exactly what the output lost (the mean input
    minus the output), so over many steps the sum of the outputs tracks the sum of the true means;
  * the messages are those of torch's `powerSGD_hook` (torch.distributed.algorithms.ddp_comm_hooks,
    non-batched): the uncompressed tensors, then all P's of the bucket in one message, then all
    Q's; a bucket sends ring bytes of Σ(n+m)·r + Σ uncompressed instead of Σ n·m.

`start_iter`: the first steps of a bucket are plain allreduces (the seed's "defer PowerSGD for
some initial steps"; torch's start_powerSGD_iter).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from scaletrain.comm import ring_allreduce

__all__ = ["orthogonalize", "should_compress", "PowerSGD", "powersgd_payloads"]


def orthogonalize(matrix: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """An orthonormal basis of the column space of `matrix` (n × r, r ≤ n, full column rank), as an
    n × r matrix; it may overwrite `matrix` and return it.

    Graded by property: QᵀQ = I and Q Qᵀ·matrix = matrix, to float tolerance. The method is yours
    (Vogels et al. 2019 orthogonalize P̂ with Gram-Schmidt; a QR decomposition is another answer);
    `eps` is there to guard a column whose norm is 0. Pitfall: keep it stable when the columns are
    nearly parallel (a warm-started P is: power iteration aligns its columns)."""
    # BEGIN SOLUTION
    r = matrix.shape[1]
    for i in range(r):
        col = matrix[:, i:i + 1]
        col.div_(torch.linalg.vector_norm(col) + eps)
        if i + 1 < r:
            rest = matrix[:, i + 1:]
            rest.sub_(col * (col * rest).sum(dim=0, keepdim=True))
    return matrix
    # END SOLUTION


def should_compress(n: int, m: int, rank: int, min_compression_rate: float = 2.0) -> bool:
    """torch's rule: compress an n × m matrix at rank r when (n + m)·r·rate < n·m."""
    return (n + m) * rank * min_compression_rate < n * m


def _matrix_shape(shape: torch.Size) -> tuple[int, int]:
    n = shape[0] if len(shape) else 1
    return n, max(1, math.prod(shape) // max(n, 1))


def powersgd_payloads(shapes: Sequence[torch.Size], rank: int, min_compression_rate: float = 2.0) -> list[int]:
    """Elements of the allreduces one compressed step of a bucket sends: [uncompressed, P's, Q's]
    (zeros left out)."""
    unc = ps = qs = 0
    for shape in shapes:
        n, m = _matrix_shape(shape)
        r = min(n, m, rank)
        if len(shape) > 1 and should_compress(n, m, r, min_compression_rate):
            ps, qs = ps + n * r, qs + m * r
        else:
            unc += math.prod(shape)
    return [x for x in (unc, ps, qs) if x]


class PowerSGD:
    """Compression hook (hook.py): rank-`rank` PowerSGD with error feedback and warm-started Q.

    Args:
        rank: r, the approximation rank (per matrix, min(n, m, r)).
        group: the data-parallel process group.
        error_feedback: keep e_w and add it to the next gradient (turn off to see the bias).
        warm_start: reuse the last averaged Q as the next step's Q (one power-iteration step per
            training step); otherwise a fresh random Q every step.
        start_iter: steps per bucket that are plain allreduces before compression starts.
        min_compression_rate: torch's threshold for compressing a matrix at all.
        seed: the random initial Q (identical on every rank: same seed, same bucket index).
        allreduce: f(tensor) summing in place over the group; default our ring (counted by
            comm_counter).
    """

    def __init__(self, rank: int = 1, *, group: Any = None, error_feedback: bool = True,
                 warm_start: bool = True, start_iter: int = 0, min_compression_rate: float = 2.0,
                 seed: int = 0, eps: float = 1e-8,
                 allreduce: Callable[[torch.Tensor], Any] | None = None):
        if rank < 1:
            raise ValueError(f"PowerSGD: rank must be >= 1, got {rank}")
        self.rank, self.group = rank, group
        self.error_feedback, self.warm_start = error_feedback, warm_start
        self.start_iter, self.min_compression_rate = start_iter, min_compression_rate
        self.seed, self.eps = seed, eps
        self.allreduce = allreduce or (lambda t: ring_allreduce(t, op="sum", group=group))
        self.errors: dict[int, torch.Tensor] = {}
        self.q_memory: dict[int, list[torch.Tensor]] = {}
        self.steps: dict[int, int] = {}

    def _initial_q(self, index: int, k: int, m: int, r: int, like: torch.Tensor) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index * 10_007 + k)
        q = torch.randn(m, r, generator=gen, dtype=torch.float32).to(like)
        return orthogonalize(q, self.eps)

    def reduce(self, index: int, flat: torch.Tensor, shapes: Sequence[torch.Size]) -> torch.Tensor:
        """Bucket `index`'s local gradient `flat` (the parameters of `shapes`, concatenated) -> the
        synchronized gradient, identical on every rank (the properties in the module docstring).

        State, per bucket: `self.errors[index]` (this rank's memory, flat like `flat`, absent
        before the first compressed step: what it holds is your design, within the module
        docstring's invariant) and `self.q_memory[index]` (one m × r Q per compressed matrix, in
        bucket order, the warm start of the next step). Exactly three `self.allreduce` calls
        (sums): the uncompressed tensors (given), then all P's concatenated, then all Q's.
        `flat` is not modified. Read Vogels et al. 2019, Alg. 1 and 2 (and their §3 on why the
        warm start makes one iteration per step enough)."""
        p = dist.get_world_size(self.group)
        step = self.steps.get(index, 0)
        self.steps[index] = step + 1
        if step < self.start_iter:
            out = flat.clone()
            self.allreduce(out)
            return out.div_(p)
        x = flat.clone()
        if self.error_feedback:
            # BEGIN SOLUTION
            if index in self.errors:
                x.add_(self.errors[index])
            # END SOLUTION
        # split the bucket into matrices to compress and tensors sent as they are
        offsets, o = [], 0
        for shape in shapes:
            offsets.append(o)
            o += math.prod(shape)
        compress, plain = [], []  # (k, matrix view into x, r) / (offset, numel)
        for k, (shape, off) in enumerate(zip(shapes, offsets)):
            n, m = _matrix_shape(shape)
            r = min(n, m, self.rank)
            if len(shape) > 1 and should_compress(n, m, r, self.min_compression_rate):
                compress.append((k, x[off:off + n * m].view(n, m), r))
            else:
                plain.append((off, math.prod(shape)))
        out = torch.empty_like(x)
        if plain:  # allreduce #0: the uncompressed tensors, in one message
            unc = torch.cat([x[off:off + numel] for off, numel in plain])
            self.allreduce(unc)
            unc.div_(p)
            pos = 0
            for off, numel in plain:
                out[off:off + numel] = unc[pos:pos + numel]
                pos += numel
        if compress:
            if not self.warm_start or index not in self.q_memory:
                self.q_memory[index] = [self._initial_q(index, k, M.shape[1], r, x) for k, M, r in compress]
            qs = self.q_memory[index]
            # one power-iteration step per matrix, two messages (all P's, then all Q's); the new Q's
            # are the bucket's warm start, the output goes in place of each matrix
            # BEGIN SOLUTION
            p_flat = torch.cat([(M @ q).reshape(-1) for (_, M, _), q in zip(compress, qs)])
            self.allreduce(p_flat)  # allreduce #1: all P's of the bucket
            p_hats, pos = [], 0
            for _, M, r in compress:
                n = M.shape[0]
                p_hats.append(orthogonalize(p_flat[pos:pos + n * r].view(n, r), self.eps))
                pos += n * r
            q_flat = torch.cat([(M.t() @ ph).reshape(-1) for (_, M, _), ph in zip(compress, p_hats)])
            self.allreduce(q_flat)  # allreduce #2: all Q's of the bucket
            q_flat.div_(p)
            new_qs, pos = [], 0
            for (k, M, r), ph in zip(compress, p_hats):
                m = M.shape[1]
                q = q_flat[pos:pos + m * r].view(m, r)
                pos += m * r
                off = offsets[k]
                out[off:off + M.numel()] = (ph @ q.t()).reshape(-1)
                new_qs.append(q.clone())
            self.q_memory[index] = new_qs
            # END SOLUTION
        if self.error_feedback:
            # BEGIN SOLUTION
            self.errors[index] = x - out
            # END SOLUTION
        return out
