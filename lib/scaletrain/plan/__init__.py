"""Plan a training run at scale: memory and throughput of 3D-parallel layouts, and a search.

    from scaletrain.plan import CLUSTERS, GPT3_175B, Layout, predict, search
    a100 = CLUSTERS["a100-80gb"]
    predict(GPT3_175B, a100, Layout(tp=8, pp=16, dp=8, microbatch=1, global_batch=1536)).tflops_per_gpu
    search(GPT3_175B, a100, gpus=1024, global_batch=1536, top=5)

    python -m scaletrain.plan --model 175B --gpus 1024 --cluster a100-80gb
    python -m scaletrain.plan --model Llama-3-70B --gpus 1024 --cluster h100 --batch 512 --software megatron-2024 --cp 1 2
    python -m scaletrain.plan validate          # the published runs of 2021-2024 beside the predictions

One idea per file: model_spec.py (GPT-3- and Llama-style models), specs.py (cluster, layout),
stages.py (even and uneven pipeline stages), software.py (what each year's stack could run),
flops.py (eq. 3), efficiency.py (roofline of the layer's GEMMs), rates.py (GEMMs plus element-wise
traffic), memory.py, time_model.py, prediction.py, layouts.py (the search), published.py (Table 1),
published_runs.py (runs of 2021-2024), calibrate.py (the efficiency fits), validate.py, clusters.py
(presets), local.py (this machine, torch), cli.py, demo.py (plots). Pure arithmetic (numpy for the fit) on the course's own pieces:
`scaletrain.memory` (a0), the α–β model of `scaletrain.comm.cost_model` (a2), the pipeline's
closed forms (a4). Names load on first use, so importing one file never runs the others.
"""

import importlib

_LAZY = {
    "ModelSpec": "specs", "ClusterSpec": "specs", "Layout": "specs", "check_layout": "specs",
    "GemmEfficiency": "efficiency", "iteration_flops": "flops", "model_flops": "flops",
    "MemoryEstimate": "memory", "memory_per_gpu": "memory", "in_flight_microbatches": "memory",
    "StageTimes": "time_model", "TimeBreakdown": "time_model", "stage_times": "time_model",
    "time_breakdown": "time_model", "Prediction": "prediction", "predict": "prediction",
    "search": "layouts", "candidate_layouts": "layouts", "CLUSTERS": "clusters",
    "GPT3_175B": "published", "MODELS": "published", "TABLE1": "published", "PublishedRun": "published",
    "PUBLISHED": "published_runs", "PublishedConfig": "published_runs", "GPT3_FAMILY": "published_runs",
    "LLAMA_FAMILY": "published_runs", "SOFTWARE": "software", "Software": "software",
    "balanced_stages": "stages", "validate_rows": "validate",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"scaletrain.plan.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'scaletrain.plan' has no attribute {name!r}")
