"""Assignment a5: ZeRO stages 1-3 on the ring collectives (`assignments/a5_zero/`).

The group is *trusted* (`Group.trusted`): this process never imports the submission. The probe
`autograder.probes.a5_zero` runs the student's `shard_of`, `unshard` and `ZeRO` in the sandboxed
worker (one spawn of 2 gloo ranks, with a subgroup of rank 0 for N = 1) on models this side
names, and sends back raw outputs: the parameters after every step, the optimizer state, the bytes
its own wrapper of `isend` saw, and the bytes of live storages it found reachable from the model,
the optimizer and the engine after each step and during forward and backward. Everything that
decides a verdict is here:

- the reference, independent of the student's code: one process training the same model on the
  mean of the ranks' micro-batch gradients (`scaletrain.zero.verify`'s protocol, step by step),
  on hidden models (a GPT of another shape with its tied embedding, an odd MLP, one weight, two
  param groups and a frozen layer), with AdamW and with SGD + momentum (Adam is blind to a
  gradient scaled by N, SGD is not); compared after every step, on every rank;
- the layout (`scaletrain.zero.layout`, the reference) that says which elements each unit and
  shard hold, so stage 3's parameters are rebuilt from the shards here;
- memory: the paper's formula `scaletrain.memory.zero_memory_per_rank` at the padded Ψ' (plus
  frozen parameters and Adam's step counters) against what the process *holds*, counted by the
  probe from the storages, never the engine's `memory_report`; during stage 2's backward, each
  bucket's full gradients must be gone (and its bytes sent) once the bucket is complete; during
  stage 3's forward only the root unit and the running module are gathered;
- bytes: `2Ψ'(N-1)/N` and `3Ψ'(N-1)/N` elements per step, against the bytes handed to `isend`
  (counted below the student's code, not through `record_send`).
Memory, timing and bytes are evidence: each is granted only when its stage's values passed in the
same run (`Check.needs`, `grade.with_values`).

A deadlocked collective ends its job after PG_TIMEOUT_S as `timeout` (the jobs after it are not
run). A task whose functions still hold the stub's `raise NotImplementedError` is reported as not
implemented without running (an untouched stub spawns nothing). torch's ZeroRedundancyOptimizer,
FSDP and its collectives are forbidden in the student file, statically and at run time (in the
ranks, by the probe).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from autograder import checks
from autograder.attacks import IMPORTER, report_forger
from autograder.manifest import Check, Group, Manifest, Planted, Task
from autograder.pyparse import parse_python
from autograder.suites import paired, sized

ZF = "zero_engine.py"
ZF3 = "zero_stage3.py"  # task 5.4: stage 3's coordinator, in its own file
STEM = "zero_engine"
PROBE = "autograder.probes.a5_zero:"
P = 2                # ranks per spawn; a subgroup of rank 0 gives N = 1
PG_TIMEOUT_S = 10.0  # a collective that waits longer than this is a deadlock
SPAWN_TIMEOUT_S = 200
TORCH_COLLECTIVES = ("torch.distributed.all_reduce", "torch.distributed.all_gather",
                     "torch.distributed.all_gather_into_tensor", "torch.distributed.reduce_scatter",
                     "torch.distributed.reduce_scatter_tensor", "torch.distributed.broadcast")

FORBIDDEN = ("torch.distributed.optim", "torch.distributed.fsdp", "torch.distributed._composable",
             "torch.distributed.tensor", "torch.nn.parallel", *TORCH_COLLECTIVES,
             "scaletrain.zero.engine", "scaletrain.zero.ZeRO", "scaletrain.zero.shard_of",
             "scaletrain.zero.unshard", "importlib", "__import__", "exec", "eval")

C_SHARD = "shard_of is a view of elements [r·m, (r+1)·m) of the padded buffer"
C_UNSHARD = "unshard fills every chunk from its owner (N = 1, 2; fewer elements than ranks)"
C_S1_EQ = "stage 1 equals one process (AdamW, SGD momentum; hidden models; N = 1, 2)"
C_S1_HELD = "stage 1 holds 8Ψ' + 8Ψ'/N bytes after each step (optimizer state sharded)"
C_S1_SENT = "stage 1 sends 2Ψ'(N-1)/N elements per step"
C_S2_EQ = "stage 2 equals one process (several buckets; hidden models; N = 1, 2)"
C_S2_HELD = "stage 2 keeps only gradient shards: 4Ψ' + 12Ψ'/N bytes after each step"
C_S2_SENT = "stage 2 sends 2Ψ'(N-1)/N elements per step"
C_S2_EARLY = "stage 2 reduce-scatters every bucket during backward and frees full gradients"
C_S3_EQ = "stage 3 equals one process (hidden models; N = 1, 2)"
C_S3_HELD = "stage 3 holds 16Ψ'/N bytes after each step"
C_S3_GATHER = "stage 3 gathers one block at a time in forward and frees every unit after backward"
C_S3_COMM = "stage 3 sends 3Ψ'(N-1)/N elements per step"


def _semantic_cheats() -> tuple[Planted, ...]:
    """Issue 13's ZeRO cheats: the right numbers without the technique. Each keeps the values
    right, so it loses only the points of the technique it skips."""
    report_formula = (
        '    def memory_report(self) -> "report.MemoryReport":\n'
        '        """Bytes this rank holds now for parameters, gradients and optimizer state (storages)."""\n'
        "        return report.measure_memory(self.units, self.optimizer, self.frozen)\n")
    return (
        Planted("memory_report returns the formula while stage 1 keeps full optimizer state", ZF,
                (report_formula,
                 '    def memory_report(self) -> "report.MemoryReport":\n'
                 "        f = report.expected_memory(self.units, self.optimizer, self.stage)  # the paper's\n"
                 "        return report.MemoryReport(params=f.params, grads=f.grads, optimizer=f.optimizer, padding=0)\n"
                 "\n"
                 "    def _step_stage1(self) -> None:  # data parallelism in disguise: every rank steps everything\n"
                 "        if not getattr(self, '_whole', False):\n"
                 "            self._whole = True\n"
                 "            for unit in self.units:\n"
                 "                unit.shard = nn.Parameter(unit.full)\n"
                 "            self.optimizer = type(self.optimizer)(\n"
                 "                [{**{k: v for k, v in g.items() if k != 'params'},\n"
                 "                  'params': [u.shard for u in self.units if u.group_index == i]}\n"
                 "                 for i, g in enumerate(self.optimizer.param_groups)])\n"
                 "        for unit in self.units:\n"
                 "            ring_allreduce(unit.sync_flat_grad(), op='avg', group=self.group)\n"
                 "            unit.shard.grad = unit.flat_grad\n"
                 "        self.optimizer.step()\n"
                 "        for unit in self.units:\n"
                 "            unit.shard.grad = None\n"),
                expect={C_S1_HELD: "failed", C_S1_SENT: "passed", C_S1_EQ: "passed", C_S2_HELD: "passed",
                        C_S3_HELD: "passed"}),
        Planted("stage 3 keeps a copy of every unit it frees (out of memory_report's sight)", ZF3,
                ("        unit.full.untyped_storage().resize_(0)\n",
                 "        if unit.full.untyped_storage().nbytes():\n"
                 "            self.__dict__.setdefault('_kept', {})[id(unit)] = unit.full.clone()\n"
                 "        unit.full.untyped_storage().resize_(0)\n"),
                expect={C_S3_HELD: "failed", C_S3_EQ: "passed", C_S3_COMM: "passed", C_S2_HELD: "passed"}),
        Planted("stage 2 reduce-scatters every bucket only once the last one is complete", ZF,
                ("        if unit.pending == 0:\n"
                 "            self._reduce_scatter_unit(unit)\n"
                 "            if self.coordinator is not None:\n"
                 "                self.coordinator.free(unit)\n",
                 "        if unit.pending == 0 and self.coordinator is not None:\n"
                 "            self._reduce_scatter_unit(unit)\n"
                 "            self.coordinator.free(unit)\n"
                 "        elif unit.pending == 0:  # hold every bucket, then reduce-scatter them all at once\n"
                 "            self._held = getattr(self, '_held', []) + [unit]\n"
                 "            if len(self._held) == len(self.units):\n"
                 "                for held in self._held:\n"
                 "                    self._reduce_scatter_unit(held)\n"
                 "                self._held = []\n"),
                expect={C_S2_EARLY: "failed", C_S2_EQ: "passed", C_S2_HELD: "passed", C_S2_SENT: "passed",
                        C_S3_GATHER: "passed"}),
        Planted("stage 1 all-gathers through files and tells the byte counter it sent them", ZF,
                ("            unit.shard.grad = None\n"
                 "            unshard(unit.full, unit.shard.detach(), self.group)\n",
                 "            unit.shard.grad = None\n"
                 "            import os, tempfile\n"
                 "            import torch.distributed as dist\n"
                 "            from scaletrain.comm.counter import record_send\n"
                 "            n, m = self.dp_world_size, unit.shard_numel\n"
                 "            calls = type(self).__dict__.get('_calls') or {}\n"
                 "            type(self)._calls = calls\n"
                 "            calls[n] = key = calls.get(n, 0) + 1\n"
                 "            path = os.path.join(tempfile.gettempdir(), f'side-{n}-{key}-{{}}.pt')\n"
                 "            torch.save(unit.shard.detach().clone(), path.format(self.dp_rank))\n"
                 "            dist.barrier(group=self.group)\n"
                 "            for r in range(n):\n"
                 "                unit.full[r * m:(r + 1) * m].copy_(torch.load(path.format(r)))\n"
                 "            record_send((n - 1) * m * unit.full.element_size(), n - 1)\n"),
                expect={C_S1_SENT: "failed", C_S1_EQ: "passed", C_UNSHARD: "passed", C_S2_SENT: "passed"}),
    )


def _grader_attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (issue 13's catalogue), each in place of `shard_of`'s answer,
    which they leave wrong: under the trusted split they earn nothing. The static check forbids
    importlib and __import__, so each reaches for what it wants where that check cannot see."""
    answer = "    m = full.numel() // dp_world_size\n    return full.narrow(0, dp_rank * m, m)\n"
    wrong = "    return full[:0]\n"
    attacks = {
        "forges 'passed' lines in every report it can find (and at exit)": (
            report_forger([C_SHARD]) +
            "    if not getattr(shard_of, 'forged', False):\n"
            "        shard_of.forged = True\n"
            "        forge(); atexit.register(forge)\n" + wrong, "failed"),
        "patches the grader's classify through sys.modules": (
            f"    ctx = {IMPORTER}('autograder.context', fromlist=['x'])\n"
            "    ctx.classify = lambda exc, submission: ('passed', '')\n" + wrong, "failed"),
        "imports the reference engine by a name built at run time": (
            f"    ref = {IMPORTER}('scaletrain.zero.eng' + 'ine', fromlist=['x'])\n"
            "    return ref.shard_of(full, dp_rank, dp_world_size)\n", "error"),
    }
    return tuple(Planted(name, ZF, (answer, body), expect={C_SHARD: outcome})
                 for name, (body, outcome) in attacks.items())


