"""The pipeline's message model: which tensor an action waits for and which one it sends.

Stage s's forward needs stage s-1's activation and produces stage s+1's input; its backward (B,
or I when the weight gradient is split off) needs stage s+1's gradient and produces stage s-1's
(Huang et al., 2019; Narayanan et al., 2021). W needs and sends nothing: its input is local. One
model for everything that moves tensors or reasons about them: the validator's dry run
(validate.py), the transport (p2p.py), the executor, the simulator and the cost fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.pipeline.schedules import B, F, I, Action

__all__ = ["Message", "receives", "sends"]


@dataclass(frozen=True, slots=True)
class Message:
    """One tensor between stages: an activation (F, stage s -> s+1) or a gradient (B/I, s -> s-1)."""
    kind: str          # "activation" | "gradient"
    src_stage: int
    dst_stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind} of microbatch {self.microbatch} (stage {self.src_stage} -> {self.dst_stage})"


def receives(action: Action, num_stages: int) -> Message | None:
    """The message `action` must receive before it can run, if any."""
    s, i = action.stage, action.microbatch
    if action.kind == F and s > 0:
        return Message("activation", s - 1, s, i)
    if action.kind in (B, I) and s < num_stages - 1:
        return Message("gradient", s + 1, s, i)
    return None


def sends(action: Action, num_stages: int) -> Message | None:
    """The message `action` sends when it is done, if any."""
    s, i = action.stage, action.microbatch
    if action.kind == F and s < num_stages - 1:
        return Message("activation", s, s + 1, i)
    if action.kind in (B, I) and s > 0:
        return Message("gradient", s, s - 1, i)
    return None
