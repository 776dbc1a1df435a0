"""Where the memory of training goes: parameters, gradients, optimizer state, activations; and FLOPs.

Pure arithmetic on integers (no torch), so it answers "does a 7.5B model fit?" instantly. The
matching *measurement* of a real step lives in `scaletrain.memory_measure`.

Sources (each task's docstring names the section and equation to read; the formulas are
derived there, not here):
  * "Techniques for large-scale training" (course seed), section on memory estimation: the
    accounting Total = model + optimizer + gradients + activations, and the GPT-1 example.
  * Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    §4.1 (eq. 1: one layer's activations), §4.2.1 (eq. 2: with tensor parallelism), §4.2.2 and
    Table 2 (with sequence parallelism as well), §5 (full recomputation).
  * Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
    Models", §3.1 (model states: weights, gradients and the optimizer's K bytes per parameter),
    §5 and Figure 1 (what each ZeRO-DP stage leaves on a rank).
  * Kaplan et al. 2020, §2.1, and Hoffmann et al. 2022 (Chinchilla), §3: training compute
    C ≈ 6ND; PaLM (Chowdhery et al. 2022), appendix B: model FLOPs utilization.

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

    Contract: the exact int `sum(p.numel() for p in GPT(cfg).parameters())` for the model that
    `scaletrain/models.py` builds (read it: every tensor counts, biases and LayerNorms
    included), without building it. `tied_embeddings=True` is GPT-2's weight tying: the output
    head *is* the token embedding and counts once; untied, the head is a parameter of its own.
    Graded: hidden random shapes, and the numel of real GPTs built from `GPTConfig`s.
    Worked example: the seed's GPT-1 (V=40512, block_size=512, L=12, h=768, untied) has
    147,675,648 parameters, which the seed rounds to "147m".
    """
    fn = "gpt_num_params"
    for name, v in (("vocab_size", vocab_size), ("block_size", block_size),
                    ("n_layer", n_layer), ("hidden", hidden)):
        _int(fn, name, v)
    h = hidden
    # BEGIN SOLUTION
    embeddings = vocab_size * h + block_size * h
    per_layer = 12 * h * h + 13 * h
    head = 0 if tied_embeddings else h * vocab_size
    return embeddings + n_layer * per_layer + 2 * h + head
    # END SOLUTION