MANIFEST = Manifest(
    assignment="a5", folder="a5_zero", title="ZeRO: sharded optimizer state, gradients and parameters",
    files={ZF: "lib/scaletrain/zero/engine.py", ZF3: "lib/scaletrain/zero/stage3.py"},
    tasks=(
        Task("5.1", "Shard and unshard the flat buffer", file=ZF, functions=("shard_of", "unshard")),
        Task("5.2", "Stage 1: reduce-scatter, step on the shard, all-gather", file=ZF, functions=("_step_stage1",)),
        Task("5.3", "Stage 2: reduce-scatter buckets during backward", file=ZF,
             functions=("_grad_ready", "_reduce_scatter_unit", "_step_stage2")),
        Task("5.4", "Stage 3: when to gather and free parameters (a design decision)", file=ZF3,
             functions=("gather", "free", "_post_forward", "_pre_backward")),
    ),
    forbidden={file: FORBIDDEN for file in (ZF, ZF3)},
    groups=(
        Group("ranks", "autograder.suites.a5_zero:group_ranks", timeout_s=240, trusted=True, checks=(
            Check("5.1", C_SHARD, 1), Check("5.1", C_UNSHARD, 2),
            Check("5.2", C_S1_EQ, 2), Check("5.2", C_S1_HELD, 1, needs=(C_S1_EQ,)),
            Check("5.2", C_S1_SENT, 1, needs=(C_S1_EQ,)),
            Check("5.3", C_S2_EQ, 2), Check("5.3", C_S2_HELD, 1, needs=(C_S2_EQ,)),
            Check("5.3", C_S2_SENT, 1, needs=(C_S2_EQ,)), Check("5.3", C_S2_EARLY, 1, needs=(C_S2_EQ,)),
            Check("5.4", C_S3_EQ, 3), Check("5.4", C_S3_HELD, 1, needs=(C_S3_EQ,)),
            Check("5.4", C_S3_GATHER, 1, needs=(C_S3_EQ,)), Check("5.4", C_S3_COMM, 1, needs=(C_S3_EQ,)),
        )),
    ),
    planted=(
        Planted("gradients summed, not averaged", ZF,
                ('unit.shard.grad = ring_reduce_scatter(unit.sync_flat_grad(), op="avg", group=self.group)',
                 'unit.shard.grad = ring_reduce_scatter(unit.sync_flat_grad(), op="sum", group=self.group)'),
                expect={C_S1_EQ: "failed", C_S1_HELD: "failed", C_S1_SENT: "failed", C_UNSHARD: "passed",
                        C_S3_EQ: "passed"}),
        Planted("stage 3 never frees gathered parameters", ZF3,
                ("        unit.full.untyped_storage().resize_(0)\n", "        pass\n"),
                expect={C_S3_GATHER: "failed", C_S3_HELD: "failed", C_S3_EQ: "passed", C_S3_COMM: "passed",
                        C_S2_EQ: "passed"}),
        # a small slip in the schedule costs its share: units kept gathered from forward to backward
        Planted("stage 3 frees a unit only after its backward, not after its forward", ZF3,
                ("        for unit in self._units_of[module]:\n            self.free(unit)\n"
                 "        if torch.is_grad_enabled():", "        if torch.is_grad_enabled():"),
                expect={C_S3_EQ: "passed", C_S3_HELD: "passed", C_S3_GATHER: "failed", C_S3_COMM: "failed"}),
        *_semantic_cheats(),
        Planted("wraps torch's FSDP", ZF,
                ("import torch.nn as nn\n", "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n"),
                expect={C_SHARD: "flagged", C_S1_EQ: "flagged", C_S2_EARLY: "flagged"}),
        Planted("stage 3's coordinator wraps torch's FSDP", ZF3,
                ("import torch.nn as nn\n", "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n"),
                expect={C_S3_EQ: "flagged", C_S3_GATHER: "flagged", C_S1_EQ: "passed"}),
        Planted("all-gather that only receives (deadlock)", ZF,
                ("    ring_all_gather_chunks(chunks, ring)\n",
                 "    torch.distributed.irecv(mine, src=ring.recv_from, group=ring.group).wait()\n"),
                expect={C_SHARD: "passed", C_UNSHARD: "timeout", C_S3_EQ: "timeout"}),
        *_grader_attacks(),
    ),
)

