"""Activation checkpointing by hand: full, selective, √n segments, and Rotor's optimal plan.

    from scaletrain.checkpointing import checkpoint, profile_chain, gpt_stages, plan_rotor, run_plan
    y = checkpoint(block, x)                           # recompute block in backward
    stages, names = gpt_stages(model, targets)         # embedding, blocks, head, loss
    chain = profile_chain(stages, idx, names=names)    # bytes and seconds per stage
    plan = plan_rotor(chain, budget)                   # the fastest plan within the budget
    run_plan(plan, stages, idx).backward()             # executes notation(plan)

function.py: the checkpoint Function (assignment a7, task 7.2) and checkpoint_sequential;
selective.py: recompute only the attention core (Korthikanti et al.); chain.py: the per-stage
profile; schedule.py: plans as data (the seed's F/B notation), their simulation; planner.py: √n
and the dynamic program (task 7.3); executor.py: a plan run on real stages; demo.py: the
notebook's plots; benchmark.py: `python -m scaletrain.bench memory`.
"""

from scaletrain.checkpointing.chain import Chain, gpt_stages, profile_chain
from scaletrain.checkpointing.executor import record_ops, run_plan
from scaletrain.checkpointing.function import CheckpointFunction, checkpoint, checkpoint_sequential
from scaletrain.checkpointing.planner import min_peak, plan_rotor, plan_sqrt, store_all_peak
from scaletrain.checkpointing.schedule import (Op, Plan, Simulation, Split, Store, notation, ops, segments_plan,
                                               simulate, store_all, timeline)
from scaletrain.checkpointing.selective import attention_core, explicit_attention

__all__ = ["checkpoint", "checkpoint_sequential", "CheckpointFunction", "Chain", "profile_chain", "gpt_stages",
           "Store", "Split", "Plan", "Op", "ops", "notation", "simulate", "Simulation", "timeline", "store_all",
           "segments_plan", "plan_rotor", "plan_sqrt", "min_peak", "store_all_peak", "run_plan", "record_ops",
           "attention_core", "explicit_attention"]
