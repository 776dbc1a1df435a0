"""Helpers for notebooks/07_memory_techniques.ipynb: what each technique removes (estimate beside
measurement), the planner's memory-versus-recompute curve, and a plan drawn as a Gantt chart.

Estimates come from `scaletrain.memory` (the seed's formulas); measurements from
`scaletrain.memory_measure` (saved tensors, storages) on the tiny GPT, one real step each.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from matplotlib.patches import Patch

from scaletrain import memory
from scaletrain.checkpointing.chain import Chain
from scaletrain.checkpointing.planner import min_peak, plan_rotor, store_all_peak
from scaletrain.checkpointing.schedule import Plan, segments_plan, simulate, timeline
from scaletrain.checkpointing.selective import explicit_attention
from scaletrain.memory_measure import measure_training_step, storage_bytes, track_saved_tensors
from scaletrain.models import GPT, GPTConfig, make_batch

__all__ = ["Removed", "gpt1_removed", "tiny_removed", "tradeoff", "plot_tradeoff", "plot_timeline", "plot_removed"]


@dataclass(frozen=True)
class Removed:
    technique: str
    what: str            # which bytes the technique acts on
    before: int
    after: int
    measured_before: int | None = None
    measured_after: int | None = None

    @property
    def removed(self) -> int:
        return self.before - self.after


def gpt1_removed(batch_size: int = 64) -> list[Removed]:
    """The seed's GPT-1 example (module 0), bytes each technique removes, from the formulas."""
    g, psi = memory.GPT1, 147 * memory.MB
    shape = dict(seq_len=g["block_size"], batch_size=batch_size, hidden=g["hidden"], n_layer=g["n_layer"],
                 n_head=g["n_head"])
    fp32 = memory.activation_bytes(**shape, bytes_per_element=4)
    half = memory.activation_bytes(**shape)
    s, b, a, L = g["block_size"], batch_size, g["n_head"], g["n_layer"]
    core = 5 * a * s * s * b * L            # Korthikanti's 5·a·s/h term, per the whole model
    states = memory.model_states_bytes(psi, precision="mixed", optimizer="adamw")
    return [Removed("mixed precision", "activations (fp32 → 16-bit)", fp32, half),
            Removed("selective recomputation", "16-bit activations", half, half - core),
            Removed("full checkpointing", "16-bit activations", half, memory.activation_bytes(**shape, checkpointing=True)),
            Removed("ZeRO-Offload", "device model states (16Ψ → 4Ψ)", states.total, states.params + states.grads)]


def _saved_after_forward(model, idx, tgt, **attn) -> int:
    with explicit_attention(model, **attn), track_saved_tensors(list(model.parameters())) as tracker:
        model(idx, tgt)
        return tracker.bytes