# ---------------------------------------------------------------- what is trained

# hidden models, as specs the probe builds (`autograder.probes.a5_zero.build_model`)
MODELS = {
    "h_gpt": {"kind": "gpt", "config": dict(vocab_size=53, block_size=10, n_layer=3, n_head=3, n_embd=15)},
    "h_mlp": {"kind": "mlp", "sizes": [9, 17, 4]},
    "h_tiny": {"kind": "one_weight"},
    "h_groups": {"kind": "mlp", "sizes": [5, 11, 7, 2], "frozen_first": True, "grouped": True},
}
# the public tests' runs (scaletrain.zero.verify's models, `_model`): each runs here too (issue 27)
PUBLIC = (("p_gpt", "sgd_momentum"), ("p_groups", "adamw"), ("p_tiny", "sgd_momentum"))
# (model, optimizer) trained per stage; SGD is in the N = 2 rows that must catch a missing average
GRID = {P: (("h_gpt", "adamw"), ("h_gpt", "sgd_momentum"), ("h_mlp", "sgd_momentum"), ("h_tiny", "adamw"),
            ("h_groups", "sgd_momentum")) + PUBLIC,
        1: (("h_groups", "adamw"), ("h_tiny", "sgd_momentum"))}
BYTES = (("h_gpt", "adamw"), ("h_groups", "sgd_momentum")) + PUBLIC  # memory and bytes audited at N = 2
EARLY = (("h_gpt", "adamw"), ("h_groups", "sgd_momentum"), ("h_gpt", "sgd_momentum"))  # stage 2's backward
GATHERS = ("h_gpt", "p_gpt")  # stage 3's gathers audited
STEPS = 3
BUCKET_CAP_MB = 0.002  # ~500 floats: the GPT gets several buckets at stages 0-2
UNSHARD_M = (1, 2, 5, 7, 1000)  # 1 and 5: the public test's (issue 27)
KIND = {"adamw": "adam", "sgd_momentum": "sgd_momentum"}  # scaletrain.memory's optimizer names


