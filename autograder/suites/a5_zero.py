"""Assignment a5: ZeRO stages 1-3 on the ring collectives (`assignments/a5_zero/`).

The reference is independent of the student's code: one process training the same model on the
mean of the ranks' micro-batch gradients (`scaletrain.zero.verify`), on hidden models (a GPT of
another shape with its tied embedding, odd MLPs, one with fewer parameters than ranks, one with
two param groups and a frozen layer) at N = 2 and N = 1, with AdamW and with SGD + momentum
(Adam is blind to a gradient scaled by N, SGD is not). Memory is counted from the storages the
engine holds and compared with `scaletrain.memory.zero_memory_per_rank` at the padded Ψ'; bytes
sent with `2Ψ'(N-1)/N` and `3Ψ'(N-1)/N`.

All checks run in one spawn of 2 ranks (each rank pays ~5 s of imports, so one spawn, not one
per task; the repository's own tests run the reference at N = 3 and 4). The engine runs on
process groups with a short timeout, so a deadlocked collective ends its check as `timeout`
after PG_TIMEOUT_S (the checks after it too), not the whole group.
A task whose functions still hold the stub's `raise NotImplementedError` is reported as not
implemented without running (an untouched stub spawns nothing). torch's ZeroRedundancyOptimizer,
FSDP and its collectives are forbidden in the student file, statically and at run time.
"""

from __future__ import annotations

import ast
import datetime
import traceback
from pathlib import Path

from autograder import checks
from autograder.manifest import Check, Group, Manifest, Planted, Task

ZF = "zero_engine.py"
P = 2                # ranks per spawn; a subgroup of rank 0 gives N = 1
PG_TIMEOUT_S = 10.0  # a collective that waits longer than this is a deadlock
TORCH_COLLECTIVES = ("torch.distributed.all_reduce", "torch.distributed.all_gather",
                     "torch.distributed.all_gather_into_tensor", "torch.distributed.reduce_scatter",
                     "torch.distributed.reduce_scatter_tensor", "torch.distributed.broadcast")

C_SHARD = "shard_of is a view of elements [r·m, (r+1)·m) of the padded buffer"
C_UNSHARD = "unshard fills every chunk from its owner (N = 1, 2; fewer elements than ranks)"
C_S1_EQ = "stage 1 equals one process (AdamW, SGD momentum; hidden models; N = 1, 2)"
C_S1_BYTES = "stage 1 holds 8Ψ' + 8Ψ'/N bytes and sends 2Ψ'(N-1)/N elements per step"
C_S2_EQ = "stage 2 equals one process (several buckets; hidden models; N = 1, 2)"
C_S2_BYTES = "stage 2 keeps only gradient shards: 4Ψ' + 12Ψ'/N bytes, 2Ψ'(N-1)/N sent"
C_S2_EARLY = "stage 2 reduce-scatters every bucket during backward and frees full gradients"
C_S3_EQ = "stage 3 equals one process (hidden models; N = 1, 2)"
C_S3_MEM = "stage 3 holds 16Ψ'/N bytes and gathers one block at a time"
C_S3_COMM = "stage 3 sends 3Ψ'(N-1)/N elements per step"

