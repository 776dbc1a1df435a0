"""Assignment a8: communication-efficient training (`assignments/a8_compression/`): PowerSGD's
compression with error feedback, the 1-bit compressor with its error buffer, LAMB's trust ratio.

Every group is *trusted* (`Group.trusted`): this process never imports the submission. The probes
(`autograder.probes.a8_compression`) run the student's code in the sandboxed worker, the
compressors on P gloo ranks in one spawn, and send back raw outputs; everything that decides a
verdict is computed here:

- 8.1: hidden bucket layouts (matrices, a 3-d tensor viewed as shape[0] × rest, vectors and
  matrices too small to compress) and hidden ranks, the initial Q's chosen here. The reference is a
  single-process simulation of all P ranks in float64 with torch.linalg.qr as the orthogonalization
  (Vogels et al. 2019, Alg. 1 and 2): one step, then several steps of two interleaved buckets
  (error memory and warm-started Q per bucket). The technique: the messages handed to
  `self.allreduce` are [uncompressed, all P's, all Q's] of `powersgd_payloads`, and the bytes each
  rank sent are the ring's for those payloads; and, over 30 steps of a gradient with a consistent
  part the rank-1 approximation misses, Σ_t (output − true mean) stays at the size of the error
  memory (the run without feedback, simulated here, drifts away: the case is chosen so).
- 8.2: compress/decompress in one process against the formula (sign(0) = +1, the mean |x| of each
  chunk, a short last chunk); on P ranks, each step's output and error memory from the rank's
  previous memory (x = g + e in float32, the very addition the student makes, so signs agree), the
  bytes (p − 1)·4·(⌈n/32⌉ + k) per rank, and the accumulated bias over 30 steps as for 8.1.
- 8.3: LAMB (You et al. 2020, Alg. 2) written out here on hidden layers and settings (weight decay,
  bias correction off, max_trust, a zero layer, a layer without gradient): the recorded trust
  ratios, the parameters after every step, and the layer-wise step itself: ‖Δx‖ = lr·‖x‖ wherever
  the trust ratio is not clamped.

torch's DDP communication hooks (torch.distributed.algorithms) and the reference modules are
forbidden in the student's files (statically; the PowerSGD hook also at run time), and so are
torch's collectives (statically, and at run time inside the student's call, as in a6: they move
data the byte counter at `isend` does not see). Bytes, messages, the accumulated bias and LAMB's
layer-wise step are evidence: each is granted only when its step's values passed in the same run
(`Check.needs`, `grade.with_values`), so zero messages of the right sizes beside an exact mean earn nothing.
"""

from __future__ import annotations

import functools
import math
import random
import textwrap

from autograder import checks
from autograder.attacks import IMPORTER, report_forger
from autograder.manifest import REPO, Check, Group, Manifest, Planted, Task
from autograder.suites import paired, sized

PS, OB, LB = "powersgd.py", "onebit.py", "lamb.py"
SRC = {PS: "lib/scaletrain/compression/powersgd.py", OB: "lib/scaletrain/compression/onebit.py",
       LB: "lib/scaletrain/compression/lamb.py"}
PROBE = "autograder.probes.a8_compression:"
P = 2                 # ranks: every property here holds at p = 2, the cheapest spawn
SPAWN_S = 60          # the probe's spawn limit (the group's own limit is above it)
RTOL = 1e-4           # float32 ranks against a float64 reference, a few steps deep
NO_TRICKS = ("importlib", "__import__", "exec", "eval", "builtins", "inspect", "sys")
COLLECTIVES = ("torch.distributed.all_reduce", "torch.distributed.all_gather", "torch.distributed.broadcast",
               "torch.distributed.all_gather_into_tensor", "torch.distributed.reduce_scatter",
               "torch.distributed.reduce_scatter_tensor", "torch.distributed.all_to_all")

