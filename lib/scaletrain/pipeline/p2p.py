"""Point-to-point transport of the pipeline executor: activations forward, gradients backward.

Every message is a `messages.Message`; its source and destination ranks follow from its stages
(stage s on rank s % p). Receives are posted with `irecv` in schedule order, ahead of the action
that needs them, and waited on just before it runs; sends are `isend`s that the rank does not
wait for until the end of the step, so a send never blocks (the dry run in `validate` assumes
exactly this). No tags: gloo and NCCL both match the messages of one (src, dst) pair in the order
they were posted, which is the rule `validate` checks. `batch_isend_irecv` is avoided: it has a
history of hangs on gloo (seen again in the course's runs with torch 2.13).

A message between two stages on the same rank (p = 1, or a test) never touches the network.

Shapes: a receiver must allocate its buffer before the data arrives, so `exchange_shapes` sends a
small header (dtype, ndim, sizes) along the stage chain once, before the first step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from scaletrain.pipeline.messages import Message
from scaletrain.pipeline.schedules import stage_rank

__all__ = ["StageComm"]

_WIRE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)
_MAX_DIMS = 6


class StageComm:
    """The isend/irecv side of one pp_rank; ranks are group ranks of `group`."""

    def __init__(self, *, group, pp_rank: int, p: int, device: torch.device = torch.device("cpu")):
        self.group, self.pp_rank, self.p, self.device = group, pp_rank, p, device  # NCCL: buffers on the GPU
        self._posted: dict[Message, tuple] = {}   # Message -> (work, buffer)
        self._local: dict[Message, torch.Tensor] = {}
        self._sends: list[tuple] = []             # (work, tensor): the tensor must outlive the send

    def src_rank(self, msg: Message) -> int:
        return stage_rank(msg.src_stage, self.p)

    def dst_rank(self, msg: Message) -> int:
        return stage_rank(msg.dst_stage, self.p)

    def post_recv(self, msg: Message, shape: torch.Size, dtype: torch.dtype) -> None:
        """Start receiving `msg` (idempotent); a same-rank message needs nothing."""
        if msg in self._posted or self.src_rank(msg) == self.pp_rank:
            return
        buffer = torch.empty(shape, dtype=dtype, device=self.device)
        work = dist.irecv(buffer, group=self.group, group_src=self.src_rank(msg))
        self._posted[msg] = (work, buffer)

    def wait_recv(self, msg: Message, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        if self.src_rank(msg) == self.pp_rank:
            return self._local.pop(msg)
        self.post_recv(msg, shape, dtype)
        work, buffer = self._posted.pop(msg)
        work.wait()
        return buffer

    def send(self, msg: Message, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"StageComm.send: the {msg} is {tensor!r}, not a tensor (a gradient is None when "
                            "the stage input was not a leaf that requires grad: `received.requires_grad_()`)")
        tensor = tensor.detach()
        if self.dst_rank(msg) == self.pp_rank:
            self._local[msg] = tensor
            return
        tensor = tensor.contiguous()  # gloo sends contiguous buffers only
        self._sends.append((dist.isend(tensor, group=self.group, group_dst=self.dst_rank(msg)), tensor))

    def release_finished_sends(self) -> None:
        """Drop sends that completed, so their tensors can be freed before the step ends."""
        self._sends = [(w, t) for w, t in self._sends if not w.is_completed()]

    def wait_sends(self) -> None:
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()

    def exchange_shapes(self, stages, num_stages: int,
                        run_stage) -> dict[int, tuple[torch.Size, torch.dtype]]:
        """Learn the shape and dtype of every stage's output by walking the chain once.

        For each local stage s in model order: receive stage s-1's header (unless s = 0), call
        `run_stage(s, example_input)` for an example output, send its header to stage s+1's rank.
        Returns {stage: (shape, dtype)} for the outputs of local stages and of the stages
        feeding them. Local stages are visited in increasing order, which is the order the
        chain reaches this rank, so the walk cannot deadlock.
        """
        shapes: dict[int, tuple[torch.Size, torch.dtype]] = {}
        example = None
        for s in sorted(stages):
            if s > 0:
                if stage_rank(s - 1, self.p) == self.pp_rank:
                    shape, dtype = shapes[s - 1]
                else:
                    shape, dtype = self._recv_header(stage_rank(s - 1, self.p))
                    shapes[s - 1] = (shape, dtype)
                example = torch.zeros(shape, dtype=dtype, device=self.device)
            out = run_stage(s, example)
            shapes[s] = (out.shape, out.dtype)
            if s < num_stages - 1 and stage_rank(s + 1, self.p) != self.pp_rank:
                self._send_header(out, stage_rank(s + 1, self.p))
        return shapes

    def _send_header(self, tensor: torch.Tensor, dst: int) -> None:
        if tensor.dtype not in _WIRE_DTYPES or tensor.dim() > _MAX_DIMS:
            raise ValueError(f"PipelineExecutor: stage outputs must be one tensor of <= {_MAX_DIMS} dims "
                             f"with dtype in {_WIRE_DTYPES}, got {tensor.dtype} of shape {tuple(tensor.shape)}")
        header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64)
        header[0], header[1] = _WIRE_DTYPES.index(tensor.dtype), tensor.dim()
        header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        dist.isend(header.to(self.device), group=self.group, group_dst=dst).wait()

    def _recv_header(self, src: int) -> tuple[torch.Size, torch.dtype]:
        header = torch.empty(2 + _MAX_DIMS, dtype=torch.int64, device=self.device)
        dist.irecv(header, group=self.group, group_src=src).wait()
        header = header.cpu()
        ndim = int(header[1])
        return torch.Size(header[2:2 + ndim].tolist()), _WIRE_DTYPES[int(header[0])]
