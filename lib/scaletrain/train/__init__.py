"""`python -m scaletrain.train --dp D --pp P --tp T [--zero S]`: the tiny GPT trained on a 3D grid of D·P·T ranks.

PTD-P (Narayanan et al. 2021; seminar §1.2.5) composed from the course's own parts, one file per step
of the recipe, read in this order:

  config.py   `TrainConfig` (validated when built) and the step's batch of the course's corpus
              (`scaletrain.data`: the handouts as bytes, vocabulary 256);
  recipe.py   `build`: the mesh (`ParallelDims(dp, pp, tp)`), the tensor-parallel GPT, this rank's
              pipeline stage and its executor;
  sync.py     the gradient synchronization over dp: plain data parallelism (one ring allreduce of a
              flat buffer) or ZeRO-S, one object each, behind one interface;
  loop.py     `train_rank`: the loop that runs the executor, the gradient fix-ups and `sync.step()`,
              the same for every layout and stage; `reference`, one process on the whole batch;
  report.py   each step's loss, tokens/s and bytes per axis; ZeRO's bytes beside its formula;
  cli.py      `main` and `run`; demo.py: notebook 06's curves.

With `--zero S`, per rank, in fp32 with Adam (p = g = 4 and K = 8 bytes per parameter; the seminar's
mixed-precision form is Ψ·(2 + 2 + K)/N_d at stage 3): stage 1 (4 + 4)Ψ + 8Ψ/N_d, stage 2
4Ψ + (4 + 8)Ψ/N_d, stage 3 (4 + 4 + 8)Ψ/N_d bytes, which the run's last line prints, measured on rank
0, next to the formula. Every stage composes with every layout, pipelines and sequence parallelism
included (tests/test_train_zero.py), at a price under a pipeline: stages 2 and 3 reduce-scatter once
per micro-batch, and stage 3 gathers every parameter twice per micro-batch, which is why DeepSpeed's
pipeline engine accepts only stage 1. Not composed yet: bucketed overlap of the dp allreduce with the
pipeline's backward, and dropout (the trainer's GPT has none; `scaletrain.tp.dropout` makes tensor
parallelism equal one process, but data and pipeline parallelism would need masks keyed by the
sample's index in the global batch).
"""

from scaletrain.train.cli import main, run
from scaletrain.train.config import OPTIMIZER_CLASSES, ZERO_STAGES, TrainConfig, batch
from scaletrain.train.loop import reference, train_rank
from scaletrain.train.recipe import Stage, build
from scaletrain.train.report import zero_summary

__all__ = ["TrainConfig", "OPTIMIZER_CLASSES", "ZERO_STAGES", "batch", "Stage", "build", "train_rank", "reference",
           "zero_summary", "run", "main"]