MANIFEST = Manifest(
    assignment="a5", folder="a5_zero", title="ZeRO: sharded optimizer state, gradients and parameters",
    files={ZF: "lib/scaletrain/zero/engine.py"},
    tasks=(
        Task("5.1", "Shard and unshard the flat buffer", file=ZF, functions=("shard_of", "unshard")),
        Task("5.2", "Stage 1: reduce-scatter, step on the shard, all-gather", file=ZF, functions=("_step_stage1",)),
        Task("5.3", "Stage 2: reduce-scatter buckets during backward", file=ZF,
             functions=("_grad_ready", "_reduce_scatter_unit", "_step_stage2")),
        Task("5.4", "Stage 3: gather parameters before use, free them after", file=ZF, functions=("_gather", "_free")),
    ),
    forbidden={ZF: ("torch.distributed.optim", "torch.distributed.fsdp", "torch.distributed._composable",
                    "torch.distributed.tensor", "torch.nn.parallel", *TORCH_COLLECTIVES,
                    "scaletrain.zero.engine", "scaletrain.zero.ZeRO", "scaletrain.zero.shard_of",
                    "scaletrain.zero.unshard", "importlib", "__import__", "exec", "eval")},
    groups=(
        Group("ranks", "autograder.suites.a5_zero:group_ranks", timeout_s=240, checks=(
            Check("5.1", C_SHARD, 1), Check("5.1", C_UNSHARD, 2),
            Check("5.2", C_S1_EQ, 3), Check("5.2", C_S1_BYTES, 1),
            Check("5.3", C_S2_EQ, 3), Check("5.3", C_S2_BYTES, 1), Check("5.3", C_S2_EARLY, 1),
            Check("5.4", C_S3_EQ, 3), Check("5.4", C_S3_MEM, 2), Check("5.4", C_S3_COMM, 1),
        )),
    ),
    planted=(
        Planted("gradients summed, not averaged", ZF,
                ('unit.shard.grad = ring_reduce_scatter(unit.sync_flat_grad(), op="avg", group=self.group)',
                 'unit.shard.grad = ring_reduce_scatter(unit.sync_flat_grad(), op="sum", group=self.group)'),
                expect={C_S1_EQ: "failed", C_S1_BYTES: "passed", C_UNSHARD: "passed", C_S3_EQ: "passed"}),
        Planted("stage 3 never frees gathered parameters", ZF,
                ("        unit.full.untyped_storage().resize_(0)\n", "        pass\n"),
                expect={C_S3_MEM: "failed", C_S3_EQ: "passed", C_S3_COMM: "passed", C_S2_EQ: "passed"}),
        Planted("wraps torch's FSDP", ZF,
                ("import torch.nn as nn\n", "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n"),
                expect={C_SHARD: "flagged", C_S1_EQ: "flagged", C_S3_MEM: "flagged"}),
        Planted("all-gather that only receives (deadlock)", ZF,
                ("    ring_all_gather_chunks(chunks, ring)\n",
                 "    torch.distributed.irecv(mine, src=ring.recv_from, group=ring.group).wait()\n"),
                expect={C_SHARD: "passed", C_UNSHARD: "timeout", C_S3_EQ: "timeout"}),
    ),
)


def _one_parameter(seed: int):
    """One weight and no bias: fewer parameters than ranks (shard 1 of 2 is all padding)."""
    import torch
    import torch.nn as nn
    model = nn.Sequential(nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.randn(1, 1, generator=torch.Generator().manual_seed(seed)))
    return model


def _register_hidden_models() -> None:
    """Hidden models, registered in `verify.MODELS` inside every process that imports this suite."""
    from scaletrain.models import GPT, MLP, GPTConfig
    from scaletrain.zero import verify

    cfg = GPTConfig(vocab_size=53, block_size=10, n_layer=3, n_head=3, n_embd=15)  # odd unit sizes
    verify.MODELS.update({
        "h_gpt": lambda seed: GPT(cfg, seed=seed),
        "h_mlp": lambda seed: MLP([9, 17, 4], seed=seed),
        "h_tiny": _one_parameter,
        "h_groups": lambda seed: verify.frozen_first_layer(MLP([5, 11, 7, 2], seed=seed)),
    })
    verify.GROUPED.add("h_groups")


# (model, optimizer) trained per stage; SGD is in the N = 2 rows that must catch a missing average
GRID = {P: (("h_gpt", "adamw"), ("h_gpt", "sgd_momentum"), ("h_mlp", "sgd_momentum"), ("h_tiny", "adamw"),
            ("h_groups", "sgd_momentum")),
        1: (("h_groups", "adamw"), ("h_tiny", "sgd_momentum"))}
BYTES = (("h_gpt", "adamw"), ("h_groups", "sgd_momentum"))  # memory and bytes audited at N = 2
_ENGINES: dict = {}  # trained engines, shared by the checks of one rank process


def _case(model: str, optimizer: str, stage: int, seed: int):
    from scaletrain.zero.verify import Case
    return Case(model=model, optimizer=optimizer, stage=stage, steps=3, seed=seed, bucket_cap_mb=0.002)


# ---------------------------------------------------------------- checks, run on every rank

