"""Notebook 06's capstone curves: `train_curves(layouts, steps)` trains the capstone in a few 3D layouts
on one spawn of 4 ranks and returns their losses beside one process's."""

from __future__ import annotations

from scaletrain.launch import spawn
from scaletrain.train.config import TrainConfig
from scaletrain.train.loop import reference, train_rank

__all__ = ["train_curves"]


def _curves_rank(rank: int, world_size: int, layouts, steps: int) -> dict:
    return {layout: train_rank(rank, world_size, TrainConfig(dp=layout[0], pp=layout[1], tp=layout[2], steps=steps),
                               log=False)["losses"] for layout in layouts}


def train_curves(layouts=((1, 2, 2), (1, 1, 4)), steps: int = 12) -> dict:
    """The capstone in each (dp, pp, tp) layout on 4 spawned ranks, and one process (the layouts must
    share dp: one batch per step): {layout: losses, "one process": losses}."""
    if len({layout[0] for layout in layouts}) != 1:
        raise ValueError("train_curves: the layouts must share dp (the reference trains on one batch per step)")
    curves = spawn(_curves_rank, 4, tuple(layouts), steps, timeout_s=240)[0]
    curves["one process"] = reference(TrainConfig(dp=layouts[0][0], steps=steps))["losses"]
    return curves
