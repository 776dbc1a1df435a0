# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/dp/data_parallel.py by `python -m autograder release`; edit the source.
"""DataParallel: gradient buckets, allreduce overlapped with backward, and no_sync accumulation.

The three ideas of PyTorch DDP (Li et al., 2020, "PyTorch Distributed", §3.2; seminar notes,
"Data parallel"; techniques notes, "Data Parallelism" and "Gradient Accumulation"):

1. Bucketing (bucket.py): gradients are packed into flat buffers of about `bucket_cap_mb`, one
   allreduce per bucket instead of one per parameter, so the latency α is paid per bucket.
2. Overlap: a post-accumulate-grad hook on every parameter copies its gradient into its bucket
   slot the moment autograd has finished accumulating it; when a bucket's last gradient arrives,
   the bucket's allreduce is launched asynchronously while backward goes on with earlier layers.
   Buckets launch strictly in index order (a full bucket waits for the ones before it), so every
   rank issues the same collectives in the same order even if gradients arrive in a different
   order (torch DDP's reducer does the same).
3. Accumulation: inside `no_sync()` the hooks do nothing, gradients accumulate locally in `.grad`;
   the first backward outside it reduces the sum of all micro-steps once. Effective batch =
   p ranks × micro-batch × micro-steps.

A training step, on every rank (`x_local`: this rank's slice of the global batch):

    model = DataParallel(GPT(cfg), bucket_cap_mb=1)
    loss = model(x_local, y_local)[1]
    loss.backward()                           # hooks launch bucket allreduces during backward
    model.finish_gradient_synchronization()   # wait; every .grad is now the mean over ranks
    optimizer.step(); optimizer.zero_grad()

Edge cases and what happens:
  * frozen parameters (requires_grad=False) get no bucket and no hook; their .grad stays None.
  * tied parameters (the GPT's wte / lm_head) are one Parameter: `module.parameters()` yields it
    once, so it has one slot and one hook, which autograd runs once per backward, after both uses
    have been summed into .grad.
  * a parameter with no gradient in a step (unused on this rank) never fires its hook, so its
    bucket cannot launch during backward; finish_gradient_synchronization() then fills its slot
    from .grad (zeros when None) and launches the remaining buckets in order: no hang, and the
    unused rank contributes zeros, so a parameter used on some ranks gets the mean with zeros.
    One that no rank used keeps .grad = None, as with torch DDP's find_unused_parameters=True
    (which also spends one allreduce of a used-parameter map per step, naive.py): an optimizer
    then skips it, where a zero gradient would still move it (AdamW's weight decay, momentum).
  * a cap smaller than one parameter gives that parameter a bucket of its own; bucket_cap_mb=None
    puts every parameter into one bucket (one per dtype).
  * bucket assignment is fixed at construction, from registration order (torch DDP rebuilds its
    buckets once from the order gradients arrived in the first step; we do not).
  * parameters and buffers are broadcast from rank 0 once, at construction (torch DDP also
    re-broadcasts buffers before every forward).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from scaletrain.dp.async_allreduce import DEFAULT_ALLREDUCE, AsyncAllreduce, make_allreduce
from scaletrain.dp.bucket import Bucket, assign_buckets, bucket_cap_bytes
from scaletrain.dp.naive import Replicated
from scaletrain.dp.trace import Trace

__all__ = ["DataParallel"]


class DataParallel(Replicated):
    """Wrap `module` for data parallelism over the ranks of `group` (None: all ranks).

    Args (keyword-only after `module`):
        bucket_cap_mb: bucket capacity in MiB (torch DDP's default 25); > 0, or None for one bucket.
        group: the data-parallel process group; `dp_rank`, `dp_world_size` are within it.
        allreduce: "ring" (our ring on a communication thread), "torch" (dist.all_reduce with
            async_op=True) or a callable f(flat_tensor) -> handle with .wait() (async_allreduce.py).
        overlap: True launches buckets from gradient hooks during backward; False launches them
            all in finish_gradient_synchronization() (bucketing without overlap).
        timeout_s: how long finish waits for a bucket to be launched before raising TimeoutError.
        trace: a `Trace` to record gradient, launch and completion times in (trace.py), or None.
    """

    def __init__(self, module: nn.Module, *, bucket_cap_mb: float | None = 25.0, group: Any = None,
                 allreduce: str | AsyncAllreduce = DEFAULT_ALLREDUCE, overlap: bool = True,
                 timeout_s: float = 300.0, trace: Trace | None = None):
        cap_bytes = bucket_cap_bytes(bucket_cap_mb, list(module.parameters()))  # a bad cap: said first
        super().__init__(module, group)  # rank 0's weights everywhere, forward, no_sync (naive.py)
        self.timeout_s = timeout_s
        self.trace = trace
        params = self._params
        self._index = {p: i for i, p in enumerate(params)}
        self._names = {p: n for n, p in module.named_parameters()}
        self.buckets = [Bucket(index=b, params=[params[i] for i in members], trace=trace)
                        for b, members in enumerate(assign_buckets(params, cap_bytes))]
        self._slot = {p: (bucket, k) for bucket in self.buckets for k, p in enumerate(bucket.params)}
        self._next_bucket = 0  # buckets [0, _next_bucket) are launched this round
        self._allreduce, self._close_allreduce = make_allreduce(allreduce, group=group,
                                                                timeout_s=timeout_s)
        self._hooks: list[Any] = []
        if overlap:
            self._register_hooks()

    # ------------------------------------------------------------ task 3.2: sync after backward

    def _mark_ready(self, bucket: Bucket, k: int) -> None:
        """Parameter k's gradient has arrived: its slot of `bucket` holds it (zeros when its .grad
        is None) and the bucket's bookkeeping (`ready`, `pending`, bucket.py) says so.

        A slot that is already ready means a second backward ran before
        finish_gradient_synchronization(): raise RuntimeError saying to call finish after each
        synchronized backward, or to wrap the earlier micro-steps in no_sync().
        """
        raise NotImplementedError('a3 task 3.2: implement `_mark_ready` (see assignments/a3_data_parallel/README.md)')

    def _launch_ready_buckets(self) -> None:
        """Launch with `self._allreduce` every bucket that may start now, each once per round.

        Invariant graded (Li et al. 2020, §3.2.3 "Bucketing" and its ordering requirement): every
        rank starts the same allreduces in the same order whatever order its gradients arrive
        in, so a full bucket never overtakes an earlier one still waiting for a gradient;
        `self._next_bucket` stays the first bucket not launched this round.
        """
        raise NotImplementedError('a3 task 3.2: implement `_launch_ready_buckets` (see assignments/a3_data_parallel/README.md)')

    def finish_gradient_synchronization(self) -> None:
        """After backward: make every synchronized parameter's .grad the mean over the ranks.

        Graded: every bucket is launched (in order, as above) and waited on (`self.timeout_s`)
        exactly once per round, including buckets whose gradients never arrived (a parameter
        unused in this step, or every parameter when no hooks are registered: its slot counts
        as zeros); the allreduce sums, the .grad you leave is the mean (created when None); the
        buckets and `_next_bucket` are ready for the next round afterwards. Pitfall: a bucket one
        rank never launches hangs every other rank in its allreduce.
        Inside `no_sync()` it does nothing. After your part, a parameter that no rank used gets
        its .grad = None back (`_unused_to_none`, naive.py), as torch DDP leaves it.
        """
        if not self.require_backward_grad_sync:
            return
        used_here = self._used_here()  # before the slots are copied back: which .grad existed
        raise NotImplementedError('a3 task 3.2: implement `finish_gradient_synchronization` (see assignments/a3_data_parallel/README.md)')
        self._unused_to_none(used_here)

    # ------------------------------------------------------------ task 3.3: overlap with backward

    def _register_hooks(self) -> None:
        """Register `self._on_grad_ready` as a post-accumulate-grad hook
        (`Tensor.register_post_accumulate_grad_hook`) on every parameter that has a slot, and keep
        the returned handles in `self._hooks` (close() removes them)."""
        raise NotImplementedError('a3 task 3.3: implement `_register_hooks` (see assignments/a3_data_parallel/README.md)')

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        """Autograd calls this once per backward for `param`, after its .grad is final (a tied
        parameter's two uses are already summed).

        Outside no_sync(): mark the parameter's slot ready (`self._slot[param]` is its
        (bucket, k)) and launch whatever buckets are now ready. Inside no_sync(): do nothing,
        the gradient stays in .grad and accumulates there.
        """
        if self.trace is not None and self.require_backward_grad_sync:
            self.trace.record("grad", self._index[param])
        raise NotImplementedError('a3 task 3.3: implement `_on_grad_ready` (see assignments/a3_data_parallel/README.md)')

    def close(self) -> None:
        """Remove the hooks and stop the communication thread (for "ring")."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._close_allreduce()