def _options(optimizer: str) -> dict:
    from scaletrain.zero.verify import OPTIMIZER_SETUPS
    return dict(OPTIMIZER_SETUPS[optimizer][1])


def _model(name: str) -> dict:
    """A hidden model's spec, or (p_*) the spec of the public model of scaletrain.zero.verify."""
    if not name.startswith("p_"):
        return MODELS[name]
    from scaletrain.zero.verify import GPT_CFG
    return {"p_gpt": {"kind": "gpt", "config": dict(vocab_size=GPT_CFG.vocab_size, block_size=GPT_CFG.block_size,
                                                    n_layer=GPT_CFG.n_layer, n_head=GPT_CFG.n_head,
                                                    n_embd=GPT_CFG.n_embd)},
            "p_tiny": {"kind": "mlp", "sizes": [1, 1]},                    # verify's MLP([1, 1])
            "p_groups": {"kind": "mlp", "sizes": [6, 9, 10, 3], "frozen_first": True, "grouped": True}}[name]


def _job(model: str, optimizer: str, stage: int, size: int, seed: int) -> dict:
    traced = size == P and ((model, optimizer) in BYTES or (stage == 2 and (model, optimizer) in EARLY))
    return {"name": f"stage {stage}, N={size}, {optimizer}, model {model}", "kind": "train", "model": _model(model),
            "key": model, "optimizer": optimizer, "options": _options(optimizer), "stage": stage, "size": size,
            "seed": seed, "steps": STEPS, "bucket_cap_mb": BUCKET_CAP_MB, "trace": traced}


def _unshard_job(size: int, seed: int) -> dict:
    import torch
    gen = torch.Generator().manual_seed(seed * 7 + size)
    return {"name": f"unshard N={size}", "kind": "unshard", "size": size,
            "buffers": [torch.randn(size * m, generator=gen) for m in UNSHARD_M]}


def _jobs(names: set[str], seed: int) -> dict[str, list[dict]]:
    """The jobs each check needs (the same job may serve several checks), for the checks in `names`."""
    need: dict[str, list[dict]] = {}
    if C_UNSHARD in names:
        need[C_UNSHARD] = [_unshard_job(size, seed) for size in (P, 1)]
    for stage, eq, audits in ((1, C_S1_EQ, (C_S1_HELD, C_S1_SENT)), (2, C_S2_EQ, (C_S2_HELD, C_S2_SENT, C_S2_EARLY)),
                              (3, C_S3_EQ, (C_S3_HELD, C_S3_GATHER, C_S3_COMM))):
        jobs = [_job(model, opt, stage, size, seed) for size in (P, 1) for model, opt in GRID[size]]
        if eq in names:
            need[eq] = jobs
        for name in audits:
            if name in names:
                pick = EARLY if name == C_S2_EARLY else BYTES
                need[name] = [j for j in jobs if j["size"] == P and (j["key"], j["optimizer"]) in pick]
    return need


# ---------------------------------------------------------------- the reference, on this side only

class _Reference:
    """Expected values, computed here from the reference library and cached per model.

    `start(wanted, seed)` builds the jobs the checks in `wanted` need and computes their expected
    values in a thread, while the worker runs the student's code (importing torch and, with the
    first optimizer, torch._dynamo costs seconds best overlapped); `jobs()` waits for the jobs,
    `wait()` for everything."""

    def __init__(self):
        import threading

        self._runs: dict = {}
        self._layouts: dict = {}
        self._thread = None
        self._error: BaseException | None = None
        self._built = threading.Event()
        self.need: dict[str, list[dict]] = {}

    def start(self, wanted: set[str], seed: int) -> None:
        import threading

        def compute():
            try:
                import torch
                torch.set_num_threads(1)  # the ranks have the cores
                self.need = _jobs(wanted, seed)
                self._built.set()
                for job in self._unique():
                    if job["kind"] == "train":
                        self.run(job)
                        self.layout(job)
            except BaseException as exc:  # noqa: BLE001 - re-raised by wait(), in the group's thread
                self._error = exc
            finally:
                self._built.set()

        self._thread = threading.Thread(target=compute, name="a5-reference", daemon=True)
        self._thread.start()

    def _unique(self) -> list[dict]:
        jobs = list({j["name"]: j for js in self.need.values() for j in js}.values())
        return sorted(jobs, key=lambda j: (j["kind"] != "unshard", j.get("stage", 0)))

    def jobs(self) -> list[dict]:
        """Every job once, in the order the ranks run them (unshard, then stage by stage)."""
        self._built.wait()
        self._raise()
        return self._unique()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"suite bug: the reference failed: {self._error!r}") from self._error

    def run(self, job: dict):
        """One process, step by step: ([{name: param} after each step], {name: {key: state}})."""
        key = (job["key"], job["optimizer"], job["size"], job["seed"])
        if key not in self._runs:
            self._runs[key] = _reference_run(job)
        return self._runs[key]

    def layout(self, job: dict) -> dict:
        key = (job["key"], job["stage"] == 3, job["size"], job["seed"])
        if key not in self._layouts:
            self._layouts[key] = _layout(job)
        return self._layouts[key]


