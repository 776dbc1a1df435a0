"""a12's names: the submitted files, the reference each is released from, and every check's name."""

CACHE, BEAM, RERANK, QUANT = "infer_kv_cache.py", "infer_beam.py", "infer_rerank.py", "infer_quant.py"
SOURCES = {CACHE: "lib/scaletrain/infer/kv_cache.py", BEAM: "lib/scaletrain/infer/beam.py",
           RERANK: "lib/scaletrain/infer/rerank.py", QUANT: "lib/scaletrain/infer/quant.py"}
PROBE = "autograder.probes.a12_inference:"

C_CACHE = "cached decoding on your cache equals the full forward at every step (prefill, chunks, one token)"
C_REORDER = "reorder(parents): every row continues its parent's past (repeats and drops, every layer)"
C_BYTES = "bytes the cache holds (counted by the grader) equal 2·L·b·s·h·bytes, and nbytes reports them"
C_STEP = "a write copies only the new positions: elements written over a decoding stay O(n), not O(n²)"
C_BEAM = "beam search with k >= V^(n-1) equals exhaustive search (sequences and scores)"
C_BEAM_PRUNED = "beam search with pruning equals a cache-free beam search; scores are the sequences' log p"
C_BEAM_COST = "beam search runs k·(s0 + n - 1) positions through the model: one token per beam per step"
C_RR = "retrieve and re-rank: torch.topk's values, indices at those values (ties, -inf, k = groups = V)"
C_RR_BEAMS = "beam_topk: the top k of every beam's scores, flat indices beam·V + token"
C_RR_COUNT = "elements sorted (counted by the grader) under a quarter of the row: the candidates, not k·V"
C_Q_ERROR = "group-wise quantization: int8 codes in range, |w - r̂| <= S/2 <= the group's range / (2·steps)"
C_Q_GROUPS = "one scale and integer zero point per group: a group's codes depend on its own range only"
C_Q_MODEL = "the GPT's loss with int8 group-wise weights (QuantLinear on your codes) near the fp32 loss"
