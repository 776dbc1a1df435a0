"""Which kind of work an operation is: the categories of the seeds' "GPT-2 Profiling: Time".

training-speedup-lecture.md ("GPT-2 Profiling: Time", "Profiling Time of Elementary Operations")
splits a GPT-2 step by operation: the linear layers (matmul), attention, LayerNorm, GeLU and the
elementwise rest, which are "limited by memory access speed".  We add the optimizer step and
communication, the two other places a training step's time goes, and `other` for what is none of
these (embedding lookups, the cross-entropy, copies and views).

`categorise` takes the name the profiler records: an aten op (`aten::addmm`), an autograd node
(`AddmmBackward0`, from `autograd::engine::evaluate_function: AddmmBackward0`) or a collective
(`c10d::allreduce_`, `nccl:all_reduce`, `gloo:all_reduce`).  Rules are tried in order: the first
pattern found in the name wins, so `scaled_dot_product` (attention) is tested before `mm`.
"""

from __future__ import annotations

import re

__all__ = ["CATEGORIES", "categorise"]

CATEGORIES = ("matmul", "attention", "normalization", "activation", "elementwise", "optimizer", "communication",
              "other")

# BEGIN SOLUTION
# STUB: # your design: rules, tables, anything that decides a name's category
_RULES: tuple[tuple[str, str], ...] = (
    # collectives first: `all_reduce` must not fall into the elementwise `add`/`sum` rules below
    ("communication", r"c10d::|nccl|gloo|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|"
                      r"\bsend\b|\brecv\b|isend|irecv"),
    ("attention", r"scaled_dot_product|ScaledDotProduct|flash_attention|efficient_attention|[Aa]ttention"),
    # the optimizer's own kernels (torch.optim's foreach and fused paths); in the optimizer phase
    # everything counts as optimizer anyway (trace.py), this names them outside it too
    ("optimizer", r"_foreach_|_fused_adam|_fused_sgd|[Oo]ptimizer"),
    ("matmul", r"(^|::|_)(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|einsum|_scaled_mm)(_|$)|"
               r"^(Addmm|Mm|Bmm|Baddbmm|Linear|Matmul)Backward"),
    # softmax normalises a row to sum 1: with LayerNorm, module 1's memory-bound row reductions
    ("normalization", r"layer_norm|LayerNorm|rms_norm|RmsNorm|batch_norm|BatchNorm|group_norm|GroupNorm|"
                      r"(^|::|_)softmax|Softmax"),
    ("activation", r"gelu|Gelu|relu|Relu|threshold_backward|silu|Silu|sigmoid|Sigmoid|tanh|Tanh|(^|::|_)glu(_|$)|Glu"),
    ("elementwise", r"(^|::)(add|sub|mul|div|neg|exp|log|sqrt|rsqrt|pow|where|masked_fill|clamp|lerp|"
                    r"addcmul|addcdiv|fill|zero|copy|dropout|native_dropout|native_dropout_backward)_?(\.|$)|"
                    r"^(Add|Sub|Mul|Div|Neg|Exp|Pow|Dropout|NativeDropout|Where|MaskedFill)Backward|"
                    r"AccumulateGrad"),
)
_COMPILED = tuple((category, re.compile(pattern)) for category, pattern in _RULES)
# END SOLUTION


def categorise(name: str) -> str:
    """The category of the profiler event named `name`: exactly one of CATEGORIES, a str.

    Names come as the profiler records them (module docstring): an aten op, an autograd node, bare
    or inside `autograd::engine::evaluate_function: `, a collective, the optimizer's marked regions.
    What each category holds (the seeds' split, plus the optimizer and communication):

      matmul         products of matrices: mm, addmm, bmm, baddbmm, addbmm, matmul, linear, einsum
      attention      fused attention: scaled_dot_product_attention and every kernel it dispatches to
                     (flash, efficient, cuDNN, math, the CPU flash kernel)
      normalization  LayerNorm, RMSNorm, BatchNorm, GroupNorm, and softmax / log-softmax (row
                     reductions like LayerNorm, module 1)
      activation     GeLU, ReLU (whose backward is threshold_backward), SiLU, sigmoid, tanh, GLU
      elementwise    arithmetic one element at a time, in place or not: add, sub, mul, div, neg, exp,
                     log, sqrt, rsqrt, pow, where, masked_fill, clamp, lerp, addcmul, addcdiv, dropout;
                     the writes fill_, zero_, copy_; a leaf's gradient accumulation (AccumulateGrad)
      optimizer      torch.optim's own kernels (the multi-tensor `_foreach_*`, the fused `_fused_*`
                     optimizers) and its marked regions (`Optimizer.step#AdamW.step`, `Optimizer.zero_grad#...`)
      communication  collectives and point-to-point: `c10d::` ops, `nccl:` and `gloo:` events
      other          the rest: embedding lookups, the loss (cross_entropy_loss, nll_loss), views and
                     reshapes, allocation, new copies and casts (clone, to, _to_copy), reductions (sum, mean)

    Every op's backward goes where its forward goes (AddmmBackward0: matmul; GeluBackward0 and
    gelu_backward: activation).  Unknown names are `other`."""
    # BEGIN SOLUTION
    name = name.rpartition("evaluate_function: ")[2] or name  # the autograd node inside the engine's wrapper
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return "other"
    # END SOLUTION
