"""Inference of the trained model (module 12): the decoder cache, search, quantization, distillation, pruning.

Seeds: the LightSeq lecture's inference half (`accelerating-transformer-training-lecture.md`, "Fast
Inference for Transformer": the decoder cache, beam search with the cache refreshed by beam id, the
hierarchical auto-regressive search that retrieves candidates by group maxima and re-ranks only
those; Wang et al., LightSeq, NAACL 2021) and the seminar notes' "Inference optimizations"
(`large-scale-dl-optimizations-seminar.md` §2.1 scale, zero point, calibration, granularity;
§4.1.2 Q-BERT's group-wise quantization, Shen et al. 2020; §2.2 knowledge distillation, Hinton et al.
2015; §2.3 magnitude and structured pruning, Han et al. 2015).

One idea per file, in the order a request meets them:

    kv_cache.py       KVCache: every layer's k, v; 2·L·b·s·h·bytes; reorder by beam
    decode.py         prefill + one cached token per step for scaletrain.models.GPT; the uncached baseline
    sampling.py       greedy, top-k, top-p
    beam.py           beam search with the cache re-indexed; exhaustive search, its reference
    rerank.py         retrieve and re-rank (LightSeq) in torch
    rerank_triton.py  its Triton launcher (kernel: kernels/retrieve_rerank_triton.py)
    quant.py          symmetric/asymmetric, per-tensor/channel/group, min-max/percentile; fake quantization
    quant_linear.py   real int8 weights with the scales applied in the matmul; a quantized GPT
    distill.py        soft targets: α·T²·KL(p_t ‖ p_s) + (1 − α)·CE; the loop that distils or trains
    prune.py          magnitude pruning, unstructured (global, per layer) and by output row, as masks
    demo.py, benchmark.py   notebook 12's helpers, `python -m scaletrain.bench infer`
"""

from scaletrain.infer.beam import beam_search, exhaustive_search, flat_topk
from scaletrain.infer.decode import forward_cached, generate, generate_uncached
from scaletrain.infer.distill import distillation_loss, fit
from scaletrain.infer.kv_cache import KVCache, cache_bytes
from scaletrain.infer.prune import block_linears, magnitude_masks, prune, row_masks, zero_fraction
from scaletrain.infer.quant import QuantSpec, Quantized, dequantize, fake_quant, quantize
from scaletrain.infer.quant_linear import QuantLinear, packed_bytes, quantize_model
from scaletrain.infer.rerank import beam_topk, candidates, retrieve_rerank, rough_threshold
from scaletrain.infer.rerank_triton import retrieve_rerank_triton
from scaletrain.infer.sampling import greedy, sampler, top_k_filter, top_p_filter

__all__ = ["beam_search", "exhaustive_search", "flat_topk", "forward_cached", "generate", "generate_uncached",
           "distillation_loss", "fit", "KVCache", "cache_bytes", "block_linears", "magnitude_masks", "prune",
           "row_masks", "zero_fraction", "QuantSpec", "Quantized", "dequantize", "fake_quant", "quantize",
           "QuantLinear", "packed_bytes", "quantize_model", "beam_topk", "candidates", "retrieve_rerank",
           "retrieve_rerank_triton", "rough_threshold", "greedy", "sampler", "top_k_filter", "top_p_filter"]
