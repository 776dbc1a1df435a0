"""scaletrain.comm.tensor_collectives: torch's flat-tensor all-gather and reduce-scatter under the
names of the pin (torch 2.13: *_single) and of the GPU machines' torch 2.11 (*_into_tensor,
reduce_scatter_tensor), and no caller that reaches for one name directly."""

import re
from pathlib import Path

import torch
import torch.distributed as dist

from scaletrain.comm.tensor_collectives import all_gather_single, reduce_scatter_single
from scaletrain.launch import spawn

ROOT = Path(__file__).resolve().parents[1]
NEW_NAMES = ("all_gather_single", "reduce_scatter_single")


def _rank(rank, world, old_torch):
    if old_torch:  # what torch 2.11 has: the new names absent
        for name in NEW_NAMES:
            if hasattr(dist, name):
                delattr(dist, name)
    x = torch.arange(world * 3, dtype=torch.float32) * (rank + 1)
    out = torch.empty(3)
    reduce_scatter_single(out, x)
    gathered = torch.empty(world * 3)
    all_gather_single(gathered, out)
    return out, gathered


def test_both_torch_namings_give_the_closed_form():
    """sum over ranks r of (r+1)·x = x·p(p+1)/2: rank r holds its slice, the gather holds all."""
    world = 2
    x = torch.arange(world * 3, dtype=torch.float32) * world * (world + 1) / 2
    for old_torch in (False, True):
        for rank, (out, gathered) in enumerate(spawn(_rank, world, old_torch, backend="gloo", timeout_s=120)):
            assert torch.equal(out, x[rank * 3:(rank + 1) * 3]), old_torch
            assert torch.equal(gathered, x), old_torch


def test_nothing_calls_one_torch_name_directly():
    """Every call of torch's flat collectives goes through tensor_collectives.py (a direct
    dist.reduce_scatter_single errored a2's baseline under torch 2.11)."""
    call = re.compile(r"\bdist\.(all_gather_single|reduce_scatter_single|all_gather_into_tensor|reduce_scatter_tensor)\(")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for folder in ("lib", "autograder", "solutions")
                 for p in (ROOT / folder).rglob("*.py") if p.name != "tensor_collectives.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if call.search(line)]
    assert offenders == []
