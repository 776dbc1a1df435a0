"""ZeRO-DP stages 0-3: shard optimizer state, gradients and parameters across data-parallel ranks.

    from scaletrain.zero import ZeRO
    zero = ZeRO(model, optimizer_class=torch.optim.AdamW, stage=2, lr=1e-3)  # inside scaletrain.launch.spawn
    zero.zero_grad(); model(x)[1].backward(); zero.step()   # a torch.optim.Optimizer: LR schedulers work
    zero.memory_report()    # bytes held now: params, grads, optimizer state, padding
    zero.comm_report()      # bytes sent, next to 2Ψ'(N-1)/N (stages 0-2) or 3Ψ'(N-1)/N (stage 3)
    zero.state_dict()       # torch's optimizer state_dict, whole, on every rank
    ckpt = zero.full_state_dict()  # model + optimizer, unpadded, on rank 0; reloads at any N

stages.py: what each stage shards and sends; layout.py: flat buffers and units; engine.py: the
stages (assignment a5); stage3.py: when stage 3 gathers, frees and prefetches; report.py: measured vs formula; checkpoint.py: world-size-independent
checkpoints; demo.py: notebook 05's measurements; benchmark.py: `python -m scaletrain.bench zero`
against torch's ZeroRedundancyOptimizer and FSDP2.
"""

from scaletrain.zero.engine import ZeRO, shard_of, unshard
from scaletrain.zero.layout import FlatUnit
from scaletrain.zero.report import CommReport, MemoryReport, expected_comm, expected_memory
from scaletrain.zero.stages import STAGES, StageFacts, stage_facts

__all__ = ["ZeRO", "STAGES", "StageFacts", "stage_facts", "shard_of", "unshard", "FlatUnit", "MemoryReport",
           "CommReport", "expected_memory", "expected_comm"]
