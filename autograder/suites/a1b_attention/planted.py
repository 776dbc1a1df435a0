"""a1b's planted submissions: each an edit of the solution's kernel files and the outcome it must get."""

from __future__ import annotations

from autograder.attacks import kernel_attacks
from autograder.manifest import REPO, Planted

from .names import (AT, C_BWD, C_BWD_ATOMIC, C_BWD_CAUSAL, C_BWD_TILES, C_CAUSAL, C_FP16, C_FWD_TILES, C_HUGE,
                    C_SMOKE, compile_check)

_ATOMIC_DQ = "_mm(ds.to(q.dtype), tl.trans(kt), DOT_PRECISION) * scale"  # the dK/dV kernel's share of dQ
_TWO_KERNELS = {C_BWD: "passed", C_BWD_CAUSAL: "passed", C_BWD_TILES: "passed"}  # dQ from the dq kernel

# A launcher patched at import to compute attention in torch, the scores materialized (n x n).
_DENSE = '''

_launch = type(attention_fwd_kernel).__getitem__


def _dense(self, grid):
    if getattr(getattr(self, "fn", None), "__name__", "") != "attention_fwd_kernel":
        return _launch(self, grid)

    def run(q, k, v, o, lse, seq_q, seq_k, head_dim, scale, **meta):
        s = torch.matmul(q.float(), k.float().transpose(1, 2)) * scale
        if meta["CAUSAL"]:
            s = s.masked_fill(torch.ones(seq_q, seq_k, dtype=torch.bool).triu(1), float("-inf"))
        m = s.amax(-1, keepdim=True)
        lse.copy_((m + (s - m).exp().sum(-1, keepdim=True).log()).squeeze(-1))
        o.copy_(torch.matmul((s - lse[..., None]).exp(), v.float()))
    return run


type(attention_fwd_kernel).__getitem__ = _dense
'''

PLANTED = (
    Planted("no running max (exp overflows on large scores)", AT,
            ("m_new = tl.maximum(m_i, tl.max(s, axis=1))", "m_new = tl.zeros_like(m_i)"),
            groups=("smoke",), expect={C_SMOKE: "passed", C_HUGE: "failed"}),
    Planted("causal mask off by one (hides the diagonal)", AT,
            ("hidden = hidden | (offs_n[None, :] > offs_m[:, None])",
             "hidden = hidden | (offs_n[None, :] >= offs_m[:, None])"),
            # the backward shares the mask: the public causal backward test fails too (issue 27)
            groups=("smoke", "attention"),
            expect={C_SMOKE: "passed", C_CAUSAL: "failed", C_BWD: "passed", C_BWD_CAUSAL: "failed"}),
    # the launcher patched at import computes in torch beside a kernel that stores zeros: the
    # grader takes only the file's @triton.jit functions, so the patch never runs, and the kernel,
    # which compiles, earns no compile points without its values (issue 28)
    Planted("a launcher patched at import to compute in torch, the kernel storing zeros", AT,
            (("    o = acc / l_i[:, None]\n", "    o = acc * 0.0\n"),
             ("\n\ndef attention_tiles(", _DENSE + "\n\ndef attention_tiles(")),
            groups=("smoke", "compile_triton"),
            expect={C_SMOKE: "failed", C_CAUSAL: "failed", compile_check("1b.1"): "failed"}),
    Planted("calls scaled_dot_product_attention", AT,
            ("    o = torch.empty_like(q)\n",
             "    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"),
            groups=("smoke",), expect={C_SMOKE: "flagged", C_CAUSAL: "flagged"}),
    Planted("backward without the rowsum(dO * O) term", AT,
            ("        ds = p * (dp - delta[:, None])\n", "        ds = p * dp\n"),
            groups=("attention",), expect={C_BWD: "failed", C_FP16: "passed"}),
    Planted("infinite loop in the forward kernel", AT,
            ("    o = acc / l_i[:, None]\n", "    while True:\n        pass\n    o = acc / l_i[:, None]\n"),
            groups=("smoke",), expect={C_SMOKE: "timeout"},
            timeout_s=10),  # the plant hangs: no need to wait the group's limit
    *(Planted(name, AT, replace, groups=("smoke",), expect={C_SMOKE: outcome})
      for name, (replace, outcome) in kernel_attacks(
          file=AT, kernel="attention_fwd_kernel", anchor="\n\ndef attention_tiles(",
          result_line="    o = acc / l_i[:, None]\n", result="o", zero="acc * 0.0",
          checks=[C_SMOKE, C_HUGE], source=str(REPO / "kernels" / AT)).items()),
    # a small slip costs its share: the dQ loop's causal bound, right only for square tiles
    Planted("the dQ causal loop stops BLOCK_N keys past the query tile's start, not BLOCK_M", AT,
            ("        hi = tl.minimum(seq_k, start_m + BLOCK_M)\n", "        hi = tl.minimum(seq_k, start_m + BLOCK_N)\n"),
            groups=("attention",), expect={C_BWD_TILES: "failed", C_BWD_CAUSAL: "passed", C_BWD: "passed",
                                           C_FWD_TILES: "passed"}),
    # the atomic dQ (DQ_BY_ATOMICS) is graded on its own: its slips cost that check only
    Planted("the atomic dQ without the scale", AT, (_ATOMIC_DQ, _ATOMIC_DQ.removesuffix(" * scale")),
            groups=("attention",), expect={C_BWD_ATOMIC: "failed", **_TWO_KERNELS}),
    # rows past seq_q add zeros (dO is 0 there), so an unmasked row is invisible; keys in the future are not
    Planted("the atomic dQ from P without the causal mask", AT,
            (_ATOMIC_DQ, "_mm((_recompute_p(q, kt, lse, offs_m, offs_n, seq_q, seq_k, scale, False, DOT_PRECISION)"
                         " * (dp - delta[:, None])).to(q.dtype), tl.trans(kt), DOT_PRECISION) * scale"),
            groups=("attention",), expect={C_BWD_ATOMIC: "failed", **_TWO_KERNELS}),
)
