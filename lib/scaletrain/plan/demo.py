"""Notebook 09 and CLI helpers: the memory wall, the time breakdown, the published table (matplotlib).

Each plot takes an `ax` and predictions (`scaletrain.plan.prediction`), so the notebook can lay
them out and the CLI can save them; nothing here computes a prediction of its own.
"""

from __future__ import annotations

from scaletrain.plan.prediction import Prediction, predict
from scaletrain.plan.layouts import candidate_layouts
from scaletrain.plan.specs import ClusterSpec, ModelSpec

__all__ = ["MEMORY_PARTS", "TIME_PARTS", "memory_wall", "time_rows", "plot_memory_wall", "plot_time_breakdown",
           "plot_published", "plan_figure"]

MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers")
# (label, seconds from a TimeBreakdown): DP is what is left exposed after the overlap
TIME_PARTS = (("compute", lambda t: t.compute_s), ("TP comm", lambda t: t.tp_comm_s), ("CP comm", lambda t: t.cp_comm_s),
              ("PP comm", lambda t: t.pp_comm_s), ("bubble", lambda t: t.bubble_s),
              ("DP comm (exposed)", lambda t: t.dp_comm_s - t.dp_overlap_s), ("optimizer", lambda t: t.optimizer_s))


def memory_wall(model: ModelSpec, cluster: ClusterSpec, gpus: int, global_batch: int, *, microbatch: int = 1,
                **space) -> list[Prediction]:
    """One prediction per (t, p) of `gpus` GPUs at `microbatch`, v = 1, fitting or not, by t then p."""
    layouts = candidate_layouts(model, cluster, gpus, global_batch, microbatches=(microbatch,), interleaves=(1,),
                                **space)
    return sorted((predict(model, cluster, lay) for lay in layouts), key=lambda p: (p.layout.tp, p.layout.pp))


def time_rows(preds: list[Prediction]) -> list[dict]:
    """A table row per prediction: layout, memory, TFLOP/s, MFU and the time breakdown in seconds."""
    rows = []
    for rank, p in enumerate(preds, 1):
        row = {"#": rank, "layout": p.layout.describe(), "GB/GPU": p.memory_per_gpu_bytes / 1e9,
               "TFLOP/s/GPU": p.tflops_per_gpu, "MFU": p.mfu, "iter s": p.iteration_s}
        row |= {name: fn(p.time) for name, fn in TIME_PARTS}
        rows.append(row)
    return rows


def _labels(preds):
    return [p.layout.describe().replace(" ", "\n", 3) for p in preds]


def plot_memory_wall(ax, preds: list[Prediction], hbm_bytes: float) -> None:
    """Stacked GB per GPU (params, grads, optimizer, activations, buffers) per (t, p), the HBM
    line, and the total printed on bars cut at 2.5 × HBM."""
    import numpy as np

    top = 2.5 * hbm_bytes / 1e9
    bottom = np.zeros(len(preds))
    for part in MEMORY_PARTS:
        gb = np.array([getattr(p.memory, part) / 1e9 for p in preds])
        ax.bar(range(len(preds)), gb, bottom=bottom, label=part)
        bottom += gb
    for i, total in enumerate(bottom):
        if total > top:
            ax.text(i, top * 0.97, f"{total:.0f}", ha="center", va="top", fontsize=6, rotation=90, color="w")
    ax.axhline(hbm_bytes / 1e9, color="k", linestyle="--", label=f"HBM {hbm_bytes / 1e9:.0f} GB")
    ax.set_ylim(0, top)
    ax.set_xticks(range(len(preds)), [f"{p.layout.tp}\n{p.layout.pp}" for p in preds], fontsize=7)
    ax.set_xlabel("t (top) × p (bottom); d = n / (t·p)")
    ax.set_ylabel("GB per GPU (pipeline rank 0)")
    ax.legend(fontsize=7)


def plot_time_breakdown(ax, preds: list[Prediction]) -> None:
    """Stacked seconds per iteration (compute, TP, PP, bubble, exposed DP, optimizer) per layout."""
    import numpy as np

    bottom = np.zeros(len(preds))
    for name, fn in TIME_PARTS:
        s = np.array([fn(p.time) for p in preds])
        ax.bar(range(len(preds)), s, bottom=bottom, label=name)
        bottom += s
    for i, p in enumerate(preds):
        ax.text(i, bottom[i], f"{p.tflops_per_gpu:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(preds)), _labels(preds), fontsize=7)
    ax.set_ylabel("seconds per iteration (TFLOP/s per GPU on top)")
    ax.legend(fontsize=7)


def plot_published(ax, rows: list[dict]) -> None:
    """Published vs predicted TFLOP/s per GPU for Table 1's rows (`calibrate.compare_table1`),
    the fitted rows apart from the held-out ones, with the ±7 % band."""
    import numpy as np

    x = np.arange(len(rows))
    pub = np.array([r["published"] for r in rows])
    pred = np.array([r["predicted"] for r in rows])
    fitted = np.array([r["fitted"] for r in rows])
    ax.fill_between(x, pub * 0.93, pub * 1.07, color="0.85", label="published ±7 %")
    ax.plot(x, pub, "ko-", label="published (Narayanan et al. 2021, Table 1)")
    ax.plot(x[fitted], pred[fitted], "s", color="C0", label="predicted, rows fitted")
    ax.plot(x[~fitted], pred[~fitted], "D", color="C3", label="predicted, rows held out")
    ax.set_xticks(x, [r["model"] for r in rows], fontsize=8)
    ax.set_ylabel("TFLOP/s per GPU")
    ax.legend(fontsize=7)


def plan_figure(title: str, preds: list[Prediction], wall: list[Prediction], hbm_bytes: float, path) -> None:
    """The CLI's figure: the memory wall of every (t, p) and the time breakdown of the best layouts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    plot_memory_wall(left, wall, hbm_bytes)
    left.set_title("memory per layout (microbatch 1, no interleaving)")
    plot_time_breakdown(right, preds)
    right.set_title("best layouts: where an iteration's time goes")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
