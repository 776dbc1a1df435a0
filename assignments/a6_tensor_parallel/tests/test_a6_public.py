"""Public tests of a6 on 2 gloo ranks: your operators, layers, loss and sequence-parallel pair against
the unsharded computation in one process.

One spawn per task (only the tasks you select run): `pytest assignments/a6_tensor_parallel -m task6_2`.
The grader runs more: hidden shapes at t = 2 and t = 3, the bytes your code hands to the wire, the
largest tensor your loss makes, the activations your layers save, and the whole GPT with and without
sequence parallelism (`scaletrain.tp.parallelize`, which in your repository runs your files).
"""

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autograder.checks import student_module
from scaletrain.comm import comm_counter
from scaletrain.launch import spawn
from scaletrain.memory_measure import track_saved_tensors
from scaletrain.testing import assert_close, expect_equal

P = 2
STEMS = ("tp_operators", "tp_layers", "tp_cross_entropy", "tp_sequence", "tp_mesh")
AXES = ("dp", "pp", "tp")
GRIDS = ((2, 2, 2), (3, 1, 2), (1, 3, 4), (2, 3, 1))  # (dp, pp, tp); the grader's are hidden, up to 48 ranks
BUILDS = ((2, 1, 2), (1, 2, 2))                        # on 4 spawned ranks
for _stem in STEMS:
    student_module(_stem, default=__file__)  # an import error shows here, before any rank starts


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _linear(d_in, d_out, seed):
    torch.manual_seed(seed)
    return nn.Linear(d_in, d_out)


def _task6_1_fg(rank):
    ops = student_module("tp_operators")
    x = _randn(3, 5, 6, seed=0)
    w = _randn(3, 5, 6, seed=1 + rank)
    xs = x.clone().requires_grad_(True)
    y = ops.copy_to_tp(xs)
    (y * w).sum().backward()
    assert_close(y.detach(), x, what="f forward (identity)")
    assert_close(xs.grad, _randn(3, 5, 6, seed=1) + _randn(3, 5, 6, seed=2), what="f backward (the sum of both ranks')")
    part = _randn(3, 5, 6, seed=10 + rank).requires_grad_(True)
    y = ops.reduce_from_tp(part)
    (y * w).sum().backward()
    assert_close(y.detach(), _randn(3, 5, 6, seed=10) + _randn(3, 5, 6, seed=11), what="g forward (the sum)")
    assert_close(part.grad, w, what="g backward (identity)")


def _task6_1_gather(rank):
    ops = student_module("tp_operators")
    piece = _randn(3, 5, 2, seed=20 + rank).requires_grad_(True)
    y = ops.gather_from_tp(piece)
    assert_close(y.detach(), torch.cat([_randn(3, 5, 2, seed=20), _randn(3, 5, 2, seed=21)], dim=-1),
                 what="gather of the last dimension")
    w = _randn(3, 5, 4, seed=30 + rank)
    y.backward(w)
    assert_close(piece.grad, w.narrow(-1, 2 * rank, 2), what="gather backward (this rank's slice)")
    whole = _randn(3, 5, 4, seed=40).requires_grad_(True)
    mine = ops.scatter_to_tp(whole)
    assert_close(mine.detach(), whole.detach().narrow(-1, 2 * rank, 2), what="scatter of the last dimension")
    mine.backward(_randn(3, 5, 2, seed=50 + rank))
    assert_close(whole.grad, torch.cat([_randn(3, 5, 2, seed=50), _randn(3, 5, 2, seed=51)], dim=-1),
                 what="scatter backward (the all-gather)")


def _check_layer(layer, ref, x_ref, x_mine, keep_out, keep_in, what):
    x_ref = x_ref.clone().requires_grad_(True)
    y_ref = ref(x_ref)
    w = _randn(*y_ref.shape, seed=99)
    (y_ref * w).sum().backward()
    x_mine = x_mine.clone().requires_grad_(True)
    y = layer(x_mine)
    assert_close(y.detach(), keep_out(y_ref.detach()), what=f"{what}: output")
    (y * keep_out(w)).sum().backward()
    assert_close(x_mine.grad, keep_in(x_ref.grad), what=f"{what}: input gradient")