C_PS_STEP = "PowerSGD step: P̂P̂ᵀ·mean M per matrix, exact mean for the rest (hidden shapes, ranks)"
C_PS_EF = "PowerSGD outputs over several steps: memory and warm-started Q per bucket"
C_PS_MEM = "PowerSGD error memory: its mean over the ranks is what the output lost"
C_PS_BIAS = "PowerSGD: accumulated bias stays bounded with error feedback (30 steps)"
C_PS_WIRE = "PowerSGD messages: uncompressed, all P's, all Q's; ring bytes as the formula"
C_OB_CODEC = "1-bit compress/decompress: packed signs, mean |x| per chunk (hidden sizes, chunks)"
C_OB_STEP = "1-bit step: mean of the ranks' C(g + e), error memory e = x − C(x)"
C_OB_BIAS = "1-bit: accumulated bias stays bounded with error feedback (30 steps)"
C_OB_WIRE = "1-bit bytes per rank: (p − 1)·4·(⌈n/32⌉ + chunks)"
C_LB_TRUST = "LAMB trust ratio ‖x‖/‖u‖ per layer (zero norms → 1, max_trust clamp)"
C_LB_STEP = "LAMB parameters after every step equal Algorithm 2 (weight decay, bias correction)"
C_LB_LAYER = "LAMB moves each layer by lr·‖x‖ where the trust ratio is not clamped"
PS_CHECKS, OB_CHECKS, LB_CHECKS = (C_PS_STEP, C_PS_EF, C_PS_MEM, C_PS_BIAS, C_PS_WIRE), \
    (C_OB_CODEC, C_OB_STEP, C_OB_BIAS, C_OB_WIRE), (C_LB_TRUST, C_LB_STEP, C_LB_LAYER)

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


MANIFEST = Manifest(
    assignment="a8", folder="a8_compression", title="Communication-efficient training: PowerSGD, 1-bit, LAMB",
    files={PS: SRC[PS], OB: SRC[OB], LB: SRC[LB]},
    tasks=(
        Task("8.1", "PowerSGD: power-iteration compression with error feedback", file=PS,
             functions=("orthogonalize", "reduce")),
        Task("8.2", "1-bit compression with its error buffer", file=OB, functions=("compress", "decompress", "reduce")),
        Task("8.3", "LAMB's trust ratio", file=LB, functions=("step",)),
    ),
    forbidden={PS: ("torch.distributed.algorithms", "scaletrain.compression", *COLLECTIVES, *NO_TRICKS),
               OB: ("torch.distributed.algorithms", "scaletrain.compression", *COLLECTIVES, *NO_TRICKS),
               LB: ("scaletrain.compression", "torch.optim.Adam", "torch.optim.AdamW", *NO_TRICKS)},
    groups=(
        Group("powersgd", "autograder.suites.a8_compression:group_powersgd", timeout_s=120, trusted=True, checks=(
            Check("8.1", C_PS_STEP, 4), Check("8.1", C_PS_EF, 2), Check("8.1", C_PS_MEM, 1),
            Check("8.1", C_PS_BIAS, 3, needs=(C_PS_STEP,)),
            Check("8.1", C_PS_WIRE, 2, needs=(C_PS_STEP,)),
        )),
        Group("onebit", "autograder.suites.a8_compression:group_onebit", timeout_s=120, trusted=True, checks=(
            Check("8.2", C_OB_CODEC, 3), Check("8.2", C_OB_STEP, 3), Check("8.2", C_OB_BIAS, 2, needs=(C_OB_STEP,)),
            Check("8.2", C_OB_WIRE, 2, needs=(C_OB_STEP,)),
        )),
        Group("lamb", "autograder.suites.a8_compression:group_lamb", timeout_s=60, trusted=True, checks=(
            Check("8.3", C_LB_TRUST, 3), Check("8.3", C_LB_STEP, 3), Check("8.3", C_LB_LAYER, 2, needs=(C_LB_STEP,)),
        )),
    ),
    planted=(
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
                expect={C_OB_BIAS: "failed", C_OB_STEP: "failed", C_OB_CODEC: "passed", C_OB_WIRE: "failed"}),
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
    ),
)


# ---------------------------------------------------------------- shared

def _ring_bytes(numel: int, p: int) -> int:
    """Bytes one rank sends in a ring allreduce of `numel` fp32 elements: 2(p − 1)·⌈n/p⌉·4."""
    return 2 * (p - 1) * math.ceil(numel / p) * 4


