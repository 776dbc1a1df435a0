"""a12's planted submissions: each an edit of the solution and the outcomes it must get."""

from __future__ import annotations

import textwrap

from autograder.attacks import IMPORTER, function_attacks
from autograder.manifest import REPO, Planted

from .names import (BEAM, C_BEAM, C_BEAM_COST, C_BEAM_PRUNED, C_BYTES, C_CACHE, C_Q_ERROR, C_Q_GROUPS, C_Q_MODEL,
                    C_REORDER, C_RR, C_RR_BEAMS, C_RR_COUNT, C_STEP, CACHE, QUANT, RERANK, SOURCES)

_WRITE = ("        self.k[layer][:, :, self.length:end] = k\n        self.v[layer][:, :, self.length:end] = v\n"
          "        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]\n")
_NEXT = "            logits = forward_cached(model, tokens[:, None], cache)[:, -1]\n"
_MASK = "    mask = candidates(x, k, groups)\n    rows, V = x.shape\n"
_ORDER = "    order = values.sort(dim=-1, descending=True, stable=True).indices[..., :k]\n"
_ZERO = "        zero = qmin - torch.round(alpha / scale)\n"
_NBYTES = "        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))\n"
_ADVANCE = "        self.length += n\n"
_ALL_ROW = (_MASK, "    mask = torch.ones_like(x, dtype=torch.bool)\n    rows, V = x.shape\n")  # no retrieval
_RERANK = ("rerank",)
_QUANT = ("quant",)
_DECODE = ("decode",)
_ALL_RR = (C_RR, C_RR_BEAMS, C_RR_COUNT)


