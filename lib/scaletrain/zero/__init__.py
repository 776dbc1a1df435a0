"""ZeRO-DP stages 0-3: shard optimizer state, gradients and parameters across data-parallel ranks.

    from scaletrain.zero import ZeRO
    zero = ZeRO(model, torch.optim.AdamW, stage=2, lr=1e-3)     # inside scaletrain.launch.spawn
    zero.zero_grad(); model(x)[1].backward(); zero.step()
    zero.memory_report()    # bytes held now: params, grads, optimizer state, padding
    zero.comm_report()      # bytes sent, next to 2Ψ'(N-1)/N (stages 0-2) or 3Ψ'(N-1)/N (stage 3)
    ckpt = zero.state_dict()  # full, unpadded, on rank 0; load_state_dict re-shards at any N

layout.py: flat buffers and units; engine.py: the stages (assignment a5); report.py: measured vs
formula; checkpoint.py: world-size-independent checkpoints; benchmark.py: `python -m
scaletrain.bench zero` against torch's ZeroRedundancyOptimizer and FSDP2.
"""

from scaletrain.zero.engine import STAGES, ZeRO, shard_of, unshard
from scaletrain.zero.layout import FlatUnit
from scaletrain.zero.report import CommReport, MemoryReport, expected_comm, expected_memory

__all__ = ["ZeRO", "STAGES", "shard_of", "unshard", "FlatUnit", "MemoryReport", "CommReport",
           "expected_memory", "expected_comm"]
