"""Mixed precision by hand: fp16/bf16 models with fp32 master weights and dynamic loss scaling.

    from scaletrain.precision import MixedPrecision, DynamicLossScaler
    mp = MixedPrecision(model, torch.optim.AdamW, dtype=torch.float16, lr=1e-3)
    mp.backward(mp.model(idx, targets)[1]); mp.step()      # skipped (False) on overflow

scaler.py: the loss scale and its update rule (assignment a7, task 7.1), equal to
torch.amp.GradScaler's; master.py: the 16-bit model + fp32 master copy; underflow.py: how much
of a real gradient fp16 loses with and without scaling, and bf16. Benchmark:
`python -m scaletrain.bench memory` runs this beside torch.amp autocast + GradScaler.
"""

from scaletrain.precision.master import HALF_DTYPES, MixedPrecision
from scaletrain.precision.scaler import DynamicLossScaler, to_float32
from scaletrain.precision.underflow import CastReport, cast_report, gradients, half_backward_report

__all__ = ["DynamicLossScaler", "to_float32", "MixedPrecision", "HALF_DTYPES", "CastReport", "cast_report",
           "gradients", "half_backward_report"]
