"""a6's names: the student's files, the grader's constants, and every check name (used nowhere as a literal)."""


OPS, LAYERS, LOSS, SEQ = "tp_operators.py", "tp_layers.py", "tp_cross_entropy.py", "tp_sequence.py"
MESH = "tp_mesh.py"
SOURCES = {OPS: "lib/scaletrain/tp/operators.py", LAYERS: "lib/scaletrain/tp/layers.py",
           LOSS: "lib/scaletrain/tp/cross_entropy.py", SEQ: "lib/scaletrain/tp/sequence.py",
           MESH: "lib/scaletrain/mesh.py"}
PROBE = "autograder.probes.a6_tensor_parallel:"
WORLD = 4             # t = 2 and t = 3 on subgroups; the 3D grid's builds on all 4
SIZES = (2, 3)
PG_TIMEOUT_S = 10.0   # a collective that waits longer is a deadlock
SPAWN_TIMEOUT_S = 150
RTOL = 2e-5           # fp32, sums in another order than one process
AXES = ("dp", "pp", "tp")
TORCH_TP = ("torch.distributed.tensor", "torch.distributed.all_reduce", "torch.distributed.all_gather",
            "torch.distributed.all_gather_into_tensor", "torch.distributed.all_gather_single",
            "torch.distributed.reduce_scatter", "torch.distributed.reduce_scatter_tensor",
            "torch.distributed.reduce_scatter_single", "torch.distributed.broadcast", "torch.nn.parallel",
            "importlib", "__import__", "exec", "eval")

C_FG_FWD = "f and g forward: f the identity, g the sum over the ranks (t = 2, 3)"
C_FG_BWD = "f and g backward: f's the sum over the ranks, g's the identity (t = 2, 3)"
C_FG_BYTES = "f and g send one allreduce each: f in the backward, g in the forward (bytes at isend)"
C_LAST = "gather and scatter of the last dimension, each the other's backward"
C_COL_FWD = "column-parallel layer forward: its rows of the weight and bias, its slice of the output"
C_COL_BWD = "column-parallel layer backward: input gradient summed over the ranks, its rows' weight and bias gradients"
C_ROW_FWD = "row-parallel layer forward: its columns of the weight, the whole bias, the unsharded output"
C_ROW_BWD = "row-parallel layer backward: its input slice's gradient, its columns' weight gradient, the bias gradient"
C_QKV = "attention split by heads: each rank holds whole heads of Q, K and V; output and gradients equal one device"
C_MLP = "column -> GeLU -> row: one allreduce of b·s·h forward and one backward"
C_GPT = "tensor-parallel GPT equals one process (loss, logits slice, every gradient; t = 2, 3)"
C_GPT_BYTES = "tensor-parallel GPT sends 4 allreduces of b·s·h per layer (+ embedding, head, loss)"
C_CE_FWD = "vocabulary-parallel cross-entropy: the loss equals F.cross_entropy on the whole logits, on every rank"
C_CE_BWD = "vocabulary-parallel cross-entropy: the gradient of this rank's logits equals the whole-logits one"
C_CE_STABLE = "vocabulary-parallel cross-entropy stays finite and exact for logits in the thousands"
C_CE_MEM = "the loss never makes a tensor of the whole logits (at most N·V/t elements)"
C_SP_PAIR_FWD = "sequence all-gather / reduce-scatter forward (values and bytes)"
C_SP_PAIR_BWD = "sequence all-gather / reduce-scatter backward: each the other's conjugate (values and bytes)"
C_SP_LIN = "sequence-gather linear equals the unsharded layer (output, every gradient, one all-gather forward)"
C_SP_LIN_SAVED = "sequence-gather linear saves only its (b, s/t, h) shard for backward"
C_SP_GPT = "GPT with sequence parallelism equals one process (t = 2, 3)"
C_SP_MEM = "blocks save sbh(10 + 24/t)-form bytes with TP, sbh(34/t)-form with SP (CPU fp32 form)"
C_SP_BYTES = "sequence parallelism sends tensor parallelism's bytes plus 2 re-gathers per layer"
C_MESH_GRID = "3D grid: coords and rank_of inverse; each axis's groups partition the ranks, position = coordinate"
C_MESH_NODES = "3D grid: every tp group is consecutive ranks (whole tp groups inside a node)"
C_MESH_BUILD = "3D grid on 4 ranks: every rank builds every group; a sum over each group reaches exactly its ranks"
CHECKS = (C_FG_FWD, C_FG_BWD, C_FG_BYTES, C_LAST, C_COL_FWD, C_COL_BWD, C_ROW_FWD, C_ROW_BWD, C_QKV, C_MLP, C_GPT,
          C_GPT_BYTES, C_CE_FWD, C_CE_BWD, C_CE_STABLE, C_CE_MEM, C_SP_PAIR_FWD, C_SP_PAIR_BWD, C_SP_LIN,
          C_SP_LIN_SAVED, C_SP_GPT, C_SP_MEM, C_SP_BYTES, C_MESH_GRID, C_MESH_NODES, C_MESH_BUILD)
