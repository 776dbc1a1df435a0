"""a8's planted submissions: wrong answers, other designs that earn every point, small slips
that cost their share, cheats of each technique and attacks on the grader, each with the outcomes
the selftest expects."""

import textwrap

from autograder.attacks import IMPORTER, report_forger
from autograder.manifest import REPO, Planted

from .names import (C_LB_LAYER, C_LB_STEP, C_LB_TRUST, C_OB_BIAS, C_OB_CODEC, C_OB_MEM, C_OB_STEP, C_OB_WIRE, C_PS_BIAS, C_PS_EF,
                    C_PS_MEM, C_PS_STEP, C_PS_WIRE, LB, LB_CHECKS, OB, P, PS, PS_CHECKS, SRC)


_LB_UPDATE = '                x.sub_(u * (group["lr"] * trust))\n'
_LB_FIRST = '                w_norm, u_norm = torch.linalg.vector_norm(x), torch.linalg.vector_norm(u)\n'


_LOCAL_RESIDUAL = (  # Vogels et al.'s Alg. 2 read locally: e_w = M_w − P̂(M_wᵀP̂)ᵀ, whose mean is M̄ − out
    "            local = out.clone()\n"
    "            for (k, M, r), ph in zip(compress, p_hats if compress else []):\n"
    "                local[offsets[k]:offsets[k] + M.numel()] = (ph @ (M.t() @ ph).t()).reshape(-1)\n"
    "            self.errors[index] = x - local\n")
_EXACT_MEAN_PS = (
    "            self.allreduce(torch.zeros(sum(M.shape[0] * r for _, M, r in compress)))  # P's sizes\n"
    "            self.allreduce(torch.zeros(sum(M.shape[1] * r for _, M, r in compress)))  # Q's sizes\n"
    "            exact = x.clone()\n"
    "            getattr(dist, 'all_' + 'reduce')(exact, group=self.group)\n"
    "            for k, M, r in compress:\n"
    "                out[offsets[k]:offsets[k] + M.numel()] = exact[offsets[k]:offsets[k] + M.numel()] / p\n"
    "            return out\n")
