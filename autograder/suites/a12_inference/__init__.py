"""Assignment a12: inference of the trained model (`assignments/a12_inference/`).

Every group is trusted (`Group.trusted`): this process never imports the submission. The probe
`autograder.probes.a12_inference` runs the student's KV cache (through the course's cached decoding,
which in the grading build writes into it), beam search, retrieve and re-rank and group-wise
quantization in the sandboxed worker on hidden inputs sent from here; raw outputs come back. What
decides a verdict is here (judge.py, judge_quant.py, against reference.py):

- values by properties any correct design has: the model's full forward at every step, exhaustive
  search over all V^n continuations (k >= V^(n-1)), a beam search that reruns every prefix,
  torch.topk's values with indices that point at them (ties: any tied index), an error bound per
  group read off the weights, with r̂ = (q - Z)·S recomputed from the returned codes;
- the technique by evidence measured below the student's code and granted only with the values
  (`Check.needs`): the bytes of every storage the cache holds or leaves alive, the elements its code
  produces, the positions run through the model's first block (by value: any copy, any route), the
  elements handed to a sort or worked on out of the probe's sight (numpy, Python, another thread).

torch.topk and kthvalue are forbidden in the re-rank file, by name and at run time (aten and function level
trapped), and so is the course's Triton re-rank (scaletrain.ops' kernel loader, triton; the worker imports
no Triton at all): its candidates would be counted as none.
Beam search runs on the student's own cache: a reorder that is wrong costs task 12.2's values too.
"""

from autograder.manifest import Check, Group, Manifest, Task

from .names import (BEAM, C_BEAM, C_BEAM_COST, C_BEAM_PRUNED, C_BYTES, C_CACHE, C_Q_ERROR, C_Q_GROUPS, C_Q_MODEL,
                    C_REORDER, C_RR, C_RR_BEAMS, C_RR_COUNT, C_STEP, CACHE, QUANT, RERANK, SOURCES)
from .planted import PLANTED

# and torch's switches for its modes: the probe's counters are dispatch modes (a tripwire: a name
# looked up at run time gets past it, and then the counters find the work's outputs from nowhere)
_NO_TRICKS = ("importlib", "__import__", "exec", "eval", "torch._C", "torch.utils._python_dispatch", "torch.overrides")
_OWN = _NO_TRICKS + ("scaletrain.infer",)  # beam search alone builds on the package (its cache, its decoding)

MANIFEST = Manifest(
    assignment="a12", folder="a12_inference",
    title="Inference: KV cache, beam search, retrieve and re-rank, quantization",
    files=dict(SOURCES),
    tasks=(
        Task("12.1", "The KV cache: append, read, reorder by beam, its bytes", file=CACHE,
             functions=("__init__", "nbytes", "write", "reorder")),
        Task("12.2", "Beam search on the cache", file=BEAM, functions=("beam_search",)),
        Task("12.3", "Retrieve and re-rank (LightSeq)", file=RERANK,
             functions=("rough_threshold", "candidates", "_rerank", "retrieve_rerank", "beam_topk")),
        Task("12.4", "Group-wise quantization (Q-BERT)", file=QUANT, functions=("quantize", "dequantize")),
    ),
    forbidden={CACHE: _OWN, BEAM: _NO_TRICKS + ("scaletrain.infer.beam",), QUANT: _OWN,
               RERANK: _OWN + ("torch.topk", "torch.kthvalue", "scaletrain.ops", "triton")},  # not the course's kernel
    groups=(
        Group("decode", "autograder.suites.a12_inference.judge:group_decode", timeout_s=90, trusted=True, checks=(
            Check("12.1", C_CACHE, 4), Check("12.1", C_REORDER, 2), Check("12.1", C_BYTES, 2, needs=(C_CACHE,)),
            Check("12.1", C_STEP, 2, needs=(C_CACHE,)),
            Check("12.2", C_BEAM, 4), Check("12.2", C_BEAM_PRUNED, 3), Check("12.2", C_BEAM_COST, 3, needs=(C_BEAM,)),
        )),
        Group("rerank", "autograder.suites.a12_inference.judge:group_rerank", timeout_s=60, trusted=True, checks=(
            Check("12.3", C_RR, 4), Check("12.3", C_RR_BEAMS, 3), Check("12.3", C_RR_COUNT, 3, needs=(C_RR,)),
        )),
        Group("quant", "autograder.suites.a12_inference.judge_quant:group_quant", timeout_s=60, trusted=True, checks=(
            Check("12.4", C_Q_ERROR, 4), Check("12.4", C_Q_GROUPS, 3), Check("12.4", C_Q_MODEL, 3, needs=(C_Q_ERROR,)),
        )),
    ),
    planted=PLANTED,
    public_boundary=("candidates strictly above the threshold (the k-th group maximum dropped)",),
)