def _reference_run(job: dict):
    import torch
    from autograder.probes.a5_zero import build_model
    from scaletrain.zero.verify import OPTIMIZER_SETUPS, micro_batch_loss

    model, groups = build_model(job["model"], job["seed"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = OPTIMIZER_SETUPS[job["optimizer"]][0](groups if groups is not None else trainable, **job["options"])
    size, snapshots = job["size"], []
    for step in range(job["steps"]):
        total = [torch.zeros_like(p) for p in trainable]
        for r in range(size):  # per-rank gradients first, summed in rank order, then / N
            model.zero_grad()
            micro_batch_loss(model, seed=job["seed"], step=step, rank=r).backward()
            for t, p in zip(total, trainable):
                t.add_(p.grad)
        for t, p in zip(total, trainable):
            p.grad = t.div_(size)
        opt.step()
        snapshots.append({n: p.detach().clone() for n, p in model.named_parameters()})
    state = {n: {k: v.clone() for k, v in opt.state[p].items() if isinstance(v, torch.Tensor) and v.shape == p.shape}
             for n, p in model.named_parameters() if p in opt.state}
    return snapshots, state


def _layout(job: dict) -> dict:
    """The units the engine builds (reference layout): names, offsets, shapes, n, m = N·m / N, the
    module (stage 3), and the bytes of the frozen parameters."""
    from autograder.probes.a5_zero import build_model
    from scaletrain.zero.layout import bucket_units, default_unit_modules, module_units, resolve_param_groups

    model, groups = build_model(job["model"], job["seed"])
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    resolved = resolve_param_groups(model, groups)
    where = dict(dp_rank=0, dp_world_size=job["size"])
    if job["stage"] == 3:
        units = module_units(model, resolved, default_unit_modules(model), **where)
    else:
        units = bucket_units(resolved, bucket_cap_bytes=int(job["bucket_cap_mb"] * 2**20), **where)
    names = {id(m): n for n, m in model.named_modules()}
    return {"units": [{"names": list(u.names), "offsets": list(u.offsets), "shapes": [tuple(p.shape) for p in u.params],
                       "numel": u.numel, "m": u.shard_numel, "padded": u.padded_numel,
                       "module": names.get(id(u.module))} for u in units],
            "frozen": frozen, "itemsize": units[0].full.element_size()}


# zero.verify's atol: entries whose exact value is 0 and whose computed one is rounding noise
_close = functools.partial(checks.assert_tensor_close, atol=1e-7)


def _whole(per_rank: list, unit: dict, what: str):
    """A unit's (N·m,) buffer from every rank's m elements (or one rank's whole buffer)."""
    import torch
    if any(t is None for t in per_rank):
        raise AssertionError(f"{what}: a rank holds no such tensor (freed or missing)")
    if all(t.numel() == unit["m"] for t in per_rank):
        return torch.cat([t.reshape(-1) for t in per_rank])
    if per_rank[0].numel() == unit["padded"]:
        return per_rank[0].reshape(-1)
    raise AssertionError(f"{what}: ranks hold {[t.numel() for t in per_rank]} elements, expected a shard of "
                         f"{unit['m']} each (or the whole {unit['padded']})")


def _views(flat, unit: dict) -> dict:
    return {n: flat[off:off + _numel(shape)].view(shape)
            for n, off, shape in zip(unit["names"], unit["offsets"], unit["shapes"])}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _outputs(job: dict, per_rank: list) -> list:
    """The job's outputs of every rank that ran it (ranks < N), each complete: an answer with a
    step or a row missing fails rather than passing on what is there."""
    if not isinstance(per_rank, list) or len(per_rank) < job["size"]:
        raise AssertionError(f"{job['name']}: expected answers of {job['size']} ranks, got {str(per_rank)[:80]}")
    outs = [per_rank[r][job["name"]]["ok"] for r in range(job["size"])]
    for rank, out in enumerate(outs):
        if job["kind"] == "unshard":
            if len(out) != len(job["buffers"]):
                raise AssertionError(f"{job['name']}, rank {rank}: {len(out)} results for {len(job['buffers'])} buffers")
        elif len(out["steps"]) != job["steps"] or (job["trace"] and any("held" not in r for r in out["steps"])):
            raise AssertionError(f"{job['name']}, rank {rank}: {len(out['steps'])} steps reported, {job['steps']} run")
    return outs


def _layout_of(job: dict, out: dict, layout: dict, label: str) -> None:
    declared = [u["names"] for u in out["layout"]]
    expected = [u["names"] for u in layout["units"]]
    if declared != expected:
        raise AssertionError(f"{label} the engine's units {declared[:3]}... are not the given layout "
                             f"{expected[:3]}... (keep ZeRO.__init__'s units)")


# ---------------------------------------------------------------- verdicts

def _verify_equal(job: dict, outs: list[dict], ref: _Reference) -> None:
    from scaletrain.zero.verify import RTOL

    rtol, label = RTOL[job["optimizer"]], job["name"] + ":"
    snapshots, state = ref.run(job)
    layout = ref.layout(job)
    for out in outs:
        _layout_of(job, out, layout, label)
    for step, expected in enumerate(snapshots):
        for rank, out in enumerate(outs):
            got = dict(out["steps"][step].get("params") or {})
            if job["stage"] == 3:  # the units' parameters are sharded: rebuilt from every rank's shards
                shards = [sized(o["steps"][step].get("shards"), len(layout["units"]),
                                f"{label} rank {r}: unit shards after step {step + 1}") for r, o in enumerate(outs)]
                for i, unit in enumerate(layout["units"]):
                    flat = _whole([row[i] for row in shards], unit, f"{label} shard of unit {i} after step {step + 1}")
                    got.update(_views(flat, unit))
            for name, want in expected.items():
                if name not in got:
                    raise AssertionError(f"{label} parameter {name} missing after step {step + 1} (rank {rank})")
                _close(got[name], want, rtol=rtol, what=f"{label} parameter {name} after step {step + 1} (rank {rank})")
            if job["stage"] == 3:
                break  # the shards of all ranks make one answer
    for i, unit in enumerate(layout["units"]):
        keys = set().union(*(state.get(n, {}) for n in unit["names"]))
        for key in sorted(keys):
            flat = _whole([o["state"][i].get(key) if i < len(o["state"]) else None for o in outs], unit,
                          f"{label} optimizer state {key} of unit {i}")
            for name, view in _views(flat, unit).items():
                _close(view, state[name][key], rtol=rtol, what=f"{label} optimizer state {key} of {name}")


def _expected_held(job: dict, layout: dict):
    """(bytes this rank should hold after a step, the formula's breakdown): the paper's formula at
    Ψ' plus the frozen parameters (whole on every rank) and Adam's 4-byte step counter per shard."""
    from scaletrain.memory import zero_memory_per_rank

    psi = sum(u["padded"] for u in layout["units"])
    formula = zero_memory_per_rank(psi, job["size"], job["stage"], precision="fp32", optimizer=KIND[job["optimizer"]])
    counters = 4 * len(layout["units"]) if job["optimizer"] == "adamw" else 0
    return formula.total + layout["frozen"] + counters, formula, psi


def _verify_held(job: dict, outs: list[dict], ref: _Reference) -> None:
    layout = ref.layout(job)
    want, formula, psi = _expected_held(job, layout)
    for rank, out in enumerate(outs):
        _layout_of(job, out, layout, job["name"] + ":")
        for step, record in enumerate(out["steps"]):
            held = record["held"]
            if held["total"] != want:
                roles = ", ".join(f"{k} {v}" for k, v in held.items() if k != "total")
                raise AssertionError(
                    f"{job['name']}, rank {rank}, after step {step + 1}: the process holds {held['total']} B "
                    f"({roles}), the formula at padded Ψ' = {psi} allows {want} B (params {formula.params}, "
                    f"grads {formula.grads}, optimizer {formula.optimizer}, frozen {layout['frozen']}, step "
                    f"counters {want - formula.total - layout['frozen']}); memory_report said "
                    f"{out['reports']['memory_report']}")


def _verify_sent(job: dict, outs: list[dict], ref: _Reference) -> None:
    layout = ref.layout(job)
    size, f = job["size"], 3 if job["stage"] == 3 else 2
    want = f * (size - 1) * sum(u["m"] for u in layout["units"]) * layout["itemsize"]
    psi = sum(u["padded"] for u in layout["units"])
    for rank, out in enumerate(outs):
        for step, record in enumerate(out["steps"]):
            sent = record["sent"]
            got = sent["forward"] + sent["backward"] + sent["step"]
            if got != want:
                raise AssertionError(
                    f"{job['name']}, rank {rank}, step {step + 1}: {got} B handed to isend (forward "
                    f"{sent['forward']}, backward {sent['backward']}, step {sent['step']}), expected "
                    f"{f}Ψ'(N-1)/N = {want} B (Ψ' = {psi}); comm_report said {out['reports']['comm_report']}")


def _verify_early(job: dict, outs: list[dict], ref: _Reference) -> None:
    """Stage 2's backward, sampled after each gradient's hook: every complete bucket has been
    reduce-scattered (its bytes sent) and its full gradients dropped; nothing else is held."""
    layout = ref.layout(job)
    units, size, item = layout["units"], job["size"], layout["itemsize"]
    assert len(units) >= 2, "suite bug: expected several buckets"
    _, formula, _ = _expected_held(job, layout)
    counters = 4 * len(units) if job["optimizer"] == "adamw" else 0
    numel = {n: _numel(s) for u in units for n, s in zip(u["names"], u["shapes"])}
    every = sum((size - 1) * u["m"] * item for u in units)
    for rank, out in enumerate(outs):
        for step, record in enumerate(out["steps"]):
            at = f"{job['name']}, rank {rank}, backward of step {step + 1}"
            base = formula.params + layout["frozen"] + (formula.optimizer + counters if step else 0)
            arrived: set[str] = set()
            samples = record["samples"]
            if not samples or samples[-1]["phase"] != "end":
                raise AssertionError(f"{at}: the backward was not sampled")
            sampled = sorted(sample["at"] for sample in samples[:-1])
            if sampled != sorted(numel):  # one sample after each parameter's gradient, or the evidence is partial
                raise AssertionError(f"{at}: the backward was sampled after {len(sampled)} gradients, expected one "
                                     f"after each of the {len(numel)} parameters' (keep every gradient hook)")
            for sample in samples[:-1]:
                arrived.add(sample["at"])
                done = [u for u in units if arrived.issuperset(u["names"])]
                must_send = sum((size - 1) * u["m"] * item for u in done)
                may_hold = sum(numel[n] * item for u in units if u not in done for n in u["names"] if n in arrived)
                if sample["sent"] < must_send:
                    raise AssertionError(
                        f"{at}: after the gradient of {sample['at']}, {len(done)} bucket(s) were complete but only "
                        f"{sample['sent']} B had been sent, expected {must_send}: reduce-scatter each bucket from "
                        "_grad_ready as soon as it is complete")
                if sample["grads"] > may_hold:
                    raise AssertionError(
                        f"{at}: after the gradient of {sample['at']}, {sample['grads']} B of full gradients held, "
                        f"at most {may_hold} B may be (those of incomplete buckets): set p.grad = None once a "
                        "bucket is reduce-scattered")
                allowed = base + sum(u["m"] * item for u in done) + may_hold
                if sample["total"] > allowed:
                    raise AssertionError(
                        f"{at}: after the gradient of {sample['at']}, the process holds {sample['total']} B, at most "
                        f"{allowed} B may be (parameters, optimizer state, the shards of complete buckets' "
                        "gradients, the full gradients of incomplete ones)")
            end = samples[-1]
            if end["sent"] != every:
                raise AssertionError(f"{at}: {end['sent']} B sent during backward, expected {every} (one "
                                     "reduce-scatter of every bucket)")
            if end["grads"]:
                raise AssertionError(f"{at}: {end['grads']} B of full gradients kept after backward; set "
                                     "p.grad = None once reduce-scattered")


def _verify_stage3(job: dict, outs: list[dict], ref: _Reference) -> None:
    """Stage 3's forward (GPT): at each unit module's pre-hook only the root unit and that module's
    unit are gathered, and nothing but them is held beyond the shards; after backward nothing is
    gathered; during backward at most the root and two other units."""
    layout = ref.layout(job)
    units, item = layout["units"], layout["itemsize"]
    want, _, _ = _expected_held(job, layout)
    root = sum(u["padded"] for u in units if u["module"] == "") * item
    own = {}
    for u in units:
        if u["module"]:
            own[u["module"]] = own.get(u["module"], 0) + u["padded"] * item
    two = sum(sorted(own.values())[-2:])
    for rank, out in enumerate(outs):
        for step, record in enumerate(out["steps"]):
            at = f"{job['name']}, rank {rank}, step {step + 1}"
            seen = {sample["at"] for sample in record["samples"] if sample["phase"] == "forward"}
            if not seen.issuperset(own) or not any(sample["phase"] == "end" for sample in record["samples"]):
                raise AssertionError(f"{at}: the forward of {sorted(set(own) - seen)} (or the backward) was not sampled")
            for sample in record["samples"]:
                if sample["phase"] == "forward":
                    expected = root + own.get(sample["at"], 0)
                    if sample["gathered"] != expected:
                        raise AssertionError(
                            f"{at}: {sample['gathered']} B of parameters gathered when {sample['at']} starts its "
                            f"forward, expected {expected} (the root unit + this module's): gather a unit just "
                            "before its module runs and free it right after")
                    if sample["total"] - sample["gathered"] > want:
                        raise AssertionError(
                            f"{at}: besides the gathered parameters the process holds {sample['total'] - sample['gathered']} "
                            f"B when {sample['at']} starts its forward, at most {want} B (shards, gradients, state)")
                elif sample["phase"] == "backward" and sample["gathered"] > root + two:
                    raise AssertionError(
                        f"{at}: {sample['gathered']} B of parameters gathered after the gradient of {sample['at']}, at "
                        f"most {root + two} B (the root and two units): free each unit once its gradients are "
                        "reduce-scattered")
                elif sample["phase"] == "end" and (sample["gathered"] or sample["grads"]):
                    raise AssertionError(
                        f"{at}: after backward {sample['gathered']} B of parameters still gathered and "
                        f"{sample['grads']} B of full gradients held: free every unit after its backward")


def _verify_unshard(job: dict, outs: list[dict], ref: _Reference) -> None:
    size = job["size"]
    for rank, rows in enumerate(outs):
        for row, data in paired(rows, job["buffers"], f"rank {rank}: unshard results, one per buffer"):
            m = data.numel() // size
            checks.assert_equal(row["view"], data, what=f"rank {rank}: unshard of a view, N={size}, m={m}")
            checks.assert_equal(row["separate"], data, what=f"rank {rank}: unshard of a separate shard, N={size}, m={m}")
            want = (size - 1) * m * data.element_size()
            if row["sent"] != [want, want]:
                raise AssertionError(f"rank {rank}: unshard (N={size}, m={m}) handed {row['sent']} B to isend per "
                                     f"call, expected {want} (N-1 messages of m elements, the ring)")


VERIFY = {C_UNSHARD: (_verify_unshard,), C_S1_EQ: (_verify_equal,), C_S2_EQ: (_verify_equal,),
          C_S3_EQ: (_verify_equal,), C_S1_HELD: (_verify_held,), C_S1_SENT: (_verify_sent,),
          C_S2_HELD: (_verify_held,), C_S2_SENT: (_verify_sent,), C_S2_EARLY: (_verify_early,),
          C_S3_HELD: (_verify_held,), C_S3_GATHER: (_verify_stage3,), C_S3_COMM: (_verify_sent,)}
CHECKS = (C_SHARD, C_UNSHARD, C_S1_EQ, C_S1_HELD, C_S1_SENT, C_S2_EQ, C_S2_HELD, C_S2_SENT, C_S2_EARLY, C_S3_EQ,
          C_S3_HELD, C_S3_GATHER, C_S3_COMM)
# what each task's checks call: every stage gathers with 5.1's functions, stage 3 reduces with 5.3's
S1, S2, S3 = ("_step_stage1",), ("_grad_ready", "_reduce_scatter_unit"), ("gather", "free", "_post_forward",
                                                                             "_pre_backward")
NEEDS = {C_SHARD: ("shard_of",), C_UNSHARD: ("unshard",)}
NEEDS.update({name: ("shard_of", "unshard") + extra for names, extra in (
    ((C_S1_EQ, C_S1_HELD, C_S1_SENT), S1), ((C_S2_EQ, C_S2_HELD, C_S2_SENT, C_S2_EARLY), S2 + ("_step_stage2",)),
    ((C_S3_EQ, C_S3_HELD, C_S3_GATHER, C_S3_COMM), S2 + S3)) for name in names})


def unimplemented(path: Path) -> set[str]:
    """The task functions of the file whose body still raises NotImplementedError (the stub's)."""
    tree = parse_python(path.read_text(errors="replace"), str(path))
    wanted = {f for t in MANIFEST.tasks for f in t.functions}
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name in wanted
            and any(isinstance(st, ast.Raise) and "NotImplementedError" in ast.unparse(st) for st in node.body)}


def _shard_cases(seed: int):
    import torch
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(size * m, generator=gen), rank, size)
            for size, m in ((3, 5), (4, 2), (1, 7), (2, 1), (3, 4)) for rank in range(size)]  # (3, 4): the public's


