"""The arithmetic of an MoE layer: parameters, FLOPs and bytes per token, as E, k and ep change.

Per layer, hidden size h, expert FFN size f, E experts, k experts per token, m weight matrices per
expert (2 for the GELU MLP here; 3 for SwiGLU experts, Mixtral's):

    parameters       E · m·h·f  (+ biases)  + h·E (router)        grows with E
    active / token   k · m·h·f  + h·E                             grows with k only
    FLOPs / token    2 · active forward, 6 · active forward + backward (Kaplan's 6N; Switch §2)

so E multiplies the parameters at a fixed cost per token, the seed's "many more parameters without
increased computation cost". What E does cost is memory (all E experts' weights, gradients and
optimizer state live somewhere) and, once the experts are spread over ep ranks, communication:
each token's hidden vector travels to each of its k experts and back,

    bytes / token / layer (one rank, forward)  = 2 · k · h · itemsize · (ep-1)/ep   (uniform routing)

twice more in the backward; the (ep-1)/ep is the share of a token's experts on other ranks.
Unlike tensor parallelism's allreduces, this does not shrink as ep grows: the all-to-all moves
activations, not weights, which is why EP groups sit inside a node where they can (mesh.py).

`ep_step_bytes` gives the exact bytes of one forward + backward of one expert-parallel layer from
the counts the ranks routed (what the tests hold `comm_counter` to).
"""

from __future__ import annotations

from typing import Sequence

from scaletrain.moe.all_to_all import SPLIT_BYTES

__all__ = ["expert_params", "layer_params", "active_params", "flops_per_token", "alltoall_bytes_per_token",
           "ep_step_bytes", "MIXTRAL_8X7B", "model_params"]


def expert_params(*, hidden: int, ffn_hidden: int, matrices: int = 2, bias: bool = True) -> int:
    """One expert: m·h·f weights, plus f + h biases for the 2-matrix MLP with bias."""
    return matrices * hidden * ffn_hidden + ((ffn_hidden + hidden) if bias else 0)


def layer_params(*, hidden: int, ffn_hidden: int, num_experts: int, matrices: int = 2, bias: bool = True) -> int:
    """Every expert and the router (h·E, no bias)."""
    return num_experts * expert_params(hidden=hidden, ffn_hidden=ffn_hidden, matrices=matrices, bias=bias) \
        + hidden * num_experts


def active_params(*, hidden: int, ffn_hidden: int, num_experts: int, top_k: int, matrices: int = 2,
                  bias: bool = True) -> int:
    """The parameters one token's forward touches: k experts and the router."""
    return top_k * expert_params(hidden=hidden, ffn_hidden=ffn_hidden, matrices=matrices, bias=bias) \
        + hidden * num_experts


def flops_per_token(*, hidden: int, ffn_hidden: int, num_experts: int, top_k: int, matrices: int = 2,
                    training: bool = True) -> int:
    """2 FLOPs per active weight forward; 3x that with the backward (weights and inputs)."""
    weights = active_params(hidden=hidden, ffn_hidden=ffn_hidden, num_experts=num_experts, top_k=top_k,
                            matrices=matrices, bias=False)
    return (6 if training else 2) * weights


def alltoall_bytes_per_token(*, hidden: int, top_k: int, ep: int, itemsize: int = 2, training: bool = True) -> float:
    """Bytes one rank sends per token it routes, one layer, uniform routing: 2 all-to-alls forward
    (dispatch, combine) and 2 backward, each k·h·itemsize·(ep-1)/ep."""
    return (4 if training else 2) * top_k * hidden * itemsize * (ep - 1) / ep


def ep_step_bytes(counts: Sequence[Sequence[int]], *, rank: int, row_bytes: int) -> int:
    """Exact bytes rank `rank` sends in one forward + backward of one expert-parallel layer.

    counts[i][e]: rows rank i routed to global expert e (after capacity), for the ep ranks of the
    group. With E_l = E/ep experts per rank, rank r sends send[j] = Σ_{e of rank j} counts[r][e]
    rows to rank j and receives recv[i] = Σ_{e of rank r} counts[i][e] from rank i:
        forward:  the count exchange 8·E_l·(ep-1), dispatch Σ_{j≠r} send[j], combine Σ_{i≠r} recv[i]
        backward: combine's gradients Σ_{j≠r} send[j], dispatch's Σ_{i≠r} recv[i]
    """
    ep, e = len(counts), len(counts[0])
    per = e // ep
    send = [sum(counts[rank][j * per:(j + 1) * per]) for j in range(ep)]
    recv = [sum(counts[i][rank * per:(rank + 1) * per]) for i in range(ep)]
    rows = 2 * sum(s for j, s in enumerate(send) if j != rank) + 2 * sum(s for i, s in enumerate(recv) if i != rank)
    return rows * row_bytes + SPLIT_BYTES * per * (ep - 1)


# Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1): 32 layers, h 4096, SwiGLU experts
# of f 14336 (3 matrices), E 8, k 2, 32 query / 8 key-value heads of 128, vocabulary 32000, untied.
# The paper: 47B parameters, 13B active per token.
MIXTRAL_8X7B = dict(n_layer=32, hidden=4096, ffn_hidden=14336, num_experts=8, top_k=2, matrices=3,
                    n_head=32, n_kv_head=8, vocab=32000)


def model_params(*, n_layer: int, hidden: int, ffn_hidden: int, num_experts: int, top_k: int, matrices: int,
                 n_head: int, n_kv_head: int, vocab: int) -> dict[str, int]:
    """Total and active parameters of a decoder whose every FFN is an MoE layer, bias-free (Mixtral's
    shape): attention with grouped KV heads, RMSNorms, untied embedding and head."""
    head = hidden // n_head
    attention = hidden * hidden * 2 + 2 * hidden * n_kv_head * head  # q, o; k, v
    norms = 2 * hidden
    moe = dict(hidden=hidden, ffn_hidden=ffn_hidden, num_experts=num_experts, matrices=matrices, bias=False)
    per_layer = attention + norms + layer_params(**moe)
    active_layer = attention + norms + active_params(top_k=top_k, **moe)
    embed = 2 * vocab * hidden + hidden  # embedding, head, final norm
    return {"total": n_layer * per_layer + embed, "active": n_layer * active_layer + embed}
