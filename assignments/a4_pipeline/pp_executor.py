# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/pipeline/executor.py by `python -m autograder release`; edit the source.
"""Run any valid schedule across processes: one `PipelineExecutor` per pp_rank.

The executor is a loop over this rank's actions (schedules.py); each action is a local
computation bracketed by at most one receive and one send (messages.receives / messages.sends):

    F(s, i)  receive stage s-1's activation (unless s = 0), y = stage_s(x), send y to stage s+1;
             on the last stage y is the loss of microbatch i, scaled by 1/m
    B(s, i)  receive dL/dy from stage s+1 (unless s is last), backward, send dL/dx to stage s-1
    I(s, i)  like B but only dL/dx and the gradients of every parameterised module's output
             (torch.autograd.grad with retain_graph): the previous stage can go on at once
    W(s, i)  each module's weight gradient from its saved output gradient: a short, local
             backward that no other rank waits for (Qi et al., 2024, section 2)

With the loss scaled by 1/m, the gradients accumulated over the m microbatches equal those of one
process computing the mean loss of the whole batch. Activations of (s, i) are dropped as soon as
its last backward (B or W) ran; `peak_activation_bytes` counts what autograd saved for backward
(parameters excluded) over the in-flight microbatches, and `in_flight` / `activation_bytes` say
what is still held (nothing, after a step). `timeline` holds the real start and end of
every action of the last step (perf_counter seconds, the clock every process on a host shares):
a span is everything the rank does for the action except blocking in its receive, so the gaps
are the bubble (waiting for a message, including its transfer).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn

from scaletrain.pipeline.messages import receives, sends
from scaletrain.pipeline.p2p import StageComm
from scaletrain.pipeline.schedules import B, F, I, W, Action, Schedule, stages_of_rank
from scaletrain.pipeline.simulate import Span
from scaletrain.pipeline.validate import schedule_sizes, validate

__all__ = ["PipelineExecutor"]


class PipelineExecutor:
    """`stage_modules`: this rank's stages, {stage: module} or a list in model order (r, r+p, ...).
    `schedule`: the full dict[pp_rank, list[Action]] (validated here). `loss_fn(output, target)`:
    a mean-reduced loss for one microbatch. `group`: the pipeline process group (default: world).
    `recv_window`: how many actions ahead receives are posted (in schedule order, so the order on
    every channel is unchanged); None: every receive of the step, at its start. Posting early
    costs one buffer per posted message (stage-boundary tensors only, not what autograd saves)
    and saves a round trip: gloo writes a message as soon as it is sent only when its receive is
    already posted. On 2 CPU ranks, 1 action ahead left 26-47 ms of idle time per 1F1B step,
    every receive posted 23-25 ms.
    """

    def __init__(self, stage_modules, *, schedule: Schedule, loss_fn, group=None, recv_window: int | None = None):
        self.group = group
        self.pp_rank, p = dist.get_rank(group), dist.get_world_size(group)
        if len(schedule) != p:
            raise ValueError(f"PipelineExecutor: the schedule has {len(schedule)} ranks, the group has {p}")
        _, self.m, self.v = schedule_sizes(schedule)
        validate(schedule, p, self.m, self.v)  # a bad schedule fails here, before it can hang
        self.p, self.num_stages = p, p * self.v
        self.actions: list[Action] = list(schedule[self.pp_rank])
        expected = stages_of_rank(self.pp_rank, p, self.v)
        if not isinstance(stage_modules, Mapping):
            stage_modules = dict(zip(expected, stage_modules))
        if sorted(stage_modules) != expected:
            raise ValueError(f"PipelineExecutor: pp_rank {self.pp_rank} holds stages {expected} "
                             f"(stage s is on rank s % p), got modules for {sorted(stage_modules)}")
        self.stages: dict[int, nn.Module] = dict(stage_modules)
        self.loss_fn = loss_fn
        if recv_window is not None and (not isinstance(recv_window, int) or recv_window < 1):
            raise ValueError(f"PipelineExecutor: recv_window must be an int >= 1 or None, got {recv_window!r}")
        self.recv_window = len(self.actions) if recv_window is None else recv_window
        self.is_first_stage = 0 in self.stages
        self.is_last_stage = self.num_stages - 1 in self.stages
        params = [q for stage in self.stages.values() for q in stage.parameters()]
        device = params[0].device if params else torch.device("cpu")
        self.comm = StageComm(group=group, pp_rank=self.pp_rank, p=p, device=device)
        # (stage, microbatch) pairs whose backward is split into I and W need their modules' outputs
        self._split = {(a.stage, a.microbatch) for a in self.actions if a.kind == I}
        self._outputs = _ParamOutputs(self.stages) if self._split else None
        self._memory = _ActivationBytes(self.stages)
        self._shapes: dict | None = None  # stage -> (shape, dtype) of its output, learnt at step 1
        self._input_shape = None
        # one step's state, emptied when the next one starts
        self._inputs: list[torch.Tensor] | None = None    # microbatches, on the first stage's rank
        self._targets: list[torch.Tensor] | None = None   # microbatches, on the last stage's rank
        self._stash: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (s, i) -> (input, output)
        self._weight_work: dict[tuple[int, int], list] = {}  # (s, i) -> what its W still has to run
        self.losses: dict[int, float] = {}
        self.timeline: list[Span] = []

    @property
    def peak_activation_bytes(self) -> int:
        return self._memory.peak

    @property
    def activation_bytes(self) -> int:
        """Bytes autograd holds for the (stage, microbatch) pairs still in flight; 0 after a step."""
        return self._memory.current

    @property
    def in_flight(self) -> list[tuple[int, int]]:
        """The (stage, microbatch) pairs whose activations or weight-gradient work this rank still
        holds: those forwarded and not yet through their last backward. Empty after a step."""
        held = set(self._stash) | set(self._weight_work) | (self._outputs.held() if self._outputs else set())
        return sorted(held)

    def step(self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None) -> list[float] | None:
        """One pipelined forward+backward over m microbatches; gradients accumulate in `.grad`.

        `inputs` (on the rank holding stage 0) and `targets` (on the rank holding the last stage):
        a batch split into m equal microbatches along dim 0, or a list of m tensors. Returns the
        m microbatch losses on the last stage's rank, None elsewhere.
        """
        self._inputs = self._microbatches(inputs, "inputs") if self.is_first_stage else None
        self._targets = self._microbatches(targets, "targets") if self.is_last_stage else None
        if self._shapes is None:
            self._shapes = self.comm.exchange_shapes(self.stages, self.num_stages, self._example_forward)
        self._stash.clear()
        self._weight_work.clear()
        self.losses.clear()
        self.timeline = []
        for k in range(self.recv_window):  # from action 0: a channel's receives are matched in posting order
            self._post_receive(k)
        for k, action in enumerate(self.actions):
            received = self._receive(action)      # time blocked here is bubble: the span starts after it
            start = time.perf_counter()
            self._post_receive(k + self.recv_window)  # keep `recv_window` receives posted ahead
            with self._memory.track(action), self._record_outputs(action):
                self._run(action, received)
            self.comm.release_finished_sends()
            self.timeline.append(Span(rank=self.pp_rank, action=action, start=start, end=time.perf_counter()))
        self.comm.wait_sends()
        return [self.losses[i] for i in range(self.m)] if self.is_last_stage else None

    def _run(self, action: Action, received: torch.Tensor | None) -> None:
        """Run one action of kind F, B, I or W on (stage, microbatch); `received` is the tensor
        its message brought (see `_receive`), None when it receives nothing. I and W are
        `_backward_input` and `_backward_weight` (given)."""
        raise NotImplementedError('a4 task 4.4: implement `_run` (see assignments/a4_pipeline/README.md)')

    def _forward(self, s: int, i: int, received: torch.Tensor | None) -> None:
        """F(s, i). `received`: stage s-1's output for microbatch i (None on stage 0, whose input is
        `self._inputs[i]`). Contract: `self.stages[s]` runs on the input; a middle stage's output
        goes to the next stage through `self.comm.send`, addressed by the message `sends` gives
        for this action; on the last stage the output becomes microbatch i's loss
        (`self.loss_fn` against `self._targets[i]`), its value recorded in `self.losses[i]`
        (a float). `self._stash[(s, i)]` keeps (input, output) for the backward, which must be
        able to send the input's gradient back. Graded: the gradients accumulated over the m
        microbatches equal one process's on the whole batch's mean loss (module docstring).
        """
        raise NotImplementedError('a4 task 4.4: implement `_forward` (see assignments/a4_pipeline/README.md)')

    def _backward(self, s: int, i: int, received: torch.Tensor | None) -> None:
        """B(s, i). `received`: dL/dy of this stage's output (None on the last stage, where y is
        the loss). Contract: the weight gradients of stage s accumulate in `.grad`; dL/dx of the
        stage's input goes to the previous stage through `self.comm.send`, addressed by the
        message `sends` gives for this action (stage 0's input is data: nothing goes back);
        the stash entry of (s, i) is gone afterwards, so its activations are freed now (graded:
        `in_flight` is empty after a step and never holds more than the schedule's peak).
        """
        raise NotImplementedError('a4 task 4.4: implement `_backward` (see assignments/a4_pipeline/README.md)')

    def _backward_input(self, s: int, i: int, received: torch.Tensor | None) -> None:
        x, y = self._stash[(s, i)]
        recorded = self._outputs.pop((s, i))
        wrt = ([x] if s > 0 else []) + [t for _, outs in recorded for t in outs]
        # one traversal computes dL/dx and dL/d(module output) only: no weight-gradient kernels
        grads = list(torch.autograd.grad(y, wrt, grad_outputs=received, retain_graph=True, allow_unused=True))
        if s > 0:
            self.comm.send(sends(Action(s, I, i), self.num_stages), grads.pop(0))
        work = []
        for params, outs in recorded:
            outs_grads = [(t, grads.pop(0)) for t in outs]
            work.append((params, [(t, g) for t, g in outs_grads if g is not None]))
        self._weight_work[(s, i)] = work

    def _backward_weight(self, s: int, i: int) -> None:
        for params, outs_grads in self._weight_work.pop((s, i)):
            if outs_grads:  # from the module's own output to its own parameters: nothing upstream
                torch.autograd.backward([t for t, _ in outs_grads], [g for _, g in outs_grads], inputs=params)
        del self._stash[(s, i)]

    def _receive(self, action: Action) -> torch.Tensor | None:
        msg = receives(action, self.num_stages)
        return None if msg is None else self.comm.wait_recv(msg, *self._message_shape(msg))

    def _post_receive(self, k: int) -> None:
        msg = receives(self.actions[k], self.num_stages) if k < len(self.actions) else None
        if msg is not None:
            self.comm.post_recv(msg, *self._message_shape(msg))

    def _message_shape(self, msg):
        # an activation has the shape of its sender's output, a gradient that of its receiver's
        return self._shapes[msg.src_stage if msg.kind == "activation" else msg.dst_stage]

    def _example_forward(self, s: int, example: torch.Tensor | None) -> torch.Tensor:
        with torch.no_grad():
            return self.stages[s](self._inputs[0] if s == 0 else example)

    def _microbatches(self, batch, name: str) -> list[torch.Tensor]:
        if batch is None:
            raise ValueError(f"PipelineExecutor.step: pp_rank {self.pp_rank} holds stage "
                             f"{0 if name == 'inputs' else self.num_stages - 1}, so it needs {name}=")
        if isinstance(batch, torch.Tensor):
            if batch.shape[0] % self.m:
                raise ValueError(f"PipelineExecutor.step: {name} batch {batch.shape[0]} is not divisible "
                                 f"by m={self.m}; pass a multiple of m or a list of m microbatches")
            batch = list(batch.split(batch.shape[0] // self.m))
        if len(batch) != self.m:
            raise ValueError(f"PipelineExecutor.step: expected {self.m} {name} microbatches, got {len(batch)}")
        if name == "inputs":
            shape = tuple(batch[0].shape)
            if any(tuple(b.shape) != shape for b in batch) or self._input_shape not in (None, shape):
                raise ValueError(f"PipelineExecutor.step: every microbatch must have the shape of the first "
                                 f"step's, {self._input_shape or shape} (receive buffers are sized once)")
            self._input_shape = shape
        return batch

    @contextmanager
    def _record_outputs(self, action: Action):
        if action.kind != F or (action.stage, action.microbatch) not in self._split:
            yield
            return
        with self._outputs.record((action.stage, action.microbatch)):
            yield


class _ParamOutputs:
    """Forward hooks that keep, per (stage, microbatch), the output of every module that owns
    parameters: I asks autograd for the gradients of these outputs, W turns them into weight
    gradients module by module. Each such module must run once per stage forward (a module
    called twice would get its weight gradient twice)."""

    def __init__(self, stages: dict[int, nn.Module]):
        self._current: list | None = None
        self._seen: set[int] = set()
        self._saved: dict[tuple[int, int], list] = {}
        for stage in stages.values():
            for module in stage.modules():
                params = [q for q in module.parameters(recurse=False) if q.requires_grad]
                if params:
                    module.register_forward_hook(self._hook(module, params))

    def _hook(self, module: nn.Module, params: list):
        def hook(_module, _args, output):
            if self._current is None:
                return
            if id(module) in self._seen:
                raise RuntimeError(f"PipelineExecutor: {type(module).__name__} ran twice in one stage forward; "
                                   "the I/W split needs each parameterised module once per forward (use B)")
            self._seen.add(id(module))
            outs = [output] if isinstance(output, torch.Tensor) else [o for o in output if isinstance(o, torch.Tensor)]
            self._current.append((params, [o for o in outs if o.requires_grad]))
        return hook

    @contextmanager
    def record(self, key: tuple[int, int]):
        self._current, self._seen = [], set()
        try:
            yield
            self._saved[key] = [(params, outs) for params, outs in self._current if outs]
        finally:
            self._current = None

    def pop(self, key: tuple[int, int]) -> list:
        return self._saved.pop(key)

    def held(self) -> set[tuple[int, int]]:
        return set(self._saved)


class _ActivationBytes:
    """Bytes autograd saves for backward per in-flight (stage, microbatch), parameters excluded,
    counted by a saved_tensors_hooks pack hook during F and released by the last backward."""

    def __init__(self, stages: dict[int, nn.Module]):
        self._params = {q.data_ptr() for stage in stages.values() for q in stage.parameters()}
        self._live: dict[tuple[int, int], int] = {}
        self.current = self.peak = 0

    @contextmanager
    def track(self, action: Action):
        key = (action.stage, action.microbatch)
        if action.kind != F:
            yield
            if action.kind in (B, W):
                self.current -= self._live.pop(key)
            return
        seen: dict[tuple[int, int], int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.data_ptr() not in self._params:  # a weight, or a view of one (W.t() in addmm)
                seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self._live[key] = sum(seen.values())
        self.current += self._live[key]
        self.peak = max(self.peak, self.current)
