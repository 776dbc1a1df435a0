"""Expert parallelism on gloo, in one spawn of 4 ranks (each spawn costs seconds; the groups of 1-4
ranks are subgroups of that world, each made with a timeout):

  * our all-to-all, equal and variable sizes, equals torch's `all_to_all_single` (gloo's) on the same
    inputs, its receive sizes equal what every rank computes on its own from the senders' seeds,
    its backward sends the gradients back, and `comm_counter` records exactly the formula's bytes;
  * the expert-parallel MoE GPT at ep = 1, 2, 3, 4 (uneven micro-batches per rank, capacity drops,
    top-1/top-2/dropless/expert choice) equals one process holding every expert: logits, loss, aux
    loss, dense and expert gradients, and its bytes per step equal cost.ep_step_bytes;
  * on ParallelDims(dp=4, ep=1|2|4), the mesh's ep and edp groups are the grid's, and after
    sync_gradients every gradient equals the mean over the four micro-batches.
"""

from __future__ import annotations

import datetime
import functools

import pytest
import torch
import torch.distributed as dist

from scaletrain.comm import comm_counter
from scaletrain.launch import spawn
from scaletrain.mesh import ParallelDims
from scaletrain.models import GPTConfig
from scaletrain.moe import all_to_all, all_to_all_v
from scaletrain.moe.all_to_all import all_to_all_bytes, all_to_all_v_bytes
from scaletrain.moe.layer import MoEConfig
from scaletrain.moe import verify

pytestmark = pytest.mark.slow

TIMEOUT = datetime.timedelta(seconds=60)
SIZES = (1, 2, 3, 4)
DTYPES = (torch.float32, torch.float64, torch.int64)
CFG = GPTConfig(vocab_size=48, block_size=13, n_layer=2, n_head=2, n_embd=8)
MOES = {"top2 cf0.6": MoEConfig(num_experts=12, top_k=2, capacity_factor=0.6, every=1),
        "top1 cf1.0": MoEConfig(num_experts=12, top_k=1, capacity_factor=1.0, every=2),
        "dropless top2": MoEConfig(num_experts=12, top_k=2, routing="dropless", every=1, gemm="loop"),
        "expert choice": MoEConfig(num_experts=12, routing="expert_choice", capacity_factor=1.5, every=2)}
MESHES = (1, 2, 4)  # ep on ParallelDims(dp=4)
TOL = 1e-11  # float64 everywhere: the EP model and the reference differ only in GEMM blocking


def splits_of(rank: int, p: int, trial: int) -> list[int]:
    """Rank `rank`'s send sizes: seeded, zeros included, so every rank can compute every other's."""
    g = torch.Generator().manual_seed(1000 * trial + 10 * p + rank)
    return torch.randint(0, 5, (p,), generator=g).tolist()