def bytes_per_param(*, precision: str = "fp32", optimizer: str = "adam") -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter (Task 0.2).

    Contract: three ints for every precision in PRECISIONS and optimizer in OPTIMIZERS, the
    ZeRO paper's accounting (§3.1): under "mixed" the first two are the 16-bit copies the
    forward and backward use, and everything the optimizer alone needs (its states, and the
    fp32 master weights of mixed precision) is the third, the paper's K. The states are those
    `torch.optim` keeps for each optimizer (read its Adam and SGD docs). Check: the paper's
    mixed-precision Adam is 16 B/param in all. Graded: every (precision, optimizer) pair, and
    the fp32 bytes against the states measured after a real step.
    """
    fn = "bytes_per_param"
    _choice(fn, "precision", precision, PRECISIONS)
    _choice(fn, "optimizer", optimizer, OPTIMIZERS)
    # BEGIN SOLUTION
    moments = {"adam": 8, "adamw": 8, "sgd": 0, "sgd_momentum": 4}[optimizer]
    if precision == "fp32":
        return 4, 4, moments
    return 2, 2, 4 + moments
    # END SOLUTION


def activation_bytes(*, seq_len: int, batch_size: int, hidden: int, n_layer: int, n_head: int,
                     tp: int = 1, checkpointing: bool = False, bytes_per_element: int = 2) -> int:
    """Activation bytes kept for the backward pass of L transformer layers (Task 0.3).

    Contract: Korthikanti et al. 2022's accounting of what each operation of a layer saves for
    its backward (§4.1, eq. 1 at 2-byte activations; §4.2.1, eq. 2, with tensor parallelism t
    and no sequence parallelism), generalized to `bytes_per_element` e: every saved activation
    takes e bytes per element, every dropout mask 1 byte whatever e is. Derive the per-layer
    sum from the paper's list of saved tensors, not from its final expression (which is for
    e = 2 only), and decide from Megatron's column/row split which of them tensor parallelism
    divides by t and which stay whole on every rank.

    checkpointing=True is full activation recomputation (§5; Chen et al. 2016): each layer
    keeps only its input, and the backward recomputes one layer at a time, so the peak is the
    kept inputs of all L layers plus one layer's full activations.
    Returns an exact int (h and a are divisible by t). Check: the seed's GPT-1 at batch 1 keeps
    349,175,808 B. Graded: hidden shapes (odd head counts, h not a power of two) with t = 1 and
    t > 1, e = 2 and 4, with and without checkpointing, as separate checks.
    """
    fn = "activation_bytes"
    for name, v in (("seq_len", seq_len), ("batch_size", batch_size), ("hidden", hidden),
                    ("n_layer", n_layer), ("n_head", n_head), ("tp", tp)):
        _int(fn, name, v)
    _shape(fn, hidden=hidden, n_head=n_head, tp=tp)
    if bytes_per_element not in (2, 4):
        raise ValueError(f"{fn}: bytes_per_element must be 2 (fp16/bf16) or 4 (fp32), got {bytes_per_element!r}")
    s, b, h, L, a, t, e = seq_len, batch_size, hidden, n_layer, n_head, tp, bytes_per_element
    # BEGIN SOLUTION
    per_layer = s * b * h * (4 * e + 2) + s * b * (12 * e * h + (2 * e + 1) * a * s) // t
    if checkpointing:
        return e * s * b * h * L + per_layer
    return L * per_layer
    # END SOLUTION


def sequence_parallel_activation_bytes(*, seq_len: int, batch_size: int, hidden: int, n_layer: int,
                                      n_head: int, tp: int) -> int:
    """Activation bytes of L layers under tensor *and* sequence parallelism, 16-bit activations.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    §4.2.2 and Table 2: s·b·h·L·(34/t + 5·a·s/(h·t)). Sequence parallelism runs LayerNorm and
    dropout on s/t positions per rank and saves only the sequence shard of the column-parallel
    layers' inputs (re-gathered in the backward), so the activations that tensor parallelism
    alone leaves whole on every rank are divided by t as well (`scaletrain.tp.sequence`). The
    formula is the paper's, for e = 2 bytes per element and 1-byte dropout masks. Returns an
    exact int (h and a are divisible by t).
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

    Contract: a MemoryBreakdown whose params, grads and optimizer fields are the bytes one rank
    holds, with the per-parameter bytes of `bytes_per_param(...)` (call it: task 0.4 is graded
    with your task 0.2). Stage 0 is plain data parallelism; stages 1, 2 and 3 partition the
    optimizer state, then the gradients too, then the parameters too (ZeRO paper §5 and
    Figure 1). A partition is padded, as real implementations pad the flat buffer to a
    multiple of N: every rank holds ceil(Ψ/N) elements of it, so the result is exact for any Ψ.
    Paper check: Ψ = 7.5e9, N = 64, mixed Adam → 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    Graded: hidden (Ψ, N, stage, precision, optimizer) with N dividing Ψ and not, separately.
    """
    fn = "zero_memory_per_rank"
    _int(fn, "num_params", num_params)
    _int(fn, "world_size", world_size)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError(f"{fn}: stage must be 0, 1, 2 or 3, got {stage!r}")
    p, g, k = bytes_per_param(precision=precision, optimizer=optimizer)
    # BEGIN SOLUTION
    shard = -(-num_params // world_size)
    return MemoryBreakdown(params=p * (shard if stage >= 3 else num_params),
                           grads=g * (shard if stage >= 2 else num_params),
                           optimizer=k * (shard if stage >= 1 else num_params))
    # END SOLUTION


def training_flops(*, num_params: int, num_tokens: int, recompute: bool = False) -> int:
    """Training FLOPs of N parameters on D tokens (Task 0.5), an exact int.

    Contract: Kaplan et al. 2020's C ≈ 6ND (§2.1; Hoffmann et al. 2022 use the same): derive
    its 6 from the FLOPs of a forward and a backward per parameter per token. recompute=True
    adds what full activation recomputation runs again. Attention's s²-terms (PaLM appendix B)
    are left out, as in the rule.
    """
    _int("training_flops", "num_params", num_params)
    _int("training_flops", "num_tokens", num_tokens)
    # BEGIN SOLUTION
    return (8 if recompute else 6) * num_params * num_tokens
    # END SOLUTION


def mfu(*, num_params: int, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilization, a fraction in (0, ∞) (Task 0.5; PaLM, appendix B).

    Contract: the FLOP rate the model needs at this throughput over the hardware's peak. MFU
    credits only the model's FLOPs, recomputation or not, so it compares implementations
    (counting the recompute gives the hardware FLOPs utilization, HFU, instead).
    """
    _int("mfu", "num_params", num_params)
    for name, v in (("tokens_per_second", tokens_per_second),
                    ("peak_flops_per_second", peak_flops_per_second)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"mfu: {name} must be a positive number, got {v!r}")
    # BEGIN SOLUTION
    return 6 * num_params * tokens_per_second / peak_flops_per_second
    # END SOLUTION


