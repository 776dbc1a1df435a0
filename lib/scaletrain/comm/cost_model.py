"""The α–β (latency–bandwidth) cost model of allreduce, with α and β fitted from measurements.

A message of b bytes costs α + b·β: α is the fixed cost per message (software stack, wake-ups),
β the inverse bandwidth (s/byte). An allreduce of n bytes on p ranks then costs, along its
critical path ("Large scale deep learning optimizations" seminar,
§1.2.2 Data parallel: tree- or ring-based allreduce, chosen by the backend; Thakur, Rabenseifner &
Gropp 2005):

    algorithm   messages (×α)      bytes (×β)              bytes sent by the busiest rank
    ring        2(p-1)             2(p-1)/p · n            2(p-1)/p · n   (every rank: bandwidth-optimal)
    tree        2⌈log2 p⌉          2⌈log2 p⌉ · n           ⌈log2 p⌉ · n   (binomial reduce + broadcast)
    naive       2(p-1)             2(p-1) · n              (p-1) · n      (all to rank 0, then back)

Ring wins for large n (its β term does not grow with p), tree for small n (fewer α terms). The
naive row charges the root's p-1 receives and p-1 sends one after another; a root that posts them
all at once (naive.py) overlaps their α's, but its bytes still funnel through one link. The
reduction's arithmetic is folded into β. `fit` recovers α and β from measured (p, n, t) by least
squares on relative error, so 4 KiB and 64 MiB points weigh alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

__all__ = ["ALGORITHMS", "AlphaBeta", "Sample", "terms", "bytes_per_rank", "predict", "fit"]

ALGORITHMS = ("ring", "tree", "naive")


@dataclass(frozen=True, kw_only=True)
class AlphaBeta:
    """alpha_s: seconds per message; beta_s_per_byte: seconds per byte (1/bandwidth)."""
    alpha_s: float
    beta_s_per_byte: float

    def __post_init__(self):
        if not (self.alpha_s >= 0 and self.beta_s_per_byte >= 0):
            raise ValueError(f"AlphaBeta: alpha and beta must be >= 0, got {self.alpha_s}, {self.beta_s_per_byte}")

    @property
    def bandwidth_gbps(self) -> float:
        return math.inf if self.beta_s_per_byte == 0 else 1e-9 / self.beta_s_per_byte


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One measurement: `algorithm` on `world_size` ranks reduced `nbytes` in `seconds`."""
    algorithm: str
    world_size: int
    nbytes: int
    seconds: float

    def __post_init__(self):
        _check(self.algorithm, self.world_size, self.nbytes)
        if not self.seconds > 0:
            raise ValueError(f"Sample: seconds must be > 0, got {self.seconds}")


def _check(algorithm: str, world_size: int, nbytes: float) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose from {ALGORITHMS}")
    if world_size < 1 or nbytes < 0:
        raise ValueError(f"need world_size >= 1 and nbytes >= 0, got {world_size}, {nbytes}")


def terms(algorithm: str, world_size: int, nbytes: float) -> tuple[float, float]:
    """(messages, bytes) on the critical path: time = messages·α + bytes·β."""
    _check(algorithm, world_size, nbytes)
    p = world_size
    if algorithm == "ring":
        return 2 * (p - 1), 2 * (p - 1) / p * nbytes
    if algorithm == "tree":
        rounds = 2 * math.ceil(math.log2(p)) if p > 1 else 0
        return rounds, rounds * nbytes
    return 2 * (p - 1), 2 * (p - 1) * nbytes


def bytes_per_rank(algorithm: str, world_size: int, nbytes: float) -> float:
    """Bytes sent by the busiest rank (what comm_counter measures on it)."""
    _check(algorithm, world_size, nbytes)
    p = world_size
    if algorithm == "ring":
        return 2 * (p - 1) / p * nbytes
    if algorithm == "tree":
        return math.ceil(math.log2(p)) * nbytes if p > 1 else 0.0
    return (p - 1) * nbytes


def predict(model: AlphaBeta, algorithm: str, world_size: int, nbytes: float) -> float:
    """Predicted seconds for one allreduce."""
    messages, volume = terms(algorithm, world_size, nbytes)
    return messages * model.alpha_s + volume * model.beta_s_per_byte


def fit(samples: Iterable[Sample]) -> AlphaBeta:
    """Least-squares α, β minimising the relative error Σ((messages·α + bytes·β)/t - 1)²; negative
    solutions are clipped to 0 and the other coefficient refitted alone."""
    rows = [(*terms(s.algorithm, s.world_size, s.nbytes), s.seconds) for s in samples]
    rows = [r for r in rows if r[0] or r[1]]  # p = 1 costs nothing and says nothing
    if len(rows) < 2:
        raise ValueError(f"fit: need at least 2 samples with p > 1, got {len(rows)}")
    a = np.array([[m / t, b / t] for m, b, t in rows])
    ones = np.ones(len(rows))
    alpha, beta = np.linalg.lstsq(a, ones, rcond=None)[0]
    if alpha < 0 or beta < 0:  # one term explains nothing: fit the other one alone
        col = 1 if alpha < 0 else 0
        coef = float(a[:, col] @ ones / (a[:, col] @ a[:, col]))
        alpha, beta = (0.0, coef) if col == 1 else (coef, 0.0)
    return AlphaBeta(alpha_s=float(alpha), beta_s_per_byte=float(beta))