def _all(outcome: str, names) -> dict:
    return {name: outcome for name in names}


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (issue 13's catalogue), each in place of `KVCache.nbytes`'s body
    (a method: one more indent): under the trusted split they earn nothing. The import and the disk
    read fail inside the decoding probe, so the cache's other checks share their `error`."""
    attacks = function_attacks(checks=[C_BYTES], module="scaletrain.infer.kv_cache",
                               source=str(REPO / SOURCES[CACHE]), call="KVCache.nbytes.fget(self)")
    return tuple(Planted(name, CACHE, (_NBYTES, textwrap.indent(body, "    ") + "\n"), groups=_DECODE,
                         expect={C_BYTES: outcome, C_BEAM: "passed"})
                 for name, (body, outcome) in attacks.items())


PLANTED = (
    # 12.1
    Planted("reorder moves the keys with the beams and leaves the values", CACHE,
            ("for cache in (self.k, self.v):", "for cache in (self.k,):"), groups=_DECODE,
            expect={C_REORDER: "failed", C_BEAM: "failed", C_CACHE: "passed", C_BYTES: "passed"}),
    Planted("cache preallocated twice as long as asked", CACHE,
            ("shape = (batch, n_head, max_len, head_dim)", "shape = (batch, n_head, 2 * max_len, head_dim)"),
            groups=_DECODE, expect={C_BYTES: "failed", C_CACHE: "passed", C_STEP: "passed", C_BEAM: "passed"}),
    # right logits and bytes, O(n²) copies: the history concatenated again at every step
    Planted("a cache that concatenates the whole history every step", CACHE,
            (("shape = (batch, n_head, max_len, head_dim)", "shape = (batch, n_head, 0, head_dim)"),
             (_WRITE, "        self.k[layer] = torch.cat([self.k[layer], k], dim=2)\n"
                      "        self.v[layer] = torch.cat([self.v[layer], v], dim=2)\n"
                      "        return self.k[layer], self.v[layer]\n")),
            groups=_DECODE, expect={C_STEP: "failed", C_CACHE: "passed", C_BYTES: "passed", C_BEAM: "passed"}),
    # the same O(n²) copies outside write() (the probe counts whatever the cache's code runs), and the
    # formula's bytes in sight with more kept where no walk from the cache reaches (alive all the same)
    Planted("a cache that copies its buffers in advance() and keeps every write in a module global", CACHE,
            ((_ADVANCE, _ADVANCE + "        self.k = [t.clone() for t in self.k]\n"
                                   "        self.v = [t.clone() for t in self.v]\n"),
             ('__all__ = ["KVCache", "cache_bytes"]\n', '__all__ = ["KVCache", "cache_bytes"]\n_KEPT = []\n'),
             (_WRITE, "        _KEPT.append((k.clone(), v.clone()))\n" + _WRITE)),
            groups=_DECODE, expect={C_STEP: "failed", C_BYTES: "failed", C_CACHE: "passed", C_BEAM: "passed"}),
    # 12.2
    Planted("beam search that forgets to reorder the cache", BEAM, ("            cache.reorder(parents)\n", ""),
            groups=_DECODE, expect={C_BEAM: "failed", C_BEAM_PRUNED: "failed", C_CACHE: "passed"}),
    # right sequences and scores without the cache: the whole prefix of every beam again each step
    Planted("beam search that reruns every beam's whole sequence each step", BEAM,
            (_NEXT, "            logits = model(torch.cat([prompt.expand(k, -1), seqs], dim=1))[0][:, -1]\n"),
            groups=_DECODE, expect={C_BEAM: "passed", C_BEAM_PRUNED: "passed", C_BEAM_COST: "failed"}),
    # the same on a fresh copy of the model, its blocks' forward called past any hook, the logits of the
    # last positions only, through a broadcast multiply
    Planted("beam search that reruns every sequence on a fresh copy of the model, by hand", BEAM,
            (_NEXT, "            twin = type(model)(model.cfg).to(model.wte.weight.dtype).eval()\n"
                    "            twin.load_state_dict(model.state_dict())\n"
                    "            full = torch.cat([prompt.expand(k, -1), seqs], dim=1)\n"
                    "            x = twin.wte(full) + twin.wpe(torch.arange(full.shape[1]))\n"
                    "            for block in twin.blocks:\n"
                    "                x = block.forward(x)\n"
                    "            logits = (twin.ln_f(x)[:, -1, None, :] * twin.wte.weight).sum(-1)\n"),
            groups=_DECODE, expect={C_BEAM: "passed", C_BEAM_PRUNED: "passed", C_BEAM_COST: "failed"}),
    # 12.3; a boundary the public tests exercise: LightSeq's example keeps the 4 at R
    Planted("candidates strictly above the threshold (the k-th group maximum dropped)", RERANK,
            ("return x >= rough_threshold(", "return x > rough_threshold("), groups=_RERANK,
            expect=_all("failed", _ALL_RR)),
    # right values, no retrieval: every row sorted whole
    Planted("retrieve and re-rank that sorts every whole row", RERANK, _ALL_ROW, groups=_RERANK,
            expect={C_RR: "passed", C_RR_BEAMS: "passed", C_RR_COUNT: "failed"}),
    # whole rows ranked where a dispatch mode sees no sort: in numpy, with the modes turned off, in a thread
    Planted("re-rank by numpy's argsort of every whole row", RERANK,
            (_ALL_ROW, (_ORDER, "    import numpy\n    order = torch.from_numpy(numpy.argsort(-values.numpy(), "
                                "axis=-1, kind='stable')[..., :k].copy())\n")), groups=_RERANK,
            expect={C_RR: "passed", C_RR_BEAMS: "passed", C_RR_COUNT: "failed"}),
    Planted("re-rank by topk with torch's dispatch and function modes turned off (names built at run time)", RERANK,
            (_ORDER, "    with getattr(torch.utils, '_python' + '_dispatch')._disable_current_modes(), "
                     "getattr(torch, '_' + 'C').DisableTorchFunction():\n"
                     "        order = values.topk(k, dim=-1).indices\n"), groups=_RERANK,
            expect=_all("flagged", _ALL_RR)),
    Planted("re-rank that sorts every whole row in a thread", RERANK,
            (_ALL_ROW, (_ORDER, "    import threading\n    box = []\n    worker = threading.Thread(target=lambda: "
                                "box.append(values.sort(dim=-1, descending=True, stable=True).indices[..., :k]))\n"
                                "    worker.start()\n    worker.join()\n    order = box[0]\n")), groups=_RERANK,
            expect=_all("flagged", _ALL_RR)),
    Planted("re-rank by torch.topk (forbidden)", RERANK,
            (_ORDER, "    order = torch.topk(values, k, dim=-1).indices\n"), groups=_RERANK,
            expect=_all("flagged", _ALL_RR)),
    Planted("re-rank by the course's Triton kernel, loaded from kernels/", RERANK,
            (_MASK, "    from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module\n"
                    "    return load_kernel_module(KERNELS_DIR / 'retrieve_rerank_triton.py')"
                    ".retrieve_rerank(x, k, groups or k)[:2]\n" + _MASK), groups=_RERANK,
            expect=_all("flagged", _ALL_RR)),
    Planted("re-rank by the course's Triton kernel, imported by a name built at run time", RERANK,
            (_MASK, "    import os\n    os.environ['TRITON_INTERPRET'] = '1'\n"
                    f"    ref = {IMPORTER}('scaletrain.infer.rerank' + '_triton', fromlist=['x'])\n"
                    "    return ref.retrieve_rerank_triton(x, k, groups=groups or k)[:2]\n" + _MASK), groups=_RERANK,
            expect={C_RR: "flagged", C_RR_COUNT: "flagged"}),
    Planted("re-rank by topk looked up by a name built at run time", RERANK,
            (_ORDER, "    order = getattr(torch, 'to' + 'pk')(values, k, dim=-1).indices\n"), groups=_RERANK,
            expect=_all("flagged", _ALL_RR)),
    Planted("re-rank that never ends", RERANK, (_MASK, "    while x.numel():\n        pass\n" + _MASK),
            groups=_RERANK, timeout_s=5, expect=_all("timeout", _ALL_RR)),
    # 12.4
    Planted("asymmetric scale without the zero point", QUANT, (_ZERO, "        zero = torch.zeros_like(scale)\n"),
            groups=_QUANT, expect=_all("failed", (C_Q_ERROR, C_Q_GROUPS, C_Q_MODEL))),
    Planted("one scale for the whole tensor where groups were asked", QUANT,
            (("        scale = (beta / qmax).clamp_min(tiny)\n",
              "        scale = (beta.amax() / qmax).clamp_min(tiny).expand_as(beta)\n"),
             ("        scale = ((beta - alpha) / (qmax - qmin)).clamp_min(tiny)\n",
              "        scale = ((beta.amax() - alpha.amin()) / (qmax - qmin)).clamp_min(tiny).expand_as(beta)\n")),
            groups=_QUANT, expect={C_Q_ERROR: "failed", C_Q_GROUPS: "failed"}),
    # right codes; dequantize hands back the float weight it kept
    Planted("dequantize returns the original weight kept beside the codes", QUANT,
            (("    return Quantized(q.to(torch.int8).reshape(w.shape), scale, zero, g, spec)\n",
              "    qt = Quantized(q.to(torch.int8).reshape(w.shape), scale, zero, g, spec)\n"
              "    qt.kept = w.detach().clone()\n    return qt\n"),
             ("    groups = qt.q.reshape(-1, qt.group_size).to(qt.scale.dtype)\n",
              "    return qt.kept.to(dtype or qt.scale.dtype)\n")),
            groups=_QUANT, expect=_all("failed", (C_Q_ERROR, C_Q_GROUPS, C_Q_MODEL))),
    Planted("quantize kills its process (crash)", QUANT, (_ZERO, "        import os\n        os._exit(3)\n"),
            groups=_QUANT, expect=_all("error", (C_Q_ERROR, C_Q_GROUPS))),
    *_attacks(),
    Planted("syntax error", QUANT, ("def dequantize(", "def dequantize(("), groups=_QUANT,
            expect=_all("error", (C_Q_ERROR, C_Q_GROUPS, C_Q_MODEL))),
)
