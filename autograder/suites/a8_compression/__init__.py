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

from autograder.manifest import Check, Group, Manifest, Task

from .names import (COLLECTIVES, C_LB_LAYER, C_LB_STEP, C_LB_TRUST, C_OB_BIAS, C_OB_CODEC, C_OB_MEM, C_OB_STEP, C_OB_WIRE,
                    C_PS_BIAS, C_PS_EF, C_PS_MEM, C_PS_STEP, C_PS_WIRE, LB, NO_TRICKS, OB, PS, SRC)
from .planted import PLANTED

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
        Group("powersgd", "autograder.suites.a8_compression.judge_powersgd:group_powersgd", timeout_s=120, trusted=True, checks=(
            Check("8.1", C_PS_STEP, 4), Check("8.1", C_PS_EF, 2), Check("8.1", C_PS_MEM, 1),
            Check("8.1", C_PS_BIAS, 3, needs=(C_PS_STEP,)),
            Check("8.1", C_PS_WIRE, 2, needs=(C_PS_STEP,)),
        )),
        Group("onebit", "autograder.suites.a8_compression.judge_onebit:group_onebit", timeout_s=120, trusted=True, checks=(
            Check("8.2", C_OB_CODEC, 3), Check("8.2", C_OB_STEP, 2), Check("8.2", C_OB_MEM, 1),
            Check("8.2", C_OB_BIAS, 2, needs=(C_OB_STEP,)),
            Check("8.2", C_OB_WIRE, 2, needs=(C_OB_STEP,)),
        )),
        Group("lamb", "autograder.suites.a8_compression.judge_lamb:group_lamb", timeout_s=60, trusted=True, checks=(
            Check("8.3", C_LB_TRUST, 3), Check("8.3", C_LB_STEP, 3), Check("8.3", C_LB_LAYER, 2, needs=(C_LB_STEP,)),
        )),
    ),
    planted=PLANTED,
    public_boundary=("1-bit: the last, shorter chunk's mean divided by the full chunk size",),
)