# float32 ranks against a float64 reference: compared in float64, whatever float a compressor returns
_close = functools.partial(checks.assert_tensor_close, rtol=RTOL, compare_in="float64")


def _run(ctx, cases: list[dict]) -> list[list[dict]]:
    """The probe on P ranks: per case, per rank, {"ok": {"steps": [...]}} or {"raised": [...]}; an
    answer not shaped so (P ranks, one entry per case) is every case's failure, reported by `_steps`."""
    answers = ctx.untrusted().call(PROBE + "compressor_run", cases[0]["stem"],
                                   {"world_size": P, "timeout_s": SPAWN_S, "cases": cases})
    try:
        ranks = [sized(a, len(cases), f"rank {r}'s answers, one per case")
                 for r, a in enumerate(sized(answers, P, "the ranks' answers"))]
    except AssertionError as exc:
        return [[{"raised": ("AssertionError", str(exc))}] * P for _ in cases]
    return [[ranks[rank][i] for rank in range(P)] for i in range(len(cases))]


def _steps(per_rank: list[dict], case: dict, label: str) -> list[list[dict]]:
    """Per rank, the case's steps, one per step the case runs; the student's exception, rebuilt, if
    a rank raised one."""
    from autograder.checks import Flagged

    for rank, answer in enumerate(per_rank):
        if "raised" in answer:
            kind, message = answer["raised"]
            exc = {"NotImplementedError": NotImplementedError, "AssertionError": AssertionError,
                   "Flagged": Flagged}.get(kind)
            text = f"{label}, rank {rank}: {message}"
            raise exc(text) if exc else RuntimeError(f"{kind}: {text}")
    return [sized(answer["ok"]["steps"], len(case["steps"]), f"{label}, rank {rank}: steps")
            for rank, answer in enumerate(per_rank)]


def _unmodified(steps, label: str) -> None:
    for rank, rank_steps in enumerate(steps):
        if any(s["modified"] for s in rank_steps):
            raise AssertionError(f"{label}, rank {rank}: the bucket's gradient `flat` was modified in place; "
                                 "work on a copy")


def _drift_grads(shapes, steps: int, seed: int, scale: float):
    """Per step, per rank: a fixed part, the same every step, that the compressor keeps missing (a
    rank-2 matrix where rank-1 PowerSGD keeps one direction; a ramp whose magnitudes one sign-scale
    can't follow), plus rank noise of `scale`."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    parts = [(torch.randn(s[0], 2, generator=gen) @ torch.randn(2, math.prod(s[1:]), generator=gen)).reshape(-1)
             if len(s) > 1 else torch.linspace(-1.0, 1.0, s[0]) for s in shapes]
    fixed = torch.cat(parts)
    return [[(fixed + scale * torch.randn(fixed.numel(), generator=gen)).float() for _ in range(P)]
            for _ in range(steps)]


def _bias(outs, grads) -> float:
    """‖Σ_t (output_t − mean_w g_w,t)‖."""
    import torch

    acc = sum(o.double() - torch.stack(g).double().mean(0) for o, g in zip(outs, grads, strict=True))
    return float(torch.linalg.vector_norm(acc))


def _check_bias(got: float, ef: float, no_ef: float, label: str) -> None:
    if not no_ef > 4 * ef:  # the hidden case must tell the two apart; a suite bug otherwise
        raise RuntimeError(f"suite bug: {label}: with feedback {ef:.3g}, without {no_ef:.3g}")
    assert got <= 2 * ef + 1e-6, (
        f"{label}: ‖Σ_t (output_t − mean gradient_t)‖ = {got:.4g} after 30 steps; with error feedback it stays "
        f"at the error memory's size ({ef:.4g} in the reference), without feedback it grows ({no_ef:.4g})")


# ---------------------------------------------------------------- task 8.1

def _orth(a):
    import torch

    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


def _powersgd_reference(case: dict, error_feedback: bool = True) -> list:
    """Single-process simulation of all P ranks in float64: per step (output, [e_w per rank] or None)."""
    import torch

    from scaletrain.compression.powersgd import should_compress

    r_max, errors, qmem, result = case["rank"], {}, {}, []
    for index, qs in case["q0"].items():
        qmem[int(index)] = [q.double() for q in qs]
    for step in case["steps"]:
        index, shapes = step["index"], step["shapes"]
        xs = [g.double() for g in step["grads"]]
        if error_feedback and index in errors:
            xs = [x + e for x, e in zip(xs, errors[index])]
        out, new_qs, o, k = torch.empty_like(xs[0]), [], 0, 0
        for shape in shapes:
            numel = math.prod(shape)
            n = shape[0]
            m = numel // n
            r = min(n, m, r_max)
            if len(shape) > 1 and should_compress(n, m, r):
                ms = [x[o:o + numel].view(n, m) for x in xs]
                p_hat = _orth(sum(mat @ qmem[index][k] for mat in ms))
                q = sum(mat.t() @ p_hat for mat in ms) / P
                out[o:o + numel] = (p_hat @ q.t()).reshape(-1)
                new_qs.append(q)
                k += 1
            else:
                out[o:o + numel] = sum(x[o:o + numel] for x in xs) / P
            o += numel
        qmem[index] = new_qs
        if error_feedback:
            errors[index] = [x - out for x in xs]
        result.append((out, errors.get(index)))
    return result


def _layouts(rng: random.Random):
    """Hidden bucket layouts, then the public tests' (16×12, 7, 20×10 at rank 2; issue 27)."""
    a, b = rng.randint(21, 37), rng.randint(11, 19)
    return [
        ([(a, b), (rng.randint(3, 9),), (rng.randint(9, 13), 4, 3), (40, 2)], rng.choice([1, 3])),
        ([(rng.randint(25, 31), rng.randint(14, 18)), (5,), (b, a)], rng.choice([4, 5])),
        ([(16, 12), (7,), (20, 10)], 2),
    ]