def _train(zm, case, group):
    """The student's engine trained on `case` (each (case, N) once per rank process)."""
    from scaletrain.zero import verify
    key = (case, None if group is None else id(group))
    if key not in _ENGINES:
        with checks.forbid_calls(*TORCH_COLLECTIVES, modules=(zm,)):
            _ENGINES[key] = verify.run_zero(case, group, zero_cls=zm.ZeRO)
    return _ENGINES[key]


def _check_shard(zm, groups, seed):
    import torch
    for size in (3, 4, 1):
        for rank in range(size):
            full = torch.arange(float(size * 5))
            got = zm.shard_of(full, rank, size)
            assert isinstance(got, torch.Tensor) and got.shape == (5,), \
                f"shard_of(N={size}, r={rank}) has shape {tuple(getattr(got, 'shape', ()))}, expected (5,)"
            checks.assert_equal(got, full[rank * 5:(rank + 1) * 5], what=f"shard_of(N={size}, r={rank})")
            assert got.untyped_storage().data_ptr() == full.untyped_storage().data_ptr(), \
                "shard_of must return a view of the buffer (the optimizer updates the parameters through it)"


def _check_unshard(zm, groups, seed):
    import torch
    import torch.distributed as dist
    from scaletrain.zero.verify import agree
    for size, group in groups.items():
        if dist.get_rank() >= size:
            continue
        rank = dist.get_rank(group)
        for m in (1, 2, 7, 1000):
            expected = torch.arange(float(size * m)) + seed
            full = torch.zeros(size * m)
            full[rank * m:(rank + 1) * m] = expected[rank * m:(rank + 1) * m]
            separate, local = torch.full((size * m,), -1.0), expected[rank * m:(rank + 1) * m].clone()
            with checks.forbid_calls(*TORCH_COLLECTIVES, modules=(zm,)):
                zm.unshard(full, full[rank * m:(rank + 1) * m], group)  # stages 1-2: the shard is a view
                zm.unshard(separate, local, group)  # stage 3: a separate shard
            error = None
            try:
                checks.assert_equal(full, expected, what=f"unshard of a view, N={size}, m={m}")
                checks.assert_equal(separate, expected, what=f"unshard of a separate shard, N={size}, m={m}")
            except AssertionError as exc:
                error = f"rank {rank}: {exc}"
            agree(error, group)  # a rank that failed alone must not leave the others waiting


def _check_equal(stage):
    def run(zm, groups, seed):
        import torch.distributed as dist
        from scaletrain.zero import verify
        for size, group in groups.items():
            if dist.get_rank() >= size:
                continue
            for model, optimizer in GRID[size]:
                case = _case(model, optimizer, stage, seed)
                engine = _train(zm, case, group)
                ref_model, ref_opt = verify.run_reference(case, size)
                verify.compare(engine, ref_model, ref_opt, rtol=verify.RTOL[case.optimizer],
                               label=f"stage {stage}, N={size}, {case.optimizer}, model {case.model}:")
    return run


def _check_bytes(stage, memory=True, comm=True):
    def run(zm, groups, seed):
        from scaletrain.zero import audit
        for model, optimizer in BYTES:
            case = _case(model, optimizer, stage, seed)
            engine = _train(zm, case, groups[P])
            if memory:
                audit.check_memory(engine)
            if comm:
                audit.check_comm(engine)
            if memory and stage == 3 and model == "h_gpt":
                audit.check_stage3_gathers(engine, case)
    return run


def _check_early(zm, groups, seed):
    from scaletrain.zero import verify
    engine = _train(zm, _case("h_gpt", "sgd_momentum", 2, seed), groups[P])
    assert len(engine.units) >= 3, "suite bug: expected several buckets"
    before = engine.sent.bytes_sent
    engine.zero_grad()
    with checks.forbid_calls(*TORCH_COLLECTIVES, modules=(zm,)):
        verify.micro_batch_loss(engine.model, seed=seed, step=3, rank=engine.dp_rank).backward()
    verify.agreed(_early_evidence)(engine, engine.sent.bytes_sent - before)


