"""PipelineExecutor against a single-process run: every schedule, p in {1, 2, 3, 4}, m in {p, 2p+1}.

One spawn of 4 ranks covers every p: p = 1, 2 and 3 run on sub-groups of the world (which also
checks that the executor maps group ranks correctly); all schedules and m values run inside it.
Interleaved needs m to be a multiple of p, so it runs m in {p, 2p} with v = 2.
"""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as Fn

from scaletrain.launch import spawn
from scaletrain.models import Block, GPTConfig
from scaletrain.pipeline import (Action, PipelineExecutor, ScheduleError, gpipe, interleaved_1f1b, one_f_one_b,
                                 simulate, zb_h1)

RTOL, ATOL = 1e-5, 4e-5
CASES = [("gpipe", lambda p, m: gpipe(p, m), 1, lambda p: (p, 2 * p + 1)),
         ("1f1b", lambda p, m: one_f_one_b(p, m), 1, lambda p: (p, 2 * p + 1)),
         ("zb_h1", lambda p, m: zb_h1(p, m), 1, lambda p: (p, 2 * p + 1)),
         ("interleaved", lambda p, m: interleaved_1f1b(p, m, 2), 2, lambda p: (p, 2 * p))]


def mlp_stages(num_stages: int, seed: int) -> tuple[list[nn.Module], list[int]]:
    """Stages of irregular widths (5..11), some with a LayerNorm, so shapes differ per boundary."""
    gen = torch.Generator().manual_seed(seed)
    widths = [5 + (3 * s) % 7 for s in range(num_stages + 1)]
    stages = []
    for s in range(num_stages):
        layers = [nn.Linear(widths[s], widths[s + 1]), nn.Tanh()]
        if s % 2:
            layers.insert(1, nn.LayerNorm(widths[s + 1]))
        stage = nn.Sequential(*layers)
        with torch.no_grad():
            for q in stage.parameters():
                q.copy_(torch.randn(q.shape, generator=gen) * 0.5)
        stages.append(stage)
    return stages, widths


