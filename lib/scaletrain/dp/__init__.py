"""Data parallelism by hand: the baseline, buckets, overlap with backward and accumulation.

    NaiveDataParallel(module)                     one allreduce per parameter after backward (naive.py)
    DataParallel(module, bucket_cap_mb=25,        buckets + hooks that launch each bucket's allreduce
                 group=None, allreduce="ring")    during backward; no_sync() for accumulation
    assign_buckets(params, cap_bytes)             reverse-order greedy bucket assignment (bucket.py)
    RingAllreduceThread / torch_allreduce         asynchronous allreduce backends (async_allreduce.py)
    Trace, plot_timeline                          timestamps of gradients, launches, completions

Seminar notes, "Data parallel"; Li et al., 2020 (PyTorch DDP). Assignment a3, notebook 03.
"""

from scaletrain.dp.async_allreduce import RingAllreduceThread, make_allreduce, torch_allreduce
from scaletrain.dp.bucket import Bucket, assign_buckets
from scaletrain.dp.data_parallel import DataParallel
from scaletrain.dp.naive import NaiveDataParallel, broadcast_module
from scaletrain.dp.trace import Trace, plot_timeline

__all__ = ["DataParallel", "NaiveDataParallel", "broadcast_module", "assign_buckets", "Bucket",
           "RingAllreduceThread", "torch_allreduce", "make_allreduce", "Trace", "plot_timeline"]