def tiny_gpt_activation_bytes(*, batch_size: int, seq_len: int, hidden: int, n_layer: int,
                              n_head: int, vocab_size: int, checkpointing: bool = False) -> int:
    """Saved-for-backward bytes of one fp32 training step of `scaletrain.models.GPT` on CPU (Task 0.6).

    Contract: predict, for any shape, the peak that
    `scaletrain.memory_measure.measure_training_step(GPT(cfg), batch_size, seq_len,
    checkpointing=...)` reports as `activations_peak`: the bytes of the tensors autograd holds
    for the backward (tensors that share one storage count once; integer tensors count too).
    Which tensors those are is yours to find from the model's code (`scaletrain/models.py`, the
    ops it calls) rather than from a formula: `activation_bytes` describes a different model
    (dropout masks, an a·s² attention matrix) and differs from this one. List them with
    `torch.autograd.graph.saved_tensors_hooks`, as memory_measure.py does, at two shapes, and
    explain every tensor before you write the count. With checkpointing, reason about *when*
    the peak happens (end of the forward, or a layer recomputed in the backward).
    Graded: against the bytes measured in real steps of hidden small GPTs (1%), and against the
    reference's prediction on hidden large shapes, with and without checkpointing separately.
    """
    fn = "tiny_gpt_activation_bytes"
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len), ("hidden", hidden),
                    ("n_layer", n_layer), ("n_head", n_head), ("vocab_size", vocab_size)):
        _int(fn, name, v)
    _shape(fn, hidden=hidden, n_head=n_head)
    s, b, h, a, V, f, i = seq_len, batch_size, hidden, n_head, vocab_size, 4, 8
    # BEGIN SOLUTION
    # per layer: LN inputs and (mean, rstd), the QKV output, attention's output and logsumexp,
    # the MLP input and GeLU input; embedding: int64 ids; head: final LN, head input, loss
    layer = 16 * f * s * b * h + 4 * f * s * b + f * a * s * b
    embedding = i * s * b + i * s
    head = 2 * f * s * b * h + 2 * f * s * b + f * s * b * V + i * s * b + f
    if not checkpointing:
        return n_layer * layer + embedding + head
    # the end of the forward, or the last layer recomputed (its LN1 input is the kept input)
    inputs = n_layer * f * s * b * h
    return max(inputs + embedding + head, inputs + embedding + layer - f * s * b * h)
    # END SOLUTION


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
