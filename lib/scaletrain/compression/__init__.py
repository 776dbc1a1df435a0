"""Communication-efficient training: gradient compression with error feedback, and LAMB.

    PowerSGD(rank=r, group=None)            rank-r power-iteration compression + error feedback (powersgd.py)
    OneBitEF(group=None, chunk_numel=None)  1 bit + a scale per chunk, error feedback (onebit.py)
    compressed_data_parallel(module, hook)  DataParallel whose buckets are synchronized by a hook (hook.py)
    LAMB(params, lr, ...)                   Adam with a per-layer trust ratio (lamb.py)
    OneBitAdam(params, warmup_steps=T_w)    Adam warm-up, then frozen v and 1-bit momentum (onebit_adam.py)
    compressed_allreduce(x, state)          1-bit allreduce, worker + server error feedback (onebit_adam.py)

Seminar notes §1.2.8 ("Communication efficient optimizers"); `additional-techniques.md` §3
("1-Bit Compressive Optimizers"). Benchmark: `python -m scaletrain.bench compression`.
"""

from scaletrain.compression.hook import CompressedAllreduce, CompressionHook, compressed_data_parallel
from scaletrain.compression.lamb import LAMB
from scaletrain.compression.onebit import OneBitEF, onebit_bytes, pack_signs, unpack_signs
from scaletrain.compression.onebit_adam import (CompressedAllreduceState, OneBitAdam, compressed_allreduce,
                                                compressed_allreduce_bytes)
from scaletrain.compression.powersgd import PowerSGD, orthogonalize, powersgd_payloads, should_compress

__all__ = ["PowerSGD", "OneBitEF", "LAMB", "CompressedAllreduce", "CompressionHook", "compressed_data_parallel",
           "orthogonalize", "should_compress", "powersgd_payloads", "onebit_bytes", "pack_signs", "unpack_signs",
           "OneBitAdam", "compressed_allreduce", "compressed_allreduce_bytes", "CompressedAllreduceState"]
