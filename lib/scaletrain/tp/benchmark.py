"""`python -m scaletrain.bench tp [--quick] [--world-sizes 2,4] [--reps N]`

One forward + backward step of the tiny GPT, tensor parallel over t ranks, without and with
sequence parallelism, three ways on the same ranks:
  * ours, backend="ring":  `scaletrain.tp.parallelize` on our ring collectives (assignment a2);
  * ours, backend="torch": the same layers on torch.distributed's collectives (gloo's C++ ring);
  * torch:                 `parallelize_module` with ColwiseParallel / RowwiseParallel /
                           SequenceParallel, DTensors on a CPU DeviceMesh, `loss_parallel`
                           (torch_twin.py; the baseline).
The three are timed round-robin, one step of each per rep (bench.compare_many: barrier before
every step, slowest rank's time); "ratio" is the median of per-rep ratios to the baseline's step of
the same rep (< 1: faster): the rows of one (t, SP) share one baseline measurement, whose own row
reads 1.00. Before timing,
our GPT is checked against one process (verify.check_gpt).

Bytes per rank per step: measured for every variant from the kernel's count of bytes the process
wrote (`wchar` in /proc/self/io: gloo's sockets, so torch's collectives too), counted by
`comm_counter` for ours on the ring, and the closed form (tp/cost.py: 4 allreduces of b·s·h per
layer, the seminar's equation 5, plus the embedding, head and loss). Activation bytes per rank:
what autograd holds at the end of the forward for the whole model, and for the blocks alone beside
the formula (tp/activations.py: Korthikanti's sbh(10 + 24/t + 5as/(ht)) and sbh(34/t + 5as/(ht))
adapted to fp32 on CPU). Plot: bench_out/tp.png.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from scaletrain import bench
from scaletrain.comm import comm_counter
from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.tp import cost, verify
from scaletrain.tp.activations import block_activation_bytes
from scaletrain.tp.gpt import allreduce_sequence_parallel_grads, parallelize
from scaletrain.tp.torch_twin import saved_bytes_at_forward_end, torch_parallelize, twin_of, twin_step

DISTRIBUTED = True  # spawns ranks: `python -m scaletrain.bench all` runs it under torchrun
CFG = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=8, n_embd=128)
QUICK_CFG = GPTConfig(vocab_size=96, block_size=16, n_layer=2, n_head=4, n_embd=32)
BATCH, QUICK_BATCH = 4, 2
BASELINE = "torch parallelize_module"
COLUMNS = ["t", "SP", "variant", "ms", "p20", "p80", "ratio", "ratio p20-p80", "KB sent/rank", "KB counted",
           "KB formula", "act KB", "blocks act KB", "blocks formula KB"]


def _wchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


def _ours(cfg: GPTConfig, sp: bool, backend: str, idx, targets):
    model = parallelize(GPT(cfg, seed=0), sequence_parallel=sp, backend=backend)

    def step(on_forward_end=None):
        model.zero_grad(set_to_none=True)
        loss = model(idx, targets)[1]
        if on_forward_end is not None:
            on_forward_end()
        loss.backward()
        allreduce_sequence_parallel_grads(model, backend=backend)
    return model, step


def _torch(cfg: GPTConfig, sp: bool, idx, targets):
    twin = torch_parallelize(twin_of(GPT(cfg, seed=0)), dist.get_world_size(), sequence_parallel=sp)

    def step(on_forward_end=None):
        twin.zero_grad(set_to_none=True)
        twin_step(twin, idx, targets, on_forward_end=on_forward_end)
    return twin, step


def _blocks_bytes(model, step) -> int:
    """Saved bytes of the blocks' forwards: the tracker's total between the first block's start and the last's end."""
    marks: list[int] = []
    first, last = model.blocks[0], model.blocks[-1]
    counting: dict[str, int] = {}
    hooks = [first.register_forward_pre_hook(lambda *_: marks.append(counting["now"]())),
             last.register_forward_hook(lambda *_: marks.append(counting["now"]()))]
    try:
        from torch.distributed.tensor import DTensor
        seen: dict[int, int] = {}
        skip = {(p.to_local() if isinstance(p, DTensor) else p).untyped_storage().data_ptr()
                for p in model.parameters()}

        def pack(t):
            st = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
            if st.data_ptr() not in skip:
                seen[st.data_ptr()] = st.nbytes()
            return t
        counting["now"] = lambda: sum(seen.values())
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step()
    finally:
        for h in hooks:
            h.remove()
    return marks[1] - marks[0]


def _measure_rank(rank: int, world_size: int, reps: int, quick: bool) -> list[dict[str, Any]]:
    cfg, b = (QUICK_CFG, QUICK_BATCH) if quick else (CFG, BATCH)
    s = cfg.block_size
    idx, targets = make_batch(cfg, b, seed=0)
    rows = []
    for sp in (False, True):
        verify.check_gpt(cfg=cfg, batch=b, seq=s, sequence_parallel=sp)  # correct before timed
        variants = {"ours (ring)": _ours(cfg, sp, "ring", idx, targets),
                    "ours (torch collectives)": _ours(cfg, sp, "torch", idx, targets),
                    BASELINE: _torch(cfg, sp, idx, targets)}
        facts = {}
        for name, (model, step) in variants.items():
            step()  # warm-up (DTensor's sharding propagation caches)
            dist.barrier()
            w0 = _wchar()
            with comm_counter() as counted:
                step()
            sent = torch.tensor([float(_wchar() - w0)])
            dist.all_reduce(sent)
            facts[name] = dict(sent=sent.item() / world_size, counted=counted.bytes_sent,
                               act=saved_bytes_at_forward_end(step, list(model.parameters())),
                               blocks=_blocks_bytes(model, step))
        # one round-robin over the three: every row uses the same baseline samples (its own row: 1.00)
        cmps = bench.compare_many({name: step for name, (_, step) in variants.items()}, BASELINE,
                                  warmup=2, reps=reps, group=dist.group.WORLD)
        for name in variants:
            rows.append(dict(t=world_size, sp=sp, variant=name, cmp=cmps[name], **facts[name],
                             formula=_step_formula(cfg, b, world_size, sp),
                             blocks_formula=cfg.n_layer * block_activation_bytes(
                                 batch_size=b, seq_len=s, hidden=cfg.n_embd, n_head=cfg.n_head, tp=world_size,
                                 sequence_parallel=sp)))
    return rows


def _step_formula(cfg: GPTConfig, b: int, t: int, sp: bool) -> int:
    """tp/cost.py: forward + backward, and under SP the gradient allreduce of the shard-wise parameters."""
    step = cost.gpt_step_bytes(batch_size=b, seq_len=cfg.block_size, hidden=cfg.n_embd, n_layer=cfg.n_layer, t=t,
                               sequence_parallel=sp)
    grads = cost.sequence_parallel_grad_bytes(hidden=cfg.n_embd, n_layer=cfg.n_layer, block_size=cfg.block_size, t=t)
    return step + (grads if sp else 0)


def measure(sizes: tuple[int, ...], reps: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for t in sizes:
        rows += spawn(_measure_rank, t, reps, quick, timeout_s=240 + 20 * reps * t)[0]
    return rows


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        cmp, ours_ring = r["cmp"], r["variant"] == "ours (ring)"
        out.append({"t": r["t"], "SP": "on" if r["sp"] else "off", "variant": r["variant"],
                    "ms": cmp.candidate.median * 1e3, "p20": cmp.candidate.p20 * 1e3, "p80": cmp.candidate.p80 * 1e3,
                    "ratio": cmp.ratio, "ratio p20-p80": f"{cmp.ratio_p20:.2f}-{cmp.ratio_p80:.2f}",
                    "KB sent/rank": r["sent"] / 1e3, "KB counted": r["counted"] / 1e3 if ours_ring else "-",
                    "KB formula": r["formula"] / 1e3 if ours_ring else "-", "act KB": r["act"] / 1e3,
                    "blocks act KB": r["blocks"] / 1e3, "blocks formula KB": r["blocks_formula"] / 1e3})
    return out


def plot(rows: list[dict[str, Any]], name: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    keys = [(r["t"], r["SP"]) for r in rows if r["variant"] == BASELINE]
    names = list(dict.fromkeys(r["variant"] for r in rows))
    width = 0.8 / len(names)
    for ax, key, title in zip(axes, ("ratio", "KB sent/rank", "blocks act KB"),
                              (f"step time / {BASELINE}", "KB sent per rank per step (wchar)",
                               "blocks' saved activations per rank, KB")):
        for i, variant in enumerate(names):  # not `name`: that is the file to write
            vals = [next(r[key] for r in rows if (r["t"], r["SP"]) == k and r["variant"] == variant) for k in keys]
            ax.bar([j + i * width for j in range(len(keys))], vals, width, label=variant)
        if key == "blocks act KB":
            formula = [next(r["blocks formula KB"] for r in rows if (r["t"], r["SP"]) == k) for k in keys]
            ax.scatter([j + width for j in range(len(keys))], formula, color="k", marker="_", s=400, label="formula",
                       zorder=3)
        ax.set_xticks([j + width for j in range(len(keys))], [f"t={t} SP {sp}" for t, sp in keys])
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return bench.save_figure(fig, name, dpi=110)


def main(argv: list[str]) -> int:
    args, sizes, reps = bench.distributed_args(
        argv, "tp", __doc__, quick_help="a smaller GPT, t = 2 only, fewer reps",
        sizes_help="comma-separated t values, one spawn of t ranks each (default 2,4; quick 2)",
        sizes="2,4", quick_sizes="2", reps=10, quick_reps=3)
    rows = table(measure(sizes, reps, args.quick))
    print(bench.format_table(rows, COLUMNS))
    path = plot(rows, "tp.png")
    print(f"\nratio: step time / {BASELINE} (median of per-rep ratios; the rows of one (t, SP) share one baseline "
          "measurement, its own row 1.00); KB sent: mean over ranks of "
          "bytes written to gloo's sockets (/proc/self/io wchar); KB counted: comm_counter; act KB: saved for "
          f"backward at the end of the forward, whole model; plot: {path}")
    return 0
