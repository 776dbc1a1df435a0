"""a12's probe: the student's KV cache, beam search, retrieve and re-rank and quantization run on the
inputs the trusted side sends; raw outputs come back.

The models are the course's GPT with the weights the trusted side sent; decoding is the course's
`scaletrain.infer.decode.forward_cached`, which in the grading build writes into the student's
KVCache. What is measured here, below the student's code, by dispatch modes: the elements produced
while the cache's code runs (aten ops that are not views, any of its frames on the stack), the bytes
of every storage reachable from the cache or made while decoding and still alive, the positions
run through the first block (rows of ops that read its qkv weight, matched by value), the
elements a re-rank ranks out of sight (handed to a sort, taken out of torch, or arriving from a
storage no op made), and torch.topk / kthvalue trapped while the re-rank runs. Modes are per thread
and a child process's work is unseen, so the worker starts neither once the files load (`_alone`).
Nothing here knows an expected value: references and verdicts are in autograder/suites/a12_inference/.
"""

from __future__ import annotations

import contextlib

from autograder.checks import Flagged, forbid_aten, student_module
from autograder.wire import short

STEMS = ("infer_kv_cache", "infer_beam", "infer_rerank", "infer_quant")
ANSWERS = ("topk", "kthvalue")  # the answer itself: a re-rank must not call it
SORTS = ("sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode",  # what counts as re-ranking
         "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive")
# Tensor methods that hand a tensor's elements to Python, numpy or raw memory, where a sort is not seen
# (printing is not among them: a debugging print costs no points)
LEAVES = ("tolist", "numpy", "__array__", "__dlpack__", "untyped_storage", "storage", "_typed_storage", "data_ptr",
          "item", "__float__", "__int__", "__bool__", "__index__", "__complex__", "__reduce_ex__", "__getstate__")


def _out(t):
    import torch
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return short(f"{type(t).__name__}: {t!r}", 200)
    t = torch.empty(t.shape, dtype=t.dtype).copy_(t.detach())
    return t.reshape(1) if t.dim() == 0 else t  # the wire carries no 0-dim tensor


# audit events of a new process: its work (a sort, a forward) would reach none of the probe's counters
SPAWNS = ("os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp", "os.spawn", "os.exec", "os.system",
          "subprocess.Popen")


def _alone() -> None:
    """From here on this worker starts no thread and no process and imports no Triton (`Flagged`):
    torch's dispatch modes, which count every measure here, are per thread, a child's work is out of
    sight, and the course's finished re-rank is a Triton kernel (kernels/retrieve_rerank_triton.py,
    whose work no aten op shows), loaded by whatever route. Set before the student's files are
    imported, so that none keeps the originals; `_posixsubprocess` has no audit event."""
    import _posixsubprocess
    import _thread
    import sys
    import threading

    def trap(*_args, **_kwargs):
        raise Flagged("started a thread or a process: the grader's counters see only this one")

    def audit(event, args):
        if event in SPAWNS:
            trap()
        if event == "import" and str(args[0]).split(".")[0] == "triton":
            raise Flagged("imported triton: the course's kernels are not for a12's files to run")
    _thread.start_new_thread = threading._start_new_thread = _posixsubprocess.fork_exec = trap
    sys.addaudithook(audit)


def load(_jobs=None) -> bool:
    """Import the student's files and the library decoding that uses them, alone (`_alone`)."""
    import torch
    torch.set_num_threads(1)  # tiny matmuls: two threads on a busy machine wait on each other ~30x longer
    _alone()
    for stem in STEMS:
        student_module(stem)
    import scaletrain.infer.decode  # noqa: F401 - in the grading build, on the student's cache
    return True


