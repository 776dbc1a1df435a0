"""Assignment a9: plan a training run at scale (`assignments/a9_planning/`).

The student writes the planner's models (`scaletrain.plan`): memory per GPU with the pairs a
schedule keeps in flight (9.1), the per-microbatch stage times (9.2), the iteration with its
bubble, data-parallel reduction and overlap (9.3), the layout search (9.4), and where context
parallelism starts to pay (9.5). Each is compared with the reference on held-out configurations
drawn from the seed (irregular head counts, layers, vocabularies; GPT-3- and Llama-style models;
TP beyond a node; context parallelism; uneven stages; flash attention; ZeRO 0-3; every
recomputation; interleaving) and with references nobody here wrote: the schedules' own in-flight
peaks (`scaletrain.pipeline.peak_in_flight`), the simulator's makespan, Narayanan et al. 2021's
Table 1 (rows 1-7, ±7 %) and the published configurations' memory (all under 80 GB).

Checks are split by property (a layer's bytes by model family and option; the in-flight count by
phase: 1F1B's warm-up, GPipe's fill, the interleaved warm-up, the cap, ranks past 0; memory and
times by field; the search by what every correct search satisfies: only layouts that fit, the
exhaustive ranking, the candidate set by degrees, options, stage maps and scale), so a small slip
costs a small share. 9.4's design (how to enumerate and prune the space) is the student's: the
grader sees only the set, the ranking and the time. The public tests check the same properties.

Every group is *trusted*: this process never imports the submission; the probes
(`autograder/probes/a9_planning.py`) call the student's functions in the sandboxed worker and send
numbers back. Each task is graded on its own: 9.3 runs on the reference's stage times, 9.4 ranks
predictions computed here, 9.5 runs on a table of predictions with the table's own search. Table 1
is the one place 9.2 and 9.3 are judged together, and it and the published memory are granted only
with the held-out checks of the same functions (`Check.needs`).
"""

from autograder.manifest import Check, Group, Manifest, Task

from .names import (C_CAND_DEGREES, C_CAND_OPTIONS, C_CAND_SCALE, C_CAND_STAGES, C_CP_NEVER, C_CP_PAYS,
                    C_FLIGHT_1F1B, C_FLIGHT_CAP, C_FLIGHT_GPIPE, C_FLIGHT_INTERLEAVED, C_FLIGHT_RANKS,
                    C_LAYER_FLASH_CP, C_LAYER_GPT, C_LAYER_LLAMA, C_MEM_ACT, C_MEM_BUFFERS, C_MEM_STATES,
                    C_PUBLISHED_MEM, C_SEARCH_FITS, C_SEARCH_OPT, C_SIM, C_STAGE_COMPUTE, C_STAGE_MSG_CP, C_STAGE_TP,
                    C_TABLE1, C_TIME_DP, C_TIME_OPT, C_TIME_PIPE, MF, SF, SOURCES, TF)
from .planted import PLANTED

_J = "autograder.suites.a9_planning."
_NO_TRICKS = ("torch", "importlib", "__import__", "exec", "eval", "sys", "inspect", "builtins", "gc", "subprocess")
_STAGE = (C_STAGE_COMPUTE, C_STAGE_TP, C_STAGE_MSG_CP)
_TIME = (C_TIME_PIPE, C_TIME_DP, C_TIME_OPT)

MANIFEST = Manifest(
    assignment="a9", folder="a9_planning", title="Plan a training run at scale",
    files={MF: SOURCES[MF], TF: SOURCES[TF], SF: SOURCES[SF]},
    tasks=(
        Task("9.1", "Memory per GPU with the pairs in flight", file=MF,
             functions=("layer_activation_bytes", "in_flight_microbatches", "memory_per_gpu")),
        Task("9.2", "Stage times: compute, tensor- and context-parallel traffic, pipeline messages", file=TF,
             functions=("stage_times",)),
        Task("9.3", "Iteration time: bubble, data-parallel reduction, overlap, optimizer", file=TF,
             functions=("time_breakdown",)),
        Task("9.4", "Search: every layout that fits, fastest first (your enumeration)", file=SF,
             functions=("candidate_layouts", "search")),
        Task("9.5", "Where context parallelism starts to pay", file=SF, functions=("context_parallel_break_even",)),
    ),
    # the models are arithmetic on the course's library: no torch, no import tricks
    forbidden={f: _NO_TRICKS for f in (MF, TF, SF)},
    groups=(
        Group("memory", _J + "judge_memory:group_memory", timeout_s=90, trusted=True, checks=(
            Check("9.1", C_LAYER_GPT, 4),
            Check("9.1", C_LAYER_LLAMA, 2),
            Check("9.1", C_LAYER_FLASH_CP, 2),
            Check("9.1", C_FLIGHT_1F1B, 2),
            Check("9.1", C_FLIGHT_GPIPE, 2),
            Check("9.1", C_FLIGHT_INTERLEAVED, 2),
            Check("9.1", C_FLIGHT_CAP, 1),
            Check("9.1", C_FLIGHT_RANKS, 1),
            Check("9.1", C_MEM_STATES, 4),
            Check("9.1", C_MEM_ACT, 5),
            Check("9.1", C_MEM_BUFFERS, 3),
            Check("9.1", C_PUBLISHED_MEM, 2, needs=(C_MEM_STATES, C_MEM_ACT, C_MEM_BUFFERS)),
        )),
        Group("time", _J + "judge_time:group_time", timeout_s=120, trusted=True, checks=(
            Check("9.2", C_STAGE_COMPUTE, 7),
            Check("9.2", C_STAGE_TP, 4),
            Check("9.2", C_STAGE_MSG_CP, 4),
            Check("9.3", C_TIME_PIPE, 6),
            Check("9.3", C_TIME_DP, 6),
            Check("9.3", C_TIME_OPT, 3),
            Check("9.3", C_SIM, 5),
            Check("9.3", C_TABLE1, 10, needs=_STAGE + _TIME),
        )),
        Group("search", _J + "judge_search:group_search", timeout_s=150, trusted=True, checks=(
            Check("9.4", C_CAND_DEGREES, 4),
            Check("9.4", C_CAND_OPTIONS, 4),
            Check("9.4", C_CAND_STAGES, 2),
            Check("9.4", C_CAND_SCALE, 3),
            Check("9.4", C_SEARCH_FITS, 4),
            Check("9.4", C_SEARCH_OPT, 8),
        )),
        Group("context", _J + "judge_search:group_context", timeout_s=120, trusted=True, checks=(
            Check("9.5", C_CP_PAYS, 6),
            Check("9.5", C_CP_NEVER, 4),
        )),
    ),
    planted=PLANTED,
    public_boundary=("in-flight pairs: p - r even when m < p (GPipe's fill forgotten)",),
)