def run_and_compare(stages, x, y, schedule, p, rank, group, name, recv_window=None) -> tuple[list[str], PipelineExecutor]:
    """Run `schedule` on this rank's stages; return mismatches against one process on the whole model."""
    reference = nn.Sequential(*copy.deepcopy(stages))
    ref_out = reference(x)
    Fn.mse_loss(ref_out, y).backward()
    m = _m(schedule)
    ref_losses = [Fn.mse_loss(o, t).item() for o, t in zip(ref_out.split(len(x) // m), y.split(len(y) // m))]
    mine = {s: stages[s] for s in range(rank, len(stages), p)}
    ex = PipelineExecutor(mine, schedule=schedule, loss_fn=Fn.mse_loss, group=group, recv_window=recv_window)
    losses = ex.step(x if ex.is_first_stage else None, y if ex.is_last_stage else None)
    bad = []
    for s, module in mine.items():
        for (pname, q), q_ref in zip(module.named_parameters(), reference[s].parameters()):
            if not torch.allclose(q.grad, q_ref.grad, rtol=RTOL, atol=ATOL):
                err = (q.grad - q_ref.grad).abs().max().item()
                bad.append(f"{name} p={p} m={m} stage {s} {pname}: max abs err {err:.2e}")
    if ex.is_last_stage and losses != pytest.approx(ref_losses, rel=1e-5):
        bad.append(f"{name} p={p}: losses {losses} != {ref_losses}")
    if ex.in_flight or ex.activation_bytes:
        bad.append(f"{name} p={p}: activations still held after the step")
    spans = ex.timeline
    if [s.action for s in spans] != schedule[rank] or any(
            a.end < a.start or b.start < a.end for a, b in zip(spans, spans[1:])):
        bad.append(f"{name} p={p}: timeline is not the rank's actions in order, back to back or later")
    return bad, ex


def _m(schedule) -> int:
    return 1 + max(a.microbatch for acts in schedule.values() for a in acts)


def _all_checks(rank: int, world_size: int):
    # new_group is collective: every rank calls it; p = 1 sends its messages to itself (no network)
    groups = {1: dist.new_group([0]), 2: dist.new_group([0, 1]), 3: dist.new_group([0, 1, 2]), 4: None}
    mismatches, checks, peaks = [], 0, {}
    for p, group in groups.items():
        if rank >= p:
            continue
        for name, make, v, m_values in CASES:
            for m in m_values(p):
                stages, widths = mlp_stages(p * v, seed=100 * p + m)
                gen = torch.Generator().manual_seed(m)
                x, y = torch.randn(3 * m, widths[0], generator=gen), torch.randn(3 * m, widths[-1], generator=gen)
                bad, ex = run_and_compare(stages, x, y, make(p, m), p, rank, group, name)
                mismatches += bad
                checks += 1
                peaks[(name, p, m)] = ex.peak_activation_bytes
        if p == 1:
            continue
        # executor refuses a deadlocking schedule before any message moves
        broken = gpipe(p, p)
        broken[0] = [Action(0, "F", 0), Action(0, "B", 0)] + [a for a in broken[0] if a.microbatch > 0]
        try:
            PipelineExecutor({s: nn.Identity() for s in [rank]}, schedule=broken, loss_fn=Fn.mse_loss, group=group)
            mismatches.append(f"p={p}: a deadlocking schedule was accepted")
        except ScheduleError as exc:
            if "rank 0 stalls at B0@s0" not in str(exc):
                mismatches.append(f"p={p}: unclear deadlock error: {exc}")
    if rank < 2:  # transformer blocks: 3-D activations, attention, LayerNorm, GELU, the I/W split
        cfg = GPTConfig(n_embd=16, n_head=2, n_layer=1, block_size=8)
        torch.manual_seed(3)
        blocks = [Block(cfg) for _ in range(4)]
        x, y = torch.randn(6, 8, 16), torch.randn(6, 8, 16)
        # every receive posted at the step's start (the default), and one action ahead only
        for name, schedule, window in [("zb_h1-gpt", zb_h1(2, 3), None), ("interleaved-gpt", interleaved_1f1b(2, 2, 2), 1)]:
            for b in blocks:
                b.zero_grad()
            mismatches += run_and_compare(blocks[:4 if "inter" in name else 2], x, y, schedule, 2, rank,
                                          groups[2], name, recv_window=window)[0]
            checks += 1
        try:
            PipelineExecutor({rank: blocks[rank]}, schedule=gpipe(2, 2), loss_fn=Fn.mse_loss, group=groups[2],
                             recv_window=0)
            mismatches.append("recv_window=0 was accepted")
        except ValueError as exc:
            if "recv_window" not in str(exc):
                mismatches.append(f"unclear recv_window error: {exc}")
    return mismatches, checks, peaks


@pytest.mark.slow
def test_executor_gradients_equal_single_process_for_every_schedule():
    results = spawn(_all_checks, 4, timeout_s=90)
    mismatches = [msg for bad, _, _ in results for msg in bad]
    assert not mismatches, "\n".join(mismatches)
    # 4 schedules x 2 m values, for each p the rank takes part in; ranks 0-1 add 2 transformer runs
    assert [c for _, c, _ in results] == [4 * 8 + 2, 3 * 8 + 2, 2 * 8, 8]
    # activation memory: the counted bytes follow the simulator's in-flight counts exactly
    for rank, (_, _, peaks) in enumerate(results):
        for p in (1, 2, 3, 4):
            if rank >= p:
                continue
            m = 2 * p + 1
            in_flight = {n: simulate(make(p, m)).peak_in_flight[rank] for n, make, v, _ in CASES if v == 1}
            unit = peaks[("gpipe", p, m)] / in_flight["gpipe"]
            assert in_flight["gpipe"] == m and in_flight["1f1b"] == p - rank
            for n in ("1f1b", "zb_h1"):
                assert peaks[(n, p, m)] == in_flight[n] * unit, (n, p, rank)


def _nccl_checks(rank: int, world_size: int):
    device = torch.device("cuda", torch.cuda.current_device())  # launch.spawn set one GPU per rank
    bad = []
    for name, schedule in [("1f1b", one_f_one_b(2, 5)), ("interleaved", interleaved_1f1b(2, 4, 2)),
                           ("zb_h1", zb_h1(2, 3))]:
        stages, widths = mlp_stages(4 if name == "interleaved" else 2, seed=5)
        stages = [s.to(device) for s in stages]
        gen = torch.Generator().manual_seed(1)
        m = 1 + max(a.microbatch for a in schedule[0])
        x = torch.randn(2 * m, widths[0], generator=gen).to(device)
        y = torch.randn(2 * m, widths[-1], generator=gen).to(device)
        bad += run_and_compare(stages, x, y, schedule, 2, rank, None, f"nccl-{name}")[0]
    return bad


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs for an NCCL pipeline; none here")
def test_executor_on_nccl_matches_single_process():
    bad = sum(spawn(_nccl_checks, 2, backend="nccl", timeout_s=120), [])
    assert not bad, "\n".join(bad)
