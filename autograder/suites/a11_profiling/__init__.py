"""Assignment a11: where the time of a training step goes (`assignments/a11_profiling/`).

Every group is *trusted* (`Group.trusted`): this process never imports the submission. The probe
`autograder.probes.a11_profiling` runs the student's categoriser, op costs, step tables and
progressive layer dropping in the sandboxed worker on hidden inputs sent from here; raw outputs come
back. What decides a verdict is here, and none of it is scaletrain.profile:

- categories: names real traces record (the tiny GPT's CPU steps, a GPU step's attention and fused
  optimizer kernels, c10d / NCCL / gloo events), labelled by hand from the contract (labels.py);
  a table of the public names earns nothing on the hidden ones;
- costs: closed forms from the recorded shapes (2 FLOPs per multiply-add, every operand read and
  the output written once, by dtype), bands where the contract leaves a choice (FLOPs per element
  of LayerNorm, softmax and elementwise ops, the statistics' bytes);
- the step's tables: synthetic profiles (op names of real traces, seeded times and FLOPs) summed
  here: time by (phase, category) per step, 6NT and MFU (PaLM appendix B);
- PLD (Zhang & He 2020): properties of θ(t) and p_i(t) (1 at the start, non-increasing in time and
  depth, the deepest layer at θ(t), Σ p_i), gate frequencies within a binomial bound, pairs of
  layers independent and the same gates from the same seed, the model left unchanged, a dropped
  block exactly the identity, given no gradient and its parameters read by no op (the probe's
  dispatch mode counts them).

No group profiles anything: the inputs are made from the grading seed in milliseconds.
"""

from autograder.manifest import Check, Group, Manifest, Task

from .names import (C_BREAKDOWN, C_CAT_BWD, C_CAT_FWD, C_CAT_ONE, C_CAT_SYS, C_COUNTED, C_DROP_FREE, C_EW, C_GATES,
                    C_IDENTITY, C_KEEP, C_MFU, C_MM_BYTES, C_MM_FLOPS, C_NORM, C_SCALED, C_THETA, CATEGORIES_F, COST,
                    PLD, SOURCES, TABLES)
from .planted import PLANTED

_JUDGE = "autograder.suites.a11_profiling.judge:"
_NO_TRICKS = ("importlib", "__import__", "exec", "eval")

MANIFEST = Manifest(
    assignment="a11", folder="a11_profiling", title="Where the time of a training step goes",
    files=dict(SOURCES),
    tasks=(
        Task("11.1", "Categorise the operations of a trace", file=CATEGORIES_F, functions=("categorise",)),
        Task("11.2", "FLOPs and bytes of an operation from its recorded shapes", file=COST,
             functions=("_matmul", "op_cost")),
        Task("11.3", "Time by category and phase, MFU of the step", file=TABLES,
             functions=("category_seconds", "step_mfu")),
        Task("11.4", "Progressive layer dropping: the schedule, the gates, a dropped block", file=PLD,
             functions=("theta", "keep_probabilities", "sample_gates", "pld_forward")),
    ),
    forbidden={CATEGORIES_F: ("scaletrain.profile",) + _NO_TRICKS,
               COST: ("scaletrain.profile", "torch.utils.flop_counter") + _NO_TRICKS,
               TABLES: ("scaletrain.profile.tables",) + _NO_TRICKS, PLD: ("scaletrain.profile",) + _NO_TRICKS},
    groups=(
        Group("analysis", _JUDGE + "group_analysis", timeout_s=60, trusted=True, checks=(
            Check("11.1", C_CAT_FWD, 8), Check("11.1", C_CAT_BWD, 6), Check("11.1", C_CAT_SYS, 4),
            Check("11.1", C_CAT_ONE, 2, needs=(C_CAT_FWD,)),
            Check("11.2", C_MM_FLOPS, 10), Check("11.2", C_MM_BYTES, 8), Check("11.2", C_EW, 6),
            Check("11.2", C_NORM, 6),
            Check("11.3", C_BREAKDOWN, 8), Check("11.3", C_MFU, 8), Check("11.3", C_COUNTED, 4),
        )),
        Group("pld", _JUDGE + "group_pld", timeout_s=90, trusted=True, checks=(
            Check("11.4", C_THETA, 6), Check("11.4", C_KEEP, 6), Check("11.4", C_GATES, 6),
            Check("11.4", C_IDENTITY, 5), Check("11.4", C_SCALED, 4),
            Check("11.4", C_DROP_FREE, 3, needs=(C_IDENTITY,)),
        )),
    ),
    planted=PLANTED,
    public_boundary=("layer index off by one: the deepest layer keeps more than θ(t)",),
)
