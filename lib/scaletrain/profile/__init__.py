"""Where the time of a training step goes (module 11): profile, categorise, price, place on a roofline.

Seeds: training-speedup-lecture.md ("Model Profiling", "GPT-2 Profiling: Time", "Profiling Time of
Elementary Operations": relative time of each operation of GPT-2 at s = 512, b = 8, h = 768; GeLU
and the elementwise ops bound by memory), techniques-for-large-scale-training.md ("Graph
Compilation": the automatic alternative to hand fusion).

One idea per file, in the order a profile is read:

    categories.py   which kind of work an op is (matmul, attention, normalization, ...)
    cost.py         an op's FLOPs and bytes from its recorded shapes (module 1's traffic model)
    roofline.py     the machine's peak FLOP/s and bandwidth, measured; min(peak, I·bw)
    trace.py        N steps under torch.profiler, phases marked, one record per op; Chrome trace
    tables.py       time by category and phase, each op on the roofline, MFU
    plot.py         stacked bars by category, the roofline with each op as a point, the memory
                    timeline, the time-to-loss curves
    shapes.py       GPT-2 small as the seeds profile it (GPU) and its CPU-sized stand-ins
    __main__.py     `python -m scaletrain.profile`: the tables, figures and trace of a GPT-2-like step
    memory_timeline.py  bytes of parameters, gradients, optimizer state, activations at each mark of a step
    fused.py        the GPT on the course's fused kernels (LayerNorm, attention, cross-entropy)
    variants.py     eager vs checkpointed MLP vs torch.compile vs fused kernels: time and kept bytes, paired
    benchmark.py    `python -m scaletrain.bench profile`: the variants' table, time to a loss, their plots

and two speedups that change the training itself (additional-techniques.md §2, §4):

    pld.py          progressive layer dropping: θ(t), p_i(t), gates, a dropped block as identity
    curriculum.py   the sequence-length curriculum s(t), batches truncated to it
    time_to_loss.py each against the baseline: steps and wall time to a fixed validation loss, over seeds
"""

from scaletrain.profile.categories import CATEGORIES, categorise
from scaletrain.profile.cost import Cost, op_cost
from scaletrain.profile.curriculum import seq_len_at, truncate
from scaletrain.profile.pld import keep_probabilities, pld_forward, sample_gates, theta
from scaletrain.profile.roofline import Machine, attainable, measure_machine
from scaletrain.profile.tables import category_seconds, category_table, op_table, step_mfu
from scaletrain.profile.trace import PHASES, OpRecord, StepProfile, profile_steps, training_step

__all__ = ["CATEGORIES", "categorise", "Cost", "op_cost", "Machine", "attainable", "measure_machine",
           "category_seconds", "category_table", "op_table", "step_mfu", "PHASES", "OpRecord", "StepProfile",
           "profile_steps", "training_step", "seq_len_at", "truncate", "keep_probabilities", "pld_forward",
           "sample_gates", "theta"]