def _q0(shapes, rank: int, gen) -> list:
    import torch

    from scaletrain.compression.powersgd import should_compress

    qs = []
    for shape in shapes:
        n, m = shape[0], math.prod(shape) // shape[0]
        r = min(n, m, rank)
        if len(shape) > 1 and should_compress(n, m, r):
            qs.append(torch.randn(m, r, generator=gen))
    return qs


def _ps_case(shapes, rank: int, n_steps: int, seed: int, *, buckets=(0,), error_feedback=True, grads=None) -> dict:
    """A case for the probe: `buckets` interleaved (bucket j uses `shapes` rotated by j)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    layouts = {index: shapes[j:] + shapes[:j] for j, index in enumerate(buckets)}
    q0 = {str(index): _q0(layout, rank, gen) for index, layout in layouts.items()}
    steps = []
    for t in range(n_steps):
        index = buckets[t % len(buckets)]
        n = sum(math.prod(s) for s in layouts[index])
        g = grads[t] if grads is not None else [torch.randn(n, generator=gen) for _ in range(P)]
        steps.append({"index": index, "shapes": layouts[index], "grads": g})
    return {"stem": "powersgd", "kind": "powersgd", "rank": rank, "error_feedback": error_feedback,
            "q0": q0, "steps": steps}


def group_powersgd(ctx):
    from scaletrain.compression.powersgd import powersgd_payloads

    seed = checks.trial_seeds(1, salt=1)[0]
    rng = random.Random(seed)
    layouts = _layouts(rng)
    one_step = [_ps_case(shapes, r, 1, seed + i) for i, (shapes, r) in enumerate(layouts)]
    multi = [_ps_case(shapes, r, 6, seed + 10 + i, buckets=(0, 3)) for i, (shapes, r) in enumerate(layouts)]
    bias_shapes = [(rng.randint(20, 26), rng.randint(14, 18)), (6,)]
    drift = _drift_grads(bias_shapes, 30, seed + 20, scale=0.1)
    bias = _ps_case(bias_shapes, 1, 30, seed + 21, grads=drift)
    answers = _run(ctx, one_step + multi + [bias])

    with ctx.check(C_PS_STEP):
        for case, per_rank in zip(one_step, answers[:len(one_step)], strict=True):
            label = f"PowerSGD(rank={case['rank']}) on a bucket of {case['steps'][0]['shapes']}"
            steps = _steps(per_rank, case, label)
            _unmodified(steps, label)
            (want, _), = _powersgd_reference(case)
            for rank, rank_steps in enumerate(steps):
                _close(rank_steps[0]["out"], want, what=f"{label}: rank {rank}'s output")
    with ctx.check(C_PS_EF):
        for case, per_rank in zip(multi, answers[len(one_step):-1], strict=True):
            label = f"PowerSGD(rank={case['rank']}), buckets 0 and 3 alternately"
            steps = _steps(per_rank, case, label)
            for t, (want, errors) in enumerate(_powersgd_reference(case)):
                for rank in range(P):
                    got = steps[rank][t]
                    where = f"{label}, step {t} (bucket {case['steps'][t]['index']}), rank {rank}"
                    _close(got["out"], want, what=f"{where}: the output")
    with ctx.check(C_PS_MEM):  # any memory whose mean over the ranks is what the output lost
        for case, per_rank in zip(multi, answers[len(one_step):-1], strict=True):
            label = f"PowerSGD(rank={case['rank']}), buckets 0 and 3 alternately"
            steps = _steps(per_rank, case, label)
            for t, (_, errors) in enumerate(_powersgd_reference(case)):
                where = f"{label}, step {t} (bucket {case['steps'][t]['index']})"
                if any(steps[rank][t]["error"] is None for rank in range(P)):
                    raise AssertionError(f"{where}: no error memory in errors[{case['steps'][t]['index']}]")
                _close(sum(steps[rank][t]["error"].double() for rank in range(P)) / P, sum(errors) / P,
                       what=f"{where}: the mean of the ranks' error memories (the mean input minus the output)")
    with ctx.check(C_PS_BIAS):
        label = f"PowerSGD(rank=1) on {bias_shapes}, a gradient with a fixed part"
        steps = _steps(answers[-1], bias, label)
        outs = [s["out"] for s in steps[0]]
        ef = _bias([o for o, _ in _powersgd_reference(bias)], drift)
        no_ef = _bias([o for o, _ in _powersgd_reference(bias, error_feedback=False)], drift)
        _check_bias(_bias(outs, drift), ef, no_ef, label)
    with ctx.check(C_PS_WIRE):
        for case, per_rank in zip(one_step + multi, answers[:-1], strict=True):
            label = f"PowerSGD(rank={case['rank']})"
            steps = _steps(per_rank, case, label)
            for t, step in enumerate(case["steps"]):
                want = powersgd_payloads([tuple(s) for s in step["shapes"]], case["rank"])
                for rank in range(P):
                    got = steps[rank][t]
                    assert got["messages"] == want, (
                        f"{label} on {step['shapes']}, rank {rank}: allreduces of {got['messages']} elements, expected "
                        f"{want} (the uncompressed tensors, all P's, all Q's, one message each)")
                    expected = sum(_ring_bytes(k, P) for k in want)
                    assert got["bytes"] == expected, (
                        f"{label} on {step['shapes']}, rank {rank}: sent {got['bytes']} B, the ring allreduces of "
                        f"{want} elements send {expected} B: all traffic goes through self.allreduce")


# ---------------------------------------------------------------- task 8.2

def _onebit_reference(x, chunk: int | None):
    """(scales, C(x)) in float64: one scale per chunk, the mean |x| over the chunk's own elements."""
    import torch

    n = x.numel()
    k = 1 if not chunk else max(1, math.ceil(n / chunk))
    c = math.ceil(n / k)
    scales = torch.stack([x[j * c:(j + 1) * c].double().abs().mean() for j in range(k)])
    signs = torch.where(x >= 0, 1.0, -1.0).double()
    return scales, signs * scales.repeat_interleave(c)[:n]


