"""`predict(model, cluster, layout)`: what one iteration of a 3D-parallel run costs, in time and memory.

It composes the pieces: `memory_per_gpu` (peak GPU), `time_breakdown` (slowest rank), and the FLOP
count of Narayanan et al. 2021, eq. (3), which turns time into the paper's figure of merit:

    tflops_per_gpu = iteration_flops(B, recompute) / (iteration_s · n)          (hardware FLOPs)
    mfu            = model_flops(B) / (iteration_s · n · peak)                  (PaLM, appendix B)

The same arithmetic the seminar notes do by hand in §1.2.5 (the PBS equations 4 and 6, TP versus
PP communication in eq. 5) and "Performance Estimation" in the training speed-up lecture, with
every term from the course's own code: `scaletrain.memory` (a0), `scaletrain.comm.cost_model` (a2),
`scaletrain.pipeline.closed_form_bubble` (a4).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.plan.flops import iteration_flops, model_flops
from scaletrain.plan.memory import MemoryEstimate, memory_per_gpu
from scaletrain.plan.specs import ClusterSpec, Layout, ModelSpec, check_layout
from scaletrain.plan.time_model import TimeBreakdown, time_breakdown

__all__ = ["Prediction", "predict"]


@dataclass(frozen=True, kw_only=True)
class Prediction:
    layout: Layout
    iteration_s: float
    tflops_per_gpu: float        # eq. (3) FLOPs (recompute counted) per second per GPU, / 1e12
    mfu: float                   # model FLOPs / (time · GPUs · peak)
    tokens_per_s: float
    memory_per_gpu_bytes: int
    fits: bool                   # memory_per_gpu_bytes <= the cluster's HBM
    memory: MemoryEstimate
    time: TimeBreakdown


def predict(model: ModelSpec, cluster: ClusterSpec, layout: Layout, *, gpus: int | None = None) -> Prediction:
    """Predicted iteration of `layout`; `gpus`, when given, must equal tp·pp·dp (ValueError)."""
    check_layout(model, layout, gpus=gpus)
    memory = memory_per_gpu(model, cluster, layout)
    time = time_breakdown(model, cluster, layout)
    seconds, n = time.iteration_s, layout.gpus
    return Prediction(
        layout=layout, iteration_s=seconds,
        tflops_per_gpu=iteration_flops(model, layout.global_batch, recompute=layout.recompute,
                                       flash_attention=layout.flash_attention) / (seconds * n) / 1e12,
        mfu=model_flops(model, layout.global_batch) / (seconds * n * cluster.peak_flops),
        tokens_per_s=layout.global_batch * model.seq / seconds,
        memory_per_gpu_bytes=memory.total, fits=memory.total <= cluster.hbm_bytes, memory=memory, time=time)