@contextlib.contextmanager
def _tally(on_op):
    """`on_op(func, args, out)` for every aten op run inside the block; `Flagged` if the mode was taken
    off the stack and put back meanwhile (torch's `_disable_current_modes`: the ops between, unseen)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    pushes = [0]

    class Tally(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):  # else the first dispatch imports torch._dynamo (~2.5 s)
            return False

        @property
        def _dispatch_key(self):  # read by torch's _push_mode: when the block enters, and when put back
            pushes[0] += 1
            raise AttributeError("_dispatch_key")  # none: pushed as before

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            on_op(func, args, out)
            return out

    with Tally():
        yield
    if pushes[0] != 1:
        raise Flagged("turned the grader's dispatch mode off and on: the work between is unseen")


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


def _reachable(obj) -> dict:
    """data_ptr -> bytes of every distinct storage reachable from `obj` through attributes, lists, tuples and dicts."""
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
    return storages


def _own_code(stem: str):
    """True while a frame of the submission's files is on the stack (the folder of `stem`): what the
    student's code runs, from whichever of its methods, properties or hooks, and nothing else."""
    import os
    import sys
    folder = os.path.dirname(os.path.abspath(student_module(stem).__file__)) + os.sep

    def inside() -> bool:
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename.startswith(folder):
                return True
            frame = frame.f_back
        return False
    return inside


class _Sight:
    """What student code works on out of the probe's sight, and the storages it leaves alive.

    `unseen`: the elements taken out of torch (to Python, numpy, raw memory: LEAVES) and those of every
    storage that reaches an op, or comes back (`arrived`), from nowhere the probe saw: none of `known`,
    made by no op it saw (in numpy, from a list, in another thread, with the modes off); the whole
    storage, since a view may show k elements of a sorted row. Storages are held weakly, by identity,
    so that `alive` finds what the code kept, wherever it keeps it."""

    def __init__(self, known, forbidden=()):
        import weakref
        self.unseen, self.forbidden, self._mine = 0, forbidden, False
        self._known = weakref.WeakValueDictionary()
        self.arrived(known, made=True)

    def arrived(self, tensors, made: bool = False) -> None:
        self._mine = True  # the probe's own untyped_storage() calls take nothing out of torch
        for t in tensors:
            storage = t.untyped_storage()
            if not made and id(storage) not in self._known:
                self.unseen += storage.nbytes() // t.element_size()
            self._known[id(storage)] = storage
        self._mine = False

    def alive(self, skip) -> dict:
        """data_ptr -> bytes of the storages met that are still alive, but those of `skip`."""
        skipped = {t.untyped_storage().data_ptr() for t in skip}
        return {s.data_ptr(): s.nbytes() for s in list(self._known.values()) if s.data_ptr() not in skipped}

    @contextlib.contextmanager
    def watching(self, on_op):
        """`on_op(func, args, out)` for every aten op inside the block (`_tally`); `forbidden` trapped a
        level above, where turning torch's dispatch modes off does not reach."""
        import torch
        from torch.overrides import TorchFunctionMode
        from torch.utils._pytree import tree_leaves
        sight = self

        def each(func, args, out):
            sight.arrived(t for t in tree_leaves(args) if isinstance(t, torch.Tensor))
            on_op(func, args, out)
            sight.arrived((t for t in tree_leaves(out) if isinstance(t, torch.Tensor)), made=True)

        class Leaving(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if name in sight.forbidden:
                    raise Flagged(f"called `{name}`, the answer itself")
                if not sight._mine and name in LEAVES:
                    sight.unseen += sum(t.numel() for t in args[:1] if isinstance(t, torch.Tensor))
                return func(*args, **(kwargs or {}))

        with Leaving(), _tally(each):
            yield self


def decode(jobs: list) -> list:
    """Prefill and decode job["idx"] in the chunks `cuts` with the student's cache; then decode
    job["ridx"], reorder its rows by `parents` and decode one more token per row."""
    import gc

    import torch
    from scaletrain.infer.decode import forward_cached
    from scaletrain.infer.kv_cache import KVCache

    out = []
    for job in jobs:
        model, idx, cuts = _model(job), job["idx"], job["cuts"]
        given, inside, written = [*model.parameters(), *model.buffers(), idx], _own_code("infer_kv_cache"), [0]

        def on_op(func, _args, out):  # what the cache's code makes, from wherever it runs
            if not func.is_view and inside():
                written[0] += _elements(out)
        with _Sight(given).watching(on_op) as sight:
            cache = KVCache.for_model(model, batch=idx.shape[0], max_len=cuts[-1])
            logits = [forward_cached(model, idx[:, a:b], cache) for a, b in zip(cuts, cuts[1:])]
        gc.collect()  # what is alive only through a cycle is garbage, not held
        held = {**_reachable(cache), **sight.alive(given + logits)}  # a copy in a global is alive, not reachable
        got = {"logits": _out(torch.cat(logits, dim=1)), "written": written[0] + sight.unseen, "length": cache.length,
               "held": sum(held.values()), "nbytes": cache.nbytes}
        ridx = job["ridx"]
        cache = KVCache.for_model(model, batch=ridx.shape[0], max_len=ridx.shape[1] + 1)
        forward_cached(model, ridx, cache)
        cache.reorder(job["parents"].clone())
        got["reordered"] = _out(forward_cached(model, job["next"][:, None], cache)[:, -1])
        out.append(got)
    return out


@contextlib.contextmanager
def _positions(weight):
    """[n]: positions run through the first block: rows of what every op reading its qkv weight
    (out, in) makes, or reading a tensor equal to it or a view of one: a copy of the model, the weight
    in parts, a product spelled as einsum or a broadcast multiply count the same."""
    import torch
    from torch.utils._pytree import tree_leaves
    weight, count, tagged = weight.detach(), [0], {}

    def tag(t) -> None:
        if t.numel() == weight.numel() and t.dim() >= 2 and t.shape[:-2].numel() == 1 and any(
                t.shape[-2:] == w.shape and torch.equal(t.reshape(w.shape), w) for w in (weight, weight.T)):
            tagged[id(t.untyped_storage())] = t.untyped_storage()  # held: no later storage takes its id

    def on_op(func, args, out):
        if func.is_view:
            return
        reads = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor)]
        for t in reads:
            tag(t)
        if any(id(t.untyped_storage()) in tagged for t in reads):
            count[0] += _elements(out) // weight.shape[0]
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                tag(t)
    with _tally(on_op):
        yield count


