"""Published runs the planner is held against: Narayanan et al. 2021, Table 1 (A100 80GB, Selene).

"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21), §5.1,
Table 1: GPT models with s = 2048, V = 51200, mixed precision, full activation recomputation,
weak-scaled from 1.7B to 1T parameters; "achieved teraFLOP/s per GPU" is eq. (3) over the
measured iteration time (communication, data loading and the optimizer included). The rows were
checked against an independent transcription of the table (SotaroKaneda/MLCarbon,
data/megatron_table.csv). The first seven rows (up to 145.6B) are the only ones the efficiency
fit may see (`calibrate.FIT_ROWS`); the three largest are held out to test the planner beyond them.

Also from the paper's text (§5.1, "Estimating end-to-end training time"): GPT-3 175B on 1024
A100s at batch 1536 reached 140 teraFLOP/s per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.plan.specs import ModelSpec

__all__ = ["PublishedRun", "TABLE1", "FIT_ROWS", "GPT3_175B", "GPT3_175B_1024", "MODELS", "BATCHES", "SEQ", "VOCAB",
           "table1_model"]

SEQ, VOCAB = 2048, 51200


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    params_b: float        # billions of parameters, as printed
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops_per_gpu: float  # achieved teraFLOP/s per GPU

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def model(self) -> ModelSpec:
        return ModelSpec(layers=self.layers, hidden=self.hidden, heads=self.heads, seq=SEQ, vocab=VOCAB,
                         name=f"{self.params_b:g}B")


#              params  heads hidden layers  t   p   GPUs  batch  TFLOP/s
_ROWS = [(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
         (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
         (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
         (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
         (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
         (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
         (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
         (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
         (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
         (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163)]
_FIELDS = ("params_b", "heads", "hidden", "layers", "tp", "pp", "gpus", "batch", "tflops_per_gpu")
TABLE1 = tuple(PublishedRun(**dict(zip(_FIELDS, row))) for row in _ROWS)
FIT_ROWS = 7  # the efficiency fit sees TABLE1[:FIT_ROWS] only

GPT3_175B = ModelSpec(layers=96, hidden=12288, heads=96, seq=SEQ, vocab=VOCAB, name="175B")

# §5.1: "GPT-3 ... 1024 A100 GPUs using batch size 1536 ... 140 teraFLOP/s per GPU" (held out)
GPT3_175B_1024 = dict(gpus=1024, batch=1536, tflops_per_gpu=140.0)

# --model names for the CLI: Table 1's models by their size, and GPT-3; their published batch
MODELS = {run.model.name: run.model for run in TABLE1} | {"175B": GPT3_175B}
BATCHES = {run.model.name: run.batch for run in TABLE1} | {"175B": GPT3_175B_1024["batch"]}


def table1_model(params_b: float) -> ModelSpec:
    """The Table 1 model with `params_b` billion parameters."""
    for run in TABLE1:
        if run.params_b == params_b:
            return run.model
    raise KeyError(f"no Table 1 row of {params_b}B; rows: {', '.join(f'{r.params_b:g}' for r in TABLE1)}")