def _attention(layers, n_head, head_size):
    """The given ParallelSelfAttention on your QKV (a column layer with parts=3) and projection (a row
    layer) equals the unsharded attention: true only when each rank holds Q, K and V of whole heads."""
    from scaletrain.models import CausalSelfAttention, GPTConfig
    from scaletrain.tp.attention import ParallelSelfAttention
    torch.manual_seed(2)
    ref = CausalSelfAttention(GPTConfig(n_embd=n_head * head_size, n_head=n_head))
    mine = ParallelSelfAttention(layers.ColumnParallelLinear.from_linear(ref.qkv, parts=3),
                                 layers.RowParallelLinear.from_linear(ref.proj), n_head)
    x = _randn(3, 5, n_head * head_size, seed=3)
    _check_layer(mine, ref, x, x, lambda y: y, lambda g: g,
                 f"attention ({n_head} heads of {head_size}, t = {P}; QKV from_linear(parts=3))")


def _task6_2(rank):
    layers = student_module("tp_layers")
    x = _randn(3, 5, 7, seed=0)
    for gather in (False, True):
        ref = _linear(7, 12, seed=1)
        col = layers.ColumnParallelLinear.from_linear(ref, gather_output=gather)
        assert tuple(col.weight.shape) == (6, 7), f"column weight {tuple(col.weight.shape)}, expected (6, 7)"
        assert_close(col.weight.detach(), ref.weight.detach()[6 * rank:6 * rank + 6], what="column: this rank's rows")
        keep = (lambda y: y) if gather else (lambda y: y.narrow(-1, 6 * rank, 6))
        _check_layer(col, ref, x, x, keep, lambda g: g, f"column gather_output={gather}")
        assert_close(col.weight.grad, ref.weight.grad[6 * rank:6 * rank + 6], what="column: weight gradient")
    _attention(layers, n_head=6, head_size=2)  # 3 heads per rank
    xw = _randn(3, 5, 12, seed=3)
    for parallel in (True, False):
        ref = _linear(12, 5, seed=4)
        row = layers.RowParallelLinear.from_linear(ref, input_is_parallel=parallel)
        assert tuple(row.weight.shape) == (5, 6), f"rank {rank}: row weight {tuple(row.weight.shape)}, expected (5, 6)"
        cut = (lambda v: v.narrow(-1, 6 * rank, 6)) if parallel else (lambda v: v)
        _check_layer(row, ref, xw, cut(xw), lambda y: y, cut, f"row input_is_parallel={parallel}")
        assert_close(row.weight.grad, ref.weight.grad[:, 6 * rank:6 * rank + 6], what="row: weight gradient")
        assert_close(row.bias.grad, ref.bias.grad, what="row: bias gradient")
    mlp = nn.Sequential(layers.ColumnParallelLinear.from_linear(_linear(12, 48, seed=5)), nn.GELU(),
                        layers.RowParallelLinear.from_linear(_linear(48, 12, seed=6)))
    with comm_counter() as fwd:
        y = mlp(xw.clone().requires_grad_(True))  # its gradient is what f's backward allreduces
    with comm_counter() as bwd:
        y.sum().backward()
    n = xw.numel() * 4  # one allreduce of b·s·h on 2 ranks sends n bytes per rank
    assert fwd.bytes_sent == n and bwd.bytes_sent == n, (
        f"MLP sent {fwd.bytes_sent} B forward and {bwd.bytes_sent} B backward, expected one allreduce ({n} B) each")


def _task6_3(rank):
    from scaletrain.tp.verify import largest_tensor
    ce = student_module("tp_cross_entropy")
    logits = 8 * _randn(15, 18, seed=0)
    targets = torch.randint(0, 18, (15,), generator=torch.Generator().manual_seed(1))
    full = logits.clone().requires_grad_(True)
    ref = F.cross_entropy(full, targets)
    ref.backward()
    mine = logits[:, 9 * rank:9 * rank + 9].clone().requires_grad_(True)

    losses = []
    most = largest_tensor(lambda: losses.append(ce.vocab_parallel_cross_entropy(mine, targets)) or losses[0].backward())
    assert_close(losses[0].detach(), ref.detach(), what="loss")
    assert_close(mine.grad, full.grad[:, 9 * rank:9 * rank + 9], what="gradient of this rank's logits")
    assert most <= 15 * 9, f"a tensor of {most} elements was made; this rank's logits have {15 * 9}: never gather them"