def _verify_shards(cases, got) -> None:
    if not isinstance(got, list) or len(got) != len(cases):
        raise AssertionError("shard_of: the probe returned no answer per case")
    for (full, rank, size), g in zip(cases, got, strict=True):
        m, call = full.numel() // size, f"shard_of(N={size}, r={rank})"
        if g.get("value") is None:
            raise AssertionError(f"{call} returned {g.get('type')}, expected a tensor")
        value = g["value"]
        if tuple(value.shape) != (m,):
            raise AssertionError(f"{call} has shape {tuple(value.shape)}, expected ({m},)")
        checks.assert_equal(value, full[rank * m:(rank + 1) * m], what=call)
        if not g["same_storage"] or g["offset"] != rank * m:
            raise AssertionError(f"{call} must return a view of the buffer starting at element {rank * m} (the "
                                 "optimizer updates the parameters through it)")


def group_ranks(ctx):
    todo = unimplemented(ctx.submission / ZF) | unimplemented(ctx.submission / ZF3)  # read as text, never imported
    skip = {name: ", ".join(f"`{f}`" for f in NEEDS[name] if f in todo) + " still raise NotImplementedError"
            for name in CHECKS if todo & set(NEEDS[name])}
    seed = checks.trial_seeds(1, salt=55)[0]
    wanted = {n for n in CHECKS if n not in skip}
    worker, failure, per_rank = ctx.untrusted(), None, []
    if not worker.started:
        worker.start()  # forked (with a preexec_fn) before this process has a second thread
    ref = _Reference()
    ref.start(wanted, seed)  # the jobs and their expected values, here, while the worker boots
    try:  # a broken import fails every check, with its line
        worker.call(PROBE + "load", STEM, ranks=bool(wanted - {C_SHARD}), timeout_s=60)
    except Exception as exc:  # noqa: BLE001 - reported inside every check below
        failure = exc
    jobs, need = ref.jobs(), ref.need
    if C_SHARD not in skip and failure is None:
        cases = _shard_cases(seed)
        with ctx.check(C_SHARD):
            _verify_shards(cases, worker.call(PROBE + "shard_views", STEM, cases, timeout_s=60))
    if jobs and failure is None:
        try:
            per_rank = sized(worker.call(PROBE + "run_ranks", STEM, jobs, P, PG_TIMEOUT_S, SPAWN_TIMEOUT_S,
                                         timeout_s=SPAWN_TIMEOUT_S + 30), P, "the ranks' answers")
        except Exception as exc:  # noqa: BLE001 - reported inside every check below
            failure = exc
    ref.wait()
    for name in CHECKS:
        if ctx.recorded(name):
            continue
        with ctx.check(name):
            if failure is not None:
                raise failure
            if name in skip:
                raise NotImplementedError(skip[name])
            mine = need[name]
            problem = checks.rank_failure(mine, per_rank)
            if problem is not None:
                raise problem
            for job in mine:
                outs = _outputs(job, per_rank)
                for verify in VERIFY[name]:
                    if verify is _verify_stage3 and job["key"] not in GATHERS:
                        continue
                    verify(job, outs, ref)