def _early_evidence(engine, sent):
    want = sum((P - 1) * u.shard_numel * 4 for u in engine.units)
    assert sent == want, (f"{sent} bytes sent during backward, expected {want} (one reduce-scatter of every "
                          "bucket): reduce-scatter each bucket from _grad_ready as soon as it is complete")
    kept = [n for u in engine.units for n, p in zip(u.names, u.params) if p.grad is not None]
    assert not kept, f"full gradients kept after backward: {kept[:3]}...; set p.grad = None once reduce-scattered"


CHECKS = {C_SHARD: _check_shard, C_UNSHARD: _check_unshard, C_S1_EQ: _check_equal(1), C_S1_BYTES: _check_bytes(1),
          C_S2_EQ: _check_equal(2), C_S2_BYTES: _check_bytes(2), C_S2_EARLY: _check_early,
          C_S3_EQ: _check_equal(3), C_S3_MEM: _check_bytes(3, comm=False), C_S3_COMM: _check_bytes(3, memory=False)}
# what each task's checks call: every stage gathers with 5.1's functions, stage 3 reduces with 5.3's
S1, S2, S3 = ("_step_stage1",), ("_grad_ready", "_reduce_scatter_unit"), ("_gather", "_free")
NEEDS = {C_SHARD: ("shard_of",), C_UNSHARD: ("unshard",)}
NEEDS.update({name: ("shard_of", "unshard") + extra for names, extra in (
    ((C_S1_EQ, C_S1_BYTES), S1), ((C_S2_EQ, C_S2_BYTES, C_S2_EARLY), S2 + ("_step_stage2",)),
    ((C_S3_EQ, C_S3_MEM, C_S3_COMM), S2 + S3)) for name in names})


def unimplemented(path: Path) -> set[str]:
    """The task functions of the file whose body still raises NotImplementedError (the stub's)."""
    tree = ast.parse(path.read_text(errors="replace"))
    wanted = {f for t in MANIFEST.tasks for f in t.functions}
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name in wanted
            and any(isinstance(st, ast.Raise) and "NotImplementedError" in ast.unparse(st) for st in node.body)}


def _where(exc: BaseException) -> str:
    folder = checks.submission_dir()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve().parent == folder]
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


def _rank(rank: int, world_size: int, seed: int, skip: dict) -> dict:
    """Every check on this rank: {name: None (passed) or (exception type, message)}."""
    import torch.distributed as dist
    _register_hidden_models()
    zm = checks.student_module("zero_engine")
    timeout = datetime.timedelta(seconds=PG_TIMEOUT_S)
    groups = {P: dist.new_group(list(range(P)), timeout=timeout), 1: dist.new_group([0], timeout=timeout)}
    out, hung = {}, None
    for name, fn in CHECKS.items():
        if name in skip or hung:
            out[name] = skip.get(name) or ("TimeoutError", f"rank {rank}: not run, an earlier check "
                                                            f"deadlocked ({hung})")
            continue
        try:
            fn(zm, groups, seed)
            out[name] = None
        except Exception as exc:  # noqa: BLE001 - each check's failure is reported on its own
            first = str(exc).splitlines()[0] if str(exc) else ""
            kind = "TimeoutError" if "timed out" in first.lower() else type(exc).__name__
            out[name] = (kind, f"rank {rank}: {first}{_where(exc)}")
            hung = name if kind == "TimeoutError" else None
    return out


def group_ranks(ctx):
    from scaletrain.launch import spawn
    ctx.student("zero_engine")  # a broken import fails here, for every check, with its line
    todo = unimplemented(ctx.submission / ZF)
    skip = {name: ("NotImplementedError", ", ".join(f"`{f}`" for f in NEEDS[name] if f in todo)
                   + " still raise NotImplementedError")
            for name in CHECKS if todo & set(NEEDS[name])}
    per_rank, failure = [{name: skip.get(name) for name in CHECKS}], None
    if len(skip) < len(CHECKS):
        try:
            per_rank = spawn(_rank, P, checks.trial_seeds(1, salt=55)[0], skip, timeout_s=200)
        except Exception as exc:  # noqa: BLE001 - reported inside every check below
            failure = exc
    ctx.report_ranks(CHECKS, per_rank, failure)