def _onebit_bytes(n: int, chunk: int | None) -> int:
    k = 1 if not chunk else max(1, math.ceil(n / chunk))
    return (P - 1) * 4 * (math.ceil(n / 32) + k)


def _codec_cases(rng: random.Random, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    cases = []
    for n, chunk in ((1, None), (31, None), (33, 8), (rng.randint(100, 300), rng.randint(7, 50)), (1000, 1000),
                     (rng.randint(64, 200), 64)):
        x = torch.randn(n, generator=gen) * rng.choice([1e-3, 1.0, 50.0])
        x[rng.randrange(n)] = 0.0  # sign(0) := +1
        cases.append((x, chunk))
    return cases + [(torch.tensor([0.5, -2.0, 0.0, 1.5, -1.0]), 3)]  # the public test's: a last chunk of 2


def _ob_case(n: int, chunk: int | None, n_steps: int, seed: int, grads=None) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    steps = [{"index": 2, "shapes": [(n,)],
              "grads": grads[t] if grads is not None else [torch.randn(n, generator=gen) for _ in range(P)]}
             for t in range(n_steps)]
    return {"stem": "onebit", "kind": "onebit", "chunk_numel": chunk, "error_feedback": True, "steps": steps}


def _onebit_simulation(case: dict, error_feedback: bool) -> list:
    """Outputs of all ranks in float64, for the bias reference."""
    import torch

    errors, outs = [torch.zeros_like(g, dtype=torch.float64) for g in case["steps"][0]["grads"]], []
    for step in case["steps"]:
        xs = [g.double() + (e if error_feedback else 0) for g, e in zip(step["grads"], errors)]
        cs = [_onebit_reference(x, case["chunk_numel"])[1] for x in xs]
        errors = [x - c for x, c in zip(xs, cs)]
        outs.append(sum(cs) / P)
    return outs


def group_onebit(ctx):
    import torch

    seed = checks.trial_seeds(1, salt=2)[0]
    rng = random.Random(seed)
    ctx.untrusted().start()
    with ctx.check(C_OB_CODEC):
        cases = _codec_cases(rng, seed)
        answers = ctx.untrusted().call(PROBE + "onebit_codec", "onebit", cases)
        from scaletrain.compression.onebit import pack_signs  # the given wire format

        for got, (x, chunk) in paired(answers, cases, "onebit_codec: the answers, one per (x, chunk_numel) case"):
            label = f"OneBitEF(chunk_numel={chunk}) on {x.numel()} elements"
            if "raised" in got:
                kind, message = got["raised"]
                raise (NotImplementedError if kind == "NotImplementedError" else RuntimeError)(
                    f"{label}: {kind}: {message}")
            scales, decoded = _onebit_reference(x, chunk)
            if not isinstance(got["words"], torch.Tensor) or not torch.equal(got["words"], pack_signs(x)):
                raise AssertionError(f"{label}: the sign words are not pack_signs(x) "
                                     "(bit j of word i: x[32i + j] >= 0)")
            _close(got["scales"], scales, what=f"{label}: the scales (mean |x| of each chunk)", rtol=1e-5)
            _close(got["decoded"], decoded, what=f"{label}: decompress(compress(x))", rtol=1e-5)
    sizes = [(rng.randint(70, 140), None), (rng.randint(300, 500), rng.randint(40, 90)), (101, 60)]  # the public's last
    stepped = [_ob_case(n, chunk, 5, seed + i) for i, (n, chunk) in enumerate(sizes)]
    n_bias = rng.randint(150, 250)
    drift = _drift_grads([(n_bias,)], 30, seed + 20, scale=0.1)
    bias = _ob_case(n_bias, None, 30, seed + 21, grads=drift)
    answers = _run(ctx, stepped + [bias])
    with ctx.check(C_OB_STEP):
        for case, per_rank in zip(stepped, answers[:-1], strict=True):
            label = f"OneBitEF(chunk_numel={case['chunk_numel']}) on {case['steps'][0]['shapes'][0][0]} elements"
            steps = _steps(per_rank, case, label)
            _unmodified(steps, label)
            previous = [torch.zeros_like(g) for g in case["steps"][0]["grads"]]
            for t, step in enumerate(case["steps"]):
                xs = [g + e for g, e in zip(step["grads"], previous)]  # float32: the student's own addition
                cs = [_onebit_reference(x, case["chunk_numel"])[1] for x in xs]
                for rank in range(P):
                    got, where = steps[rank][t], f"{label}, step {t}, rank {rank}"
                    _close(got["out"], sum(cs) / P, what=f"{where}: the output (mean of the ranks' C(g + e))", rtol=1e-5)
                    if got["error"] is None:
                        raise AssertionError(f"{where}: no error memory kept in errors[{step['index']}]")
                    _close(got["error"], xs[rank].double() - cs[rank], what=f"{where}: the error memory e = x − C(x)",
                           rtol=1e-5)
                previous = [steps[rank][t]["error"].float() for rank in range(P)]
    with ctx.check(C_OB_BIAS):
        label = f"OneBitEF on {n_bias} elements, a gradient with a fixed part"
        steps = _steps(answers[-1], bias, label)
        ef, no_ef = (_bias(_onebit_simulation(bias, flag), drift) for flag in (True, False))
        _check_bias(_bias([s["out"] for s in steps[0]], drift), ef, no_ef, label)
    with ctx.check(C_OB_WIRE):
        for case, per_rank in zip(stepped + [bias], answers, strict=True):
            n, chunk = case["steps"][0]["shapes"][0][0], case["chunk_numel"]
            steps = _steps(per_rank, case, f"OneBitEF(chunk_numel={chunk})")
            for rank in range(P):
                for t, got in enumerate(steps[rank]):
                    assert got["bytes"] == _onebit_bytes(n, chunk), (
                        f"OneBitEF(chunk_numel={chunk}) on {n} elements, step {t}, rank {rank}: sent {got['bytes']} B, "
                        f"expected (p − 1)·4·(⌈n/32⌉ + chunks) = {_onebit_bytes(n, chunk)} B")


# ---------------------------------------------------------------- task 8.3

def _adam_directions(grads, settings: dict) -> list:
    """m̂ / (√v̂ + ε) per step and layer: Adam's part of LAMB's update, a function of the gradients only."""
    import torch

    (b1, b2), eps, bc = settings["betas"], settings["eps"], settings["bias_correction"]
    ms, vs = [torch.zeros_like(g) for g in grads[0]], [torch.zeros_like(g) for g in grads[0]]
    out = []
    for t, step_grads in enumerate(grads, 1):
        row = []
        for i, g in enumerate(step_grads):
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            m_hat, v_hat = (ms[i] / (1 - b1 ** t), vs[i] / (1 - b2 ** t)) if bc else (ms[i], vs[i])
            row.append(m_hat / (v_hat.sqrt() + eps))
        out.append(row)
    return out


def _trust(x, u, cap) -> tuple[float, bool]:
    """(trust ratio, whether it differs from ‖x‖/‖u‖: clamped, or a zero norm)."""
    w_norm, u_norm = float(x.double().norm()), float(u.double().norm())
    if not (w_norm > 0 and u_norm > 0):
        return 1.0, True
    trust = w_norm / u_norm
    return (min(trust, cap), trust > cap) if cap is not None else (trust, False)


def _lamb_reference(params, grads, settings: dict) -> dict:
    """You et al. 2020, Algorithm 2 with one "layer" per tensor, written out in float32."""
    lr, wd, cap = settings["lr"], settings["weight_decay"], settings["max_trust"]
    xs = [p.clone() for p in params]
    out = {"params": [], "clamped": []}
    for directions in _adam_directions(grads, settings):
        clamped = []
        for i, d in enumerate(directions):
            u = d + wd * xs[i]
            trust, special = _trust(xs[i], u, cap)
            xs[i] = xs[i] - lr * trust * u
            clamped.append(special)
        out["params"].append([x.clone() for x in xs])
        out["clamped"].append(clamped)
    return out


def _lamb_cases(rng: random.Random, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    shapes = [(rng.randint(5, 9), rng.randint(3, 7)), (rng.randint(10, 17),), (3, 4, 2), (4, 3), (6,)]
    params = [torch.randn(s, generator=gen) * rng.choice([0.02, 1.0, 3.0]) for s in shapes]
    params[3] = torch.zeros(shapes[3])                 # a zero layer: ‖x‖ = 0, trust 1
    settings = [dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, bias_correction=True, max_trust=None),
                dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0, bias_correction=False, max_trust=2.0)]
    cases = []
    for s in settings:
        grads = [[torch.randn(p.shape, generator=gen) * 0.1 for p in params] for _ in range(6)]
        for step in grads:
            step[4] = torch.zeros(shapes[4])            # a layer without gradient: m = 0, u = λx
        cases.append((params, grads, s))
    return cases + [_public_lamb_case(gen)]


