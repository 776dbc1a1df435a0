"""Published large training runs of 2021-2024 the planner is held against (`validate.py`).

Each record is what its paper printed: model, GPUs, parallel degrees, batch, and one measured
figure (an iteration time, or TFLOP/s per GPU counted the paper's way). What a paper left out
(the microbatch, the interleaving) the planner searches, as `calibrate.best_for_row` does for
Table 1. Which records the efficiency fits saw is marked (`fitted`): Table 1's rows 1-7 (A100) and
Llama 3's 8,192-GPU row (H100); everything else is held out.

Sources:
  [N21]  Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
         Using Megatron-LM", Table 1 and §5.1 (GPT-3 175B on 1024 GPUs), A100-80GB, TFLOP/s per
         GPU by eq. 3 (recompute counted).
  [K22]  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
         Table 3 (configurations) and Table 5 (iteration times, full recomputation vs sequence
         parallelism + selective recomputation), A100-80GB, a single pipeline (d = 1).
  [S22]  Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B",
         §2.3 / Table 1 (2240, 2800, 3360 GPUs; 60.1, 50.2, 44.4 s per iteration), A100-80GB,
         DeepSpeed's non-interleaved 1F1B pipeline, full recomputation.
  [L22]  Le Scao et al. 2022, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model",
         §3.4 (384 A100-80GB, t = 4, p = 12, d = 8, 156 TFLOP/s per GPU in Megatron-DeepSpeed's
         count, recompute included); ALiBi (no position table), tied embeddings, ZeRO-1, its
         70 layers split 5, 6 × 10, 5 with the embeddings on the end stages.
  [D24]  Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.2 and Table 4 (Llama 3 405B on
         8,192 and 16,384 H100s, BF16 model TFLOP/s per GPU), 126 layers on 16 stages with one
         layer fewer on the first and last, ZeRO-1-like sharding, flash attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scaletrain.plan.flops import iteration_flops, model_flops
from scaletrain.plan.model_spec import ModelSpec
from scaletrain.plan.published import GPT3_175B, GPT3_175B_1024, TABLE1, FIT_ROWS

__all__ = ["PublishedConfig", "PUBLISHED", "LLAMA2_7B", "LLAMA3_405B", "BLOOM_176B", "GPT3_FAMILY", "LLAMA_FAMILY"]

KINDS = ("hw_tflops", "model_tflops", "iteration_s")


@dataclass(frozen=True, kw_only=True)
class PublishedConfig:
    """One published run (module docstring). `pinned` fixes layout fields the paper states beyond
    t, c, p, d and B (recompute, zero, sequence_parallel, microbatch, interleave); `stages` is
    "even" or "balanced" (`stages.balanced_stages`)."""
    source: str
    model: ModelSpec
    cluster: str
    software: str
    gpus: int
    tp: int | None  # None: not published, searched
    pp: int | None
    batch: int
    value: float
    kind: str
    cp: int = 1
    stages: str = "even"
    pinned: dict = field(default_factory=dict)
    fitted: bool = False

    def __post_init__(self):
        if self.kind not in KINDS or self.gpus % ((self.tp or 1) * self.cp * (self.pp or 1)):
            raise ValueError(f"PublishedConfig {self.label}: kind in {KINDS}, t·c·p dividing the GPUs")

    @property
    def label(self) -> str:
        return f"{self.source} {self.model.name} {self.gpus}"

    def published_seconds(self, recompute: str = "full") -> float:
        """The iteration time the published figure implies (hardware TFLOP/s under the run's
        recompute, model TFLOP/s, or the time itself)."""
        if self.kind == "iteration_s":
            return self.value
        flops = (model_flops(self.model, self.batch) if self.kind == "model_tflops"
                 else iteration_flops(self.model, self.batch, recompute=self.pinned.get("recompute", recompute)))
        return flops / (self.value * 1e12 * self.gpus)


def _gpt(name: str, layers: int, hidden: int, heads: int, **kw) -> ModelSpec:
    return ModelSpec(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=51200, name=name, **kw)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> ModelSpec:
    return ModelSpec(layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=ffn, gated_ffn=True,
                     tied_embeddings=False, biases=False, learned_positions=False, seq=seq, vocab=vocab, name=name)


# presets: the GPT-3 family (Brown et al. 2020, Table 2.1) and the Llama family (Touvron et al.
# 2023 Table 1 / model cards; Dubey et al. 2024 Table 3)
GPT3_FAMILY = {m.name: m for m in (
    _gpt("GPT-3 1.3B", 24, 2048, 16), _gpt("GPT-3 6.7B", 32, 4096, 32), _gpt("GPT-3 13B", 40, 5120, 40),
    ModelSpec(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, name="GPT-3 175B"))}
LLAMA2_7B = _llama("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, 4096)
LLAMA_FAMILY = {m.name: m for m in (
    LLAMA2_7B, _llama("Llama-2-13B", 40, 5120, 40, 40, 13824, 32000, 4096),
    _llama("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, 4096),
    _llama("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, 8192),
    _llama("Llama-3-70B", 80, 8192, 64, 8, 28672, 128256, 8192),
    _llama("Llama-3-405B", 126, 16384, 128, 8, 53248, 128256, 8192))}
LLAMA3_405B = LLAMA_FAMILY["Llama-3-405B"]
BLOOM_176B = ModelSpec(layers=70, hidden=14336, heads=112, seq=2048, vocab=250880, learned_positions=False,
                       name="BLOOM-176B")

_2021 = dict(cluster="a100-80gb", software="megatron-2021", kind="hw_tflops")
_table1 = tuple(PublishedConfig(source="N21 T1", model=r.model, gpus=r.gpus, tp=r.tp, pp=r.pp, batch=r.batch,
                                value=r.tflops_per_gpu, fitted=i < FIT_ROWS, **_2021) for i, r in enumerate(TABLE1))
_gpt3_1024 = PublishedConfig(source="N21 §5.1", model=GPT3_175B, gpus=GPT3_175B_1024["gpus"], tp=None, pp=None,
                             batch=GPT3_175B_1024["batch"], value=GPT3_175B_1024["tflops_per_gpu"], **_2021)

_K22 = (("22B", 48, 6144, 64, 1, 8, 4, 4, 1.42, 1.10), ("175B", 96, 12288, 96, 8, 64, 64, 1, 18.13, 13.75),
        ("530B", 105, 20480, 128, 35, 280, 280, 1, 49.05, 37.83), ("1T", 128, 25600, 160, 64, 512, 512, 1, 94.42, 71.49))
_korthikanti = tuple(
    PublishedConfig(source=f"K22 T5 {how}", model=_gpt(name, l, h, a), gpus=n, tp=8, pp=p, batch=B, value=sec,
                    kind="iteration_s", cluster="a100-80gb", software="megatron-2022",
                    pinned=dict(microbatch=b, recompute=rc, sequence_parallel=sp))
    for name, l, h, a, p, n, B, b, full_s, present_s in _K22
    for how, sec, rc, sp in (("full", full_s, "full", False), ("sp+sel", present_s, "selective", True)))

_MT_NLG = _gpt("MT-NLG 530B", 105, 20480, 128)
_smith = tuple(PublishedConfig(source="S22", model=_MT_NLG, gpus=n, tp=8, pp=35, batch=1920, value=sec,
                               kind="iteration_s", cluster="a100-80gb", software="megatron-2021",
                               pinned=dict(microbatch=1, interleave=1))
               for n, sec in ((2240, 60.1), (2800, 50.2), (3360, 44.4)))

_bloom = PublishedConfig(source="L22 §3.4", model=BLOOM_176B, gpus=384, tp=4, pp=12, batch=2048, value=156.0,
                         kind="hw_tflops", cluster="a100-80gb", software="megatron-2022", stages="balanced",
                         pinned=dict(microbatch=2, recompute="full", sequence_parallel=False, zero=1))

_LONG = ModelSpec(**{**LLAMA3_405B.__dict__, "seq": 131072, "name": "Llama-3-405B 128K"})
_llama3 = tuple(PublishedConfig(source="D24 T4", model=m, gpus=n, tp=8, cp=c, pp=16, batch=B, value=tf,
                                kind="model_tflops", cluster="h100", software="megatron-2024", stages="balanced",
                                pinned=dict(microbatch=1), fitted=fit)
                for m, n, c, B, tf, fit in ((LLAMA3_405B, 8192, 1, 2048, 430.0, True),
                                            (LLAMA3_405B, 16384, 1, 2048, 400.0, False),
                                            (_LONG, 16384, 16, 128, 380.0, False)))

PUBLISHED: tuple[PublishedConfig, ...] = (*_table1, _gpt3_1024, *_korthikanti, *_smith, _bloom, *_llama3)
