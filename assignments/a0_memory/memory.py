# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/memory.py by `python -m autograder release`; edit the source.
"""Where the memory of training goes: parameters, gradients, optimizer state, activations; and FLOPs.

Pure arithmetic on integers (no torch), so it answers "does a 7.5B model fit?" instantly. The
matching *measurement* of a real step lives in `scaletrain.memory_measure`.

Sources (cited by title; formulas re-derived in the docstrings):
  * "Techniques for large-scale training" (course seed), section on memory estimation: the
    accounting Total = model + optimizer + gradients + activations, and the GPT-1 example.
  * Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    §4: activations per layer s·b·h·(34 + 5·a·s/h) bytes; with tensor parallelism t,
    s·b·h·(10 + 24/t + 5·a·s/(h·t)); full recomputation keeps 2·s·b·h per layer;
    §4.2.2 and Table 2: with sequence parallelism as well, s·b·h·(34/t + 5·a·s/(h·t)).
  * Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
    Models", §5: per-rank bytes (2 + 2 + K)·Ψ and its three sharded stages.
  * Kaplan et al. 2020 / PaLM appendix B: training FLOPs ≈ 6·N·D, model FLOPs utilization.

Notation: Ψ parameters, N ranks, s sequence length, b micro-batch size, h hidden size,
L layers, a attention heads, t tensor-parallel degree, V vocabulary. Bytes are exact ints;
1 MB = 10**6 B and 1 GB = 10**9 B, as in the seed and the ZeRO paper.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["PRECISIONS", "OPTIMIZERS", "GB", "MB", "MemoryBreakdown", "TrainingMemory",
           "gpt_num_params", "bytes_per_param", "activation_bytes", "sequence_parallel_activation_bytes",
           "zero_memory_per_rank",
           "training_flops", "mfu", "tiny_gpt_activation_bytes", "model_states_bytes",
           "training_memory", "GPT1", "seed_gpt1_example"]

PRECISIONS = ("fp32", "mixed")                         # mixed = 16-bit weights/grads + fp32 master
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd_momentum")
MB, GB = 10**6, 10**9


def _int(fn: str, name: str, value, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{fn}: {name} must be >= {minimum}, got {value}")
    return value


def _choice(fn: str, name: str, value, choices: tuple) -> str:
    if value not in choices:
        raise ValueError(f"{fn}: unknown {name} {value!r}; choose one of {', '.join(choices)}")
    return value


def _shape(fn: str, *, hidden: int, n_head: int, tp: int = 1) -> None:
    """Megatron's split: heads divide among the t tensor-parallel ranks, h divides among heads."""
    if hidden % n_head:
        raise ValueError(f"{fn}: hidden={hidden} must be divisible by n_head={n_head}")
    if n_head % tp:
        raise ValueError(f"{fn}: n_head={n_head} must be divisible by tp={tp} (heads are split across ranks)")


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Bytes of the model states on one rank: parameters, gradients, optimizer state.

    Under mixed precision `params` and `grads` are the 16-bit copies; the fp32 master weights
    belong to `optimizer` (the ZeRO paper's K).
    """
    params: int
    grads: int
    optimizer: int

    def __post_init__(self):
        for name in ("params", "grads", "optimizer"):
            _int("MemoryBreakdown", name, getattr(self, name), minimum=0)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


@dataclass(frozen=True, kw_only=True)
class TrainingMemory:
    """Model states plus activation bytes on one rank (no allocator overhead or workspace)."""
    states: MemoryBreakdown
    activations: int

    def __post_init__(self):
        _int("TrainingMemory", "activations", self.activations, minimum=0)

    @property
    def total(self) -> int:
        return self.states.total + self.activations


def gpt_num_params(*, vocab_size: int, block_size: int, n_layer: int, hidden: int,
                   tied_embeddings: bool = True) -> int:
    """Number of parameters of `scaletrain.models.GPT` (Task 0.1).

    Count every tensor of the model (biases and LayerNorm weights included):
      * token embedding V·h and learned position embedding block_size·h;
      * per layer: two LayerNorms (weight and bias each), the fused QKV projection h → 3h,
        the output projection h → h, the MLP h → 4h → h, every Linear with a bias;
      * the final LayerNorm 2h;
      * the output head h·V (no bias) only when `tied_embeddings=False`; tied, it *is* the
        token embedding, so it is counted once (GPT-2's weight tying).
    Example: the seed's GPT-1 (V=40512, block_size=512, L=12, h=768, untied) has
    147,675,648 parameters, which the seed rounds to "147m".
    """
    fn = "gpt_num_params"
    for name, v in (("vocab_size", vocab_size), ("block_size", block_size),
                    ("n_layer", n_layer), ("hidden", hidden)):
        _int(fn, name, v)
    h = hidden
    raise NotImplementedError('a0 task 0.1: implement `gpt_num_params` (see assignments/a0_memory/README.md)')


def bytes_per_param(*, precision: str = "fp32", optimizer: str = "adam") -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter (Task 0.2).

    fp32: weights and gradients 4 B each. Optimizer state K: Adam/AdamW keep the first and
    second moments m, v (4 + 4 = 8 B); SGD with momentum one buffer (4 B); plain SGD nothing.
    mixed: weights and gradients in 16 bit (2 B each); the optimizer also keeps an fp32
    master copy of the weights (+4 B), so K = 12 for Adam (the ZeRO paper's K), 8 for SGD
    with momentum, 4 for SGD. Hence 16 B/param for both fp32 Adam (4+4+8) and mixed Adam
    (2+2+12): mixed precision saves activation memory and time, not model-state memory.
    """
    fn = "bytes_per_param"
    _choice(fn, "precision", precision, PRECISIONS)
    _choice(fn, "optimizer", optimizer, OPTIMIZERS)
    raise NotImplementedError('a0 task 0.2: implement `bytes_per_param` (see assignments/a0_memory/README.md)')


def activation_bytes(*, seq_len: int, batch_size: int, hidden: int, n_layer: int, n_head: int,
                     tp: int = 1, checkpointing: bool = False, bytes_per_element: int = 2) -> int:
    """Activation bytes kept for the backward pass of L transformer layers (Task 0.3).

    Korthikanti et al. 2022, §4.1, counts what one layer saves, with e = 2 bytes per element
    and 1-byte dropout masks (per layer, in units of s·b·h unless marked):
      attention: QKV input e, Q and K 2e, V e, softmax output e·(a·s/h), its dropout mask
                 1·(a·s/h), the dropout output e·(a·s/h), output-projection input e,
                 dropout mask 1;
      MLP:       first linear input e, GeLU input 4e, second linear input 4e, dropout mask 1;
      two LayerNorm inputs 2e.
    With e = 2 this sums to s·b·h·(34 + 5·a·s/h). With tensor parallelism t (Megatron's split,
    no sequence parallelism) the two LayerNorm inputs, the QKV input, the first MLP input and
    the two s·b·h dropout masks stay whole on every rank; everything else is split t ways. For
    e = 2 this gives the seed's s·b·h·(10 + 24/t + 5·a·s/(h·t)) per layer; yours must hold for
    e = 4 (fp32 activations; masks stay 1 byte) too. Multiply by L.

    checkpointing=True (full activation recomputation, Korthikanti §4.1 and "Training Deep
    Nets with Sublinear Memory Cost"): only each layer's input, e·s·b·h, is kept (2·s·b·h·L
    at e = 2); in the backward one layer at a time is recomputed, so add one layer's full
    activations: e·s·b·h·L + per layer. Returns an exact int (h and a are divisible by t).
    """
    fn = "activation_bytes"
    for name, v in (("seq_len", seq_len), ("batch_size", batch_size), ("hidden", hidden),
                    ("n_layer", n_layer), ("n_head", n_head), ("tp", tp)):
        _int(fn, name, v)
    _shape(fn, hidden=hidden, n_head=n_head, tp=tp)
    if bytes_per_element not in (2, 4):
        raise ValueError(f"{fn}: bytes_per_element must be 2 (fp16/bf16) or 4 (fp32), got {bytes_per_element!r}")
    s, b, h, L, a, t, e = seq_len, batch_size, hidden, n_layer, n_head, tp, bytes_per_element
    raise NotImplementedError('a0 task 0.3: implement `activation_bytes` (see assignments/a0_memory/README.md)')


def sequence_parallel_activation_bytes(*, seq_len: int, batch_size: int, hidden: int, n_layer: int,
                                      n_head: int, tp: int) -> int:
    """Activation bytes of L layers under tensor *and* sequence parallelism, 16-bit activations.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    §4.2.2 and Table 2: s·b·h·L·(34/t + 5·a·s/(h·t)). Tensor parallelism alone leaves the
    10·s·b·h of `activation_bytes` whole on every rank (the LayerNorm inputs, the inputs of the
    QKV and first MLP projections, the dropout masks); sequence parallelism runs LayerNorm and
    dropout on s/t positions per rank and saves only the sequence shard of the column-parallel
    layers' inputs (re-gathered in the backward), so every term is divided by t
    (`scaletrain.tp.sequence`). The formula is the paper's, for e = 2 bytes per element and
    1-byte dropout masks. Returns an exact int (h and a are divisible by t).
    """
    fn = "sequence_parallel_activation_bytes"
    for name, v in (("seq_len", seq_len), ("batch_size", batch_size), ("hidden", hidden),
                    ("n_layer", n_layer), ("n_head", n_head), ("tp", tp)):
        _int(fn, name, v)
    _shape(fn, hidden=hidden, n_head=n_head, tp=tp)
    s, b, h, L, a, t = seq_len, batch_size, hidden, n_layer, n_head, tp
    return L * (34 * s * b * h + 5 * a * s * s * b) // t


def zero_memory_per_rank(num_params: int, world_size: int, stage: int, *,
                         precision: str = "fp32", optimizer: str = "adam") -> MemoryBreakdown:
    """Model-state bytes held by one of N data-parallel ranks under ZeRO stage 0-3 (Task 0.4).

    ZeRO paper §5 (Figure 1), with p, g, K = `bytes_per_param(...)`:
      stage 0 (plain data parallel): p·Ψ + g·Ψ + K·Ψ      (mixed Adam: (2+2+12)Ψ = 16Ψ)
      stage 1 (optimizer state sharded):  p·Ψ + g·Ψ + K·Ψ/N
      stage 2 (+ gradients sharded):      p·Ψ + g·Ψ/N + K·Ψ/N
      stage 3 (+ parameters sharded):     (p + g + K)·Ψ/N
    A shard holds ceil(Ψ/N) elements (the flat buffer is padded to a multiple of N, as real
    implementations do), so "Ψ/N" above means ceil(Ψ/N) and the result is exact.
    Paper check: Ψ = 7.5e9, N = 64, mixed Adam → 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    """
    fn = "zero_memory_per_rank"
    _int(fn, "num_params", num_params)
    _int(fn, "world_size", world_size)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError(f"{fn}: stage must be 0, 1, 2 or 3, got {stage!r}")
    p, g, k = bytes_per_param(precision=precision, optimizer=optimizer)
    raise NotImplementedError('a0 task 0.4: implement `zero_memory_per_rank` (see assignments/a0_memory/README.md)')


def training_flops(*, num_params: int, num_tokens: int, recompute: bool = False) -> int:
    """Training FLOPs ≈ 6·N·D (Task 0.5): forward 2·N per token, backward 4·N per token.

    Full activation recomputation runs the forward twice: 8·N·D. (Attention's s²-terms,
    12·L·h·s per token in PaLM's appendix B, are left out, as in the 6·N·D rule.)
    """
    _int("training_flops", "num_params", num_params)
    _int("training_flops", "num_tokens", num_tokens)
    raise NotImplementedError('a0 task 0.5: implement `training_flops` (see assignments/a0_memory/README.md)')


def mfu(*, num_params: int, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilization (PaLM, appendix B): 6·N·(tokens/s) / peak FLOP/s (Task 0.5).

    Always 6·N, recomputation or not: MFU credits only the FLOPs the model needs, so it is
    comparable across implementations (counting the recompute gives the hardware FLOPs
    utilization, HFU, instead).
    """
    _int("mfu", "num_params", num_params)
    for name, v in (("tokens_per_second", tokens_per_second),
                    ("peak_flops_per_second", peak_flops_per_second)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"mfu: {name} must be a positive number, got {v!r}")
    raise NotImplementedError('a0 task 0.5: implement `mfu` (see assignments/a0_memory/README.md)')


def tiny_gpt_activation_bytes(*, batch_size: int, seq_len: int, hidden: int, n_layer: int,
                              n_head: int, vocab_size: int, checkpointing: bool = False) -> int:
    """Saved-for-backward bytes of one fp32 training step of `scaletrain.models.GPT` on CPU (Task 0.6).

    This predicts what `scaletrain.memory_measure.measure_training_step` counts (exactly, on
    torch 2.13 CPU; the tests allow 1%). It is the formula of `activation_bytes` with e = 4,
    adapted to this model: dropout is 0 (no masks saved), and fused scaled-dot-product
    attention saves no a·s² matrix. What autograd saves, float32 (4 B) unless marked int64 (8 B);
    tensors that share one storage count once:
      per layer:  each LayerNorm: its input (b, s, h), its mean and 1/std (b, s, 1) each;
                  each Linear: its input (the weight is a parameter, not an activation);
                  attention: Q, K, V (views of the one QKV output (b, s, 3h)), its output
                  (b, a, s, h/a), which is also the output projection's input, and a
                  logsumexp (b, a, s);  GeLU: its input (b, s, 4h).
      embedding:  token ids (b, s) and position ids (s,), int64, kept to the end of backward.
      head:       final LayerNorm (as above), output-head input (b, s, h), and the loss:
                  log-softmax output (b·s, V), targets (b·s,) int64, a float32 scalar.
    You can list them yourself: `torch.autograd.graph.saved_tensors_hooks` (see
    scaletrain/memory_measure.py) calls a function on every saved tensor.
    With checkpointing, each layer keeps only its input (b, s, h); the peak is the larger of
    the end of the forward (all inputs + embedding + head) and the recomputation of the last
    layer in the backward (all inputs + embedding + one layer; the head is freed by then, and
    that layer's LN1 input is its checkpointed input, not counted twice).
    """
    fn = "tiny_gpt_activation_bytes"
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len), ("hidden", hidden),
                    ("n_layer", n_layer), ("n_head", n_head), ("vocab_size", vocab_size)):
        _int(fn, name, v)
    _shape(fn, hidden=hidden, n_head=n_head)
    s, b, h, a, V, f, i = seq_len, batch_size, hidden, n_head, vocab_size, 4, 8
    raise NotImplementedError('a0 task 0.6: implement `tiny_gpt_activation_bytes` (see assignments/a0_memory/README.md)')
    if not checkpointing:
        return n_layer * layer + embedding + head
    inputs = n_layer * f * s * b * h
    return max(inputs + embedding + head, inputs + embedding + layer - f * s * b * h)


def model_states_bytes(num_params: int, *, precision: str = "fp32", optimizer: str = "adam") -> MemoryBreakdown:
    """Parameters + gradients + optimizer state of one unsharded replica (ZeRO stage 0)."""
    return zero_memory_per_rank(num_params, 1, 0, precision=precision, optimizer=optimizer)


def training_memory(*, num_params: int, seq_len: int, batch_size: int, hidden: int, n_layer: int,
                    n_head: int, tp: int = 1, precision: str = "mixed", optimizer: str = "adam",
                    checkpointing: bool = False, zero_stage: int = 0, world_size: int = 1) -> TrainingMemory:
    """Per-rank bytes of one training configuration: ZeRO-sharded states + activations.

    Activations are 16-bit under mixed precision, 32-bit under fp32. Tensor parallelism here
    only divides the activations (sharding the weights t ways is left to the caller's Ψ).
    """
    states = zero_memory_per_rank(num_params, world_size, zero_stage, precision=precision,
                                  optimizer=optimizer)
    acts = activation_bytes(seq_len=seq_len, batch_size=batch_size, hidden=hidden, n_layer=n_layer,
                            n_head=n_head, tp=tp, checkpointing=checkpointing,
                            bytes_per_element=2 if precision == "mixed" else 4)
    return TrainingMemory(states=states, activations=acts)


# The seed's worked example: the original GPT (12 layers, h = 768, 512 tokens, 12 heads,
# vocabulary 40512, untied output head), trained in mixed precision with AdamW.
GPT1 = dict(vocab_size=40512, block_size=512, n_layer=12, hidden=768, n_head=12)


def seed_gpt1_example(*, batch_size: int = 64) -> TrainingMemory:
    """The seed's GPT-1 numbers, reproduced with the seed's own conventions.

    The seed takes Ψ = 147e6 (gpt_num_params(..., tied_embeddings=False) = 147,675,648,
    rounded down) and books model 2Ψ + optimizer (4 + 12)Ψ + gradients 2Ψ = 20Ψ = 2,940 MB
    fixed, plus activation_bytes(...) = 349,175,808 B per sequence: 25.3 GB at batch 64.
    Its optimizer term counts the fp32 master copy twice (AdamW's 12 B already include it),
    so the ZeRO paper's accounting, 16Ψ = 2,352 MB, is 4Ψ = 588 MB lower.
    """
    num_params = 147 * MB
    states = model_states_bytes(num_params, precision="mixed", optimizer="adamw")
    states = replace(states, optimizer=states.optimizer + 4 * num_params)  # the seed's double count
    acts = activation_bytes(seq_len=GPT1["block_size"], batch_size=batch_size, hidden=GPT1["hidden"],
                            n_layer=GPT1["n_layer"], n_head=GPT1["n_head"])
    return TrainingMemory(states=states, activations=acts)