def _public_lamb_case(gen):
    """The public test's layers (6×4 and a small 5-vector), settings and 3 steps, hidden values."""
    import torch
    params = [torch.randn(6, 4, generator=gen), torch.randn(5, generator=gen) * 0.01]
    grads = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(3)]
    return params, grads, dict(lr=0.02, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1, bias_correction=True,
                               max_trust=None)


def _lamb_answer(got, params, grads, settings: dict) -> dict:
    """The worker's LAMB run, checked to hold, for every step, one trust ratio and one parameter per
    layer (a LAMB that empties the caller's list leaves nothing to compare: issue 28)."""
    what = f"LAMB({settings})"
    if not isinstance(got, dict):
        raise AssertionError(f"{what}: the probe sent {str(got)[:80]}, not the run")
    for key, item in (("params", "parameter"), ("trust", "state['trust_ratio']")):
        for t, row in enumerate(sized(got.get(key), len(grads), f"{what}: {key}, one row per step")):
            sized(row, len(params), f"{what}, step {t}: one {item} per layer")
    return got


def group_lamb(ctx):
    import torch

    seed = checks.trial_seeds(1, salt=3)[0]
    cases = _lamb_cases(random.Random(seed), seed)
    ctx.untrusted().start()
    runs = []
    for params, grads, settings in cases:
        want = _lamb_reference(params, grads, settings)
        runs.append((want, ctx.untrusted().call(PROBE + "lamb_run", "lamb", params, grads, settings)))
    with ctx.check(C_LB_TRUST):  # step by step from the student's own parameters: the ratio alone is graded
        for (params, grads, settings), (_, got) in zip(cases, runs, strict=True):
            got, before = _lamb_answer(got, params, grads, settings), params
            for t, (directions, trusts) in enumerate(zip(_adam_directions(grads, settings), got["trust"], strict=True)):
                for i, (d, x, a) in enumerate(zip(directions, before, trusts, strict=True)):
                    b, _ = _trust(x, d + settings["weight_decay"] * x, settings["max_trust"])
                    a = float(a) if isinstance(a, (int, float, torch.Tensor)) and not isinstance(a, bool) else a
                    assert isinstance(a, float) and abs(a - b) <= 1e-4 * max(1.0, abs(b)), (
                        f"LAMB({settings}), step {t}, layer {i}: state['trust_ratio'] = {a!r}, expected "
                        f"‖x‖/‖u‖ = {b:.6g} for the parameters before the step")
                before = got["params"][t]
    with ctx.check(C_LB_STEP):
        for (params, grads, settings), (want, got) in zip(cases, runs, strict=True):
            got = _lamb_answer(got, params, grads, settings)
            for t, (xs, ref) in enumerate(zip(got["params"], want["params"], strict=True)):
                for i, (a, b) in enumerate(zip(xs, ref, strict=True)):
                    _close(a, b, what=f"LAMB({settings}), layer {i} after step {t}", rtol=1e-5)
    with ctx.check(C_LB_LAYER):
        for (params, grads, settings), (want, got) in zip(cases, runs, strict=True):
            got, before = _lamb_answer(got, params, grads, settings), params
            for t, xs in enumerate(got["params"]):
                for i, (a, b) in enumerate(zip(xs, before, strict=True)):
                    if want["clamped"][t][i]:
                        continue
                    moved, size = float((a - b).double().norm()), settings["lr"] * float(b.double().norm())
                    assert abs(moved - size) <= 1e-3 * size, (
                        f"LAMB({settings}), layer {i}, step {t}: moved by {moved:.6g}, "
                        f"expected lr·‖x‖ = {size:.6g} "
                        f"(the trust ratio makes each layer's step proportional to its weights)")
                before = xs