def _task6_4(rank):
    seq = student_module("tp_sequence")
    parts = [_randn(3, 6, 5, seed=k) for k in range(P)]
    shard = parts[rank][:, 3 * rank:3 * rank + 3].clone().requires_grad_(True)
    gathered = seq.gather_from_sp(shard)
    whole = torch.cat([parts[0][:, :3], parts[1][:, 3:]], dim=1)
    assert_close(gathered.detach(), whole, what="all-gather along the sequence")
    gathered.backward(parts[rank])
    assert_close(shard.grad, (parts[0] + parts[1])[:, 3 * rank:3 * rank + 3], what="its backward (a reduce-scatter)")
    x = parts[rank].clone().requires_grad_(True)
    out = seq.reduce_scatter_to_sp(x)
    assert_close(out.detach(), (parts[0] + parts[1])[:, 3 * rank:3 * rank + 3],
                 what="reduce-scatter along the sequence")
    out.backward(_randn(3, 3, 5, seed=10 + rank))
    assert_close(x.grad, torch.cat([_randn(3, 3, 5, seed=10), _randn(3, 3, 5, seed=11)], dim=1),
                 what="its backward (an all-gather)")
    ref = _linear(5, 8, seed=3)
    x_full = _randn(3, 6, 5, seed=4).requires_grad_(True)
    y_ref = ref(x_full)
    w = _randn(3, 6, 8, seed=5)
    (y_ref * w).sum().backward()
    weight = nn.Parameter(ref.weight.detach()[4 * rank:4 * rank + 4].clone())
    bias = nn.Parameter(ref.bias.detach()[4 * rank:4 * rank + 4].clone())
    x = x_full.detach()[:, 3 * rank:3 * rank + 3].clone().requires_grad_(True)
    with track_saved_tensors([weight, bias]) as saved:
        y = seq.sequence_gather_linear(x, weight, bias)
        held = saved.bytes
    assert_close(y.detach(), y_ref.detach()[..., 4 * rank:4 * rank + 4], what="sequence-gather linear: output")
    assert held <= x.numel() * 4, f"saved {held} B for backward; only the shard ({x.numel() * 4} B) may be kept"
    (y * w[..., 4 * rank:4 * rank + 4]).sum().backward()
    assert_close(x.grad, x_full.grad[:, 3 * rank:3 * rank + 3], what="sequence-gather linear: input gradient")
    assert_close(weight.grad, ref.weight.grad[4 * rank:4 * rank + 4], what="sequence-gather linear: weight gradient")


def _gpt(rank, sp):
    from scaletrain.models import GPT, GPTConfig, make_batch
    from scaletrain.tp import allreduce_sequence_parallel_grads, parallelize
    from scaletrain.tp.gpt import gpt_shard
    cfg = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=16)
    ref = GPT(cfg, seed=0)
    x, y = make_batch(cfg, 3, seed=1, seq_len=8 if sp else 7)  # sequence parallelism splits 8 positions over 2
    ref(x, y)[1].backward()
    model = parallelize(GPT(cfg, seed=0), sequence_parallel=sp)
    loss = model(x, y)[1]
    loss.backward()
    allreduce_sequence_parallel_grads(model)
    where = f"GPT (V 64, h 16, 4 heads, 2 layers, 3 sequences of {x.shape[1]}) at t = {P}, sequence_parallel={sp}"
    assert_close(loss.detach(), ref(x, y)[1].detach(), what=f"{where}: loss")
    grads = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert_close(p.grad, gpt_shard(name, grads[name].grad, rank=rank, world_size=P),
                     what=f"{where}, rank {rank}: gradient of {name}")


def _rank(rank, world_size, task):
    for stem in STEMS:
        student_module(stem)  # the folder comes from $AUTOGRADER_SUBMISSION
    {"6.1": lambda r: (_task6_1_fg(r), _task6_1_gather(r)), "6.2": _task6_2, "6.3": _task6_3, "6.4": _task6_4,
     "gpt": lambda r: _gpt(r, sp=False), "gpt-sp": lambda r: _gpt(r, sp=True)}[task](rank)


@functools.lru_cache(maxsize=None)
def _run(task):
    spawn(_rank, P, task, timeout_s=60)  # raises RankError naming the failing rank and line


@pytest.mark.task6_1
def test_task6_1_f_g_and_the_last_dimension_gather_scatter():
    _run("6.1")


@pytest.mark.task6_2
def test_task6_2_column_row_layers_equal_the_unsharded_layer_and_the_mlp_sends_one_allreduce_each_way():
    _run("6.2")


