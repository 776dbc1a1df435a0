"""The model a plan is about: a decoder-only transformer, GPT-3-style or Llama-style.

Both families are one `ModelSpec` (Narayanan et al. 2021 §3 notation: l layers, h hidden, a heads,
s sequence, V vocabulary) with five switches that say where they differ:

    kv_heads          grouped-query attention: K and V have kv_heads heads of h/a each, shared by
                      a/kv_heads query heads (Ainslie et al. 2023; kv_heads = 1 is multi-query,
                      Shazeer 2019; kv_heads = a, the default, is multi-head)
    ffn_hidden        the MLP's width f (default 4h, GPT-3); Llama's is about 8h/3 rounded
    gated_ffn         SwiGLU (Shazeer 2020; Touvron et al. 2023 §2.2): three h×f matrices
                      (gate, up, down) instead of two
    tied_embeddings   the output head is the input embedding (GPT-2/3) or its own V×h matrix (Llama)
    biases            linear biases and LayerNorm's β (GPT-3); Llama has neither (RMSNorm keeps only
                      its gain, Touvron et al. 2023 §2.2)
    learned_positions an s×h position table (GPT-3) or rotary embeddings without parameters (Llama)

Parameters, counted matrix by matrix (`num_params`): per layer the attention's Q and output
projections (h² each) and K, V (h·h_kv each, h_kv = kv_heads·h/a), the MLP's 2 or 3 h×f
matrices, biases and norms; then the embeddings. With the GPT defaults this is a0's
`gpt_num_params` (Narayanan et al. 2021 §5.1: 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h))); for
Llama-2-7B it gives 6,738,415,616, the count of the released checkpoint (Touvron et al. 2023,
Table 1: "7B"), and for Llama-3-405B 405.9e9 (Dubey et al. 2024, Table 3).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelSpec", "positive_int"]


def positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer (module docstring). The defaults are GPT-3's choices."""
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    name: str = ""
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    gated_ffn: bool = False
    tied_embeddings: bool = True
    biases: bool = True
    learned_positions: bool = True

    def __post_init__(self):
        for f in ("layers", "hidden", "heads", "seq", "vocab"):
            positive_int("ModelSpec", f, getattr(self, f))
        for f in ("kv_heads", "ffn_hidden"):
            if getattr(self, f) is not None:
                positive_int("ModelSpec", f, getattr(self, f))
        if self.hidden % self.heads:
            raise ValueError(f"ModelSpec: hidden={self.hidden} must be divisible by heads={self.heads}")
        if self.heads % self.kv:
            raise ValueError(f"ModelSpec: kv_heads={self.kv} must divide heads={self.heads}: each key/value "
                             f"head serves a whole group of query heads")

    @property
    def kv(self) -> int:
        """Key/value heads (a under multi-head attention)."""
        return self.kv_heads or self.heads

    @property
    def kv_hidden(self) -> int:
        """h_kv = kv·h/a: the width of K (and of V)."""
        return self.kv * (self.hidden // self.heads)

    @property
    def ffn(self) -> int:
        """f: the MLP's inner width."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_ffn else 2

    @property
    def layer_matrix_params(self) -> int:
        """Weights of one layer's matrices: Q and output h² each, K and V h·h_kv each, the MLP's."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_hidden + self.mlp_matrices * h * self.ffn

    @property
    def layer_params(self) -> int:
        """One layer: its matrices, their biases (one per output) and two norms (γ, and β with biases)."""
        h, f = self.hidden, self.ffn
        biases = (h + 2 * self.kv_hidden) + h + (self.mlp_matrices - 1) * f + h if self.biases else 0
        return self.layer_matrix_params + biases + 2 * self.norm_params

    @property
    def norm_params(self) -> int:
        return 2 * self.hidden if self.biases else self.hidden

    @property
    def embedding_params(self) -> int:
        """Input embedding, the untied output head, the position table, the final norm."""
        h = self.hidden
        head = 0 if self.tied_embeddings else self.vocab * h
        positions = self.seq * h if self.learned_positions else 0
        return self.vocab * h + head + positions + self.norm_params

    @property
    def num_params(self) -> int:
        """Ψ (module docstring)."""
        return self.layers * self.layer_params + self.embedding_params
