"""What the capstone prints: each step's loss, tokens/s and the bytes rank 0 sent on each axis, and
with ZeRO the model-state bytes it holds beside ZeRO §5's formula.

tp and dp bytes are counted by `comm_counter` (step 1's tp figure includes the executor's one shape
probe, a forward without gradients); ZeRO-2/3's hooks send inside the backward, under the tp
counter, and are moved to dp. pp bytes are computed from the activations and gradients a stage
sends: m micro-batches each way that has a neighbour. The tied embedding's sum is its own figure.
"""

from __future__ import annotations

from scaletrain.mesh import Mesh
from scaletrain.train.config import TrainConfig

__all__ = ["pp_bytes", "step_line", "zero_summary"]


def pp_bytes(cfg: TrainConfig, mesh: Mesh) -> int:
    """Activations sent forward and gradients sent backward by this rank's stage in one step (fp32)."""
    act_bytes = cfg.rows_per_replica * cfg.seq_len * cfg.n_embd * 4 // (cfg.tp if cfg.sequence_parallel else 1)
    return cfg.micro_batches * act_bytes * ((not mesh.is_last_stage) + (not mesh.is_first_stage))


def step_line(step: int, loss: float, tokens_per_s: float, *, tp: int, pp: int, dp: int, embedding: int) -> str:
    return (f"step {step + 1:3d}  loss {loss:.4f}  {tokens_per_s:8.0f} tokens/s  sent by rank 0: "
            f"tp {tp / 1e3:.1f} KB  pp {pp / 1e3:.1f} KB  dp {dp / 1e3:.1f} KB  embedding {embedding / 1e3:.1f} KB")


def zero_summary(memory: dict, cfg: TrainConfig) -> str:
    kb = lambda key: f"{memory[key] / 1e3:.1f} KB (formula {memory['expected'][key] / 1e3:.1f})"  # noqa: E731
    return (f"ZeRO-{cfg.zero} over dp={memory['dp']}, rank 0 holds Ψ = {memory['num_params']:,} parameters "
            f"(Ψ' = {memory['padded_params']:,} padded): params {kb('params')}, grads {kb('grads')}, "
            f"{cfg.optimizer} state {kb('optimizer')}")
