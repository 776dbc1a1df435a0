"""a2's hidden inputs and what each call must give back: every rank's input from the grading seed
(small integers: every sum is exact in every dtype), the single-process sum in float64, and the
calls of each check, grouped into blocks that run on the ranks of one process group."""

from __future__ import annotations

import zlib

from autograder import checks

from .names import DTYPES, PUBLIC_SIZES


def input_of(seed: int, label: str, rank: int, n: int, dtype):
    """Rank `rank`'s input: small integers, from the grading seed (never seen by the worker)."""
    import torch
    key = zlib.crc32(f"{label}/{rank}/{n}/{dtype}".encode())
    g = torch.Generator().manual_seed((seed * 1_000_003 + key) % (1 << 62))
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


def _total(inputs):
    """The exact sum over ranks, computed in float64 (exact: small integers)."""
    return sum(x.double() for x in inputs).to(inputs[0].dtype)


def _padded_shard(total, index: int, p: int):
    import torch
    m = -(-total.numel() // p)
    padded = torch.cat([total, total.new_zeros(p * m - total.numel())])
    return padded[index * m:(index + 1) * m]



class Call:
    """One student call on one rank: what is sent (`call`) and what must come back (`judge`)."""

    def __init__(self, call: dict, judge, *, fn: str, m: int, itemsize: int, n: int, dtype, exact_bytes: bool = False):
        self.call, self.judge, self.fn = call, judge, fn
        self.m, self.itemsize, self.n, self.dtype, self.exact_bytes = m, itemsize, n, dtype, exact_bytes


class Block:
    """One check's calls on the ranks of one process group."""

    def __init__(self, label: str, name: str, members: list[int], group_index: int):
        self.label, self.name, self.members, self.group_index = label, name, members, group_index
        self.calls: dict[int, list[Call]] = {rank: [] for rank in members}


KINDS = ("rs", "ag", "ar", "views", "bytes")  # the order blocks run in: every allreduce last


class Blocks:
    """The blocks of one process group, one per check name. They run reduce-scatters first, then
    all-gathers, then allreduces: a call that fails after posting its receives (a flagged
    allreduce) leaves them posted, and they would catch a later ring's messages between the same
    two ranks."""

    def __init__(self, tag: str, members: list[int], group_index: int):
        self.tag, self.members, self.group_index, self.by_name, self.kind = tag, members, group_index, {}, {}

    def add(self, kind: str, name: str | None, rank: int, call: Call) -> None:
        if name is None:
            return
        if name not in self.by_name:
            label = f"{self.tag}:{len(self.by_name)}"
            self.by_name[name], self.kind[name] = Block(label, name, self.members, self.group_index), kind
        self.by_name[name].calls[rank].append(call)

    def ordered(self) -> list[Block]:
        return sorted(self.by_name.values(), key=lambda block: KINDS.index(self.kind[block.name]))


def divides(p: int, n: int) -> bool:
    """The 'even' cases: p divides n > 0, so no chunk is padded (n = 0 is an edge case, not even)."""
    return n > 0 and n % p == 0


def blocks(seed: int, members: list[int], group_index: int, sizes: list[int], tag: str, names: dict,
           dtypes=DTYPES) -> list[Block]:
    """The calls of one process group. names: kind ("rs", "ag", "ar", "views", "bytes") -> check name,
    or (name when p divides n, name when not); a kind left out is not run on this group."""
    import torch

    p, out = len(members), Blocks(tag, members, group_index)

    def name(kind: str, n: int):
        got = names.get(kind)
        return got[0 if divides(p, n) else 1] if isinstance(got, tuple) else got

    for dtype in (getattr(torch, d) for d in dtypes):
        itemsize = torch.empty(0, dtype=dtype).element_size()
        for n in sizes:
            xs = [input_of(seed, tag, rank, n, dtype) for rank in members]
            total, m = _total(xs) if n else torch.zeros(0, dtype=dtype), -(-n // p)
            for me, rank in enumerate(members):
                what, shape = f"{tag} rank {rank}", dict(m=m, itemsize=itemsize, n=n, dtype=dtype)
                out.add("rs", name("rs", n), rank, Call(
                    {"fn": "rs", "x": xs[me]},
                    judge_rs(_padded_shard(total, me, p), xs[me], f"{what} reduce-scatter shard, n={n} {dtype}", tag),
                    fn="reduce-scatter", **shape))
                out.add("ag", name("ag", n), rank, Call(
                    {"fn": "ag", "x": _padded_shard(total, me, p).clone(), "n": n},
                    judge_out(total, f"{what} all-gather, n={n} {dtype}"), fn="all-gather", **shape))
                for op in ("sum", "avg") if dtype.is_floating_point and n else ("sum",):
                    want = total if op == "sum" else total / p
                    rtol = 0.0 if op == "sum" else 1e-2 if itemsize == 2 else 1e-6
                    out.add("ar", name("ar", n), rank, Call(
                        {"fn": "ar", "x": xs[me], "op": op},
                        judge_in_place(want, rtol, f"{what} allreduce {op}, n={n} {dtype}", tag),
                        fn="allreduce", **shape))
    _views(out, seed, names.get("views"))
    _bytes(out, seed, names.get("bytes"))
    return out.ordered()


def _views(out: Blocks, seed: int, name: str | None) -> None:
    """A strided view and a transposed matrix: the result must land in the caller's memory."""
    import torch

    if name is None:
        return
    p, n, tag = len(out.members), 7 * 13, out.tag
    xs = [input_of(seed, tag + "/views", rank, n, torch.float32) for rank in out.members]
    total = _total(xs)
    shape = dict(fn="allreduce", m=-(-n // p), itemsize=4, n=n, dtype=torch.float32)
    for me, rank in enumerate(out.members):
        base = torch.full((2 * n,), -5.0)
        base[::2] = xs[me]
        out.add("views", name, rank, Call({"fn": "ar", "x": base, "view": "strided"}, judge_strided(total, tag),
                                          **shape))
        for op, want in (("sum", total), ("avg", total / p)):  # avg: the public test's
            out.add("views", name, rank, Call({"fn": "ar", "x": xs[me].view(13, 7).clone(), "view": "transposed",
                                               "op": op},
                                     judge_after(want.view(13, 7), f"{tag} allreduce {op} of a transposed matrix"),
                                     **shape))


def _bytes(out: Blocks, seed: int, names: tuple | None) -> None:
    """Allreduce calls whose traffic is judged exactly: hidden sizes p divides and does not, and the
    public tests' sizes (n = 0: nothing sent, nothing recorded)."""
    import torch

    if names is None:
        return
    p = len(out.members)
    public = [(n, getattr(torch, DTYPES[i % len(DTYPES)])) for i, n in enumerate(PUBLIC_SIZES)]
    for n, dtype in [(1, torch.float32), (p + 1, torch.bfloat16), (1000 * p + 1, torch.int64), (4099, torch.float16),
                     (p, torch.float32), (1000 * p, torch.int64), (1367 * p, torch.float16)] + public:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        for rank in out.members:
            out.add("bytes", names[0 if divides(p, n) else 1], rank, Call(
                {"fn": "ar", "x": input_of(seed, out.tag + "/bytes", rank, n, dtype)}, lambda record: None,
                fn="allreduce", m=-(-n // p), itemsize=itemsize, n=n, dtype=dtype, exact_bytes=True))


def _returned(record, what: str):
    if record.get("out") is None:
        raise AssertionError(f"{what}: returned {record.get('out_type', 'nothing')}, expected a tensor")
    return record["out"]


def judge_rs(want, x, what: str, tag: str):
    def judge(record):
        checks.assert_equal(_returned(record, what), want, what=what)
        assert _equal(record["after"], x), f"{tag} reduce-scatter modified its input"
    return judge


def judge_out(want, what: str):
    def judge(record):
        checks.assert_equal(_returned(record, what), want, what=what)
    return judge


def judge_in_place(want, rtol: float, what: str, tag: str):
    def judge(record):
        assert record["same"], f"{tag} ring_allreduce must return the tensor it was given (in place)"
        checks.assert_close(record["after"], want, rtol=rtol, what=what)
    return judge


def judge_strided(total, tag: str):
    def judge(record):
        base = record["after"]
        checks.assert_equal(base[::2], total, what=f"{tag} allreduce of a strided view")
        assert bool((base[1::2] == -5.0).all()), f"{tag} allreduce of a strided view wrote outside the view"
    return judge


def judge_after(want, what: str):
    def judge(record):
        checks.assert_equal(record["after"], want, what=what)
    return judge


def _equal(a, b) -> bool:
    import torch
    return isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)

