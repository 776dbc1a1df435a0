"""a5's planted submissions: wrong answers, a small slip in the stage-3 schedule, semantic cheats
(the right numbers without the technique), forbidden imports, a deadlock and attacks on the
grader, each with the outcomes the selftest expects."""

from autograder.attacks import IMPORTER, report_forger
from autograder.manifest import Planted

from .names import (C_S1_EQ, C_S1_HELD, C_S1_SENT, C_S2_EARLY, C_S2_EQ, C_S2_HELD, C_S2_SENT, C_S3_COMM, C_S3_EQ,
                    C_S3_GATHER, C_S3_HELD, C_SHARD, C_UNSHARD, ZF, ZF3)


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


PLANTED = (
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
)
