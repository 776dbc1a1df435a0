"""ZeRO stage 3's parameter coordinator: when a unit's parameters are gathered, freed and
prefetched (assignment a5, task 5.4).

Rajbhandari et al. 2020, "ZeRO", §5.3 (P_os+g+p) and §7.2.3: each rank keeps only its shard of
every flat unit (layout.py); a unit's whole buffer exists only while its module runs. One step:
  forward   gather a unit's parameters just before its module runs, free them right after;
  backward  gather them again when the gradient reaches the module's output; the engine
            reduce-scatters the unit's gradients as they complete and then frees it (engine.py);
  end       anything still gathered is freed, so a step ends holding shards only.
A freed buffer is `unit.full` with its storage resized to 0 bytes: the parameters stay valid views
(autograd keeps them for backward), and reading one before the next gather is an error, never
stale data.

Prefetch (`prefetch=k`, FSDP's forward and backward prefetch; Zhao et al. 2023, "PyTorch FSDP",
§3.3.2): the first step records the order in which the unit modules run forward and backward;
from then on, when a module starts, the gathers of the next modules in that order (at most k
units in flight) run on a communication thread (comm/thread.py, its own process group), so module
i+1's all-gather overlaps module i's compute. Bytes sent are unchanged; the price is up to k more
gathered units of memory. DeepSpeed keeps the same logic apart from its optimizer
(`partitioned_param_coordinator.py`): "when is a parameter gathered?" is answered in this file.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

from scaletrain.comm.counter import CommStats, comm_counter
from scaletrain.comm.thread import CommThread
from scaletrain.zero.layout import FlatUnit

__all__ = ["ParameterCoordinator"]


class ParameterCoordinator:
    """Gathers and frees stage 3's flat units around their modules' forward and backward.

    group:       the data-parallel process group the shards are gathered on (None: all ranks).
    prefetch:    how many units may be gathered ahead on the communication thread (0: none).
    unshard:     `unshard(full, local, group)`, task 5.1's all-gather into a buffer.
    counted:     `counted(fn, *args)` runs a hook with its sends counted as training's (the engine's).
    on_backward: called when a gradient first reaches a unit module (the engine queues its end of
                 backward there).
    sent:        where a prefetch's bytes are added once the main thread waits for it.
    """

    def __init__(self, *, group: Any, prefetch: int, unshard: Callable, counted: Callable,
                 on_backward: Callable[[], None], sent: CommStats):
        self.group, self.prefetch, self.sent = group, prefetch, sent
        self._unshard, self._counted, self._on_backward = unshard, counted, on_backward
        self._units_of: dict[nn.Module, list[FlatUnit]] = {}
        self._order: dict[str, list[nn.Module]] = {"forward": [], "backward": []}
        self._recording = True  # until the first backward ends: the order prefetch follows
        self._inflight: dict[int, torch.futures.Future] = {}  # id(unit) -> its gather on the thread
        self._comm = CommThread(group=group, name="zero3-prefetch") if prefetch else None

    def register(self, units: list[FlatUnit]) -> None:
        """Hook every unit's module: gather before its forward, free after it (counted)."""
        for unit in units:
            self._units_of.setdefault(unit.module, []).append(unit)
        for module in self._units_of:
            module.register_forward_pre_hook(functools.partial(self._counted, self._pre_forward))
            module.register_forward_hook(functools.partial(self._counted, self._post_forward))

    # -------------------------------------------------------------- task 5.4: gather and free

    def gather(self, unit: FlatUnit, group: Any = None) -> None:
        """Task 5.4. Make the unit's parameters usable: give `unit.full` its N·m elements of storage
        back (`unit.full.untyped_storage().resize_(nbytes)`) and all-gather every rank's shard into
        it with `unshard` on `group` (None: the coordinator's `self.group`; the prefetch thread
        passes its own, so its messages never meet the main thread's). The parameters are views of
        `full`, so they see the values at once.
        Already gathered (a module called twice, or the root during its children): do nothing.
        """
        if unit.gathered:
            return
        # BEGIN SOLUTION
        unit.full.untyped_storage().resize_(unit.padded_numel * unit.full.element_size())
        self._unshard(unit.full, unit.shard.detach(), self.group if group is None else group)
        # END SOLUTION
        unit.gathered = True

    def free(self, unit: FlatUnit) -> None:
        """Task 5.4. Release the memory of the gathered parameters: resize `unit.full`'s storage to
        0 bytes. The views stay valid objects (autograd keeps them for the backward, which
        gathers again first); reading them before the next `gather` is an error, not stale data.
        """
        # BEGIN SOLUTION
        unit.full.untyped_storage().resize_(0)
        # END SOLUTION
        unit.gathered = False

    # -------------------------------------------------------------- the hooks

    def _pre_forward(self, module: nn.Module, _inputs: Any) -> None:
        self._use(module, "forward")

    def _post_forward(self, module: nn.Module, _inputs: Any, output: Any) -> None:
        """Task 5.4 (the schedule). `module`'s forward is over (a forward hook; `output` is what it
        returned). Contract: from here until backward reaches the module, its units hold no
        storage (during forward only the root unit and the running module are gathered), and
        when backward reaches it (its output's gradient is being computed) `_pre_backward` runs
        for it, with its sends counted (wrap the call in `self._counted(fn, *args)`), before
        autograd reads its parameters. How you learn that backward reached the module is your
        design (tensor hooks on the output, module backward hooks...); `_tensors(output)` lists
        the tensors inside an output. No backward follows a forward under `torch.no_grad()`.
        Graded: stage 3 equals one process, the bytes gathered at each module's forward, the
        bytes held after a step, and 3Ψ'(N-1)/N elements sent per step (ZeRO §7.2.3).
        """
        # BEGIN SOLUTION
        for unit in self._units_of[module]:
            self.free(unit)
        if torch.is_grad_enabled():  # gather again when the gradient reaches this module's output
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._counted, self._pre_backward, module))
        # END SOLUTION

    def _pre_backward(self, module: nn.Module, _grad: torch.Tensor | None = None) -> None:
        """Task 5.4 (the schedule). Backward has reached `module` (possibly more than once: once per
        output tensor). Contract: tell the engine that backward has started (`self._on_backward()`,
        which it needs to finish the step) and make the module's units usable again, as
        `_pre_forward` does for the forward (`_use` with this phase's name: it gathers, waits for a
        prefetch under way and starts the next ones in the backward's order). The engine frees
        each unit once its gradients are reduce-scattered."""
        # BEGIN SOLUTION
        self._on_backward()
        self._use(module, "backward")
        # END SOLUTION

    def finish_backward(self) -> None:
        """The backward is over: wait for the prefetches, fix the order they follow (the first
        backward recorded it) and free every unit still gathered (prefetched ones included)."""
        self._drain()
        self._recording = False
        for units in self._units_of.values():
            for unit in units:
                if unit.gathered:
                    self.free(unit)

    # -------------------------------------------------------------- prefetch

    def _use(self, module: nn.Module, phase: str) -> None:
        """Gather `module`'s units (waiting for a prefetch already under way), then start the
        gathers of the modules that come next in the recorded `phase` order."""
        order = self._order[phase]
        if self._recording and module not in order:
            order.append(module)
        for unit in self._units_of[module]:
            self._wait(unit)
            self.gather(unit)
        if self._comm is not None and not self._recording:
            for upcoming in order[order.index(module) + 1:]:
                for unit in self._units_of[upcoming]:
                    if len(self._inflight) >= self.prefetch:
                        return
                    if not unit.gathered and id(unit) not in self._inflight:
                        self._inflight[id(unit)] = self._comm.submit(functools.partial(self._prefetch_job, unit))

    def _prefetch_job(self, unit: FlatUnit, group: Any) -> CommStats:
        """On the communication thread: gather `unit` on the thread's group; return what it sent."""
        with comm_counter(this_thread=True) as stats:
            self.gather(unit, group)
        return stats

    def _wait(self, unit: FlatUnit) -> None:
        """If `unit` is being gathered on the thread, wait for it and count its bytes as training's."""
        future = self._inflight.pop(id(unit), None)
        if future is not None:
            stats = future.wait()  # re-raises the thread's exception here
            self.sent.bytes_sent += stats.bytes_sent
            self.sent.messages += stats.messages

    def _drain(self) -> None:
        for units in self._units_of.values():
            for unit in units:
                self._wait(unit)

    def close(self) -> None:
        """Stop the prefetch thread and destroy its process group (collective; a no-op without prefetch)."""
        if self._comm is not None:
            self._drain()
            self._comm.close()
            self._comm = None


def _tensors(output: Any) -> Iterator[torch.Tensor]:
    """The tensors inside a module's output (a tensor, or tuples / lists / dicts of them)."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors(item)