_EXACT_MEAN_OB = (
    "        message = torch.zeros_like(torch.cat([words, scales.view(torch.int32)]))\n"
    "        ring_all_gather(message, p * message.numel(), group=self.group)\n"
    "        exact = x.clone()\n"
    "        _UNSEEN['sum'](exact, group=self.group)\n"
    "        self.errors[index] = torch.zeros_like(x)\n"
    "        return (exact / p).to(flat.dtype)\n"
    "        message = torch.cat([words, scales.view(torch.int32)])\n")


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (issue 13's catalogue) in place of LAMB's trust ratio, which
    they leave undone (the parameter never moves): under the trusted split they earn nothing."""
    body = {
        "forges 'passed' lines in every report it can find (and at exit)": (
            textwrap.indent(report_forger(list(LB_CHECKS)), " " * 12) +
            "                if not getattr(LAMB, 'forged', False):   # once: walking /tmp is slow\n"
            "                    LAMB.forged = True\n"
            "                    forge(); atexit.register(forge)\n                continue\n", "failed"),
        "patches the grader's classify through sys.modules": (
            f"                ctx = {IMPORTER}('autograder.context', fromlist=['x'])\n"
            "                ctx.classify = lambda exc, submission: ('passed', '')\n"
            "                continue\n", "failed"),
        "reads the expected parameters out of the caller's frames": (
            "                try:\n                    raise ZeroDivisionError\n"
            "                except ZeroDivisionError as e:\n                    frame = e.__traceback__.tb_frame\n"
            "                while frame is not None:\n"
            "                    for key in ('want', 'expected', 'ref'):\n"
            "                        if isinstance(frame.f_locals.get(key), dict):\n"
            "                            x.copy_(frame.f_locals[key]['params'][0][0])\n"
            "                    frame = frame.f_back\n"
            "                continue\n", "failed"),
        "imports the reference LAMB by a name built at run time": (
            f"                ref = {IMPORTER}('scaletrain.compression.la' + 'mb', fromlist=['x'])\n"
            "                return ref.LAMB.step(self, closure)\n", "error"),
        "reads the reference from the grader's disk": (
            f"                code = open({str(REPO / SRC[LB])!r}).read()\n"
            "                scope = {'__name__': 'stolen'}\n"
            f"                {IMPORTER}('builtins').exec(code, scope)\n"
            "                return scope['LAMB'].step(self, closure)\n", "error"),
    }
    return tuple(Planted(name, LB, (_LB_FIRST, text + _LB_FIRST), groups=("lamb",),
                         expect={C_LB_STEP: outcome, C_LB_LAYER: outcome})
                 for name, (text, outcome) in body.items())


PLANTED = (
    Planted("PowerSGD without error feedback", PS,
            (("            if index in self.errors:\n                x.add_(self.errors[index])\n",
              "            pass\n"),
             ("            self.errors[index] = x - out\n", "            pass\n")),
            groups=("powersgd",),
            expect={C_PS_BIAS: "failed", C_PS_EF: "failed", C_PS_MEM: "failed", C_PS_STEP: "passed",
                    C_PS_WIRE: "passed"}),
    # the design decisions: other orthogonalizations and another memory earn every point
    Planted("PowerSGD orthogonalizes with torch.linalg.qr and keeps each rank's local residual", PS,
            (("    r = matrix.shape[1]\n    for i in range(r):\n",
              "    q, _ = torch.linalg.qr(matrix)\n    return matrix.copy_(q)\n    for i in range(r):\n"),
             ("            self.errors[index] = x - out\n", _LOCAL_RESIDUAL)),
            groups=("powersgd",), expect={c: "passed" for c in PS_CHECKS}),
    Planted("PowerSGD's memory keeps only the compressed matrices' loss (a small slip)", PS,
            ("            self.errors[index] = x - out\n",
             "            self.errors[index] = x - out\n"
             "            for k, M, r in compress:\n"
             "                self.errors[index][offsets[k]:offsets[k] + M.numel()] *= 0.5\n"),
            groups=("powersgd",), expect={C_PS_STEP: "passed", C_PS_WIRE: "passed", C_PS_MEM: "failed"}),
    Planted("PowerSGD: P not re-orthogonalized each step (Q ← MᵀP on the raw P)", PS,
            ("                p_hats.append(orthogonalize(p_flat[pos:pos + n * r].view(n, r), self.eps))\n",
             "                p_hats.append(p_flat[pos:pos + n * r].view(n, r))\n"),
            groups=("powersgd",), expect={C_PS_STEP: "failed", C_PS_EF: "failed", C_PS_WIRE: "failed"}),
    Planted("imports torch's PowerSGD hook", PS,
            ("import torch.distributed as dist\n",
             "import torch.distributed as dist\n"
             "from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook\n"),
            groups=("powersgd",), expect={c: "flagged" for c in PS_CHECKS}),
    Planted("1-bit without its error buffer", OB,
            (("            if index in self.errors:\n                x.add_(self.errors[index])\n",
              "            pass\n"),
             ("            self.errors[index] = x - self.decompress(words, scales, n)\n", "            pass\n")),
            groups=("onebit",),
            expect={C_OB_BIAS: "failed", C_OB_STEP: "failed", C_OB_MEM: "failed", C_OB_CODEC: "passed",
                    C_OB_WIRE: "failed"}),
    # issue 27: the last, shorter chunk (the public test's 5 elements in chunks of 3)
    Planted("1-bit: the last, shorter chunk's mean divided by the full chunk size", OB,
            ("        counts[-1] = n - c * (k - 1)\n", ""), groups=("onebit",),
            expect={C_OB_CODEC: "failed", C_OB_STEP: "failed", C_OB_WIRE: "failed"}),
    # issue 28: no compression at all, the wire evidence faked: zero messages of the right sizes
    # beside the exact mean taken through a collective the byte counter does not see
    Planted("PowerSGD: exact mean through torch's all_reduce (looked up at run time), zero P and Q messages",
            PS, ("            p_flat = torch.cat([(M @ q).reshape(-1) for (_, M, _), q in zip(compress, qs)])\n",
                 _EXACT_MEAN_PS + "            p_flat = torch.cat([(M @ q).reshape(-1) "
                 "for (_, M, _), q in zip(compress, qs)])\n"),
            groups=("powersgd",), expect={C_PS_STEP: "flagged", C_PS_WIRE: "flagged"}),
    Planted("1-bit: exact mean through torch's all_reduce (saved at import), zero messages of the right size", OB,
            (("from scaletrain.comm import ring_all_gather\n",
              "from scaletrain.comm import ring_all_gather\n\n"
              "_UNSEEN = {'sum': getattr(dist, 'all_' + 'reduce')}\n"),
             ("        message = torch.cat([words, scales.view(torch.int32)])\n", _EXACT_MEAN_OB)),
            groups=("onebit",),
            expect={C_OB_CODEC: "passed", C_OB_STEP: "failed", C_OB_WIRE: "failed", C_OB_BIAS: "failed"}),
    Planted("LAMB is Adam: the trust ratio is recorded but not applied", LB,
            (_LB_UPDATE, '                x.sub_(u * group["lr"])\n'), groups=("lamb",),
            expect={C_LB_TRUST: "passed", C_LB_STEP: "failed", C_LB_LAYER: "failed"}),
    *_attacks(),
    # issue 28: every loop over the worker's answer checked nothing (task 8.3 in full for a stub)
    Planted("LAMB empties the caller's parameter list; its step is the stub", LB,
            (("                                      bias_correction=bias_correction, max_trust=max_trust))\n",
              "                                      bias_correction=bias_correction, max_trust=max_trust))\n"
              "        if isinstance(params, list):\n            params.clear()  # every loop over it is empty\n"),
             (_LB_FIRST, "                raise NotImplementedError('a8 task 8.3')\n" + _LB_FIRST)),
            groups=("lamb",), expect={c: "failed" for c in LB_CHECKS}),
    Planted("infinite loop in LAMB's step", LB, (_LB_FIRST, "                while True:\n"
                                                 "                    pass\n" + _LB_FIRST),
            groups=("lamb",), timeout_s=10, expect={c: "timeout" for c in LB_CHECKS}),
    Planted("the process exits in LAMB's step", LB, (_LB_FIRST, "                import os; os._exit(3)\n"),
            groups=("lamb",), expect={c: "error" for c in LB_CHECKS}),
)