def beam(jobs: list) -> list:
    """The student's beam_search, with the positions run through the model counted (`_positions`)."""
    m = student_module("infer_beam")
    out = []
    for job in jobs:
        model = _model(job)
        with _positions(model.blocks[0].attn.qkv.weight) as positions:
            seqs, scores = m.beam_search(model, job["prompt"].clone(), beam_size=job["k"], steps=job["steps"])
        out.append({"seqs": _out(seqs), "scores": _out(scores), "positions": positions[0]})
    return out


def rerank(jobs: list) -> list:
    """retrieve_rerank (rows) or beam_topk (flat over beams) with torch.topk trapped and the elements
    ranked counted: handed to a sort, or out of the probe's sight (`_Sight`)."""
    import torch
    m = student_module("infer_rerank")
    out = []
    for job in jobs:
        x, sorted_ = job["x"].clone(), [0]

        def on_op(func, args, _out):
            if func.overloadpacket.__name__ in SORTS:
                sorted_[0] += _elements(args[:1])
        fn = m.retrieve_rerank if job["fn"] == "rows" else m.beam_topk
        with forbid_aten(*ANSWERS), _Sight([x], forbidden=ANSWERS).watching(on_op) as sight:
            values, indices = fn(x, job["k"], groups=job["groups"])
        sight.arrived(t for t in (values, indices) if isinstance(t, torch.Tensor))
        out.append({"values": _out(values), "indices": _out(indices), "sorted": sorted_[0] + sight.unseen,
                    "x_after": _out(x)})
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
