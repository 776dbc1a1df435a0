"""Compile module 1b's Triton kernels (attention, cross-entropy, embedding) for sm_80 without a GPU.

The same check as module 1's (triton_compile.py: the interpreter accepts code the compiler
rejects), with these kernels' signatures.  `compile_fused(module)` runs triton_compile's
compile_module with SIGNATURES added to its table for the duration of the call.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from unittest import mock

import torch

from scaletrain.ops.toolchain import triton_compile

__all__ = ["SIGNATURES", "compile_fused", "launch_local_memory"]

_I, _F, _L = "i32", "*fp32", "*i64"
_ATT = dict(seq_q=_I, seq_k=_I, head_dim=_I, scale="fp32")
# the causal branch holds all the code of the other one; head dim 128 is the largest tile
_TILES = [dict(CAUSAL=True, DOT_PRECISION="tf32", BLOCK_M=64, BLOCK_N=64, BLOCK_D=128)]
# the dK/dV kernel with and without dQ's atomic adds (attention_triton.DQ_BY_ATOMICS): two different programs
_DKDV_TILES = [{**tile, "ATOMIC_DQ": atomic} for tile in _TILES for atomic in (False, True)]

SIGNATURES = {
    "attention_fwd_kernel": (dict(q_ptr="{T}", k_ptr="{T}", v_ptr="{T}", o_ptr="{T}", lse_ptr=_F, **_ATT), _TILES),
    "attention_bwd_delta_kernel": (dict(o_ptr="{T}", do_ptr="{T}", delta_ptr=_F, seq_q=_I, head_dim=_I),
                                   [dict(BLOCK_M=64, BLOCK_D=128)]),
    "attention_bwd_dkdv_kernel": (dict(q_ptr="{T}", k_ptr="{T}", v_ptr="{T}", do_ptr="{T}", lse_ptr=_F, delta_ptr=_F,
                                       dk_ptr="{T}", dv_ptr="{T}", dq_ptr=_F, **_ATT), _DKDV_TILES),
    "attention_bwd_dq_kernel": (dict(q_ptr="{T}", k_ptr="{T}", v_ptr="{T}", do_ptr="{T}", lse_ptr=_F, delta_ptr=_F,
                                     dq_ptr="{T}", **_ATT), _TILES),
    "cross_entropy_fwd_kernel": (dict(x_ptr="{T}", target_ptr=_L, loss_ptr=_F, lse_ptr=_F, vocab=_I, smoothing="fp32",
                                      ignore_index="i64"), [dict(BLOCK_V=4096)]),
    "cross_entropy_bwd_kernel": (dict(x_ptr="{T}", target_ptr=_L, lse_ptr=_F, dloss_ptr=_F, dx_ptr="{T}", vocab=_I,
                                      smoothing="fp32", ignore_index="i64"), [dict(BLOCK_V=4096)]),
    "embedding_fwd_kernel": (dict(ids_ptr=_L, tok_ptr="{T}", pos_ptr="{T}", y_ptr="{T}", keep_ptr="*i8", tokens=_I,
                                  seq=_I, dim=_I, p="fp32", seed=_I),
                             [dict(DROPOUT=True, BLOCK_T=16, BLOCK_D=128)]),
    "embedding_bwd_kernel": (dict(ids_ptr=_L, dy_ptr="{T}", keep_ptr="*i8", dtok_ptr=_F, dpos_ptr=_F, tokens=_I,
                                  seq=_I, dim=_I, p="fp32"),
                             [dict(DROPOUT=True, BLOCK_T=16, BLOCK_D=128)]),
}


def compile_fused(module: ModuleType, *, arch: int = 80, storage: str = "fp16",
                  kernels: tuple[str, ...] | None = None) -> list[dict]:
    """triton_compile.compile_module over SIGNATURES' kernels that `module` defines."""
    with mock.patch.dict(triton_compile.KERNEL_SIGNATURES, SIGNATURES):
        names = tuple(SIGNATURES) if kernels is None else kernels
        return triton_compile.compile_module(module, arch=arch, storage=storage, kernels=names)


def launch_local_memory(module: ModuleType, dtype: torch.dtype, head_dim: int, *, arch: int = 90) -> list[dict]:
    """The forward, dK/dV and dQ kernels of `module` (kernels/attention_triton.py) compiled for sm_{arch}
    as its launcher configures them for a GPU tensor of `dtype` and `head_dim` (its tiles, dot precision
    and warps; causal, the longer program), each with the local memory a thread keeps
    (triton_compile.local_memory_bytes): one row per kernel."""
    q = SimpleNamespace(shape=(1, 1, head_dim), dtype=dtype, is_cuda=True, element_size=lambda: dtype.itemsize)
    options = module.launch_options(q)
    warps = options.pop("num_warps")
    storage = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    rows = []
    for name, extra in (("attention_fwd_kernel", {}), ("attention_bwd_dkdv_kernel", {"ATOMIC_DQ": False}),
                        ("attention_bwd_dq_kernel", {})):
        kernel = triton_compile.compile_kernel(getattr(module, name), SIGNATURES[name][0],
                                               {"CAUSAL": True, **options, **extra}, arch, storage,
                                               options=dict(num_warps=warps))
        rows.append({"kernel": name, "dtype": storage, "head_dim": head_dim, "warps": warps, **options,
                     "local_bytes": triton_compile.local_memory_bytes(kernel)})
    return rows