def tiny_removed(cfg: GPTConfig | None = None, batch_size: int = 4) -> list[Removed]:
    """The same techniques on the tiny GPT: the formula's before/after beside one measured step."""
    from scaletrain.offload import OffloadOptimizer
    from scaletrain.precision import MixedPrecision

    cfg = cfg or GPTConfig(n_layer=4, dropout=0.0)
    s, b, h, L, a, V = cfg.block_size, batch_size, cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.vocab_size
    shape = dict(batch_size=b, seq_len=s, hidden=h, n_layer=L, n_head=a, vocab_size=V)
    full = measure_training_step(GPT(cfg), batch_size=b)
    ckpt = measure_training_step(GPT(cfg), batch_size=b, checkpointing=True)
    rows = [Removed("full checkpointing", "fp32 activations, peak", memory.tiny_gpt_activation_bytes(**shape),
                    memory.tiny_gpt_activation_bytes(**shape, checkpointing=True),
                    full.activations_peak, ckpt.activations_peak)]
    model = GPT(cfg)
    idx, tgt = make_batch(cfg, b)
    ints = 8 * s * b + 8 * s + 8 * s * b   # token ids, position ids, targets: int64 whatever the precision
    fp32 = memory.tiny_gpt_activation_bytes(**shape)
    half_model = copy.deepcopy(model).half()
    with track_saved_tensors(list(half_model.parameters())) as tracker:
        half_model(idx, tgt)
        half = tracker.bytes
    rows.append(Removed("mixed precision", "activations (fp32 → fp16)", fp32, (fp32 - ints) // 2 + ints,
                        full.activations, half))
    stored, selective = _saved_after_forward(model, idx, tgt), _saved_after_forward(model, idx, tgt, recompute=True)
    rows.append(Removed("selective recomputation", "fp32 activations, unfused attention", stored,
                        stored - 4 * a * s * s * b * L, stored, selective))
    held = {}
    for name, cls in (("one tier", MixedPrecision), ("offload", OffloadOptimizer)):
        engine = cls(copy.deepcopy(model), torch.optim.Adam, dtype=torch.float16, lr=1e-3, scaler=dict(init_scale=2.0**8))
        for _ in range(2):   # the second backward: gradients and the optimizer state exist together
            engine.backward(engine.model(idx, tgt)[1])
            if _ == 0:
                engine.step()
        state = [v for st in engine.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        device = storage_bytes(engine.params) + storage_bytes(p.grad for p in engine.params)
        held[name] = device if name == "offload" else device + storage_bytes(engine.master) + storage_bytes(state)
    psi = sum(p.numel() for p in engine.params)
    states = memory.model_states_bytes(psi, precision="mixed", optimizer="adam")
    rows.append(Removed("ZeRO-Offload", "device model states", states.total, states.params + states.grads,
                        held["one tier"], held["offload"]))
    return rows


def plot_removed(rows: list[Removed], ax, *, unit: float = 1e9, label: str = "GB") -> None:
    """Bars: bytes removed per technique, the formula beside the measurement when there is one."""
    xs = range(len(rows))
    measured = any(r.measured_before is not None for r in rows)
    shift, width = (0.2, 0.4) if measured else (0.0, 0.6)
    ax.bar([x - shift for x in xs], [r.removed / unit for r in rows], width, label="estimate (scaletrain.memory)")
    if measured:
        ax.bar([x + shift for x in xs], [(r.measured_before - r.measured_after) / unit
                                         if r.measured_before is not None else 0 for r in rows],
               width, label="measured (one CPU step)")
    ax.set_xticks(list(xs), [f"{r.technique}\n{r.what}" for r in rows], fontsize=8, rotation=12, ha="right")
    ax.set_ylabel(f"{label} removed")
    ax.legend()


def tradeoff(chain: Chain, points: int = 24) -> dict[str, list[tuple[int, float]]]:
    """(peak bytes, recompute seconds) of Rotor's plan at budgets from the lowest peak to store-all,
    of every d-segment plan (Chen's family, d = 1..n-1), and of storing everything."""
    lo, hi = min_peak(chain), store_all_peak(chain)
    budgets = sorted({int(lo + (hi - lo) * (i / (points - 1)) ** 2) for i in range(points)})
    rotor = []
    for budget in budgets:
        sim = simulate(plan_rotor(chain, budget), chain)
        rotor.append((budget, sim.recompute_s))
    chen = [(sim.peak_bytes, sim.recompute_s) for d in range(1, chain.n)
            for sim in [simulate(segments_plan(chain.n, d), chain)]]
    d = max(1, round(math.sqrt(chain.n - 1)))
    sqrt = simulate(segments_plan(chain.n, d), chain)
    return {"rotor": rotor, "segments": chen, "sqrt": [(sqrt.peak_bytes, sqrt.recompute_s)], "store all": [(hi, 0.0)]}


def plot_tradeoff(chain: Chain, ax, *, points: int = 24) -> None:
    curves = tradeoff(chain, points)
    forward = sum(chain.forward_s)
    ax.step([b / 1e6 for b, _ in curves["rotor"]], [r / forward for _, r in curves["rotor"]], where="post",
            label="Rotor's plan (budget on x)")
    ax.plot([b / 1e6 for b, _ in curves["segments"]], [r / forward for _, r in curves["segments"]], "o",
            mfc="none", label="d equal segments (Chen), d = 1 … n−1")
    ax.plot([b / 1e6 for b, _ in curves["sqrt"]], [r / forward for _, r in curves["sqrt"]], "*", ms=14, label="√n segments")
    ax.plot([b / 1e6 for b, _ in curves["store all"]], [0], "ks", label="store everything")
    ax.set_xlabel("peak saved MB")
    ax.set_ylabel("recomputation / one forward")
    ax.legend()


COLORS = {("F", "e"): "tab:blue", ("F", "c"): "tab:orange", ("F", "n"): "tab:gray", ("B", ""): "tab:green"}


def plot_timeline(plan: Plan, chain: Chain, ax, ax_mem=None) -> None:
    """The plan as a Gantt chart, one row per stage (the seed's F^e / F^c / F^n / B), and the saved
    bytes after every operation below it."""
    rows = timeline(plan, chain)
    for op, start, duration, _ in rows:
        ax.barh(op.stage, duration, left=start, color=COLORS[(op.kind, op.mode)], edgecolor="white")
    ax.set_yticks(range(chain.n), [chain.label(i) for i in range(chain.n)])
    ax.invert_yaxis()
    ax.legend(handles=[Patch(color=color, label=f"{kind}^{mode}" if mode else kind)
                       for (kind, mode), color in COLORS.items()], ncol=4, fontsize=8)
    if ax_mem is not None:
        xs = [start + duration for _, start, duration, _ in rows]
        ax_mem.step([0.0, *xs], [0, *(live / 1e6 for *_, live in rows)], where="pre")
        ax_mem.axhline(simulate(plan, chain).peak_bytes / 1e6, ls="--", color="k", lw=0.8)
        ax_mem.set_ylabel("saved MB")
        ax_mem.set_xlabel("seconds (profiled)")
