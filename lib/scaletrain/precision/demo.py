"""Helper for notebooks/07_memory_techniques.ipynb: the fp16 underflow histogram.

The histogram of log2|g| of a real gradient, with fp16's limits drawn where they fall for the
*unscaled* gradient at each loss scale S: 2^-24/S (below: lost), 2^-14/S (below: subnormal),
65504/S (above: overflow). Scaling slides the window left over the same histogram
(Micikevicius et al. 2018, Fig. 3).
"""

from __future__ import annotations

import math

import torch

__all__ = ["plot_gradient_histogram"]


def plot_gradient_histogram(grads: dict[str, torch.Tensor], ax, *, scales=(1.0, 2.0**8, 2.0**16), bins: int = 80) -> None:
    for name, g in grads.items():
        g = g.detach().float().flatten()
        g = g[g != 0].abs()
        ax.hist(torch.log2(g).numpy(), bins=bins, histtype="step", density=True, label=f"{name} gradients")
    styles = ["-", "--", ":"]
    for S, style in zip(scales, styles):
        shift = math.log2(S)
        label = f"S = 2^{shift:.0f}" if S != 1 else "S = 1"
        ax.axvline(-24 - shift, color="tab:red", ls=style, lw=1, label=f"{label}: fp16 zero below")
        ax.axvline(-14 - shift, color="tab:orange", ls=style, lw=1, label=f"{label}: subnormal below")
        ax.axvline(math.log2(65504) - shift, color="k", ls=style, lw=1, label=f"{label}: overflow above")
    ax.set_xlabel("log2 |g| (fp32 gradient, unscaled)")
    ax.set_ylabel("density")
    ax.legend(fontsize=7, ncol=2)
