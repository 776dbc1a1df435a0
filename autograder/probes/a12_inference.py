"""a12's probe: the student's KV cache, beam search, retrieve and re-rank and quantization run on the
inputs the trusted side sends; raw outputs come back.

The models are the course's GPT with the weights the trusted side sent; decoding is the course's
`scaletrain.infer.decode.forward_cached`, which in the grading build writes into the student's
KVCache. What is measured here, below the student's code: the elements a cache's `write` produces
(aten ops that are not views, counted by a dispatch mode), the bytes of every storage reachable from
the cache object, the positions that reach the model's first block (a hook), the elements handed to
a sort, and torch.topk / kthvalue trapped while the re-rank runs. Nothing here knows an expected
value: references and verdicts are in autograder/suites/a12_inference/.
"""

from __future__ import annotations

import contextlib

from autograder.checks import forbid_aten, student_module
from autograder.wire import short

STEMS = ("infer_kv_cache", "infer_beam", "infer_rerank", "infer_quant")
ANSWERS = ("topk", "kthvalue")  # the answer itself: a re-rank must not call it
SORTS = ("sort", "argsort", "msort", "topk", "kthvalue", "median", "mode")  # what counts as re-ranking


def _out(t):
    import torch
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return short(f"{type(t).__name__}: {t!r}", 200)
    t = torch.empty(t.shape, dtype=t.dtype).copy_(t.detach())
    return t.reshape(1) if t.dim() == 0 else t  # the wire carries no 0-dim tensor


def load(_jobs=None) -> bool:
    """Import the student's files and the library decoding that uses them."""
    import torch
    torch.set_num_threads(1)  # tiny matmuls: two threads on a busy machine wait on each other ~30x longer
    for stem in STEMS:
        student_module(stem)
    import scaletrain.infer.decode  # noqa: F401 - in the grading build, on the student's cache
    return True


@contextlib.contextmanager
def _tally(on_op):
    """`on_op(func, args, out)` for every aten op run inside the block."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Tally(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):  # else the first dispatch imports torch._dynamo (~2.5 s)
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            on_op(func, args, out)
            return out

    with Tally():
        yield


def _elements(tree) -> int:
    import torch
    from torch.utils._pytree import tree_leaves
    return sum(t.numel() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


def _model(job):
    """The course's GPT in the job's dtype with the weights the trusted side sent."""
    import torch
    from scaletrain.models import GPT, GPTConfig

    model = GPT(GPTConfig(**job["cfg"])).to(getattr(torch, job["dtype"])).eval()
    model.load_state_dict(job["weights"])
    return model


def _held_bytes(obj) -> int:
    """Bytes of every distinct storage reachable from `obj` through attributes, lists, tuples and dicts."""
    import torch
    seen, storages, todo = set(), {}, [(obj, 0)]
    while todo:
        item, depth = todo.pop()
        if id(item) in seen or depth > 6:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(item, (list, tuple)):
            todo += [(x, depth + 1) for x in item]
        elif isinstance(item, dict):
            todo += [(x, depth + 1) for x in item.values()]
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            todo += [(x, depth + 1) for x in vars(item).values()]
    return sum(storages.values())


def _counted_writes(cache) -> list:
    """Wrap this cache's `write`: each call adds the elements its non-view aten ops produce."""
    written, write = [0], cache.write

    def counted(*args, **kwargs):
        def on_op(func, _args, out):
            if not func.is_view:
                written[0] += _elements(out)
        with _tally(on_op):
            return write(*args, **kwargs)
    cache.write = counted
    return written


def decode(jobs: list) -> list:
    """Prefill and decode job["idx"] in the chunks `cuts` with the student's cache; then decode
    job["ridx"], reorder its rows by `parents` and decode one more token per row."""
    import torch
    from scaletrain.infer.decode import forward_cached
    from scaletrain.infer.kv_cache import KVCache

    out = []
    for job in jobs:
        model, idx, cuts = _model(job), job["idx"], job["cuts"]
        cache = KVCache.for_model(model, batch=idx.shape[0], max_len=cuts[-1])
        written = _counted_writes(cache)
        logits = [forward_cached(model, idx[:, a:b], cache) for a, b in zip(cuts, cuts[1:])]
        got = {"logits": _out(torch.cat(logits, dim=1)), "written": written[0], "length": cache.length,
               "held": _held_bytes(cache), "nbytes": cache.nbytes}
        ridx = job["ridx"]
        cache = KVCache.for_model(model, batch=ridx.shape[0], max_len=ridx.shape[1] + 1)
        forward_cached(model, ridx, cache)
        cache.reorder(job["parents"].clone())
        got["reordered"] = _out(forward_cached(model, job["next"][:, None], cache)[:, -1])
        out.append(got)
    return out


def beam(jobs: list) -> list:
    """The student's beam_search, with the positions entering the model's first block counted."""
    m = student_module("infer_beam")
    out = []
    for job in jobs:
        model, positions = _model(job), [0]
        hook = model.blocks[0].register_forward_pre_hook(
            lambda _mod, args: positions.__setitem__(0, positions[0] + args[0].shape[0] * args[0].shape[1]))
        seqs, scores = m.beam_search(model, job["prompt"].clone(), beam_size=job["k"], steps=job["steps"])
        hook.remove()
        out.append({"seqs": _out(seqs), "scores": _out(scores), "positions": positions[0]})
    return out


def rerank(jobs: list) -> list:
    """retrieve_rerank (rows) or beam_topk (flat over beams) with torch.topk trapped and the elements
    handed to any sort counted."""
    m = student_module("infer_rerank")
    out = []
    for job in jobs:
        x, ranked = job["x"].clone(), [0]

        def on_op(func, args, _out_):
            if func.overloadpacket.__name__ in SORTS:
                ranked[0] += _elements(args[:1])
        fn = m.retrieve_rerank if job["fn"] == "rows" else m.beam_topk
        with forbid_aten(*ANSWERS), _tally(on_op):
            values, indices = fn(x, job["k"], groups=job["groups"])
        out.append({"values": _out(values), "indices": _out(indices), "sorted": ranked[0], "x_after": _out(x)})
    return out


def quant(jobs: list) -> list:
    """The student's quantize and dequantize on w under the job's spec."""
    m = student_module("infer_quant")
    out = []
    for job in jobs:
        w = job["w"].clone()
        qt = m.quantize(w, m.QuantSpec(**job["spec"]))
        out.append({"q": _out(qt.q), "scale": _out(qt.scale), "zero": _out(qt.zero), "group_size": qt.group_size,
                    "deq": _out(m.dequantize(qt)), "w_after": _out(w)})
    return out


def quant_model(jobs: list) -> list:
    """The course's quantize_model (QuantLinear on the student's codes): the loss on the job's batch."""
    from scaletrain.infer.quant import QuantSpec
    from scaletrain.infer.quant_linear import quantize_model

    import torch

    out = []
    for job in jobs:
        model = quantize_model(_model(job), QuantSpec(**job["spec"]), real=True)
        with torch.no_grad():
            out.append(float(model(job["idx"], job["targets"])[1]))
    return out