@pytest.mark.task6_3
def test_task6_3_vocab_parallel_cross_entropy_equals_f_cross_entropy_without_the_whole_logits():
    _run("6.3")


@pytest.mark.task6_4
def test_task6_4_sequence_pair_and_gather_linear():
    _run("6.4")


@pytest.mark.task6_2
def test_task6_2_gpt_equals_one_process():
    """Scored under 6.2 by the grader, as here; it needs your 6.1 (f and g) and 6.3 (the loss) too."""
    _run("gpt")


@pytest.mark.task6_4
def test_task6_4_gpt_with_sequence_parallelism_equals_one_process():
    """Scored under 6.4 by the grader; runs all four of your files."""
    _run("gpt-sp")


def _grid(layout):
    """Every rank's (dp, pp, tp) and each axis's groups, from your ParallelDims, checked as the grader does."""
    dims = student_module("tp_mesh").ParallelDims(dp=layout[0], pp=layout[1], tp=layout[2])
    n, at = dims.world_size, f"ParallelDims(dp={layout[0]}, pp={layout[1]}, tp={layout[2]})"
    coords = [(c.dp, c.pp, c.tp) for c in map(dims.coords, range(n))]
    for r, c in enumerate(coords):
        assert all(0 <= v < d for v, d in zip(c, layout)), f"{at}.coords({r}) = {c}: outside the degrees {layout}"
        expect_equal(dims.rank_of(dp=c[0], pp=c[1], tp=c[2]), r, what=f"{at}.rank_of{c} (coords({r}) = {c})")
    groups = {axis: dims.groups(axis) for axis in AXES}
    for k, axis in enumerate(AXES):
        expect_equal(sorted(r for g in groups[axis] for r in g), list(range(n)),
                     what=f"{at}: the ranks of the {axis} groups, sorted (each rank exactly once)")
        for g in groups[axis]:
            expect_equal([coords[r][k] for r in g], list(range(layout[k])),
                         what=f"{at}: the {axis} coordinates of the {axis} group {g} (position = coordinate)")
    return coords, groups


@pytest.mark.task6_5
def test_task6_5_grid_coords_rank_of_and_groups():
    for layout in GRIDS:
        _grid(layout)


@pytest.mark.task6_5
def test_task6_5_tp_groups_are_consecutive_ranks_inside_a_node():
    for layout in GRIDS:
        tp = layout[2]
        for g in _grid(layout)[1]["tp"]:
            expect_equal(g, list(range(g[0] // tp * tp, g[0] // tp * tp + tp)),
                         what=f"grid {layout}: a tp group (consecutive ranks from a multiple of tp = {tp})")


def _build_rank(rank, world_size):
    import torch.distributed as dist
    from scaletrain.tp.collectives import allreduce
    out = {}
    for layout in BUILDS:
        mesh = student_module("tp_mesh").ParallelDims(dp=layout[0], pp=layout[1], tp=layout[2]).build(timeout_s=30)
        for axis in AXES:
            mark = torch.zeros(world_size)
            mark[rank] = rank + 1
            total = allreduce(mark, getattr(mesh, f"{axis}_group"), "ring")
            out[layout, axis] = ([i for i, v in enumerate(total.tolist()) if v == i + 1],
                                 list(getattr(mesh, f"{axis}_ranks")), dist.get_rank(getattr(mesh, f"{axis}_group")),
                                 getattr(mesh.coords, axis))
    return out


@pytest.mark.task6_5
def test_task6_5_build_gives_every_rank_real_groups():
    for rank, out in enumerate(spawn(_build_rank, 4, timeout_s=90)):
        for layout in BUILDS:
            coords, groups = _grid(layout)
            for k, axis in enumerate(AXES):
                reached, ranks, position, coordinate = out[layout, axis]
                mine = next(g for g in groups[axis] if rank in g)
                at = f"grid {layout}, rank {rank}, mesh.{axis}_group"
                expect_equal(ranks, mine, what=f"{at}: mesh.{axis}_ranks against groups('{axis}')")
                expect_equal(reached, mine, what=f"{at}: the ranks a sum over the group reached")
                expect_equal(position, coords[rank][k], what=f"{at}: the rank's position in the group")
                expect_equal(coordinate, coords[rank][k], what=f"{at}: mesh.coords.{axis}")
