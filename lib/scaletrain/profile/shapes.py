"""The GPT shapes module 11 profiles: GPT-2 small as the seeds do, and CPU-sized stand-ins.

training-speedup-lecture.md, "GPT-2 Profiling: Time": s = 512, b = 8, h = 768 (GPT-2 small: 12 layers,
12 heads, V = 50257).  That shape is for a GPU: the paths that use it ran once, on an H200
(2026-11-27, ../shared/gpu-runs/2026-11-27-h200-gpucheck), which found the profile's phase split
wrong on a GPU (fixed since, in trace.py; not yet re-run there: GPU_STATUS says so in the output).
On a CPU, a shape of the same form that runs in seconds; `tiny` for tests and --quick.
"""

from __future__ import annotations

import argparse

import torch

from scaletrain.models import GPTConfig

__all__ = ["SHAPES", "GPU_STATUS", "device_note", "pick_shape", "resolve_device", "device_arg"]

# what a GPU run of these paths has shown so far (printed with every GPU profile)
GPU_STATUS = ("GPU path: ran once, H200 2026-11-27; the phase split it got wrong is fixed since, "
              "not yet re-run on a GPU")

SHAPES = {  # name -> (config, batch)
    "gpt2": (GPTConfig(vocab_size=50257, block_size=512, n_layer=12, n_head=12, n_embd=768), 8),  # GPU
    "cpu": (GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=128), 4),
    "tiny": (GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32), 2),
}


def device_note(device: str) -> str:
    """The device as the output's first line names it, with GPU_STATUS on a GPU."""
    return f"{device} ({GPU_STATUS})" if device == "cuda" else device


def pick_shape(device: str, *, quick: bool = False) -> str:
    return "tiny" if quick else "gpt2" if device.startswith("cuda") else "cpu"


def resolve_device(device: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def device_arg(text: str) -> str:
    """argparse `type=` of --device: `cuda` without a GPU is a usage error with the fix, not torch's
    "Torch not compiled with CUDA enabled" traceback halfway through the run."""
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("no CUDA device is available here: use --device cpu or auto")
    return text