def rows(rank: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return torch.randint(-50, 50, (n, 3), generator=g).to(dtype)


def _torch_a2a(x, send, recv, group):
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x, output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


def _collective_checks(rank: int, members: list[int], group) -> list[str]:
    """Failures, as messages (empty: all passed)."""
    p, me, bad = len(members), members.index(rank), []
    for dtype in DTYPES:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        for m in (0, 1, 3):
            x = rows(rank, p * m, dtype, seed=m)
            with comm_counter() as c:
                got = all_to_all(x, group)
            if not torch.equal(got, _torch_a2a(x, [m] * p, [m] * p, group)):
                bad.append(f"equal p={p} m={m} {dtype}: differs from all_to_all_single")
            want = all_to_all_bytes(rows=p * m, row_bytes=3 * itemsize, world_size=p)
            if (c.bytes_sent, c.messages) != (want, (p - 1) if m else 0):
                bad.append(f"equal p={p} m={m} {dtype}: counted {c.bytes_sent} B / {c.messages}, formula {want}")
        for trial in range(3):
            send = splits_of(me, p, trial)
            recv_want = [splits_of(i, p, trial)[me] for i in range(p)]
            x = rows(rank, sum(send), dtype, seed=trial + 7)
            with comm_counter() as c:
                got, recv = all_to_all_v(x, send, group=group)
            if recv != recv_want or not torch.equal(got, _torch_a2a(x, send, recv_want, group)):
                bad.append(f"variable p={p} trial={trial} {dtype}: {recv} vs {recv_want}")
            want = all_to_all_v_bytes(send, rank=me, row_bytes=3 * itemsize)
            messages = (p - 1) + sum(1 for j, s in enumerate(send) if j != me and s)
            if (c.bytes_sent, c.messages) != (want, messages):
                bad.append(f"variable p={p} trial={trial}: counted {c.bytes_sent} B / {c.messages}, "
                           f"formula {want} / {messages}")
    # backward: the gradient of row i is the upstream gradient where row i landed
    send = splits_of(me, p, 9)
    recv = [splits_of(i, p, 9)[me] for i in range(p)]
    x = rows(rank, sum(send), torch.float64, seed=11).requires_grad_()
    y, _ = all_to_all_v(x, send, recv, group)
    upstream = rows(rank + 17, y.shape[0], torch.float64, seed=12)
    with comm_counter() as c:
        y.backward(upstream)
    if not torch.equal(x.grad, _torch_a2a(upstream, recv, send, group)):
        bad.append(f"backward p={p}: gradient differs from the reverse all_to_all_single")
    if c.bytes_sent != all_to_all_v_bytes(recv, rank=me, row_bytes=24, exchange=False):
        bad.append(f"backward p={p}: counted {c.bytes_sent} B")
    return bad


def _ep_checks(rank: int, members: list[int], group, refs) -> dict[str, dict]:
    out = {}
    for name, moe in MOES.items():
        run = verify.expert_parallel_run(CFG, moe, rank=rank, ep_group=group)
        out[name] = verify.compare(run, refs[name], rank=rank, ep_ranks=members, row_bytes=8 * CFG.n_embd)
        out[name]["dropped"] = refs[name][rank]["dropped"]
    return out


def _mesh_checks(rank: int, refs) -> dict[int, dict]:
    out = {}
    for ep in MESHES:
        dims = ParallelDims(dp=4, ep=ep)
        mesh = dims.build(timeout_s=60)
        try:
            groups = {"ep": list(mesh.ep_ranks), "edp": list(mesh.edp_ranks), "dp": list(mesh.dp_ranks)}
            want = {a: next(g for g in dims.groups(a) if rank in g) for a in ("ep", "edp", "dp")}
            moe = MOES["top2 cf0.6"]
            run = verify.expert_parallel_run(CFG, moe, rank=rank, ep_group=mesh.ep_group, dp_group=mesh.dp_group,
                                             edp_group=mesh.edp_group)
            errors = verify.compare(run, refs["top2 cf0.6"], rank=rank, ep_ranks=groups["ep"],
                                    dp_ranks=groups["dp"], row_bytes=8 * CFG.n_embd)
            out[ep] = {"groups": groups == want, "ep_rank": mesh.ep_rank == groups["ep"].index(rank),
                       "edp_rank": mesh.edp_rank == groups["edp"].index(rank), **errors}
        finally:
            mesh.destroy()
    return out


def _rank_main(rank: int, world_size: int) -> dict:
    torch.set_num_threads(1)
    refs = {name: verify.reference_runs(CFG, moe, list(range(world_size))) for name, moe in MOES.items()}
    result = {"collectives": {}, "ep": {}}
    for p in SIZES:  # new_group is collective: every rank makes every group
        members = list(range(p))
        group = dist.new_group(members, timeout=TIMEOUT)
        if rank in members:
            result["collectives"][p] = _collective_checks(rank, members, group)
            result["ep"][p] = _ep_checks(rank, members, group, refs)
        dist.barrier()
        dist.destroy_process_group(group)
    result["mesh"] = _mesh_checks(rank, refs)
    return result


@functools.lru_cache(maxsize=None)
def _results() -> list[dict]:
    return spawn(_rank_main, 4, timeout_s=180)


@pytest.mark.parametrize("p", SIZES)
def test_all_to_all_equals_gloo_and_counts_the_formula(p):
    for rank in range(p):
        assert _results()[rank]["collectives"][p] == [], f"rank {rank}"


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("name", list(MOES))
def test_expert_parallel_equals_one_process(p, name):
    for rank in range(p):
        got = _results()[rank]["ep"][p][name]
        for key in ("logits", "loss", "aux", "dense grads", "expert grads"):
            assert got[key] < TOL, (rank, key, got)
        assert got["bytes"] == got["bytes formula"], (rank, got)
        assert (got["bytes"] > 0) == (p > 1)
    if name.startswith("top2 cf0.6"):  # the capacity really dropped tokens on some rank
        assert any(_results()[rank]["ep"][p][name]["dropped"] > 0 for rank in range(p))


@pytest.mark.parametrize("ep", MESHES)
def test_expert_and_data_parallel_on_the_mesh(ep):
    for rank in range(4):
        got = _results()[rank]["mesh"][ep]
        assert got["groups"] and got["ep_rank"] and got["edp_rank"], (rank, got)
        for key in ("logits", "loss", "aux", "dense grads", "expert grads", "synced grads"):
            assert got[key] < TOL, (rank, key, got)
        assert got["bytes"] == got["bytes formula"], (rank, got)

